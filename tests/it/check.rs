//! `fencecron check`: every configuration error the issue lists exits 2 and
//! names the file, the line and the key; a valid file exits 0 and lists
//! three next fire times per job, each exactly on its schedule.

use crate::common::harness::fencecron;

use std::path::{Path, PathBuf};
use std::process::Output;

use chrono::{DateTime, Datelike, Timelike, Utc};

/// Writes `text` to a fresh `jobs.toml` and runs `fencecron check` on it.
fn check(text: &str) -> (tempfile::TempDir, PathBuf, Output) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("jobs.toml");
    std::fs::write(&path, text).expect("write jobs.toml");
    let out = fencecron(dir.path())
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .expect("run fencecron check");
    (dir, path, out)
}

/// Asserts exit 2 and an error of the form `FILE:LINE:COL: KEY: message`
/// (or `FILE:LINE:COL: message` when `key` is `None`); returns stderr.
fn expect_error(text: &str, line: usize, key: Option<&str>) -> String {
    let (_dir, path, out) = check(text);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        out.status.code(),
        Some(2),
        "expected exit 2 for\n{text}\nstdout: {}\nstderr: {stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    let prefix = format!("{}:{line}:", path.display());
    let at = stderr.find(&prefix).unwrap_or_else(|| {
        panic!(
            "stderr does not name `{prefix}` (file and line {line}) for\n{text}\nstderr: {stderr}"
        )
    });
    let rest = &stderr[at + prefix.len()..];
    let col_len = rest.chars().take_while(char::is_ascii_digit).count();
    assert!(col_len > 0, "no column after `{prefix}`: {stderr}");
    let rest = &rest[col_len..];
    if let Some(key) = key {
        assert!(
            rest.starts_with(&format!(": {key}: ")),
            "stderr does not name the key `{key}` right after FILE:LINE:COL for\n{text}\nstderr: {stderr}"
        );
    }
    stderr
}

const JOB_A: &str = "[[job]]\nname = \"a\"\nschedule = \"*/2 * * * * *\"\ncommand = [\"true\"]\n";

#[test]
fn bad_toml() {
    expect_error("[defaults]\nlease = \"10s\"\ncommand = [\n", 4, None);
}

#[test]
fn unknown_key() {
    let stderr = expect_error(&format!("{JOB_A}colour = \"red\"\n"), 5, None);
    assert!(
        stderr.contains("colour"),
        "the unknown key is not named: {stderr}"
    );
    let stderr = expect_error("[defaults]\nleese = \"10s\"\n", 2, None);
    assert!(
        stderr.contains("leese"),
        "the unknown key is not named: {stderr}"
    );
}

#[test]
fn bad_cron_names_the_job() {
    expect_error(
        "[[job]]\nname = \"nightly\"\nschedule = \"61 * * * *\"\ncommand = [\"true\"]\n",
        3,
        Some("job `nightly`.schedule"),
    );
    expect_error(
        "[[job]]\nname = \"nightly\"\nschedule = \"* * *\"\ncommand = [\"true\"]\n",
        3,
        Some("job `nightly`.schedule"),
    );
}

/// A job in another time zone shows each next instant in UTC and on its
/// own wall clock, as `systemd-analyze calendar` does.
#[test]
fn next_times_in_utc_and_the_jobs_zone() {
    let text = "[[job]]\nname = \"berlin\"\nschedule = \"0 0 4 * * *\"\ntimezone = \"Europe/Berlin\"\ncommand = [\"true\"]\n";
    let (_dir, _path, out) = check(text);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let nexts: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix("next: "))
        .collect();
    assert_eq!(nexts.len(), 3, "{stdout}");
    for n in nexts {
        let (utc, local) = n.split_once("  ").expect("UTC, then the local time");
        let utc = DateTime::parse_from_rfc3339(utc)
            .unwrap()
            .with_timezone(&Utc);
        // 04:00 in Berlin is 03:00 UTC in winter, 02:00 in summer.
        assert!(utc.hour() == 3 || utc.hour() == 2, "{n}");
        assert!(
            local.contains(" 04:00:00 CET") || local.contains(" 04:00:00 CEST"),
            "{n}"
        );
    }
}

/// The macros every cron accepts (`@daily`, `@hourly`, …) stand for their
/// patterns; `@reboot` (no instant, so no occurrence) is refused by name.
#[test]
fn cron_macros() {
    let text = "[[job]]\nname = \"daily\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n\
                [[job]]\nname = \"hourly\"\nschedule = \"@HOURLY\"\ncommand = [\"true\"]\n\
                [[job]]\nname = \"weekly\"\nschedule = \"@weekly\"\ncommand = [\"true\"]\n";
    let (_dir, _path, out) = check(text);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jobs = next_times(&stdout);
    assert_eq!(jobs.len(), 3, "{stdout}");
    for t in &jobs[0].1 {
        assert!(
            (t.hour(), t.minute(), t.second()) == (0, 0, 0),
            "@daily: {t}"
        );
    }
    for t in &jobs[1].1 {
        assert!((t.minute(), t.second()) == (0, 0), "@HOURLY: {t}");
    }
    for t in &jobs[2].1 {
        assert!(
            t.weekday() == chrono::Weekday::Sun && (t.hour(), t.minute()) == (0, 0),
            "@weekly: {t}"
        );
    }
    let e = expect_error(
        "[[job]]\nname = \"boot\"\nschedule = \"@reboot\"\ncommand = [\"true\"]\n",
        3,
        Some("job `boot`.schedule"),
    );
    assert!(e.contains("@daily"), "the error lists the macros: {e}");
}

#[test]
fn lease_outside_5s_to_300s() {
    for lease in ["4s", "301s", "0s"] {
        expect_error(
            &format!("{JOB_A}lease = \"{lease}\"\n"),
            5,
            Some("job `a`.lease"),
        );
        expect_error(
            &format!("[defaults]\nlease = \"{lease}\"\n{JOB_A}"),
            2,
            Some("defaults.lease"),
        );
    }
    // The bounds themselves are fine.
    for lease in ["5s", "300s"] {
        let (_d, _p, out) = check(&format!("{JOB_A}lease = \"{lease}\"\n"));
        assert_eq!(
            out.status.code(),
            Some(0),
            "lease {lease}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn node_max_running_out_of_range() {
    for n in ["0", "100001", "-3"] {
        let msg = expect_error(
            &format!("[node]\nmax_running = {n}\n{JOB_A}"),
            2,
            Some("node.max_running"),
        );
        assert!(msg.contains("between 1 and 100000"), "{msg}");
    }
    let (_d, _p, out) = check(&format!("[node]\nmax_running = 1\n{JOB_A}"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn node_shutdown_grace_must_be_a_duration_of_at_most_a_day() {
    for (grace, says) in [
        ("\"soon\"", "is not a duration"),
        ("\"2d\"", "longer than 24h"),
        ("30", "invalid type"),
    ] {
        let msg = expect_error(
            &format!("[node]\nshutdown_grace = {grace}\n{JOB_A}"),
            2,
            Some("node.shutdown_grace"),
        );
        assert!(msg.contains(says), "{grace}: {msg}");
    }
    for grace in ["0s", "24h"] {
        let (_d, _p, out) = check(&format!("[node]\nshutdown_grace = \"{grace}\"\n{JOB_A}"));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{grace}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn store_max_connections_out_of_range() {
    for n in ["0", "65", "-1"] {
        let msg = expect_error(
            &format!("[store]\nmax_connections = {n}\n{JOB_A}"),
            2,
            Some("store.max_connections"),
        );
        assert!(msg.contains("between 1 and 64"), "{msg}");
    }
    let (_d, _p, out) = check(&format!("[store]\nmax_connections = 64\n{JOB_A}"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn renew_every_not_well_below_the_lease() {
    expect_error(
        &format!("{JOB_A}lease = \"10s\"\nrenew_every = \"6s\"\n"),
        6,
        Some("job `a`.renew_every"),
    );
    expect_error(
        &format!("[defaults]\nlease = \"30s\"\nrenew_every = \"30s\"\n{JOB_A}"),
        3,
        Some("defaults.renew_every"),
    );
}

#[test]
fn kill_grace_that_does_not_fit() {
    expect_error(
        &format!("{JOB_A}lease = \"10s\"\nkill_grace = \"7s\"\n"),
        6,
        Some("job `a`.kill_grace"),
    );
    expect_error(
        &format!("[defaults]\nkill_grace = \"20s\"\n{JOB_A}lease = \"30s\"\n"),
        2,
        Some("defaults.kill_grace"),
    );
}

#[test]
fn duplicate_job_names() {
    let stderr = expect_error(&format!("{JOB_A}{JOB_A}"), 6, Some("job[1].name"));
    assert!(
        stderr.contains("`a`"),
        "the duplicate name is not shown: {stderr}"
    );
}

#[test]
fn empty_command() {
    expect_error(
        "[[job]]\nname = \"a\"\nschedule = \"* * * * * *\"\ncommand = []\n",
        4,
        Some("job `a`.command"),
    );
    expect_error(
        "[[job]]\nname = \"a\"\nschedule = \"* * * * * *\"\ncommand = [\"\"]\n",
        4,
        Some("job `a`.command"),
    );
}

#[test]
fn bad_store_url() {
    expect_error(
        &format!("[store]\nurl = \"redis://localhost\"\n{JOB_A}"),
        2,
        Some("store.url"),
    );
    expect_error(
        &format!("[store]\nurl = \"postgres://[::1\"\n{JOB_A}"),
        2,
        Some("store.url"),
    );
}

/// Parses `  next: <RFC 3339>` lines per job from `check`'s stdout.
fn next_times(stdout: &str) -> Vec<(String, Vec<DateTime<Utc>>)> {
    let mut jobs: Vec<(String, Vec<DateTime<Utc>>)> = Vec::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("job ") {
            let name = rest.split_whitespace().next().unwrap_or("").to_string();
            jobs.push((name, Vec::new()));
        } else if let Some(t) = line.trim().strip_prefix("next: ") {
            // The UTC instant, then the job's wall clock for other zones.
            let t = t.split_whitespace().next().unwrap_or_default();
            let t = DateTime::parse_from_rfc3339(t)
                .unwrap_or_else(|e| panic!("`{t}` is not RFC 3339: {e}"))
                .with_timezone(&Utc);
            jobs.last_mut().expect("next: before any job").1.push(t);
        }
    }
    jobs
}

#[test]
fn valid_file_lists_three_next_fire_times_per_job() {
    let text = "[defaults]\nlease = \"10s\"\n\
                [[job]]\nname = \"every-2s\"\nschedule = \"*/2 * * * * *\"\ncommand = [\"true\"]\n\
                [[job]]\nname = \"monthly\"\nschedule = \"0 0 2 1 * *\"\ncommand = [\"true\"]\n\
                [[job]]\nname = \"daily\"\nschedule = \"30 4 * * *\"\ncommand = [\"true\"]\n";
    let before = Utc::now();
    let (_dir, path, out) = check(text);
    let after = Utc::now();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&path.display().to_string()),
        "stdout does not name the file: {stdout}"
    );
    let jobs = next_times(&stdout);
    let names: Vec<&str> = jobs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["every-2s", "monthly", "daily"], "{stdout}");
    for (name, times) in &jobs {
        assert_eq!(
            times.len(),
            3,
            "job {name}: not three next fire times:\n{stdout}"
        );
        assert!(
            times[0] > before,
            "job {name}: {} is not in the future",
            times[0]
        );
        assert!(
            times.windows(2).all(|w| w[0] < w[1]),
            "job {name}: not increasing: {times:?}"
        );
        for t in times {
            // A fire time is an instant of the schedule: whole seconds.
            assert_eq!(
                t.timestamp_subsec_nanos(),
                0,
                "job {name}: fire time {t} is not on the schedule (sub-second part; \
                 the occurrence identity would depend on when the host looked):\n{stdout}"
            );
        }
    }
    let two = &jobs[0].1;
    assert!(two.iter().all(|t| t.second() % 2 == 0), "every-2s: {two:?}");
    assert!(
        two.windows(2)
            .all(|w| (w[1] - w[0]).num_milliseconds() == 2000),
        "every-2s: not 2 s apart: {two:?}"
    );
    assert!(
        two[0] <= after + chrono::Duration::seconds(2),
        "every-2s: first {} too late",
        two[0]
    );
    for t in &jobs[1].1 {
        assert!(
            t.day() == 1 && t.hour() == 2 && t.minute() == 0 && t.second() == 0,
            "monthly: {t}"
        );
    }
    for t in &jobs[2].1 {
        assert!(
            t.hour() == 4 && t.minute() == 30 && t.second() == 0,
            "daily: {t}"
        );
    }
}

/// What only the host can tell: a missing `workdir` (outside volatile
/// directories) exits 2 with file, line and key; a command not on `PATH` and
/// a file without jobs are warnings (exit 0).
#[test]
fn host_checks_missing_workdir_is_an_error_and_unknown_command_a_warning() {
    // At the root, so never under a volatile directory (as a checkout in
    // /tmp would be).
    let missing = Path::new("/").join(crate::common::unique("fencecron-no-such-dir"));
    let text = format!("{JOB_A}workdir = \"{}\"\n", missing.display());
    let stderr = expect_error(&text, 5, Some("job `a`.workdir"));
    assert!(
        stderr.contains("does not exist; create the directory"),
        "{stderr}"
    );

    let (_dir, _path, out) = check(
        "[[job]]\nname = \"b\"\nschedule = \"* * * * *\"\ncommand = [\"no-such-program-fencecron\"]\n",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("warning: ") && stderr.contains("not on this shell's PATH"),
        "{stderr}"
    );
    let (_dir, _path, out) = check("");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("warning: ") && stderr.contains("no [[job]]"),
        "{stderr}"
    );
}

/// Errors go to stderr only; nothing half-valid on stdout.
#[test]
fn missing_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = fencecron(dir.path())
        .arg("check")
        .arg("--config")
        .arg(Path::new("/nonexistent/fencecron/jobs.toml"))
        .output()
        .expect("run fencecron check");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("/nonexistent/fencecron/jobs.toml"),
        "{stderr}"
    );
}

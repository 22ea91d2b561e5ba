//! A restart is not a failure (issue 26): on the first SIGTERM a daemon
//! competes for nothing more and lets its running jobs finish for up to
//! `[node] shutdown_grace`, through the real binary and real stores.
//!
//! * a rolling restart of three daemons on PostgreSQL, each restarted
//!   mid-run: every run finishes by itself, none overlaps the next, no
//!   instant is missed, nothing is reported as failed;
//! * a second SIGTERM, or a SIGINT, during a drain stops at once, and the
//!   stopped run is not a failure (no `job_failed`, no `on_failure`);
//! * two daemons restarted in turn every few seconds for a minute: every
//!   instant of a job due every 2 s runs exactly once.
//!
//! `shutdown_grace = "0s"` and SIGINT on their own are in `daemon.rs`
//! (`sigterm_with_no_shutdown_grace_…`, `sigint_stops_…`).

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::common::daemon::{
    ev, i64_field, is, job_toml, read_runs, record_cmd, secs, sh, str_field, token_of, wait_until,
    Daemon, DaemonOpts,
};
use crate::common::harness::{code, describe, fencecron, run};
use crate::common::{unique, Backend, TestStore};
use crate::daemon_faults::recv_until_line;

/// `jobs.toml` in `dir`: `[node] shutdown_grace = GRACE`, then `jobs`.
fn config(dir: &Path, grace: &str, jobs: &[String]) -> std::path::PathBuf {
    let path = dir.join("jobs.toml");
    let text = format!("[node]\nshutdown_grace = \"{grace}\"\n\n{}", jobs.concat());
    std::fs::write(&path, text).expect("write jobs.toml");
    path
}

/// `fencecron runs --json` for `job`.
fn history(dir: &Path, store: &str, config: &Path, job: &str) -> Vec<Value> {
    let mut cmd: Command = fencecron(dir);
    cmd.args(["--store", store, "--config"])
        .arg(config)
        .args(["runs", job, "--json", "--limit", "1000"]);
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    match serde_json::from_slice(&out.stdout) {
        Ok(Value::Array(rows)) => rows,
        other => panic!("runs --json: {other:?}: {}", describe(&out)),
    }
}

/// No daemon reported a failed run.
fn no_failures(daemons: &[&Daemon]) {
    for d in daemons {
        for event in ["job_failed", "job_cancelled"] {
            assert!(
                d.events(event).is_empty(),
                "[{}] logged {event}: {}",
                d.node,
                d.summary()
            );
        }
    }
}

/// SIGTERM to `d`: it drains (`daemon_stopping` with `drain_ms`), then
/// exits 0 once its runs have ended.
fn drain_and_exit(d: &mut Daemon, grace_ms: i64) {
    let cut = d.len();
    d.signal(Signal::SIGTERM);
    let (_, stopping) = d.expect_from(cut, "daemon_stopping", ev("daemon_stopping"), secs(10));
    assert_eq!(
        i64_field(&stopping, "drain_ms"),
        Some(grace_ms),
        "{stopping}"
    );
    let st = d.wait_exit(secs(60));
    assert!(
        st.is_some_and(|s| s.code() == Some(0)),
        "[{}] exit after SIGTERM: {st:?}; {}",
        d.node,
        d.summary()
    );
}

/// One line the rolling-restart job writes: `start|end SCHEDULED_AT NODE NS`.
#[derive(Debug, Clone)]
struct Mark {
    start: bool,
    at: DateTime<Utc>,
    node: String,
    ns: u128,
}

fn read_marks(file: &Path) -> Vec<Mark> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 4, "malformed line {l:?}");
            Mark {
                start: f[0] == "start",
                at: DateTime::parse_from_rfc3339(f[1])
                    .unwrap_or_else(|e| panic!("{l:?}: {e}"))
                    .with_timezone(&Utc),
                node: f[2].to_string(),
                ns: f[3].parse().unwrap_or_else(|e| panic!("{l:?}: {e}")),
            }
        })
        .collect()
}

/// Three daemons on PostgreSQL run a job of 5 s every 10 s (under a 5 s
/// lease, so it must renew). Three times, the node that just started a run
/// gets SIGTERM, drains (the run finishes by itself while the other nodes
/// take the next instant), exits 0 and is started again under the same
/// node id. Then all three get SIGTERM together. Every instant from the
/// first to the last ran exactly once, started and ended by itself
/// (`start` and `end` lines from the same node), no run overlapped the
/// next, the history says `succeeded` for each, and no daemon logged
/// `job_failed` or `job_cancelled`.
#[test]
fn a_rolling_restart_lets_every_run_finish_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "rolling_restart") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("rolling");
    let marks = dir.path().join("marks");
    let script = r#"echo "start $FENCECRON_SCHEDULED_AT $FENCECRON_NODE $(date +%s%N)" >> "$1"; sleep 5; echo "end $FENCECRON_SCHEDULED_AT $FENCECRON_NODE $(date +%s%N)" >> "$1""#;
    let argv = vec![
        "sh".to_string(),
        "-c".to_string(),
        script.to_string(),
        "sh".to_string(),
        marks.display().to_string(),
    ];
    let config = config(
        dir.path(),
        "30s",
        &[job_toml(&job, "*/10 * * * * *", &argv, "lease = \"5s\"")],
    );
    let opts: Vec<DaemonOpts> = ["a", "b", "c"]
        .iter()
        .map(|n| DaemonOpts::new(&unique(&format!("roll-{n}")), &config, &store.url))
        .collect();
    let mut daemons: Vec<Daemon> = opts.iter().cloned().map(Daemon::spawn).collect();
    for d in &daemons {
        d.expect("daemon_started", ev("daemon_started"), secs(60));
    }
    let mut retired: Vec<Daemon> = Vec::new();
    for round in 0..3 {
        let cuts: Vec<usize> = daemons.iter().map(Daemon::len).collect();
        let mut found: Option<(usize, Value)> = None;
        wait_until(
            secs(60),
            || {
                found = daemons
                    .iter()
                    .zip(&cuts)
                    .enumerate()
                    .find_map(|(i, (d, cut))| {
                        d.wait_for_from(*cut, ev("job_started"), Duration::ZERO)
                            .map(|(_, e)| (i, e))
                    });
                found.is_some()
            },
            || format!("round {round}: no run started"),
        );
        let (i, started) = found.expect("found");
        let token = token_of(&started);
        drain_and_exit(&mut daemons[i], 30_000);
        let old = &daemons[i];
        let (_, fin) = old.expect_from(
            0,
            "its job_finished",
            |e| is(e, "job_finished") && token_of(e) == token,
            secs(0),
        );
        assert_eq!(str_field(&fin, "outcome"), Some("succeeded"), "{fin}");
        let (_, drained) = old.expect_from(0, "drain_ended", ev("drain_ended"), secs(0));
        assert_eq!(
            str_field(&drained, "reason"),
            Some("runs_finished"),
            "{drained}"
        );
        eprintln!("round {round}: {} drained run {token}", old.node);
        let fresh = Daemon::spawn(opts[i].clone());
        fresh.expect("daemon_started", ev("daemon_started"), secs(60));
        retired.push(std::mem::replace(&mut daemons[i], fresh));
    }
    // Two more instants after the last restart, then all three drain.
    let restarted_at = Utc::now();
    wait_until(
        secs(60),
        || {
            read_marks(&marks)
                .iter()
                .filter(|m| !m.start && m.at > restarted_at)
                .count()
                >= 2
        },
        || format!("no two runs after the restarts: {:?}", read_marks(&marks)),
    );
    for d in &daemons {
        d.signal(Signal::SIGTERM);
    }
    for d in &mut daemons {
        let st = d.wait_exit(secs(60));
        assert!(st.is_some_and(|s| s.success()), "[{}] {st:?}", d.node);
    }

    let all = read_marks(&marks);
    let starts: Vec<&Mark> = all.iter().filter(|m| m.start).collect();
    let (first, last) = (starts[0].at, starts[starts.len() - 1].at);
    let mut at = first;
    let mut previous_end: Option<u128> = None;
    while at <= last {
        let s: Vec<&&Mark> = starts.iter().filter(|m| m.at == at).collect();
        let e: Vec<&Mark> = all.iter().filter(|m| !m.start && m.at == at).collect();
        assert_eq!(
            s.len(),
            1,
            "instant {at} started {} times: {all:?}",
            s.len()
        );
        assert_eq!(e.len(), 1, "instant {at} ended {} times: {all:?}", e.len());
        assert_eq!(s[0].node, e[0].node, "{at}");
        if let Some(end) = previous_end {
            assert!(
                end <= s[0].ns,
                "the run of {at} overlapped the one before: {all:?}"
            );
        }
        previous_end = Some(e[0].ns);
        at += chrono::Duration::seconds(10);
    }
    let instants = (last - first).num_seconds() / 10 + 1;
    assert!(instants >= 5, "{instants} instants: {all:?}");
    let rows = history(dir.path(), &store.url, &config, &job);
    assert_eq!(rows.len(), starts.len(), "{rows:?}");
    for row in &rows {
        assert_eq!(str_field(row, "outcome"), Some("succeeded"), "{row}");
    }
    let everyone: Vec<&Daemon> = retired.iter().chain(daemons.iter()).collect();
    no_failures(&everyone);
    assert!(
        everyone.iter().all(|d| d.events("job_stopped").is_empty()),
        "a run was stopped"
    );
}

/// During a drain with a grace of an hour (systemd hears STOPPING=1 and
/// `STATUS=draining: 1 run(s) left, …`), a second SIGTERM (`sig`) or a
/// SIGINT stops at once: the job gets SIGTERM, the run ends `shutdown`
/// (`job_finished`, then `job_stopped` at INFO), no `job_failed`, no
/// `job_cancelled`, and its `on_failure` hook does not run.
fn a_stop_during_a_drain_stops_at_once(sig: Signal) {
    let store = TestStore::new(Backend::Sqlite, "stop_during_drain").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("endless");
    let hooked = dir.path().join("hook-ran");
    let extra = format!(
        "lease = \"5s\"\non_failure = [\"sh\", \"-c\", \"touch {}\"]",
        hooked.display()
    );
    let config = config(
        dir.path(),
        "1h",
        &[job_toml(
            &job,
            "* * * * * *",
            &sh("exec sleep 3600"),
            &extra,
        )],
    );
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).expect("bind the notify socket");
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    let mut opts = DaemonOpts::new(&unique("drain-stop"), &config, &store.url);
    opts.env
        .push(("NOTIFY_SOCKET".into(), sock_path.display().to_string()));
    let mut d = Daemon::spawn(opts);
    let started = d.expect("job_started", ev("job_started"), secs(60));
    let token = token_of(&started);
    let cut = d.len();
    d.signal(Signal::SIGTERM);
    let (_, stopping) = d.expect_from(cut, "daemon_stopping", ev("daemon_stopping"), secs(10));
    assert_eq!(
        i64_field(&stopping, "drain_ms"),
        Some(3_600_000),
        "{stopping}"
    );
    assert_eq!(i64_field(&stopping, "running"), Some(1), "{stopping}");
    let draining = recv_until_line(
        &sock,
        |l| l.starts_with("STATUS=draining: 1 run(s) left, stopping them in "),
        secs(30),
    );
    assert!(
        draining
            .iter()
            .flat_map(|m| m.lines())
            .any(|l| l == "STOPPING=1"),
        "no STOPPING=1 with the drain: {draining:?}"
    );
    d.signal(sig);
    // Without the second signal the drain would last an hour.
    let st = d.wait_exit(secs(60));
    assert!(
        st.is_some_and(|s| s.code() == Some(0)),
        "exit after {sig} during the drain: {st:?}; {}",
        d.summary()
    );
    let (_, drained) = d.expect_from(cut, "drain_ended", ev("drain_ended"), secs(0));
    assert_eq!(
        str_field(&drained, "reason"),
        Some(sig.as_str()),
        "{drained}"
    );
    assert_eq!(i64_field(&drained, "running"), Some(1), "{drained}");
    let (_, fin) = d.expect_from(
        cut,
        "job_finished",
        |e| is(e, "job_finished") && token_of(e) == token,
        secs(0),
    );
    assert_eq!(str_field(&fin, "outcome"), Some("shutdown"), "{fin}");
    assert_eq!(str_field(&fin, "signal"), Some("SIGTERM"), "{fin}");
    let (_, stopped) = d.expect_from(
        cut,
        "job_stopped",
        |e| is(e, "job_stopped") && token_of(e) == token,
        secs(0),
    );
    assert_eq!(str_field(&stopped, "level"), Some("INFO"), "{stopped}");
    assert_eq!(str_field(&stopped, "signal"), Some("SIGTERM"), "{stopped}");
    assert_eq!(str_field(&stopped, "reason"), Some("shutdown"), "{stopped}");
    no_failures(&[&d]);
    assert!(
        !hooked.exists(),
        "on_failure ran for a run stopped by a shutdown"
    );
    let rows = history(dir.path(), &store.url, &config, &job);
    let row = rows
        .iter()
        .find(|r| i64_field(r, "token") == Some(token))
        .unwrap_or_else(|| panic!("run {token} not in the history: {rows:?}"));
    assert_eq!(str_field(row, "outcome"), Some("shutdown"), "{row}");
}

#[test]
fn a_second_sigterm_stops_a_drain_at_once_sqlite() {
    a_stop_during_a_drain_stops_at_once(Signal::SIGTERM);
}

#[test]
fn a_sigint_stops_a_drain_at_once_sqlite() {
    a_stop_during_a_drain_stops_at_once(Signal::SIGINT);
}

/// Two daemons on PostgreSQL, restarted in turn (SIGTERM, exit, start
/// again) every two runs for a minute, run a job due every 2 s: every
/// instant from the first to the last ran exactly once (the job's own
/// record and the history agree), and nothing failed.
#[test]
fn two_daemons_restarted_in_turn_run_every_instant_once_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "restarted_in_turn") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("inturn");
    let runs_file = dir.path().join("runs");
    let config = config(
        dir.path(),
        "30s",
        &[job_toml(
            &job,
            "*/2 * * * * *",
            &record_cmd(&runs_file),
            "lease = \"5s\"",
        )],
    );
    let opts: Vec<DaemonOpts> = ["a", "b"]
        .iter()
        .map(|n| DaemonOpts::new(&unique(&format!("turn-{n}")), &config, &store.url))
        .collect();
    let mut daemons: Vec<Daemon> = opts.iter().cloned().map(Daemon::spawn).collect();
    for d in &daemons {
        d.expect("daemon_started", ev("daemon_started"), secs(60));
    }
    let mut retired: Vec<Daemon> = Vec::new();
    let began = Instant::now();
    let mut turn = 0;
    // For a minute, and each daemon at least once.
    while turn < 2 || began.elapsed() < secs(60) {
        let before = read_runs(&runs_file).len();
        wait_until(
            secs(30),
            || read_runs(&runs_file).len() >= before + 2,
            || format!("no two runs after restart {turn}"),
        );
        let i = turn % 2;
        drain_and_exit(&mut daemons[i], 30_000);
        let fresh = Daemon::spawn(opts[i].clone());
        fresh.expect("daemon_started", ev("daemon_started"), secs(60));
        retired.push(std::mem::replace(&mut daemons[i], fresh));
        turn += 1;
    }
    let before = read_runs(&runs_file).len();
    wait_until(
        secs(30),
        || read_runs(&runs_file).len() >= before + 2,
        || "no two runs after the last restart".to_string(),
    );
    for d in &mut daemons {
        drain_and_exit(d, 30_000);
    }
    eprintln!("{turn} restarts");

    let runs = read_runs(&runs_file);
    let first = runs.iter().map(|r| r.scheduled_at).min().expect("runs");
    let last = runs.iter().map(|r| r.scheduled_at).max().expect("runs");
    let rows = history(dir.path(), &store.url, &config, &job);
    let mut at = first;
    while at <= last {
        let ran = runs.iter().filter(|r| r.scheduled_at == at).count();
        assert_eq!(ran, 1, "instant {at} ran {ran} times: {runs:?}");
        let recorded = rows
            .iter()
            .filter(|r| {
                str_field(r, "scheduled_at")
                    .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
                    .is_some_and(|s| s == at)
            })
            .count();
        assert_eq!(
            recorded, 1,
            "instant {at} is in the history {recorded} times"
        );
        at += chrono::Duration::seconds(2);
    }
    assert_eq!(rows.len(), runs.len(), "{rows:?}");
    let everyone: Vec<&Daemon> = retired.iter().chain(daemons.iter()).collect();
    no_failures(&everyone);
}

/// SIGHUP cannot change `shutdown_grace`: the reload logs `config_ignored`
/// for `node.shutdown_grace`, and the drain keeps the value the daemon
/// started with.
#[test]
fn a_reload_does_not_change_the_shutdown_grace_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "grace_reload").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("grace");
    let jobs = [job_toml(
        &job,
        "* * * * * *",
        &sh("exec sleep 3600"),
        "lease = \"5s\"",
    )];
    let config = config(dir.path(), "1h", &jobs);
    let mut d = Daemon::spawn(DaemonOpts::new(&unique("grace"), &config, &store.url));
    d.expect("job_started", ev("job_started"), secs(60));
    let config_again = self::config(dir.path(), "0s", &jobs);
    assert_eq!(config, config_again);
    let cut = d.len();
    d.signal(Signal::SIGHUP);
    let (_, ignored) = d.expect_from(
        cut,
        "config_ignored for node.shutdown_grace",
        |e| is(e, "config_ignored") && str_field(e, "key") == Some("node.shutdown_grace"),
        secs(30),
    );
    eprintln!("{ignored}");
    d.expect_from(cut, "config_reloaded", ev("config_reloaded"), secs(30));
    drain_stop(&mut d, 3_600_000);
}

/// SIGTERM, a drain of `grace_ms`, then SIGINT: exits 0 at once.
fn drain_stop(d: &mut Daemon, grace_ms: i64) {
    let cut = d.len();
    d.signal(Signal::SIGTERM);
    let (_, stopping) = d.expect_from(cut, "daemon_stopping", ev("daemon_stopping"), secs(10));
    assert_eq!(
        i64_field(&stopping, "drain_ms"),
        Some(grace_ms),
        "{stopping}"
    );
    d.signal(Signal::SIGINT);
    let st = d.wait_exit(secs(60));
    assert!(st.is_some_and(|s| s.success()), "{st:?}; {}", d.summary());
}

//! The run watchdog (docs/guarantee.md, "The guarantee, exactly", point 1): a job is dead before its lease
//! can expire even when the process that supervises it is killed, aborts or
//! stalls, and a restarted daemon gives back the leases of its own runs once
//! they are provably dead, but never while one might still be alive.
//!
//! Every job here writes a heartbeat line (`TOKEN EPOCH_MS ROLE`) every
//! 200 ms, and forks a second process of its group that does the same, so
//! the checks cover the whole process group, not just its leader:
//! no heartbeat of token N after N's stored expiry, none after the first
//! heartbeat of a later token, and the group is gone.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::DateTime;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use common::daemon::{
    group_alive, i64_field, is, job_toml, pid_of, secs, str_field, token_of, write_config, Daemon,
    DaemonOpts,
};
use common::harness::run;
use common::{unique, Backend, TestStore};

/// A job that heartbeats from its leader and from a forked member of its
/// group, and writes the leader's pid to `dir/pid.TOKEN`. With
/// `ignore_term` it ignores SIGTERM (only SIGKILL ends it).
fn heartbeat_cmd(dir: &Path, ignore_term: bool) -> Vec<String> {
    let trap = if ignore_term { "trap '' TERM; " } else { "" };
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            r#"{trap}hb() {{ while :; do echo "$FENCECRON_TOKEN $(date +%s%3N) $1" >> "$D/hb"; sleep 0.2; done; }}; hb grandchild & echo $$ > "$D/pid.$FENCECRON_TOKEN"; hb leader"#
        ),
    ]
    .into_iter()
    .map(|s: String| s.replace("$D", &dir.display().to_string()))
    .collect()
}

/// One heartbeat line.
#[derive(Debug, Clone, Copy)]
struct Beat {
    token: i64,
    at_ms: i64,
    grandchild: bool,
}

fn beats(dir: &Path) -> Vec<Beat> {
    let text = std::fs::read_to_string(dir.join("hb")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3).then_some(())?;
            Some(Beat {
                token: f[0].parse().ok()?,
                at_ms: f[1].parse().ok()?,
                grandchild: f[2] == "grandchild",
            })
        })
        .collect()
}

/// Waits until token `t` has heartbeats from both its leader and the other
/// member of its group, `n` in all.
fn wait_beats(dir: &Path, t: i64, n: usize, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let b: Vec<Beat> = beats(dir).into_iter().filter(|b| b.token == t).collect();
        if b.len() >= n && b.iter().any(|b| b.grandchild) && b.iter().any(|b| !b.grandchild) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "token {t}: only {} heartbeats within {timeout:?}",
            b.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ms_of(rfc3339: &str) -> i64 {
    DateTime::parse_from_rfc3339(rfc3339)
        .unwrap_or_else(|e| panic!("not RFC 3339: {rfc3339:?}: {e}"))
        .timestamp_millis()
}

fn wall_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The latest expiry the store gave token `t`, as its holder logged it
/// (`lease_acquired`, `lease_renewed`). The holder logs each renewal before
/// it hands the new deadline to the watchdog, so the watchdog never works
/// to a later expiry than this.
fn logged_expiry(events: &[Value], t: i64) -> i64 {
    events
        .iter()
        .filter(|e| (is(e, "lease_acquired") || is(e, "lease_renewed")) && token_of(e) == t)
        .filter_map(|e| str_field(e, "expires_at").map(ms_of))
        .max()
        .unwrap_or_else(|| panic!("no expiry logged for token {t}"))
}

/// No heartbeat of `old` after its stored expiry or after the first
/// heartbeat of `new`, and its process group is gone.
fn assert_no_overlap(dir: &Path, old: i64, old_pgid: i32, expiry_ms: i64, new: i64) {
    let all = beats(dir);
    let last_old = all
        .iter()
        .filter(|b| b.token == old)
        .map(|b| b.at_ms)
        .max()
        .expect("heartbeats of the old token");
    let first_new = all
        .iter()
        .filter(|b| b.token == new)
        .map(|b| b.at_ms)
        .min()
        .expect("heartbeats of the new token");
    assert!(
        !group_alive(old_pgid),
        "the process group of token {old} ({old_pgid}) is still alive"
    );
    assert!(
        last_old <= expiry_ms,
        "token {old} heartbeat at {last_old}, {} ms after its stored expiry {expiry_ms}",
        last_old - expiry_ms
    );
    assert!(
        last_old < first_new,
        "token {old} heartbeat at {last_old} after token {new}'s first at {first_new}"
    );
}

fn read_pid(dir: &Path, token: i64) -> i32 {
    common::daemon::read_pid_file(&dir.join(format!("pid.{token}")), secs(10))
}

/// Two daemons share a job; the one running it is hit with `how`. The other
/// takes over after the lease expired, and the old run is gone before that.
fn owner_fails(test: &str, how: Signal) {
    let store = TestStore::new(Backend::Sqlite, test).expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("wd");
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "* * * * * *",
            &heartbeat_cmd(dir.path(), false),
            "lease = \"5s\"",
        )],
    );
    let a = Daemon::spawn(DaemonOpts::new(&unique("wd-a"), &config, &store.url).debug());
    let b = Daemon::spawn(DaemonOpts::new(&unique("wd-b"), &config, &store.url).debug());
    let deadline = Instant::now() + secs(30);
    let (owner, other, started) = loop {
        if let Some(e) = a.wait_for(|e| is(e, "job_started"), Duration::ZERO) {
            break (&a, &b, e);
        }
        if let Some(e) = b.wait_for(|e| is(e, "job_started"), Duration::ZERO) {
            break (&b, &a, e);
        }
        assert!(Instant::now() < deadline, "no job started on either daemon");
        std::thread::sleep(Duration::from_millis(20));
    };
    let t1 = token_of(&started);
    let p1 = pid_of(&started);
    assert_eq!(read_pid(dir.path(), t1), p1);
    wait_beats(dir.path(), t1, 4, secs(10));

    let hit_at = wall_ms();
    owner.signal(how);
    eprintln!(
        "{how} sent to {} running token {t1} (pgid {p1})",
        owner.node
    );
    if how != Signal::SIGSTOP {
        // The watchdog saw its daemon go: SIGTERM at once, and this job
        // obeys it, so nothing of it survives the grace (1 s for a 5 s
        // lease), long before the lease runs out.
        let gone_by = Instant::now() + secs(3);
        while group_alive(p1) {
            assert!(
                Instant::now() < gone_by,
                "token {t1}'s group still runs 3 s after its daemon got {how}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let last = beats(dir.path())
            .iter()
            .filter(|b| b.token == t1)
            .map(|b| b.at_ms)
            .max()
            .unwrap();
        assert!(
            last <= hit_at + 1_500,
            "token {t1} heartbeat {} ms after its daemon got {how}",
            last - hit_at
        );
    }
    let later = other.expect(
        "the other daemon runs the job with a higher token",
        |e| is(e, "job_started") && token_of(e) > t1,
        secs(30),
    );
    let t2 = token_of(&later);
    wait_beats(dir.path(), t2, 4, secs(10));
    assert_no_overlap(dir.path(), t1, p1, logged_expiry(&owner.all(), t1), t2);
    if how == Signal::SIGSTOP {
        owner.signal(Signal::SIGCONT);
        owner.expect(
            "lease_lost once the paused daemon resumes",
            |e| is(e, "lease_lost") && token_of(e) == t1,
            secs(15),
        );
    }
}

#[test]
fn daemon_sigkill_kills_its_job_sqlite() {
    owner_fails("daemon_sigkill_kills_its_job_sqlite", Signal::SIGKILL);
}

#[test]
fn daemon_sigstop_job_dies_before_expiry_sqlite() {
    owner_fails(
        "daemon_sigstop_job_dies_before_expiry_sqlite",
        Signal::SIGSTOP,
    );
}

#[test]
fn daemon_sigabrt_kills_its_job_sqlite() {
    owner_fails("daemon_sigabrt_kills_its_job_sqlite", Signal::SIGABRT);
}

/// `fencecron exec` killed with SIGKILL: its job goes at once, and the next
/// owner (after the lease expired) sees no heartbeat of the old token.
#[test]
fn exec_sigkill_kills_its_job() {
    let store = TestStore::new(Backend::Sqlite, "exec_sigkill_kills_its_job").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let resource = unique("wd-exec");
    let log_path = dir.path().join("exec.log");
    let mut cmd = common::harness::fencecron(dir.path());
    cmd.args([
        "--store",
        &store.url,
        "--log-format",
        "json",
        "exec",
        &resource,
        "--lease",
        "5s",
        "--",
    ])
    .args(heartbeat_cmd(dir.path(), false))
    .env("FENCECRON_LOG", "debug,sqlx=off")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log_path).expect("log file"));
    let mut exec = cmd.spawn().expect("start exec");
    // Token 1: the resource is new.
    let p1 = read_pid(dir.path(), 1);
    wait_beats(dir.path(), 1, 4, secs(10));

    let hit_at = wall_ms();
    kill(Pid::from_raw(exec.id() as i32), Signal::SIGKILL).expect("kill exec");
    let _ = exec.wait();
    let gone_by = Instant::now() + secs(3);
    while group_alive(p1) {
        assert!(Instant::now() < gone_by, "exec's job survived it by 3 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let last = beats(dir.path()).iter().map(|b| b.at_ms).max().unwrap();
    assert!(
        last <= hit_at + 1_500,
        "heartbeat {} ms after SIGKILL",
        last - hit_at
    );

    // The lease stays held until it expires by the store's clock; then the
    // next owner gets token 2.
    let events: Vec<Value> = std::fs::read_to_string(&log_path)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let expiry = logged_expiry(&events, 1);
    let deadline = Instant::now() + secs(30);
    let acquired_at = loop {
        let out = run(
            common::harness::fencecron(dir.path()).args([
                "--store", &store.url, "lease", "acquire", &resource, "--json",
            ]),
            None,
        );
        if out.status.code() == Some(0) {
            let v: Value = serde_json::from_slice(&out.stdout).expect("json");
            assert_eq!(i64_field(&v, "token"), Some(2), "{v}");
            break wall_ms();
        }
        assert_eq!(out.status.code(), Some(75), "lease acquire: {out:?}");
        assert!(Instant::now() < deadline, "the lease was never freed");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(last <= expiry && last < acquired_at);
}

/// Starts a single daemon for the restart tests.
fn single(node: &str, config: &Path, store: &str) -> Daemon {
    Daemon::spawn(DaemonOpts::new(node, config, store).debug())
}

fn restart_config(dir: &Path, job: &str, ignore_term: bool) -> PathBuf {
    write_config(
        dir,
        "",
        &[job_toml(
            job,
            "* * * * * *",
            &heartbeat_cmd(dir, ignore_term),
            "lease = \"30s\"\nkill_grace = \"3s\"",
        )],
    )
}

/// A daemon whose run was noted, killed with SIGKILL mid-run and started
/// again as the same node on the same store.
struct Restarted {
    /// Kept (not dropped) until the end: dropping it would kill the jobs it
    /// saw start, doing the watchdog's work for it. (Fields drop in order:
    /// the daemons before their directory and store.)
    _first: Daemon,
    second: Daemon,
    dir: tempfile::TempDir,
    /// The old run: token, process group, stored expiry.
    t1: i64,
    p1: i32,
    expiry: i64,
    /// The second daemon's `run_recovered` for the old run, `released`.
    recovered: Value,
    _store: TestStore,
}

fn kill_and_restart(test: &str, ignore_term: bool) -> Restarted {
    let store = TestStore::new(Backend::Sqlite, test).expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("wd-restart");
    let config = restart_config(dir.path(), &job, ignore_term);
    let node = unique("wd-r");
    let first = single(&node, &config, &store.url);
    let started = first.expect("job_started", |e| is(e, "job_started"), secs(30));
    let t1 = token_of(&started);
    let p1 = pid_of(&started);
    wait_beats(dir.path(), t1, 3, secs(10));
    let expiry = logged_expiry(&first.all(), t1);
    first.signal(Signal::SIGKILL);

    let second = single(&node, &config, &store.url);
    let recovered = second.expect(
        "run_recovered for the old run",
        |e| is(e, "run_recovered") && token_of(e) == t1,
        secs(20),
    );
    assert_eq!(
        str_field(&recovered, "outcome"),
        Some("released"),
        "{recovered}"
    );
    Restarted {
        dir,
        _first: first,
        second,
        t1,
        p1,
        expiry,
        recovered,
        _store: store,
    }
}

impl Restarted {
    /// The next run (a higher token) starts, and never beside the old one.
    fn next_run_without_overlap(&self) -> Value {
        let later = self.second.expect(
            "the job runs again with a higher token",
            |e| is(e, "job_started") && token_of(e) > self.t1,
            secs(15),
        );
        let t2 = token_of(&later);
        wait_beats(self.dir.path(), t2, 3, secs(10));
        assert_no_overlap(self.dir.path(), self.t1, self.p1, self.expiry, t2);
        later
    }
}

/// A daemon killed with SIGKILL and started again gives back the lease of
/// its own dead run at once, instead of leaving the job blocked fleet-wide
/// until the lease expires.
#[test]
fn restarted_daemon_releases_its_dead_run_sqlite() {
    let r = kill_and_restart("restarted_releases", false);
    let later = r.next_run_without_overlap();
    let started_ms = ms_of(str_field(&later, "timestamp").expect("timestamp"));
    assert!(
        started_ms < r.expiry - 10_000,
        "the next run waited for the old lease to expire ({started_ms} vs {})",
        r.expiry
    );
}

/// A restarted daemon whose previous run is still being terminated (its job
/// ignores SIGTERM, so it lives until the grace ends) waits for it to die
/// before it gives the lease back.
#[test]
fn restarted_daemon_waits_for_a_run_still_alive_sqlite() {
    let r = kill_and_restart("restarted_waits", true);
    let recovered_ms = ms_of(str_field(&r.recovered, "timestamp").expect("timestamp"));
    let last_t1 = beats(r.dir.path())
        .iter()
        .filter(|b| b.token == r.t1)
        .map(|b| b.at_ms)
        .max()
        .unwrap();
    assert!(
        recovered_ms >= last_t1,
        "the lease was given back at {recovered_ms} while token {} still ran ({last_t1})",
        r.t1
    );
    r.next_run_without_overlap();
}

/// Installed alone (no `fencecron-shim` beside it), `fencecron` runs its
/// own `__shim` mode as the watchdog; beside it, the small binary is used.
#[test]
fn watchdog_binary_is_found_beside_fencecron_or_built_in() {
    let store = TestStore::new(Backend::Sqlite, "watchdog_binary").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let alone = dir.path().join("alone");
    std::fs::create_dir(&alone).unwrap();
    let copy = alone.join("fencecron");
    std::fs::copy(common::bin(), &copy).expect("copy the binary");
    let watchdog_of = |bin: &Path| {
        let mut cmd = common::harness::clean(std::process::Command::new(bin), dir.path());
        cmd.args(["--store", &store.url, "exec", &unique("wd-bin"), "--"])
            .args(["sh", "-c", "tr '\\0' ' ' < /proc/$PPID/cmdline; exit 7"]);
        let out = run(&mut cmd, None);
        assert_eq!(
            out.status.code(),
            Some(7),
            "the job's exit code passes through"
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let built_in = watchdog_of(&copy);
    assert!(built_in.starts_with("fencecron-shim __shim "), "{built_in}");
    let beside = watchdog_of(&common::bin());
    assert!(
        beside.starts_with("fencecron-shim ") && !beside.contains("__shim"),
        "{beside}"
    );
}

/// The daemon's watchdogs are forked by its spawner (`fencecron-spawn`,
/// the daemon's child), not executed by the daemon; each still reports
/// the job's exit code and signal. A killed spawner is replaced at the
/// next run, and no run is lost to it.
#[test]
fn daemon_forks_watchdogs_through_its_spawner_and_replaces_a_killed_one() {
    let store = TestStore::new(Backend::Sqlite, "wd_spawner").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let (coded, signalled) = (unique("wd-sp-code"), unique("wd-sp-sig"));
    // Each run writes: its watchdog's pid and name, the watchdog's parent.
    let report = |name: &str, end: &str| {
        common::daemon::sh(&format!(
            r#"w=$PPID; p=$(awk '{{print $4}}' /proc/$w/stat); echo "$FENCECRON_TOKEN $w $(cat /proc/$w/comm) $p $(cat /proc/$p/comm)" >> "{}/{name}"; {end}"#,
            dir.path().display()
        ))
    };
    let config = write_config(
        dir.path(),
        "",
        &[
            job_toml(&coded, "* * * * * *", &report(&coded, "exit 7"), ""),
            job_toml(
                &signalled,
                "* * * * * *",
                &report(&signalled, "kill -USR1 $$"),
                "",
            ),
        ],
    );
    let mut daemon = single(&unique("wd-sp"), &config, &store.url);
    let finished = |job: &str, after: usize| {
        let job = job.to_string();
        daemon
            .expect_from(
                after,
                &format!("job_finished of {job}"),
                move |e| is(e, "job_finished") && str_field(e, "job") == Some(job.as_str()),
                secs(20),
            )
            .1
    };
    let code = finished(&coded, 0);
    assert_eq!(i64_field(&code, "exit_code"), Some(7), "{code}");
    let sig = finished(&signalled, 0);
    assert_eq!(str_field(&sig, "signal"), Some("SIGUSR1"), "{sig}");
    let lines = |job: &str| -> Vec<Vec<String>> {
        std::fs::read_to_string(dir.path().join(job))
            .unwrap_or_default()
            .lines()
            .map(|l| l.split_whitespace().map(String::from).collect())
            .collect()
    };
    let first = lines(&coded)[0].clone();
    assert_eq!(first[2], "fencecron-shim", "{first:?}");
    assert_eq!(first[4], "fencecron-spawn", "{first:?}");
    let spawner: i32 = first[3].parse().unwrap();
    let parent = std::fs::read_to_string(format!("/proc/{spawner}/stat")).expect("spawner");
    let parent: i32 = parent[parent.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        parent,
        daemon.pid().as_raw(),
        "the spawner is the daemon's child"
    );

    kill(Pid::from_raw(spawner), Signal::SIGKILL).expect("kill the spawner");
    let after = daemon.len();
    let seen = lines(&coded).len();
    let code = finished(&coded, after);
    assert_eq!(i64_field(&code, "exit_code"), Some(7), "{code}");
    common::daemon::wait_until(
        secs(20),
        || {
            lines(&coded).iter().skip(seen).any(|l| {
                l[3].parse::<i32>().is_ok_and(|p| p != spawner) && l[4] == "fencecron-spawn"
            })
        },
        || format!("no run through a new spawner: {:?}", lines(&coded)),
    );
    assert!(
        daemon.events("spawner_unavailable").is_empty(),
        "a killed spawner is replaced, not given up: {}",
        daemon.summary()
    );
    assert!(daemon.events("job_failed").iter().all(|e| {
        i64_field(e, "exit_code") == Some(7) || str_field(e, "signal") == Some("SIGUSR1")
    }));
    daemon.stop(secs(30));
}

/// A watchdog whose term deadline has passed before it could start the job
/// (a spawner that was stopped or starved while the daemon gave up on the
/// start) reports an error and never runs the job.
#[test]
fn a_watchdog_never_starts_a_job_past_its_deadline() {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let marker = dir.path().join("ran");
    let now_ns = {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime into a live timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    };
    let run = |term_at: u64| {
        let (ctl_r, ctl_w) = nix::unistd::pipe().expect("pipe");
        let (st_r, st_w) = nix::unistd::pipe().expect("pipe");
        let (c, s) = (ctl_r.as_raw_fd(), st_w.as_raw_fd());
        let mut cmd = std::process::Command::new(common::bin());
        cmd.arg("__shim")
            .arg(term_at.to_string())
            .arg((term_at + 1_000_000_000).to_string())
            .args(["1000", "--", "sh", "-c"])
            .arg(format!("touch '{}'", marker.display()));
        // SAFETY: only dup2 between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(c, 3) < 0 || libc::dup2(s, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("start the watchdog");
        drop((ctl_r, st_w));
        let mut line = String::new();
        std::fs::File::from(st_r)
            .read_to_string(&mut line)
            .expect("status");
        let status = child.wait().expect("wait");
        drop(ctl_w);
        (line, status.code())
    };
    let (line, code) = run(now_ns.saturating_sub(1_000_000_000));
    assert!(line.starts_with("E the run's deadline passed"), "{line:?}");
    assert_eq!(code, Some(127));
    assert!(!marker.exists(), "the job ran past its deadline");
    // The same start within its deadline runs the job (the check is not
    // what keeps it from running above).
    let (line, code) = run(now_ns + 60_000_000_000);
    assert!(line.starts_with("P "), "{line:?}");
    assert_eq!(code, Some(0));
    assert!(marker.exists(), "the job did not run");
}

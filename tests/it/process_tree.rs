//! A run is its whole process tree: whatever a job starts, in any session
//! or process group, stops with it (lease loss, timeout, shutdown, the
//! daemon's death, the job's own exit), and its lease is released only
//! once all of it is gone.
//!
//! Every job here starts a *helper* that leaves the job's process group
//! and session (`setsid`), either as its child or daemonised by a double
//! fork (its parent exits, so it is orphaned and re-parented). The helper
//! writes its pid to `dir/helper.TOKEN` and heartbeats (`TOKEN EPOCH_MS
//! helper`) every 100 ms; the test watches it through a pidfd, so it knows
//! when it died to the millisecond, without polling.

use crate::common;

use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::DateTime;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use common::daemon::{
    ev, ev_token, is, pid_alive, read_pid_file, secs, str_field, token_of, write_config, Daemon,
    DaemonOpts,
};
use common::proxy::Proxy;
use common::{unique, Backend, TestStore};

/// How the job starts its helper.
#[derive(Clone, Copy)]
enum Start {
    /// `setsid helper &`: a child of the job's leader, in a session (and
    /// process group) of its own.
    Setsid,
    /// `(setsid helper &)`: a subshell starts it and exits at once, so the
    /// helper is orphaned and re-parented, as a daemonising script does.
    DoubleFork,
}

/// What the helper does with SIGTERM.
#[derive(Clone, Copy)]
enum OnTerm {
    /// Ignores it: only SIGKILL ends it.
    Ignore,
    /// Appends its token to `dir/term` and exits.
    Record,
}

/// What the job's leader does after starting its helper.
#[derive(Clone, Copy)]
enum Leader {
    /// Keeps running (ignoring SIGTERM as the helper does, when it does).
    Runs,
    /// Exits 0 at once.
    Exits,
}

/// Writes `dir/helper.sh` and returns the job's command.
fn tree_job(dir: &Path, start: Start, on_term: OnTerm, leader: Leader) -> Vec<String> {
    let d = dir.display().to_string();
    let trap = match on_term {
        OnTerm::Ignore => "trap '' TERM".to_string(),
        OnTerm::Record => format!(r#"trap 'echo "$FENCECRON_TOKEN" >> "{d}/term"; exit 0' TERM"#),
    };
    let helper = format!(
        r#"{trap}
echo $$ > "{d}/helper.$FENCECRON_TOKEN.tmp"
mv "{d}/helper.$FENCECRON_TOKEN.tmp" "{d}/helper.$FENCECRON_TOKEN"
while :; do echo "$FENCECRON_TOKEN $(date +%s%3N) helper" >> "{d}/hb"; sleep 0.1; done
"#
    );
    std::fs::write(dir.join("helper.sh"), helper).expect("write helper.sh");
    let spawn = match start {
        Start::Setsid => format!(r#"setsid sh "{d}/helper.sh" &"#),
        Start::DoubleFork => format!(r#"(setsid sh "{d}/helper.sh" &)"#),
    };
    let rest = match (leader, on_term) {
        (Leader::Exits, _) => {
            // Exit only once the helper runs, so it is there to be stopped.
            format!(r#"while [ ! -e "{d}/helper.$FENCECRON_TOKEN" ]; do sleep 0.05; done; exit 0"#)
        }
        (Leader::Runs, OnTerm::Ignore) => "trap '' TERM; while :; do sleep 0.1; done".to_string(),
        (Leader::Runs, OnTerm::Record) => "while :; do sleep 0.1; done".to_string(),
    };
    vec!["sh".into(), "-c".into(), format!("{spawn}\n{rest}")]
}

/// The helper of token `t`: its pid, and when it died (wall-clock epoch
/// ms, read the moment its pidfd said so). Killed when dropped, should a
/// failing test leave it running.
struct Helper {
    pid: i32,
    died_at: Arc<Mutex<Option<i64>>>,
}

impl Helper {
    fn of(dir: &Path, t: i64) -> Helper {
        let pid = read_pid_file(&dir.join(format!("helper.{t}")), secs(15));
        // SAFETY: pidfd_open returns a new descriptor we own, or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        assert!(fd >= 0, "pidfd_open({pid}): the helper is already gone");
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let died_at = Arc::new(Mutex::new(None));
        let out = Arc::clone(&died_at);
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // A pidfd becomes readable when the process exits.
            // SAFETY: one live pollfd.
            while unsafe { libc::poll(&mut p, 1, 120_000) } <= 0 {}
            *out.lock().unwrap() = Some(wall_ms());
        });
        Helper { pid, died_at }
    }

    /// Waits (up to `timeout`) for the helper to die; when it died.
    fn dead_by(&self, timeout: Duration, what: &str) -> i64 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(at) = *self.died_at.lock().unwrap() {
                return at;
            }
            assert!(
                Instant::now() < deadline,
                "the helper ({}) still runs {timeout:?} after {what}",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if pid_alive(self.pid) {
            let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
        }
    }
}

fn wall_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn ms_of(e: &Value, field: &str) -> i64 {
    let s = str_field(e, field).unwrap_or_else(|| panic!("no {field} in {e}"));
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("not RFC 3339: {s:?}: {e}"))
        .timestamp_millis()
}

/// The last heartbeat of token `t`'s helper (epoch ms).
fn last_beat(dir: &Path, t: i64) -> Option<i64> {
    let text = std::fs::read_to_string(dir.join("hb")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[0].parse::<i64>().ok()? == t).then(|| f[1].parse().ok())?
        })
        .max()
}

/// Waits until token `t`'s helper has heartbeaten `n` times.
fn wait_beats(dir: &Path, t: i64, n: usize) {
    let count = || {
        std::fs::read_to_string(dir.join("hb"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(t.to_string().as_str()))
            .count()
    };
    common::daemon::wait_until(
        secs(15),
        || count() >= n,
        || format!("token {t}: {} heartbeats", count()),
    );
}

/// The latest expiry the store gave token `t` (`lease_acquired`,
/// `lease_renewed`): the daemon logs each before it hands the deadline on.
fn logged_expiry(events: &[Value], t: i64) -> i64 {
    events
        .iter()
        .filter(|e| (is(e, "lease_acquired") || is(e, "lease_renewed")) && token_of(e) == t)
        .map(|e| ms_of(e, "expires_at"))
        .max()
        .unwrap_or_else(|| panic!("no expiry logged for token {t}"))
}

/// Whether the helper received SIGTERM (it recorded its token).
fn termed(dir: &Path, t: i64) -> bool {
    std::fs::read_to_string(dir.join("term"))
        .unwrap_or_default()
        .lines()
        .any(|l| l.trim() == t.to_string())
}

fn one_job(dir: &Path, argv: &[String], extra: &str) -> (String, PathBuf) {
    let job = unique("tree");
    let config = write_config(
        dir,
        "",
        &[common::daemon::job_toml(&job, "* * * * * *", argv, extra)],
    );
    (job, config)
}

/// The store black-holed (renewals hang): the helper, in a session of its
/// own and deaf to SIGTERM, is dead before the lease's stored expiry.
#[test]
fn setsid_grandchild_dies_before_expiry_store_blackholed_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "tree_blackholed_postgres") else {
        return;
    };
    let (proxy, proxied) = Proxy::for_url(&store.url, 5432);
    let dir = tempfile::tempdir().expect("temp dir");
    let argv = tree_job(dir.path(), Start::Setsid, OnTerm::Ignore, Leader::Runs);
    let (_, config) = one_job(dir.path(), &argv, "lease = \"5s\"");
    let d = Daemon::spawn(DaemonOpts::new(&unique("tree-bh"), &config, &proxied).debug());
    let started = d.expect("job_started", ev("job_started"), secs(60));
    let t = token_of(&started);
    let helper = Helper::of(dir.path(), t);
    wait_beats(dir.path(), t, 3);

    proxy.blackhole();
    let died = helper.dead_by(secs(15), "the store was black-holed");
    let expiry = logged_expiry(&d.all(), t);
    let last = last_beat(dir.path(), t).expect("heartbeats");
    eprintln!("helper died at {died}, last beat {last}, stored expiry {expiry}");
    assert!(
        died < expiry,
        "the helper died {} ms after the lease's stored expiry",
        died - expiry
    );
    assert!(last < expiry);
    let cancelled = d.expect("job_cancelled", ev_token("job_cancelled", t), secs(1));
    assert_eq!(
        str_field(&cancelled, "reason"),
        Some("lease_unconfirmed"),
        "{cancelled}"
    );
    proxy.restore();
}

/// Runs a daemon whose job starts a helper as `start`, hits the daemon with
/// SIGKILL, and checks the helper dies before the lease's stored expiry.
fn daemon_killed(test: &str, start: Start) {
    let store = TestStore::new(Backend::Sqlite, test).expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let argv = tree_job(dir.path(), start, OnTerm::Ignore, Leader::Runs);
    let (_, config) = one_job(dir.path(), &argv, "lease = \"5s\"");
    let d = Daemon::spawn(DaemonOpts::new(&unique("tree-k9"), &config, &store.url).debug());
    let started = d.expect("job_started", ev("job_started"), secs(30));
    let t = token_of(&started);
    let helper = Helper::of(dir.path(), t);
    wait_beats(dir.path(), t, 3);
    let expiry = logged_expiry(&d.all(), t);

    d.signal(Signal::SIGKILL);
    // The watchdog saw its daemon die: SIGTERM to the tree at once (the
    // helper ignores it), SIGKILL after the grace (1 s for a 5 s lease).
    let died = helper.dead_by(secs(10), "its daemon was killed");
    assert!(
        died < expiry,
        "the helper died {} ms after the lease's stored expiry",
        died - expiry
    );
}

#[test]
fn setsid_grandchild_dies_when_the_daemon_is_killed_sqlite() {
    daemon_killed("tree_daemon_sigkill", Start::Setsid);
}

/// A helper daemonised by a double fork (orphaned, re-parented to the
/// run's watchdog, not to PID 1) dies with the daemon too.
#[test]
fn double_forked_helper_dies_when_the_daemon_is_killed_sqlite() {
    daemon_killed("tree_daemon_sigkill_double_fork", Start::DoubleFork);
}

/// A job's timeout reaches its helper in another session: SIGTERM first
/// (it records it and exits), and the lease is released only after.
#[test]
fn timeout_terminates_a_setsid_grandchild_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "tree_timeout").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let argv = tree_job(dir.path(), Start::Setsid, OnTerm::Record, Leader::Runs);
    let (_, config) = one_job(dir.path(), &argv, "lease = \"30s\"\ntimeout = \"2s\"");
    let d = Daemon::spawn(DaemonOpts::new(&unique("tree-to"), &config, &store.url));
    let started = d.expect("job_started", ev("job_started"), secs(30));
    let t = token_of(&started);
    let helper = Helper::of(dir.path(), t);
    let cancelled = d.expect("job_cancelled", ev_token("job_cancelled", t), secs(15));
    assert_eq!(
        str_field(&cancelled, "reason"),
        Some("timeout"),
        "{cancelled}"
    );
    let died = helper.dead_by(secs(10), "the job's timeout");
    assert!(termed(dir.path(), t), "the helper never got SIGTERM");
    let released = d.expect("lease_released", ev_token("lease_released", t), secs(10));
    assert!(
        died <= ms_of(&released, "timestamp"),
        "released before the helper died"
    );
}

/// The store refuses a renewal (another owner took the lease): the helper
/// in another session gets SIGTERM at once.
#[test]
fn lease_loss_terminates_a_setsid_grandchild_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "tree_lease_lost").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let argv = tree_job(dir.path(), Start::Setsid, OnTerm::Record, Leader::Runs);
    let (job, config) = one_job(
        dir.path(),
        &argv,
        "lease = \"6s\"\nrenew_every = \"1s\"\nkill_grace = \"1s\"",
    );
    let d = Daemon::spawn(DaemonOpts::new(&unique("tree-ll"), &config, &store.url).debug());
    let started = d.expect("job_started", ev("job_started"), secs(30));
    let t = token_of(&started);
    let helper = Helper::of(dir.path(), t);
    let mut db = crate::daemon_faults::Db::connect(&store);
    assert_eq!(
        db.intrude(&job),
        1,
        "the lease row of {job} was not updated"
    );
    let lost = d.expect("lease_lost", ev_token("lease_lost", t), secs(20));
    assert_eq!(str_field(&lost, "reason"), Some("renew_refused"), "{lost}");
    helper.dead_by(secs(10), "the lease was lost");
    assert!(termed(dir.path(), t), "the helper never got SIGTERM");
    d.expect("job_finished", ev_token("job_finished", t), secs(10));
}

/// SIGTERM to the daemon (shutdown): the helper gets SIGTERM too, and the
/// daemon exits 0 only after it is gone.
#[test]
fn shutdown_terminates_a_setsid_grandchild_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "tree_shutdown").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let argv = tree_job(dir.path(), Start::Setsid, OnTerm::Record, Leader::Runs);
    let (_, config) = one_job(dir.path(), &argv, "lease = \"30s\"");
    let mut d = Daemon::spawn(DaemonOpts::new(&unique("tree-sd"), &config, &store.url));
    let started = d.expect("job_started", ev("job_started"), secs(30));
    let t = token_of(&started);
    let helper = Helper::of(dir.path(), t);
    let st = d.stop(secs(30));
    assert!(
        st.is_some_and(|s| s.code() == Some(0)),
        "exit after SIGTERM: {st:?}"
    );
    let died = helper.dead_by(secs(1), "the daemon's shutdown");
    assert!(termed(dir.path(), t), "the helper never got SIGTERM");
    let released = d.expect("lease_released", ev_token("lease_released", t), secs(1));
    assert!(
        died <= ms_of(&released, "timestamp"),
        "released before the helper died"
    );
}

/// The job's leader exits 0 while its daemonised helper still runs: the
/// run is its whole tree, so the helper is stopped and only then is the
/// lease released.
#[test]
fn normal_exit_stops_a_daemonised_helper_before_the_release_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "tree_normal_exit").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let argv = tree_job(dir.path(), Start::DoubleFork, OnTerm::Ignore, Leader::Exits);
    let (_, config) = one_job(dir.path(), &argv, "lease = \"30s\"");
    let d = Daemon::spawn(DaemonOpts::new(&unique("tree-ok"), &config, &store.url));
    let started = d.expect("job_started", ev("job_started"), secs(30));
    let t = token_of(&started);
    let helper = Helper::of(dir.path(), t);
    let finished = d.expect("job_finished", ev_token("job_finished", t), secs(15));
    assert_eq!(
        common::daemon::i64_field(&finished, "exit_code"),
        Some(0),
        "{finished}"
    );
    let released = d.expect("lease_released", ev_token("lease_released", t), secs(10));
    let died = helper.dead_by(Duration::ZERO, "the lease was released");
    assert!(
        died <= ms_of(&released, "timestamp"),
        "released before the helper died"
    );
}

/// `fencecron exec` shares the supervisor and the watchdog: killed with
/// SIGKILL, its job's helper in another session dies before the lease's
/// stored expiry.
#[test]
fn exec_sigkill_kills_a_setsid_grandchild() {
    let store = TestStore::new(Backend::Sqlite, "tree_exec").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let argv = tree_job(dir.path(), Start::Setsid, OnTerm::Ignore, Leader::Runs);
    let log_path = dir.path().join("exec.log");
    let mut cmd = common::harness::fencecron(dir.path());
    cmd.args([
        "--store",
        &store.url,
        "--log-format",
        "json",
        "exec",
        &unique("tree-exec"),
        "--lease",
        "5s",
        "--",
    ])
    .args(&argv)
    .env("FENCECRON_LOG", "debug,sqlx=off")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log_path).expect("log file"));
    let mut exec = cmd.spawn().expect("start exec");
    // Token 1: the resource is new.
    let helper = Helper::of(dir.path(), 1);
    wait_beats(dir.path(), 1, 3);
    kill(Pid::from_raw(exec.id() as i32), Signal::SIGKILL).expect("kill exec");
    let _ = exec.wait();
    let died = helper.dead_by(secs(10), "exec was killed");
    let events: Vec<Value> = std::fs::read_to_string(&log_path)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let expiry = logged_expiry(&events, 1);
    assert!(
        died < expiry,
        "the helper died {} ms after the lease's stored expiry",
        died - expiry
    );
}

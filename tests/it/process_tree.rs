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
    /// Appends its token to `dir/term` and exits 0.3 s later (so it
    /// outlives a leader that dies of the same SIGTERM).
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
        OnTerm::Record => {
            format!(r#"trap 'echo "$FENCECRON_TOKEN" >> "{d}/term"; sleep 0.3; exit 0' TERM"#)
        }
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
    // The leader died of SIGTERM at once; its status is the run's, however
    // long the rest of the tree took.
    let finished = d.expect("job_finished", ev_token("job_finished", t), secs(10));
    assert_eq!(
        str_field(&finished, "signal"),
        Some("SIGTERM"),
        "{finished}"
    );
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

/// `overlap = "replace"`: the next instant takes the lease from the run
/// still going (on the same node); the replaced run's helper in another
/// session gets SIGTERM and is gone.
#[test]
fn replace_terminates_the_old_runs_setsid_grandchild_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "tree_replace").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let argv = tree_job(dir.path(), Start::Setsid, OnTerm::Record, Leader::Runs);
    let job = unique("tree");
    let config = write_config(
        dir.path(),
        "",
        &[common::daemon::job_toml(
            &job,
            "*/3 * * * * *",
            &argv,
            "lease = \"6s\"\nrenew_every = \"1s\"\nkill_grace = \"1s\"\noverlap = \"replace\"",
        )],
    );
    let d = Daemon::spawn(DaemonOpts::new(&unique("tree-rp"), &config, &store.url).debug());
    let started = d.expect("job_started", ev("job_started"), secs(30));
    let t = token_of(&started);
    let helper = Helper::of(dir.path(), t);
    let replaced = d.expect(
        "run_replaced",
        |e| is(e, "run_replaced") && common::daemon::i64_field(e, "previous_token") == Some(t),
        secs(15),
    );
    eprintln!("{replaced}");
    helper.dead_by(secs(10), "its run was replaced");
    assert!(termed(dir.path(), t), "the helper never got SIGTERM");
    let finished = d.expect("job_finished", ev_token("job_finished", t), secs(10));
    assert_eq!(
        str_field(&finished, "outcome"),
        Some("lease_lost"),
        "{finished}"
    );
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

// ---------------------------------------------------------------------------
// The cgroup path: a daemon in a delegated cgroup v2 runs each job in a
// cgroup of its own.

/// A cgroup v2 made for one test below the test's own, marked delegated
/// the way systemd marks a `Delegate=yes` unit's cgroup (`trusted.delegate
/// = 1`). Emptied and removed, with whatever runs' cgroups are left in it,
/// when dropped.
struct DelegatedCgroup {
    path: PathBuf,
}

impl DelegatedCgroup {
    /// `None` (skipped loudly; a failure under `CI=true`) where the host has
    /// no cgroup v2 this test may create a cgroup in (needs root).
    fn new(test: &str) -> Option<DelegatedCgroup> {
        let made = fencecron::proctree::own_cgroup_dir()
            .ok_or_else(|| "no cgroup v2 is mounted".to_string())
            .and_then(|own| {
                let path = own.join(unique("fencecron-test"));
                std::fs::create_dir(&path)
                    .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
                let cg = DelegatedCgroup { path };
                set_xattr(&cg.path, "trusted.delegate", b"1")
                    .map_err(|e| format!("cannot mark {} delegated: {e}", cg.path.display()))?;
                Ok(cg)
            });
        match made {
            Ok(cg) => Some(cg),
            Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
                panic!("{test}: {why} (CI=true: the cgroup path must be tested)")
            }
            Err(why) => {
                skipped!("SKIPPED {test}: {why}; run as root on a host with cgroup v2");
                None
            }
        }
    }

    /// The run cgroups (`fencecron-…`) in it.
    fn runs(&self) -> Vec<PathBuf> {
        std::fs::read_dir(&self.path)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: NUL-terminated names and a live value buffer of its length.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Kills everything in cgroup `dir` and removes it.
fn remove_cgroup(dir: &Path) {
    let deadline = Instant::now() + secs(10);
    loop {
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for DelegatedCgroup {
    fn drop(&mut self) {
        for run in self.runs() {
            remove_cgroup(&run);
        }
        remove_cgroup(&self.path);
    }
}

/// The cgroup v2 path of `pid` (`0::/PATH`).
fn cgroup_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        .unwrap_or_default()
}

/// The daemon says which mechanism it uses; outside a delegated cgroup it
/// is the subreaper.
#[test]
fn daemon_started_names_the_subreaper_outside_a_delegated_cgroup_sqlite() {
    if fencecron::proctree::Cgroups::detect().is_some() {
        skipped!("SKIPPED: this test process itself runs in a delegated cgroup");
        return;
    }
    let store = TestStore::new(Backend::Sqlite, "tree_mechanism").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, config) = one_job(dir.path(), &common::daemon::sh("true"), "");
    let mut d = Daemon::spawn(DaemonOpts::new(&unique("tree-m"), &config, &store.url));
    let started = d.expect("daemon_started", ev("daemon_started"), secs(30));
    assert_eq!(
        str_field(&started, "process_tree"),
        Some("subreaper"),
        "{started}"
    );
    d.stop(secs(20));
}

/// In a delegated cgroup: `process_tree` is `cgroup`, the job's helper in
/// another session is in the run's own cgroup below it, and it dies with
/// the daemon (SIGKILL) before the lease's stored expiry.
#[test]
fn cgroup_runs_each_job_in_its_own_cgroup_and_it_dies_with_the_daemon_sqlite() {
    let Some(cg) = DelegatedCgroup::new("cgroup_runs_each_job_in_its_own_cgroup") else {
        return;
    };
    let store = TestStore::new(Backend::Sqlite, "tree_cgroup_k9").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let argv = tree_job(dir.path(), Start::DoubleFork, OnTerm::Ignore, Leader::Runs);
    let (_, config) = one_job(dir.path(), &argv, "lease = \"5s\"");
    let d = Daemon::spawn(
        DaemonOpts::new(&unique("tree-cg"), &config, &store.url)
            .debug()
            .in_cgroup(&cg.path),
    );
    let started = d.expect("daemon_started", ev("daemon_started"), secs(30));
    assert_eq!(
        str_field(&started, "process_tree"),
        Some("cgroup"),
        "{started}"
    );
    let started = d.expect("job_started", ev("job_started"), secs(30));
    let t = token_of(&started);
    let helper = Helper::of(dir.path(), t);
    let owner = str_field(
        &d.expect("lease_acquired", ev_token("lease_acquired", t), secs(5)),
        "owner_id",
    )
    .expect("owner_id")
    .to_string();
    let in_cg = cgroup_of(helper.pid);
    assert!(
        in_cg.ends_with(&format!("/fencecron-{owner}")),
        "the helper is in {in_cg}, not the run's cgroup"
    );
    wait_beats(dir.path(), t, 3);
    let expiry = logged_expiry(&d.all(), t);
    d.signal(Signal::SIGKILL);
    let died = helper.dead_by(secs(10), "its daemon was killed");
    assert!(
        died < expiry,
        "the helper died {} ms after the lease's stored expiry",
        died - expiry
    );
}

/// What the subreaper cannot do, the cgroup does: the run's watchdog is
/// killed with SIGKILL, so the helper (another session, deaf to SIGTERM)
/// is re-parented past it; the daemon still kills it through the run's
/// cgroup before it releases the lease, and removes the cgroup.
#[test]
fn cgroup_stops_what_a_killed_watchdog_left_before_the_release_sqlite() {
    let Some(cg) = DelegatedCgroup::new("cgroup_stops_what_a_killed_watchdog_left") else {
        return;
    };
    let store = TestStore::new(Backend::Sqlite, "tree_cgroup_shim_killed").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let argv = tree_job(dir.path(), Start::Setsid, OnTerm::Ignore, Leader::Runs);
    let (_, config) = one_job(dir.path(), &argv, "lease = \"30s\"");
    let d = Daemon::spawn(
        DaemonOpts::new(&unique("tree-cgw"), &config, &store.url).in_cgroup(&cg.path),
    );
    let started = d.expect("job_started", ev("job_started"), secs(30));
    let t = token_of(&started);
    let leader = common::daemon::pid_of(&started);
    let helper = Helper::of(dir.path(), t);
    let owner = str_field(
        &d.expect("lease_acquired", ev_token("lease_acquired", t), secs(5)),
        "owner_id",
    )
    .expect("owner_id")
    .to_string();
    let run_cg = cg.path.join(format!("fencecron-{owner}"));
    assert!(run_cg.is_dir(), "no run cgroup {}", run_cg.display());
    let stat = std::fs::read_to_string(format!("/proc/{leader}/stat")).expect("leader's stat");
    let watchdog: i32 = stat[stat.rfind(')').unwrap() + 2..]
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("the leader's parent");
    kill(Pid::from_raw(watchdog), Signal::SIGKILL).expect("kill the watchdog");
    let released = d.expect("lease_released", ev_token("lease_released", t), secs(15));
    let died = helper.dead_by(Duration::ZERO, "the lease was released");
    assert!(
        died <= ms_of(&released, "timestamp"),
        "released before the helper died"
    );
    assert!(
        !run_cg.exists(),
        "the run's cgroup is left: {}",
        run_cg.display()
    );
}

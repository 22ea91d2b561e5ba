//! A running `fencecron run` for integration tests.
//!
//! [`Daemon::spawn`] starts the real binary with `--log-format json`, reads
//! its stderr on a background thread into a shared list of JSON events (and
//! echoes every line to the test's stderr, prefixed with the node id, so a
//! failing test shows the daemon's log), and kills the daemon — and any job
//! it left running — when dropped.
//!
//! Also here: helpers to write `jobs.toml`, shell one-liner jobs that record
//! their runs, parsing those records, and process liveness checks.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use super::bin;
use super::harness::{run, scrub};

/// How to start one daemon.
#[derive(Debug, Clone)]
pub struct DaemonOpts {
    pub node: String,
    pub config: PathBuf,
    /// `--store`; empty for none.
    pub store: String,
    /// Run with libfaketime and `FAKETIME=OFFSET` (e.g. `"+2s"`): the daemon's clock is
    /// skewed, the store's is not.
    pub faketime: Option<String>,
    /// `FENCECRON_LOG`; `None` leaves the default (info).
    pub log_filter: Option<String>,
    pub env: Vec<(String, String)>,
    /// Put `--config`/`--store` before `run` instead of after it.
    pub flags_before_subcommand: bool,
    /// Start the daemon in this cgroup (v2) directory.
    pub cgroup: Option<PathBuf>,
}

impl DaemonOpts {
    /// Info-level logs, flags after `run`, no clock skew.
    pub fn new(node: &str, config: &Path, store: &str) -> DaemonOpts {
        DaemonOpts {
            node: node.to_string(),
            config: config.to_path_buf(),
            store: store.to_string(),
            faketime: None,
            log_filter: None,
            env: Vec::new(),
            flags_before_subcommand: false,
            cgroup: None,
        }
    }

    /// Starts the daemon in the cgroup v2 directory `dir`.
    pub fn in_cgroup(mut self, dir: &Path) -> Self {
        self.cgroup = Some(dir.to_path_buf());
        self
    }

    /// Runs the daemon with libfaketime preloaded, `FAKETIME=offset`.
    pub fn faketime(mut self, offset: &str) -> Self {
        self.faketime = Some(offset.to_string());
        self
    }

    /// Also logs debug events (`lease_renewed`, `lease_deadline`,
    /// `occurrence_taken`), without the SQL driver's chatter.
    pub fn debug(mut self) -> Self {
        self.log_filter = Some("debug,sqlx=warn".to_string());
        self
    }

    pub fn flags_before_subcommand(mut self) -> Self {
        self.flags_before_subcommand = true;
        self
    }
}

/// What the reader thread collected.
#[derive(Default)]
struct Log {
    events: Vec<Value>,
    /// Lines that were not JSON objects (panics, the final error message).
    other: Vec<String>,
    eof: bool,
}

struct Shared {
    log: Mutex<Log>,
    changed: Condvar,
}

/// A running `fencecron run`.
pub struct Daemon {
    pub node: String,
    child: Child,
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

impl Daemon {
    /// Starts `fencecron run` (in its own process group).
    pub fn spawn(opts: DaemonOpts) -> Daemon {
        let mut args: Vec<String> = Vec::new();
        let mut flags = vec![
            "--config".to_string(),
            opts.config.display().to_string(),
            "--log-format".to_string(),
            "json".to_string(),
        ];
        // An empty store: no `--store`, the config (or `opts.env`) names it.
        if !opts.store.is_empty() {
            flags.extend(["--store".to_string(), opts.store.clone()]);
        }
        if opts.flags_before_subcommand {
            args.extend(flags.clone());
            args.extend([
                "run".to_string(),
                "--node-id".to_string(),
                opts.node.clone(),
            ]);
        } else {
            args.extend([
                "run".to_string(),
                "--node-id".to_string(),
                opts.node.clone(),
            ]);
            args.extend(flags);
        }
        let mut cmd = Command::new(bin());
        scrub(&mut cmd).args(&args);
        if let Some(offset) = &opts.faketime {
            // libfaketime preloaded, as the `faketime` wrapper would, but
            // without the wrapper: it keeps a named semaphore per pid that a
            // SIGKILLed wrapper leaves in /dev/shm, and a later wrapper given
            // the same pid then fails at start (`sem_open: File exists`).
            cmd.env("LD_PRELOAD", super::pg::libfaketime())
                .env("FAKETIME", offset);
        }
        if let Some(filter) = &opts.log_filter {
            cmd.env("FENCECRON_LOG", filter);
        }
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        use std::os::unix::process::CommandExt;
        if let Some(dir) = &opts.cgroup {
            super::harness::into_cgroup(&mut cmd, dir);
        }
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", opts));
        let stderr = child.stderr.take().expect("piped stderr");
        let shared = Arc::new(Shared {
            log: Mutex::new(Log::default()),
            changed: Condvar::new(),
        });
        let reader = {
            let shared = Arc::clone(&shared);
            let node = opts.node.clone();
            std::thread::Builder::new()
                .name(format!("log-{node}"))
                .spawn(move || read_log(stderr, &node, &shared))
                .expect("spawn log reader")
        };
        Daemon {
            node: opts.node,
            child,
            shared,
            reader: Some(reader),
            status: None,
        }
    }

    /// The pid of the fencecron process.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    /// Sends `sig` to the daemon process.
    pub fn signal(&self, sig: Signal) {
        let pid = self.pid();
        kill(pid, sig).unwrap_or_else(|e| panic!("[{}] kill({pid}, {sig}): {e}", self.node));
    }

    /// All events so far.
    pub fn all(&self) -> Vec<Value> {
        self.shared.log.lock().unwrap().events.clone()
    }

    /// How many events have been logged so far (an index for
    /// [`Daemon::wait_for_from`]).
    pub fn len(&self) -> usize {
        self.shared.log.lock().unwrap().events.len()
    }

    /// The events named `name`, in order.
    pub fn events(&self, name: &str) -> Vec<Value> {
        self.shared
            .log
            .lock()
            .unwrap()
            .events
            .iter()
            .filter(|e| is(e, name))
            .cloned()
            .collect()
    }

    /// The first event matching `pred`, waiting up to `timeout`.
    pub fn wait_for(&self, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Option<Value> {
        self.wait_for_from(0, pred, timeout).map(|(_, v)| v)
    }

    /// The first event at index `start` or later that matches `pred`, with
    /// its index, waiting up to `timeout`.
    pub fn wait_for_from(
        &self,
        start: usize,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> Option<(usize, Value)> {
        let deadline = Instant::now() + timeout;
        let mut log = self.shared.log.lock().unwrap();
        let mut next = start;
        loop {
            while next < log.events.len() {
                if pred(&log.events[next]) {
                    return Some((next, log.events[next].clone()));
                }
                next += 1;
            }
            let now = Instant::now();
            if now >= deadline || log.eof {
                return None;
            }
            log = self
                .shared
                .changed
                .wait_timeout(log, deadline - now)
                .unwrap()
                .0;
        }
    }

    /// Like [`Daemon::wait_for_from`] but panics, naming `what`, on timeout.
    pub fn expect_from(
        &self,
        start: usize,
        what: &str,
        pred: impl Fn(&Value) -> bool,
        timeout: Duration,
    ) -> (usize, Value) {
        match self.wait_for_from(start, pred, timeout) {
            Some(found) => found,
            None => panic!(
                "[{}] no {what} within {timeout:?} (daemon {}); {}",
                self.node,
                if self.log_ended() {
                    "stopped logging"
                } else {
                    "still logging"
                },
                self.summary()
            ),
        }
    }

    /// Like [`Daemon::wait_for`] but panics, naming `what`, on timeout.
    pub fn expect(&self, what: &str, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Value {
        self.expect_from(0, what, pred, timeout).1
    }

    /// Whether stderr was closed (the daemon exited).
    pub fn log_ended(&self) -> bool {
        self.shared.log.lock().unwrap().eof
    }

    /// Non-JSON stderr lines (panics, the final error message).
    pub fn other_lines(&self) -> Vec<String> {
        self.shared.log.lock().unwrap().other.clone()
    }

    /// A one-line count of the events seen, for failure messages.
    pub fn summary(&self) -> String {
        let log = self.shared.log.lock().unwrap();
        let mut counts: Vec<(String, usize)> = Vec::new();
        for e in &log.events {
            let name = e
                .get("event")
                .and_then(Value::as_str)
                .unwrap_or("-")
                .to_string();
            match counts.iter_mut().find(|(n, _)| *n == name) {
                Some((_, c)) => *c += 1,
                None => counts.push((name, 1)),
            }
        }
        format!("events seen: {counts:?}; non-JSON lines: {:?}", log.other)
    }

    /// Whether the daemon process is still running.
    pub fn is_running(&mut self) -> bool {
        if self.status.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(st)) => {
                self.status = Some(st);
                false
            }
            Ok(None) => true,
            Err(e) => panic!("[{}] try_wait: {e}", self.node),
        }
    }

    /// Waits up to `timeout` for the daemon to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while self.is_running() {
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.status
    }

    /// SIGINT (stop at once, whatever `node.shutdown_grace` says; a
    /// SIGTERM would first drain) and wait for the exit status.
    pub fn stop(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.is_running() {
            self.signal(Signal::SIGINT);
        }
        self.wait_exit(timeout)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pgid = Pid::from_raw(self.child.id() as i32);
        if self.is_running() {
            // SIGKILL also ends a SIGSTOPped daemon.
            let _ = killpg(pgid, Signal::SIGKILL);
            let _ = self.child.wait();
        }
        // Jobs run in their own process groups: kill those the daemon did not
        // see finish, so no `sleep 60` outlives the test.
        // Tokens are per resource: key by (job, token).
        let key = |e: &Value| {
            (
                str_field(e, "job").unwrap_or("").to_string(),
                i64_field(e, "token"),
            )
        };
        let finished: HashSet<(String, Option<i64>)> =
            self.events("job_finished").iter().map(key).collect();
        for started in self.events("job_started") {
            let Some(pid) = i64_field(&started, "pid") else {
                continue;
            };
            if !finished.contains(&key(&started)) && pid_alive(pid as i32) {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
        // Join the log reader once stderr is closed; should something still
        // hold the pipe open, leave the thread behind rather than hang.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut log = self.shared.log.lock().unwrap();
        while !log.eof && Instant::now() < deadline {
            log = self
                .shared
                .changed
                .wait_timeout(log, Duration::from_millis(100))
                .unwrap()
                .0;
        }
        let eof = log.eof;
        drop(log);
        if let Some(reader) = self.reader.take() {
            if eof {
                let _ = reader.join();
            }
        }
    }
}

fn read_log(stderr: impl Read, node: &str, shared: &Shared) {
    let reader = BufReader::new(stderr);
    for line in reader.lines() {
        let Ok(line) = line else { break };
        eprintln!("[{node}] {line}");
        let mut log = shared.log.lock().unwrap();
        match serde_json::from_str::<Value>(&line) {
            Ok(v) if v.is_object() => log.events.push(v),
            _ => log.other.push(line),
        }
        drop(log);
        shared.changed.notify_all();
    }
    shared.log.lock().unwrap().eof = true;
    shared.changed.notify_all();
    eprintln!("[{node}] <stderr closed>");
}

/// State letter and parent pid from `/proc/PID/stat`.
fn proc_state(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

// ---------------------------------------------------------------------------
// Events

/// Whether `e` is the event `name`.
pub fn is(e: &Value, name: &str) -> bool {
    e.get("event").and_then(Value::as_str) == Some(name)
}

/// A predicate: the event `name`.
pub fn ev(name: &'static str) -> impl Fn(&Value) -> bool {
    move |e| is(e, name)
}

/// A string field.
pub fn str_field<'a>(e: &'a Value, key: &str) -> Option<&'a str> {
    e.get(key).and_then(Value::as_str)
}

/// An integer field (also accepts a decimal string).
pub fn i64_field(e: &Value, key: &str) -> Option<i64> {
    match e.get(key)? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Processes

/// Whether `pid` is a live process (a zombie counts as dead).
pub fn pid_alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    !matches!(proc_state(pid), Some(('Z', _)) | None)
}

/// Whether any process is left in process group `pgid` (zombies aside).
pub fn group_alive(pgid: i32) -> bool {
    if killpg(Pid::from_raw(pgid), None).is_err() {
        return false;
    }
    // Members may all be zombies waiting to be reaped.
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return true;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else {
            continue;
        };
        let f: Vec<&str> = stat[close + 2..].split_whitespace().collect();
        if f.len() > 2 && f[2].parse::<i32>().ok() == Some(pgid) && f[0] != "Z" {
            return true;
        }
    }
    false
}

/// Polls until `pid` is dead; returns whether it died within `timeout`.
pub fn wait_pid_gone(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !pid_alive(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a file to hold a pid and returns it.
pub fn read_pid_file(path: &Path, timeout: Duration) -> i32 {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if let Ok(pid) = s.trim().parse() {
                return pid;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no pid in {} within {timeout:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `fencecron lease list --json --store URL`, parsed.
pub fn lease_list(store: &str) -> Vec<Value> {
    let out = run(
        scrub(&mut Command::new(bin())).args(["lease", "list", "--json", "--store", store]),
        None,
    );
    assert!(
        out.status.success(),
        "lease list failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout) {
        Ok(Value::Array(a)) => a,
        other => panic!("lease list --json is not an array: {other:?}"),
    }
}

// ---------------------------------------------------------------------------
// jobs.toml

/// A TOML string literal.
pub fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// A job command run through `sh -c`.
pub fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// One `[[job]]` table; `extra` is further raw TOML lines (`lease = "5s"`).
pub fn job_toml(name: &str, schedule: &str, argv: &[String], extra: &str) -> String {
    let argv: Vec<String> = argv.iter().map(|a| toml_str(a)).collect();
    format!(
        "[[job]]\nname = {}\nschedule = {}\ncommand = [{}]\n{extra}\n",
        toml_str(name),
        toml_str(schedule),
        argv.join(", ")
    )
}

/// A job that appends `SCHEDULED_AT TOKEN NODE` to `file` and exits.
pub fn record_cmd(file: &Path) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        r#"echo "$FENCECRON_SCHEDULED_AT $FENCECRON_TOKEN $FENCECRON_NODE" >> "$1""#.into(),
        "sh".into(),
        file.display().to_string(),
    ]
}

/// A job that records its run in `dir/runs`, writes its pid to
/// `dir/pid.TOKEN` and then becomes `sleep 60` (same pid).
pub fn long_cmd(dir: &Path) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        r#"echo "$FENCECRON_SCHEDULED_AT $FENCECRON_TOKEN $FENCECRON_NODE" >> "$1/runs"; echo $$ > "$1/pid.$FENCECRON_TOKEN"; exec sleep 60"#.into(),
        "sh".into(),
        dir.display().to_string(),
    ]
}

/// One line written by [`record_cmd`] / [`long_cmd`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub raw_scheduled_at: String,
    pub scheduled_at: DateTime<Utc>,
    pub token: i64,
    pub node: String,
}

/// Parses a runs file (missing file: no runs).
pub fn read_runs(file: &Path) -> Vec<Run> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "malformed run line {l:?} in {}", file.display());
            let scheduled_at = DateTime::parse_from_rfc3339(f[0])
                .unwrap_or_else(|e| {
                    panic!("FENCECRON_SCHEDULED_AT {:?} is not RFC 3339: {e}", f[0])
                })
                .with_timezone(&Utc);
            Run {
                raw_scheduled_at: f[0].to_string(),
                scheduled_at,
                token: f[1].parse().unwrap_or_else(|e| {
                    panic!("FENCECRON_TOKEN {:?} is not an integer: {e}", f[1])
                }),
                node: f[2].to_string(),
            }
        })
        .collect()
}

/// The exact RFC 3339 form fencecron prints (UTC, milliseconds, `Z`).
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// `n` seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Checks `done` every 100 ms until it holds, for up to `timeout`; panics
/// with `what()` (say, the daemons' summaries) when it never does.
pub fn wait_until(timeout: Duration, mut done: impl FnMut() -> bool, what: impl Fn() -> String) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "{}", what());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Writes `jobs.toml` into `dir`: a `[defaults]` table when `defaults` is
/// not empty, then the jobs.
pub fn write_config(dir: &Path, defaults: &str, jobs: &[String]) -> PathBuf {
    let path = dir.join("jobs.toml");
    let mut text = String::new();
    if !defaults.is_empty() {
        text.push_str("[defaults]\n");
        text.push_str(defaults);
        text.push('\n');
    }
    for j in jobs {
        text.push_str(j);
    }
    std::fs::write(&path, text).expect("write jobs.toml");
    path
}

/// The event's integer `token`; panics without one.
pub fn token_of(e: &Value) -> i64 {
    i64_field(e, "token").unwrap_or_else(|| panic!("event without an integer token: {e}"))
}

/// The `pid` of a `job_started` event; panics without one.
pub fn pid_of(e: &Value) -> i32 {
    i64_field(e, "pid").unwrap_or_else(|| panic!("job_started without a pid: {e}")) as i32
}

/// A predicate: the event `name` for `token`.
pub fn ev_token(name: &'static str, token: i64) -> impl Fn(&Value) -> bool {
    move |e| is(e, name) && i64_field(e, "token") == Some(token)
}

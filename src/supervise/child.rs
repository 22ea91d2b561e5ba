//! The job's side of a run: starting it through its watchdog and talking to
//! the running job. [`Launch`] and [`JobProcess`] are the seam between the
//! supervisor's deadline loop ([`super::deadline`]) and processes: the real
//! implementation ([`ShimLauncher`], [`ShimJob`]) spawns the run's watchdog
//! ([`crate::shim`]), signals the job's whole tree ([`crate::proctree`]),
//! gives each run its own cgroup where the daemon's cgroup v2 is delegated,
//! and writes confirmed deadlines down the watchdog's control pipe; tests
//! drive the same loop with a fake job on tokio's paused clock.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use async_trait::async_trait;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::net::unix::pipe;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::events;
use crate::job_env::ChildEnv;
use crate::proctree::{Cgroups, RunCgroup};
use crate::shim;
use crate::store::{rfc3339, Lease, Token};

use super::RunSpec;

/// Starts jobs. The supervisor holds one for all its runs.
#[async_trait]
pub(crate) trait Launch: Send + Sync {
    /// Starts `spec` under `lease` and returns once the job runs (or could
    /// not be started: the error, one sentence). `term_at` and `kill_at`
    /// are the deadlines the job's watchdog enforces from the start.
    async fn start(
        &self,
        spec: &RunSpec,
        lease: &Lease,
        node: &str,
        term_at: Instant,
        kill_at: Instant,
    ) -> Result<Box<dyn JobProcess>, String>;

    /// How a run's whole tree is stopped (`cgroup` or `subreaper`), for
    /// the log.
    fn process_tree(&self) -> &'static str {
        "subreaper"
    }
}

/// A started job, as the supervisor sees it.
#[async_trait]
pub(crate) trait JobProcess: Send {
    /// The job's pid, which is also its process group.
    fn pid(&self) -> u32;
    /// The pid of the run's watchdog, for the run record.
    fn watchdog_pid(&self) -> Option<u32>;
    /// Starts logging the job's output lines (after `job_started`), keeping
    /// the last `tail` bytes of them for the run history.
    fn forward_output(&mut self, job: &str, token: Token, tail: usize);
    /// The last bytes of the output, once `reap` returned.
    fn output_tail(&self) -> String {
        String::new()
    }
    /// Sends `sig` to the job's whole tree: its process group and every
    /// other process it started, in any session or group.
    fn signal(&mut self, sig: Signal);
    /// Hands newly confirmed deadlines to the watchdog, which enforces them
    /// even if this process stops or dies. A failed hand-over only leaves
    /// it with the earlier, stricter deadlines.
    fn confirm(&mut self, term_at: Instant, kill_at: Instant);
    /// Waits for the job to end; its status. Cancel-safe.
    async fn wait(&mut self) -> std::io::Result<ExitStatus>;
    /// After the job's leader ended: kills whatever is left of its group
    /// (a grandchild could still hold the token) and waits for its output
    /// to be logged. The watchdog has already killed the rest of the tree
    /// before it exited.
    async fn reap(&mut self);
}

/// Starts jobs through their watchdog, with the fencing environment.
pub(crate) struct ShimLauncher {
    /// How each run's watchdog is started.
    shim: ShimProgram,
    /// What the job's environment gains and loses: the variables that let
    /// `fencecron put/get` inside it reach this store, and the store's
    /// credentials kept out of it.
    child_env: ChildEnv,
    /// The cgroup v2 delegated to this process, where each run gets its
    /// own; `None`: the watchdog as subreaper alone stops the tree.
    cgroups: Option<Cgroups>,
}

impl ShimLauncher {
    pub(crate) fn new(child_env: ChildEnv) -> ShimLauncher {
        ShimLauncher {
            shim: ShimProgram::locate(),
            child_env,
            cgroups: Cgroups::detect(),
        }
    }
}

/// How to start a run's watchdog: the small `fencecron-shim` installed
/// beside this binary, else this binary's own `__shim` mode (the same code,
/// about 1 ms slower to start: the full binary has 40 times the
/// relocations). The small one is opened once, at start-up, and executed
/// through that descriptor, so a package upgrade that replaces it on disk
/// cannot pair this daemon with another version's watchdog.
struct ShimProgram {
    exec: PathBuf,
    internal: bool,
    _file: Option<OwnedFd>,
}

impl ShimProgram {
    fn locate() -> ShimProgram {
        let beside = std::env::current_exe()
            .ok()
            .map(|exe| exe.with_file_name(shim::SHIM_NAME));
        if let Some(path) = beside {
            use std::os::unix::fs::PermissionsExt;
            let runnable = std::fs::metadata(&path)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
            // Above 3 and 4, which the watchdog's pipes are moved to before
            // it is executed through this descriptor.
            let opened = runnable
                .then(|| std::fs::File::open(&path).ok())
                .flatten()
                .and_then(|f| dup_above(&OwnedFd::from(f), 10).ok());
            if let Some(fd) = opened {
                return ShimProgram {
                    exec: PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
                    internal: false,
                    _file: Some(fd),
                };
            }
        }
        ShimProgram {
            exec: PathBuf::from("/proc/self/exe"),
            internal: true,
            _file: None,
        }
    }
}

#[async_trait]
impl Launch for ShimLauncher {
    /// Starts the job through its watchdog ([`crate::shim`]) with the
    /// fencing environment, and waits until the job runs (its pid) or could
    /// not be started (the error). The watchdog already enforces `term_at`
    /// and `kill_at`, and acts on its own should this process die.
    async fn start(
        &self,
        spec: &RunSpec,
        lease: &Lease,
        node: &str,
        term_at: Instant,
        kill_at: Instant,
    ) -> Result<Box<dyn JobProcess>, String> {
        let cgroup = match &self.cgroups {
            Some(c) => Some(c.create(&lease.owner_id.to_string()).map_err(|e| {
                format!(
                    "cannot create the run's cgroup under {}: {e}",
                    c.base().display()
                )
            })?),
            None => None,
        };
        match self
            .spawn(spec, lease, node, term_at, kill_at, cgroup.as_ref())
            .await
        {
            Ok(job) => Ok(job),
            Err(e) => {
                if let Some(cg) = cgroup {
                    empty_and_remove(cg).await;
                }
                Err(e)
            }
        }
    }

    fn process_tree(&self) -> &'static str {
        crate::proctree::mechanism(self.cgroups.as_ref())
    }
}

impl ShimLauncher {
    /// Starts the watchdog (and through it the job, in `cgroup` if given).
    async fn spawn(
        &self,
        spec: &RunSpec,
        lease: &Lease,
        node: &str,
        term_at: Instant,
        kill_at: Instant,
        cgroup: Option<&RunCgroup>,
    ) -> Result<Box<dyn JobProcess>, String> {
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        let (ctl_r, ctl_w) = pipe_pair().map_err(|e| io("cannot create a pipe", e))?;
        let (st_r, st_w) = pipe_pair().map_err(|e| io("cannot create a pipe", e))?;
        // Above the descriptors the watchdog receives them on (3 and 4), so
        // that moving one there cannot overwrite the other.
        let ctl_r = dup_above(&ctl_r, 10).map_err(|e| io("cannot duplicate a pipe", e))?;
        let st_w = dup_above(&st_w, 10).map_err(|e| io("cannot duplicate a pipe", e))?;
        let mut cmd = Command::new(&self.shim.exec);
        for name in &self.child_env.remove {
            cmd.env_remove(name);
        }
        cmd.arg0(shim::SHIM_NAME);
        if self.shim.internal {
            cmd.arg(shim::SHIM_ARG);
        }
        cmd.arg(to_monotonic(term_at).to_string())
            .arg(to_monotonic(kill_at).to_string())
            .arg(spec.timing.kill_grace.as_millis().to_string())
            .args(cgroup.map(|c| c.path().as_os_str()))
            .arg("--")
            .args(&spec.command)
            .envs(&spec.env)
            .envs(self.child_env.set.iter().map(|(k, v)| (k, v)))
            .env("FENCECRON_TOKEN", lease.token.to_string())
            .env("FENCECRON_RESOURCE", spec.resource.as_str())
            // `curl -H "Fencing-Token: $FENCECRON_FENCING_HEADER"` through
            // `fencecron proxy`.
            .env(
                crate::proxy::ENV_VAR,
                crate::proxy::header_value(spec.resource.as_str(), lease.token),
            )
            .env("FENCECRON_OWNER_ID", lease.owner_id.to_string())
            .env("FENCECRON_EXPIRES_AT", lease.expires_at.rfc3339())
            .env("FENCECRON_JOB", &spec.job)
            .env("FENCECRON_NODE", node)
            // Its own group: a signal meant for the daemon's group (a
            // terminal's Ctrl-C, a stop) does not reach the watchdog.
            .process_group(0)
            // Dropped without being waited for (this task aborted), the
            // watchdog sees its control pipe close and terminates the job
            // with a grace; killing it outright would orphan grandchildren.
            .kill_on_drop(false);
        // Not even from the job's own `env`.
        for name in crate::job_env::DAEMON_ONLY {
            cmd.env_remove(name);
        }
        match spec.scheduled_at {
            Some(at) => cmd.env("FENCECRON_SCHEDULED_AT", rfc3339(at)),
            None => cmd.env_remove("FENCECRON_SCHEDULED_AT"),
        };
        cmd.env("FENCECRON_RUN_ID", spec.run_id(lease));
        if let Some(dir) = &spec.workdir {
            cmd.current_dir(dir);
        }
        if spec.inherit_stdio {
            cmd.stdin(Stdio::inherit())
                .stdout(Stdio::inherit())
                .stderr(Stdio::inherit());
        } else {
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
        }
        let (ctl_fd, st_fd) = (ctl_r.as_raw_fd(), st_w.as_raw_fd());
        // SAFETY: between fork and exec the closure only calls dup2, which
        // is async-signal-safe; both descriptors stay open until spawn
        // returns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(ctl_fd, shim::CTL_FD) < 0 || libc::dup2(st_fd, shim::STATUS_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| io("cannot start the run watchdog", e))?;
        drop((ctl_r, st_w));
        let ctl = std::fs::File::from(ctl_w);
        set_nonblocking(&ctl);

        // The first status line: `P PID` or `E MESSAGE`. Bounded by the kill
        // deadline, which the watchdog enforces anyway.
        let status = pipe::Receiver::from_owned_fd(st_r)
            .map_err(|e| io("cannot read the run watchdog's status", e))?;
        let mut line = String::new();
        let mut status = BufReader::new(status);
        let read = tokio::time::timeout_at(kill_at, status.read_line(&mut line));
        let failure = match read.await {
            Ok(Ok(_)) => match line.trim_end().split_once(' ') {
                Some(("P", pid)) => match pid.parse::<u32>() {
                    Ok(pid) => {
                        return Ok(Box::new(ShimJob {
                            child,
                            pid,
                            cgroup: cgroup.cloned(),
                            ctl,
                            forwarders: Vec::new(),
                            tail: OutputTail::new(0),
                        }))
                    }
                    Err(_) => format!("the run watchdog reported `{}`", line.trim_end()),
                },
                Some(("E", msg)) => msg.to_string(),
                _ => "the run watchdog exited before starting the job".to_string(),
            },
            Ok(Err(e)) => io("cannot read the run watchdog's status", e),
            Err(_) => "the run watchdog did not start the job in time".to_string(),
        };
        drop(ctl);
        let _ = child.start_kill();
        let _ = child.wait().await;
        Err(failure)
    }
}

/// A job started through its watchdog.
struct ShimJob {
    /// The watchdog process; it exits the way the job did.
    child: Child,
    /// The job's pid, which is also its process group.
    pid: u32,
    /// The run's cgroup, if it has one.
    cgroup: Option<RunCgroup>,
    /// The control pipe: confirmed deadlines go down it. Closing it (this
    /// process dying included) tells the watchdog to terminate the job.
    ctl: std::fs::File,
    /// The tasks logging the job's output.
    forwarders: Vec<JoinHandle<()>>,
    /// The last bytes of its output, for the run history.
    tail: OutputTail,
}

#[async_trait]
impl JobProcess for ShimJob {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn watchdog_pid(&self) -> Option<u32> {
        self.child.id()
    }

    fn forward_output(&mut self, job: &str, token: Token, tail: usize) {
        self.tail = OutputTail::new(tail);
        if let Some(out) = self.child.stdout.take() {
            self.forwarders.push(tokio::spawn(forward_lines(
                out,
                job.to_string(),
                token,
                "stdout",
                self.tail.clone(),
            )));
        }
        if let Some(err) = self.child.stderr.take() {
            self.forwarders.push(tokio::spawn(forward_lines(
                err,
                job.to_string(),
                token,
                "stderr",
                self.tail.clone(),
            )));
        }
    }

    fn output_tail(&self) -> String {
        self.tail.text()
    }

    fn signal(&mut self, sig: Signal) {
        // The watchdog learns first that a termination is under way, so
        // that a leader exiting on this SIGTERM does not cut the rest of the
        // tree's grace short; it SIGKILLs after the grace by its own clock.
        let line: &[u8] = match sig {
            Signal::SIGTERM => b"T\n",
            Signal::SIGKILL => b"K\n",
            _ => b"",
        };
        let _ = self.ctl.write_all(line);
        // Also here, not only through the watchdog: a watchdog that cannot
        // act (stopped by someone) must not keep the signal from the job.
        // Its descendants are the job's tree; it is not signalled itself.
        match self.child.id() {
            Some(watchdog) => crate::proctree::signal_tree(
                watchdog as i32,
                self.pid as i32,
                self.cgroup.as_ref(),
                sig,
            ),
            None => {
                let _ = killpg(Pid::from_raw(self.pid as i32), sig);
            }
        }
    }

    fn confirm(&mut self, term_at: Instant, kill_at: Instant) {
        let line = format!("D {} {}\n", to_monotonic(term_at), to_monotonic(kill_at));
        let _ = self.ctl.write_all(line.as_bytes());
    }

    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait().await
    }

    async fn reap(&mut self) {
        let _ = killpg(Pid::from_raw(self.pid as i32), Signal::SIGKILL);
        // The watchdog emptied the run's cgroup before it exited; should it
        // have been killed itself, what the job left behind is still in
        // there and dies now, before the lease is released.
        if let Some(cg) = self.cgroup.take() {
            empty_and_remove(cg).await;
        }
        for f in self.forwarders.drain(..) {
            let _ = f.await;
        }
    }
}

/// Kills whatever is in a run's cgroup until it is empty (SIGKILLed
/// processes go at once, so no bound: the release must wait for them), then
/// removes it.
async fn empty_and_remove(cg: RunCgroup) {
    loop {
        cg.signal(Signal::SIGKILL);
        if cg.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    if let Err(e) = cg.remove() {
        events::run_cgroup_left(&cg.path().display().to_string(), &e.to_string());
    }
}

/// A pipe whose ends are closed on exec.
fn pipe_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
}

/// A close-on-exec duplicate of `fd` numbered at least `min`.
fn dup_above(fd: &OwnedFd, min: i32) -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) returns a new descriptor we own.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `n` is a fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

/// Writes to the control pipe never block the runtime: a watchdog that does
/// not read (stopped by someone) only misses later, looser deadlines.
fn set_nonblocking(f: &std::fs::File) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

/// A tokio instant as raw `CLOCK_MONOTONIC` nanoseconds, the clock the
/// watchdog reads: both run on this host's monotonic clock, and only the
/// distance from now is carried over (a libc clock fake in this process
/// shifts both ends alike).
fn to_monotonic(at: Instant) -> u64 {
    let now = Instant::now();
    let raw = shim::monotonic_ns();
    if at >= now {
        raw.saturating_add(u64::try_from((at - now).as_nanos()).unwrap_or(u64::MAX))
    } else {
        raw.saturating_sub(u64::try_from((now - at).as_nanos()).unwrap_or(u64::MAX))
    }
}

/// Forwards one output stream line by line (lines longer than 64 KiB are
/// split) until EOF.
async fn forward_lines(
    stream: impl AsyncRead + Unpin,
    job: String,
    token: Token,
    name: &'static str,
    tail: OutputTail,
) {
    const LIMIT: u64 = 64 * 1024;
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match (&mut reader).take(LIMIT).read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    buf.pop();
                }
                let line = String::from_utf8_lossy(&buf);
                tail.push_line(&line);
                match crate::fence::parse_job_report(&line, &job) {
                    Some(rec) => events::stale_write_rejected(&rec),
                    None => events::job_output(&job, token, name, &line),
                }
            }
        }
    }
}

/// The last bytes of a job's output lines (stdout and stderr as they came),
/// bounded: older bytes fall off the front.
#[derive(Clone)]
pub(crate) struct OutputTail {
    limit: usize,
    bytes: Arc<std::sync::Mutex<std::collections::VecDeque<u8>>>,
}

impl OutputTail {
    pub(crate) fn new(limit: usize) -> OutputTail {
        OutputTail {
            limit,
            bytes: Arc::default(),
        }
    }

    pub(crate) fn push_line(&self, line: &str) {
        if self.limit == 0 {
            return;
        }
        let mut b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        b.extend(line.as_bytes());
        b.push_back(b'\n');
        let excess = b.len().saturating_sub(self.limit);
        b.drain(..excess);
    }

    /// The kept text; a character cut in two at the front is dropped.
    pub(crate) fn text(&self) -> String {
        let b = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        let (front, back) = b.as_slices();
        let mut all = Vec::with_capacity(b.len());
        all.extend_from_slice(front);
        all.extend_from_slice(back);
        let start = all
            .iter()
            .position(|c| (*c as i8) >= -0x40)
            .unwrap_or(all.len());
        String::from_utf8_lossy(&all[start..]).into_owned()
    }
}

#[cfg(test)]
mod tail_tests {
    use super::OutputTail;

    #[test]
    fn the_tail_keeps_the_last_bytes_of_whole_characters() {
        let tail = OutputTail::new(8);
        tail.push_line("first line");
        tail.push_line("äbc");
        assert_eq!(tail.text(), "ne\näbc\n");
        tail.push_line("xyz");
        // "bc\nxyz\n" is 7 bytes; the byte before is half of "ä".
        assert_eq!(tail.text(), "bc\nxyz\n");
        assert_eq!(OutputTail::new(0).text(), "");
    }
}

//! The job's side of a run: starting it through its watchdog and talking to
//! the running job. [`Launch`] and [`JobProcess`] are the seam between the
//! supervisor's deadline loop ([`super::deadline`]) and processes: the real
//! implementation ([`ShimLauncher`], [`ShimJob`]) spawns the run's watchdog
//! ([`crate::shim`]), signals the job's whole tree ([`crate::proctree`]),
//! gives each run its own cgroup where the daemon's cgroup v2 is delegated,
//! and writes confirmed deadlines down the watchdog's control pipe; tests
//! drive the same loop with a fake job on tokio's paused clock.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;

use async_trait::async_trait;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
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
    /// The process that forks each run's watchdog.
    spawner: SpawnerSlot,
    /// This process's environment without what `child_env` removes, read
    /// once: every job's environment starts from it, and so does the
    /// spawner's.
    base_env: BTreeMap<OsString, OsString>,
}

impl ShimLauncher {
    pub(crate) fn new(child_env: ChildEnv) -> ShimLauncher {
        let mut base_env: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        for name in &child_env.remove {
            base_env.remove(name);
        }
        ShimLauncher {
            shim: ShimProgram::locate(),
            child_env,
            cgroups: Cgroups::detect(),
            spawner: SpawnerSlot::default(),
            base_env,
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
                .and_then(|f| shim::dup_above(&OwnedFd::from(f), 10).ok());
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
    /// Starts the watchdog (and through it the job, in `cgroup` if given):
    /// forked by the spawner when the job's output is the daemon's to log,
    /// else (`fencecron exec`, a spawner that cannot be started, a request
    /// too large for it) executed by this process.
    async fn spawn(
        &self,
        spec: &RunSpec,
        lease: &Lease,
        node: &str,
        term_at: Instant,
        kill_at: Instant,
        cgroup: Option<&RunCgroup>,
    ) -> Result<Box<dyn JobProcess>, String> {
        let env = self.job_env(spec, lease, node);
        if !spec.inherit_stdio {
            if let Some(started) = self
                .spawn_forked(spec, &env, term_at, kill_at, cgroup)
                .await
            {
                return started;
            }
        }
        self.spawn_executed(spec, &env, term_at, kill_at, cgroup)
            .await
    }

    /// The job's whole environment: this process's, without what the job
    /// must not see, with the run's fencing variables.
    fn job_env(&self, spec: &RunSpec, lease: &Lease, node: &str) -> Vec<(OsString, OsString)> {
        let mut env = self.base_env.clone();
        let mut set = |k: &str, v: &str| {
            env.insert(k.into(), v.into());
        };
        for (k, v) in spec
            .env
            .iter()
            .chain(self.child_env.set.iter().map(|(k, v)| (k, v)))
        {
            set(k, v);
        }
        set("FENCECRON_TOKEN", &lease.token.to_string());
        set("FENCECRON_RESOURCE", spec.resource.as_str());
        // `curl -H "Fencing-Token: $FENCECRON_FENCING_HEADER"` through
        // `fencecron proxy`.
        set(
            crate::proxy::ENV_VAR,
            &crate::proxy::header_value(spec.resource.as_str(), lease.token),
        );
        set("FENCECRON_OWNER_ID", &lease.owner_id.to_string());
        set("FENCECRON_EXPIRES_AT", &lease.expires_at.rfc3339());
        set("FENCECRON_JOB", &spec.job);
        set("FENCECRON_NODE", node);
        set("FENCECRON_RUN_ID", &spec.run_id(lease));
        match spec.scheduled_at {
            Some(at) => set("FENCECRON_SCHEDULED_AT", &rfc3339(at)),
            None => {
                env.remove(OsStr::new("FENCECRON_SCHEDULED_AT"));
            }
        }
        // Not even from the job's own `env`.
        for name in crate::job_env::DAEMON_ONLY {
            env.remove(OsStr::new(name));
        }
        env.into_iter().collect()
    }

    /// Has the spawner fork the run's watchdog. `None`: the spawner cannot
    /// take it (it cannot be started, or the request is too large), so the
    /// caller executes the watchdog itself.
    async fn spawn_forked(
        &self,
        spec: &RunSpec,
        env: &[(OsString, OsString)],
        term_at: Instant,
        kill_at: Instant,
        cgroup: Option<&RunCgroup>,
    ) -> Option<Result<Box<dyn JobProcess>, String>> {
        let msg = shim::Request {
            term_at: to_monotonic(term_at),
            kill_at: to_monotonic(kill_at),
            grace_ms: u64::try_from(spec.timing.kill_grace.as_millis()).unwrap_or(u64::MAX),
            cgroup: cgroup.map(|c| c.path()),
            workdir: spec.workdir.as_deref(),
            argv: &spec.command,
            env,
        }
        .encode();
        if msg.len() > shim::MAX_REQUEST {
            return None;
        }
        let pipes =
            (|| Ok::<_, std::io::Error>([pipe_pair()?, pipe_pair()?, pipe_pair()?, pipe_pair()?]))(
            );
        let [(ctl_r, ctl_w), (st_r, st_w), (out_r, out_w), (err_r, err_w)] = match pipes {
            Ok(p) => p,
            Err(e) => return Some(Err(format!("cannot create a pipe: {e}"))),
        };
        let fds = [
            ctl_r.as_raw_fd(),
            st_w.as_raw_fd(),
            out_w.as_raw_fd(),
            err_w.as_raw_fd(),
        ];
        if let Err(e) = self
            .spawner
            .send(&self.shim, &self.base_env, &msg, &fds)
            .await
        {
            events::spawner_unavailable(&e.to_string());
            return None;
        }
        drop((ctl_r, st_w, out_w, err_w));
        let ctl = std::fs::File::from(ctl_w);
        set_nonblocking(&ctl);
        let started = match first_status(st_r, kill_at).await {
            Ok(s) => s,
            // The control pipe closes here: a watchdog that did start
            // terminates its job.
            Err(e) => return Some(Err(e)),
        };
        let Some(watchdog_pid) = started.watchdog else {
            return Some(Err("the run watchdog did not report its pid".to_string()));
        };
        let receiver = |fd: OwnedFd| -> Option<Box<dyn AsyncRead + Send + Unpin>> {
            pipe::Receiver::from_owned_fd(fd)
                .ok()
                .map(|r| Box::new(r) as Box<dyn AsyncRead + Send + Unpin>)
        };
        Some(Ok(Box::new(ShimJob {
            watchdog: Watchdog::Spawned {
                pid: watchdog_pid,
                status: started.rest,
                last: Vec::new(),
                ended: None,
            },
            pid: started.job,
            cgroup: cgroup.cloned(),
            ctl,
            outputs: [("stdout", receiver(out_r)), ("stderr", receiver(err_r))],
            forwarders: Vec::new(),
            tail: OutputTail::new(0),
        })))
    }

    /// Executes the run's watchdog as this process's child.
    async fn spawn_executed(
        &self,
        spec: &RunSpec,
        env: &[(OsString, OsString)],
        term_at: Instant,
        kill_at: Instant,
        cgroup: Option<&RunCgroup>,
    ) -> Result<Box<dyn JobProcess>, String> {
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        let (ctl_r, ctl_w) = pipe_pair().map_err(|e| io("cannot create a pipe", e))?;
        let (st_r, st_w) = pipe_pair().map_err(|e| io("cannot create a pipe", e))?;
        // Above the descriptors the watchdog receives them on (3 and 4), so
        // that moving one there cannot overwrite the other.
        let ctl_r = shim::dup_above(&ctl_r, 10).map_err(|e| io("cannot duplicate a pipe", e))?;
        let st_w = shim::dup_above(&st_w, 10).map_err(|e| io("cannot duplicate a pipe", e))?;
        let mut cmd = Command::new(&self.shim.exec);
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
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            // Its own group: a signal meant for the daemon's group (a
            // terminal's Ctrl-C, a stop) does not reach the watchdog.
            .process_group(0)
            // Dropped without being waited for (this task aborted), the
            // watchdog sees its control pipe close and terminates the job
            // with a grace; killing it outright would orphan grandchildren.
            .kill_on_drop(false);
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
        match first_status(st_r, kill_at).await {
            Ok(started) => {
                let out = child
                    .stdout
                    .take()
                    .map(|o| Box::new(o) as Box<dyn AsyncRead + Send + Unpin>);
                let err = child
                    .stderr
                    .take()
                    .map(|e| Box::new(e) as Box<dyn AsyncRead + Send + Unpin>);
                Ok(Box::new(ShimJob {
                    watchdog: Watchdog::Child(child),
                    pid: started.job,
                    cgroup: cgroup.cloned(),
                    ctl,
                    outputs: [("stdout", out), ("stderr", err)],
                    forwarders: Vec::new(),
                    tail: OutputTail::new(0),
                }))
            }
            Err(failure) => {
                drop(ctl);
                let _ = child.start_kill();
                let _ = child.wait().await;
                Err(failure)
            }
        }
    }
}

/// What a watchdog's first status line said.
struct Started {
    /// The job's pid.
    job: u32,
    /// The watchdog's own pid, which one forked by the spawner reports.
    watchdog: Option<u32>,
    /// The rest of the status pipe.
    rest: BufReader<pipe::Receiver>,
}

/// Reads the watchdog's first status line: `P PID [WATCHDOG]` once the job
/// runs, or `E MESSAGE` (the error, returned). Bounded by the kill deadline,
/// which the watchdog enforces anyway.
async fn first_status(st_r: OwnedFd, kill_at: Instant) -> Result<Started, String> {
    let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
    let status = pipe::Receiver::from_owned_fd(st_r)
        .map_err(|e| io("cannot read the run watchdog's status", e))?;
    let mut line = String::new();
    let mut status = BufReader::new(status);
    let read = tokio::time::timeout_at(kill_at, status.read_line(&mut line));
    match read.await {
        Ok(Ok(_)) => {
            let mut f = line.split_whitespace();
            match f.next() {
                Some("P") => {
                    let job = f.next().and_then(|p| p.parse::<u32>().ok());
                    let watchdog = f.next().and_then(|p| p.parse::<u32>().ok());
                    match job {
                        Some(job) => Ok(Started {
                            job,
                            watchdog,
                            rest: status,
                        }),
                        None => Err(format!("the run watchdog reported `{}`", line.trim_end())),
                    }
                }
                Some("E") => Err(line.trim_end()[1..].trim_start().to_string()),
                _ => Err("the run watchdog exited before starting the job".to_string()),
            }
        }
        Ok(Err(e)) => Err(io("cannot read the run watchdog's status", e)),
        Err(_) => Err("the run watchdog did not start the job in time".to_string()),
    }
}

/// The spawner this daemon's runs are forked by ([`crate::shim`]): started
/// on the first run, started again when it is found gone.
#[derive(Default)]
struct SpawnerSlot(std::sync::Mutex<Option<Arc<Spawner>>>);

/// How long a spawner may keep a request waiting to be sent.
const SPAWNER_TAKES_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// A running spawner: the daemon's end of its socket.
struct Spawner {
    sock: AsyncFd<OwnedFd>,
    /// Reaped once it exits (it does when the socket closes). Until then
    /// its pid cannot be reused, so killing it cannot hit another process.
    process: std::sync::Mutex<Child>,
}

impl SpawnerSlot {
    /// Sends one request with its descriptors; starts the spawner first if
    /// there is none, and once again if the one there is gone.
    async fn send(
        &self,
        shim: &ShimProgram,
        env: &BTreeMap<OsString, OsString>,
        msg: &[u8],
        fds: &[RawFd; shim::SPAWN_FDS],
    ) -> std::io::Result<()> {
        let mut restarted = false;
        loop {
            let spawner = {
                let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
                match &*slot {
                    Some(s) => s.clone(),
                    None => {
                        let s = Arc::new(Spawner::start(shim, env)?);
                        *slot = Some(s.clone());
                        s
                    }
                }
            };
            // A spawner takes a request in microseconds; one whose socket
            // stays full (stopped, starved) is replaced. A request not sent
            // is not queued, so no watchdog can come of it.
            let sent =
                match tokio::time::timeout(SPAWNER_TAKES_WITHIN, spawner.send(msg, fds)).await {
                    Ok(sent) => sent,
                    Err(_) => Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the spawner took no request for a second",
                    )),
                };
            match sent {
                Ok(()) => return Ok(()),
                Err(e) if restarted => return Err(e),
                Err(_) => {
                    // Gone (killed, or it failed) or stuck: the next turn
                    // starts a new one, unless another run already has.
                    let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
                    if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, &spawner)) {
                        *slot = None;
                    }
                    spawner.kill();
                    restarted = true;
                }
            }
        }
    }
}

impl Spawner {
    fn start(shim: &ShimProgram, env: &BTreeMap<OsString, OsString>) -> std::io::Result<Spawner> {
        use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        )?;
        let theirs = shim::dup_above(&theirs, 10)?;
        let mut cmd = Command::new(&shim.exec);
        cmd.arg0(shim::SHIM_NAME);
        if shim.internal {
            cmd.arg(shim::SHIM_ARG);
        }
        cmd.arg(shim::SPAWNER_ARG)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(false)
            .env_clear()
            .envs(env);
        let fd = theirs.as_raw_fd();
        // SAFETY: between fork and exec the closure only calls dup2, which
        // is async-signal-safe; the descriptor stays open until spawn
        // returns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(fd, shim::SPAWNER_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let process = cmd.spawn()?;
        drop(theirs);
        // SAFETY: `ours` owns its descriptor, which the `AsyncFd` keeps
        // and closes; nothing else replaces or closes it.
        let sock = unsafe { AsyncFd::register(ours)? };
        Ok(Spawner {
            sock,
            process: std::sync::Mutex::new(process),
        })
    }

    /// Kills a spawner given up on. The requests it had taken fail to
    /// start (their pipes close); the watchdogs it forked live on.
    fn kill(&self) {
        let mut p = self.process.lock().unwrap_or_else(|p| p.into_inner());
        let _ = p.start_kill();
    }

    async fn send(&self, msg: &[u8], fds: &[RawFd; shim::SPAWN_FDS]) -> std::io::Result<()> {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        let iov = [std::io::IoSlice::new(msg)];
        let rights = [ControlMessage::ScmRights(fds)];
        self.sock
            .async_io(tokio::io::Interest::WRITABLE, |sock| {
                sendmsg::<()>(
                    sock.as_raw_fd(),
                    &iov,
                    &rights,
                    MsgFlags::MSG_NOSIGNAL,
                    None,
                )
                .map(|_| ())
                .map_err(std::io::Error::from)
            })
            .await
    }
}

/// A job started through its watchdog.
struct ShimJob {
    /// The watchdog; it exits the way the job did.
    watchdog: Watchdog,
    /// The job's pid, which is also its process group.
    pid: u32,
    /// The run's cgroup, if it has one.
    cgroup: Option<RunCgroup>,
    /// The control pipe: confirmed deadlines go down it. Closing it (this
    /// process dying included) tells the watchdog to terminate the job.
    ctl: std::fs::File,
    /// The job's stdout and stderr, until their logging starts.
    outputs: [(&'static str, Option<Box<dyn AsyncRead + Send + Unpin>>); 2],
    /// The tasks logging the job's output.
    forwarders: Vec<JoinHandle<()>>,
    /// The last bytes of its output, for the run history.
    tail: OutputTail,
}

/// How the daemon knows the watchdog.
enum Watchdog {
    /// Executed by this process: its child.
    Child(Child),
    /// Forked by the spawner: its pid, and its status pipe, whose last line
    /// says how the job ended and whose end is the watchdog's exit.
    Spawned {
        pid: u32,
        status: BufReader<pipe::Receiver>,
        /// What the pipe brought after the first line (its last bytes).
        last: Vec<u8>,
        /// Once the pipe ended: the job's status.
        ended: Option<ExitStatus>,
    },
}

#[async_trait]
impl JobProcess for ShimJob {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn watchdog_pid(&self) -> Option<u32> {
        match &self.watchdog {
            Watchdog::Child(child) => child.id(),
            // Once its pipe ended it has exited, and its pid may be reused.
            Watchdog::Spawned { pid, ended, .. } => ended.is_none().then_some(*pid),
        }
    }

    fn forward_output(&mut self, job: &str, token: Token, tail: usize) {
        self.tail = OutputTail::new(tail);
        for (name, stream) in &mut self.outputs {
            if let Some(stream) = stream.take() {
                self.forwarders.push(tokio::spawn(forward_lines(
                    stream,
                    job.to_string(),
                    token,
                    name,
                    self.tail.clone(),
                )));
            }
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
        match self.watchdog_pid() {
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
        match &mut self.watchdog {
            Watchdog::Child(child) => child.wait().await,
            Watchdog::Spawned {
                status,
                last,
                ended,
                ..
            } => loop {
                if let Some(s) = ended {
                    return Ok(*s);
                }
                let mut chunk = [0u8; 256];
                // Cancel-safe: what a read brought is kept in `last`.
                let n = status.read(&mut chunk).await?;
                if n == 0 {
                    // No last line: the watchdog itself was killed, as a
                    // child's wait would report it.
                    let text = String::from_utf8_lossy(last);
                    let exit = text.lines().rev().find_map(shim::exit_status);
                    *ended = Some(exit.unwrap_or_else(|| {
                        std::os::unix::process::ExitStatusExt::from_raw(libc::SIGKILL)
                    }));
                    continue;
                }
                last.extend_from_slice(&chunk[..n]);
                let excess = last.len().saturating_sub(256);
                last.drain(..excess);
            },
        }
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

//! One fenced run: spawn under an acquired lease, renew in the background,
//! kill before the local deadline, release. Shared by the daemon and
//! `fencecron exec`.
//!
//! The deadline rule (PRODUCT.md principle 8): from the moment the last
//! successful acquire or renew was *sent*, measured on this host's monotonic
//! clock, the job receives SIGTERM at `lease − margin − kill_grace` and
//! SIGKILL at `lease − margin`. The store computed its expiry no earlier
//! than that send, so the job is dead before the lease can expire — whether
//! the store is slow, unreachable, or this process was paused. The deadline
//! timer never waits for a renewal to fail: a renewal in flight and the
//! deadline race in one `select!`.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};
use tokio::net::unix::pipe;
use tokio::process::{Child, Command};
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::events;
use crate::fence;
use crate::job_env::ChildEnv;
use crate::names::Name;
use crate::runs::{RunRecord, RunRecords};
use crate::shim;
use crate::store::{
    rfc3339, Lease, NewStaleRecord, RenewOutcome, StaleKind, Store, StoreError, MAX_LEASE,
    MIN_LEASE,
};

/// Default lease when neither the config nor a flag gives one.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The timing of a lease: how long it lasts, how often it is renewed, and how
/// long a job gets between SIGTERM and SIGKILL. Only [`LeaseTiming::new`]
/// builds one, so every value in use fits together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    pub lease: Duration,
    pub renew_every: Duration,
    pub kill_grace: Duration,
}

impl LeaseTiming {
    /// Validates a lease and derives what is not given: `renew_every`
    /// defaults to a third of the lease, `kill_grace` to a fifth.
    ///
    /// The constraints: the lease is 5 s..=300 s; `renew_every` is at most
    /// half the lease (so one failed renewal still leaves a retry); and
    /// `renew_every + kill_grace + safety margin` is below the lease, so that
    /// after the last confirmed renewal there is time for one more attempt
    /// before the job must receive SIGTERM.
    pub fn new(
        lease: Duration,
        renew_every: Option<Duration>,
        kill_grace: Option<Duration>,
    ) -> Result<LeaseTiming, TimingError> {
        if lease < MIN_LEASE || lease > MAX_LEASE {
            return Err(TimingError::Lease(format!(
                "lease {} is outside 5s..=300s; choose a lease between 5s and 300s",
                humantime::format_duration(lease)
            )));
        }
        let renew_every = renew_every.unwrap_or(lease / 3);
        let kill_grace = kill_grace.unwrap_or(lease / 5);
        if renew_every.is_zero() || renew_every > lease / 2 {
            return Err(TimingError::RenewEvery(format!(
                "renew_every {} is not well below the lease {}; use at most half the lease (default: a third)",
                humantime::format_duration(renew_every),
                humantime::format_duration(lease)
            )));
        }
        let timing = LeaseTiming {
            lease,
            renew_every,
            kill_grace,
        };
        if renew_every + kill_grace + timing.safety_margin() >= lease {
            return Err(TimingError::KillGrace(format!(
                "kill_grace {} does not fit in the lease {}: renew_every ({}) + kill_grace + safety margin ({}) must stay below the lease; shorten kill_grace or lengthen the lease",
                humantime::format_duration(kill_grace),
                humantime::format_duration(lease),
                humantime::format_duration(renew_every),
                humantime::format_duration(timing.safety_margin()),
            )));
        }
        Ok(timing)
    }

    /// How much earlier than the lease's end, measured on this host's
    /// monotonic clock from the moment the last successful acquire or renew
    /// was *sent*, the job must already be dead: covers clock-rate drift
    /// between this host and the store (2% of the lease) plus the time a
    /// SIGKILL takes to land (at least 200 ms in all).
    pub fn safety_margin(&self) -> Duration {
        (self.lease / 50).max(Duration::from_millis(200))
    }

    /// The time after a confirmed send at which the job must be dead.
    pub fn kill_by(&self) -> Duration {
        self.lease - self.safety_margin()
    }

    /// How much later than the daemon the run's watchdog acts on the same
    /// deadlines: a quarter of the safety margin (at least 50 ms). The
    /// daemon, when healthy, terminates the job itself and logs why; the
    /// watchdog is the backstop for a daemon that is stopped or gone, and
    /// its SIGKILL still lands three quarters of the margin before the
    /// lease can expire.
    pub fn watchdog_lag(&self) -> Duration {
        self.safety_margin() / 4
    }
}

/// Which timing value is wrong; the config module maps it to its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error("{0}")]
    Lease(String),
    #[error("{0}")]
    RenewEvery(String),
    #[error("{0}")]
    KillGrace(String),
}

/// Why the supervisor terminated a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// The store refused a renewal: another owner has the lease.
    LeaseLost,
    /// No renewal was confirmed before the local deadline.
    LeaseUnconfirmed,
    /// The job ran longer than its `timeout`.
    Timeout,
    /// The daemon (or `exec`) is shutting down.
    Shutdown,
}

impl CancelReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelReason::LeaseLost => "lease_lost",
            CancelReason::LeaseUnconfirmed => "lease_unconfirmed",
            CancelReason::Timeout => "timeout",
            CancelReason::Shutdown => "shutdown",
        }
    }
}

/// What to run under a lease.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Job name (for `exec`, the resource).
    pub job: String,
    pub resource: Name,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<PathBuf>,
    pub timing: LeaseTiming,
    pub timeout: Option<Duration>,
    pub stale_exit_code: Option<i32>,
    /// The scheduled occurrence; `None` for `exec`.
    pub scheduled_at: Option<DateTime<Utc>>,
    /// `exec` passes its terminal through; the daemon logs each line.
    pub inherit_stdio: bool,
}

/// How a supervised run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunResult {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub cancelled: Option<CancelReason>,
    /// Whether the lease was lost (refused or unconfirmed) during the run.
    pub lease_lost: bool,
}

impl RunResult {
    /// The shell-style exit code: the child's code, or 128 + signal.
    pub fn shell_code(&self) -> u8 {
        match (self.exit_code, self.signal) {
            (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
            (None, Some(s)) => u8::try_from(128 + s).unwrap_or(255),
            (None, None) => 1,
        }
    }
}

/// Runs jobs under leases on one store, as one node.
#[derive(Clone)]
pub struct Supervisor {
    store: Arc<dyn Store>,
    node: String,
    /// What the job's environment gains and loses: the variables that let
    /// `fencecron put/get` inside it reach this store, and the store's
    /// credentials kept out of it.
    child_env: ChildEnv,
    /// Where the daemon notes each run in progress, so that after a crash
    /// its successor can give back the leases of runs that are provably
    /// dead (`None` for `exec`).
    records: Option<Arc<RunRecords>>,
    /// How each run's watchdog is started.
    shim: Arc<ShimProgram>,
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

/// Errors before the child ran.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    /// The command could not be started.
    #[error("cannot start `{program}`: {error}; check the command path and permissions")]
    Spawn { program: String, error: String },
    #[error("the lease was acquired too late to run safely (the store took longer than the lease allows); skipped")]
    AcquiredTooLate,
}

/// Whether a release also gives the occurrence back.
#[derive(Debug, Clone, Copy)]
enum Unrun {
    /// The occurrence ran (or started to): it stays taken.
    Keep,
    /// Nothing ran under the lease: the occurrence becomes takeable again.
    GiveBack,
}

impl Supervisor {
    pub fn new(store: Arc<dyn Store>, node: String, child_env: ChildEnv) -> Self {
        Supervisor {
            store,
            node,
            child_env,
            records: None,
            shim: Arc::new(ShimProgram::locate()),
        }
    }

    /// Notes every run in `records` while it is in progress.
    pub fn with_records(mut self, records: Arc<RunRecords>) -> Self {
        self.records = Some(records);
        self
    }

    /// The store this supervisor uses.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// This node's id.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Runs `spec` under `lease`, acquired by a call sent at `sent_at`.
    /// Returns once the child (and its process group) is gone and the lease
    /// released (or known lost).
    pub async fn run(
        &self,
        spec: &RunSpec,
        lease: Lease,
        sent_at: Instant,
        shutdown: CancellationToken,
    ) -> Result<RunResult, SuperviseError> {
        let timing = spec.timing;
        if Instant::now() + timing.kill_grace >= sent_at + timing.kill_by() {
            // The acquire itself stalled for most of the lease: the job would
            // have to be terminated the moment it started. Nothing ran, so
            // the occurrence goes back with the lease.
            self.release_as(spec, &lease, Unrun::GiveBack).await;
            return Err(SuperviseError::AcquiredTooLate);
        }
        let kill_at = sent_at + timing.kill_by();
        let lag = timing.watchdog_lag();
        let mut shim = match self
            .spawn(
                spec,
                &lease,
                kill_at - timing.kill_grace + lag,
                kill_at + lag,
            )
            .await
        {
            Ok(c) => c,
            Err(error) => {
                let err = SuperviseError::Spawn {
                    program: spec.command[0].clone(),
                    error,
                };
                events::job_spawn_failed(&spec.job, lease.token, &err.to_string());
                self.release(spec, &lease).await;
                return Err(err);
            }
        };
        let pid = Some(shim.pid);
        let started = Instant::now();
        let scheduled = spec.scheduled_at.map(rfc3339).unwrap_or_default();
        let record = self.note_run(spec, &lease, &shim);
        events::job_started(
            &spec.job,
            spec.resource.as_str(),
            lease.token,
            pid,
            &scheduled,
        );
        let mut child = shim.child.take().expect("a spawned shim has its child");
        let forwarders = self.forward_output(spec, &lease, &mut child);

        let mut watch = Watch::new(self, spec, &lease, sent_at, started, shim.ctl);
        let status = watch.supervise(&mut child, pid, &shutdown).await;

        // The leader is gone; make sure nothing else of the job outlives the
        // lease (a grandchild could still hold the token).
        if let Some(pid) = pid {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        for f in forwarders {
            let _ = f.await;
        }
        let (exit_code, signal) = match &status {
            Ok(st) => (st.code(), st.signal()),
            Err(_) => (None, None),
        };
        events::job_finished(&spec.job, lease.token, exit_code, signal, started.elapsed());

        if let (Some(code), Some(stale_code)) = (exit_code, spec.stale_exit_code) {
            if code == stale_code {
                self.job_reported_stale(spec, &lease).await;
            }
        }
        if !watch.lost {
            self.release(spec, &lease).await;
        }
        if let (Some(records), Some(path)) = (&self.records, record) {
            records.remove(&path);
        }
        Ok(RunResult {
            exit_code,
            signal,
            cancelled: watch.cancel.map(|c| c.reason),
            lease_lost: watch.lost,
        })
    }

    /// Starts the job through its watchdog ([`crate::shim`]) with the
    /// fencing environment, and waits until the job runs (its pid) or could
    /// not be started (the error). The watchdog already enforces `term_at`
    /// and `kill_at`, and acts on its own should this process die.
    async fn spawn(
        &self,
        spec: &RunSpec,
        lease: &Lease,
        term_at: Instant,
        kill_at: Instant,
    ) -> Result<Shim, String> {
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
            .arg("--")
            .args(&spec.command)
            .envs(&spec.env)
            .envs(self.child_env.set.iter().map(|(k, v)| (k, v)))
            .env("FENCECRON_TOKEN", lease.token.to_string())
            .env("FENCECRON_RESOURCE", spec.resource.as_str())
            .env("FENCECRON_OWNER_ID", lease.owner_id.to_string())
            .env("FENCECRON_EXPIRES_AT", lease.expires_at.rfc3339())
            .env("FENCECRON_JOB", &spec.job)
            .env("FENCECRON_NODE", &self.node)
            // Its own group: a signal meant for the daemon's group (a
            // terminal's Ctrl-C, a stop) does not reach the watchdog.
            .process_group(0)
            // Dropped without being waited for (this task aborted), the
            // watchdog sees its control pipe close and terminates the job
            // with a grace; killing it outright would orphan grandchildren.
            .kill_on_drop(false);
        match spec.scheduled_at {
            Some(at) => cmd.env("FENCECRON_SCHEDULED_AT", rfc3339(at)),
            None => cmd.env_remove("FENCECRON_SCHEDULED_AT"),
        };
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
                        return Ok(Shim {
                            child: Some(child),
                            pid,
                            ctl,
                        })
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

    /// Notes a run in progress for a successor daemon; returns the record's
    /// path. A failure to write is logged, not fatal: without the record
    /// the lease simply runs out by itself after a crash.
    fn note_run(&self, spec: &RunSpec, lease: &Lease, shim: &Shim) -> Option<PathBuf> {
        let records = self.records.as_ref()?;
        let child_pid = shim.child.as_ref().and_then(|c| c.id())?;
        let rec = RunRecord::new(
            &spec.job,
            spec.resource.as_str(),
            lease,
            child_pid,
            shim.pid,
            spec.timing,
        );
        match records.write(&rec) {
            Ok(p) => Some(p),
            Err(e) => {
                events::run_record_failed(Some(&spec.job), &e.to_string());
                None
            }
        }
    }

    /// Logs each stdout/stderr line of the child with the job's fields.
    fn forward_output(
        &self,
        spec: &RunSpec,
        lease: &Lease,
        child: &mut Child,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut tasks = Vec::new();
        if let Some(out) = child.stdout.take() {
            tasks.push(tokio::spawn(forward_lines(
                out,
                spec.job.clone(),
                lease.token,
                "stdout",
            )));
        }
        if let Some(err) = child.stderr.take() {
            tasks.push(tokio::spawn(forward_lines(
                err,
                spec.job.clone(),
                lease.token,
                "stderr",
            )));
        }
        tasks
    }

    /// Gives the lease back, retrying briefly: a failure only means the lease
    /// runs out by itself.
    async fn release(&self, spec: &RunSpec, lease: &Lease) {
        self.release_as(spec, lease, Unrun::Keep).await
    }

    /// `release`; with [`Unrun::GiveBack`] (nothing ran under the lease) a
    /// scheduled occurrence is given back with it, so another node still
    /// trying it can run it.
    async fn release_as(&self, spec: &RunSpec, lease: &Lease, unrun: Unrun) {
        let mut delay = Duration::from_millis(200);
        let owner_id = lease.owner_id.to_string();
        for attempt in 0..3 {
            let released = match (unrun, spec.scheduled_at) {
                (Unrun::GiveBack, Some(at)) => {
                    self.store
                        .give_back(
                            &spec.resource,
                            &owner_id,
                            Some(lease.token),
                            crate::store::StoreTime::from_utc(at),
                        )
                        .await
                }
                _ => {
                    self.store
                        .release(&spec.resource, &owner_id, lease.token)
                        .await
                }
            };
            match released {
                Ok(crate::store::ReleaseOutcome::Released) => {
                    events::lease_released(Some(&spec.job), lease);
                    return;
                }
                Ok(crate::store::ReleaseOutcome::Refused(r)) => {
                    events::lease_lost(
                        Some(&spec.job),
                        lease,
                        &self.node,
                        "release_refused",
                        &r.to_string(),
                    );
                    // The job ended before we noticed the loss (it finished
                    // while this process was paused, say): a stale-owner
                    // event like any other, so it is stored too.
                    self.record_lost(spec, lease, "release_refused");
                    return;
                }
                Err(e) => {
                    let retry = (attempt < 2).then_some(delay);
                    events::store_unavailable("release", Some(&spec.job), &e.to_string(), retry);
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
    }

    /// The job exited with its configured stale code: it reports a write its
    /// own storage rejected. Record and log it like any other.
    async fn job_reported_stale(&self, spec: &RunSpec, lease: &Lease) {
        let owner = lease.owner_id.to_string();
        let op = uuid::Uuid::new_v4().to_string();
        let rec = NewStaleRecord {
            kind: StaleKind::WriteRejected,
            reason: "stale",
            resource: spec.resource.as_str(),
            key: None,
            owner_id: Some(&owner),
            token: lease.token,
            accepted_token: None,
            node: &self.node,
            job: Some(&spec.job),
            stage: "job",
            operation_id: &op,
        };
        match fence::record(self.store.as_ref(), &rec).await {
            Some(stored) => events::stale_write_rejected(&stored),
            None => events::stale_write_rejected(&crate::store::StaleRecord {
                at: crate::store::StoreTime::from_utc(Utc::now()),
                kind: rec.kind,
                reason: rec.reason.to_string(),
                resource: rec.resource.to_string(),
                key: None,
                owner_id: Some(owner.clone()),
                token: rec.token,
                accepted_token: None,
                node: self.node.clone(),
                job: Some(spec.job.clone()),
                stage: rec.stage.to_string(),
                operation_id: op.clone(),
            }),
        }
    }

    /// Records a lost lease in the store, retrying in the background while
    /// the store is unreachable (the event itself is already logged).
    fn record_lost(&self, spec: &RunSpec, lease: &Lease, reason: &str) {
        fence::record_in_background(
            self.store.clone(),
            fence::PendingRecord {
                kind: StaleKind::LeaseLost,
                reason: reason.to_string(),
                resource: spec.resource.to_string(),
                owner_id: Some(lease.owner_id.to_string()),
                token: lease.token,
                accepted_token: None,
                node: self.node.clone(),
                job: Some(spec.job.clone()),
                stage: "renew".to_string(),
            },
        );
    }
}

/// A job started through its watchdog.
struct Shim {
    /// The watchdog process; taken by the run that waits for it.
    child: Option<Child>,
    /// The job's pid, which is also its process group.
    pid: u32,
    /// The control pipe: confirmed deadlines go down it. Closing it (this
    /// process dying included) tells the watchdog to terminate the job.
    ctl: std::fs::File,
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

/// A termination in progress.
#[derive(Debug, Clone, Copy)]
struct Cancel {
    reason: CancelReason,
    /// When SIGKILL goes out unless the job is gone.
    kill_at: Instant,
}

/// The state of one supervised run: the renewal loop and the deadlines.
struct Watch<'a> {
    sup: &'a Supervisor,
    spec: &'a RunSpec,
    lease: &'a Lease,
    /// Send time of the last successful acquire/renew.
    confirmed: Instant,
    next_renew: Instant,
    timeout_at: Option<Instant>,
    cancel: Option<Cancel>,
    lost: bool,
    killed: bool,
    /// The watchdog's control pipe.
    ctl: std::fs::File,
}

type RenewCall = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = (Instant, Result<RenewOutcome, StoreError>)>
            + Send
            + 'static,
    >,
>;

impl<'a> Watch<'a> {
    fn new(
        sup: &'a Supervisor,
        spec: &'a RunSpec,
        lease: &'a Lease,
        sent_at: Instant,
        started: Instant,
        ctl: std::fs::File,
    ) -> Self {
        let w = Watch {
            sup,
            spec,
            lease,
            confirmed: sent_at,
            next_renew: sent_at + spec.timing.renew_every,
            timeout_at: spec.timeout.map(|t| started + t),
            cancel: None,
            lost: false,
            killed: false,
            ctl,
        };
        w.log_deadline();
        w
    }

    /// Hands the current deadlines to the watchdog, which enforces them even
    /// if this process stops or dies. A failed write only leaves it with the
    /// earlier, stricter deadlines.
    fn confirm_to_watchdog(&mut self) {
        let lag = self.spec.timing.watchdog_lag();
        let line = format!(
            "D {} {}\n",
            to_monotonic(self.term_deadline() + lag),
            to_monotonic(self.kill_deadline() + lag)
        );
        let _ = self.ctl.write_all(line.as_bytes());
    }

    /// SIGKILL deadline: the job must be dead by then.
    fn kill_deadline(&self) -> Instant {
        self.confirmed + self.spec.timing.kill_by()
    }

    /// SIGTERM deadline when no renewal is confirmed.
    fn term_deadline(&self) -> Instant {
        self.kill_deadline() - self.spec.timing.kill_grace
    }

    fn log_deadline(&self) {
        let now = Instant::now();
        events::lease_deadline(
            Some(&self.spec.job),
            self.lease,
            self.kill_deadline().saturating_duration_since(now),
            self.term_deadline().saturating_duration_since(now),
        );
    }

    fn renew_call(&self) -> RenewCall {
        let store = self.sup.store.clone();
        let resource = self.spec.resource.clone();
        let owner = self.lease.owner_id.to_string();
        let token = self.lease.token;
        let lease = self.spec.timing.lease;
        // Abandon a call that outlives one renewal interval and try again.
        let limit = self.spec.timing.renew_every;
        Box::pin(async move {
            let sent = Instant::now();
            let r = match tokio::time::timeout(limit, store.renew(&resource, &owner, token, lease))
                .await
            {
                Ok(r) => r,
                Err(_) => Err(StoreError::Timeout {
                    url: store.url().to_string(),
                    limit,
                }),
            };
            (sent, r)
        })
    }

    /// Sends SIGTERM (or SIGKILL when already past the kill deadline) to the
    /// job's process group.
    fn start_cancel(&mut self, reason: CancelReason, pid: Option<u32>) {
        if self.cancel.is_some() {
            return;
        }
        let now = Instant::now();
        let kill_at = (now + self.spec.timing.kill_grace).min(self.kill_deadline());
        self.cancel = Some(Cancel { reason, kill_at });
        if now >= kill_at {
            events::job_cancelled(&self.spec.job, self.lease.token, reason.as_str(), "SIGKILL");
            self.signal(pid, Signal::SIGKILL);
            self.killed = true;
        } else {
            events::job_cancelled(&self.spec.job, self.lease.token, reason.as_str(), "SIGTERM");
            self.signal(pid, Signal::SIGTERM);
        }
    }

    fn signal(&self, pid: Option<u32>, sig: Signal) {
        if let Some(pid) = pid {
            let _ = killpg(Pid::from_raw(pid as i32), sig);
        }
    }

    fn mark_lost(&mut self, reason: &str, detail: &str) {
        if self.lost {
            return;
        }
        self.lost = true;
        events::lease_lost(
            Some(&self.spec.job),
            self.lease,
            &self.sup.node,
            reason,
            detail,
        );
        self.sup.record_lost(self.spec, self.lease, reason);
    }

    /// Waits for the child while renewing and enforcing every deadline.
    async fn supervise(
        &mut self,
        child: &mut Child,
        pid: Option<u32>,
        shutdown: &CancellationToken,
    ) -> std::io::Result<std::process::ExitStatus> {
        let mut renewal: Option<RenewCall> = None;
        let far = || Instant::now() + Duration::from_secs(86_400 * 365);
        loop {
            let kill_at = match self.cancel {
                Some(c) if !self.killed => c.kill_at.min(self.kill_deadline()),
                None if !self.killed => self.kill_deadline(),
                _ => far(),
            };
            let term_at = if self.cancel.is_none() {
                self.term_deadline()
            } else {
                far()
            };
            let renew_at = if renewal.is_none() && !self.lost {
                self.next_renew
            } else {
                far()
            };
            let timeout_at = match (self.timeout_at, self.cancel) {
                (Some(t), None) => t,
                _ => far(),
            };
            tokio::select! {
                biased;
                status = child.wait() => {
                    if self.cancel.is_none() && Instant::now() >= self.term_deadline() {
                        // The watchdog acted on the deadline before this
                        // process did (it was busy or stopped): report it
                        // the same way.
                        self.mark_lost("deadline_passed", "no renewal confirmed before the local deadline (store unreachable or this process was paused); the run's watchdog terminated the job");
                        self.cancel = Some(Cancel { reason: CancelReason::LeaseUnconfirmed, kill_at: Instant::now() });
                        events::job_cancelled(&self.spec.job, self.lease.token, CancelReason::LeaseUnconfirmed.as_str(), "SIGTERM");
                    }
                    return status;
                }
                _ = sleep_until(kill_at) => {
                    // Past the point where the lease may have expired, or the
                    // grace is over: nothing of the job may keep running.
                    if self.cancel.is_none() {
                        self.mark_lost("deadline_passed", "no renewal confirmed before the local deadline (store unreachable or this process was paused)");
                        self.cancel = Some(Cancel { reason: CancelReason::LeaseUnconfirmed, kill_at: Instant::now() });
                    }
                    let reason = self.cancel.map_or(CancelReason::LeaseUnconfirmed, |c| c.reason);
                    events::job_cancelled(&self.spec.job, self.lease.token, reason.as_str(), "SIGKILL");
                    self.signal(pid, Signal::SIGKILL);
                    self.killed = true;
                }
                _ = sleep_until(term_at) => {
                    self.mark_lost("deadline_passed", "no renewal confirmed before the local deadline (store unreachable or this process was paused)");
                    self.start_cancel(CancelReason::LeaseUnconfirmed, pid);
                }
                _ = sleep_until(timeout_at) => {
                    self.start_cancel(CancelReason::Timeout, pid);
                }
                _ = shutdown.cancelled(), if self.cancel.is_none() => {
                    self.start_cancel(CancelReason::Shutdown, pid);
                }
                (sent, result) = async { renewal.as_mut().expect("guarded").await }, if renewal.is_some() => {
                    renewal = None;
                    match result {
                        Ok(RenewOutcome::Renewed { expires_at }) => {
                            if !self.lost {
                                self.confirmed = sent;
                                self.next_renew = sent + self.spec.timing.renew_every;
                                events::lease_renewed(Some(&self.spec.job), self.lease, expires_at);
                                // After the log line: the watchdog never holds
                                // a later deadline than the log shows.
                                self.confirm_to_watchdog();
                                self.log_deadline();
                            }
                        }
                        Ok(RenewOutcome::Refused(refusal)) => {
                            self.mark_lost("renew_refused", &refusal.to_string());
                            self.start_cancel(CancelReason::LeaseLost, pid);
                        }
                        Err(e) => {
                            let retry = (self.spec.timing.renew_every / 4).max(Duration::from_millis(250));
                            events::store_unavailable("renew", Some(&self.spec.job), &e.to_string(), Some(retry));
                            self.next_renew = Instant::now() + retry;
                        }
                    }
                }
                _ = sleep_until(renew_at) => {
                    renewal = Some(self.renew_call());
                }
            }
        }
    }
}

/// Forwards one output stream line by line (lines longer than 64 KiB are
/// split) until EOF.
async fn forward_lines(
    stream: impl AsyncRead + Unpin,
    job: String,
    token: i64,
    name: &'static str,
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
                events::job_output(&job, token, name, &String::from_utf8_lossy(&buf));
            }
        }
    }
}

#[cfg(test)]
mod timing_tests {
    use super::*;

    #[test]
    fn derives_defaults() {
        let t = LeaseTiming::new(Duration::from_secs(30), None, None).unwrap();
        assert_eq!(t.renew_every, Duration::from_secs(10));
        assert_eq!(t.kill_grace, Duration::from_secs(6));
        assert_eq!(t.safety_margin(), Duration::from_millis(600));
        let t = LeaseTiming::new(Duration::from_secs(5), None, None).unwrap();
        assert_eq!(t.safety_margin(), Duration::from_millis(200));
        // The watchdog's SIGKILL still comes before the lease ends.
        assert_eq!(t.watchdog_lag(), Duration::from_millis(50));
        assert!(t.kill_by() + t.watchdog_lag() < t.lease);
    }

    #[test]
    fn rejects_bad_values() {
        let s = Duration::from_secs;
        assert!(matches!(
            LeaseTiming::new(s(4), None, None),
            Err(TimingError::Lease(_))
        ));
        assert!(matches!(
            LeaseTiming::new(s(301), None, None),
            Err(TimingError::Lease(_))
        ));
        assert!(matches!(
            LeaseTiming::new(s(30), Some(s(20)), None),
            Err(TimingError::RenewEvery(_))
        ));
        assert!(matches!(
            LeaseTiming::new(s(30), Some(s(10)), Some(s(20))),
            Err(TimingError::KillGrace(_))
        ));
        assert!(LeaseTiming::new(s(30), Some(s(10)), Some(s(10))).is_ok());
    }
}

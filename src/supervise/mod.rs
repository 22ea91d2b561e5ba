//! One fenced run: spawn under an acquired lease, renew in the background,
//! kill before the local deadline, release. Shared by the daemon and
//! `fencecron exec`.
//!
//! The deadline rule (docs/guarantee.md, "The guarantee, exactly", point 1): from the moment the last
//! successful acquire or renew was *sent*, measured on this host's monotonic
//! clock, the job receives SIGTERM at `lease − margin − kill_grace` and
//! SIGKILL at `lease − margin`. The store computed its expiry no earlier
//! than that send, so the job is dead before the lease can expire — whether
//! the store is slow, unreachable, or this process was paused. The deadline
//! timer never waits for a renewal to fail: a renewal in flight and the
//! deadline race in one `select!`.
//!
//! The flow of one run is here ([`Supervisor::run`]); the deadline state
//! machine is [`deadline`], the job's process and its watchdog are
//! [`child`], and the lease's timing is [`timing`].

mod child;
mod deadline;
mod end;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::domain::{RunOutcome, Stage};
use crate::events::{self, LossReason};
use crate::fence;
use crate::job_env::ChildEnv;
use crate::names::Name;
use crate::runs::{RunRecord, RunRecords};
use crate::store::{millis, rfc3339, Lease, NewStaleRecord, RunEnd, StaleKind, Store};

pub use crate::timing::{LeaseTiming, DEFAULT_LEASE};
use child::ShimLauncher;
pub(crate) use child::{JobProcess, Launch};
use deadline::Watch;
use end::End;
pub(crate) use end::Unused;

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
    /// A daemon's run, recorded in the run history by its acquire: the
    /// supervisor writes how it ended, with up to this many bytes of its
    /// last output. `None` for `exec`.
    pub history: Option<usize>,
}

impl RunSpec {
    /// `FENCECRON_RUN_ID`: `JOB@SCHEDULED_AT` for a scheduled occurrence, the
    /// same on every host and for every attempt at that occurrence, so a
    /// destination can deduplicate on it; `RESOURCE@OWNER_ID` for `exec`,
    /// whose every run is its own.
    pub fn run_id(&self, lease: &Lease) -> String {
        match self.scheduled_at {
            Some(at) => format!("{}@{}", self.job, rfc3339(at)),
            None => format!("{}@{}", self.job, lease.owner_id),
        }
    }
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
    /// How the run ended, as `job_finished` names it.
    pub fn outcome(&self) -> RunOutcome {
        outcome_of(self.exit_code, self.cancelled, self.lease_lost)
    }

    /// The shell-style exit code: the child's code, or 128 + signal.
    pub fn shell_code(&self) -> u8 {
        match (self.exit_code, self.signal) {
            (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
            (None, Some(s)) => u8::try_from(128 + s).unwrap_or(255),
            (None, None) => 1,
        }
    }
}

/// What is wrong with a job's `workdir`, if anything: starting the job
/// there would fail with an error that names the command instead.
pub fn workdir_problem(dir: &Path) -> Option<String> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => None,
        Ok(_) => Some("is not a directory".to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("does not exist".to_string()),
        Err(e) => Some(format!("cannot be used ({e})")),
    }
}

/// How a run that started ended: fencecron's own reason to end it wins
/// over the exit status it caused.
fn outcome_of(
    exit_code: Option<i32>,
    cancelled: Option<CancelReason>,
    lease_lost: bool,
) -> RunOutcome {
    match cancelled {
        Some(CancelReason::LeaseLost | CancelReason::LeaseUnconfirmed) => RunOutcome::LeaseLost,
        Some(CancelReason::Timeout) => RunOutcome::TimedOut,
        Some(CancelReason::Shutdown) => RunOutcome::Shutdown,
        None if lease_lost => RunOutcome::LeaseLost,
        None if exit_code == Some(0) => RunOutcome::Succeeded,
        None => RunOutcome::Failed,
    }
}

/// Runs jobs under leases on one store, as one node.
#[derive(Clone)]
pub struct Supervisor {
    store: Arc<dyn Store>,
    node: String,
    /// Where the daemon notes each run in progress, so that after a crash
    /// its successor can give back the leases of runs that are provably
    /// dead (`None` for `exec`).
    records: Option<Arc<RunRecords>>,
    /// How jobs are started: through their watchdog, with the fencing
    /// environment and `child_env` ([`ShimLauncher`]).
    launcher: Arc<dyn Launch>,
}

/// Errors before the child ran.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    /// The command could not be started.
    #[error("cannot start `{program}`: {error}; check the command path and permissions")]
    Spawn { program: String, error: String },
    /// The job's `workdir` is missing or not a directory.
    #[error(
        "the job's workdir `{path}` {problem}; create the directory or fix the job's `workdir`"
    )]
    Workdir { path: String, problem: String },
    #[error("the lease was acquired too late to run safely (the store took longer than the lease allows); skipped")]
    AcquiredTooLate,
}

impl Supervisor {
    /// A supervisor that starts jobs through their watchdog, with
    /// `child_env` applied to their environment.
    pub fn new(store: Arc<dyn Store>, node: String, child_env: ChildEnv) -> Self {
        Self::with_launcher(store, node, Arc::new(ShimLauncher::new(child_env)))
    }

    /// A supervisor that starts jobs with `launcher` (tests start fake ones).
    pub(crate) fn with_launcher(
        store: Arc<dyn Store>,
        node: String,
        launcher: Arc<dyn Launch>,
    ) -> Self {
        Supervisor {
            store,
            node,
            records: None,
            launcher,
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

    /// How each run's whole process tree is stopped: `cgroup` or
    /// `subreaper` (see [`crate::proctree`]).
    pub fn process_tree(&self) -> &'static str {
        self.launcher.process_tree()
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
            let job = (spec.job.as_str(), &spec.resource);
            self.give_back_unused(job, &lease, spec.scheduled_at, Unused::TooLate)
                .await;
            return Err(SuperviseError::AcquiredTooLate);
        }
        let workdir = spec.workdir.as_deref();
        if let Some((dir, problem)) = workdir.and_then(|d| workdir_problem(d).map(|p| (d, p))) {
            let err = SuperviseError::Workdir {
                path: dir.display().to_string(),
                problem,
            };
            events::job_spawn_failed(&spec.job, lease.token, &err.to_string());
            self.spawn_failed(spec, &lease, &err).await;
            return Err(err);
        }
        let kill_at = sent_at + timing.kill_by();
        let lag = timing.watchdog_lag();
        let mut job = match self
            .launcher
            .start(
                spec,
                &lease,
                &self.node,
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
                self.spawn_failed(spec, &lease, &err).await;
                return Err(err);
            }
        };
        let started = Instant::now();
        let scheduled = spec.scheduled_at.map(rfc3339).unwrap_or_default();
        let record = self.note_run(spec, &lease, job.as_ref());
        events::job_started(
            &spec.job,
            spec.resource.as_str(),
            lease.token,
            Some(job.pid()),
            spec.scheduled_at,
        );
        job.forward_output(&spec.job, lease.token, spec.history.unwrap_or(0));

        let mut watch = Watch::new(self, spec, &lease, sent_at, started);
        let status = watch.supervise(job.as_mut(), &shutdown).await;

        // The leader is gone; make sure nothing else of the job outlives the
        // lease (a grandchild could still hold the token).
        job.reap().await;
        let (exit_code, signal) = match &status {
            Ok(st) => (st.code(), st.signal()),
            Err(_) => (None, None),
        };
        let cancelled = watch.cancel_reason();
        let outcome = outcome_of(exit_code, cancelled, watch.lost());
        let duration = started.elapsed();
        let ended = events::JobEnd {
            job: &spec.job,
            resource: spec.resource.as_str(),
            node: &self.node,
            token: lease.token,
            scheduled_at: (!scheduled.is_empty()).then_some(scheduled.as_str()),
            outcome,
            exit_code,
            signal,
            duration,
        };
        events::job_finished(&ended);
        if outcome == RunOutcome::Shutdown {
            events::job_stopped(&ended, watch.sent_signal().unwrap_or("SIGTERM"));
        }
        if let (Some(code), Some(stale_code)) = (exit_code, spec.stale_exit_code) {
            if code == stale_code {
                self.job_reported_stale(spec, &lease).await;
            }
        }
        let signal_name = signal.map(events::signal_name);
        let output = job.output_tail();
        let end = RunEnd {
            resource: spec.resource.as_str(),
            token: lease.token,
            outcome,
            exit_code,
            signal: signal_name.as_deref(),
            duration_ms: millis(duration),
            elapsed_ms: millis(sent_at.elapsed()),
            output: &output,
        };
        let end = if watch.lost() {
            End::Lost(&end)
        } else {
            End::Release(&end)
        };
        self.end(spec, &lease, end).await;
        if let (Some(records), Some(path)) = (&self.records, record) {
            records.remove(&path);
        }
        Ok(RunResult {
            exit_code,
            signal,
            cancelled,
            lease_lost: watch.lost(),
        })
    }

    /// Notes a run in progress for a successor daemon; returns the record's
    /// path. A failure to write is logged, not fatal: without the record
    /// the lease simply runs out by itself after a crash.
    fn note_run(&self, spec: &RunSpec, lease: &Lease, job: &dyn JobProcess) -> Option<PathBuf> {
        let records = self.records.as_ref()?;
        let child_pid = job.watchdog_pid()?;
        let rec = RunRecord::new(
            &spec.job,
            spec.resource.as_str(),
            lease,
            child_pid,
            job.pid(),
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

    /// The job could not be started: its history says so, and the lease
    /// goes back.
    async fn spawn_failed(&self, spec: &RunSpec, lease: &Lease, err: &SuperviseError) {
        let output = err.to_string();
        let end = RunEnd {
            resource: spec.resource.as_str(),
            token: lease.token,
            outcome: RunOutcome::SpawnFailed,
            exit_code: None,
            signal: None,
            duration_ms: 0,
            elapsed_ms: 0,
            output: &output,
        };
        self.end(spec, lease, End::Release(&end)).await;
    }

    /// The store refused to release: the lease was lost before the job
    /// ended (it finished while this process was paused, say): a
    /// stale-owner event like any other, so it is stored too.
    fn release_refused(&self, job: &str, lease: &Lease, r: &crate::store::Refusal) {
        events::lease_lost(
            Some(job),
            lease,
            &self.node,
            LossReason::ReleaseRefused,
            &r.to_string(),
        );
        self.record_lost(job, lease, LossReason::ReleaseRefused);
    }

    /// The job exited with its configured stale code: it reports a write its
    /// own storage rejected. Record and log it like any other.
    async fn job_reported_stale(&self, spec: &RunSpec, lease: &Lease) {
        let owner = lease.owner_id;
        let op = uuid::Uuid::new_v4().to_string();
        let rec = NewStaleRecord {
            kind: StaleKind::WriteRejected,
            reason: crate::store::RejectReason::Stale.into(),
            resource: spec.resource.as_str(),
            key: None,
            owner_id: Some(owner),
            token: lease.token,
            accepted_token: None,
            node: &self.node,
            job: Some(&spec.job),
            stage: crate::domain::Stage::Job,
            operation_id: &op,
        };
        match fence::record(self.store.as_ref(), &rec).await {
            Some(stored) => events::stale_write_rejected(&stored),
            None => events::stale_write_rejected(&crate::store::StaleRecord {
                at: crate::store::StoreTime::from_utc(Utc::now()),
                kind: rec.kind,
                reason: rec.reason.clone(),
                resource: rec.resource.to_string(),
                key: None,
                owner_id: Some(owner),
                token: rec.token,
                accepted_token: None,
                node: self.node.clone(),
                job: Some(spec.job.clone()),
                stage: rec.stage.clone(),
                operation_id: op.clone(),
            }),
        }
    }

    /// Records a lost lease in the store, retrying in the background while
    /// the store is unreachable (the event itself is already logged).
    fn record_lost(&self, job: &str, lease: &Lease, reason: LossReason) {
        fence::record_in_background(
            self.store.clone(),
            fence::PendingRecord {
                kind: StaleKind::LeaseLost,
                reason: reason.into(),
                resource: lease.resource.clone(),
                owner_id: lease.owner_id,
                token: lease.token,
                accepted_token: None,
                node: self.node.clone(),
                job: Some(job.to_string()),
                stage: Stage::Renew,
            },
        );
    }
}

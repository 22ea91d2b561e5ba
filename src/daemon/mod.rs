//! The daemon: schedules jobs, competes for each occurrence's lease and runs
//! the winners under the [`Supervisor`], until it is told to stop.
//!
//! [`run`] takes plain [`Settings`] and a stream of [`Control`] messages,
//! both built by the command layer (`commands::run`, which turns SIGHUP into
//! a reloaded job list, a first SIGTERM into a drain and SIGINT or a second
//! SIGTERM into a stop), so the daemon knows nothing of the command line,
//! config files or signals, and a test can run it in-process. One scheduler
//! task ([`scheduler`]) fires instants; each due occurrence is its own task
//! ([`occurrence`]).
//!
//! Stopping has two stages. A drain ([`Control::Drain`]) cancels
//! `Shared::draining`: the scheduler fires nothing more and polls no
//! triggers, an occurrence waiting to compete (for a place, for a retry
//! after a store failure, for a store clock behind ours, for a retry of a
//! failed run) stops, and the instants go to the other nodes at once. An
//! attempt already sent is answered as usual, and what this node has won
//! runs: the other nodes have lost that instant and stopped competing for
//! it, so a win given back would run nowhere. Running jobs keep renewing
//! their leases (the deadlines are untouched) and may finish by themselves
//! for up to `node.shutdown_grace`. Then (or at once, on [`Control::Stop`])
//! the stop cancels `Shared::shutdown`, which terminates what still runs
//! (SIGTERM, `kill_grace`, SIGKILL), and waits for every task in the
//! [`TaskTracker`], so leases are released before `run` returns. A run
//! stopped that way ends with outcome `shutdown`: not a failure (no
//! `job_failed`, no `on_failure`, no retry).
//! systemd is told READY (once the store has answered; until then STATUS
//! says what the daemon waits for), RELOADING, STATUS, STOPPING and, with
//! `WatchdogSec=`, WATCHDOG pings from the scheduler loop itself.

mod assign;
mod claim;
mod fleet;
mod heartbeat;
mod hook;
mod occurrence;
mod scheduler;
mod sweep;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::sync::{mpsc, watch, OnceCell};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backoff::Backoff;
use crate::clock::Clock;
use crate::config::{History, Job};
use crate::domain::NodeId;
use crate::events;
use crate::job_env::ChildEnv;
use crate::runs::{self, RunRecords};
use crate::store::{self, OpenOptions, Store};
use crate::supervise::Supervisor;

pub use heartbeat::current_drift;
use heartbeat::{Heartbeat, JobSet};
use occurrence::{Capacity, Running};
use scheduler::Scheduler;

/// Time limit for one store call made by the daemon.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections per daemon unless `store.max_connections` says otherwise:
/// twenty hosts fit in PostgreSQL's default limit of 100. A caller that
/// finds every connection busy waits for one to come back instead of
/// opening another, which costs a round trip at most.
const DEFAULT_MAX_CONNECTIONS: u32 = 4;

/// How the daemon opens its store: `store.max_connections` (default 4) and
/// its per-call time limit.
pub fn store_options(max_connections: Option<u32>) -> OpenOptions {
    OpenOptions {
        max_connections: max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
        call_timeout: CALL_TIMEOUT,
        hook: None,
    }
}

/// What the daemon runs with.
pub struct Settings {
    /// This node's id.
    pub node: NodeId,
    /// `node.max_running`: how many runs this daemon holds at once; `None`
    /// for no limit.
    pub max_running: Option<u32>,
    /// The jobs to schedule. Held once, by the scheduler (a few hundred
    /// bytes a job: a copy of 10,000 jobs would cost megabytes).
    pub jobs: Vec<Arc<Job>>,
    /// The store, opened with [`store_options`]; migrations are applied by
    /// the daemon, retried until the store answers.
    pub store: Arc<dyn Store>,
    /// What every job's environment gains and loses.
    pub child_env: ChildEnv,
    /// Where runs in progress are noted for a successor after a crash;
    /// `None` when there is no usable directory (leases then expire by
    /// themselves).
    pub records: Option<Arc<RunRecords>>,
    /// For the start-up log line: the store (redacted) and the config file.
    pub store_display: String,
    /// Which daemons the store fences ([`crate::store::StoreUrl::scope`]).
    pub store_scope: &'static str,
    pub config_display: String,
    /// How often to ping systemd's watchdog (half of `WatchdogSec=`); `None`
    /// without one. The scheduler loop pings, so a stuck loop stops pinging.
    pub watchdog: Option<Duration>,
    /// `[history]`: retention and output kept per run.
    pub history: History,
    /// `node.shutdown_grace`: how long a drain lets running jobs finish.
    pub shutdown_grace: Duration,
    /// Whether `/metrics` is served (`[http] listen`): only then does the
    /// daemon read the run history at start (the restored timestamps) and
    /// the pauses at every beat (`fencecron_job_paused`).
    pub metrics: bool,
}

/// The first wait before retrying a store that did not answer at start-up;
/// doubled up to [`STARTUP_RETRY_MAX`].
const STARTUP_RETRY: Duration = Duration::from_secs(1);
const STARTUP_RETRY_MAX: Duration = Duration::from_secs(30);

/// What the daemon can be told while it runs.
#[derive(Debug)]
pub enum Control {
    /// A new job list; or why it could not be read (the old jobs keep
    /// running).
    Reload(Result<Vec<Arc<Job>>, String>),
    /// Drain, then stop: compete for nothing more, let running jobs finish
    /// for up to `shutdown_grace`, then stop what is left. The reason is
    /// logged (`SIGTERM`). A drain during a drain stops at once.
    Drain(&'static str),
    /// Stop now: terminate running jobs, release their leases, return. The
    /// reason is logged (`SIGINT`, a second `SIGTERM`).
    Stop(&'static str),
}

/// Runs the daemon until [`Control::Stop`] (or a drain, or until `control`
/// closes), then terminates running jobs and returns once every lease is
/// released.
pub async fn run(settings: Settings, control: mpsc::Receiver<Control>) {
    // Jobs get it through the supervisor; `on_failure` hooks through
    // `Shared`.
    let child_env = settings.child_env.clone();
    let mut supervisor =
        Supervisor::new(settings.store.clone(), settings.node.to_string(), child_env);
    if let Some(records) = &settings.records {
        supervisor = supervisor.with_records(records.clone());
    }
    serve(settings, control, supervisor, Clock::system()).await
}

/// [`run`] with the supervisor and the clock given (tests start fake jobs
/// on tokio's paused clock).
async fn serve(
    settings: Settings,
    mut control: mpsc::Receiver<Control>,
    supervisor: Supervisor,
    clock: Clock,
) {
    let Settings {
        node,
        max_running,
        jobs,
        store,
        records,
        store_display,
        store_scope,
        config_display,
        watchdog,
        child_env,
        history,
        shutdown_grace,
        metrics,
    } = settings;
    // Validated once, before the daemon; what it shares takes it as text.
    let node = node.to_string();
    let shutdown = CancellationToken::new();
    let draining = CancellationToken::new();
    let tracker = TaskTracker::new();
    let ready = Arc::new(OnceCell::new());
    if let Some(records) = records {
        // Leases of runs an earlier process of this node left behind are
        // given back once those runs are provably dead.
        tracker.spawn(runs::recover(records, store.clone(), node.clone()));
    }

    // Apply migrations, retrying until the store answers; systemd hears
    // READY=1 only then (a unit ordered after this one relies on a daemon
    // that can take leases), and STATUS= says what it waits for. The daemon
    // keeps scheduling meanwhile: an occurrence retries the store itself.
    {
        let store = store.clone();
        let ready = ready.clone();
        let shutdown = shutdown.clone();
        let status = format!("scheduling {} job(s) as {node}", jobs.len());
        let names: Vec<String> = jobs.iter().map(|j| j.name.to_string()).collect();
        tracker.spawn(async move {
            await_store(&ready, store.as_ref(), &shutdown).await;
            if ready.initialized() && !shutdown.is_cancelled() {
                notify(&[NotifyState::Ready, NotifyState::Status(&status)]);
                if metrics {
                    restore_metrics(store.as_ref(), &names).await;
                }
            }
        });
    }

    let (reload_tx, reload_rx) = mpsc::channel(4);
    let running = Running::default();
    let process_tree = supervisor.process_tree();
    // The node's row in the store: not in the tracker, since it outlives
    // every other task (its last beat says the node stopped).
    let stopped = CancellationToken::new();
    let (jobs_tx, jobs_rx) = watch::channel(JobSet::of(&jobs));
    let views = assign::Views::default();
    let beats = tokio::spawn(
        Heartbeat {
            store: store.clone(),
            node: node.clone(),
            jobs: jobs_rx,
            running: running.clone(),
            ready: ready.clone(),
            draining: draining.clone(),
            stopped: stopped.clone(),
            clock,
            retention: history.nodes,
            metrics,
            views: views.clone(),
        }
        .run(),
    );
    let scheduler = Scheduler::new(Shared {
        supervisor,
        running: running.clone(),
        capacity: Capacity::new(max_running),
        ready: ready.clone(),
        shutdown: shutdown.clone(),
        draining: draining.clone(),
        tracker: tracker.clone(),
        clock,
        watchdog,
        hook_env: child_env,
        history,
        sweeper: Default::default(),
        metrics,
        views: views.clone(),
    });
    let job_count = jobs.len();
    tracker.spawn(scheduler.run(jobs, reload_rx));

    events::daemon_started(
        &node,
        job_count,
        &store_display,
        store_scope,
        &config_display,
        process_tree,
    );
    if !ready.initialized() {
        notify(&[NotifyState::Status(&format!(
            "waiting for the store {store_display} to answer"
        ))]);
    }

    let (reason, drain) = loop {
        match control.recv().await {
            Some(Control::Reload(jobs)) => {
                if let Ok(jobs) = &jobs {
                    // The other nodes may split the instants by the old
                    // jobs until they see the new ones: compete for
                    // everything until the beats agree again.
                    views.hold_off();
                    jobs_tx.send_replace(JobSet::of(jobs));
                }
                reload(jobs, &reload_tx, ready.initialized()).await
            }
            Some(Control::Drain(reason)) => break (reason, shutdown_grace),
            Some(Control::Stop(reason)) => break (reason, Duration::ZERO),
            None => break ("control stream closed", Duration::ZERO),
        }
    };
    draining.cancel();
    events::daemon_stopping(reason, running.len(), drain);
    if !drain.is_zero() {
        notify(&[NotifyState::Stopping]);
        let started = tokio::time::Instant::now();
        let (why, left) = drain_runs(&running, started + drain, &mut control).await;
        events::drain_ended(why, left, started.elapsed());
    }
    notify(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping: terminating jobs and releasing leases"),
    ]);
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    stopped.cancel();
    let _ = beats.await;
    events::daemon_stopped();
}

/// The drain: waits until no run is left on this node, `until` passes, or
/// a second stop request comes, keeping systemd's STATUS= up to date with
/// the runs left; returns why it ended (`runs_finished`, `grace_expired`,
/// or the request's reason) and how many runs were left then. A reload is
/// ignored: the scheduler fires nothing more.
async fn drain_runs(
    running: &Running,
    until: tokio::time::Instant,
    control: &mut mpsc::Receiver<Control>,
) -> (&'static str, usize) {
    loop {
        // Registered before the count is read, so a run that ends between
        // the two still wakes this loop.
        let changed = running.changed();
        let left = running.len();
        if left == 0 {
            return ("runs_finished", 0);
        }
        let secs = until
            .saturating_duration_since(tokio::time::Instant::now())
            .as_secs_f64()
            .ceil();
        notify(&[NotifyState::Status(&format!(
            "draining: {left} run(s) left, stopping them in {secs}s"
        ))]);
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep_until(until) => return ("grace_expired", running.len()),
            message = control.recv() => match message {
                Some(Control::Drain(reason) | Control::Stop(reason)) => {
                    return (reason, running.len())
                }
                Some(Control::Reload(_)) => {}
                None => return ("control stream closed", running.len()),
            },
        }
    }
}

/// Sends states to systemd when run under `Type=notify`; a no-op otherwise.
fn notify(states: &[NotifyState<'_>]) {
    let _ = sd_notify::notify(false, states);
}

/// Hands a reloaded job list to the scheduler. An invalid file keeps the
/// old jobs. systemd hears RELOADING=1 (with the monotonic time
/// `Type=notify-reload` asks for), then READY=1 again, unless the daemon was
/// not ready yet (its store has not answered).
async fn reload(
    jobs: Result<Vec<Arc<Job>>, String>,
    tx: &mpsc::Sender<Vec<Arc<Job>>>,
    ready: bool,
) {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
    match jobs {
        Err(e) => events::config_invalid(&e),
        Ok(jobs) => {
            let count = jobs.len();
            let _ = tx.send(jobs).await;
            notify(&[NotifyState::Status(&format!("scheduling {count} job(s)"))]);
        }
    }
    if ready {
        notify(&[NotifyState::Ready]);
    }
}

/// Applies migrations, retrying with back-off until the store answers or
/// the daemon stops; each failure is logged (`store_unavailable`) and shown
/// in systemd's STATUS=.
async fn await_store(ready: &OnceCell<()>, store: &dyn Store, shutdown: &CancellationToken) {
    let mut backoff = Backoff::new(STARTUP_RETRY, STARTUP_RETRY_MAX);
    loop {
        let error = match ensure_ready(ready, store).await {
            Ok(()) => return,
            Err(e) => e.to_string(),
        };
        let wait = backoff.wait();
        events::store_unavailable(store.outages(), "migrate", None, &error, Some(wait));
        notify(&[NotifyState::Status(&format!(
            "waiting for the store: {error}; retrying in {}s",
            wait.as_secs()
        ))]);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// How many runs of the history the start-up reads to restore the metrics'
/// last-success and last-run timestamps: the newest this many successes,
/// and the newest this many runs of any outcome. A job whose last success
/// is older than the fleet's newest `RESTORE_RUNS` successes keeps no
/// last-success series until its next one.
pub const RESTORE_RUNS: u32 = 1000;

/// Restores, once the store answers at start, what the metrics say about
/// the past from the run history (`fencecron_job_last_success_timestamp_seconds`,
/// `fencecron_job_last_run_timestamp_seconds`): two bounded reads, once
/// per process; a scrape never reads the store. A store that fails here leaves the
/// gauges to the runs that end from now on (logged, not retried).
async fn restore_metrics(store: &dyn Store, names: &[String]) {
    let read = async {
        let successes = store
            .runs(&store::RunQuery {
                outcome: Some(crate::domain::RunOutcome::Succeeded),
                limit: RESTORE_RUNS,
                ..Default::default()
            })
            .await?;
        let runs = store
            .runs(&store::RunQuery {
                limit: RESTORE_RUNS,
                ..Default::default()
            })
            .await?;
        Ok::<_, store::StoreError>((successes, runs))
    };
    let (successes, runs) = match read.await {
        Ok(r) => r,
        Err(e) => {
            events::store_unavailable(store.outages(), "runs", None, &e.to_string(), None);
            return;
        }
    };
    let secs = |t: store::StoreTime| t.0 as f64 / 1000.0;
    for name in names {
        // Newest first: the first of each job is its latest.
        let success = successes
            .iter()
            .find(|r| r.job == *name)
            .and_then(|r| r.finished_at)
            .map(secs);
        let ended = runs
            .iter()
            .filter(|r| r.job == *name)
            .find_map(|r| r.finished_at)
            .map(secs);
        crate::metrics::restore(name, success, ended);
    }
}

/// Pings systemd's watchdog (`WATCHDOG=1`).
fn ping_watchdog() {
    notify(&[NotifyState::Watchdog]);
}

/// Applies migrations once per process; retried by later callers on failure.
async fn ensure_ready(ready: &OnceCell<()>, store: &dyn Store) -> Result<(), store::StoreError> {
    ready.get_or_try_init(|| store.migrate()).await.map(|_| ())
}

/// What the scheduler and every occurrence of this node share.
#[derive(Clone)]
struct Shared {
    supervisor: Supervisor,
    /// Resources with a run in progress on this node.
    running: Running,
    /// `node.max_running`.
    capacity: Capacity,
    /// Set once migrations are applied.
    ready: Arc<OnceCell<()>>,
    /// Cancelled when running jobs are to be stopped: at once on a stop,
    /// after the drain otherwise.
    shutdown: CancellationToken,
    /// Cancelled when the daemon starts to stop (a drain or a stop, so
    /// always before `shutdown`): from then on the node competes for
    /// nothing new (no instant, no trigger, no retry), while its running
    /// jobs go on renewing their leases.
    draining: CancellationToken,
    /// Every task of the daemon; shutdown waits for all of them.
    tracker: TaskTracker,
    /// Wall time: instants, give-up times.
    clock: Clock,
    /// How often the scheduler loop pings systemd's watchdog, if at all.
    watchdog: Option<Duration>,
    /// The environment changes `on_failure` hooks get (the jobs' own).
    hook_env: ChildEnv,
    /// `[history]`.
    history: History,
    /// Looks for wins whose answers never came.
    sweeper: sweep::Sweeper,
    /// Whether `/metrics` is served (`[http]`): only then does every job
    /// get its series from the start (next run, runs at zero, duration…),
    /// about 1 KB a job that no one could read otherwise (10 MB at 10,000
    /// jobs). Events still move the series of the jobs they are about.
    metrics: bool,
    /// The live nodes as the heartbeat last saw them, when they can be
    /// trusted: who claims which occurrence ([`assign`]).
    views: assign::Views,
}

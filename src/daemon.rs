//! `fencecron run`: ties the scheduler, the supervisor, signals and systemd
//! together.
//!
//! One scheduler task owns a min-heap of (next instant, job) and sleeps until
//! the earliest instant; each due occurrence becomes its own task that
//! competes for the lease and, on winning, runs the job under the
//! [`Supervisor`]. Signals arrive through signal-hook: SIGTERM/SIGINT cancel
//! one [`CancellationToken`] that every task watches, SIGHUP sends a new job
//! list to the scheduler. Shutdown waits for every task in the
//! [`TaskTracker`], so leases are released before the process exits.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use sd_notify::NotifyState;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_tokio::Signals;
use tokio::sync::{mpsc, OnceCell};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cli::Cli;
use crate::commands::Context;
use crate::config::Job;
use crate::error::{Error, Result};
use crate::events;
use crate::fence;
use crate::names::Name;
use crate::runs::{self, RunRecords};
use crate::store::{self, rfc3339, AcquireOutcome, AcquireRequest, OpenOptions, Store, StoreTime};
use crate::supervise::{RunSpec, SuperviseError, Supervisor};

/// The longest the scheduler sleeps before re-reading the wall clock, so a
/// stepped clock (NTP, manual change) shifts firings by at most this much.
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// How far ahead of the store's clock this host's clock may run before an
/// occurrence is skipped instead of waited for.
const MAX_CLOCK_AHEAD: Duration = Duration::from_secs(60);

/// Time limit for one store call made by the daemon.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections per daemon unless `store.max_connections` says otherwise:
/// twenty hosts fit in PostgreSQL's default limit of 100. A caller that
/// finds every connection busy waits for one to come back instead of
/// opening another, which costs a round trip at most.
const DEFAULT_MAX_CONNECTIONS: u32 = 4;

/// Runs the daemon until SIGTERM/SIGINT; returns exit code 0 after a clean
/// shutdown.
pub async fn run(cli: &Cli, node_flag: Option<String>) -> Result<u8> {
    let mut ctx = Context::load(cli, true)?;
    // Computed while the context still holds the config (it names the
    // config file to the jobs).
    let child_env = ctx.child_env()?;
    // The job list is held once, by the scheduler: with croner's schedules
    // at about 5 KB each, every copy of 1,000 jobs costs 5 MB.
    let config = ctx
        .config
        .take()
        .ok_or_else(|| Error::Usage("fencecron run needs a config file".to_string()))?;
    let started_with = StartedWith {
        store: config.store.clone(),
        store_max_connections: config.store_max_connections,
        node_id: config.node_id.clone(),
    };
    let node = node_flag.unwrap_or_else(|| ctx.node.clone());
    Name::parse("node", &node).map_err(|m| Error::Usage(format!("--node-id: {m}")))?;

    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| Error::Runtime(format!("cannot install signal handlers: {e}")))?;
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let ready = Arc::new(OnceCell::new());
    let store = store::open(
        &ctx.store_url,
        &OpenOptions {
            max_connections: config
                .store_max_connections
                .unwrap_or(DEFAULT_MAX_CONNECTIONS),
            call_timeout: CALL_TIMEOUT,
        },
    )?;
    let mut supervisor = Supervisor::new(store.clone(), node.clone(), child_env);
    match RunRecords::open(&node, &ctx.store_url) {
        Ok(records) => {
            let records = Arc::new(records);
            supervisor = supervisor.with_records(records.clone());
            // Leases of runs an earlier process of this node left behind are
            // given back once those runs are provably dead.
            tracker.spawn(runs::recover(records, store.clone(), node.clone()));
        }
        Err(e) => events::run_record_failed(
            None,
            &format!("no run-record directory ({e}); after a crash this node's leases expire by themselves"),
        ),
    }

    // Apply migrations now if the store answers; if not, the first firing
    // retries, and the daemon keeps running either way.
    {
        let store = store.clone();
        let ready = ready.clone();
        tracker.spawn(async move {
            if let Err(e) = ensure_ready(&ready, store.as_ref()).await {
                events::store_unavailable("migrate", None, &e.to_string(), None);
            }
        });
    }

    let (reload_tx, reload_rx) = mpsc::channel(4);
    let running = Arc::new(Mutex::new(HashSet::new()));
    let scheduler = Scheduler {
        supervisor,
        jobs: HashMap::new(),
        heap: BinaryHeap::new(),
        generation: 0,
        running: running.clone(),
        ready,
        tracker: tracker.clone(),
        shutdown: shutdown.clone(),
    };
    let job_count = config.jobs.len();
    tracker.spawn(scheduler.run(config.jobs, reload_rx));

    events::daemon_started(
        &node,
        job_count,
        &ctx.store_url.to_string(),
        &ctx.config_path.display().to_string(),
    );
    notify(&[
        NotifyState::Ready,
        NotifyState::Status(&format!("scheduling {job_count} job(s) as {node}")),
    ]);

    let reason = loop {
        match signals.next().await {
            Some(SIGHUP) => reload(&ctx, &started_with, &reload_tx).await,
            Some(SIGTERM) => break "SIGTERM",
            Some(SIGINT) => break "SIGINT",
            Some(_) => {}
            None => break "signal stream closed",
        }
    };
    notify(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping: terminating jobs and releasing leases"),
    ]);
    let in_progress = running.lock().map(|r| r.len()).unwrap_or(0);
    events::daemon_stopping(reason, in_progress);
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    events::daemon_stopped();
    Ok(0)
}

/// Sends states to systemd when run under `Type=notify`; a no-op otherwise.
fn notify(states: &[NotifyState<'_>]) {
    let _ = sd_notify::notify(false, states);
}

/// The settings a reload cannot change.
struct StartedWith {
    store: Option<store::StoreUrl>,
    store_max_connections: Option<u32>,
    node_id: Option<String>,
}

/// Reloads jobs.toml on SIGHUP. An invalid file keeps the old jobs.
async fn reload(ctx: &Context, original: &StartedWith, tx: &mpsc::Sender<Vec<Job>>) {
    notify(&[NotifyState::Reloading]);
    match ctx.reload_config() {
        Err(e) => events::config_invalid(&e.to_string()),
        Ok(new) => {
            if !ctx.store_from_flag && new.store != original.store {
                events::config_ignored("store", "the store cannot change while running; restart the daemon to use the new store");
            }
            if new.store_max_connections != original.store_max_connections {
                events::config_ignored(
                    "store.max_connections",
                    "the connection pool cannot be resized while running; restart the daemon",
                );
            }
            if new.node_id != original.node_id {
                events::config_ignored(
                    "node.id",
                    "the node id cannot change while running; restart the daemon",
                );
            }
            let count = new.jobs.len();
            let _ = tx.send(new.jobs).await;
            notify(&[NotifyState::Status(&format!("scheduling {count} job(s)"))]);
        }
    }
    notify(&[NotifyState::Ready]);
}

/// Applies migrations once per process; retried by later callers on failure.
async fn ensure_ready(ready: &OnceCell<()>, store: &dyn Store) -> Result<(), store::StoreError> {
    ready.get_or_try_init(|| store.migrate()).await.map(|_| ())
}

/// One job as the scheduler knows it.
struct Entry {
    job: Arc<Job>,
    generation: u64,
}

/// A heap entry: instant, rank, generation, job name.
type Due = (DateTime<Utc>, u64, u64, String);

/// The timer: fires each job's occurrences at their instants.
struct Scheduler {
    supervisor: Supervisor,
    jobs: HashMap<String, Entry>,
    /// Next instant per job, then the job's node-specific rank (see
    /// [`rank`]); entries of replaced or removed jobs are recognised by
    /// their generation and dropped when they surface.
    heap: BinaryHeap<Reverse<Due>>,
    generation: u64,
    /// Resources with a run in progress on this node.
    running: Arc<Mutex<HashSet<String>>>,
    ready: Arc<OnceCell<()>>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
}

impl Scheduler {
    async fn run(mut self, jobs: Vec<Job>, mut reloads: mpsc::Receiver<Vec<Job>>) {
        self.apply(jobs, false);
        loop {
            let now = Utc::now();
            let sleep_for = self
                .heap
                .peek()
                .map(|Reverse((at, _, _, _))| (*at - now).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(MAX_SLEEP)
                .min(MAX_SLEEP);
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => return,
                Some(jobs) = reloads.recv() => self.apply(jobs, true),
                _ = tokio::time::sleep(sleep_for) => self.fire_due(),
            }
        }
    }

    /// Installs a job list: unchanged jobs keep their timers, changed and
    /// new ones start from now, removed ones stop firing. Runs in progress
    /// are not touched.
    fn apply(&mut self, jobs: Vec<Job>, is_reload: bool) {
        let now = Utc::now();
        let names: HashSet<String> = jobs.iter().map(|j| j.name.to_string()).collect();
        let before = self.jobs.len();
        self.jobs.retain(|name, _| names.contains(name));
        let removed = before - self.jobs.len();
        let (mut added, mut changed) = (0, 0);
        for job in jobs {
            let name = job.name.to_string();
            match self.jobs.get(&name) {
                Some(e) if *e.job == job => continue,
                Some(_) => changed += 1,
                None => added += 1,
            }
            self.generation += 1;
            let rank = rank(self.supervisor.node(), &name);
            if let Some(next) = job.schedule.next_after(now) {
                self.heap
                    .push(Reverse((next, rank, self.generation, name.clone())));
            }
            self.jobs.insert(
                name,
                Entry {
                    job: Arc::new(job),
                    generation: self.generation,
                },
            );
        }
        if is_reload {
            events::config_reloaded(added, removed, changed, self.jobs.len());
        }
    }

    /// Fires every occurrence that is due.
    fn fire_due(&mut self) {
        let now = Utc::now();
        while let Some(Reverse((at, rank, generation, name))) = self.heap.peek().cloned() {
            if at > now {
                break;
            }
            self.heap.pop();
            let Some(entry) = self.jobs.get(&name) else {
                continue;
            };
            if entry.generation != generation {
                continue;
            }
            let job = entry.job.clone();
            let next = job.schedule.next_after(at);
            if let Some(n) = next {
                self.heap.push(Reverse((n, rank, generation, name.clone())));
            }
            if next.is_some_and(|n| n <= now) {
                // A later instant is already due (this host was paused or
                // overloaded): only the newest due occurrence is attempted.
                events::occurrence_skipped(
                    &name,
                    &rfc3339(at),
                    "missed",
                    "a later occurrence is already due on this node",
                );
                continue;
            }
            let occurrence = Occurrence {
                supervisor: self.supervisor.clone(),
                job,
                at,
                running: self.running.clone(),
                ready: self.ready.clone(),
                shutdown: self.shutdown.clone(),
                tracker: self.tracker.clone(),
            };
            self.tracker.spawn(occurrence.run());
        }
    }
}

/// The order in which this node tries jobs due at the same instant: a hash
/// of node and job, so that each node starts with different jobs. In the
/// same order on every node, all nodes would queue on the first job's row
/// lock, then on the second's; spread out, most nodes find a job already
/// taken and lose at once without waiting for the winner's commit.
fn rank(node: &str, job: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (node, job).hash(&mut h);
    h.finish()
}

/// One scheduled occurrence on this node: compete, and run if we win.
struct Occurrence {
    supervisor: Supervisor,
    job: Arc<Job>,
    at: DateTime<Utc>,
    running: Arc<Mutex<HashSet<String>>>,
    ready: Arc<OnceCell<()>>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

/// Removes a resource from the node's running set when the run ends.
struct RunningGuard {
    running: Arc<Mutex<HashSet<String>>>,
    resource: String,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        if let Ok(mut r) = self.running.lock() {
            r.remove(&self.resource);
        }
    }
}

impl Occurrence {
    /// Lets an acquire this occurrence no longer waits for (given up, or the
    /// daemon is stopping) finish in the background, bounded by the store's
    /// own time limit. Should it still win, the lease is given back at once,
    /// and the occurrence with it: kept, the lease would block the job's
    /// next instants on every node until it expired with no job running
    /// under it, and the instant would count as taken although it ran
    /// nowhere.
    fn release_if_won(
        &self,
        attempt: impl Future<Output = Result<AcquireOutcome, store::StoreError>> + Send + 'static,
    ) {
        let (store, job) = (self.supervisor.store().clone(), self.job.clone());
        let node = self.supervisor.node().to_string();
        let at = self.at;
        self.tracker.spawn(async move {
            if let Ok(AcquireOutcome::Acquired(lease)) = attempt.await {
                events::lease_acquired(Some(job.name.as_str()), &lease, &node);
                fence::taken_over(&store, Some(job.name.as_str()), &lease, &node);
                give_back_unused(store.as_ref(), &job, &lease, at).await;
            }
        });
    }

    async fn run(self) {
        let job = &self.job;
        let name = job.name.as_str();
        let at = rfc3339(self.at);
        let resource = job.resource.to_string();
        {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            if !running.insert(resource.clone()) {
                // Known locally; no need to ask the store.
                events::occurrence_skipped(
                    name,
                    &at,
                    "held",
                    "an earlier occurrence of this job is still being acquired or run on this node",
                );
                return;
            }
        }
        let _guard = RunningGuard {
            running: self.running.clone(),
            resource,
        };

        // One owner id for every attempt at this occurrence on this node: an
        // attempt that timed out here may still have won in the store, and
        // the next attempt then adopts that win instead of finding its own
        // occurrence taken (see `AcquireRequest::owner_id`).
        let owner_id = store::fresh_owner();
        let mut unanswered = false;
        let ran = self.compete(owner_id, &mut unanswered).await;
        if !ran && unanswered {
            self.sweep(owner_id);
        }
    }

    /// After an occurrence that did not run here while an attempt went
    /// unanswered: should that attempt's statement have committed after all
    /// (a ghost owner: the lease held with nothing under it, the instant
    /// counted as taken), gives the win back with its occurrence, so the
    /// lease is free and another node still trying the instant can run it.
    /// Tried 1 s and a store call's time limit after the occurrence ended
    /// (statements in flight by then have mostly landed or failed), and
    /// once more shortly before the job's next instant when a ghost's lease
    /// could still block it (the store refuses this occurrence after that
    /// instant, [`AcquireOutcome::Superseded`]). At shutdown, tried at once.
    fn sweep(&self, owner_id: uuid::Uuid) {
        let (store, job) = (self.supervisor.store().clone(), self.job.clone());
        let node = self.supervisor.node().to_string();
        let (at, shutdown) = (self.at, self.shutdown.clone());
        // Soon, once a call's time limit later, and shortly before the next
        // instant if the lease a ghost took could still be held then.
        let now = Instant::now();
        let mut times = vec![now + Duration::from_secs(1), now + CALL_TIMEOUT];
        if let Some(next) = job.schedule.next_after(at) {
            let before_next = (next - Utc::now() - chrono::Duration::seconds(1)).to_std();
            if let Ok(d) = before_next {
                if d > Duration::from_secs(1) && d < job.timing.lease {
                    times.push(now + d);
                }
            }
        }
        times.sort();
        self.tracker.spawn(async move {
            let name = job.name.as_str();
            let owner = owner_id.to_string();
            for when in times {
                tokio::select! {
                    _ = tokio::time::sleep_until(when) => {}
                    _ = shutdown.cancelled() => {}
                }
                match store
                    .give_back(&job.resource, &owner, None, StoreTime::from_utc(at))
                    .await
                {
                    Ok(store::ReleaseOutcome::Released) => {
                        events::occurrence_given_back(name, &rfc3339(at), &owner, &node);
                        return;
                    }
                    Ok(store::ReleaseOutcome::Refused(_)) => {}
                    Err(e) => {
                        events::store_unavailable("give_back", Some(name), &e.to_string(), None)
                    }
                }
                if shutdown.is_cancelled() {
                    return;
                }
            }
        });
    }

    /// Competes for the occurrence until it runs here, is decided elsewhere
    /// or is given up. Returns whether it ran (or was given back) here;
    /// `unanswered` is set when an attempt ended without an answer, so its
    /// statement may still win in the store.
    async fn compete(&self, owner_id: uuid::Uuid, unanswered: &mut bool) -> bool {
        let job = &self.job;
        let name = job.name.as_str();
        let at = rfc3339(self.at);
        // Retry a failing store until the occurrence is no longer worth
        // starting: the next occurrence is due or a lease length has passed.
        let mut give_up =
            self.at + chrono::Duration::from_std(job.timing.lease).unwrap_or_default();
        if let Some(next) = job.schedule.next_after(self.at) {
            give_up = give_up.min(next);
        }
        let store = self.supervisor.store().clone();
        let next = job.schedule.next_after(self.at);
        let mut delay = Duration::from_millis(100);
        loop {
            // Every attempt, including one that hangs on a stalled store or
            // a starved pool, is given up at `give_up`: an occurrence that
            // started that late would hold up the next one, which this node
            // then skips locally.
            let sent_wall = Utc::now();
            let give_up_in = (give_up - sent_wall).to_std().unwrap_or(Duration::ZERO);
            let sent = Instant::now();
            let mut attempt = Box::pin(acquire_attempt(
                store.clone(),
                self.ready.clone(),
                job.clone(),
                self.supervisor.node().to_string(),
                owner_id,
                (self.at, next),
            ));
            let outcome = tokio::select! {
                r = &mut attempt => r,
                _ = tokio::time::sleep_until(sent + give_up_in) => {
                    let detail = format!(
                        "the store did not answer before {}, when the occurrence was no longer worth starting",
                        rfc3339(give_up)
                    );
                    events::store_unavailable("acquire", Some(name), &detail, None);
                    events::occurrence_skipped(name, &at, "store_unavailable", &detail);
                    // Should the store time this call out, its statement may
                    // still commit later, out of `release_if_won`'s sight.
                    *unanswered = true;
                    self.release_if_won(attempt);
                    return false;
                }
                _ = self.shutdown.cancelled() => {
                    self.release_if_won(attempt);
                    return false;
                }
            };
            match outcome {
                Ok(AcquireOutcome::Acquired(lease)) => {
                    events::lease_acquired(Some(name), &lease, self.supervisor.node());
                    fence::taken_over(&store, Some(name), &lease, self.supervisor.node());
                    let spec = spec_for(job, self.at);
                    match self
                        .supervisor
                        .run(&spec, lease, sent, self.shutdown.clone())
                        .await
                    {
                        Ok(_) => {}
                        Err(SuperviseError::AcquiredTooLate) => events::occurrence_skipped(
                            name,
                            &at,
                            "acquired_too_late",
                            "the store answered too late to run the job safely within the lease",
                        ),
                        // Already logged as job_spawn_failed.
                        Err(SuperviseError::Spawn { .. }) => {}
                    }
                    return true;
                }
                Ok(AcquireOutcome::Held {
                    owner_id: Some(owner),
                    node,
                    token,
                    ..
                }) => {
                    let detail = format!(
                        "lease held by {owner} on {} with token {token}",
                        node.as_deref().unwrap_or("an unknown node")
                    );
                    events::occurrence_skipped(name, &at, "held", &detail);
                    return false;
                }
                Ok(AcquireOutcome::Held { owner_id: None, .. }) => {
                    // Another node's acquire won while ours waited for the
                    // row (the store could only see the row as it was before
                    // the winner committed): in a fleet that is this very
                    // occurrence, taken elsewhere.
                    events::occurrence_taken(name, &at);
                    return false;
                }
                Ok(AcquireOutcome::OccurrenceTaken { .. }) => {
                    events::occurrence_taken(name, &at);
                    return false;
                }
                Ok(AcquireOutcome::NotYetDue { store_now }) => {
                    // This host's clock runs ahead of the store's: wait until
                    // the store reaches the instant, then compete as usual.
                    let ahead_ms = StoreTime::from_utc(self.at).0 - store_now.0;
                    let ahead = Duration::from_millis(u64::try_from(ahead_ms).unwrap_or(0));
                    if ahead > MAX_CLOCK_AHEAD {
                        events::occurrence_skipped_clock(
                            name,
                            &at,
                            "clock_ahead",
                            ahead_ms,
                            &format!("this host's clock is at least {ahead_ms} ms ahead of the store's; fix its time synchronisation"),
                        );
                        return false;
                    }
                    events::occurrence_early(name, &at, ahead_ms);
                    // The occurrence's deadline moves with the store's
                    // clock, or a host running ahead would never run a job
                    // whose interval is shorter than its offset.
                    give_up += chrono::Duration::from_std(ahead).unwrap_or_default();
                    tokio::select! {
                        _ = tokio::time::sleep(ahead + Duration::from_millis(1)) => {}
                        _ = self.shutdown.cancelled() => return false,
                    }
                }
                Ok(AcquireOutcome::Superseded { store_now }) => {
                    // The job's next instant is already due by the store's
                    // clock, not yet by ours: this host's clock runs behind.
                    // The store wrote nothing; the fleet runs the current
                    // instant. The offset is this host's clock minus the
                    // store's, the local time taken halfway through the call.
                    let answered = Utc::now();
                    if next.is_some_and(|n| answered >= n) {
                        // By our clock too: the answer came too late, not
                        // from a clock that runs behind.
                        events::occurrence_skipped(
                            name,
                            &at,
                            "missed",
                            "the store answered only after the job's next instant was due",
                        );
                        return false;
                    }
                    let local = sent_wall
                        + chrono::Duration::from_std(sent.elapsed() / 2).unwrap_or_default();
                    let offset_ms = StoreTime::from_utc(local).0 - store_now.0;
                    events::occurrence_skipped_clock(
                        name,
                        &at,
                        "clock_behind",
                        offset_ms,
                        &format!(
                            "the store's clock ({store_now}) is past this occurrence's successor; this host's clock is about {} ms behind the store's; fix its time synchronisation",
                            -offset_ms
                        ),
                    );
                    return false;
                }
                Err(e) => {
                    *unanswered = true;
                    if Utc::now() + chrono::Duration::from_std(delay).unwrap_or_default() >= give_up
                    {
                        events::store_unavailable("acquire", Some(name), &e.to_string(), None);
                        events::occurrence_skipped(name, &at, "store_unavailable", &e.to_string());
                        return false;
                    }
                    events::store_unavailable("acquire", Some(name), &e.to_string(), Some(delay));
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = self.shutdown.cancelled() => return false,
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// One acquisition of `job`'s lease for the occurrence at `at`, migrations
/// first if they have not been applied yet. Owns what it uses, so that an
/// attempt given up by its occurrence can finish on its own.
async fn acquire_attempt(
    store: Arc<dyn Store>,
    ready: Arc<OnceCell<()>>,
    job: Arc<Job>,
    node: String,
    owner_id: uuid::Uuid,
    (at, next): (DateTime<Utc>, Option<DateTime<Utc>>),
) -> Result<AcquireOutcome, store::StoreError> {
    ensure_ready(&ready, store.as_ref()).await?;
    store
        .acquire(&AcquireRequest {
            resource: &job.resource,
            lease: job.timing.lease,
            node: &node,
            owner_id,
            occurrence: Some(StoreTime::from_utc(at)),
            next_occurrence: next.map(StoreTime::from_utc),
        })
        .await
}

/// Gives back a lease that was won too late to be used, and its occurrence
/// with it (see [`Store::give_back`]).
async fn give_back_unused(store: &dyn Store, job: &Job, lease: &store::Lease, at: DateTime<Utc>) {
    match store
        .give_back(
            &job.resource,
            &lease.owner_id.to_string(),
            Some(lease.token),
            StoreTime::from_utc(at),
        )
        .await
    {
        Ok(store::ReleaseOutcome::Released) => {
            events::lease_released(Some(job.name.as_str()), lease)
        }
        // Not ours any more (expired meanwhile): nothing to give back.
        Ok(store::ReleaseOutcome::Refused(_)) => {}
        Err(e) => {
            events::store_unavailable("release", Some(job.name.as_str()), &e.to_string(), None)
        }
    }
}

/// The supervisor's view of a job occurrence.
fn spec_for(job: &Job, at: DateTime<Utc>) -> RunSpec {
    RunSpec {
        job: job.name.to_string(),
        resource: job.resource.clone(),
        command: job.command.clone(),
        env: job.env.clone(),
        workdir: job.workdir.clone(),
        timing: job.timing,
        timeout: job.timeout,
        stale_exit_code: job.stale_exit_code,
        scheduled_at: Some(at),
        inherit_stdio: false,
    }
}

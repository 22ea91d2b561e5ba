//! The occurrence policy on tokio's paused clock: one occurrence of a job
//! against the in-memory store with injected faults and clock offsets, the
//! job a fake that runs for 2 s. Times are exact, measured from the
//! instant (the occurrence fires at its instant). Every occurrence enters
//! as in production, through its instant's batch claim (`claim::claim`):
//! the store claims, a job with no row yet included (the claim creates it);
//! tests of the single acquire make the claim answer `Ask` ([`Rig::asks`]).
//!
//! The job fires every minute with a 10 s lease: an occurrence is given up
//! 10 s after its instant (a lease length; the next instant is 60 s away).

mod acquire;
mod assign;
mod capacity;
mod claim;
mod daemon;
mod drain;
mod runs;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::claim::claim;
use super::occurrence::{Capacity, Ending, Occurrence};
use super::Shared;
use crate::clock::Clock;
use crate::config::{Job, Overlap};
use crate::domain::TriggerState;
use crate::events::SkipReason;
use crate::names::Name;
use crate::schedule::Schedule;
use crate::store::{
    prelude::*, AcquireOutcome, AcquireRequest, OwnerId, PauseInfo, Refusal, RenewOutcome,
    RunStart, StartedBy, StoreTime, Token, TriggerInfo,
};
use crate::supervise::{LeaseTiming, Supervisor};
use crate::testing::epoch_wall;
use crate::testing::job::{FakeLauncher, Script};
use crate::testing::store::{Commit, Fault, Gate, MemoryStore, Op};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Longer than any test needs; a policy that never ends fails instead of
/// hanging (paused time races through it).
const LIMIT: Duration = Duration::from_secs(3_600);

struct Rig {
    store: MemoryStore,
    launcher: Arc<FakeLauncher>,
    shared: Shared,
    job: Arc<Job>,
    t0: Instant,
}

impl Rig {
    fn new() -> Rig {
        Rig::with_store(|s| s)
    }

    fn with_store(adjust: impl FnOnce(MemoryStore) -> MemoryStore) -> Rig {
        Rig::with(
            Script {
                runs_for: Some(ms(2_000)),
                ..Script::default()
            },
            adjust,
        )
    }

    fn with(script: Script, adjust: impl FnOnce(MemoryStore) -> MemoryStore) -> Rig {
        let clock = Clock::following_tokio(epoch_wall());
        let store = adjust(MemoryStore::new(clock));
        let launcher = FakeLauncher::new(script);
        let supervisor =
            Supervisor::with_launcher(Arc::new(store.clone()), "node-a".into(), launcher.clone());
        let shared = Shared {
            supervisor,
            running: Default::default(),
            capacity: Default::default(),
            ready: Arc::new(OnceCell::new()),
            shutdown: CancellationToken::new(),
            draining: CancellationToken::new(),
            tracker: TaskTracker::new(),
            clock,
            watchdog: None,
            hook_env: Default::default(),
            history: Default::default(),
            sweeper: Default::default(),
            metrics: true,
            views: Default::default(),
        };
        let job = Job {
            name: Name::parse("job", "job").unwrap(),
            schedule: Schedule::parse("0 * * * * *", chrono_tz::UTC).unwrap(),
            command: vec!["true".into()],
            resource: Name::parse("resource", "job").unwrap(),
            timeout: None,
            env: Default::default(),
            workdir: None,
            timing: LeaseTiming::new(ms(10_000), None, None).unwrap(),
            stale_exit_code: None,
            starting_deadline: None,
            retry: Default::default(),
            catchup: Default::default(),
            overlap: Default::default(),
            on_failure: None,
            place: Default::default(),
        };
        Rig {
            store,
            launcher,
            shared,
            job: Arc::new(job),
            t0: Instant::now(),
        }
    }

    /// Runs the occurrence at the instant `epoch_wall()`, which is now,
    /// through its claim, as the scheduler does.
    async fn run(&self) -> Ending {
        let occurrence = Occurrence {
            shared: self.shared.clone(),
            job: self.job.clone(),
            at: epoch_wall(),
        };
        let endings = tokio::time::timeout(LIMIT, claim(self.shared.clone(), vec![occurrence]))
            .await
            .expect("the occurrence ends");
        assert_eq!(endings.len(), 1, "one ending per occurrence");
        endings[0]
    }

    /// The next claim decides nothing (`Ask` for every item, as PostgreSQL
    /// answers for a new row another node created meanwhile): the
    /// occurrence goes to the single acquire, which the test exercises.
    fn asks(&self) {
        self.store.fault(Op::Claim, Fault::Ask, 1);
    }

    /// Waits for the background work the occurrence left (abandoned
    /// attempts, sweeps).
    async fn settle(&self) {
        self.shared.tracker.close();
        tokio::time::timeout(LIMIT, self.shared.tracker.wait())
            .await
            .expect("background work ends");
    }

    /// What the store did for `op`, as (time since the instant, what).
    fn log(&self, op: Op) -> Vec<(Duration, String)> {
        self.store
            .entries(op)
            .into_iter()
            .map(|e| (e.at - self.t0, e.what))
            .collect()
    }

    /// When each job started (since the instant), with its token.
    fn runs(&self) -> Vec<(Duration, i64)> {
        self.launcher
            .started()
            .iter()
            .map(|j| (j.started() - self.t0, j.token.get()))
            .collect()
    }

    /// Acquires the job's lease as another node, for `occurrence`.
    async fn acquire_elsewhere(&self, occurrence: Option<StoreTime>) -> AcquireOutcome {
        self.store
            .acquire(&AcquireRequest {
                resource: &self.job.resource,
                lease: self.job.timing.lease,
                node: "node-b",
                owner_id: OwnerId::fresh(),
                occurrence,
                next_occurrence: None,
                run: None,
            })
            .await
            .unwrap()
    }
}

fn at() -> StoreTime {
    StoreTime::from_utc(epoch_wall())
}

fn log(entries: &[(u64, &str)]) -> Vec<(Duration, String)> {
    entries
        .iter()
        .map(|(t, w)| (ms(*t), w.to_string()))
        .collect()
}

/// A job of the rig's kind named `name`, firing on `schedule`.
fn job_on(rig: &Rig, name: &str, schedule: &str) -> Job {
    Job {
        name: Name::parse("job", name).unwrap(),
        resource: Name::parse("resource", name).unwrap(),
        schedule: Schedule::parse(schedule, chrono_tz::UTC).unwrap(),
        ..(*rig.job).clone()
    }
}

/// Starts the whole daemon in-process on the rig's store with `jobs` and `node.shutdown_grace = grace`.
fn start_daemon(
    rig: &Rig,
    jobs: Vec<Job>,
    grace: Duration,
) -> (
    tokio::sync::mpsc::Sender<super::Control>,
    tokio::task::JoinHandle<()>,
) {
    let settings = super::Settings {
        node: crate::domain::NodeId::parse("node-a").unwrap(),
        max_running: None,
        jobs: jobs.into_iter().map(Arc::new).collect(),
        store: Arc::new(rig.store.clone()),
        child_env: Default::default(),
        records: None,
        store_display: "memory".into(),
        store_scope: "host",
        config_display: "none".into(),
        watchdog: None,
        history: Default::default(),
        shutdown_grace: grace,
        metrics: true,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let daemon = tokio::spawn(super::serve(
        settings,
        rx,
        rig.shared.supervisor.clone(),
        rig.shared.clock,
    ));
    (tx, daemon)
}

/// Waits for the daemon to return; how long after the rig's start it did.
async fn stopped(rig: &Rig, daemon: tokio::task::JoinHandle<()>) -> Duration {
    tokio::time::timeout(LIMIT, daemon)
        .await
        .expect("the daemon stops")
        .unwrap();
    Instant::now() - rig.t0
}

/// When each job started (since the instant), by resource, with its token.
fn started(rig: &Rig) -> Vec<(Duration, String, i64)> {
    let mut v: Vec<_> = rig
        .launcher
        .started()
        .iter()
        .map(|j| (j.started() - rig.t0, j.resource.clone(), j.token.get()))
        .collect();
    v.sort();
    v
}

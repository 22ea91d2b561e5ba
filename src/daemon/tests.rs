//! The occurrence policy on tokio's paused clock: one occurrence of a job
//! against the in-memory store with injected faults and clock offsets, the
//! job a fake that runs for 2 s. Times are exact, measured from the
//! instant (the occurrence fires at its instant). Every occurrence enters
//! as in production, through its instant's batch claim (`claim::claim`):
//! the store claims; where it has no row for the job yet, the claim leaves
//! the occurrence to the single acquire.
//!
//! The job fires every minute with a 10 s lease: an occurrence is given up
//! 10 s after its instant (a lease length; the next instant is 60 s away).

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
use crate::events::SkipReason;
use crate::names::Name;
use crate::schedule::Schedule;
use crate::store::{
    trigger_state, AcquireOutcome, AcquireRequest, OwnerId, PauseInfo, Refusal, RenewOutcome,
    RunStart, StartedBy, Store, StoreTime, TriggerInfo,
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
            .map(|j| (j.started() - self.t0, j.token))
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

#[tokio::test(start_paused = true)]
async fn an_acquire_that_fails_then_succeeds_runs_the_job() {
    let rig = Rig::new();
    rig.store.fault(Op::Acquire, Fault::Fail, 2);
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    // Backoff 100 ms, then 200 ms.
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[(0, "failed"), (100, "failed"), (300, "acquired 1")])
    );
    assert_eq!(rig.runs(), [(ms(300), 1)]);
    assert_eq!(rig.log(Op::Release), log(&[(2_300, "released 1")]));
    assert!(rig.log(Op::GiveBack).is_empty(), "nothing to sweep");
}

#[tokio::test(start_paused = true)]
async fn a_failing_store_is_retried_with_backoff_until_the_give_up_time() {
    let rig = Rig::new();
    rig.store.fault(Op::Acquire, Fault::Fail, 100);
    assert_eq!(
        rig.run().await,
        Ending::Skipped(SkipReason::StoreUnavailable)
    );
    let times: Vec<_> = rig.log(Op::Acquire).into_iter().map(|(t, _)| t).collect();
    // 100, 200, 400, 800, 1600, 3200 ms; the next wait (5 s) would end
    // past the give-up time (10 s), so the occurrence is skipped at once.
    assert_eq!(
        times,
        [0, 100, 300, 700, 1_500, 3_100, 6_300].map(ms),
        "attempts"
    );
    assert!(rig.runs().is_empty());
    rig.settle().await;
}

/// `starting_deadline`: an occurrence fired after it (this daemon was
/// paused) is skipped without asking the store; one whose store fails past
/// it is skipped with `deadline` there instead of at the next instant.
#[tokio::test(start_paused = true)]
async fn a_starting_deadline_bounds_when_an_occurrence_may_start() {
    let mut rig = Rig::new();
    Arc::make_mut(&mut rig.job).starting_deadline = Some(ms(1_000));
    tokio::time::sleep(ms(1_500)).await;
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Deadline));
    assert!(rig.log(Op::Acquire).is_empty(), "no store call");

    let mut rig = Rig::new();
    Arc::make_mut(&mut rig.job).starting_deadline = Some(ms(1_000));
    rig.store.fault(Op::Acquire, Fault::Fail, 100);
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Deadline));
    let times: Vec<_> = rig.log(Op::Acquire).into_iter().map(|(t, _)| t).collect();
    // 100, 200, 400 ms; the next wait (800 ms) would end past the deadline.
    assert_eq!(times, [0, 100, 300, 700].map(ms), "attempts");
    assert!(rig.runs().is_empty());
    rig.settle().await;
}

/// The first attempt commits in the store, but its answer is lost: the
/// caller times out after 5 s. The retry, with the same owner id, adopts
/// that win instead of finding its own occurrence taken.
#[tokio::test(start_paused = true)]
async fn a_timed_out_acquire_that_committed_is_adopted_by_the_retry() {
    let rig = Rig::new();
    rig.store
        .fault(Op::Acquire, Fault::Hang(Gate::new(), Commit::Before), 1);
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[
            (0, "acquired 1"),
            (0, "hung"),
            (5_000, "timed_out"),
            (5_100, "adopted 1"),
        ])
    );
    assert_eq!(rig.runs(), [(ms(5_100), 1)]);
    let job = &rig.launcher.started()[0];
    assert_eq!(
        job.owner_id.to_string(),
        rig.store.row("job").unwrap().owner_id,
        "the job runs as the owner the store recorded"
    );
    assert_eq!(rig.log(Op::Release), log(&[(7_100, "released 1")]));
}

/// The store holds the statement past the give-up time (10 s) and then
/// commits it (at 20 s, still before the next instant), answering the
/// abandoned attempt: the win goes back with its occurrence, which another
/// node can then still take.
#[tokio::test(start_paused = true)]
async fn a_win_after_the_occurrence_was_abandoned_is_given_back_with_it() {
    let rig = Rig::with_store(|s| s.with_call_timeout(None));
    let gate = Gate::new();
    rig.store
        .fault(Op::Acquire, Fault::Hang(gate.clone(), Commit::After), 1);
    tokio::spawn(async move {
        tokio::time::sleep(ms(20_000)).await;
        gate.open();
    });
    assert_eq!(
        rig.run().await,
        Ending::Skipped(SkipReason::StoreUnavailable)
    );
    assert_eq!(Instant::now() - rig.t0, ms(10_000), "given up at 10 s");
    rig.settle().await;
    assert!(rig.runs().is_empty(), "the job never ran");
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[(0, "hung"), (20_000, "acquired 1")])
    );
    // The sweep (1 s and 5 s after giving up) found nothing yet; the
    // abandoned attempt's own answer gives the win back.
    assert_eq!(
        rig.log(Op::GiveBack),
        log(&[
            (11_000, "refused"),
            (15_000, "refused"),
            (20_000, "given_back 1")
        ])
    );
    let row = rig.store.row("job").unwrap();
    assert!(row.released);
    assert_eq!(row.last_occurrence, Some(at().0 - 1));
    assert!(matches!(
        rig.acquire_elsewhere(Some(at())).await,
        AcquireOutcome::Acquired(l) if l.token == 2
    ));
}

/// Every attempt hangs and times out unanswered (5 s each), and both
/// statements commit later (at 10.5 s, the second adopting the first's
/// win). Nobody saw those answers: the sweep, 1 s after the occurrence
/// ended, finds the win by its owner id and gives it back.
#[tokio::test(start_paused = true)]
async fn a_win_nobody_saw_is_swept_back() {
    let rig = Rig::new();
    let gate = Gate::new();
    rig.store
        .fault(Op::Acquire, Fault::Hang(gate.clone(), Commit::After), 2);
    tokio::spawn(async move {
        tokio::time::sleep(ms(10_500)).await;
        gate.open();
    });
    assert_eq!(
        rig.run().await,
        Ending::Skipped(SkipReason::StoreUnavailable)
    );
    rig.settle().await;
    assert!(rig.runs().is_empty());
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[
            (0, "hung"),
            (5_000, "timed_out"),
            (5_100, "hung"),
            (10_100, "timed_out"),
            (10_500, "acquired 1"),
            (10_500, "adopted 1"),
        ])
    );
    assert_eq!(rig.log(Op::GiveBack), log(&[(11_000, "given_back")]));
    let row = rig.store.row("job").unwrap();
    assert!(row.released);
    assert_eq!(row.last_occurrence, Some(at().0 - 1));
}

/// SIGTERM while an acquire hangs: the occurrence stops at once, and the
/// win that arrives later goes back, without the job ever starting.
#[tokio::test(start_paused = true)]
async fn shutdown_mid_acquire_gives_a_late_win_back() {
    let rig = Rig::new();
    let gate = Gate::new();
    rig.store
        .fault(Op::Acquire, Fault::Hang(gate.clone(), Commit::After), 1);
    let shutdown = rig.shared.shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(1_000)).await;
        shutdown.cancel();
        tokio::time::sleep(ms(1_000)).await;
        gate.open();
    });
    assert_eq!(rig.run().await, Ending::Stopped);
    assert_eq!(Instant::now() - rig.t0, ms(1_000));
    rig.settle().await;
    assert!(rig.runs().is_empty());
    assert_eq!(rig.log(Op::GiveBack), log(&[(2_000, "given_back 1")]));
    assert!(rig.store.row("job").unwrap().released);
}

/// This host's clock runs 10 s ahead of the store's: the store refuses the
/// instant as not yet due, and the occurrence waits for the store's clock
/// to reach it, then runs.
#[tokio::test(start_paused = true)]
async fn a_clock_ahead_of_the_store_waits_for_it() {
    let rig = Rig::new();
    rig.store.set_offset_ms(-10_000);
    assert_eq!(rig.run().await, Ending::Won);
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[(0, "not_yet_due"), (10_001, "acquired 1")])
    );
    assert_eq!(rig.runs(), [(ms(10_001), 1)]);
    rig.settle().await;
}

#[tokio::test(start_paused = true)]
async fn a_clock_more_than_a_minute_ahead_skips() {
    let rig = Rig::new();
    rig.store.set_offset_ms(-61_000);
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::ClockAhead));
    rig.settle().await;
    assert_eq!(rig.log(Op::Acquire), log(&[(0, "not_yet_due")]));
    assert!(rig.runs().is_empty());
    assert!(rig.log(Op::GiveBack).is_empty(), "nothing to sweep");
}

/// This host's clock runs behind: by the store's clock the job's next
/// instant is already due, so this one is over for the fleet.
#[tokio::test(start_paused = true)]
async fn a_clock_behind_the_store_skips_a_superseded_instant() {
    let rig = Rig::new();
    rig.store.set_offset_ms(61_000);
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::ClockBehind));
    assert_eq!(rig.log(Op::Acquire), log(&[(0, "superseded")]));
    assert!(rig.store.row("job").is_none(), "nothing written");
    assert!(rig.runs().is_empty());
}

/// A statement the store holds until after the job's next instant is due
/// (by the store's clock) wins nothing: the store refuses it as superseded.
#[tokio::test(start_paused = true)]
async fn a_statement_delivered_after_the_next_instant_wins_nothing() {
    let rig = Rig::with_store(|s| s.with_call_timeout(None));
    let gate = Gate::new();
    rig.store
        .fault(Op::Acquire, Fault::Hang(gate.clone(), Commit::After), 1);
    // The statement waits past the next instant (60 s) but the occurrence
    // waits for it only until 10 s: skipped as store_unavailable.
    tokio::spawn(async move {
        tokio::time::sleep(ms(61_000)).await;
        gate.open();
    });
    assert_eq!(
        rig.run().await,
        Ending::Skipped(SkipReason::StoreUnavailable)
    );
    rig.settle().await;
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[(0, "hung"), (61_000, "superseded")]),
        "a statement delivered after the next instant wins nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_in_progress_on_this_node_skips_without_asking_the_store() {
    let rig = Rig::new();
    let _running = rig.shared.running.enter("job", false).unwrap();
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Held));
    assert!(rig.log(Op::Acquire).is_empty());
}

/// `overlap = "replace"`: a lease held for an earlier instant is ended and
/// taken over with the next token, and its owner's renewal is refused from
/// then on; with the default `skip` the same lease makes the instant skip.
#[tokio::test(start_paused = true)]
async fn replace_takes_over_a_lease_held_for_an_earlier_instant() {
    for overlap in [Overlap::Skip, Overlap::Replace] {
        let mut rig = Rig::new();
        Arc::get_mut(&mut rig.job).unwrap().overlap = overlap;
        let earlier = StoreTime(at().0 - 60_000);
        let AcquireOutcome::Acquired(old) = rig.acquire_elsewhere(Some(earlier)).await else {
            panic!("acquire elsewhere");
        };
        let ending = rig.run().await;
        let renewed = rig
            .store
            .renew(
                &rig.job.resource,
                old.owner_id,
                old.token,
                rig.job.timing.lease,
            )
            .await
            .unwrap();
        if overlap == Overlap::Skip {
            assert_eq!(ending, Ending::Skipped(SkipReason::Held));
            assert!(rig.log(Op::Preempt).is_empty());
            assert!(
                matches!(renewed, RenewOutcome::Renewed { .. }),
                "{renewed:?}"
            );
            continue;
        }
        assert_eq!(ending, Ending::Won);
        assert_eq!(
            rig.log(Op::Preempt),
            log(&[(0, &format!("preempted {}", old.token))])
        );
        assert_eq!(rig.runs(), [(ms(0), old.token + 1)], "the next token");
        assert!(
            matches!(renewed, RenewOutcome::Refused(Refusal::NotOwner { current_token, .. }) if current_token == old.token + 1),
            "the replaced owner is refused: {renewed:?}"
        );
    }
}

/// `overlap = "replace"` never takes an instant from the node that won it:
/// a lease held for this very instant is the instant taken.
#[tokio::test(start_paused = true)]
async fn replace_leaves_a_lease_held_for_the_same_instant() {
    let mut rig = Rig::new();
    Arc::get_mut(&mut rig.job).unwrap().overlap = Overlap::Replace;
    let AcquireOutcome::Acquired(_) = rig.acquire_elsewhere(Some(at())).await else {
        panic!("acquire elsewhere");
    };
    assert_eq!(rig.run().await, Ending::Taken);
    assert!(rig.log(Op::Preempt).is_empty());
    assert!(rig.runs().is_empty());
}

/// On the node of the run it replaces, a `replace` instant does not skip
/// locally: it competes (and the store ends the earlier run's lease).
#[tokio::test(start_paused = true)]
async fn replace_competes_while_this_node_runs_the_job() {
    let mut rig = Rig::new();
    Arc::get_mut(&mut rig.job).unwrap().overlap = Overlap::Replace;
    let running = rig.shared.running.enter("job", false).unwrap();
    assert_eq!(rig.run().await, Ending::Won);
    assert_eq!(rig.log(Op::Acquire), log(&[(0, "acquired 1")]));
    drop(running);
    assert_eq!(rig.shared.running.len(), 0, "both left the running set");
}

#[tokio::test(start_paused = true)]
async fn a_lease_held_elsewhere_skips_and_a_taken_instant_is_taken() {
    let rig = Rig::new();
    let AcquireOutcome::Acquired(other) = rig.acquire_elsewhere(None).await else {
        panic!("acquire elsewhere");
    };
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Held));
    rig.store
        .release(&rig.job.resource, other.owner_id, other.token)
        .await
        .unwrap();

    let rig = Rig::new();
    let AcquireOutcome::Acquired(other) = rig.acquire_elsewhere(Some(at())).await else {
        panic!("acquire elsewhere");
    };
    rig.store
        .release(&rig.job.resource, other.owner_id, other.token)
        .await
        .unwrap();
    assert_eq!(rig.run().await, Ending::Taken);
    assert!(rig.runs().is_empty());
}

/// The whole daemon in-process: plain settings and a control stream, no
/// command line, no signals. Jobs every 10 s run at their instants; a
/// reload adds a job; a stop terminates the runs in progress (which take
/// 500 ms to end) and returns only once their leases are released.
#[tokio::test(start_paused = true)]
async fn the_daemon_runs_in_process_from_settings_and_a_control_stream() {
    let rig = Rig::with(
        Script {
            runs_for: Some(ms(2_000)),
            term_takes: Some(ms(500)),
            ..Script::default()
        },
        |s| s,
    );
    let every_10s = |name: &str| Job {
        name: Name::parse("job", name).unwrap(),
        resource: Name::parse("resource", name).unwrap(),
        schedule: Schedule::parse("*/10 * * * * *", chrono_tz::UTC).unwrap(),
        ..(*rig.job).clone()
    };
    let settings = super::Settings {
        node: "node-a".into(),
        max_running: None,
        jobs: vec![every_10s("a")],
        store: Arc::new(rig.store.clone()),
        child_env: Default::default(),
        records: None,
        store_display: "memory".into(),
        store_scope: "host",
        config_display: "none".into(),
        watchdog: None,
        history: Default::default(),
        shutdown_grace: Duration::ZERO,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let daemon = tokio::spawn(super::serve(
        settings,
        rx,
        rig.shared.supervisor.clone(),
        rig.shared.clock,
    ));
    tokio::time::sleep(ms(25_000)).await;
    tx.send(super::Control::Reload(Ok(vec![
        every_10s("a"),
        every_10s("b"),
    ])))
    .await
    .unwrap();
    // 31 s: "a" and "b" of 30 s are running (2 s each).
    tokio::time::sleep(ms(6_000)).await;
    tx.send(super::Control::Stop("test")).await.unwrap();
    tokio::time::timeout(LIMIT, daemon)
        .await
        .expect("the daemon stops")
        .unwrap();
    let stopped_at = Instant::now() - rig.t0;

    let mut runs: Vec<_> = rig
        .launcher
        .started()
        .iter()
        .map(|j| (j.started() - rig.t0, j.resource.clone(), j.token))
        .collect();
    runs.sort();
    assert_eq!(
        runs,
        [
            (ms(10_000), "a".to_string(), 1),
            (ms(20_000), "a".to_string(), 2),
            (ms(30_000), "a".to_string(), 3),
            (ms(30_000), "b".to_string(), 1),
        ]
    );
    // The runs of 30 s got SIGTERM at the stop (31 s) and ended 500 ms
    // later; the daemon returned after releasing both leases.
    for job in &rig.launcher.started()[2..] {
        assert_eq!(job.signals().len(), 1, "{:?}", job.signals());
        assert_eq!(job.signals()[0].0 - rig.t0, ms(31_000));
    }
    assert_eq!(stopped_at, ms(31_500));
    for resource in ["a", "b"] {
        assert!(rig.store.row(resource).unwrap().released, "{resource}");
    }
    assert_eq!(rig.store.history(Op::Release).len(), 4);
}

/// At start-up the daemon retries migrations with back-off (1 s, 2 s, 4 s,
/// … up to 30 s) until the store answers, and gives up waiting at a stop.
#[tokio::test(start_paused = true)]
async fn the_store_is_retried_with_back_off_until_it_answers() {
    let store = MemoryStore::new(Clock::following_tokio(epoch_wall()));
    store.fault(Op::Migrate, Fault::Fail, 3);
    let ready = OnceCell::new();
    let t0 = Instant::now();
    super::await_store(&ready, &store, &CancellationToken::new()).await;
    assert!(ready.initialized());
    assert_eq!(
        Instant::now() - t0,
        ms(7_000),
        "the fourth attempt answered"
    );
    let failures: Vec<Duration> = store
        .entries(Op::Migrate)
        .iter()
        .map(|e| e.at - t0)
        .collect();
    assert_eq!(failures, [ms(0), ms(1_000), ms(3_000)]);

    // A store that never answers: the wait ends with the stop.
    let store = MemoryStore::new(Clock::following_tokio(epoch_wall()));
    store.fault(Op::Migrate, Fault::Fail, 100);
    let ready = OnceCell::new();
    let stop = CancellationToken::new();
    let waiting = super::await_store(&ready, &store, &stop);
    let stopper = async {
        tokio::time::sleep(ms(100_000)).await;
        stop.cancel();
    };
    tokio::join!(waiting, stopper);
    assert!(!ready.initialized());
    let gaps: Vec<Duration> = store
        .entries(Op::Migrate)
        .windows(2)
        .map(|w| w[1].at - w[0].at)
        .collect();
    assert_eq!(&gaps[..6], [1, 2, 4, 8, 16, 30].map(|s| ms(s * 1_000)));
}

/// A run is in the history from its winning acquire on (the same atomic
/// operation) and ends with one `finish_run` before the release: outcome,
/// exit code, duration, and `finished_at` the store's start plus the time
/// since the acquire. A losing acquire records nothing.
#[tokio::test(start_paused = true)]
async fn a_run_is_recorded_by_its_acquire_and_finished_before_its_release() {
    let rig = Rig::with(
        Script {
            runs_for: Some(ms(2_000)),
            exit_code: 3,
            ..Script::default()
        },
        |s| s,
    );
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    let rows = rig.store.run_rows();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let r = &rows[0];
    assert_eq!((r.job.as_str(), r.trigger.as_str()), ("job", "schedule"));
    assert_eq!((r.scheduled_at, r.token), (Some(at()), 1));
    assert_eq!(r.owner_id, rig.launcher.started()[0].owner_id.to_string());
    assert_eq!((r.outcome.as_str(), r.exit_code), ("failed", Some(3)));
    assert_eq!(r.duration_ms, Some(2_000));
    assert_eq!(r.started_at, at());
    assert_eq!(r.finished_at, Some(StoreTime(at().0 + 2_000)));
    assert_eq!(rig.log(Op::FinishRun), log(&[(2_000, "finished 1")]));
    assert_eq!(rig.log(Op::Release), log(&[(2_000, "released 1")]));
    let finished = rig.store.entries(Op::FinishRun)[0].at;
    assert!(finished <= rig.store.entries(Op::Release)[0].at);

    // The run's end and release fail as one call: each is then made on its
    // own, and both happen.
    let rig = Rig::new();
    rig.store.fault(Op::FinishRun, Fault::Fail, 1);
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    assert_eq!(
        rig.log(Op::FinishRun),
        log(&[(2_000, "failed"), (2_000, "finished 1")])
    );
    assert_eq!(rig.log(Op::Release), log(&[(2_000, "released 1")]));
    assert!(rig.store.row("job").unwrap().released);

    // Another node holds the next instant's lease: this node's losing
    // acquire adds no row.
    let rig = Rig::new();
    assert!(matches!(
        rig.acquire_elsewhere(None).await,
        AcquireOutcome::Acquired(_)
    ));
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Held));
    assert!(rig.store.run_rows().is_empty());
}

/// A paused job's instant wins nothing on any node; exactly one node (the
/// first to ask) is told it noted the skip, so the fleet logs it once.
/// Resumed, the same instant runs; a pause `--for` ends by itself.
#[tokio::test(start_paused = true)]
async fn a_paused_job_skips_its_instants_until_resumed_or_its_pause_ends() {
    let rig = Rig::new();
    let pause = PauseInfo {
        job: "job".into(),
        note: Some("maintenance".into()),
        since: at(),
        until: None,
        paused_by: "ops@host".into(),
    };
    assert_eq!(rig.store.pause(&pause, false).await.unwrap(), None);
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Paused));
    let elsewhere = rig
        .store
        .acquire(&AcquireRequest {
            resource: &rig.job.resource,
            lease: rig.job.timing.lease,
            node: "node-b",
            owner_id: OwnerId::fresh(),
            occurrence: Some(at()),
            next_occurrence: None,
            run: Some(RunStart {
                job: "job",
                started_by: StartedBy::Schedule,
                scheduled_at: Some(at()),
            }),
        })
        .await
        .unwrap();
    assert_eq!(
        elsewhere,
        AcquireOutcome::Paused {
            note: Some("maintenance".into()),
            until: None,
            first: false
        }
    );
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[(0, "paused first"), (0, "paused")])
    );
    assert!(rig.runs().is_empty() && rig.store.run_rows().is_empty());
    // A paused instant costs this node its acquire and nothing else.
    for op in [Op::Release, Op::GiveBack, Op::FinishRun, Op::Renew] {
        assert!(rig.log(op).is_empty(), "{op:?}: {:?}", rig.log(op));
    }
    assert!(rig.store.resume("job").await.unwrap());
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;

    let rig = Rig::new();
    let until = StoreTime(at().0 + 3_000);
    rig.store
        .pause(
            &PauseInfo {
                until: Some(until),
                ..pause
            },
            false,
        )
        .await
        .unwrap();
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Paused));
    tokio::time::sleep(ms(3_000)).await;
    assert_eq!(rig.run().await, Ending::Won, "the pause ended at its until");
    rig.settle().await;
    assert_eq!(rig.runs(), [(ms(3_000), 1)]);
}

/// `fencecron trigger`: a pending request is claimed by one daemon and runs
/// the job under a new token, recorded as `manual`; while the job's lease
/// is held elsewhere, the claim ends `refused`, naming the holder.
#[tokio::test(start_paused = true)]
async fn a_trigger_is_claimed_once_and_runs_the_job_as_manual() {
    let rig = Rig::new();
    let request = |id: &str| TriggerInfo {
        id: id.into(),
        job: "job".into(),
        requested_at: at(),
        requested_by: "ops@host".into(),
        state: trigger_state::PENDING.into(),
        node: None,
        token: None,
        detail: None,
    };
    rig.store.request_trigger(&request("t1")).await.unwrap();
    let jobs: HashMap<String, Arc<Job>> = [("job".to_string(), rig.job.clone())].into();
    super::fleet::poll_triggers(rig.shared.clone(), jobs.clone()).await;
    // A second daemon polling now finds nothing pending.
    super::fleet::poll_triggers(rig.shared.clone(), jobs.clone()).await;
    rig.settle().await;
    let t = rig.store.trigger("t1").await.unwrap().unwrap();
    assert_eq!(
        (t.state.as_str(), t.node.as_deref(), t.token),
        (trigger_state::ENDED, Some("node-a"), Some(1))
    );
    assert_eq!(rig.runs(), [(ms(0), 1)]);
    let rows = rig.store.run_rows();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (
            rows[0].trigger.as_str(),
            rows[0].scheduled_at,
            rows[0].outcome.as_str()
        ),
        ("manual", None, "succeeded")
    );

    let rig = Rig::new();
    assert!(matches!(
        rig.acquire_elsewhere(None).await,
        AcquireOutcome::Acquired(_)
    ));
    rig.store.request_trigger(&request("t2")).await.unwrap();
    super::fleet::poll_triggers(rig.shared.clone(), jobs).await;
    rig.settle().await;
    let t = rig.store.trigger("t2").await.unwrap().unwrap();
    assert_eq!(t.state, trigger_state::REFUSED);
    assert!(
        t.detail.as_deref().is_some_and(|d| d.contains("node-b")),
        "{t:?}"
    );
    assert!(rig.runs().is_empty() && rig.store.run_rows().is_empty());
}

/// A manual run follows the job's `retries` like a scheduled one: after
/// the same back-off, fresh acquires with higher tokens, each recorded as
/// `manual`. The trigger follows each attempt's token and says `ended`
/// only once the last attempt's end is recorded: during a back-off it still
/// says `started` under the failed attempt (what `trigger --wait` relies on
/// to wait for the retry).
#[tokio::test(start_paused = true)]
async fn a_failed_manual_run_is_retried_and_its_trigger_ends_with_the_last_attempt() {
    let (events, _guard) = crate::testing::events::Captured::start();
    let mut rig = Rig::with(
        Script {
            runs_for: Some(ms(2_000)),
            exit_code: 3,
            ..Script::default()
        },
        |s| s,
    );
    Arc::make_mut(&mut rig.job).retry = crate::config::Retry {
        retries: 2,
        backoff: ms(1_000),
        backoff_max: ms(60_000),
    };
    rig.store
        .request_trigger(&TriggerInfo {
            id: "t1".into(),
            job: "job".into(),
            requested_at: at(),
            requested_by: "ops@host".into(),
            state: trigger_state::PENDING.into(),
            node: None,
            token: None,
            detail: None,
        })
        .await
        .unwrap();
    let jobs: HashMap<String, Arc<Job>> = [("job".to_string(), rig.job.clone())].into();
    super::fleet::poll_triggers(rig.shared.clone(), jobs).await;
    let trigger = || async { rig.store.trigger("t1").await.unwrap().unwrap() };
    tokio::time::sleep(ms(100)).await;
    let t = trigger().await;
    assert_eq!(
        (t.state.as_str(), t.token, t.detail.as_deref()),
        (trigger_state::STARTED, Some(1), Some("attempt 1 of 3"))
    );
    // The first attempt failed at 2 s; its retry starts at 3 s.
    tokio::time::sleep(ms(2_400)).await;
    let t = trigger().await;
    assert_eq!(
        (t.state.as_str(), t.token),
        (trigger_state::STARTED, Some(1))
    );
    assert_eq!(rig.store.run_rows()[0].outcome, "failed");
    tokio::time::sleep(ms(1_000)).await;
    let t = trigger().await;
    assert_eq!(
        (t.state.as_str(), t.token, t.detail.as_deref()),
        (trigger_state::STARTED, Some(2), Some("attempt 2 of 3"))
    );
    rig.settle().await;
    // Ends at 2 s, 5 s (3 + 2), 9 s (7 + 2).
    assert_eq!(rig.runs(), [(ms(0), 1), (ms(3_000), 2), (ms(7_000), 3)]);
    let rows = rig.store.run_rows();
    let by: Vec<(&str, Option<StoreTime>, &str)> = rows
        .iter()
        .map(|r| (r.trigger.as_str(), r.scheduled_at, r.outcome.as_str()))
        .collect();
    assert_eq!(by, [("manual", None, "failed"); 3]);
    let t = trigger().await;
    assert_eq!((t.state.as_str(), t.token), (trigger_state::ENDED, Some(3)));
    let attempts: Vec<String> = events
        .named("retry_scheduled")
        .iter()
        .map(|e| format!("{} {}", e.get("attempt"), e.get("delay_ms")))
        .collect();
    assert_eq!(attempts, ["1 1000", "2 2000"]);
}

/// The trigger's `ended` is what `trigger --wait` waits for: a store that
/// fails to take it is asked again.
#[tokio::test(start_paused = true)]
async fn a_manual_runs_end_is_settled_again_when_the_store_failed() {
    let rig = Rig::with(
        Script {
            runs_for: Some(ms(2_000)),
            ..Script::default()
        },
        |s| s,
    );
    rig.store
        .request_trigger(&TriggerInfo {
            id: "t1".into(),
            job: "job".into(),
            requested_at: at(),
            requested_by: "ops@host".into(),
            state: trigger_state::PENDING.into(),
            node: None,
            token: None,
            detail: None,
        })
        .await
        .unwrap();
    let jobs: HashMap<String, Arc<Job>> = [("job".to_string(), rig.job.clone())].into();
    super::fleet::poll_triggers(rig.shared.clone(), jobs).await;
    tokio::time::sleep(ms(100)).await;
    let t = rig.store.trigger("t1").await.unwrap().unwrap();
    assert_eq!(t.state, trigger_state::STARTED);
    // The next two fleet calls (the run's end is `FinishRun`): the
    // trigger's end, twice.
    rig.store.fault(Op::Fleet, Fault::Fail, 2);
    rig.settle().await;
    rig.store.heal();
    let t = rig.store.trigger("t1").await.unwrap().unwrap();
    assert_eq!((t.state.as_str(), t.token), (trigger_state::ENDED, Some(1)));
    assert_eq!(rig.store.run_rows()[0].outcome, "succeeded");
}

/// `retries`: a failed run is run again after its back-off (1 s, then 2 s),
/// each time under a fresh acquire with a higher token, recorded as
/// `retry` for the same instant; the next retry would start after the
/// job's next instant and is abandoned.
#[tokio::test(start_paused = true)]
async fn a_failed_run_is_retried_with_backoff_until_the_next_instant() {
    let mut rig = Rig::with(
        Script {
            runs_for: Some(ms(2_000)),
            exit_code: 3,
            ..Script::default()
        },
        |s| s,
    );
    Arc::make_mut(&mut rig.job).retry = crate::config::Retry {
        retries: 5,
        backoff: ms(1_000),
        backoff_max: ms(60_000),
    };
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    // Runs end at 2, 5 (3 + 2), 9 (7 + 2), 15 (13 + 2), 25 (23 + 2) s; the
    // fifth retry would wait 16 s and start at 41 s, before the next
    // instant (60 s): it runs too, ending at 43 s. No sixth.
    assert_eq!(
        rig.runs(),
        [
            (ms(0), 1),
            (ms(3_000), 2),
            (ms(7_000), 3),
            (ms(13_000), 4),
            (ms(23_000), 5),
            (ms(41_000), 6),
        ]
    );
    let rows = rig.store.run_rows();
    let by: Vec<(&str, Option<StoreTime>, i64)> = rows
        .iter()
        .map(|r| (r.trigger.as_str(), r.scheduled_at, r.token))
        .collect();
    assert_eq!(by[0], ("schedule", Some(at()), 1));
    assert!(
        by[1..]
            .iter()
            .all(|(t, s, _)| *t == "retry" && *s == Some(at())),
        "{by:?}"
    );

    // A back-off that reaches past the next instant: abandoned there.
    let mut rig = Rig::with(
        Script {
            runs_for: Some(ms(2_000)),
            exit_code: 3,
            ..Script::default()
        },
        |s| s,
    );
    Arc::make_mut(&mut rig.job).retry = crate::config::Retry {
        retries: 3,
        backoff: ms(40_000),
        backoff_max: ms(600_000),
    };
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    assert_eq!(rig.runs(), [(ms(0), 1), (ms(42_000), 2)]);
}

/// A run that succeeds, or loses its lease, is not retried.
#[tokio::test(start_paused = true)]
async fn only_a_failed_run_is_retried() {
    let mut rig = Rig::new();
    Arc::make_mut(&mut rig.job).retry = crate::config::Retry {
        retries: 3,
        backoff: ms(1_000),
        backoff_max: ms(1_000),
    };
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    assert_eq!(rig.runs(), [(ms(0), 1)]);

    let mut rig = Rig::with(
        Script {
            runs_for: None,
            ..Script::default()
        },
        |s| s,
    );
    Arc::make_mut(&mut rig.job).retry = crate::config::Retry {
        retries: 3,
        backoff: ms(1_000),
        backoff_max: ms(1_000),
    };
    rig.store.fault(Op::Renew, Fault::Refuse, 1);
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    assert_eq!(rig.runs().len(), 1, "a lost lease is not retried");
    assert_eq!(rig.store.run_rows()[0].outcome, "lease_lost");
}

/// Retention: a minute after start the daemon prunes each job's history
/// to its newest `history.keep` runs (the store's part is in the
/// conformance suite, on every backend).
#[tokio::test(start_paused = true)]
async fn the_daemon_prunes_the_history_to_the_newest_runs() {
    let rig = Rig::new();
    let job = Job {
        schedule: Schedule::parse("5,15,25,35,45,55 * * * * *", chrono_tz::UTC).unwrap(),
        ..(*rig.job).clone()
    };
    let settings = super::Settings {
        node: "node-a".into(),
        max_running: None,
        jobs: vec![job],
        store: Arc::new(rig.store.clone()),
        child_env: Default::default(),
        records: None,
        store_display: "memory".into(),
        store_scope: "host",
        config_display: "none".into(),
        watchdog: None,
        history: crate::config::History {
            keep: 2,
            ..Default::default()
        },
        shutdown_grace: Duration::ZERO,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let daemon = tokio::spawn(super::serve(
        settings,
        rx,
        rig.shared.supervisor.clone(),
        rig.shared.clock,
    ));
    tokio::time::sleep(ms(59_000)).await;
    assert_eq!(rig.store.run_rows().len(), 6, "six runs before the prune");
    tokio::time::sleep(ms(3_000)).await;
    tx.send(super::Control::Stop("test")).await.unwrap();
    tokio::time::timeout(LIMIT, daemon)
        .await
        .expect("the daemon stops")
        .unwrap();
    let kept: Vec<i64> = rig.store.run_rows().iter().map(|r| r.token).collect();
    assert_eq!(kept, [5, 6], "the two newest of six");
}

/// `node.max_running`: an occurrence on a node at capacity does not
/// compete; it waits for a run to end (first come, first served) and then
/// competes as usual, holding its place until its lease is released.
#[tokio::test(start_paused = true)]
async fn a_node_at_capacity_waits_for_a_run_to_end_then_competes() {
    let mut rig = Rig::new();
    rig.shared.capacity = Capacity::new(Some(1));
    let busy = rig.shared.capacity.try_take().expect("a free slot");
    let capacity = rig.shared.capacity.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(3_000)).await;
        drop(busy);
    });
    // While the run holds the only slot, nothing else gets one.
    let probe = tokio::spawn(async move {
        tokio::time::sleep(ms(4_000)).await;
        let during = capacity.try_take().is_none();
        tokio::time::sleep(ms(2_000)).await;
        (during, capacity.try_take().is_some())
    });
    assert_eq!(rig.run().await, Ending::Won);
    assert_eq!(rig.log(Op::Acquire), log(&[(3_000, "acquired 1")]));
    assert_eq!(rig.runs(), [(ms(3_000), 1)]);
    assert_eq!(rig.log(Op::Release), log(&[(5_000, "released 1")]));
    assert_eq!(
        probe.await.unwrap(),
        (true, true),
        "held during the run (3 s to 5 s), free after it"
    );
}

/// A node that stays at capacity until the occurrence is no longer worth
/// starting (a lease length after the instant) skips it with reason
/// `capacity`, without a single statement: the other nodes take it.
#[tokio::test(start_paused = true)]
async fn a_node_at_capacity_until_the_give_up_time_skips_without_claiming() {
    let mut rig = Rig::new();
    rig.shared.capacity = Capacity::new(Some(2));
    let _busy = (
        rig.shared.capacity.try_take().unwrap(),
        rig.shared.capacity.try_take().unwrap(),
    );
    let t0 = Instant::now();
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Capacity));
    assert_eq!(t0.elapsed(), ms(10_000));
    assert!(
        rig.log(Op::Acquire).is_empty(),
        "a node at capacity does not claim"
    );
    assert!(rig.runs().is_empty());

    // With a `starting_deadline` before that, the skip is the deadline's.
    let mut rig = Rig::new();
    Arc::get_mut(&mut rig.job).unwrap().starting_deadline = Some(ms(4_000));
    rig.shared.capacity = Capacity::new(Some(1));
    let _busy = rig.shared.capacity.try_take().unwrap();
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Deadline));
    assert!(rig.log(Op::Acquire).is_empty());
}

/// Two jobs due at the same instant on a node with `max_running = 1`: one
/// runs, the other waits for it to end and then runs; a trigger polled
/// meanwhile is not claimed (it stays pending for another daemon).
#[tokio::test(start_paused = true)]
async fn max_running_one_runs_same_instant_jobs_one_after_the_other() {
    let mut rig = Rig::new();
    rig.shared.capacity = Capacity::new(Some(1));
    let other = Arc::new(Job {
        name: Name::parse("job", "other").unwrap(),
        resource: Name::parse("resource", "other").unwrap(),
        ..(*rig.job).clone()
    });
    let occurrence = |job: &Arc<Job>| Occurrence {
        shared: rig.shared.clone(),
        job: job.clone(),
        at: epoch_wall(),
    };
    let first = tokio::spawn(claim(rig.shared.clone(), vec![occurrence(&rig.job)]));
    tokio::task::yield_now().await;
    let second = tokio::spawn(claim(rig.shared.clone(), vec![occurrence(&other)]));
    let trigger = TriggerInfo {
        id: "t1".into(),
        job: "job".into(),
        requested_at: at(),
        requested_by: "ops@host".into(),
        state: trigger_state::PENDING.into(),
        node: None,
        token: None,
        detail: None,
    };
    rig.store.request_trigger(&trigger).await.unwrap();
    tokio::time::sleep(ms(1_000)).await;
    let jobs: HashMap<String, Arc<Job>> = [("job".to_string(), rig.job.clone())].into();
    super::fleet::poll_triggers(rig.shared.clone(), jobs).await;
    let t = rig.store.trigger("t1").await.unwrap().unwrap();
    assert_eq!(t.state, trigger_state::PENDING, "not claimed at capacity");
    assert_eq!(first.await.unwrap(), [Ending::Won]);
    assert_eq!(second.await.unwrap(), [Ending::Won]);
    assert_eq!(rig.runs(), [(ms(0), 1), (ms(2_000), 1)]);
    let starts: Vec<_> = rig
        .launcher
        .started()
        .iter()
        .map(|j| j.resource.clone())
        .collect();
    assert_eq!(starts, ["job", "other"]);
}

// ------------------------------------------------------------ batch claims

/// `n` jobs like the rig's, named `c0`…, each with a lease row already
/// (acquired and released once, ad hoc), and their occurrences at the
/// instant, in this order.
async fn claimable(rig: &Rig, n: usize) -> Vec<Occurrence> {
    let mut out = Vec::new();
    for i in 0..n {
        let job = Arc::new(Job {
            name: Name::parse("job", &format!("c{i}")).unwrap(),
            resource: Name::parse("resource", &format!("c{i}")).unwrap(),
            ..(*rig.job).clone()
        });
        let AcquireOutcome::Acquired(l) = rig
            .store
            .acquire(&AcquireRequest {
                resource: &job.resource,
                lease: job.timing.lease,
                node: "setup",
                owner_id: OwnerId::fresh(),
                occurrence: None,
                next_occurrence: None,
                run: None,
            })
            .await
            .unwrap()
        else {
            panic!("setup acquire");
        };
        rig.store
            .release(&job.resource, l.owner_id, l.token)
            .await
            .unwrap();
        out.push(Occurrence {
            shared: rig.shared.clone(),
            job,
            at: epoch_wall(),
        });
    }
    out
}

/// Claims `due` and waits for everything it started.
async fn claim_all(rig: &Rig, due: Vec<Occurrence>) {
    tokio::time::timeout(LIMIT, super::claim::claim(rig.shared.clone(), due))
        .await
        .expect("the claim ends");
    rig.settle().await;
}

/// When each job started (since the instant), by resource, with its token.
fn started(rig: &Rig) -> Vec<(Duration, String, i64)> {
    let mut v: Vec<_> = rig
        .launcher
        .started()
        .iter()
        .map(|j| (j.started() - rig.t0, j.resource.clone(), j.token))
        .collect();
    v.sort();
    v
}

/// One claim for the instant's three jobs: the two free ones run at once
/// under the tokens the claim won, the one held elsewhere is skipped as
/// `held`; no single acquire is made.
#[tokio::test(start_paused = true)]
async fn a_claim_runs_what_it_wins_and_settles_the_rest() {
    let rig = Rig::new();
    let due = claimable(&rig, 3).await;
    let held = rig
        .store
        .acquire(&AcquireRequest {
            resource: &due[1].job.resource,
            lease: ms(60_000),
            node: "node-b",
            owner_id: OwnerId::fresh(),
            occurrence: None,
            next_occurrence: None,
            run: None,
        })
        .await
        .unwrap();
    assert!(matches!(held, AcquireOutcome::Acquired(_)));
    claim_all(&rig, due).await;
    assert_eq!(
        rig.log(Op::Claim),
        log(&[(0, "limit 3: won 2, lost, won 2")])
    );
    assert_eq!(
        rig.log(Op::Acquire).len(),
        4,
        "only the setup's and node-b's acquires"
    );
    assert_eq!(
        started(&rig),
        [(ms(0), "c0".into(), 2), (ms(0), "c2".into(), 2)]
    );
    assert_eq!(
        rig.log(Op::Release).len(),
        3 + 2,
        "setup's three, then both runs'"
    );
}

/// Each occurrence follows what the claim decided for it, and only that:
/// a win runs under the claim's token with no single acquire (not ended as
/// a loss), a loss ends as `held` without running, and what the claim left
/// undecided (no row yet) is decided by the single acquire, which runs it.
#[tokio::test(start_paused = true)]
async fn each_occurrence_follows_its_claims_decision() {
    let rig = Rig::new();
    let mut due = claimable(&rig, 2).await;
    let held = rig
        .store
        .acquire(&AcquireRequest {
            resource: &due[1].job.resource,
            lease: ms(60_000),
            node: "node-b",
            owner_id: OwnerId::fresh(),
            occurrence: None,
            next_occurrence: None,
            run: None,
        })
        .await
        .unwrap();
    assert!(matches!(held, AcquireOutcome::Acquired(_)));
    due.push(Occurrence {
        shared: rig.shared.clone(),
        job: Arc::new(job_on(&rig, "fresh", "0 * * * * *")),
        at: epoch_wall(),
    });
    let acquires_before = rig.log(Op::Acquire).len();
    let endings = tokio::time::timeout(LIMIT, claim(rig.shared.clone(), due))
        .await
        .expect("the claim ends");
    rig.settle().await;
    assert_eq!(
        endings,
        [Ending::Won, Ending::Skipped(SkipReason::Held), Ending::Won],
        "won, lost, undecided then won by the single acquire"
    );
    assert_eq!(rig.log(Op::Claim), log(&[(0, "limit 3: won 2, lost, ask")]));
    assert_eq!(
        rig.log(Op::Acquire)
            .into_iter()
            .skip(acquires_before)
            .collect::<Vec<_>>(),
        log(&[(0, "acquired 1")]),
        "one single acquire: the undecided one's"
    );
    assert_eq!(
        started(&rig),
        [(ms(0), "c0".into(), 2), (ms(0), "fresh".into(), 1)]
    );
}

/// A claim that fails: every occurrence acquires on its own, under the
/// owner id the claim used, after the first back-off, and runs.
#[tokio::test(start_paused = true)]
async fn a_failed_claim_falls_back_to_single_acquires() {
    let rig = Rig::new();
    let due = claimable(&rig, 2).await;
    rig.store.fault(Op::Claim, Fault::Fail, 1);
    claim_all(&rig, due).await;
    assert_eq!(rig.log(Op::Claim), log(&[(0, "failed")]));
    let singles: Vec<_> = rig.log(Op::Acquire).into_iter().skip(2).collect();
    // The claim counts as each occurrence's first failed attempt: the
    // retry follows after the first back-off.
    assert_eq!(singles, log(&[(100, "acquired 2"), (100, "acquired 2")]));
    assert_eq!(
        started(&rig),
        [(ms(100), "c0".into(), 2), (ms(100), "c1".into(), 2)]
    );
}

/// A claim whose statement committed but whose answer never came: the
/// store's 5 s limit ends the wait, and each occurrence's own acquire
/// (after the first back-off), under the same owner id, adopts the win
/// (same token) and runs it. No token is lost and nothing is given back.
#[tokio::test(start_paused = true)]
async fn a_claim_answered_too_late_is_adopted_by_the_single_acquire() {
    let rig = Rig::new();
    let due = claimable(&rig, 2).await;
    let gate = Gate::new();
    rig.store
        .fault(Op::Claim, Fault::Hang(gate.clone(), Commit::Before), 1);
    claim_all(&rig, due).await;
    let singles: Vec<_> = rig.log(Op::Acquire).into_iter().skip(2).collect();
    assert_eq!(singles, log(&[(5_100, "adopted 2"), (5_100, "adopted 2")]));
    assert_eq!(
        started(&rig),
        [(ms(5_100), "c0".into(), 2), (ms(5_100), "c1".into(), 2)]
    );
    assert!(rig.log(Op::GiveBack).is_empty());
    drop(gate);
}

/// A claim the store holds past the occurrences' give-up time (10 s) and
/// answers at 20 s, having won both: each occurrence ends at 10 s as an
/// unanswered acquire would; the claim is not dropped, its answer comes,
/// and exactly what it won goes back (with the tokens it won). Nothing is
/// swept and nothing is acquired alone: a late answer costs the store one
/// give-back per win, not a sweep and a retry per occurrence.
#[tokio::test(start_paused = true)]
async fn a_claim_answered_after_the_give_up_gives_back_what_it_won() {
    let rig = Rig::with_store(|s| s.with_call_timeout(None));
    let due = claimable(&rig, 2).await;
    let gate = Gate::new();
    rig.store
        .fault(Op::Claim, Fault::Hang(gate.clone(), Commit::Before), 1);
    tokio::spawn(async move {
        tokio::time::sleep(ms(20_000)).await;
        gate.open();
    });
    claim_all(&rig, due).await;
    assert!(rig.launcher.started().is_empty(), "nothing ran");
    assert_eq!(rig.log(Op::Acquire).len(), 2, "only the setup's acquires");
    assert_eq!(
        rig.log(Op::GiveBack),
        log(&[(20_000, "given_back 2"), (20_000, "given_back 2")])
    );
    assert!(
        rig.log(Op::Sweep).is_empty(),
        "an answered claim is not swept"
    );
    for i in 0..2 {
        let row = rig.store.row(&format!("c{i}")).unwrap();
        assert!(row.released);
        assert_eq!(
            row.last_occurrence,
            Some(at().0 - 1),
            "the instant is free again"
        );
    }
}

/// A claim that times out (15 s) after its occurrences gave up (10 s), and
/// whose statement commits later (18 s): nobody sees the wins, so both
/// owner ids are swept, together, in one store call per look: at 16 s
/// (nothing yet) and at 20 s (both given back).
#[tokio::test(start_paused = true)]
async fn a_failed_claim_nobody_waits_for_is_swept_in_one_call_per_look() {
    let rig = Rig::with_store(|s| s.with_call_timeout(Some(ms(15_000))));
    let due = claimable(&rig, 2).await;
    let gate = Gate::new();
    rig.store
        .fault(Op::Claim, Fault::Hang(gate.clone(), Commit::After), 1);
    tokio::spawn(async move {
        tokio::time::sleep(ms(18_000)).await;
        gate.open();
    });
    claim_all(&rig, due).await;
    assert!(rig.launcher.started().is_empty(), "nothing ran");
    assert_eq!(rig.log(Op::Sweep), log(&[(16_000, "2"), (20_000, "2")]));
    assert_eq!(
        rig.log(Op::GiveBack),
        log(&[
            (16_000, "refused"),
            (16_000, "refused"),
            (20_000, "given_back"),
            (20_000, "given_back")
        ])
    );
    for i in 0..2 {
        assert!(rig.store.row(&format!("c{i}")).unwrap().released);
    }
}

/// With another node live, a claim takes its share (4 jobs, 2 nodes: 3),
/// and since nobody took the fourth, a second round 200 ms later does.
#[tokio::test(start_paused = true)]
async fn a_claim_takes_its_share_then_what_the_others_left() {
    let rig = Rig::new();
    let due = claimable(&rig, 4).await;
    rig.store.node_seen("node-b");
    claim_all(&rig, due).await;
    assert_eq!(
        rig.log(Op::Claim),
        log(&[
            (0, "limit 3: won 2, won 2, won 2, skipped"),
            (200, "limit 1: won 2"),
        ])
    );
    assert_eq!(
        started(&rig),
        [
            (ms(0), "c0".into(), 2),
            (ms(0), "c1".into(), 2),
            (ms(0), "c2".into(), 2),
            (ms(200), "c3".into(), 2)
        ]
    );
}

/// `max_running = 2` and four jobs due: the claim wins two; the second
/// round finds the node full, so the other two wait for places and run
/// when the first two end (2 s).
#[tokio::test(start_paused = true)]
async fn a_claim_wins_no_more_than_the_free_capacity() {
    let mut rig = Rig::new();
    rig.shared.capacity = Capacity::new(Some(2));
    let due = claimable(&rig, 4).await;
    claim_all(&rig, due).await;
    assert_eq!(
        rig.log(Op::Claim),
        log(&[(0, "limit 2: won 2, won 2, skipped, skipped")])
    );
    assert_eq!(
        started(&rig),
        [
            (ms(0), "c0".into(), 2),
            (ms(0), "c1".into(), 2),
            (ms(2_000), "c2".into(), 2),
            (ms(2_000), "c3".into(), 2)
        ]
    );
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
        node: "node-a".into(),
        max_running: None,
        jobs,
        store: Arc::new(rig.store.clone()),
        child_env: Default::default(),
        records: None,
        store_display: "memory".into(),
        store_scope: "host",
        config_display: "none".into(),
        watchdog: None,
        history: Default::default(),
        shutdown_grace: grace,
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

/// A drain (SIGTERM) lets a running job finish by itself while it renews
/// its lease as usual, and competes for nothing more: an instant that
/// comes due during the drain is neither claimed nor acquired by this
/// node, and another node's acquire wins it. The daemon returns when the
/// last run has ended, well before the grace is over.
///
/// "a" runs at 30 s for 45 s (to 75 s) under a 10 s lease; the drain
/// starts at 40 s with a 60 s grace; "b" is due at 60 s.
#[tokio::test(start_paused = true)]
async fn a_drain_lets_running_jobs_finish_and_competes_for_nothing_new() {
    let (events, _guard) = crate::testing::events::Captured::start();
    let rig = Rig::with(
        Script {
            runs_for: Some(ms(45_000)),
            ..Script::default()
        },
        |s| s,
    );
    let jobs = vec![
        job_on(&rig, "a", "30 * * * * *"),
        job_on(&rig, "b", "0 * * * * *"),
    ];
    let (tx, daemon) = start_daemon(&rig, jobs, ms(60_000));
    tokio::time::sleep(ms(40_000)).await;
    tx.send(super::Control::Drain("test")).await.unwrap();
    let competed_before = (rig.log(Op::Claim), rig.log(Op::Acquire));
    tokio::time::sleep(ms(21_000)).await;
    // 61 s: another node takes b's instant of 60 s at once.
    let b = Name::parse("resource", "b").unwrap();
    let next = StoreTime::from_utc(epoch_wall() + chrono::Duration::seconds(120));
    let won = rig
        .store
        .acquire(&AcquireRequest {
            resource: &b,
            lease: ms(10_000),
            node: "node-b",
            owner_id: OwnerId::fresh(),
            occurrence: Some(StoreTime::from_utc(
                epoch_wall() + chrono::Duration::seconds(60),
            )),
            next_occurrence: Some(next),
            run: None,
        })
        .await
        .unwrap();
    assert!(matches!(won, AcquireOutcome::Acquired(_)), "{won:?}");
    assert_eq!(stopped(&rig, daemon).await, ms(75_000));

    assert_eq!(
        (rig.log(Op::Claim), rig.log(Op::Acquire).len()),
        (competed_before.0, competed_before.1.len() + 1),
        "after the drain began only node-b's acquire reached the store"
    );
    assert!(competed_before.1.iter().all(|(t, _)| *t == ms(30_000)));
    assert_eq!(started(&rig), [(ms(30_000), "a".to_string(), 1)]);
    let job = &rig.launcher.started()[0];
    assert!(job.signals().is_empty(), "{:?}", job.signals());
    let renewals: Vec<Duration> = rig.log(Op::Renew).iter().map(|(t, _)| *t).collect();
    assert!(
        renewals.iter().filter(|t| **t > ms(40_000)).count() >= 10,
        "renewed as usual during the drain: {renewals:?}"
    );
    let rows = rig.store.run_rows();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, "succeeded");
    assert!(rig.store.row("a").unwrap().released);

    let stopping = events.named("daemon_stopping");
    assert_eq!(stopping.len(), 1);
    assert_eq!(
        (stopping[0].get("running"), stopping[0].get("drain_ms")),
        ("1", "60000")
    );
    let drained = events.named("drain_ended");
    assert_eq!(drained.len(), 1);
    assert_eq!(
        (drained[0].get("reason"), drained[0].get("running")),
        ("runs_finished", "0")
    );
    assert!(events.named("job_stopped").is_empty());
}

/// The jobs of the three tests below: "a" runs from 30 s until it is
/// signalled, then takes 500 ms to end; it would be retried twice and has
/// an `on_failure` hook (that cannot start: it would log
/// `on_failure_failed` at once if it ran).
fn endless(rig: &Rig) -> Vec<Job> {
    vec![Job {
        on_failure: Some(vec!["/nonexistent/fencecron-hook".into()]),
        retry: crate::config::Retry {
            retries: 2,
            backoff: ms(1_000),
            backoff_max: ms(1_000),
        },
        ..job_on(rig, "a", "30 * * * * *")
    }]
}

fn endless_rig() -> Rig {
    Rig::with(
        Script {
            runs_for: None,
            term_takes: Some(ms(500)),
            ..Script::default()
        },
        |s| s,
    )
}

/// What a run stopped for a shutdown at `stop` leaves: SIGTERM at `stop`,
/// outcome `shutdown` in the history, the lease released, `job_finished`
/// then `job_stopped` (INFO), and nothing that reports a failure: no
/// `job_failed`, no `job_cancelled`, no retry, no `on_failure` hook.
fn stopped_for_shutdown(rig: &Rig, events: &crate::testing::events::Captured, stop: Duration) {
    assert_eq!(started(rig), [(ms(30_000), "a".to_string(), 1)]);
    let job = &rig.launcher.started()[0];
    let signals: Vec<_> = job
        .signals()
        .iter()
        .map(|(t, s)| (*t - rig.t0, *s))
        .collect();
    assert_eq!(signals, [(stop, nix::sys::signal::Signal::SIGTERM)]);
    let rows = rig.store.run_rows();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, "shutdown");
    assert!(rig.store.row("a").unwrap().released);
    let finished = events.named("job_finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0].get("outcome"), "shutdown");
    let stopped = events.named("job_stopped");
    assert_eq!(stopped.len(), 1);
    assert_eq!(stopped[0].level, tracing::Level::INFO);
    assert_eq!(
        (
            stopped[0].get("job"),
            stopped[0].get("signal"),
            stopped[0].get("reason"),
            stopped[0].get("duration_ms"),
        ),
        (
            "a",
            "SIGTERM",
            "shutdown",
            &*(stop + ms(500) - ms(30_000)).as_millis().to_string()
        )
    );
    for event in [
        "job_failed",
        "job_cancelled",
        "retry_scheduled",
        "on_failure_failed",
        "on_failure_finished",
    ] {
        assert!(
            events.named(event).is_empty(),
            "{event}: {:?}",
            events.named(event)
        );
    }
}

/// The grace runs out: what still runs is stopped as at a stop (SIGTERM,
/// `kill_grace`, SIGKILL), and that is not a failure.
#[tokio::test(start_paused = true)]
async fn a_drain_stops_what_outlives_the_grace_as_a_shutdown_not_a_failure() {
    let (events, _guard) = crate::testing::events::Captured::start();
    let rig = endless_rig();
    let (tx, daemon) = start_daemon(&rig, endless(&rig), ms(20_000));
    tokio::time::sleep(ms(40_000)).await;
    tx.send(super::Control::Drain("test")).await.unwrap();
    assert_eq!(stopped(&rig, daemon).await, ms(60_500));
    stopped_for_shutdown(&rig, &events, ms(60_000));
    let drained = events.named("drain_ended");
    assert_eq!(
        (drained[0].get("reason"), drained[0].get("running")),
        ("grace_expired", "1")
    );
}

/// A stop during a drain (SIGINT, a second SIGTERM) stops at once.
#[tokio::test(start_paused = true)]
async fn a_stop_during_a_drain_stops_at_once() {
    let (events, _guard) = crate::testing::events::Captured::start();
    let rig = endless_rig();
    let (tx, daemon) = start_daemon(&rig, endless(&rig), ms(3_600_000));
    tokio::time::sleep(ms(40_000)).await;
    tx.send(super::Control::Drain("test")).await.unwrap();
    tokio::time::sleep(ms(5_000)).await;
    tx.send(super::Control::Stop("again")).await.unwrap();
    assert_eq!(stopped(&rig, daemon).await, ms(45_500));
    stopped_for_shutdown(&rig, &events, ms(45_000));
    let drained = events.named("drain_ended");
    assert_eq!(
        (drained[0].get("reason"), drained[0].get("running")),
        ("again", "1")
    );
}

/// `shutdown_grace = "0s"`: a drain is a stop, at once.
#[tokio::test(start_paused = true)]
async fn a_zero_shutdown_grace_stops_at_once() {
    let (events, _guard) = crate::testing::events::Captured::start();
    let rig = endless_rig();
    let (tx, daemon) = start_daemon(&rig, endless(&rig), Duration::ZERO);
    tokio::time::sleep(ms(40_000)).await;
    tx.send(super::Control::Drain("test")).await.unwrap();
    assert_eq!(stopped(&rig, daemon).await, ms(40_500));
    stopped_for_shutdown(&rig, &events, ms(40_000));
    assert_eq!(events.named("daemon_stopping")[0].get("drain_ms"), "0");
    assert!(events.named("drain_ended").is_empty());
}

/// The checks above can fail: a run of the same job that fails by itself
/// (exit code 1) logs `job_failed` and runs the hook, which logs
/// `on_failure_failed` at once since it cannot start.
#[tokio::test(start_paused = true)]
async fn a_failed_run_runs_its_hook_so_the_shutdown_checks_can_fail() {
    let (events, _guard) = crate::testing::events::Captured::start();
    let mut rig = Rig::with(
        Script {
            runs_for: Some(ms(2_000)),
            exit_code: 1,
            ..Script::default()
        },
        |s| s,
    );
    rig.job = Arc::new(Job {
        retry: Default::default(),
        ..endless(&rig).remove(0)
    });
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    assert_eq!(events.named("job_failed").len(), 1);
    assert_eq!(events.named("on_failure_failed").len(), 1);
    assert!(events.named("job_stopped").is_empty());
}

/// A draining node claims no trigger (it stays pending for another
/// daemon), and a failed run's retry waiting for its back-off is not run:
/// the failure stands (its hook runs).
#[tokio::test(start_paused = true)]
async fn a_draining_node_claims_no_trigger_and_runs_no_retry() {
    let (events, _guard) = crate::testing::events::Captured::start();
    let rig = Rig::new();
    rig.store
        .request_trigger(&TriggerInfo {
            id: "t1".into(),
            job: "job".into(),
            requested_at: at(),
            requested_by: "ops@host".into(),
            state: trigger_state::PENDING.into(),
            node: None,
            token: None,
            detail: None,
        })
        .await
        .unwrap();
    rig.shared.draining.cancel();
    let jobs: HashMap<String, Arc<Job>> = [("job".to_string(), rig.job.clone())].into();
    super::fleet::poll_triggers(rig.shared.clone(), jobs).await;
    rig.settle().await;
    let t = rig.store.trigger("t1").await.unwrap().unwrap();
    assert_eq!(t.state, trigger_state::PENDING);
    assert!(rig.runs().is_empty());

    let mut rig = Rig::with(
        Script {
            runs_for: Some(ms(2_000)),
            exit_code: 3,
            ..Script::default()
        },
        |s| s,
    );
    rig.job = Arc::new(Job {
        on_failure: Some(vec!["/nonexistent/fencecron-hook".into()]),
        retry: crate::config::Retry {
            retries: 3,
            backoff: ms(10_000),
            backoff_max: ms(10_000),
        },
        ..(*rig.job).clone()
    });
    let draining = rig.shared.draining.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(5_000)).await;
        draining.cancel();
    });
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    assert_eq!(
        rig.runs(),
        [(ms(0), 1)],
        "the retry due at 12 s did not run"
    );
    assert_eq!(events.named("retry_scheduled").len(), 1);
    assert_eq!(events.named("on_failure_failed").len(), 1);
}

/// A 10 s outage while two jobs have an instant every second: each job
/// logs one WARN `store_unavailable` (its first failure), every later
/// failure at DEBUG, and once the store answers again one
/// `store_available` whose count is all of them.
#[tokio::test(start_paused = true)]
async fn an_outage_warns_once_per_job_and_logs_when_it_ends() {
    let (events, _guard) = crate::testing::events::Captured::start();
    let rig = Rig::new();
    for op in [
        Op::Claim,
        Op::Acquire,
        Op::Release,
        Op::GiveBack,
        Op::Sweep,
        Op::FinishRun,
        Op::RecordStale,
        Op::Fleet,
        Op::Nodes,
    ] {
        rig.store.fault(op, Fault::Fail, 100_000);
    }
    let jobs = vec![
        job_on(&rig, "a", "* * * * * *"),
        job_on(&rig, "b", "* * * * * *"),
    ];
    let (tx, daemon) = start_daemon(&rig, jobs, ms(1_000));
    tokio::time::sleep(ms(10_000)).await;
    rig.store.heal();
    let ended = |job: &str| {
        events
            .named("store_available")
            .iter()
            .any(|e| e.get("job") == job)
    };
    let limit = Instant::now() + LIMIT;
    while !(ended("a") && ended("b")) {
        assert!(Instant::now() < limit, "the outages end");
        tokio::time::sleep(ms(100)).await;
    }
    tx.send(super::Control::Stop("test")).await.unwrap();
    stopped(&rig, daemon).await;
    for job in ["a", "b"] {
        let failed: Vec<_> = events
            .named("store_unavailable")
            .into_iter()
            .filter(|e| e.get("job") == job)
            .collect();
        let warned = failed
            .iter()
            .filter(|e| e.level == tracing::Level::WARN)
            .count();
        assert_eq!(warned, 1, "{job}: one WARN per outage: {failed:?}");
        assert_eq!(failed[0].level, tracing::Level::WARN, "{job}: the first");
        assert!(failed.len() >= 5, "{job}: a failure a second at least");
        let available: Vec<_> = events
            .named("store_available")
            .into_iter()
            .filter(|e| e.get("job") == job)
            .collect();
        assert_eq!(available.len(), 1, "{job}: {available:?}");
        assert_eq!(available[0].level, tracing::Level::INFO);
        assert_eq!(
            available[0].get("failures"),
            failed.len().to_string(),
            "{job}: the count of the outage's failures"
        );
        let took: u64 = available[0].get("duration_ms").parse().unwrap();
        assert!(took >= 9_000, "{job}: the outage lasted {took} ms");
    }
}

//! The supervisor's deadline loop on tokio's paused clock: a fake job
//! ([`FakeLauncher`]) under a lease in the in-memory store, with renewals
//! refused, failing or hanging. Every time below is exact (paused time
//! only moves to the next timer), measured from the send of the acquire.
//!
//! Timing: lease 10 s, renew every 3 s, kill grace 2 s, so the safety
//! margin is 200 ms, SIGKILL is due 9.8 s after the last confirmed send and
//! SIGTERM 7.8 s after it; the watchdog's deadlines are 50 ms later.

use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    outcome_of, CancelReason, LeaseTiming, RunResult, RunSpec, SuperviseError, Supervisor,
};
use crate::clock::Clock;
use crate::names::Name;
use crate::store::{
    prelude::*, AcquireOutcome, AcquireRequest, Lease, OwnerId, StaleKind, StoreTime, Token,
};
use crate::testing::epoch_wall;
use crate::testing::job::{FakeLauncher, JobHandle, Script};
use crate::testing::store::{Commit, Fault, Gate, MemoryStore, Op};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One supervisor over the in-memory store, starting fake jobs.
struct Rig {
    store: MemoryStore,
    launcher: Arc<FakeLauncher>,
    sup: Supervisor,
    spec: RunSpec,
    t0: Instant,
}

impl Rig {
    fn new(script: Script) -> Rig {
        let store = MemoryStore::new(Clock::following_tokio(epoch_wall()));
        let launcher = FakeLauncher::new(script);
        let sup =
            Supervisor::with_launcher(Arc::new(store.clone()), "node-a".into(), launcher.clone());
        let spec = RunSpec {
            job: "job".into(),
            resource: Name::parse("resource", "job").unwrap(),
            command: vec!["true".into()],
            env: Default::default(),
            workdir: None,
            timing: LeaseTiming::new(ms(10_000), Some(ms(3_000)), Some(ms(2_000))).unwrap(),
            timeout: None,
            stale_exit_code: None,
            scheduled_at: None,
            inherit_stdio: false,
            history: None,
        };
        Rig {
            store,
            launcher,
            sup,
            spec,
            t0: Instant::now(),
        }
    }

    /// Acquires the job's lease (sent at `t0`, for the occurrence the spec
    /// names, if any).
    async fn lease(&self) -> Lease {
        let out = self
            .store
            .acquire(&AcquireRequest {
                resource: &self.spec.resource,
                lease: self.spec.timing.lease,
                node: "node-a",
                owner_id: OwnerId::fresh(),
                occurrence: self.spec.scheduled_at.map(StoreTime::from_utc),
                next_occurrence: None,
                run: None,
            })
            .await
            .unwrap();
        match out {
            AcquireOutcome::Acquired(l) => l,
            other => panic!("{other:?}"),
        }
    }

    /// Runs the job under a fresh lease sent at `t0`.
    async fn run(&self, shutdown: CancellationToken) -> Result<RunResult, SuperviseError> {
        let lease = self.lease().await;
        // A run that never ends (a deadline not enforced) fails the test
        // instead of hanging it: paused time races through the hour.
        tokio::time::timeout(
            Duration::from_secs(3_600),
            self.sup.run(&self.spec, lease, self.t0, shutdown),
        )
        .await
        .expect("the run ends within an hour")
    }

    fn job(&self) -> JobHandle {
        let started = self.launcher.started();
        assert_eq!(started.len(), 1, "one job started");
        started[0].clone()
    }

    /// The signals the job got, as (time since t0, signal).
    fn signals(&self) -> Vec<(Duration, Signal)> {
        self.job()
            .signals()
            .into_iter()
            .map(|(at, s)| (at - self.t0, s))
            .collect()
    }

    /// The deadlines confirmed to the watchdog, as (time since t0, term
    /// deadline, kill deadline), all since t0.
    fn confirms(&self) -> Vec<(Duration, Duration, Duration)> {
        self.job()
            .confirms()
            .into_iter()
            .map(|(at, term, kill)| (at - self.t0, term - self.t0, kill - self.t0))
            .collect()
    }

    /// Lets background tasks (records of a lost lease) run.
    async fn settle(&self) {
        tokio::time::sleep(ms(1)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn renewals_move_the_deadline_and_an_exit_releases_the_lease() {
    let rig = Rig::new(Script {
        runs_for: Some(ms(25_000)),
        exit_code: 3,
        ..Script::default()
    });
    let result = rig.run(CancellationToken::new()).await.unwrap();
    assert_eq!(
        result,
        RunResult {
            exit_code: Some(3),
            signal: None,
            cancelled: None,
            lease_lost: false
        }
    );
    let job = rig.job();
    assert_eq!((job.token, job.started()), (Token::new(1), rig.t0));
    assert_eq!(job.resource, "job");
    assert!(rig.signals().is_empty(), "{:?}", rig.signals());
    // The watchdog starts with the acquire's deadlines, 50 ms behind ours.
    assert_eq!(
        (job.term_at - rig.t0, job.kill_at - rig.t0),
        (ms(7_850), ms(9_850))
    );
    // Each renewal (every 3 s) moves both deadlines to its own send + lease.
    let expected: Vec<_> = (1..=8)
        .map(|i| {
            let sent = ms(3_000 * i);
            (sent, sent + ms(7_850), sent + ms(9_850))
        })
        .collect();
    assert_eq!(rig.confirms(), expected);
    assert_eq!(job.ended().unwrap().0 - rig.t0, ms(25_000));
    assert!(job.reaped(), "the job's group is cleaned up");
    assert_eq!(rig.store.history(Op::Release), ["released 1"]);
    assert!(rig.store.row("job").unwrap().released);
}

#[tokio::test(start_paused = true)]
async fn a_refused_renewal_terminates_at_once_and_kills_after_the_grace() {
    let rig = Rig::new(Script {
        term_takes: None,
        ..Script::default()
    });
    rig.store.fault(Op::Renew, Fault::Refuse, 1);
    let result = rig.run(CancellationToken::new()).await.unwrap();
    assert_eq!(
        rig.signals(),
        [(ms(3_000), Signal::SIGTERM), (ms(5_000), Signal::SIGKILL)]
    );
    assert_eq!(result.cancelled, Some(CancelReason::LeaseLost));
    assert!(result.lease_lost);
    assert_eq!(result.signal, Some(libc::SIGKILL));
    assert!(
        rig.store.history(Op::Release).is_empty(),
        "a lost lease is not released"
    );
    rig.settle().await;
    let stale = rig.store.stale(None).await.unwrap();
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert_eq!(
        (stale[0].kind, stale[0].reason.as_str()),
        (StaleKind::LeaseLost, "renew_refused")
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_that_ends_on_sigterm_is_not_killed() {
    let rig = Rig::new(Script {
        term_takes: Some(ms(500)),
        ..Script::default()
    });
    rig.store.fault(Op::Renew, Fault::Refuse, 1);
    let result = rig.run(CancellationToken::new()).await.unwrap();
    assert_eq!(rig.signals(), [(ms(3_000), Signal::SIGTERM)]);
    assert_eq!(result.signal, Some(libc::SIGTERM));
    assert_eq!(rig.job().ended().unwrap().0 - rig.t0, ms(3_500));
}

/// Renewals fail, then one hangs across both deadlines: neither SIGTERM
/// nor SIGKILL waits for it. Failed renewals are retried every 750 ms (a
/// quarter of the interval); an attempt is given up after 3 s (the
/// interval). Once the lease counts as lost (at SIGTERM), no more are sent.
#[tokio::test(start_paused = true)]
async fn a_renewal_hanging_past_the_deadline_does_not_delay_the_kill() {
    let rig = Rig::new(Script {
        term_takes: None,
        ..Script::default()
    });
    let gate = Gate::new();
    // 3.0, 3.75, 4.5, 5.25, 6.0 and 6.75 fail; 7.5 hangs until 10.5, past
    // SIGTERM at 7.8 and SIGKILL at 9.8 (and then commits, at 12 s).
    rig.store.fault(Op::Renew, Fault::Fail, 6);
    rig.store
        .fault(Op::Renew, Fault::Hang(gate.clone(), Commit::After), 1);
    let opener = tokio::spawn(async move {
        tokio::time::sleep(ms(12_000)).await;
        gate.open();
    });
    let result = rig.run(CancellationToken::new()).await.unwrap();
    assert_eq!(
        rig.signals(),
        [(ms(7_800), Signal::SIGTERM), (ms(9_800), Signal::SIGKILL)]
    );
    assert_eq!(result.cancelled, Some(CancelReason::LeaseUnconfirmed));
    assert!(result.lease_lost);
    assert_eq!(rig.job().ended().unwrap().0 - rig.t0, ms(9_800));
    assert!(rig.confirms().is_empty(), "no deadline was ever extended");
    assert!(rig.store.history(Op::Release).is_empty());
    let renewals: Vec<_> = rig
        .store
        .entries(Op::Renew)
        .into_iter()
        .map(|e| (e.at - rig.t0, e.what))
        .collect();
    let mut expected: Vec<_> = [3_000, 3_750, 4_500, 5_250, 6_000, 6_750]
        .into_iter()
        .map(|t| (ms(t), "failed".to_string()))
        .collect();
    expected.push((ms(7_500), "hung".to_string()));
    assert_eq!(renewals, expected);
    opener.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_renewal_that_recovers_before_the_deadline_moves_it() {
    let rig = Rig::new(Script {
        runs_for: Some(ms(12_000)),
        ..Script::default()
    });
    rig.store.fault(Op::Renew, Fault::Fail, 3);
    let result = rig.run(CancellationToken::new()).await.unwrap();
    assert!(rig.signals().is_empty(), "{:?}", rig.signals());
    assert_eq!(result.exit_code, Some(0));
    // 3.0, 3.75 and 4.5 fail; 5.25 succeeds, then every 3 s.
    assert_eq!(
        rig.confirms(),
        [
            (ms(5_250), ms(13_100), ms(15_100)),
            (ms(8_250), ms(16_100), ms(18_100)),
            (ms(11_250), ms(19_100), ms(21_100)),
        ]
    );
    assert_eq!(rig.store.history(Op::Release), ["released 1"]);
}

/// The job ends by itself while a renewal hangs: the lease is released at
/// once, not after the renewal gives up.
#[tokio::test(start_paused = true)]
async fn an_exit_during_a_hanging_renewal_releases_at_once() {
    let rig = Rig::new(Script::default());
    rig.store
        .fault(Op::Renew, Fault::Hang(Gate::new(), Commit::Before), 1);
    let launcher = rig.launcher.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(4_000)).await;
        launcher.started()[0].exit(0);
    });
    let result = rig.run(CancellationToken::new()).await.unwrap();
    assert_eq!((result.exit_code, result.cancelled), (Some(0), None));
    let release = rig.store.entries(Op::Release);
    assert_eq!(
        release
            .iter()
            .map(|e| (e.at - rig.t0, e.what.as_str()))
            .collect::<Vec<_>>(),
        [(ms(4_000), "released 1")]
    );
    assert_eq!(rig.job().owner_id, rig.store.row("job").unwrap().owner_id);
}

#[tokio::test(start_paused = true)]
async fn shutdown_terminates_the_job_then_releases_the_lease() {
    let rig = Rig::new(Script {
        term_takes: Some(ms(1_000)),
        ..Script::default()
    });
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(4_000)).await;
        stop.cancel();
    });
    let result = rig.run(shutdown).await.unwrap();
    assert_eq!(rig.signals(), [(ms(4_000), Signal::SIGTERM)]);
    assert_eq!(result.cancelled, Some(CancelReason::Shutdown));
    assert!(!result.lease_lost);
    let release = rig.store.entries(Op::Release);
    assert_eq!(release.len(), 1);
    assert_eq!(
        (release[0].at - rig.t0, release[0].what.as_str()),
        (ms(5_000), "released 1"),
        "released once the job is gone"
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_past_its_timeout_is_terminated() {
    let mut rig = Rig::new(Script::default());
    rig.spec.timeout = Some(ms(4_500));
    let result = rig.run(CancellationToken::new()).await.unwrap();
    assert_eq!(rig.signals(), [(ms(4_500), Signal::SIGTERM)]);
    assert_eq!(result.cancelled, Some(CancelReason::Timeout));
    assert_eq!(rig.store.history(Op::Release), ["released 1"]);
}

#[tokio::test(start_paused = true)]
async fn an_acquire_answered_too_late_gives_the_occurrence_back_unrun() {
    let mut rig = Rig::new(Script::default());
    let at = epoch_wall();
    rig.spec.scheduled_at = Some(at);
    let lease = rig.lease().await;
    // The answer arrived 8 s after the send: SIGTERM would be due 200 ms
    // after the job started, less than its grace.
    tokio::time::sleep(ms(8_000)).await;
    let result = rig
        .sup
        .run(&rig.spec, lease, rig.t0, CancellationToken::new())
        .await;
    assert!(matches!(result, Err(SuperviseError::AcquiredTooLate)));
    assert!(rig.launcher.started().is_empty());
    assert_eq!(rig.store.history(Op::GiveBack), ["given_back 1"]);
    let row = rig.store.row("job").unwrap();
    assert!(row.released);
    assert_eq!(
        row.last_occurrence,
        Some(StoreTime::from_utc(at).0 - 1),
        "the instant is takeable again"
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_that_cannot_start_releases_the_lease() {
    let rig = Rig::new(Script::default());
    rig.launcher.refuse("no such file");
    let result = rig.run(CancellationToken::new()).await;
    assert!(matches!(result, Err(SuperviseError::Spawn { .. })));
    assert_eq!(rig.store.history(Op::Release), ["released 1"]);
}

#[tokio::test(start_paused = true)]
async fn a_missing_workdir_is_named_and_nothing_starts() {
    let mut rig = Rig::new(Script::default());
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("gone");
    rig.spec.workdir = Some(missing.clone());
    let result = rig.run(CancellationToken::new()).await;
    let err = result.unwrap_err();
    assert!(matches!(err, SuperviseError::Workdir { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "the job's workdir `{}` does not exist; create the directory or fix the job's `workdir`",
            missing.display()
        )
    );
    assert!(rig.launcher.started().is_empty());
    assert_eq!(rig.store.history(Op::Release), ["released 1"]);
    // A file is not a directory either.
    std::fs::write(&missing, b"").unwrap();
    assert_eq!(
        super::workdir_problem(&missing).as_deref(),
        Some("is not a directory")
    );
    assert_eq!(super::workdir_problem(dir.path()), None);
}

#[test]
fn exit_statuses_of_fake_jobs_read_like_real_ones() {
    use std::process::ExitStatus;
    assert_eq!(ExitStatus::from_raw(3 << 8).code(), Some(3));
    assert_eq!(ExitStatus::from_raw(libc::SIGKILL).signal(), Some(9));
}

#[test]
fn outcome_names_fencecrons_reason_before_the_exit_status() {
    use crate::domain::RunOutcome;
    assert_eq!(outcome_of(Some(0), None, false), RunOutcome::Succeeded);
    assert_eq!(outcome_of(Some(1), None, false), RunOutcome::Failed);
    assert_eq!(outcome_of(None, None, false), RunOutcome::Failed);
    assert_eq!(outcome_of(Some(0), None, true), RunOutcome::LeaseLost);
    assert_eq!(
        outcome_of(Some(0), Some(CancelReason::Timeout), false),
        RunOutcome::TimedOut
    );
    assert_eq!(
        outcome_of(None, Some(CancelReason::LeaseUnconfirmed), true),
        RunOutcome::LeaseLost
    );
    assert_eq!(
        outcome_of(None, Some(CancelReason::Shutdown), false),
        RunOutcome::Shutdown
    );
    assert_eq!(crate::events::signal_name(9), "SIGKILL");
    assert_eq!(crate::events::signal_name(200), "SIG200");
}

//! Drains and stops: running jobs finish within the grace or are stopped
//! as a shutdown; nothing new is competed for.

use super::*;

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
    tx.send(crate::daemon::Control::Drain("test"))
        .await
        .unwrap();
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
    assert_eq!(rows[0].outcome.as_str(), "succeeded");
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
    assert_eq!(rows[0].outcome.as_str(), "shutdown");
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
    tx.send(crate::daemon::Control::Drain("test"))
        .await
        .unwrap();
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
    tx.send(crate::daemon::Control::Drain("test"))
        .await
        .unwrap();
    tokio::time::sleep(ms(5_000)).await;
    tx.send(crate::daemon::Control::Stop("again"))
        .await
        .unwrap();
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
    tx.send(crate::daemon::Control::Drain("test"))
        .await
        .unwrap();
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
            state: TriggerState::Pending,
            node: None,
            token: None,
            detail: None,
        })
        .await
        .unwrap();
    rig.shared.draining.cancel();
    let jobs: HashMap<String, Arc<Job>> = [("job".to_string(), rig.job.clone())].into();
    crate::daemon::fleet::poll_triggers(rig.shared.clone(), jobs).await;
    rig.settle().await;
    let t = rig.store.trigger("t1").await.unwrap().unwrap();
    assert_eq!(t.state, TriggerState::Pending);
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

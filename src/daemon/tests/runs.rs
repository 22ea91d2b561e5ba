//! A run and what follows it: its history row, pauses, triggers (manual
//! runs), retries of a failed run.

use super::*;

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
    assert_eq!((r.scheduled_at, r.token), (Some(at()), Token::new(1)));
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
        state: TriggerState::Pending,
        node: None,
        token: None,
        detail: None,
    };
    rig.store.request_trigger(&request("t1")).await.unwrap();
    let jobs: HashMap<String, Arc<Job>> = [("job".to_string(), rig.job.clone())].into();
    crate::daemon::fleet::poll_triggers(rig.shared.clone(), jobs.clone()).await;
    // A second daemon polling now finds nothing pending.
    crate::daemon::fleet::poll_triggers(rig.shared.clone(), jobs.clone()).await;
    rig.settle().await;
    let t = rig.store.trigger("t1").await.unwrap().unwrap();
    assert_eq!(
        (t.state.clone(), t.node.as_deref(), t.token),
        (TriggerState::Ended, Some("node-a"), Some(Token::new(1)))
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
    crate::daemon::fleet::poll_triggers(rig.shared.clone(), jobs).await;
    rig.settle().await;
    let t = rig.store.trigger("t2").await.unwrap().unwrap();
    assert_eq!(t.state, TriggerState::Refused);
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
            state: TriggerState::Pending,
            node: None,
            token: None,
            detail: None,
        })
        .await
        .unwrap();
    let jobs: HashMap<String, Arc<Job>> = [("job".to_string(), rig.job.clone())].into();
    crate::daemon::fleet::poll_triggers(rig.shared.clone(), jobs).await;
    let trigger = || async { rig.store.trigger("t1").await.unwrap().unwrap() };
    tokio::time::sleep(ms(100)).await;
    let t = trigger().await;
    assert_eq!(
        (t.state.clone(), t.token, t.detail.as_deref()),
        (
            TriggerState::Started,
            Some(Token::new(1)),
            Some("attempt 1 of 3")
        )
    );
    // The first attempt failed at 2 s; its retry starts at 3 s.
    tokio::time::sleep(ms(2_400)).await;
    let t = trigger().await;
    assert_eq!(
        (t.state.clone(), t.token),
        (TriggerState::Started, Some(Token::new(1)))
    );
    assert_eq!(rig.store.run_rows()[0].outcome.as_str(), "failed");
    tokio::time::sleep(ms(1_000)).await;
    let t = trigger().await;
    assert_eq!(
        (t.state.clone(), t.token, t.detail.as_deref()),
        (
            TriggerState::Started,
            Some(Token::new(2)),
            Some("attempt 2 of 3")
        )
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
    assert_eq!(
        (t.state.clone(), t.token),
        (TriggerState::Ended, Some(Token::new(3)))
    );
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
            state: TriggerState::Pending,
            node: None,
            token: None,
            detail: None,
        })
        .await
        .unwrap();
    let jobs: HashMap<String, Arc<Job>> = [("job".to_string(), rig.job.clone())].into();
    crate::daemon::fleet::poll_triggers(rig.shared.clone(), jobs).await;
    tokio::time::sleep(ms(100)).await;
    let t = rig.store.trigger("t1").await.unwrap().unwrap();
    assert_eq!(t.state, TriggerState::Started);
    // The next two fleet calls (the run's end is `FinishRun`): the
    // trigger's end, twice.
    rig.store.fault(Op::Fleet, Fault::Fail, 2);
    rig.settle().await;
    rig.store.heal();
    let t = rig.store.trigger("t1").await.unwrap().unwrap();
    assert_eq!(
        (t.state.clone(), t.token),
        (TriggerState::Ended, Some(Token::new(1)))
    );
    assert_eq!(rig.store.run_rows()[0].outcome.as_str(), "succeeded");
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
        .map(|r| (r.trigger.as_str(), r.scheduled_at, r.token.get()))
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
    assert_eq!(rig.store.run_rows()[0].outcome.as_str(), "lease_lost");
}

//! The whole daemon in-process: start, the store's readiness, history
//! pruning, outages.

use super::*;

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
    let settings = crate::daemon::Settings {
        node: crate::domain::NodeId::parse("node-a").unwrap(),
        max_running: None,
        jobs: vec![Arc::new(every_10s("a"))],
        store: Arc::new(rig.store.clone()),
        child_env: Default::default(),
        records: None,
        store_display: "memory".into(),
        store_scope: "host",
        config_display: "none".into(),
        watchdog: None,
        history: Default::default(),
        shutdown_grace: Duration::ZERO,
        metrics: true,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let daemon = tokio::spawn(crate::daemon::serve(
        settings,
        rx,
        rig.shared.supervisor.clone(),
        rig.shared.clock,
    ));
    tokio::time::sleep(ms(25_000)).await;
    tx.send(crate::daemon::Control::Reload(Ok(vec![
        Arc::new(every_10s("a")),
        Arc::new(every_10s("b")),
    ])))
    .await
    .unwrap();
    // 31 s: "a" and "b" of 30 s are running (2 s each).
    tokio::time::sleep(ms(6_000)).await;
    tx.send(crate::daemon::Control::Stop("test")).await.unwrap();
    tokio::time::timeout(LIMIT, daemon)
        .await
        .expect("the daemon stops")
        .unwrap();
    let stopped_at = Instant::now() - rig.t0;

    let mut runs: Vec<_> = rig
        .launcher
        .started()
        .iter()
        .map(|j| (j.started() - rig.t0, j.resource.clone(), j.token.get()))
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
    crate::daemon::await_store(&ready, &store, &CancellationToken::new()).await;
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
    let waiting = crate::daemon::await_store(&ready, &store, &stop);
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
    let settings = crate::daemon::Settings {
        node: crate::domain::NodeId::parse("node-a").unwrap(),
        max_running: None,
        jobs: vec![Arc::new(job)],
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
        metrics: true,
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let daemon = tokio::spawn(crate::daemon::serve(
        settings,
        rx,
        rig.shared.supervisor.clone(),
        rig.shared.clock,
    ));
    tokio::time::sleep(ms(59_000)).await;
    assert_eq!(rig.store.run_rows().len(), 6, "six runs before the prune");
    tokio::time::sleep(ms(3_000)).await;
    tx.send(crate::daemon::Control::Stop("test")).await.unwrap();
    tokio::time::timeout(LIMIT, daemon)
        .await
        .expect("the daemon stops")
        .unwrap();
    let kept: Vec<i64> = rig.store.run_rows().iter().map(|r| r.token.get()).collect();
    assert_eq!(kept, [5, 6], "the two newest of six");
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
    tx.send(crate::daemon::Control::Stop("test")).await.unwrap();
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
            "{job}: the count of the outage's failures: {available:?}, logged: {failed:?}"
        );
        let took: u64 = available[0].get("duration_ms").parse().unwrap();
        assert!(took >= 9_000, "{job}: the outage lasted {took} ms");
    }
}

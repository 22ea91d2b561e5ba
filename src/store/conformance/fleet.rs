//! Operating the fleet: pauses honoured by the acquire itself and refused
//! twice, triggers claimed once.

use super::kit::*;
use super::Subject;
use crate::store::*;

/// A pause is honoured by the scheduled acquire itself: every caller is
/// refused, exactly one per instant is told it was first, nothing is
/// written to the lease, also for a resource never leased; a manual run
/// still wins; an expired pause and a resumed job are not honoured.
async fn case_pause_is_honoured_by_the_acquire(subject: Subject) {
    let s = subject.store.as_ref();
    let (r, job) = (resource("paused"), unique("job"));
    let now = s.now().await.unwrap();
    let t = StoreTime(now.0 / 1000 * 1000 - 60_000);
    let pause = PauseInfo {
        job: job.clone(),
        note: Some("maintenance window".into()),
        since: now,
        until: None,
        paused_by: "ops@host".into(),
    };
    assert_eq!(s.pause(&pause, false).await.unwrap(), None);
    assert!(s.pauses(now).await.unwrap().contains(&pause));
    let first = acquire_run(s, &r, &job, OwnerId::fresh(), Some(t), StartedBy::Schedule).await;
    assert_eq!(
        first,
        AcquireOutcome::Paused {
            note: Some("maintenance window".into()),
            until: None,
            first: true
        },
        "a resource never leased"
    );
    let second = acquire_run(s, &r, &job, OwnerId::fresh(), Some(t), StartedBy::Schedule).await;
    assert!(
        matches!(second, AcquireOutcome::Paused { first: false, .. }),
        "{second:?}"
    );
    let retry = acquire_run(s, &r, &job, OwnerId::fresh(), None, StartedBy::Retry).await;
    assert!(
        matches!(retry, AcquireOutcome::Paused { first: false, .. }),
        "a retry honours the pause: {retry:?}"
    );
    assert!(runs_of(s, &job).await.is_empty());
    // A manual run is not held back by the pause.
    let m = acquired(
        acquire_run(s, &r, &job, OwnerId::fresh(), None, StartedBy::Manual).await,
        "manual",
    );
    must_release(s, &m).await;
    let before = row(s, &r).await;
    let t2 = StoreTime(t.0 + 1_000);
    let next = acquire_run(s, &r, &job, OwnerId::fresh(), Some(t2), StartedBy::Schedule).await;
    assert!(
        matches!(next, AcquireOutcome::Paused { first: true, .. }),
        "the next instant is noted once again: {next:?}"
    );
    assert_eq!(
        row(s, &r).await,
        before,
        "a paused acquire leaves the lease alone"
    );

    assert!(s.resume(&job).await.unwrap());
    assert!(!s.resume(&job).await.unwrap(), "resumed already");
    acquired(
        acquire_run(s, &r, &job, OwnerId::fresh(), Some(t2), StartedBy::Schedule).await,
        "resumed",
    );

    // A pause that ended is neither listed nor honoured.
    let (r3, job3) = (resource("pause-ended"), unique("job"));
    let ended = PauseInfo {
        job: job3.clone(),
        until: Some(StoreTime(now.0 - 1)),
        ..pause
    };
    assert_eq!(s.pause(&ended, false).await.unwrap(), None);
    assert!(!s.pauses(now).await.unwrap().iter().any(|p| p.job == job3));
    acquired(
        acquire_run(
            s,
            &r3,
            &job3,
            OwnerId::fresh(),
            Some(t),
            StartedBy::Schedule,
        )
        .await,
        "pause over",
    );
}

/// A second pause is refused while the first is in force, atomically in
/// the store, and answers the pause in force unchanged; `replace` writes
/// over it; a timed pause that ended is no pause and is written over; two
/// pauses at once: exactly one is written.
async fn case_pause_twice_is_refused_unless_replaced(subject: Subject) {
    let s = subject.store.as_ref();
    let job = unique("job");
    let now = s.now().await.unwrap();
    let first = PauseInfo {
        job: job.clone(),
        note: Some("disk swap".into()),
        since: now,
        until: Some(StoreTime(now.0 + 3_600_000)),
        paused_by: "alice@host".into(),
    };
    assert_eq!(s.pause(&first, false).await.unwrap(), None, "first");
    let second = PauseInfo {
        note: None,
        since: StoreTime(now.0 + 1),
        until: None,
        paused_by: "bob@host".into(),
        ..first.clone()
    };
    assert_eq!(
        s.pause(&second, false).await.unwrap(),
        Some(first.clone()),
        "refused, naming the pause in force"
    );
    assert!(s.pauses(now).await.unwrap().contains(&first), "unchanged");
    assert_eq!(s.pause(&second, true).await.unwrap(), None, "replaced");
    let listed = s.pauses(StoreTime(now.0 + 1)).await.unwrap();
    assert!(listed.contains(&second), "{listed:?}");
    assert!(!listed.contains(&first));
    // Refused by an indefinite pause as well, repeatedly.
    let third = PauseInfo {
        paused_by: "carol@host".into(),
        since: StoreTime(now.0 + 2),
        ..second.clone()
    };
    assert_eq!(s.pause(&third, false).await.unwrap(), Some(second.clone()));

    // A timed pause that ended (at or before the new pause's time) is
    // replaced without `replace`.
    let job2 = unique("job");
    let ended = PauseInfo {
        job: job2.clone(),
        until: Some(now),
        ..first.clone()
    };
    assert_eq!(s.pause(&ended, false).await.unwrap(), None);
    let after = PauseInfo {
        job: job2.clone(),
        note: Some("again".into()),
        since: now,
        until: None,
        paused_by: "bob@host".into(),
    };
    assert_eq!(s.pause(&after, false).await.unwrap(), None, "ended");
    assert!(s.pauses(now).await.unwrap().contains(&after));

    // Two at once: exactly one wins, the other names the winner.
    let job3 = unique("job");
    let racer = |by: &str| PauseInfo {
        job: job3.clone(),
        note: Some(by.to_string()),
        since: now,
        until: None,
        paused_by: by.to_string(),
    };
    let (a, b) = (racer("a@host"), racer("b@host"));
    let (ra, rb) = tokio::join!(s.pause(&a, false), s.pause(&b, false));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    match (&ra, &rb) {
        (None, Some(w)) => assert_eq!(*w, a),
        (Some(w), None) => assert_eq!(*w, b),
        other => panic!("exactly one pause is written: {other:?}"),
    }
}

/// Triggers: exactly one claim succeeds; a claimed trigger cannot be
/// withdrawn, a pending one can; old ones are pruned.
async fn case_triggers_are_claimed_once(subject: Subject) {
    let s = subject.store.as_ref();
    let now = s.now().await.unwrap();
    let request = |id: &str| TriggerInfo {
        id: id.to_string(),
        job: "job".into(),
        requested_at: now,
        requested_by: "ops@host".into(),
        state: TriggerState::Pending,
        node: None,
        token: None,
        detail: None,
    };
    let (a, b) = (unique("t"), unique("t"));
    s.request_trigger(&request(&a)).await.unwrap();
    s.request_trigger(&request(&b)).await.unwrap();
    let pending = s.pending_triggers().await.unwrap();
    assert!(pending.contains(&request(&a)) && pending.contains(&request(&b)));
    assert!(s.claim_trigger(&a, "node-a").await.unwrap());
    assert!(
        !s.claim_trigger(&a, "node-b").await.unwrap(),
        "claimed once"
    );
    assert!(
        !s.cancel_trigger(&a).await.unwrap(),
        "claimed: not withdrawn"
    );
    s.settle_trigger(&a, TriggerState::Started, Some(Token::new(7)), None)
        .await
        .unwrap();
    let t = s.trigger(&a).await.unwrap().unwrap();
    assert_eq!(
        (t.state.as_str(), t.node.as_deref(), t.token),
        ("started", Some("node-a"), Some(Token::new(7)))
    );
    assert!(!s
        .pending_triggers()
        .await
        .unwrap()
        .iter()
        .any(|t| t.id == a));
    assert!(s.cancel_trigger(&b).await.unwrap());
    assert_eq!(s.trigger(&b).await.unwrap(), None);
    let c = unique("t");
    s.request_trigger(&TriggerInfo {
        requested_at: StoreTime(1),
        ..request(&c)
    })
    .await
    .unwrap();
    assert!(s.prune_fleet(StoreTime(2)).await.unwrap() >= 1);
    assert_eq!(s.trigger(&c).await.unwrap(), None);
    assert!(s.trigger(&a).await.unwrap().is_some(), "newer ones stay");
}

conformance!([
    case_pause_is_honoured_by_the_acquire,
    case_pause_twice_is_refused_unless_replaced,
    case_triggers_are_claimed_once,
]);

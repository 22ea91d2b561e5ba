//! Scheduled occurrences: each taken at most once, only once due and not
//! superseded by the store's clock; a retry by the same owner adopts its own
//! win.

use std::time::Duration;

use super::kit::*;
use super::Subject;
use crate::store::*;

/// Occurrence dedup: an occurrence runs at most once; older and equal ones
/// are refused after release, a newer one while held is Held, a newer one
/// when free wins; refused attempts do not move the fence, and an ad-hoc
/// acquisition does not forget the last occurrence.
async fn case_occurrence_dedup(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("occurrence");
    // All three instants are already due by the store's clock.
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let next = StoreTime(t.0 + 30_000);
    let older = StoreTime(t.0 - 60_000);

    let a = match acquire_at(s, &r, LEASE, Some(t)).await {
        AcquireOutcome::Acquired(l) => l,
        other => panic!("first occurrence: {other:?}"),
    };
    assert_eq!(row(s, &r).await.last_occurrence, Some(t));
    match acquire_at(s, &r, LEASE, Some(next)).await {
        AcquireOutcome::Held { token, .. } => assert_eq!(token, a.token),
        other => panic!("newer occurrence while held: {other:?}"),
    }
    must_release(s, &a).await;

    for occ in [t, older] {
        assert_eq!(
            acquire_at(s, &r, LEASE, Some(occ)).await,
            AcquireOutcome::OccurrenceTaken { last_occurrence: t },
            "occurrence {occ:?} after {t:?} was taken"
        );
    }
    let listed = row(s, &r).await;
    assert_eq!(
        (listed.token, listed.held),
        (a.token, false),
        "refused attempts change nothing"
    );

    let b = match acquire_at(s, &r, LEASE, Some(next)).await {
        AcquireOutcome::Acquired(l) => l,
        other => panic!("newer occurrence when free: {other:?}"),
    };
    assert_eq!(b.token, a.token.next());
    assert_eq!(row(s, &r).await.last_occurrence, Some(next));
    must_release(s, &b).await;

    // An ad-hoc lease (no occurrence) neither needs nor resets it.
    let c = must_acquire(s, &r).await;
    assert_eq!(c.token, b.token.next());
    assert_eq!(row(s, &r).await.last_occurrence, Some(next));
    must_release(s, &c).await;
    assert_eq!(
        acquire_at(s, &r, LEASE, Some(next)).await,
        AcquireOutcome::OccurrenceTaken {
            last_occurrence: next
        }
    );
}

/// An occurrence still in the future by the store's clock is refused as
/// not yet due — on a resource never leased (no row is created), on a free
/// one and on a held one — and changes nothing; once due it is taken. This
/// is what stops a host whose clock runs ahead from taking a later instant
/// before the fleet could take an earlier one.
async fn case_occurrence_not_yet_due(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("not-yet-due");
    let now = s.now().await.unwrap();
    let future = StoreTime(now.0 / 1000 * 1000 + 60_000);
    match acquire_at(s, &r, LEASE, Some(future)).await {
        AcquireOutcome::NotYetDue { store_now } => {
            assert!(store_now >= now && store_now < future, "{store_now:?}")
        }
        other => panic!("future occurrence on a new resource: {other:?}"),
    }
    assert!(
        s.list()
            .await
            .unwrap()
            .iter()
            .all(|l| l.resource != r.as_str()),
        "no row is created for an occurrence that is not due"
    );

    let due = StoreTime(now.0 / 1000 * 1000 - 1_000);
    let a = match acquire_at(s, &r, LEASE, Some(due)).await {
        AcquireOutcome::Acquired(l) => l,
        other => panic!("due occurrence: {other:?}"),
    };
    assert!(matches!(
        acquire_at(s, &r, LEASE, Some(future)).await,
        AcquireOutcome::NotYetDue { .. }
    ));
    must_release(s, &a).await;
    assert!(matches!(
        acquire_at(s, &r, LEASE, Some(future)).await,
        AcquireOutcome::NotYetDue { .. }
    ));
    let listed = row(s, &r).await;
    assert_eq!(
        (listed.token, listed.last_occurrence),
        (a.token, Some(due)),
        "a refused early attempt changes nothing"
    );
}

/// A retry of an occurrence by the same owner adopts that owner's own
/// unreleased win (an earlier attempt that committed after its caller
/// stopped waiting): same token, expiry not earlier, the takeover it made
/// still reported. Another owner, an ad-hoc lease, or the same owner after
/// releasing cannot.
async fn case_retry_adopts_its_own_win(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("adopt");
    let now = s.now().await.unwrap();
    let t = StoreTime(now.0 / 1000 * 1000 - 2_000);
    let next = StoreTime(t.0 + 600_000);
    let me = OwnerId::fresh();

    // A vanished earlier owner, so the first win is a takeover.
    let gone = acquired(
        acquire_at(s, &r, Duration::from_millis(200), None).await,
        "an earlier owner",
    );
    wait_until_store_time(s, gone.expires_at).await;

    let first = acquired(attempt(s, &r, LEASE, me, t, next).await, "first attempt");
    assert_eq!(first.owner_id, me);
    assert_eq!(first.token, gone.token.next());
    assert!(first.taken_over.is_some(), "{first:?}");

    let again = acquired(
        attempt(s, &r, LEASE, me, t, next).await,
        "the retry of the same occurrence by the same owner",
    );
    assert_eq!(again.token, first.token, "adoption keeps the token");
    assert_eq!(again.owner_id, me);
    assert!(again.expires_at >= first.expires_at, "{again:?} {first:?}");
    assert_eq!(
        again.taken_over, first.taken_over,
        "the takeover is still reported"
    );

    // Someone else, for the same occurrence: taken (not adoptable).
    assert_eq!(
        attempt(s, &r, LEASE, OwnerId::fresh(), t, next).await,
        AcquireOutcome::OccurrenceTaken { last_occurrence: t },
        "another owner, same occurrence"
    );
    let listed = row(s, &r).await;
    assert_eq!(
        (listed.token, listed.owner_id.as_str()),
        (first.token, me.to_string().as_str())
    );

    // Released by its owner (the run is over): nothing left to adopt.
    must_release(s, &again).await;
    assert_eq!(
        attempt(s, &r, LEASE, me, t, next).await,
        AcquireOutcome::OccurrenceTaken { last_occurrence: t },
        "a released occurrence is not adopted again"
    );
}

/// Adoption also works once the won lease has expired by the store's clock
/// (nobody took it since): the expiry moves to now + lease.
async fn case_retry_adopts_an_expired_win(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("adopt-expired");
    let now = s.now().await.unwrap();
    let t = StoreTime(now.0 / 1000 * 1000 - 1_000);
    let next = StoreTime(t.0 + 600_000);
    let me = OwnerId::fresh();
    let first = acquired(
        attempt(s, &r, Duration::from_millis(200), me, t, next).await,
        "first attempt",
    );
    wait_until_store_time(s, first.expires_at).await;
    let before = s.now().await.unwrap();
    let again = acquired(attempt(s, &r, LEASE, me, t, next).await, "the retry");
    assert_eq!(again.token, first.token);
    assert!(
        again.expires_at.0 >= before.0 + LEASE.as_millis() as i64,
        "expiry {:?} not at least now {:?} + lease",
        again.expires_at,
        before
    );
    assert!(row(s, &r).await.held);
}

/// An instant whose successor is already due by the store's clock is
/// refused as superseded, on a new resource (no row is created), on a free
/// one and on one this owner could otherwise adopt, and writes nothing: a
/// node whose clock runs behind cannot take an instant the fleet has moved
/// past. Its successor is still taken normally.
async fn case_superseded_occurrence_is_refused(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("superseded");
    let now = s.now().await.unwrap();
    let old = StoreTime(now.0 / 1000 * 1000 - 30_000);
    let due_next = StoreTime(old.0 + 2_000);
    let me = OwnerId::fresh();
    match attempt(s, &r, LEASE, me, old, due_next).await {
        AcquireOutcome::Superseded { store_now } => assert!(store_now >= now, "{store_now:?}"),
        other => panic!("superseded instant on a new resource: {other:?}"),
    }
    assert!(
        s.list()
            .await
            .unwrap()
            .iter()
            .all(|l| l.resource != r.as_str()),
        "no row is created for a superseded instant"
    );

    // The current instant (successor not yet due) is taken.
    let current = StoreTime(now.0 / 1000 * 1000 - 1_000);
    let later = StoreTime(current.0 + 600_000);
    let a = acquired(attempt(s, &r, LEASE, me, current, later).await, "current");
    // The same owner retrying it once its successor is due: refused.
    assert!(matches!(
        attempt(s, &r, LEASE, me, current, StoreTime(current.0 + 1)).await,
        AcquireOutcome::Superseded { .. }
    ));
    must_release(s, &a).await;
    // A free lease and a newer (but superseded) instant: refused, unchanged.
    let newer = StoreTime(current.0 + 500);
    assert!(matches!(
        attempt(
            s,
            &r,
            LEASE,
            OwnerId::fresh(),
            newer,
            StoreTime(newer.0 + 1)
        )
        .await,
        AcquireOutcome::Superseded { .. }
    ));
    let listed = row(s, &r).await;
    assert_eq!(
        (listed.token, listed.held, listed.last_occurrence),
        (a.token, false, Some(current)),
        "a superseded attempt changes nothing"
    );
}

conformance!([
    case_occurrence_dedup,
    case_occurrence_not_yet_due,
    case_retry_adopts_its_own_win,
    case_retry_adopts_an_expired_win,
    case_superseded_occurrence_is_refused,
]);

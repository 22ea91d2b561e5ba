//! The in-memory store keeps the SQL backends' semantics: the cases of
//! `tests/it/store_conformance.rs` that define leases, occurrences, takeovers
//! and fenced writes, run against it on tokio's paused clock (so an expiry
//! is a jump, not a wait), then its injected faults.

use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::epoch_wall;
use super::store::{Commit, Fault, Gate, MemoryStore, Op};
use crate::clock::Clock;
use crate::domain::{LossReason, Stage, StaleReason};
use crate::names::Name;
use crate::store::{
    AcquireOutcome, AcquireRequest, Lease, NewStaleRecord, OwnerId, PutOutcome, PutRequest,
    Refusal, RejectReason, ReleaseOutcome, RenewOutcome, StaleKind, Store, StoreError, StoreTime,
    Takeover,
};

const LEASE: Duration = Duration::from_secs(5);

/// An owner id printed as text (as the cases compare them) back as one.
fn oid(s: &str) -> OwnerId {
    s.parse().expect("owner ids are UUIDs")
}

fn store() -> MemoryStore {
    MemoryStore::new(Clock::following_tokio(epoch_wall()))
}

fn name(s: &str) -> Name {
    Name::parse("resource", s).unwrap()
}

async fn acquire(
    s: &MemoryStore,
    r: &Name,
    owner: OwnerId,
    occ: Option<StoreTime>,
    next: Option<StoreTime>,
) -> AcquireOutcome {
    s.acquire(&AcquireRequest {
        resource: r,
        lease: LEASE,
        node: "node-a",
        owner_id: owner,
        occurrence: occ,
        next_occurrence: next,
        run: None,
    })
    .await
    .expect("the store answers")
}

async fn adhoc(s: &MemoryStore, r: &Name) -> AcquireOutcome {
    acquire(s, r, OwnerId::fresh(), None, None).await
}

fn won(out: AcquireOutcome) -> Lease {
    match out {
        AcquireOutcome::Acquired(l) => l,
        other => panic!("expected to acquire, got {other:?}"),
    }
}

async fn release(s: &MemoryStore, l: &Lease) -> ReleaseOutcome {
    s.release(&name(&l.resource), l.owner_id, l.token)
        .await
        .unwrap()
}

async fn pass(d: Duration) {
    tokio::time::sleep(d).await;
}

fn at(s: &MemoryStore, secs_ago: i64) -> StoreTime {
    StoreTime(s.now_ms() / 1000 * 1000 - secs_ago * 1000)
}

#[tokio::test(start_paused = true)]
async fn tokens_grow_across_release_and_expiry_and_refusals_say_why() {
    let s = store();
    let r = name("r");
    let a = won(adhoc(&s, &r).await);
    assert_eq!(a.token, 1);
    assert_eq!(a.expires_at.0, s.now_ms() + 5_000);
    match adhoc(&s, &r).await {
        AcquireOutcome::Held {
            owner_id, token, ..
        } => assert_eq!((owner_id, token), (a.owner_id, 1)),
        other => panic!("{other:?}"),
    }
    assert_eq!(release(&s, &a).await, ReleaseOutcome::Released);
    assert_eq!(
        release(&s, &a).await,
        ReleaseOutcome::Released,
        "idempotent"
    );
    let b = won(adhoc(&s, &r).await);
    assert_eq!((b.token, b.taken_over.clone()), (2, None));

    pass(LEASE).await;
    let owner_b = b.owner_id.to_string();
    assert_eq!(
        s.renew(&r, oid(&owner_b), 2, LEASE).await.unwrap(),
        RenewOutcome::Refused(Refusal::Expired {
            expired_at: b.expires_at
        })
    );
    let c = won(adhoc(&s, &r).await);
    assert_eq!(c.token, 3);
    assert_eq!(
        c.taken_over,
        Some(Takeover {
            owner_id: b.owner_id,
            node: "node-a".into(),
            token: 2,
            expired_at: b.expires_at
        }),
        "an expired, unreleased lease is a takeover"
    );
    let not_owner = Refusal::NotOwner {
        current_owner: c.owner_id,
        current_token: 3,
    };
    assert_eq!(
        s.renew(&r, oid(&owner_b), 2, LEASE).await.unwrap(),
        RenewOutcome::Refused(not_owner.clone())
    );
    assert_eq!(release(&s, &b).await, ReleaseOutcome::Refused(not_owner));
    pass(Duration::from_secs(1)).await;
    match s.renew(&r, c.owner_id, 3, LEASE).await.unwrap() {
        RenewOutcome::Renewed { expires_at } => assert_eq!(expires_at.0, s.now_ms() + 5_000),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.renew(&name("never"), OwnerId::fresh(), 1, LEASE)
            .await
            .unwrap(),
        RenewOutcome::Refused(Refusal::Missing)
    );
    assert!(s.row("never").is_none(), "a refusal creates no row");
}

#[tokio::test(start_paused = true)]
async fn an_occurrence_is_taken_once_when_due_and_not_superseded() {
    let s = store();
    let r = name("occ");
    let t = at(&s, 60);
    let (next, older) = (StoreTime(t.0 + 30_000), StoreTime(t.0 - 60_000));
    let a = won(acquire(&s, &r, OwnerId::fresh(), Some(t), None).await);
    assert!(matches!(
        acquire(&s, &r, OwnerId::fresh(), Some(next), None).await,
        AcquireOutcome::Held { .. }
    ));
    release(&s, &a).await;
    for occ in [t, older] {
        assert_eq!(
            acquire(&s, &r, OwnerId::fresh(), Some(occ), None).await,
            AcquireOutcome::OccurrenceTaken { last_occurrence: t }
        );
    }
    let b = won(acquire(&s, &r, OwnerId::fresh(), Some(next), None).await);
    assert_eq!(b.token, 2);
    release(&s, &b).await;
    won(adhoc(&s, &r).await);
    assert_eq!(
        s.row("occ").unwrap().last_occurrence,
        Some(next.0),
        "an ad-hoc lease keeps the last occurrence"
    );

    // Not yet due, or superseded, by the store's clock: refused, no row.
    let fresh = name("fresh");
    let future = StoreTime(s.now_ms() + 60_000);
    assert!(matches!(
        acquire(&s, &fresh, OwnerId::fresh(), Some(future), None).await,
        AcquireOutcome::NotYetDue { store_now } if store_now.0 == s.now_ms()
    ));
    let old = at(&s, 30);
    assert!(matches!(
        acquire(
            &s,
            &fresh,
            OwnerId::fresh(),
            Some(old),
            Some(StoreTime(old.0 + 2_000))
        )
        .await,
        AcquireOutcome::Superseded { .. }
    ));
    assert!(s.row("fresh").is_none());
}

#[tokio::test(start_paused = true)]
async fn the_same_owner_adopts_its_own_unreleased_win() {
    let s = store();
    let r = name("adopt");
    let t = at(&s, 2);
    let next = Some(StoreTime(t.0 + 600_000));
    let me = OwnerId::fresh();
    let first = won(acquire(&s, &r, me, Some(t), next).await);
    pass(Duration::from_secs(1)).await;
    let again = won(acquire(&s, &r, me, Some(t), next).await);
    assert_eq!(again.token, first.token);
    assert_eq!(again.expires_at.0, s.now_ms() + 5_000);
    assert_eq!(
        acquire(&s, &r, OwnerId::fresh(), Some(t), next).await,
        AcquireOutcome::OccurrenceTaken { last_occurrence: t },
        "another owner cannot"
    );
    // Expired by the store's clock and taken by nobody since: still adopted.
    pass(LEASE * 2).await;
    assert_eq!(won(acquire(&s, &r, me, Some(t), next).await).token, 1);
    // The same owner, once its successor is due: superseded.
    assert!(matches!(
        acquire(&s, &r, me, Some(t), Some(StoreTime(t.0 + 1))).await,
        AcquireOutcome::Superseded { .. }
    ));
    release(&s, &again).await;
    assert_eq!(
        acquire(&s, &r, me, Some(t), next).await,
        AcquireOutcome::OccurrenceTaken { last_occurrence: t },
        "a released win is not adopted again"
    );
    assert_eq!(
        s.history(Op::Acquire),
        [
            "acquired 1",
            "adopted 1",
            "taken",
            "adopted 1",
            "superseded",
            "taken"
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn giving_back_makes_the_instant_takeable_again() {
    let s = store();
    let r = name("give-back");
    let t = at(&s, 5);
    let next = Some(StoreTime(t.0 + 600_000));
    let late = won(acquire(&s, &r, OwnerId::fresh(), Some(t), next).await);
    let owner = late.owner_id.to_string();
    assert!(matches!(
        s.give_back(&r, OwnerId::fresh(), Some(1), t).await.unwrap(),
        ReleaseOutcome::Refused(Refusal::NotOwner { .. })
    ));
    assert_eq!(
        s.give_back(&r, oid(&owner), Some(1), t).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(s.row("give-back").unwrap().last_occurrence, Some(t.0 - 1));
    assert!(matches!(
        acquire(&s, &r, OwnerId::fresh(), Some(StoreTime(t.0 - 1_000)), None).await,
        AcquireOutcome::OccurrenceTaken { .. }
    ));
    let other = won(acquire(&s, &r, OwnerId::fresh(), Some(t), next).await);
    assert_eq!((other.token, other.taken_over.clone()), (2, None));
    release(&s, &other).await;

    // Without a token: only this owner's unreleased win of this instant.
    let t3 = StoreTime(t.0 + 2_000);
    let ghost = OwnerId::fresh();
    won(acquire(&s, &r, ghost, Some(t3), next).await);
    assert!(matches!(
        s.give_back(&r, ghost, None, t).await.unwrap(),
        ReleaseOutcome::Refused(_)
    ));
    assert_eq!(
        s.give_back(&r, ghost, None, t3).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(matches!(
        s.give_back(&r, ghost, None, t3).await.unwrap(),
        ReleaseOutcome::Refused(_)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_losing_acquire_changes_nothing() {
    let s = store();
    let r = name("loser");
    let t = at(&s, 60);
    won(acquire(&s, &r, OwnerId::fresh(), Some(t), None).await);
    let before = s.row("loser");
    for occ in [
        None,
        Some(StoreTime(t.0 + 1_000)),
        Some(t),
        Some(StoreTime(t.0 + 3_600_000)),
    ] {
        assert!(!matches!(
            acquire(&s, &r, OwnerId::fresh(), occ, None).await,
            AcquireOutcome::Acquired(_)
        ));
        assert_eq!(s.row("loser"), before);
    }
}

#[tokio::test(start_paused = true)]
async fn fenced_writes_compare_tokens_and_record_rejections() {
    let s = store();
    let r = name("put");
    let key = Name::parse("key", "k").unwrap();
    let put = |token, owner_id, once| PutRequest {
        resource: &r,
        key: &key,
        value: b"v",
        token,
        owner_id,
        once,
        node: "node-a",
        job: None,
        stage: Stage::Label("test".into()),
        operation_id: Uuid::new_v4(),
    };
    let nobody = OwnerId::fresh();
    assert!(matches!(
        s.put(&put(1, nobody, false)).await.unwrap(),
        PutOutcome::Rejected(rec) if rec.reason == StaleReason::from(RejectReason::Forged)
    ));
    let a = won(adhoc(&s, &r).await);
    release(&s, &a).await;
    let b = won(adhoc(&s, &r).await);
    let (a_owner, b_owner) = (a.owner_id, b.owner_id);
    for _ in 0..2 {
        assert!(matches!(
            s.put(&put(2, b_owner, false)).await.unwrap(),
            PutOutcome::Accepted { .. }
        ));
    }
    assert_eq!(
        s.put(&put(2, b_owner, true)).await.unwrap(),
        PutOutcome::AlreadyApplied
    );
    for (token, owner, reason) in [(1, a_owner, "stale"), (2, a_owner, "wrong_owner")] {
        match s.put(&put(token, owner, false)).await.unwrap() {
            PutOutcome::Rejected(rec) => {
                assert_eq!((rec.reason.as_str(), rec.accepted_token), (reason, Some(2)))
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(s.get(&r, &key).await.unwrap().unwrap().token, 2);
    let stale = s.stale(None).await.unwrap();
    assert_eq!(stale.len(), 3);
    assert!(stale.iter().all(|x| x.kind == StaleKind::WriteRejected));
}

#[tokio::test(start_paused = true)]
async fn an_advanced_epoch_lifts_every_later_token() {
    let s = store();
    won(adhoc(&s, &name("e1")).await);
    let info = s.advance_epoch().await.unwrap();
    assert_eq!(info.effective, 1);
    assert_eq!(won(adhoc(&s, &name("e2")).await).token, (1 << 32) + 1);
}

#[tokio::test(start_paused = true)]
async fn injected_faults() {
    let s = store();
    let r = name("faults");

    // Fail: nothing written.
    s.fault(Op::Acquire, Fault::Fail, 2);
    for _ in 0..2 {
        let e = s
            .acquire(&AcquireRequest {
                resource: &r,
                lease: LEASE,
                node: "n",
                owner_id: OwnerId::fresh(),
                occurrence: None,
                next_occurrence: None,
                run: None,
            })
            .await
            .unwrap_err();
        assert!(matches!(e, StoreError::Unavailable { .. }), "{e}");
    }
    assert!(s.row("faults").is_none());

    // Hang, committed before: the caller times out after 5 s, the row is won.
    let gate = Gate::new();
    s.fault(Op::Acquire, Fault::Hang(gate.clone(), Commit::Before), 1);
    let start = Instant::now();
    let me = OwnerId::fresh();
    let t = at(&s, 1);
    let e = s
        .acquire(&AcquireRequest {
            resource: &r,
            lease: LEASE,
            node: "n",
            owner_id: me,
            occurrence: Some(t),
            next_occurrence: None,
            run: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Timeout { .. }), "{e}");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    assert_eq!(s.row("faults").unwrap().owner_id, me.to_string());

    // Hang, committed after: the statement runs when the gate opens, also
    // when its caller stopped waiting.
    let r2 = name("late");
    let gate = Gate::new();
    s.fault(Op::Acquire, Fault::Hang(gate.clone(), Commit::After), 1);
    assert!(adhoc_err(&s, &r2).await);
    assert!(s.row("late").is_none());
    pass(Duration::from_secs(10)).await;
    gate.open();
    tokio::task::yield_now().await;
    assert_eq!(s.row("late").unwrap().fence, 1);
    assert_eq!(s.history(Op::Acquire).last().unwrap(), "acquired 1");

    // Without a time limit, a hung call answers when the gate opens.
    let patient = store().with_call_timeout(None);
    let gate = Gate::new();
    patient.fault(Op::Acquire, Fault::Hang(gate.clone(), Commit::Before), 1);
    let opener = tokio::spawn(async move {
        pass(Duration::from_secs(20)).await;
        gate.open();
    });
    let start = Instant::now();
    won(adhoc(&patient, &r).await);
    assert_eq!(start.elapsed(), Duration::from_secs(20));
    opener.await.unwrap();

    // Refused renewals, and a store clock ahead of ours.
    let l = won(adhoc(&s, &name("renew")).await);
    s.fault(Op::Renew, Fault::Refuse, 1);
    assert!(matches!(
        s.renew(&name("renew"), l.owner_id, l.token, LEASE)
            .await
            .unwrap(),
        RenewOutcome::Refused(Refusal::NotOwner { .. })
    ));
    let ours = s.now_ms();
    s.set_offset_ms(30_000);
    assert_eq!(s.now().await.unwrap().0, ours + 30_000);

    // Records of lost leases land in the store.
    let rec = s
        .record_stale(&NewStaleRecord {
            kind: StaleKind::LeaseLost,
            reason: LossReason::RenewRefused.into(),
            resource: "renew",
            key: None,
            owner_id: None,
            token: 1,
            accepted_token: None,
            node: "n",
            job: None,
            stage: Stage::Renew,
            operation_id: "op",
        })
        .await
        .unwrap();
    assert_eq!(rec.at.0, ours + 30_000);
}

/// An ad-hoc acquire that ends in an error.
async fn adhoc_err(s: &MemoryStore, r: &Name) -> bool {
    s.acquire(&AcquireRequest {
        resource: r,
        lease: LEASE,
        node: "n",
        owner_id: OwnerId::fresh(),
        occurrence: None,
        next_occurrence: None,
        run: None,
    })
    .await
    .is_err()
}

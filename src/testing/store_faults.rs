//! What only the in-memory store has: its record of what it did and its
//! injected faults, on tokio's paused clock. Its semantics, the SQL
//! backends', are the conformance suite's (`src/store/conformance/`), which
//! runs every case against it too.

use std::time::Duration;

use super::epoch_wall;
use super::store::{Commit, Fault, Gate, MemoryStore, Op};
use crate::clock::Clock;
use crate::domain::{LossReason, Stage};
use crate::names::Name;
use crate::store::{
    prelude::*, AcquireOutcome, AcquireRequest, Lease, NewStaleRecord, OwnerId, Refusal,
    RenewOutcome, StaleKind, StoreError, StoreTime, Token,
};
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(5);

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

async fn pass(d: Duration) {
    tokio::time::sleep(d).await;
}

fn at(s: &MemoryStore, secs_ago: i64) -> StoreTime {
    StoreTime(s.now_ms() / 1000 * 1000 - secs_ago * 1000)
}

/// What the store did, as `history` tells the in-process tests: each
/// acquire's outcome, an adoption told apart from a new win.
#[tokio::test(start_paused = true)]
async fn history_names_each_acquires_outcome() {
    let s = store();
    let r = name("adopt");
    let t = at(&s, 2);
    let next = Some(StoreTime(t.0 + 600_000));
    let me = OwnerId::fresh();
    let first = won(acquire(&s, &r, me, Some(t), next).await);
    won(acquire(&s, &r, me, Some(t), next).await);
    acquire(&s, &r, OwnerId::fresh(), Some(t), next).await;
    acquire(&s, &r, me, Some(t), Some(StoreTime(t.0 + 1))).await;
    s.release(&r, me, first.token).await.unwrap();
    acquire(&s, &r, me, Some(t), next).await;
    assert_eq!(
        s.history(Op::Acquire),
        ["acquired 1", "adopted 1", "taken", "superseded", "taken"]
    );
    assert_eq!(s.history(Op::Release), ["released 1"]);
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
    assert_eq!(s.row("late").unwrap().fence, Token::new(1));
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
            token: Token::new(1),
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

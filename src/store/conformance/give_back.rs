//! Giving back a win nothing ran under, with or without its token, one at a
//! time or many at once.

use super::kit::*;
use super::Subject;
use crate::names::Name;
use crate::store::*;

/// `give_back`: a lease under which nothing ran goes back with its
/// occurrence, which another owner can then take (a newer token); older
/// instants stay refused. It needs the owner and token, and leaves a
/// later occurrence alone.
async fn case_give_back_leaves_the_instant_runnable(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("give-back");
    let now = s.now().await.unwrap();
    let t = StoreTime(now.0 / 1000 * 1000 - 5_000);
    let next = StoreTime(t.0 + 600_000);
    let late = acquired(
        attempt(s, &r, LEASE, OwnerId::fresh(), t, next).await,
        "late win",
    );
    let owner = late.owner_id.to_string();
    assert!(matches!(
        s.give_back(&r, OwnerId::fresh(), Some(late.token), t)
            .await
            .unwrap(),
        ReleaseOutcome::Refused(Refusal::NotOwner { .. })
    ));
    assert_eq!(
        s.give_back(&r, oid(&owner), Some(late.token), t)
            .await
            .unwrap(),
        ReleaseOutcome::Released
    );
    let listed = row(s, &r).await;
    assert!(!listed.held);
    assert!(listed.last_occurrence < Some(t), "{listed:?}");

    assert_eq!(
        acquire_at(s, &r, LEASE, Some(StoreTime(t.0 - 1_000))).await,
        AcquireOutcome::OccurrenceTaken {
            last_occurrence: StoreTime(t.0 - 1)
        },
        "an older instant is still refused"
    );
    let other = acquired(
        attempt(s, &r, LEASE, OwnerId::fresh(), t, next).await,
        "another node, same instant",
    );
    assert_eq!(other.token, late.token.next());
    assert_eq!(other.taken_over, None, "given back is no takeover");
    must_release(s, &other).await;

    // Giving back an occurrence that is no longer the last one taken
    // leaves the last one alone.
    let t2 = StoreTime(t.0 + 1_000);
    let b = acquired(
        attempt(s, &r, LEASE, OwnerId::fresh(), t2, next).await,
        "t2",
    );
    assert_eq!(
        s.give_back(&r, b.owner_id, Some(b.token), t).await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(row(s, &r).await.last_occurrence, Some(t2));

    // Without a token (an acquire whose answer never came back): only this
    // owner's unreleased win of exactly this occurrence.
    let t3 = StoreTime(t.0 + 2_000);
    let ghost_owner = OwnerId::fresh();
    let ghost = acquired(attempt(s, &r, LEASE, ghost_owner, t3, next).await, "t3");
    for (who, occ) in [(OwnerId::fresh(), t3), (ghost_owner, t2)] {
        assert!(
            matches!(
                s.give_back(&r, who, None, occ).await.unwrap(),
                ReleaseOutcome::Refused(_)
            ),
            "token-less give-back by {who} of {occ:?}"
        );
    }
    assert!(row(s, &r).await.held);
    assert_eq!(
        s.give_back(&r, ghost_owner, None, t3).await.unwrap(),
        ReleaseOutcome::Released
    );
    let listed = row(s, &r).await;
    assert_eq!((listed.token, listed.held), (ghost.token, false));
    assert!(listed.last_occurrence < Some(t3), "{listed:?}");
    // Once released, there is nothing left to give back without a token.
    let again = acquired(
        attempt(s, &r, LEASE, ghost_owner, t3, next).await,
        "t3 again",
    );
    must_release(s, &again).await;
    assert!(matches!(
        s.give_back(&r, ghost_owner, None, t3).await.unwrap(),
        ReleaseOutcome::Refused(_)
    ));
    assert_eq!(row(s, &r).await.last_occurrence, Some(t3));
}

/// `give_back_unseen`: the token-less `give_back` of many (resource,
/// owner, occurrence) at once, answered per item in the request's order:
/// only an owner's unreleased win of exactly that occurrence goes back,
/// with its occurrence and its run row; the rest is left alone.
async fn case_give_back_unseen_sweeps_many_at_once(subject: Subject) {
    let s = subject.store.as_ref();
    let job = unique("sweep");
    let now = s.now().await.unwrap();
    let t = StoreTime(now.0 / 1000 * 1000 - 5_000);
    let next = StoreTime(t.0 + 600_000);
    let rs: Vec<Name> = (0..4).map(|i| resource(&format!("sweep-{i}"))).collect();
    let mut owners = Vec::new();
    for r in &rs {
        let owner = OwnerId::fresh();
        let won = s
            .acquire(&AcquireRequest {
                resource: r,
                lease: LEASE,
                node: NODE,
                owner_id: owner,
                occurrence: Some(t),
                next_occurrence: Some(next),
                run: Some(RunStart {
                    job: &job,
                    started_by: StartedBy::Schedule,
                    scheduled_at: Some(t),
                }),
            })
            .await
            .unwrap();
        owners.push((owner, acquired(won, "ghost")));
    }
    // 0: a ghost; 1: released already; 2: asked for another instant;
    // 3: asked by another owner.
    must_release(s, &owners[1].1).await;
    let items = [
        Unseen {
            resource: &rs[0],
            owner_id: owners[0].0,
            occurrence: t,
        },
        Unseen {
            resource: &rs[1],
            owner_id: owners[1].0,
            occurrence: t,
        },
        Unseen {
            resource: &rs[2],
            owner_id: owners[2].0,
            occurrence: StoreTime(t.0 - 1_000),
        },
        Unseen {
            resource: &rs[3],
            owner_id: OwnerId::fresh(),
            occurrence: t,
        },
    ];
    assert_eq!(
        s.give_back_unseen(&items).await.unwrap(),
        [true, false, false, false]
    );
    let swept = row(s, &rs[0]).await;
    assert!(!swept.held);
    assert!(
        swept.last_occurrence < Some(t),
        "the instant is free again: {swept:?}"
    );
    for r in &rs[2..] {
        let kept = row(s, r).await;
        assert!(kept.held, "{r} is still held");
        assert_eq!(kept.last_occurrence, Some(t));
    }
    let runs = runs_of(s, &job).await;
    assert_eq!(runs.len(), 3, "the swept ghost's run row is gone: {runs:?}");
    assert!(runs.iter().all(|run| run.resource != rs[0].as_str()));
    assert_eq!(
        s.give_back_unseen(&items[..1]).await.unwrap(),
        [false],
        "once given back, there is nothing left to sweep"
    );
    for (_, l) in &owners[2..] {
        must_release(s, l).await;
    }
}

conformance!([
    case_give_back_leaves_the_instant_runnable,
    case_give_back_unseen_sweeps_many_at_once,
]);

//! Renewal, release and takeovers: both match owner id and token, an old owner
//! is refused, an expired unreleased lease is a takeover, `preempt` ends only
//! an earlier instant's lease.

use std::time::Duration;

use super::kit::*;
use super::Subject;
use crate::store::*;

/// Renew keeps the token and owner and returns a later, store-computed
/// expiry; a renew with the right owner but wrong token, or of a resource
/// never leased, is refused.
async fn case_renew_keeps_token(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("renew");
    let a = must_acquire(s, &r).await;
    let owner = a.owner_id.to_string();
    tokio::time::sleep(Duration::from_millis(30)).await;

    let first = match s.renew(&r, oid(&owner), a.token, LEASE).await.unwrap() {
        RenewOutcome::Renewed { expires_at } => expires_at,
        other => panic!("renew: {other:?}"),
    };
    assert!(
        first > a.expires_at,
        "same lease length renewed later must expire later: {first:?} > {:?}",
        a.expires_at
    );
    let second = match s
        .renew(&r, oid(&owner), a.token, Duration::from_secs(60))
        .await
        .unwrap()
    {
        RenewOutcome::Renewed { expires_at } => expires_at,
        other => panic!("renew: {other:?}"),
    };
    assert!(
        second.0 >= first.0 + 55_000,
        "a longer lease: {second:?} vs {first:?}"
    );
    let listed = row(s, &r).await;
    assert_eq!(
        (
            listed.owner_id.as_str(),
            listed.token,
            listed.expires_at,
            listed.held
        ),
        (owner.as_str(), a.token, second, true),
        "renew keeps token and owner"
    );

    // Right owner, wrong token: refused, lease untouched.
    assert_eq!(
        s.renew(&r, oid(&owner), a.token.next(), LEASE)
            .await
            .unwrap(),
        RenewOutcome::Refused(Refusal::NotOwner {
            current_owner: oid(&owner),
            current_token: a.token,
        })
    );
    assert_eq!(
        s.release(&r, oid(&owner), a.token.next()).await.unwrap(),
        ReleaseOutcome::Refused(Refusal::NotOwner {
            current_owner: oid(&owner),
            current_token: a.token,
        })
    );
    assert_eq!(row(s, &r).await.expires_at, second);

    // Never leased.
    let never = resource("never");
    assert_eq!(
        s.renew(&never, oid(&owner), Token::new(1), LEASE)
            .await
            .unwrap(),
        RenewOutcome::Refused(Refusal::Missing)
    );
    assert_eq!(
        s.release(&never, oid(&owner), Token::new(1)).await.unwrap(),
        ReleaseOutcome::Refused(Refusal::Missing)
    );
    assert!(
        s.list()
            .await
            .unwrap()
            .iter()
            .all(|l| l.resource != never.as_str()),
        "a refused renew/release must not create a row"
    );
}

/// After a release and a new acquisition, the old owner's renew and release
/// (and mixes of old/new owner id and token) are refused and leave the new
/// owner's lease intact.
async fn case_old_owner_refused(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("old-owner");
    let a = must_acquire(s, &r).await;
    must_release(s, &a).await;
    let b = must_acquire(s, &r).await;
    let (a_owner, b_owner) = (a.owner_id.to_string(), b.owner_id.to_string());
    let not_owner = Refusal::NotOwner {
        current_owner: oid(&b_owner),
        current_token: b.token,
    };
    for (owner, token) in [
        (&a_owner, a.token),
        (&a_owner, b.token),
        (&b_owner, a.token),
    ] {
        assert_eq!(
            s.renew(&r, oid(owner), token, Duration::from_secs(300))
                .await
                .unwrap(),
            RenewOutcome::Refused(not_owner.clone()),
            "renew as {owner}/{token}"
        );
        assert_eq!(
            s.release(&r, oid(owner), token).await.unwrap(),
            ReleaseOutcome::Refused(not_owner.clone()),
            "release as {owner}/{token}"
        );
    }
    let listed = row(s, &r).await;
    assert_eq!(listed.owner_id, b_owner);
    assert_eq!(listed.token, b.token);
    assert_eq!(
        listed.expires_at, b.expires_at,
        "the new owner's expiry is untouched"
    );
    assert!(listed.held, "the new owner still holds the lease");
    // And the new owner can still renew it.
    assert!(matches!(
        s.renew(&r, oid(&b_owner), b.token, LEASE).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
}

/// A lease given back is no takeover: not after a release, not after a
/// release that came late (the lease had already expired, but its owner
/// gave it up itself), and not the first acquisition of a resource. Nor do
/// losing attempts on a released row (occurrence taken, not yet due) make
/// the next winner report one. `lease acquire --json` has no `taken_over`.
async fn case_release_is_no_takeover(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("no-takeover");
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let a = acquired(acquire_as(s, &r, "node-a", Some(t)).await, "first");
    assert_eq!(a.taken_over, None, "a first acquisition");
    must_release(s, &a).await;
    // Losers on the released row.
    assert!(matches!(
        acquire_as(s, &r, "node-x", Some(t)).await,
        AcquireOutcome::OccurrenceTaken { .. }
    ));
    let future = StoreTime(t.0 + 3_600_000);
    assert!(matches!(
        acquire_as(s, &r, "node-x", Some(future)).await,
        AcquireOutcome::NotYetDue { .. }
    ));
    let b = acquired(
        acquire_as(s, &r, "node-b", Some(StoreTime(t.0 + 1_000))).await,
        "after release",
    );
    assert_eq!(b.taken_over, None, "after a release");
    assert!(
        serde_json::to_value(&b)
            .unwrap()
            .get("taken_over")
            .is_none(),
        "no taken_over key without a takeover"
    );

    // Released only after it had expired: still given back by its owner.
    wait_until_store_time(s, b.expires_at).await;
    must_release(s, &b).await;
    let c = acquired(
        acquire_as(s, &r, "node-c", None).await,
        "after a late release",
    );
    assert_eq!(c.taken_over, None, "after a late release");
    assert_eq!(c.token, b.token.next());
}

/// A lease that expired without being released is taken over, and the
/// winner learns the vanished owner: its owner id, node, token and the
/// store-clock expiry it had (the renewed one). The vanished owner's late
/// release is refused. A takeover of a takeover names the latest owner.
async fn case_expiry_is_a_takeover(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("takeover");
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let a = acquired(acquire_as(s, &r, "node-a", Some(t)).await, "a");
    let renewed = match s.renew(&r, a.owner_id, a.token, LEASE).await.unwrap() {
        RenewOutcome::Renewed { expires_at } => expires_at,
        other => panic!("renew: {other:?}"),
    };
    wait_until_store_time(s, renewed).await;
    let b = acquired(
        acquire_as(s, &r, "node-b", Some(StoreTime(t.0 + 1_000))).await,
        "b after a expired",
    );
    let expected = Takeover {
        owner_id: a.owner_id,
        node: "node-a".to_string(),
        token: a.token,
        expired_at: renewed,
    };
    assert_eq!(b.taken_over.as_ref(), Some(&expected));
    assert_eq!(b.token, a.token.next());
    let json = serde_json::to_value(&b).unwrap();
    assert_eq!(json["taken_over"]["token"], a.token.get(), "{json}");
    assert_eq!(json["taken_over"]["node"], "node-a", "{json}");
    // The vanished owner comes back too late.
    assert!(matches!(
        s.release(&r, a.owner_id, a.token).await.unwrap(),
        ReleaseOutcome::Refused(Refusal::NotOwner { .. })
    ));

    // b vanishes too (ad hoc this time): c takes over from b, not from a.
    wait_until_store_time(s, b.expires_at).await;
    let c = acquired(acquire_as(s, &r, "node-c", None).await, "c after b expired");
    assert_eq!(
        c.taken_over,
        Some(Takeover {
            owner_id: b.owner_id,
            node: "node-b".to_string(),
            token: b.token,
            expired_at: b.expires_at,
        })
    );
    must_release(s, &c).await;
    let d = acquired(
        acquire_as(s, &r, "node-d", None).await,
        "d after c released",
    );
    assert_eq!(d.taken_over, None);
}

/// `overlap = "replace"`: `preempt` ends only the generation it names, and
/// only when that generation was not taken for the instant (or a later
/// one). The next acquire for the instant then takes the lease over with
/// the next token and names the replaced owner, whose renewal and release
/// are refused from then on; a released or expired lease is not preempted.
async fn case_preempt_ends_only_an_earlier_instants_lease(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("preempt");
    let t1 = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let t2 = StoreTime(t1.0 + 30_000);
    let a = acquired(acquire_as(s, &r, "node-a", Some(t1)).await, "a for t1");
    assert!(!s.preempt(&r, a.token, t1).await.unwrap(), "same instant");
    assert!(
        !s.preempt(&r, a.token.next(), t2).await.unwrap(),
        "another generation"
    );
    assert!(row(s, &r).await.held, "nothing ended yet");
    assert!(
        s.preempt(&r, a.token, t2).await.unwrap(),
        "an earlier instant"
    );
    assert!(!row(s, &r).await.held, "the generation ended");
    assert!(
        !s.preempt(&r, a.token, t2).await.unwrap(),
        "an ended generation is not ended again"
    );
    let b = acquired(acquire_as(s, &r, "node-b", Some(t2)).await, "b for t2");
    assert_eq!(b.token, a.token.next(), "the next token");
    let replaced = b.taken_over.as_ref().expect("b names whom it replaced");
    assert_eq!(
        (
            replaced.owner_id.as_str(),
            replaced.node.as_str(),
            replaced.token
        ),
        (a.owner_id.as_str(), "node-a", a.token)
    );
    assert!(matches!(
        s.renew(&r, a.owner_id, a.token, LEASE).await.unwrap(),
        RenewOutcome::Refused(Refusal::NotOwner { current_token, .. }) if current_token == b.token
    ));
    assert!(matches!(
        s.release(&r, a.owner_id, a.token).await.unwrap(),
        ReleaseOutcome::Refused(Refusal::NotOwner { .. })
    ));
    // An ad-hoc holder (a manual run) is an earlier instant's too.
    must_release(s, &b).await;
    let c = acquired(acquire_as(s, &r, "node-c", None).await, "ad hoc");
    let t3 = StoreTime(t2.0 + 10_000);
    assert!(s.preempt(&r, c.token, t3).await.unwrap(), "ad-hoc holder");
    let d = acquired(acquire_as(s, &r, "node-d", Some(t3)).await, "d for t3");
    assert_eq!(d.token, c.token.next());
    // Released: nothing to end.
    must_release(s, &d).await;
    assert!(!s
        .preempt(&r, d.token, StoreTime(t3.0 + 1_000))
        .await
        .unwrap());
}

conformance!([
    case_renew_keeps_token,
    case_old_owner_refused,
    case_release_is_no_takeover,
    case_expiry_is_a_takeover,
    case_preempt_ends_only_an_earlier_instants_lease,
]);

//! Epochs of tokens (failover): an advance makes every later token greater
//! than every earlier one.

use super::kit::*;
use super::Subject;
use crate::store::*;

/// `advance_epoch` makes every later token greater than every earlier one:
/// for a resource leased before, for one never leased, and for the next
/// generation of a lease held across the advance (which itself keeps its
/// token: its owner can still renew and write). Within an epoch tokens
/// count up by one. Runs on a database of its own (the epoch is store-wide).
async fn case_epoch_advance(subject: Subject) {
    let s = subject.store.as_ref();
    let start = s.epoch().await.expect("epoch reaches the store");
    assert_eq!(start.highest_token, None, "a fresh database: {start:?}");
    assert_eq!(start.lowest_token, first_token_of(start.effective));
    let (r, ls) = generations(s, "epoch", 3).await;
    let first = start.lowest_token;
    assert_eq!(
        ls.iter().map(|l| l.token).collect::<Vec<_>>(),
        vec![first, first.next(), first.next().next()],
        "tokens count up from the epoch's first token"
    );
    let held_r = resource("epoch-held");
    let held = must_acquire(s, &held_r).await;
    let mut earlier: Vec<Token> = ls.iter().map(|l| l.token).collect();
    earlier.push(held.token);
    let highest = *earlier.iter().max().unwrap();
    assert_eq!(s.epoch().await.unwrap().highest_token, Some(highest));

    let adv = s.advance_epoch().await.expect("advance reaches the store");
    assert_eq!(
        adv.effective,
        start.effective.max(highest.get() >> 32) + 1,
        "{start:?} -> {adv:?}"
    );
    assert_eq!(adv.stored, start.stored + 1);
    assert_eq!(adv.timeline, start.timeline);
    assert_eq!(adv.lowest_token, first_token_of(adv.effective));
    assert!(adv.lowest_token > highest, "{adv:?} vs {highest}");
    assert_eq!(s.epoch().await.unwrap(), adv, "show agrees with advance");

    let next = must_acquire(s, &r).await;
    let never = must_acquire(s, &resource("epoch-never")).await;
    for t in &earlier {
        assert!(
            next.token > *t,
            "resource leased before: {} > {t}",
            next.token
        );
        assert!(
            never.token > *t,
            "resource never leased: {} > {t}",
            never.token
        );
    }
    assert_eq!(next.token, adv.lowest_token);
    assert_eq!(never.token, adv.lowest_token);

    // The lease held across the advance keeps its token.
    let held_owner = held.owner_id.to_string();
    assert!(matches!(
        s.renew(&held_r, oid(&held_owner), held.token, LEASE)
            .await
            .unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    let k = name("key", "k");
    assert_accepted(
        &Put::new(&held_r, &k, b"held", held.token, &held_owner)
            .send(s)
            .await,
        "the held generation writes after the advance",
    );
    must_release(s, &held).await;
    let after_held = must_acquire(s, &held_r).await;
    let after_held_owner = after_held.owner_id.to_string();
    assert_eq!(after_held.token, adv.lowest_token);
    assert_accepted(
        &Put::new(&held_r, &k, b"new", after_held.token, &after_held_owner)
            .send(s)
            .await,
        "the next generation",
    );
    let rec = rejection(
        Put::new(&held_r, &k, b"old", held.token, &held_owner)
            .send(s)
            .await,
        "the old generation after the new one wrote",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.accepted_token),
        ("stale", Some(after_held.token))
    );

    // Counting goes on within the new epoch; another advance moves on again.
    must_release(s, &next).await;
    assert_eq!(must_acquire(s, &r).await.token, adv.lowest_token.next());
    let adv2 = s.advance_epoch().await.unwrap();
    assert_eq!(adv2.effective, adv.effective + 1);
    let after = must_acquire(s, &resource("epoch-after")).await;
    assert_eq!(after.token, first_token_of(adv2.effective));
}

conformance!(
    [],
    isolated: [
        case_epoch_advance,
    ]
);

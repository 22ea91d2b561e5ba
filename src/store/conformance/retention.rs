//! Retention and clean-up: pruning stale records and unused values, `forget`,
//! the benchmark's purge.

use std::time::Duration;

use super::kit::*;
use super::Subject;
use crate::names::Name;
use crate::store::*;

/// Retention (`[history] stale`, `values`): `prune_stale` deletes the
/// records made before the cut-off; `prune_values` deletes the values
/// written before it only of resources whose lease was not held since,
/// so a held lease's values stay. Neither touches a lease row: the next
/// token is still greater than every earlier one.
async fn case_retention_prunes_stale_records_and_unused_values(subject: Subject) {
    let s = subject.store.as_ref();
    let k = name("key", "result");
    let start = s.now().await.unwrap();
    // In use: held (a lease far longer than the test).
    let held = resource("kept-held");
    let AcquireOutcome::Acquired(h) = acquire_at(s, &held, Duration::from_secs(600), None).await
    else {
        panic!("acquire {held}");
    };
    let h_owner = h.owner_id.to_string();
    assert_accepted(
        &Put::new(&held, &k, b"held", h.token, &h_owner)
            .send(s)
            .await,
        "held",
    );
    // No longer in use: released after its write.
    let (gone, ls) = generations(s, "pruned-released", 1).await;
    let g_owner = ls[0].owner_id.to_string();
    assert_accepted(
        &Put::new(&gone, &k, b"gone", ls[0].token, &g_owner)
            .send(s)
            .await,
        "released",
    );
    let rec = rejection(
        Put::new(&held, &k, b"forged", h.token.next(), &h_owner)
            .send(s)
            .await,
        "forged",
    );
    let now = s.now().await.unwrap();
    assert_eq!(s.prune_stale(start).await.unwrap(), 0, "none older");
    assert_eq!(s.prune_values(start).await.unwrap(), 0, "none older");
    assert_eq!(stale_of(s, None, &held).await, vec![rec]);

    let cut = StoreTime(now.0 + 1);
    assert!(s.prune_stale(cut).await.unwrap() >= 1);
    assert!(stale_of(s, None, &held).await.is_empty(), "stale pruned");
    assert_eq!(
        s.prune_values(cut).await.unwrap(),
        1,
        "only the unused value"
    );
    assert_eq!(
        value_of(s, &held, &k).await,
        Some((b"held".to_vec(), h.token)),
        "a held lease's value stays"
    );
    assert_eq!(value_of(s, &gone, &k).await, None, "the unused value went");
    // The lease rows and their fences stay: tokens keep growing.
    assert_eq!(row(s, &gone).await.token, ls[0].token);
    let next = must_acquire(s, &gone).await;
    assert!(next.token > ls[0].token, "{next:?} after {:?}", ls[0]);
}

/// `forget` hides a lease row that is not held from `list` until the next
/// acquire, refuses a held one, and keeps the fence: the token issued after
/// it is greater than every token before it.
async fn case_forget_hides_a_free_lease_and_keeps_its_fence(subject: Subject) {
    let s = subject.store.as_ref();
    let listed = |r: &Name| {
        let r = r.to_string();
        async move { s.list().await.unwrap().iter().any(|l| l.resource == r) }
    };
    let (r, ls) = generations(s, "forget", 2).await;
    let held = must_acquire(s, &resource("forget-held")).await;
    let held_r = name("resource", &held.resource);
    // A row acquired in the same millisecond as the forget is shown again
    // (`acquired_at >= forgotten_at`): forget once the store's clock moved
    // on (on the paused clock of MemoryStore it does not by itself).
    let acquired = s.now().await.unwrap();
    wait_until_store_time(s, acquired).await;
    let now = s.now().await.unwrap();
    assert_eq!(s.forget(&held_r, now).await.unwrap(), Some(false), "held");
    assert!(listed(&held_r).await, "a held lease stays listed");
    assert_eq!(
        s.forget(&resource("forget-none"), now).await.unwrap(),
        None,
        "no row"
    );
    assert!(listed(&r).await);
    assert_eq!(s.forget(&r, now).await.unwrap(), Some(true));
    assert!(!listed(&r).await, "forgotten");
    let next = must_acquire(s, &r).await;
    assert!(
        ls.iter().all(|l| next.token > l.token),
        "{next:?} after {ls:?}"
    );
    assert!(listed(&r).await, "listed again once acquired");
}

/// `purge_prefix` deletes the leases, values and stale records of matching
/// resources only: `%`, `_` and `\` in the prefix are literal, and case
/// matters.
async fn case_purge_prefix(subject: Subject) {
    let s = subject.store.as_ref();
    let base = unique("purge");
    let prefix = format!("{base}-a%_\\");
    let doomed = [prefix.clone(), format!("{prefix}z"), format!("{prefix}%")];
    let spared = [
        format!("{base}-aXY\\z"),  // `%_` as wildcards would match
        format!("{base}-a%Y\\z"),  // `_` as a wildcard would match
        format!("{base}-a%_z"),    // `\` dropped would match
        format!("{base}-A%_\\z"),  // case-insensitive matching would match
        format!("{base}-a%_"),     // shorter than the prefix
        format!("x{base}-a%_\\z"), // prefix not at the start
    ];
    let k = name("key", "k");
    for res in doomed.iter().chain(&spared) {
        let r = name("resource", res);
        let l = must_acquire(s, &r).await;
        let owner = l.owner_id.to_string();
        assert_accepted(&Put::new(&r, &k, b"v", l.token, &owner).send(s).await, res);
        rejection(
            Put::new(&r, &k, b"f", l.token.next(), &owner).send(s).await,
            res,
        );
    }
    // The purge is the benchmark's alone: reached through its own open.
    let deleted = subject.purge_prefix(&prefix).await;
    assert_eq!(
        deleted,
        3 * doomed.len() as u64,
        "a lease, a value and a stale record each"
    );

    let leases = s.list().await.unwrap();
    let stale = s.stale(None).await.unwrap();
    for res in &doomed {
        let r = name("resource", res);
        assert!(
            leases.iter().all(|l| &l.resource != res),
            "{res} lease purged"
        );
        assert!(
            stale.iter().all(|x| &x.resource != res),
            "{res} stale purged"
        );
        assert_eq!(value_of(s, &r, &k).await, None, "{res} value purged");
    }
    for res in &spared {
        let r = name("resource", res);
        assert_eq!(
            leases.iter().filter(|l| &l.resource == res).count(),
            1,
            "{res} lease spared"
        );
        assert_eq!(
            stale.iter().filter(|x| &x.resource == res).count(),
            1,
            "{res} stale spared"
        );
        assert_eq!(
            value_of(s, &r, &k).await,
            Some((b"v".to_vec(), Token::new(1))),
            "{res} value spared"
        );
    }
}

conformance!(
    [
        case_forget_hides_a_free_lease_and_keeps_its_fence,
        case_purge_prefix,
    ],
    isolated: [
        case_retention_prunes_stale_records_and_unused_values,
    ]
);

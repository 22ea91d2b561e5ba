//! Fenced writes: only the resource's current token from the owner it was
//! issued to writes; `>=` and `once` semantics per key; races of old writers
//! with the next generation; values round-trip byte for byte.

use std::sync::Arc;

use tokio::sync::Barrier;

use super::kit::*;
use super::Subject;
use crate::names::Name;
use crate::store::*;

/// `>=` semantics within a generation: the current token with its owner id
/// writes a key several times; a newer generation wins; the older one is
/// then stale, on the key the newer one wrote and on a key nobody wrote
/// since (its generation is over, whatever the key holds).
async fn case_put_accepts_equal_token(subject: Subject) {
    let s = subject.store.as_ref();
    let (r, ls) = generations(s, "put-ge", 1).await;
    let k = name("key", "result");
    let owner1 = ls[0].owner_id.to_string();
    assert_eq!(value_of(s, &r, &k).await, None);
    for (value, what) in [(b"a", "first"), (b"b", "again"), (b"c", "third")] {
        assert_accepted(
            &Put::new(&r, &k, value, Token::new(1), &owner1)
                .send(s)
                .await,
            what,
        );
    }
    let v = s.get(&r, &k).await.unwrap().expect("value");
    assert_eq!((v.value.as_slice(), v.token), (&b"c"[..], Token::new(1)));
    assert_eq!(
        v.owner_id.as_ref().map(OwnerId::as_str),
        Some(owner1.as_str())
    );
    assert_eq!(
        (v.resource.as_str(), v.key.as_str()),
        (r.as_str(), "result")
    );

    let l2 = must_acquire(s, &r).await;
    let owner2 = l2.owner_id.to_string();
    assert_accepted(
        &Put::new(&r, &k, b"d", Token::new(2), &owner2).send(s).await,
        "newer generation",
    );
    let rec = rejection(
        Put::new(&r, &k, b"e", Token::new(1), &owner1).send(s).await,
        "older generation",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.accepted_token),
        ("stale", Some(Token::new(2)))
    );
    assert_eq!(
        value_of(s, &r, &k).await,
        Some((b"d".to_vec(), Token::new(2)))
    );
    // A key of the same resource that no newer token wrote: still stale.
    let k2 = name("key", "other");
    let rec = rejection(
        Put::new(&r, &k2, b"x", Token::new(1), &owner1)
            .send(s)
            .await,
        "token 1 on a key never written",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.token, rec.accepted_token),
        ("stale", Token::new(1), Some(Token::new(2)))
    );
    assert_eq!(
        value_of(s, &r, &k2).await,
        None,
        "a stale write creates nothing"
    );
    assert_accepted(
        &Put::new(&r, &k2, b"y", Token::new(2), &owner2)
            .send(s)
            .await,
        "token 2 on that key",
    );
}

/// `once` semantics: with the current token and its owner id, a new key is
/// written, the same token again is AlreadyApplied and changes (and
/// records) nothing, a greater one is accepted, an older one is stale. Only
/// the current token of its owner can be "already applied": once a newer
/// generation exists, the older one's retry is stale, and another owner's
/// id is refused.
async fn case_put_once(subject: Subject) {
    let s = subject.store.as_ref();
    let (r, ls) = generations(s, "put-once", 1).await;
    let owner1 = ls[0].owner_id.to_string();
    let k = name("key", "applied");
    assert_accepted(
        &Put::new(&r, &k, b"first", Token::new(1), &owner1)
            .once()
            .send(s)
            .await,
        "new key",
    );
    let before = s.get(&r, &k).await.unwrap().expect("value");
    assert_eq!(
        Put::new(&r, &k, b"second", Token::new(1), &owner1)
            .once()
            .send(s)
            .await,
        PutOutcome::AlreadyApplied
    );
    let after = s.get(&r, &k).await.unwrap().expect("value");
    assert_eq!(before, after, "already applied changes nothing");
    assert!(
        stale_of(s, None, &r).await.is_empty(),
        "already applied is not a rejection"
    );

    let l2 = must_acquire(s, &r).await;
    let owner2 = l2.owner_id.to_string();
    let rec = rejection(
        Put::new(&r, &k, b"retry", Token::new(1), &owner1)
            .once()
            .send(s)
            .await,
        "older, once, its own token still on the key",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.accepted_token),
        ("stale", Some(Token::new(2)))
    );
    assert_accepted(
        &Put::new(&r, &k, b"third", Token::new(2), &owner2)
            .once()
            .send(s)
            .await,
        "greater",
    );
    assert_eq!(
        value_of(s, &r, &k).await,
        Some((b"third".to_vec(), Token::new(2)))
    );
    let rec = rejection(
        Put::new(&r, &k, b"x", Token::new(1), &owner1)
            .once()
            .send(s)
            .await,
        "older, once",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.accepted_token),
        ("stale", Some(Token::new(2)))
    );
    assert_eq!(
        Put::new(&r, &k, b"y", Token::new(2), &owner2)
            .once()
            .send(s)
            .await,
        PutOutcome::AlreadyApplied
    );
    let rec = rejection(
        Put::new(&r, &k, b"z", Token::new(2), &owner1)
            .once()
            .send(s)
            .await,
        "the current token with another owner id, once",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.accepted_token),
        ("wrong_owner", Some(Token::new(2)))
    );
    assert_eq!(
        value_of(s, &r, &k).await,
        Some((b"third".to_vec(), Token::new(2)))
    );
    assert_eq!(stale_of(s, None, &r).await.len(), 3);
}

/// A token greater than the resource's fence, or any token for a resource
/// never leased, is rejected as forged, recorded, and changes nothing.
async fn case_put_forged(subject: Subject) {
    let s = subject.store.as_ref();
    let (r, ls) = generations(s, "forged", 2).await;
    let owner = ls[1].owner_id.to_string();
    let k = name("key", "k");
    let rec = rejection(
        Put::new(&r, &k, b"f", Token::new(3), &owner).send(s).await,
        "fence+1 on new key",
    );
    assert_eq!((rec.reason.as_str(), rec.accepted_token), ("forged", None));
    assert_eq!(
        value_of(s, &r, &k).await,
        None,
        "a forged write creates nothing"
    );
    assert_accepted(
        &Put::new(&r, &k, b"ok", Token::new(2), &owner).send(s).await,
        "the fence itself",
    );
    for (token, once) in [(3, false), (3, true), (i64::MAX, false)] {
        let token = Token::new(token);
        let rec = rejection(
            Put::new(&r, &k, b"f", token, &owner)
                .once_if(once)
                .send(s)
                .await,
            "forged",
        );
        assert_eq!(
            (rec.reason.as_str(), rec.token, rec.accepted_token),
            ("forged", token, Some(Token::new(2)))
        );
    }
    assert_eq!(
        value_of(s, &r, &k).await,
        Some((b"ok".to_vec(), Token::new(2)))
    );
    assert_eq!(stale_of(s, None, &r).await.len(), 4);

    let never = resource("never-leased");
    for token in [Token::new(1), Token::new(2)] {
        let rec = rejection(
            Put::new(&never, &k, b"f", token, &owner).send(s).await,
            "never leased",
        );
        assert_eq!(rec.reason.as_str(), "forged");
    }
    assert_eq!(value_of(s, &never, &k).await, None);
    assert_eq!(stale_of(s, None, &never).await.len(), 2);
}

/// The current token with an owner id it was not issued to is refused as
/// `wrong_owner` and recorded with the caller's owner id, before and after
/// the owner wrote, with and without `once`, also after the owner released
/// the lease; the owner's own writes go through.
async fn case_put_wrong_owner(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("wrong-owner");
    let l = must_acquire(s, &r).await;
    let owner = l.owner_id.to_string();
    let foreign = OwnerId::fresh().to_string();
    let k = name("key", "k");
    let rec = rejection(
        Put::new(&r, &k, b"foreign", l.token, &foreign)
            .send(s)
            .await,
        "another owner id, key never written",
    );
    assert_eq!(
        (
            rec.kind,
            rec.reason.as_str(),
            rec.owner_id.as_ref().map(OwnerId::as_str),
            rec.token,
            rec.accepted_token
        ),
        (
            StaleKind::WriteRejected,
            "wrong_owner",
            Some(foreign.as_str()),
            l.token,
            Some(l.token)
        )
    );
    assert_eq!(
        value_of(s, &r, &k).await,
        None,
        "a refused write creates nothing"
    );
    assert_accepted(
        &Put::new(&r, &k, b"mine", l.token, &owner).send(s).await,
        "the owner",
    );
    for once in [false, true] {
        let rec = rejection(
            Put::new(&r, &k, b"foreign", l.token, &foreign)
                .once_if(once)
                .send(s)
                .await,
            "another owner id after the owner wrote",
        );
        assert_eq!(rec.reason.as_str(), "wrong_owner", "once: {once}");
    }
    must_release(s, &l).await;
    rejection(
        Put::new(&r, &k, b"foreign", l.token, &foreign)
            .send(s)
            .await,
        "another owner id after release",
    );
    assert_eq!(value_of(s, &r, &k).await, Some((b"mine".to_vec(), l.token)));
    let recs = stale_of(s, None, &r).await;
    assert_eq!(recs.len(), 4, "every rejection recorded: {recs:?}");
    assert_eq!(recs[0], rec);
    for x in &recs {
        assert_eq!(
            (
                x.reason.as_str(),
                x.owner_id.as_ref().map(OwnerId::as_str),
                x.key.as_deref()
            ),
            ("wrong_owner", Some(foreign.as_str()), Some("k")),
            "{x:?}"
        );
    }
    assert_accepted(
        &Put::new(&r, &k, b"mine again", l.token, &owner)
            .send(s)
            .await,
        "the owner after release",
    );
}

/// Tokens count per resource, so the numbers of two resources overlap: a
/// job writing to another resource with its own owner id and token is
/// refused there and recorded under that resource — `stale` when the number
/// is below that resource's fence (on a key nobody wrote), `wrong_owner`
/// when it equals it — and that resource's owner still writes.
async fn case_put_other_resources_token(subject: Subject) {
    let s = subject.store.as_ref();
    let (b, _) = generations(s, "other-b", 2).await;
    let lb = must_acquire(s, &b).await;
    let b_owner = lb.owner_id.to_string();
    assert_eq!(lb.token, Token::new(3));
    let a = resource("other-a");
    let la = must_acquire(s, &a).await;
    let a_owner = la.owner_id.to_string();
    assert_eq!(la.token, Token::new(1));
    let k = name("key", "result");

    let rec = rejection(
        Put::new(&b, &k, b"from a", la.token, &a_owner)
            .send(s)
            .await,
        "A's token 1 on B (fence 3)",
    );
    assert_eq!(
        (
            rec.reason.as_str(),
            rec.resource.as_str(),
            rec.owner_id.as_ref().map(OwnerId::as_str),
            rec.token,
            rec.accepted_token
        ),
        (
            "stale",
            b.as_str(),
            Some(a_owner.as_str()),
            Token::new(1),
            Some(Token::new(3))
        )
    );

    // A's generations catch up with B's number.
    must_release(s, &la).await;
    let la2 = must_acquire(s, &a).await;
    must_release(s, &la2).await;
    let la3 = must_acquire(s, &a).await;
    let a3_owner = la3.owner_id.to_string();
    assert_eq!(la3.token, lb.token);
    let rec = rejection(
        Put::new(&b, &k, b"from a", la3.token, &a3_owner)
            .send(s)
            .await,
        "A's token 3 on B (fence 3)",
    );
    assert_eq!(
        (
            rec.reason.as_str(),
            rec.resource.as_str(),
            rec.owner_id.as_ref().map(OwnerId::as_str),
            rec.token,
            rec.accepted_token
        ),
        (
            "wrong_owner",
            b.as_str(),
            Some(a3_owner.as_str()),
            Token::new(3),
            Some(Token::new(3))
        )
    );
    assert_eq!(value_of(s, &b, &k).await, None, "B's key is untouched");

    assert_accepted(
        &Put::new(&b, &k, b"b's own", lb.token, &b_owner)
            .send(s)
            .await,
        "B's owner",
    );
    assert_accepted(
        &Put::new(&a, &k, b"a's own", la3.token, &a3_owner)
            .send(s)
            .await,
        "A's owner on A",
    );
    let rec = rejection(
        Put::new(&b, &k, b"from a", la3.token, &a3_owner)
            .send(s)
            .await,
        "A's token 3 on B after B's owner wrote",
    );
    assert_eq!(rec.reason.as_str(), "wrong_owner");
    assert_eq!(
        value_of(s, &b, &k).await,
        Some((b"b's own".to_vec(), Token::new(3)))
    );
    assert_eq!(stale_of(s, None, &b).await.len(), 3);
    assert!(stale_of(s, None, &a).await.is_empty());
}

/// A lease released or expired but not taken again keeps its fence and
/// owner, so its owner still writes; once another acquisition takes the
/// resource, the old token is stale.
async fn case_put_after_release_and_expiry(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("put-after");
    let k = name("key", "k");
    let l1 = must_acquire(s, &r).await;
    let owner1 = l1.owner_id.to_string();
    must_release(s, &l1).await;
    assert_accepted(
        &Put::new(&r, &k, b"released", l1.token, &owner1)
            .send(s)
            .await,
        "after release, not re-acquired",
    );
    let l2 = must_acquire(s, &r).await;
    let owner2 = l2.owner_id.to_string();
    let rec = rejection(
        Put::new(&r, &k, b"old", l1.token, &owner1).send(s).await,
        "the released generation after the next acquisition",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.accepted_token),
        ("stale", Some(l2.token))
    );

    wait_until_store_time(s, l2.expires_at).await;
    assert!(!row(s, &r).await.held, "expired");
    assert_accepted(
        &Put::new(&r, &k, b"expired", l2.token, &owner2)
            .send(s)
            .await,
        "after expiry, not re-acquired",
    );
    let l3 = must_acquire(s, &r).await;
    let rec = rejection(
        Put::new(&r, &k, b"late", l2.token, &owner2).send(s).await,
        "the expired generation after the takeover",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.accepted_token),
        ("stale", Some(l3.token))
    );
    assert_eq!(
        value_of(s, &r, &k).await,
        Some((b"expired".to_vec(), l2.token))
    );
}

/// Writers of one generation keep writing to the same keys while the next
/// generation takes the lease over and writes them: each old writer ends on
/// a `stale` rejection naming the new token, the new generation's values
/// are the ones left, and every rejection is recorded.
async fn case_concurrent_puts(subject: Subject) {
    const WRITERS: usize = 6;
    const KEYS: usize = 3;
    let r = resource("put-race");
    let old = must_acquire(subject.store.as_ref(), &r).await;
    let keys: Vec<Name> = (0..KEYS).map(|i| name("key", &format!("k{i}"))).collect();
    let barrier = Arc::new(Barrier::new(WRITERS + 1));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (store, r, keys, barrier) = (
            subject.store.clone(),
            r.clone(),
            keys.clone(),
            barrier.clone(),
        );
        let (owner, token) = (old.owner_id.to_string(), old.token);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            // Write round the keys until refused: then the generation is over.
            let mut i = 0;
            loop {
                let value = format!("old-{w}-{i}");
                let out = Put::new(&r, &keys[(w + i) % KEYS], value.as_bytes(), token, &owner)
                    .send(store.as_ref())
                    .await;
                match out {
                    PutOutcome::Accepted { .. } => i += 1,
                    PutOutcome::Rejected(rec) => return *rec,
                    other => panic!("writer {w}: {other:?}"),
                }
                // An in-memory store answers without yielding: let the
                // other tasks run between two writes, as a round trip to a
                // server does.
                tokio::task::yield_now().await;
            }
        }));
    }
    barrier.wait().await;
    let s = subject.store.as_ref();
    must_release(s, &old).await;
    let new = must_acquire(s, &r).await;
    let new_owner = new.owner_id.to_string();
    for k in &keys {
        assert_accepted(
            &Put::new(&r, k, b"new", new.token, &new_owner).send(s).await,
            "the new generation",
        );
    }
    for task in tasks {
        let rec = task.await.expect("writer task");
        assert_eq!(
            (rec.reason.as_str(), rec.token, rec.accepted_token),
            ("stale", old.token, Some(new.token)),
            "{rec:?}"
        );
    }
    for k in &keys {
        assert_eq!(
            value_of(s, &r, k).await,
            Some((b"new".to_vec(), new.token)),
            "key {k}: the new generation's value"
        );
    }
    assert_eq!(stale_of(s, None, &r).await.len(), WRITERS);
}

/// A 1 MiB value, non-UTF-8 bytes and the empty value round-trip exactly.
async fn case_values_round_trip(subject: Subject) {
    let s = subject.store.as_ref();
    let (r, ls) = generations(s, "values", 1).await;
    let owner = ls[0].owner_id.to_string();
    // Deterministic pseudo-random bytes: every byte value, mostly not UTF-8.
    let mut x: u32 = 0x9e37_79b9;
    let big: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect();
    assert!(std::str::from_utf8(&big).is_err());
    let cases: [(&str, &[u8]); 4] = [
        ("big", &big),
        ("binary", &[0xff, 0x00, 0xfe, 0x80, b'\\', b'\'', 0xc3]),
        ("empty", b""),
        ("text", "grüße\n".as_bytes()),
    ];
    for (key, value) in cases {
        let k = name("key", key);
        assert_accepted(
            &Put::new(&r, &k, value, Token::new(1), &owner).send(s).await,
            key,
        );
        let got = s.get(&r, &k).await.unwrap().expect("stored value");
        assert_eq!(got.value.len(), value.len(), "{key}: length");
        assert!(got.value == value, "{key}: bytes differ");
        assert_eq!(got.token, Token::new(1));
    }
}

conformance!([
    case_put_accepts_equal_token,
    case_put_once,
    case_put_forged,
    case_put_wrong_owner,
    case_put_other_resources_token,
    case_put_after_release_and_expiry,
    case_concurrent_puts,
    case_values_round_trip,
]);

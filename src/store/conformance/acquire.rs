//! Acquiring a lease: the fence grows by one per generation across release and
//! expiry, concurrent first acquisitions make one row, a losing acquire writes
//! nothing, names at their limit round-trip.

use std::sync::Arc;

use tokio::sync::Barrier;

use super::kit::*;
use super::{open_store, Kind, Subject, TestDb};
use crate::names::Name;
use crate::store::*;

/// The token grows by one per generation across release, the row stays
/// listed with `held: false` and its fence after release, and every
/// acquisition has a fresh owner id.
async fn case_token_increases_across_release(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("release");
    let before = s.now().await.unwrap();
    let a = must_acquire(s, &r).await;
    let after = s.now().await.unwrap();
    assert_eq!(
        a.token,
        Token::new(1),
        "first acquisition of a new resource"
    );
    assert_eq!(a.resource, r.as_str());
    // Expiry is the store's clock plus the lease.
    assert!(
        a.expires_at.0 >= before.0 + 5_000 && a.expires_at.0 <= after.0 + 5_000,
        "expires_at {} should be store now + 5s (now was {}..{})",
        a.expires_at.0,
        before.0,
        after.0
    );

    // Held while unexpired: the loser learns who holds it, and nothing moves.
    match try_acquire(s, &r).await {
        AcquireOutcome::Held {
            owner_id,
            token,
            expires_at,
            node,
        } => {
            assert_eq!(owner_id, a.owner_id);
            assert_eq!(node, NODE);
            assert_eq!(token, a.token);
            assert_eq!(expires_at, a.expires_at);
        }
        other => panic!("second acquire while held: {other:?}"),
    }
    let listed = row(s, &r).await;
    assert_eq!(
        (listed.token, listed.held, listed.owner_id.as_str()),
        (Token::new(1), true, a.owner_id.to_string().as_str())
    );
    assert_eq!(listed.node, NODE);
    assert_eq!(listed.expires_at, a.expires_at);

    must_release(s, &a).await;
    // Releasing again is idempotent for the owner and changes nothing.
    must_release(s, &a).await;
    let listed = row(s, &r).await;
    assert_eq!(
        (listed.token, listed.held),
        (Token::new(1), false),
        "released: {listed:?}"
    );

    let b = must_acquire(s, &r).await;
    assert_eq!(b.token, Token::new(2), "token after release");
    assert_ne!(
        b.owner_id, a.owner_id,
        "each acquisition has a fresh owner id"
    );
    must_release(s, &b).await;
    let c = must_acquire(s, &r).await;
    assert_eq!(c.token, Token::new(3));
    assert!(c.expires_at >= b.expires_at);
    let listed = row(s, &r).await;
    assert_eq!((listed.token, listed.held), (Token::new(3), true));
}

/// Expiry is decided by the store: after it, the owner can no longer renew
/// (Expired), a new owner takes over with a greater token, and the old
/// owner's renew and release are refused as NotOwner without touching the
/// new owner's lease.
async fn case_token_increases_across_expiry(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("expiry");
    let a = must_acquire(s, &r).await;
    let a_owner = a.owner_id.to_string();
    wait_until_store_time(s, a.expires_at).await;
    assert!(!row(s, &r).await.held, "listed as not held after expiry");

    // The owner itself cannot renew an expired lease.
    match s.renew(&r, oid(&a_owner), a.token, LEASE).await.unwrap() {
        RenewOutcome::Refused(Refusal::Expired { expired_at }) => {
            assert_eq!(expired_at, a.expires_at)
        }
        other => panic!("renewing an expired lease: {other:?}"),
    }

    let b = must_acquire(s, &r).await;
    assert!(
        b.token > a.token,
        "token across expiry: {} > {}",
        b.token,
        a.token
    );
    assert_eq!(b.token, a.token.next());
    let b_owner = b.owner_id.to_string();

    let not_owner = Refusal::NotOwner {
        current_owner: oid(&b_owner),
        current_token: b.token,
    };
    assert_eq!(
        s.renew(&r, oid(&a_owner), a.token, LEASE).await.unwrap(),
        RenewOutcome::Refused(not_owner.clone())
    );
    assert_eq!(
        s.release(&r, oid(&a_owner), a.token).await.unwrap(),
        ReleaseOutcome::Refused(not_owner)
    );
    let listed = row(s, &r).await;
    assert_eq!(listed.owner_id, b_owner);
    assert_eq!(listed.token, b.token);
    assert_eq!(listed.expires_at, b.expires_at);
    assert!(listed.held);
}

/// 16 concurrent first-time acquisitions of a new resource: exactly one
/// winner with token 1, exactly one row.
async fn case_concurrent_first_acquire(subject: Subject) {
    const N: usize = 16;
    for round in 0..3 {
        let r = resource(&format!("race{round}"));
        let barrier = Arc::new(Barrier::new(N));
        let tasks: Vec<_> = (0..N)
            .map(|_| {
                let (store, r, barrier) = (subject.store.clone(), r.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    try_acquire(store.as_ref(), &r).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        for t in tasks {
            match t.await.expect("acquire task") {
                AcquireOutcome::Acquired(l) => winners.push(l),
                AcquireOutcome::Held { token, .. } => {
                    assert_eq!(token, Token::new(1), "losers see the winner's token")
                }
                other => panic!("unexpected outcome: {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one winner: {winners:?}");
        assert_eq!(winners[0].token, Token::new(1));
        let listed = row(subject.store.as_ref(), &r).await;
        assert_eq!(listed.token, Token::new(1));
        assert_eq!(listed.owner_id, winners[0].owner_id.to_string());
    }
}

/// A losing acquire changes nothing: the row (owner, node, token, expiry,
/// last occurrence) is exactly as before, whether it lost to a holder, an
/// occurrence already taken or one not yet due; and the next takeover still
/// names the owner that actually held the lease.
async fn case_losing_acquire_changes_nothing(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("loser");
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let a = acquired(acquire_as(s, &r, "node-a", Some(t)).await, "a");
    let before = row(s, &r).await;
    for (occ, what) in [
        (None, "ad hoc"),
        (Some(StoreTime(t.0 + 1_000)), "newer occurrence"),
        (Some(t), "same occurrence"),
        (Some(StoreTime(t.0 + 3_600_000)), "future occurrence"),
    ] {
        let out = acquire_as(s, &r, "node-x", occ).await;
        assert!(
            !matches!(out, AcquireOutcome::Acquired(_)),
            "{what}: must lose, got {out:?}"
        );
        assert_eq!(row(s, &r).await, before, "{what}: the row is untouched");
    }
    wait_until_store_time(s, a.expires_at).await;
    let b = acquired(acquire_as(s, &r, "node-b", None).await, "b");
    assert_eq!(
        b.taken_over.map(|p| (p.owner_id, p.node, p.token)),
        Some((a.owner_id, "node-a".to_string(), a.token))
    );
}

/// PostgreSQL, where "writes nothing" can be seen: a losing acquire leaves
/// the row's version (`xmin`) as it was — no new tuple, no WAL — also now
/// that a winner evaluates the epoch and copies the previous owner. A
/// release, which does write, changes it (so the check can see a write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_losing_acquire_writes_no_row_version() {
    let Some(db) = TestDb::new(
        Kind::Postgres,
        "postgres_losing_acquire_writes_no_row_version",
    ) else {
        return;
    };
    let store = open_store(&db.url, 4).await;
    let s = store.as_ref();
    let pool = sqlx::PgPool::connect(&db.url).await.expect("connect");
    let xmin = |r: Name| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT xmin::text FROM fencecron_leases WHERE resource = $1",
            )
            .bind(r.as_str())
            .fetch_one(&pool)
            .await
            .expect("lease row")
        }
    };
    let r = resource("xmin");
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let a = acquired(acquire_as(s, &r, "node-a", Some(t)).await, "a");
    let version = xmin(r.clone()).await;
    for occ in [None, Some(StoreTime(t.0 + 1_000)), Some(t)] {
        assert!(!matches!(
            acquire_as(s, &r, "node-x", occ).await,
            AcquireOutcome::Acquired(_)
        ));
    }
    assert_eq!(
        xmin(r.clone()).await,
        version,
        "a losing acquire wrote a row version"
    );
    must_release(s, &a).await;
    assert_ne!(
        xmin(r.clone()).await,
        version,
        "a release writes a new version"
    );
    pool.close().await;
}

/// MySQL/MariaDB, whose counters show what a statement touched: a losing
/// acquire (one `CALL`) writes nothing and does not read the epoch either.
/// It reads 3 index entries, as before epochs existed; with the epoch as an
/// uncorrelated `WHERE id = 1` subquery MariaDB read it while optimising,
/// for every loser (4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_losing_acquire_reads_no_epoch_and_writes_nothing() {
    let Some(db) = TestDb::new(
        Kind::MySql,
        "mysql_losing_acquire_reads_no_epoch_and_writes_nothing",
    ) else {
        return;
    };
    let store = open_store(&db.url, 4).await;
    let s = store.as_ref();
    let r = resource("handlers");
    let _held = must_acquire(s, &r).await;
    let pool = sqlx::MySqlPool::connect(&db.url).await.expect("connect");
    let mut conn = pool.acquire().await.expect("connection");
    let counters = "SHOW SESSION STATUS WHERE Variable_name IN
        ('Handler_read_key', 'Handler_read_rnd_next', 'Handler_update', 'Handler_write', 'Handler_delete')";
    let read = |rows: Vec<(String, String)>| -> std::collections::HashMap<String, i64> {
        rows.into_iter()
            .map(|(k, v)| (k, v.parse().expect("counter")))
            .collect()
    };
    let before = read(
        sqlx::query_as(counters)
            .fetch_all(&mut *conn)
            .await
            .expect("status"),
    );
    let row = sqlx::query("CALL fencecron_acquire(?, ?, ?, ?, ?)")
        .bind(r.as_str())
        .bind("loser")
        .bind(NODE)
        .bind(5_000_i64)
        .bind(None::<i64>)
        .fetch_one(&mut *conn)
        .await
        .expect("call");
    let won: i64 = sqlx::Row::try_get(&row, 0).expect("won");
    assert_eq!(won, 0, "the call must lose");
    let after = read(
        sqlx::query_as(counters)
            .fetch_all(&mut *conn)
            .await
            .expect("status"),
    );
    let delta = |k: &str| after[k] - before[k];
    for k in ["Handler_update", "Handler_write", "Handler_delete"] {
        assert_eq!(delta(k), 0, "{k}: a losing acquire wrote");
    }
    assert_eq!(
        delta("Handler_read_rnd_next"),
        0,
        "a losing acquire scanned"
    );
    assert!(
        delta("Handler_read_key") <= 3,
        "a losing acquire read {} index entries (3 expected): the epoch subquery ran",
        delta("Handler_read_key")
    );
    drop(conn);
    pool.close().await;
}

/// Names at the limit (200 characters, many bytes each) work on every
/// backend as resource and key, in leases, values and stale records.
async fn case_longest_names_round_trip(subject: Subject) {
    let s = subject.store.as_ref();
    let base = unique("long");
    let pad = 200 - base.chars().count();
    let r = name("resource", &format!("{base}{}", "𝄞".repeat(pad)));
    let k = name("key", &format!("{}{base}", "é".repeat(pad)));
    assert_eq!(r.as_str().chars().count(), 200);
    let l = must_acquire(s, &r).await;
    let owner = l.owner_id.to_string();
    assert_eq!(l.resource, r.as_str());
    assert_eq!(row(s, &r).await.token, Token::new(1));
    assert_accepted(
        &Put::new(&r, &k, b"v", Token::new(1), &owner).send(s).await,
        "long put",
    );
    assert_eq!(
        value_of(s, &r, &k).await,
        Some((b"v".to_vec(), Token::new(1)))
    );
    let rec = rejection(
        Put::new(&r, &k, b"w", Token::new(2), &owner).send(s).await,
        "forged",
    );
    assert_eq!(stale_of(s, None, &r).await, vec![rec]);
}

/// Name validation happens before any store is involved.
#[test]
fn names_are_validated() {
    assert!(Name::parse("resource", &"a".repeat(200)).is_ok());
    let long = Name::parse("resource", &"a".repeat(201)).unwrap_err();
    assert!(long.contains("201") && long.contains("200"), "{long}");
    assert!(Name::parse("resource", &"é".repeat(201)).is_err());
    for bad in [
        "a\nb",
        "tab\there",
        "nul\0",
        "del\u{7f}",
        "esc\u{1b}[0m",
        "\u{85}",
    ] {
        let e = Name::parse("key", bad).unwrap_err();
        assert!(e.contains("control"), "{bad:?}: {e}");
    }
    let e = Name::parse("resource", "").unwrap_err();
    assert!(e.contains("empty"), "{e}");
}

conformance!([
    case_token_increases_across_release,
    case_token_increases_across_expiry,
    case_concurrent_first_acquire,
    case_losing_acquire_changes_nothing,
    case_longest_names_round_trip,
]);

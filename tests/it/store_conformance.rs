//! The store conformance suite: every case is written once against
//! `Arc<dyn Store>` and run against every backend (SQLite, PostgreSQL,
//! MySQL/MariaDB) by the `conformance!` macro at the bottom.
//!
//! PostgreSQL and MySQL cases need `FENCECRON_TEST_POSTGRES_URL` and
//! `FENCECRON_TEST_MYSQL_URL` (see `tests/common/mod.rs`). Cases share one
//! database per server and run in parallel, so every resource name is
//! unique to its case.

use crate::common;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fencecron::names::Name;
use fencecron::store::{
    first_token_of, AcquireOutcome, AcquireRequest, AdmitOutcome, AdmitRequest,
    Backend as StoreBackend, ClaimItem, ClaimOutcome, ClaimRequest, Claimed, Lease, LeaseInfo,
    NewStaleRecord, OwnerId, PauseInfo, PutOutcome, PutRequest, Refusal, ReleaseOutcome,
    RenewOutcome, RunEnd, RunInfo, RunQuery, RunStart, StaleKind, StaleRecord, StartedBy, Store,
    StoreTime, Takeover, Token, TriggerInfo, Unseen,
};
use fencecron::store::{node_state, NodeBeat, NodeInfo};
use tokio::sync::Barrier;
use uuid::Uuid;

use common::fresh::with_fresh_database;
use common::harness::open_store;
use common::{unique, Backend, TestStore};

const LEASE: Duration = Duration::from_secs(5);

/// An owner id printed as text (as the cases compare them) back as one.
fn oid(s: &str) -> OwnerId {
    s.parse().expect("owner ids are UUIDs")
}
const NODE: &str = "conformance-node";

// ---------------------------------------------------------------- helpers

fn name(kind: &str, s: &str) -> Name {
    Name::parse(kind, s).unwrap_or_else(|e| panic!("{s:?} should be a valid {kind}: {e}"))
}

fn resource(prefix: &str) -> Name {
    name("resource", &unique(prefix))
}

async fn acquire_at(
    store: &dyn Store,
    r: &Name,
    lease: Duration,
    occurrence: Option<StoreTime>,
) -> AcquireOutcome {
    store
        .acquire(&AcquireRequest {
            resource: r,
            lease,
            node: NODE,
            owner_id: OwnerId::fresh(),
            occurrence,
            next_occurrence: None,
            run: None,
        })
        .await
        .expect("acquire reaches the store")
}

async fn try_acquire(store: &dyn Store, r: &Name) -> AcquireOutcome {
    acquire_at(store, r, LEASE, None).await
}

async fn must_acquire(store: &dyn Store, r: &Name) -> Lease {
    match try_acquire(store, r).await {
        AcquireOutcome::Acquired(l) => l,
        other => panic!("expected to acquire {r}, got {other:?}"),
    }
}

async fn must_release(store: &dyn Store, l: &Lease) {
    let r = name("resource", &l.resource);
    let out = store
        .release(&r, l.owner_id, l.token)
        .await
        .expect("release reaches the store");
    assert_eq!(out, ReleaseOutcome::Released, "releasing {l:?}");
}

/// Acquires and releases `n` generations of a fresh resource; returns the
/// tokens (1..=n) and the resource.
async fn generations(store: &dyn Store, prefix: &str, n: usize) -> (Name, Vec<Lease>) {
    let r = resource(prefix);
    let mut leases = Vec::new();
    for _ in 0..n {
        let l = must_acquire(store, &r).await;
        must_release(store, &l).await;
        leases.push(l);
    }
    (r, leases)
}

/// The one `list()` row of a resource.
async fn row(store: &dyn Store, r: &Name) -> LeaseInfo {
    let rows: Vec<LeaseInfo> = store
        .list()
        .await
        .expect("list reaches the store")
        .into_iter()
        .filter(|l| l.resource == r.as_str())
        .collect();
    assert_eq!(rows.len(), 1, "exactly one lease row for {r}: {rows:?}");
    rows.into_iter().next().unwrap()
}

/// A fenced write with everything a rejection records filled in.
struct Put<'a> {
    resource: &'a Name,
    key: &'a Name,
    value: &'a [u8],
    token: Token,
    owner_id: &'a str,
    once: bool,
    job: Option<&'a str>,
    stage: &'a str,
    operation_id: Uuid,
}

impl<'a> Put<'a> {
    /// A write as `owner` with `token`: the pair a lease of `resource` came
    /// with, or not.
    fn new(
        resource: &'a Name,
        key: &'a Name,
        value: &'a [u8],
        token: Token,
        owner: &'a str,
    ) -> Self {
        Put {
            resource,
            key,
            value,
            token,
            owner_id: owner,
            once: false,
            job: None,
            stage: "conformance",
            operation_id: Uuid::new_v4(),
        }
    }

    fn once(mut self) -> Self {
        self.once = true;
        self
    }

    async fn send(&self, store: &dyn Store) -> PutOutcome {
        store
            .put(&PutRequest {
                resource: self.resource,
                key: self.key,
                value: self.value,
                token: self.token,
                owner_id: oid(self.owner_id),
                once: self.once,
                node: NODE,
                job: self.job,
                stage: self.stage,
                operation_id: self.operation_id,
            })
            .await
            .expect("put reaches the store")
    }
}

fn assert_accepted(out: &PutOutcome, what: &str) {
    assert!(
        matches!(out, PutOutcome::Accepted { .. }),
        "{what}: expected Accepted, got {out:?}"
    );
}

fn rejection(out: PutOutcome, what: &str) -> StaleRecord {
    match out {
        PutOutcome::Rejected(rec) => *rec,
        other => panic!("{what}: expected Rejected, got {other:?}"),
    }
}

async fn value_of(store: &dyn Store, r: &Name, k: &Name) -> Option<(Vec<u8>, Token)> {
    store
        .get(r, k)
        .await
        .expect("get reaches the store")
        .map(|v| (v.value, v.token))
}

async fn stale_of(store: &dyn Store, since: Option<StoreTime>, r: &Name) -> Vec<StaleRecord> {
    store
        .stale(since)
        .await
        .expect("stale reaches the store")
        .into_iter()
        .filter(|s| s.resource == r.as_str())
        .collect()
}

/// Waits until the store's own clock has passed `t`.
async fn wait_until_store_time(store: &dyn Store, t: StoreTime) {
    loop {
        let now = store.now().await.expect("now reaches the store");
        if now > t {
            return;
        }
        tokio::time::sleep(Duration::from_millis(
            (t.0 - now.0 + 20).clamp(10, 6_000) as u64
        ))
        .await;
    }
}

// ------------------------------------------------------- lease: fence/token

/// The token grows by one per generation across release, the row stays
/// listed with `held: false` and its fence after release, and every
/// acquisition has a fresh owner id.
async fn case_token_increases_across_release(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let r = resource("release");
    let before = s.now().await.unwrap();
    let a = must_acquire(s, &r).await;
    let after = s.now().await.unwrap();
    assert_eq!(a.token, 1, "first acquisition of a new resource");
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
            assert_eq!(owner_id.as_deref(), Some(a.owner_id.to_string().as_str()));
            assert_eq!(node.as_deref(), Some(NODE));
            assert_eq!(token, a.token);
            assert_eq!(expires_at, Some(a.expires_at));
        }
        other => panic!("second acquire while held: {other:?}"),
    }
    let listed = row(s, &r).await;
    assert_eq!(
        (listed.token, listed.held, listed.owner_id.as_str()),
        (1, true, a.owner_id.to_string().as_str())
    );
    assert_eq!(listed.node, NODE);
    assert_eq!(listed.expires_at, a.expires_at);

    must_release(s, &a).await;
    // Releasing again is idempotent for the owner and changes nothing.
    must_release(s, &a).await;
    let listed = row(s, &r).await;
    assert_eq!(
        (listed.token, listed.held),
        (1, false),
        "released: {listed:?}"
    );

    let b = must_acquire(s, &r).await;
    assert_eq!(b.token, 2, "token after release");
    assert_ne!(
        b.owner_id, a.owner_id,
        "each acquisition has a fresh owner id"
    );
    must_release(s, &b).await;
    let c = must_acquire(s, &r).await;
    assert_eq!(c.token, 3);
    assert!(c.expires_at >= b.expires_at);
    let listed = row(s, &r).await;
    assert_eq!((listed.token, listed.held), (3, true));
}

/// Expiry is decided by the store: after it, the owner can no longer renew
/// (Expired), a new owner takes over with a greater token, and the old
/// owner's renew and release are refused as NotOwner without touching the
/// new owner's lease.
async fn case_token_increases_across_expiry(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
    assert_eq!(b.token, a.token + 1);
    let b_owner = b.owner_id.to_string();

    let not_owner = Refusal::NotOwner {
        current_owner: b_owner.clone(),
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

/// Renew keeps the token and owner and returns a later, store-computed
/// expiry; a renew with the right owner but wrong token, or of a resource
/// never leased, is refused.
async fn case_renew_keeps_token(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
        s.renew(&r, oid(&owner), a.token + 1, LEASE).await.unwrap(),
        RenewOutcome::Refused(Refusal::NotOwner {
            current_owner: owner.clone(),
            current_token: a.token,
        })
    );
    assert_eq!(
        s.release(&r, oid(&owner), a.token + 1).await.unwrap(),
        ReleaseOutcome::Refused(Refusal::NotOwner {
            current_owner: owner.clone(),
            current_token: a.token,
        })
    );
    assert_eq!(row(s, &r).await.expires_at, second);

    // Never leased.
    let never = resource("never");
    assert_eq!(
        s.renew(&never, oid(&owner), 1, LEASE).await.unwrap(),
        RenewOutcome::Refused(Refusal::Missing)
    );
    assert_eq!(
        s.release(&never, oid(&owner), 1).await.unwrap(),
        ReleaseOutcome::Refused(Refusal::Missing)
    );
    assert!(
        store
            .list()
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
async fn case_old_owner_refused(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let r = resource("old-owner");
    let a = must_acquire(s, &r).await;
    must_release(s, &a).await;
    let b = must_acquire(s, &r).await;
    let (a_owner, b_owner) = (a.owner_id.to_string(), b.owner_id.to_string());
    let not_owner = Refusal::NotOwner {
        current_owner: b_owner.clone(),
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

/// 16 concurrent first-time acquisitions of a new resource: exactly one
/// winner with token 1, exactly one row.
async fn case_concurrent_first_acquire(store: Arc<dyn Store>) {
    const N: usize = 16;
    for round in 0..3 {
        let r = resource(&format!("race{round}"));
        let barrier = Arc::new(Barrier::new(N));
        let tasks: Vec<_> = (0..N)
            .map(|_| {
                let (store, r, barrier) = (store.clone(), r.clone(), barrier.clone());
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
                    assert_eq!(token, 1, "losers see the winner's token")
                }
                other => panic!("unexpected outcome: {other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "exactly one winner: {winners:?}");
        assert_eq!(winners[0].token, 1);
        let listed = row(store.as_ref(), &r).await;
        assert_eq!(listed.token, 1);
        assert_eq!(listed.owner_id, winners[0].owner_id.to_string());
    }
}

/// Occurrence dedup: an occurrence runs at most once; older and equal ones
/// are refused after release, a newer one while held is Held, a newer one
/// when free wins; refused attempts do not move the fence, and an ad-hoc
/// acquisition does not forget the last occurrence.
async fn case_occurrence_dedup(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
    assert_eq!(b.token, a.token + 1);
    assert_eq!(row(s, &r).await.last_occurrence, Some(next));
    must_release(s, &b).await;

    // An ad-hoc lease (no occurrence) neither needs nor resets it.
    let c = must_acquire(s, &r).await;
    assert_eq!(c.token, b.token + 1);
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
async fn case_occurrence_not_yet_due(store: Arc<dyn Store>) {
    let s = store.as_ref();
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

/// Names at the limit (200 characters, many bytes each) work on every
/// backend as resource and key, in leases, values and stale records.
async fn case_longest_names_round_trip(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let base = unique("long");
    let pad = 200 - base.chars().count();
    let r = name("resource", &format!("{base}{}", "𝄞".repeat(pad)));
    let k = name("key", &format!("{}{base}", "é".repeat(pad)));
    assert_eq!(r.as_str().chars().count(), 200);
    let l = must_acquire(s, &r).await;
    let owner = l.owner_id.to_string();
    assert_eq!(l.resource, r.as_str());
    assert_eq!(row(s, &r).await.token, 1);
    assert_accepted(&Put::new(&r, &k, b"v", 1, &owner).send(s).await, "long put");
    assert_eq!(value_of(s, &r, &k).await, Some((b"v".to_vec(), 1)));
    let rec = rejection(Put::new(&r, &k, b"w", 2, &owner).send(s).await, "forged");
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

// ------------------------------------------------------------ fenced writes

/// `>=` semantics within a generation: the current token with its owner id
/// writes a key several times; a newer generation wins; the older one is
/// then stale, on the key the newer one wrote and on a key nobody wrote
/// since (its generation is over, whatever the key holds).
async fn case_put_accepts_equal_token(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let (r, ls) = generations(s, "put-ge", 1).await;
    let k = name("key", "result");
    let owner1 = ls[0].owner_id.to_string();
    assert_eq!(value_of(s, &r, &k).await, None);
    for (value, what) in [(b"a", "first"), (b"b", "again"), (b"c", "third")] {
        assert_accepted(&Put::new(&r, &k, value, 1, &owner1).send(s).await, what);
    }
    let v = s.get(&r, &k).await.unwrap().expect("value");
    assert_eq!((v.value.as_slice(), v.token), (&b"c"[..], 1));
    assert_eq!(v.owner_id.as_deref(), Some(owner1.as_str()));
    assert_eq!(
        (v.resource.as_str(), v.key.as_str()),
        (r.as_str(), "result")
    );

    let l2 = must_acquire(s, &r).await;
    let owner2 = l2.owner_id.to_string();
    assert_accepted(
        &Put::new(&r, &k, b"d", 2, &owner2).send(s).await,
        "newer generation",
    );
    let rec = rejection(
        Put::new(&r, &k, b"e", 1, &owner1).send(s).await,
        "older generation",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.accepted_token),
        ("stale", Some(2))
    );
    assert_eq!(value_of(s, &r, &k).await, Some((b"d".to_vec(), 2)));
    // A key of the same resource that no newer token wrote: still stale.
    let k2 = name("key", "other");
    let rec = rejection(
        Put::new(&r, &k2, b"x", 1, &owner1).send(s).await,
        "token 1 on a key never written",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.token, rec.accepted_token),
        ("stale", 1, Some(2))
    );
    assert_eq!(
        value_of(s, &r, &k2).await,
        None,
        "a stale write creates nothing"
    );
    assert_accepted(
        &Put::new(&r, &k2, b"y", 2, &owner2).send(s).await,
        "token 2 on that key",
    );
}

/// `once` semantics: with the current token and its owner id, a new key is
/// written, the same token again is AlreadyApplied and changes (and
/// records) nothing, a greater one is accepted, an older one is stale. Only
/// the current token of its owner can be "already applied": once a newer
/// generation exists, the older one's retry is stale, and another owner's
/// id is refused.
async fn case_put_once(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let (r, ls) = generations(s, "put-once", 1).await;
    let owner1 = ls[0].owner_id.to_string();
    let k = name("key", "applied");
    assert_accepted(
        &Put::new(&r, &k, b"first", 1, &owner1).once().send(s).await,
        "new key",
    );
    let before = s.get(&r, &k).await.unwrap().expect("value");
    assert_eq!(
        Put::new(&r, &k, b"second", 1, &owner1).once().send(s).await,
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
        Put::new(&r, &k, b"retry", 1, &owner1).once().send(s).await,
        "older, once, its own token still on the key",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.accepted_token),
        ("stale", Some(2))
    );
    assert_accepted(
        &Put::new(&r, &k, b"third", 2, &owner2).once().send(s).await,
        "greater",
    );
    assert_eq!(value_of(s, &r, &k).await, Some((b"third".to_vec(), 2)));
    let rec = rejection(
        Put::new(&r, &k, b"x", 1, &owner1).once().send(s).await,
        "older, once",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.accepted_token),
        ("stale", Some(2))
    );
    assert_eq!(
        Put::new(&r, &k, b"y", 2, &owner2).once().send(s).await,
        PutOutcome::AlreadyApplied
    );
    let rec = rejection(
        Put::new(&r, &k, b"z", 2, &owner1).once().send(s).await,
        "the current token with another owner id, once",
    );
    assert_eq!(
        (rec.reason.as_str(), rec.accepted_token),
        ("wrong_owner", Some(2))
    );
    assert_eq!(value_of(s, &r, &k).await, Some((b"third".to_vec(), 2)));
    assert_eq!(stale_of(s, None, &r).await.len(), 3);
}

/// A token greater than the resource's fence, or any token for a resource
/// never leased, is rejected as forged, recorded, and changes nothing.
async fn case_put_forged(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let (r, ls) = generations(s, "forged", 2).await;
    let owner = ls[1].owner_id.to_string();
    let k = name("key", "k");
    let rec = rejection(
        Put::new(&r, &k, b"f", 3, &owner).send(s).await,
        "fence+1 on new key",
    );
    assert_eq!((rec.reason.as_str(), rec.accepted_token), ("forged", None));
    assert_eq!(
        value_of(s, &r, &k).await,
        None,
        "a forged write creates nothing"
    );
    assert_accepted(
        &Put::new(&r, &k, b"ok", 2, &owner).send(s).await,
        "the fence itself",
    );
    for (token, once) in [(3, false), (3, true), (i64::MAX, false)] {
        let rec = rejection(
            Put::new(&r, &k, b"f", token, &owner)
                .once_if(once)
                .send(s)
                .await,
            "forged",
        );
        assert_eq!(
            (rec.reason.as_str(), rec.token, rec.accepted_token),
            ("forged", token, Some(2))
        );
    }
    assert_eq!(value_of(s, &r, &k).await, Some((b"ok".to_vec(), 2)));
    assert_eq!(stale_of(s, None, &r).await.len(), 4);

    let never = resource("never-leased");
    for token in [1, 2] {
        let rec = rejection(
            Put::new(&never, &k, b"f", token, &owner).send(s).await,
            "never leased",
        );
        assert_eq!(rec.reason, "forged");
    }
    assert_eq!(value_of(s, &never, &k).await, None);
    assert_eq!(stale_of(s, None, &never).await.len(), 2);
}

impl Put<'_> {
    fn once_if(self, once: bool) -> Self {
        if once {
            self.once()
        } else {
            self
        }
    }
}

/// The current token with an owner id it was not issued to is refused as
/// `wrong_owner` and recorded with the caller's owner id, before and after
/// the owner wrote, with and without `once`, also after the owner released
/// the lease; the owner's own writes go through.
async fn case_put_wrong_owner(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
            rec.owner_id.as_deref(),
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
        assert_eq!(rec.reason, "wrong_owner", "once: {once}");
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
            (x.reason.as_str(), x.owner_id.as_deref(), x.key.as_deref()),
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
async fn case_put_other_resources_token(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let (b, _) = generations(s, "other-b", 2).await;
    let lb = must_acquire(s, &b).await;
    let b_owner = lb.owner_id.to_string();
    assert_eq!(lb.token, 3);
    let a = resource("other-a");
    let la = must_acquire(s, &a).await;
    let a_owner = la.owner_id.to_string();
    assert_eq!(la.token, 1);
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
            rec.owner_id.as_deref(),
            rec.token,
            rec.accepted_token
        ),
        ("stale", b.as_str(), Some(a_owner.as_str()), 1, Some(3))
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
            rec.owner_id.as_deref(),
            rec.token,
            rec.accepted_token
        ),
        (
            "wrong_owner",
            b.as_str(),
            Some(a3_owner.as_str()),
            3,
            Some(3)
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
    assert_eq!(rec.reason, "wrong_owner");
    assert_eq!(value_of(s, &b, &k).await, Some((b"b's own".to_vec(), 3)));
    assert_eq!(stale_of(s, None, &b).await.len(), 3);
    assert!(stale_of(s, None, &a).await.is_empty());
}

/// A lease released or expired but not taken again keeps its fence and
/// owner, so its owner still writes; once another acquisition takes the
/// resource, the old token is stale.
async fn case_put_after_release_and_expiry(store: Arc<dyn Store>) {
    let s = store.as_ref();
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

/// A stale rejection is recorded with every field, returned in the put
/// outcome and by `stale(None)` and `stale(Some(since))`, oldest first.
async fn case_stale_rejection_recorded(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let (r, ls) = generations(s, "stale-rec", 2).await;
    let k = name("key", "report.csv");
    let new_owner = ls[1].owner_id.to_string();
    assert_accepted(
        &Put::new(&r, &k, b"new", 2, &new_owner).send(s).await,
        "owner 2",
    );
    let old_owner = ls[0].owner_id.to_string();
    let op = Uuid::new_v4();
    let since = s.now().await.unwrap();
    let mut put = Put::new(&r, &k, b"old", 1, &old_owner);
    put.job = Some("nightly-report");
    put.stage = "upload";
    put.operation_id = op;
    let rec = rejection(put.send(s).await, "old owner");
    let until = s.now().await.unwrap();
    let expected = StaleRecord {
        at: rec.at,
        kind: StaleKind::WriteRejected,
        reason: "stale".to_string(),
        resource: r.to_string(),
        key: Some("report.csv".to_string()),
        owner_id: Some(old_owner.clone()),
        token: 1,
        accepted_token: Some(2),
        node: NODE.to_string(),
        job: Some("nightly-report".to_string()),
        stage: "upload".to_string(),
        operation_id: op.to_string(),
    };
    assert_eq!(rec, expected);
    assert!(
        since <= rec.at && rec.at <= until,
        "stamped by the store's clock: {since:?} <= {:?} <= {until:?}",
        rec.at
    );
    assert_eq!(value_of(s, &r, &k).await, Some((b"new".to_vec(), 2)));

    // A second rejection, later: listing is oldest first.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let rec2 = rejection(
        Put::new(&r, &k, b"older", 1, &old_owner).send(s).await,
        "again",
    );
    assert!(rec2.at >= rec.at);
    assert_eq!(stale_of(s, None, &r).await, vec![rec.clone(), rec2.clone()]);
    assert_eq!(
        stale_of(s, Some(since), &r).await,
        vec![rec.clone(), rec2.clone()]
    );
    assert_eq!(
        stale_of(s, Some(rec.at), &r).await,
        vec![rec.clone(), rec2.clone()]
    );
    assert_eq!(stale_of(s, Some(rec2.at), &r).await.last(), Some(&rec2));
    let later = StoreTime(rec2.at.0 + 1);
    assert!(
        stale_of(s, Some(later), &r).await.is_empty(),
        "since excludes older"
    );
}

/// `record_stale` of a lost lease round-trips through `stale`.
async fn case_record_stale_lease_lost(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let r = resource("lost");
    let l = must_acquire(s, &r).await;
    let owner = l.owner_id.to_string();
    let op = Uuid::new_v4().to_string();
    let since = s.now().await.unwrap();
    let rec = s
        .record_stale(&NewStaleRecord {
            kind: StaleKind::LeaseLost,
            reason: "renewal refused: the lease now belongs to another owner",
            resource: r.as_str(),
            key: None,
            owner_id: Some(&owner),
            token: l.token,
            accepted_token: Some(l.token + 1),
            node: "node-b",
            job: Some("job-x"),
            stage: "renew",
            operation_id: &op,
        })
        .await
        .expect("record_stale reaches the store");
    let expected = StaleRecord {
        at: rec.at,
        kind: StaleKind::LeaseLost,
        reason: "renewal refused: the lease now belongs to another owner".to_string(),
        resource: r.to_string(),
        key: None,
        owner_id: Some(owner),
        token: l.token,
        accepted_token: Some(l.token + 1),
        node: "node-b".to_string(),
        job: Some("job-x".to_string()),
        stage: "renew".to_string(),
        operation_id: op,
    };
    assert_eq!(rec, expected);
    assert!(rec.at >= since);
    assert_eq!(stale_of(s, None, &r).await, vec![expected.clone()]);
    assert_eq!(stale_of(s, Some(since), &r).await, vec![expected]);
}

/// Writers of one generation keep writing to the same keys while the next
/// generation takes the lease over and writes them: each old writer ends on
/// a `stale` rejection naming the new token, the new generation's values
/// are the ones left, and every rejection is recorded.
async fn case_concurrent_puts(store: Arc<dyn Store>) {
    const WRITERS: usize = 6;
    const KEYS: usize = 3;
    let r = resource("put-race");
    let old = must_acquire(store.as_ref(), &r).await;
    let keys: Vec<Name> = (0..KEYS).map(|i| name("key", &format!("k{i}"))).collect();
    let barrier = Arc::new(Barrier::new(WRITERS + 1));
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (store, r, keys, barrier) = (store.clone(), r.clone(), keys.clone(), barrier.clone());
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
            }
        }));
    }
    barrier.wait().await;
    let s = store.as_ref();
    must_release(s, &old).await;
    let new = must_acquire(s, &r).await;
    let new_owner = new.owner_id.to_string();
    for k in &keys {
        assert_accepted(
            &Put::new(&r, k, b"new", new.token, &new_owner).send(s).await,
            "the new generation",
        );
    }
    for t in tasks {
        let rec = t.await.expect("writer task");
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
async fn case_values_round_trip(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
        assert_accepted(&Put::new(&r, &k, value, 1, &owner).send(s).await, key);
        let got = s.get(&r, &k).await.unwrap().expect("stored value");
        assert_eq!(got.value.len(), value.len(), "{key}: length");
        assert!(got.value == value, "{key}: bytes differ");
        assert_eq!(got.token, 1);
    }
}

/// Retention (`[history] stale`, `values`): `prune_stale` deletes the
/// records made before the cut-off; `prune_values` deletes the values
/// written before it only of resources whose lease was not held since,
/// so a held lease's values stay. Neither touches a lease row: the next
/// token is still greater than every earlier one.
async fn case_retention_prunes_stale_records_and_unused_values(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
        Put::new(&held, &k, b"forged", h.token + 1, &h_owner)
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
async fn case_forget_hides_a_free_lease_and_keeps_its_fence(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let listed = |r: &Name| {
        let r = r.to_string();
        async move { s.list().await.unwrap().iter().any(|l| l.resource == r) }
    };
    let (r, ls) = generations(s, "forget", 2).await;
    let held = must_acquire(s, &resource("forget-held")).await;
    let held_r = name("resource", &held.resource);
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
async fn case_purge_prefix(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
            Put::new(&r, &k, b"f", l.token + 1, &owner).send(s).await,
            res,
        );
    }
    // The purge is the benchmark's alone: reached through its own open.
    let bench = fencecron::store::open_bench(s.url(), &Default::default()).expect("store opens");
    let deleted = bench
        .purge_prefix(&prefix)
        .await
        .expect("purge reaches the store");
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
            Some((b"v".to_vec(), 1)),
            "{res} value spared"
        );
    }
}

// ------------------------------------------- failover: epochs of tokens

/// `advance_epoch` makes every later token greater than every earlier one:
/// for a resource leased before, for one never leased, and for the next
/// generation of a lease held across the advance (which itself keeps its
/// token: its owner can still renew and write). Within an epoch tokens
/// count up by one. Runs on a database of its own (the epoch is store-wide).
async fn case_epoch_advance(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let start = s.epoch().await.expect("epoch reaches the store");
    assert_eq!(start.highest_token, None, "a fresh database: {start:?}");
    assert_eq!(start.lowest_token, first_token_of(start.effective));
    let (r, ls) = generations(s, "epoch", 3).await;
    let first = start.lowest_token;
    assert_eq!(
        ls.iter().map(|l| l.token).collect::<Vec<_>>(),
        vec![first, first + 1, first + 2],
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
        start.effective.max(highest >> 32) + 1,
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
    assert_eq!(must_acquire(s, &r).await.token, adv.lowest_token + 1);
    let adv2 = s.advance_epoch().await.unwrap();
    assert_eq!(adv2.effective, adv.effective + 1);
    let after = must_acquire(s, &resource("epoch-after")).await;
    assert_eq!(after.token, first_token_of(adv2.effective));
}

// ------------------------------------------ occurrence identity and clock

/// One attempt at an occurrence, as the daemon sends it: its owner id (one
/// per occurrence and node), the instant and the job's next instant.
async fn attempt(
    s: &dyn Store,
    r: &Name,
    lease: Duration,
    owner_id: OwnerId,
    occ: StoreTime,
    next: StoreTime,
) -> AcquireOutcome {
    s.acquire(&AcquireRequest {
        resource: r,
        lease,
        node: NODE,
        owner_id,
        occurrence: Some(occ),
        next_occurrence: Some(next),
        run: None,
    })
    .await
    .expect("acquire reaches the store")
}

/// A retry of an occurrence by the same owner adopts that owner's own
/// unreleased win (an earlier attempt that committed after its caller
/// stopped waiting): same token, expiry not earlier, the takeover it made
/// still reported. Another owner, an ad-hoc lease, or the same owner after
/// releasing cannot.
async fn case_retry_adopts_its_own_win(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
    assert_eq!(first.token, gone.token + 1);
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
async fn case_retry_adopts_an_expired_win(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
async fn case_superseded_occurrence_is_refused(store: Arc<dyn Store>) {
    let s = store.as_ref();
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

/// `give_back`: a lease under which nothing ran goes back with its
/// occurrence, which another owner can then take (a newer token); older
/// instants stay refused. It needs the owner and token, and leaves a
/// later occurrence alone.
async fn case_give_back_leaves_the_instant_runnable(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
    assert_eq!(other.token, late.token + 1);
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
async fn case_give_back_unseen_sweeps_many_at_once(store: Arc<dyn Store>) {
    let s = store.as_ref();
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

// ------------------------------------------------------------ takeovers

async fn acquire_as(
    s: &dyn Store,
    r: &Name,
    node: &str,
    occurrence: Option<StoreTime>,
) -> AcquireOutcome {
    s.acquire(&AcquireRequest {
        resource: r,
        lease: LEASE,
        node,
        owner_id: OwnerId::fresh(),
        occurrence,
        next_occurrence: None,
        run: None,
    })
    .await
    .expect("acquire reaches the store")
}

fn acquired(out: AcquireOutcome, what: &str) -> Lease {
    match out {
        AcquireOutcome::Acquired(l) => l,
        other => panic!("{what}: expected to acquire, got {other:?}"),
    }
}

/// A lease given back is no takeover: not after a release, not after a
/// release that came late (the lease had already expired, but its owner
/// gave it up itself), and not the first acquisition of a resource. Nor do
/// losing attempts on a released row (occurrence taken, not yet due) make
/// the next winner report one. `lease acquire --json` has no `taken_over`.
async fn case_release_is_no_takeover(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
    assert_eq!(c.token, b.token + 1);
}

/// A lease that expired without being released is taken over, and the
/// winner learns the vanished owner: its owner id, node, token and the
/// store-clock expiry it had (the renewed one). The vanished owner's late
/// release is refused. A takeover of a takeover names the latest owner.
async fn case_expiry_is_a_takeover(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
        owner_id: a.owner_id.to_string(),
        node: "node-a".to_string(),
        token: a.token,
        expired_at: renewed,
    };
    assert_eq!(b.taken_over.as_ref(), Some(&expected));
    assert_eq!(b.token, a.token + 1);
    let json = serde_json::to_value(&b).unwrap();
    assert_eq!(json["taken_over"]["token"], a.token, "{json}");
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
            owner_id: b.owner_id.to_string(),
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
async fn case_preempt_ends_only_an_earlier_instants_lease(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let r = resource("preempt");
    let t1 = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let t2 = StoreTime(t1.0 + 30_000);
    let a = acquired(acquire_as(s, &r, "node-a", Some(t1)).await, "a for t1");
    assert!(!s.preempt(&r, a.token, t1).await.unwrap(), "same instant");
    assert!(
        !s.preempt(&r, a.token + 1, t2).await.unwrap(),
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
    assert_eq!(b.token, a.token + 1, "the next token");
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
    assert_eq!(d.token, c.token + 1);
    // Released: nothing to end.
    must_release(s, &d).await;
    assert!(!s
        .preempt(&r, d.token, StoreTime(t3.0 + 1_000))
        .await
        .unwrap());
}

// ----------------------------------------------------------- batch claims

/// One scheduled item per resource (job = resource name) at `at`.
fn claim_items<'a>(rs: &'a [Name], at: StoreTime) -> Vec<ClaimItem<'a>> {
    rs.iter()
        .map(|r| ClaimItem {
            resource: r,
            job: r.as_str(),
            owner_id: OwnerId::fresh(),
            lease: LEASE,
            occurrence: at,
            next_occurrence: None,
        })
        .collect()
}

/// `Store::claim`, which every backend answers.
async fn claim(
    s: &dyn Store,
    node: &str,
    items: &[ClaimItem<'_>],
    limit: usize,
    share: bool,
) -> ClaimOutcome {
    let out = s
        .claim(&ClaimRequest {
            node,
            items,
            limit,
            share,
        })
        .await
        .expect("claim reaches the store");
    assert_eq!(out.items.len(), items.len(), "one answer per item");
    out
}

/// Resources whose rows exist, released, last taken for an instant long
/// ago.
async fn released_rows(s: &dyn Store, prefix: &str, n: usize) -> Vec<Name> {
    let mut rs = Vec::new();
    for _ in 0..n {
        let r = resource(prefix);
        let l = must_acquire(s, &r).await;
        must_release(s, &l).await;
        rs.push(r);
    }
    rs
}

/// A batch claim wins each item exactly as the single acquire would: the
/// next token, the run recorded with the claim's owner id (so that a later
/// single acquire of the same owner adopts it), a takeover reported; it
/// loses to a holder or an instant already taken and writes nothing then;
/// and leaves to the single acquire what it does not decide (no row yet,
/// paused, not yet due, superseded). A limit stops it after that many wins,
/// the rest `Skipped`.
async fn case_claim_wins_like_the_acquire(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let now = s.now().await.unwrap();
    let t = StoreTime(now.0 / 1000 * 1000 - 60_000);
    let free = released_rows(s, "claim-free", 3).await;
    // Expired without a release: the claim takes it over.
    let expired = resource("claim-expired");
    let gone = acquired(
        acquire_at(s, &expired, Duration::from_millis(1), None).await,
        "expiring",
    );
    while row(s, &expired).await.held {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held = resource("claim-held");
    let holder = must_acquire(s, &held).await;
    let taken = resource("claim-taken");
    let t_taken = acquired(acquire_as(s, &taken, "node-z", Some(t)).await, "taken");
    must_release(s, &t_taken).await;
    let (absent, paused) = (
        resource("claim-absent"),
        released_rows(s, "claim-paused", 1).await,
    );
    s.pause(
        &PauseInfo {
            job: paused[0].to_string(),
            note: None,
            since: now,
            until: None,
            paused_by: "ops@host".into(),
        },
        false,
    )
    .await
    .unwrap();
    let (early, late) = (
        released_rows(s, "claim-early", 1).await,
        released_rows(s, "claim-late", 1).await,
    );

    let mut rs: Vec<Name> = free.clone();
    rs.extend([expired.clone(), held.clone(), taken.clone(), absent.clone()]);
    rs.extend(paused.iter().cloned());
    let mut items = claim_items(&rs, t);
    let mut more = claim_items(&early, StoreTime(now.0 + 3_600_000));
    more.extend(claim_items(&late, t).into_iter().map(|mut i| {
        i.next_occurrence = Some(StoreTime(t.0 + 1_000));
        i
    }));
    items.extend(more);
    let before: Vec<i64> = {
        let mut v = Vec::new();
        for r in &rs {
            v.push(if *r == absent {
                0
            } else {
                row(s, r).await.token
            });
        }
        v
    };
    let out = claim(s, "node-c", &items, 100, false).await;
    for (i, r) in free.iter().enumerate() {
        let Claimed::Won(l) = &out.items[i] else {
            panic!("{r}: {:?}", out.items[i]);
        };
        assert_eq!(l.token, before[i] + 1, "the next token");
        assert_eq!(l.owner_id, items[i].owner_id);
        assert_eq!(l.taken_over, None, "released before: no takeover");
        let runs = runs_of(s, r.as_str()).await;
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!(
            (
                runs[0].token,
                runs[0].scheduled_at,
                runs[0].trigger.as_str(),
                runs[0].node.as_str()
            ),
            (l.token, Some(t), "schedule", "node-c")
        );
        let info = row(s, r).await;
        assert_eq!((info.held, info.last_occurrence), (true, Some(t)));
    }
    let Claimed::Won(over) = &out.items[3] else {
        panic!("expired: {:?}", out.items[3]);
    };
    let prev = over
        .taken_over
        .as_ref()
        .expect("an expired lease is taken over");
    assert_eq!(
        (prev.owner_id.as_str(), prev.token),
        (gone.owner_id.as_str(), gone.token)
    );
    assert!(
        matches!(&out.items[4], Claimed::Lost(AcquireOutcome::Held { owner_id: Some(o), token, .. })
            if o == holder.owner_id.as_str() && *token == holder.token),
        "held: {:?}",
        out.items[4]
    );
    assert!(
        matches!(
            out.items[5],
            Claimed::Lost(AcquireOutcome::OccurrenceTaken { .. })
        ),
        "taken: {:?}",
        out.items[5]
    );
    for (i, what) in [
        (6, "absent"),
        (7, "paused"),
        (8, "not yet due"),
        (9, "superseded"),
    ] {
        assert_eq!(out.items[i], Claimed::Ask, "{what}");
    }
    // Nothing written for what it did not win.
    assert_eq!(row(s, &held).await.token, holder.token);
    assert_eq!(row(s, &taken).await.token, t_taken.token);
    assert!(runs_of(s, paused[0].as_str()).await.is_empty());
    assert!(s
        .list()
        .await
        .unwrap()
        .iter()
        .all(|l| l.resource != absent.as_str()));

    // A single acquire of the same owner and instant adopts the win.
    let Claimed::Won(w0) = &out.items[0] else {
        unreachable!()
    };
    let again = acquired(
        acquire_run(
            s,
            &free[0],
            free[0].as_str(),
            items[0].owner_id,
            Some(t),
            StartedBy::Schedule,
        )
        .await,
        "adopt",
    );
    assert_eq!(again.token, w0.token, "adopted, not a new token");
    assert_eq!(runs_of(s, free[0].as_str()).await.len(), 1);

    // The same instant again: all taken, nothing changes.
    let again = claim_items(&free, t);
    let out2 = claim(s, "node-d", &again, 100, false).await;
    assert!(
        out2.items.iter().all(|c| matches!(c, Claimed::Lost(_))),
        "{:?}",
        out2.items
    );

    // The limit: two of three, the third skipped and left.
    let fresh = released_rows(s, "claim-limit", 3).await;
    let items = claim_items(&fresh, t);
    let out = claim(s, "node-e", &items, 2, false).await;
    assert!(matches!(out.items[0], Claimed::Won(_)) && matches!(out.items[1], Claimed::Won(_)));
    assert_eq!(out.items[2], Claimed::Skipped);
    assert!(out.left_some(), "the claim stopped at its limit");
    assert!(!row(s, &fresh[2]).await.held, "the third is untouched");
    let rest = claim_items(&fresh[2..], t);
    let out = claim(s, "node-f", &rest, 1, false).await;
    assert!(matches!(out.items[0], Claimed::Won(_)));
    assert!(!out.left_some());
}

/// Concurrent claims of the same instant from eight nodes: every item is
/// won exactly once, with one run recorded; a row another transaction has
/// locked is skipped at once instead of waited for.
async fn case_claim_once_under_concurrency_and_skips_locked_rows(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let rs = released_rows(s, "claim-race", 12).await;
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = Vec::new();
    for n in 0..8 {
        let (store, rs, barrier) = (store.clone(), rs.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            // Each node in its own order.
            let mut mine = rs.clone();
            mine.rotate_left(n * 3 % rs.len());
            let items = claim_items(&mine, t);
            barrier.wait().await;
            let out = claim(store.as_ref(), &format!("race-{n}"), &items, 100, false).await;
            mine.iter()
                .zip(out.items)
                .filter_map(|(r, c)| match c {
                    Claimed::Won(l) => Some((r.to_string(), l.token)),
                    Claimed::Lost(_) | Claimed::Skipped => None,
                    Claimed::Ask => panic!("{r}: nothing to ask about"),
                })
                .collect::<Vec<_>>()
        }));
    }
    let mut wins = Vec::new();
    for t in tasks {
        wins.extend(t.await.unwrap());
    }
    wins.sort();
    let names: Vec<String> = wins.iter().map(|(r, _)| r.clone()).collect();
    let mut expected: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
    expected.sort();
    assert_eq!(names, expected, "every item won exactly once");
    for r in &rs {
        assert_eq!(runs_of(s, r.as_str()).await.len(), 1, "{r}: one run");
    }

    // A row locked by another transaction is skipped, not waited for
    // (SQLite locks the whole database for a writer: nothing to skip).
    if s.backend() == StoreBackend::Sqlite {
        return;
    }
    let locked = released_rows(s, "claim-locked", 2).await;
    let items = claim_items(&locked, t);
    let url = s.url().expose();
    let out = if s.backend() == StoreBackend::MySql {
        claim_while_locked::<sqlx::MySql>(s, url, "?", &locked[0], &items).await
    } else {
        claim_while_locked::<sqlx::Postgres>(s, url, "$1", &locked[0], &items).await
    };
    assert_eq!(out.items[0], Claimed::Skipped, "locked elsewhere");
    assert!(matches!(out.items[1], Claimed::Won(_)));
    assert!(
        !row(s, &locked[0]).await.held,
        "the locked row is untouched"
    );
}

/// Claims `items` (as `node-l`) while a transaction of its own, on a raw
/// connection to `url`, holds the row lock of `locked`'s lease (`param`:
/// the backend's first placeholder).
async fn claim_while_locked<DB>(
    s: &dyn Store,
    url: &str,
    param: &str,
    locked: &Name,
    items: &[ClaimItem<'_>],
) -> ClaimOutcome
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("a raw connection");
    let mut tx = pool.begin().await.unwrap();
    let lock = format!("SELECT 1 FROM fencecron_leases WHERE resource = {param} FOR UPDATE");
    sqlx::query(&lock)
        .bind(locked.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    let out = claim(s, "node-l", items, 100, false).await;
    tx.rollback().await.unwrap();
    out
}

/// The share: a claim bounded by its share takes at most `ceil(items /
/// live nodes) + 1`, the live nodes being those that claimed lately (on a
/// database of its own, so other cases' nodes do not count); the
/// request's own limit (free capacity) still applies below that.
async fn case_claim_takes_its_share_of_the_live_nodes(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let rs = released_rows(s, "claim-share", 12).await;
    let items = claim_items(&rs[..4], t);
    let out = claim(s, "share-a", &items, 100, true).await;
    if s.backend() == StoreBackend::Sqlite {
        // One host: no live nodes kept, no share; the limit alone bounds.
        assert_eq!(out.limit, 100);
        assert!(out.items.iter().all(|c| matches!(c, Claimed::Won(_))));
        return;
    }
    assert_eq!(out.limit, 5, "alone: everything (4 / 1 + 1)");
    assert!(out.items.iter().all(|c| matches!(c, Claimed::Won(_))));
    let items = claim_items(&rs[4..8], t);
    let out = claim(s, "share-b", &items, 100, true).await;
    assert_eq!(out.limit, 3, "two live nodes: 4 / 2 + 1");
    assert_eq!(
        out.items
            .iter()
            .filter(|c| matches!(c, Claimed::Won(_)))
            .count(),
        3
    );
    assert_eq!(out.items[3], Claimed::Skipped);
    assert!(out.left_some());
    // Without the share (a second round), the rest; capacity still bounds.
    let items = claim_items(&rs[7..12], t);
    let out = claim(s, "share-b", &items, 2, false).await;
    assert_eq!(out.limit, 2);
    assert!(matches!(out.items[0], Claimed::Won(_)) && matches!(out.items[1], Claimed::Won(_)));
    assert_eq!(out.items[2], Claimed::Skipped);
}

/// The registry of nodes: a beat writes the whole row with the store's
/// clock (started_at kept once given), definitions are replaced as a whole
/// and read with or without their text, a stopped node does not count for
/// a claim's share (the one "live"), a row a claim made has the columns'
/// defaults, and pruning forgets rows and their definitions.
async fn case_nodes_register_publish_and_are_forgotten(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let before = s.now().await.unwrap();
    let beat = |state: &'static str, started_at: Option<StoreTime>, running: u32| NodeBeat {
        node: "node-x",
        hostname: "host-x",
        pid: 4242,
        version: "9.9.9",
        config_digest: "abc",
        started_at,
        state,
        running,
    };
    let t1 = s.beat(&beat(node_state::RUNNING, None, 0)).await.unwrap();
    assert!(t1 >= before, "the store's clock");
    let row = |nodes: Vec<NodeInfo>, node: &str| nodes.into_iter().find(|n| n.node == node);
    let x = row(s.nodes().await.unwrap(), "node-x").expect("registered");
    assert_eq!(
        (
            x.hostname.as_str(),
            x.pid,
            x.version.as_str(),
            x.config_digest.as_str()
        ),
        ("host-x", 4242, "9.9.9", "abc")
    );
    assert_eq!(
        (x.started_at, x.last_seen, x.state.as_str(), x.running),
        (t1, t1, "running", 0)
    );
    assert!(x.live(t1));
    let t2 = s
        .beat(&beat(node_state::DRAINING, Some(t1), 2))
        .await
        .unwrap();
    let x = row(s.nodes().await.unwrap(), "node-x").unwrap();
    assert_eq!(
        (x.started_at, x.last_seen, x.state.as_str(), x.running),
        (t1, t2, "draining", 2)
    );

    let def = |job: &str, d: &str| {
        (
            job.to_string(),
            d.to_string(),
            format!("{{\"name\":\"{job}\"}}"),
        )
    };
    s.publish_jobs("node-x", &[def("a", "d1"), def("b", "d2")])
        .await
        .unwrap();
    let digests = s.published_jobs("node-x", false).await.unwrap();
    assert_eq!(
        digests
            .iter()
            .map(|p| (p.job.as_str(), p.digest.as_str(), p.definition.is_none()))
            .collect::<Vec<_>>(),
        [("a", "d1", true), ("b", "d2", true)]
    );
    let full = s.published_jobs("node-x", true).await.unwrap();
    assert_eq!(full[1].definition.as_deref(), Some("{\"name\":\"b\"}"));
    s.publish_jobs("node-x", &[def("a", "d3")]).await.unwrap();
    let digests = s.published_jobs("node-x", false).await.unwrap();
    assert_eq!(digests.len(), 1);
    assert_eq!(
        (
            digests[0].job.as_str(),
            digests[0].digest.as_str(),
            digests[0].node.as_str()
        ),
        ("a", "d3", "node-x")
    );
    assert!(s.published_jobs("node-y", false).await.unwrap().is_empty());

    if s.backend() != StoreBackend::Sqlite {
        // The claim share counts the same live nodes: stopped, node-x does
        // not count; running, it does.
        s.beat(&beat(node_state::STOPPED, Some(t1), 0))
            .await
            .unwrap();
        let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
        let rs = released_rows(s, "nodes-share", 8).await;
        let out = claim(s, "claimer", &claim_items(&rs[..4], t), 100, true).await;
        assert_eq!(out.limit, 5, "alone: a stopped node does not count");
        s.beat(&beat(node_state::RUNNING, Some(t1), 0))
            .await
            .unwrap();
        let out = claim(s, "claimer", &claim_items(&rs[4..], t), 100, true).await;
        assert_eq!(out.limit, 3, "node-x is live again: 4 / 2 + 1");
        // A row only a claim wrote (as a daemon of the previous release
        // does) reads with the columns' defaults.
        let c = row(s.nodes().await.unwrap(), "claimer").expect("the claim marked its node");
        assert_eq!(
            (
                c.hostname.as_str(),
                c.pid,
                c.config_digest.as_str(),
                c.state.as_str()
            ),
            ("", 0, "", "running")
        );
    }

    // A node publishes before its first beat writes its row: a prune in
    // between keeps its definitions.
    s.publish_jobs("node-new", &[def("a", "d1")]).await.unwrap();
    let last = s.now().await.unwrap();
    assert_eq!(
        s.prune_nodes(StoreTime(t1.0)).await.unwrap(),
        0,
        "seen since"
    );
    assert!(s.prune_nodes(StoreTime(last.0 + 1)).await.unwrap() >= 1);
    assert!(row(s.nodes().await.unwrap(), "node-x").is_none());
    assert!(
        s.published_jobs("node-x", true).await.unwrap().is_empty(),
        "its definitions went too"
    );
    assert_eq!(s.published_jobs("node-new", false).await.unwrap().len(), 1);
}

/// A losing acquire changes nothing: the row (owner, node, token, expiry,
/// last occurrence) is exactly as before, whether it lost to a holder, an
/// occurrence already taken or one not yet due; and the next takeover still
/// names the owner that actually held the lease.
async fn case_losing_acquire_changes_nothing(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
        Some((a.owner_id.to_string(), "node-a".to_string(), a.token))
    );
}

/// PostgreSQL, where "writes nothing" can be seen: a losing acquire leaves
/// the row's version (`xmin`) as it was — no new tuple, no WAL — also now
/// that a winner evaluates the epoch and copies the previous owner. A
/// release, which does write, changes it (so the check can see a write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_losing_acquire_writes_no_row_version() {
    let Some(ts) = TestStore::new(
        Backend::Postgres,
        "postgres_losing_acquire_writes_no_row_version",
    ) else {
        return;
    };
    let store = open_store(&ts, 4).await;
    let s = store.as_ref();
    let pool = sqlx::PgPool::connect(&ts.url).await.expect("connect");
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
    let Some(ts) = TestStore::new(
        Backend::MySql,
        "mysql_losing_acquire_reads_no_epoch_and_writes_nothing",
    ) else {
        return;
    };
    let store = open_store(&ts, 4).await;
    let s = store.as_ref();
    let r = resource("handlers");
    let _held = must_acquire(s, &r).await;
    let pool = sqlx::MySqlPool::connect(&ts.url).await.expect("connect");
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

// ------------------------------------------ operating the fleet (issue 10)

/// A scheduled acquire for `job` as a new owner.
async fn acquire_run(
    s: &dyn Store,
    r: &Name,
    job: &str,
    owner_id: OwnerId,
    occurrence: Option<StoreTime>,
    started_by: StartedBy,
) -> AcquireOutcome {
    s.acquire(&AcquireRequest {
        resource: r,
        lease: LEASE,
        node: NODE,
        owner_id,
        occurrence,
        next_occurrence: None,
        run: Some(RunStart {
            job,
            started_by,
            scheduled_at: occurrence.filter(|_| started_by != StartedBy::Manual),
        }),
    })
    .await
    .expect("acquire reaches the store")
}

async fn runs_of(s: &dyn Store, job: &str) -> Vec<RunInfo> {
    s.runs(&RunQuery {
        job: Some(job),
        limit: 100,
        ..RunQuery::default()
    })
    .await
    .expect("runs reaches the store")
}

fn end(l: &Lease, outcome: &'static str, output: &'static str) -> RunEnd<'static> {
    RunEnd {
        resource: Box::leak(l.resource.clone().into_boxed_str()),
        token: l.token,
        outcome,
        exit_code: Some(3),
        signal: None,
        duration_ms: 1_500,
        elapsed_ms: 1_600,
        output,
    }
}

/// `finish_and_release`: a run's end and its lease's release in one
/// operation. The owner's own lease: the row finished once and the lease
/// released (free for the next instant, token kept); a wrong owner or a
/// lease taken over since: refused, naming the new holder, and the row
/// still finished by its own token.
async fn case_finish_and_release_ends_the_run_and_frees_the_lease(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let (r, job) = (resource("finish-release"), unique("job"));
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let a = acquired(
        acquire_run(s, &r, &job, OwnerId::fresh(), Some(t), StartedBy::Schedule).await,
        "a",
    );
    assert!(
        matches!(
            s.finish_and_release(&r, OwnerId::fresh(), &end(&a, "failed", "x"))
                .await
                .unwrap(),
            (true, ReleaseOutcome::Refused(Refusal::NotOwner { .. }))
        ),
        "another owner: the row is finished by its token, the lease stays"
    );
    assert!(row(s, &r).await.held, "still held");
    assert_eq!(
        s.finish_and_release(&r, a.owner_id, &end(&a, "succeeded", "out"))
            .await
            .unwrap(),
        (false, ReleaseOutcome::Released),
        "the row ends once; the lease goes back"
    );
    let listed = row(s, &r).await;
    assert_eq!((listed.held, listed.token), (false, a.token));
    let run = &runs_of(s, &job).await[0];
    assert_eq!(
        (run.outcome.as_str(), run.exit_code, run.output.as_deref()),
        ("failed", Some(3), Some("x"))
    );

    // Taken over after the expiry: refused, and the new holder's lease stays.
    let t2 = StoreTime(t.0 + 1_000);
    let b = acquired(
        acquire_run(s, &r, &job, OwnerId::fresh(), Some(t2), StartedBy::Schedule).await,
        "b",
    );
    assert!(matches!(
        s.finish_and_release(&r, a.owner_id, &end(&a, "succeeded", ""))
            .await
            .unwrap(),
        (false, ReleaseOutcome::Refused(_))
    ));
    assert_eq!(row(s, &r).await.token, b.token);
    assert!(row(s, &r).await.held);
    assert_eq!(
        s.finish_and_release(&r, b.owner_id, &end(&b, "succeeded", ""))
            .await
            .unwrap(),
        (true, ReleaseOutcome::Released)
    );
}

/// The run history: a winning acquire records the run in the same
/// operation (a loser, and a retry adopting its own win, add nothing); the
/// run reads `running` while its lease is held, `unknown` once the lease is
/// gone without an end, and its end once `finish_run` wrote it (once).
/// A win given back unused leaves no run; manual runs have no instant.
async fn case_run_history_records_winners_only(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let (r, job) = (resource("history"), unique("job"));
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let owner = OwnerId::fresh();
    let a = acquired(
        acquire_run(s, &r, &job, owner, Some(t), StartedBy::Schedule).await,
        "a",
    );
    let lost = acquire_run(s, &r, &job, OwnerId::fresh(), Some(t), StartedBy::Schedule).await;
    assert!(!matches!(lost, AcquireOutcome::Acquired(_)), "{lost:?}");
    let adopted = acquired(
        acquire_run(s, &r, &job, owner, Some(t), StartedBy::Schedule).await,
        "retry",
    );
    assert_eq!(adopted.token, a.token);
    let runs = runs_of(s, &job).await;
    assert_eq!(runs.len(), 1, "one row per run: {runs:?}");
    let run = &runs[0];
    assert_eq!(
        (
            run.resource.as_str(),
            run.scheduled_at,
            run.trigger.as_str(),
            run.node.as_str(),
            run.owner_id.as_str(),
            run.token,
            run.outcome.as_str(),
            run.finished_at,
        ),
        (
            r.as_str(),
            Some(t),
            "schedule",
            NODE,
            owner.to_string().as_str(),
            a.token,
            "running",
            None
        )
    );
    let started = run.started_at;
    assert!(s
        .finish_run(&end(&a, "failed", "last\nlines\n"))
        .await
        .unwrap());
    assert!(
        !s.finish_run(&end(&a, "succeeded", "")).await.unwrap(),
        "a run ends once"
    );
    must_release(s, &a).await;
    let run = &runs_of(s, &job).await[0];
    assert_eq!(
        (
            run.outcome.as_str(),
            run.exit_code,
            run.signal.as_deref(),
            run.duration_ms,
            run.finished_at,
            run.output.as_deref()
        ),
        (
            "failed",
            Some(3),
            None,
            Some(1_500),
            Some(StoreTime(started.0 + 1_600)),
            Some("last\nlines\n")
        )
    );

    // Released without an end (its node died and a successor gave the lease
    // back): unknown, not running forever. Manual: no instant.
    let m = acquired(
        acquire_run(s, &r, &job, OwnerId::fresh(), None, StartedBy::Manual).await,
        "manual",
    );
    assert_eq!(runs_of(s, &job).await[0].outcome, "running");
    must_release(s, &m).await;
    let newest = &runs_of(s, &job).await[0];
    assert_eq!(
        (
            newest.token,
            newest.trigger.as_str(),
            newest.scheduled_at,
            newest.outcome.as_str()
        ),
        (m.token, "manual", None, "unknown")
    );

    // Given back unused: no run.
    let t2 = StoreTime(t.0 + 1_000);
    let g = acquired(
        acquire_run(s, &r, &job, OwnerId::fresh(), Some(t2), StartedBy::Schedule).await,
        "given back",
    );
    let out = s
        .give_back(&r, g.owner_id, Some(g.token), t2)
        .await
        .unwrap();
    assert_eq!(out, ReleaseOutcome::Released);
    let tokens: Vec<Token> = runs_of(s, &job).await.iter().map(|r| r.token).collect();
    assert_eq!(
        tokens,
        [m.token, a.token],
        "newest first, no given-back run"
    );

    // Filters: outcome, limit, since.
    let failed = s
        .runs(&RunQuery {
            job: Some(&job),
            outcome: Some("failed"),
            limit: 10,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(
        failed.iter().map(|r| r.token).collect::<Vec<_>>(),
        [a.token]
    );
    let one = s
        .runs(&RunQuery {
            job: Some(&job),
            limit: 1,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    let later = s
        .runs(&RunQuery {
            job: Some(&job),
            since: Some(StoreTime(s.now().await.unwrap().0 + 60_000)),
            limit: 10,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert!(later.is_empty(), "{later:?}");

    // A retry: an ad-hoc acquire recording the instant it retries.
    let rt = acquired(
        s.acquire(&AcquireRequest {
            resource: &r,
            lease: LEASE,
            node: NODE,
            owner_id: OwnerId::fresh(),
            occurrence: None,
            next_occurrence: None,
            run: Some(RunStart {
                job: &job,
                started_by: StartedBy::Retry,
                scheduled_at: Some(t),
            }),
        })
        .await
        .unwrap(),
        "retry",
    );
    let newest = &runs_of(s, &job).await[0];
    assert_eq!(
        (newest.token, newest.trigger.as_str(), newest.scheduled_at),
        (rt.token, "retry", Some(t))
    );
    must_release(s, &rt).await;
}

/// Retention, in one statement for every job: the newest `keep` runs of
/// each job stay, older ones go, and all runs past the age limit. (On a
/// database of its own: it prunes every job.)
async fn case_run_history_prune_keeps_the_newest(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let (r, job, other) = (resource("prune"), unique("job"), unique("other"));
    let mut tokens = Vec::new();
    for _ in 0..5 {
        let l = acquired(
            acquire_run(s, &r, &job, OwnerId::fresh(), None, StartedBy::Manual).await,
            "run",
        );
        s.finish_run(&end(&l, "succeeded", "")).await.unwrap();
        must_release(s, &l).await;
        tokens.push(l.token);
    }
    let o = acquired(
        acquire_run(
            s,
            &resource("prune-other"),
            &other,
            OwnerId::fresh(),
            None,
            StartedBy::Manual,
        )
        .await,
        "other",
    );
    let long_ago = StoreTime(0);
    assert_eq!(s.prune_runs(2, long_ago).await.unwrap(), 3);
    let kept: Vec<Token> = runs_of(s, &job).await.iter().map(|r| r.token).collect();
    assert_eq!(kept, [tokens[4], tokens[3]]);
    assert_eq!(
        runs_of(s, &other).await.len(),
        1,
        "another job's newest stays"
    );
    assert_eq!(s.prune_runs(2, long_ago).await.unwrap(), 0);
    let future = StoreTime(s.now().await.unwrap().0 + 60_000);
    assert_eq!(s.prune_runs(2, future).await.unwrap(), 3, "age");
    assert!(runs_of(s, &job).await.is_empty());
    assert!(runs_of(s, &other).await.is_empty());
    must_release(s, &o).await;
}

/// A pause is honoured by the scheduled acquire itself: every caller is
/// refused, exactly one per instant is told it was first, nothing is
/// written to the lease, also for a resource never leased; a manual run
/// still wins; an expired pause and a resumed job are not honoured.
async fn case_pause_is_honoured_by_the_acquire(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
async fn case_pause_twice_is_refused_unless_replaced(store: Arc<dyn Store>) {
    let s = store.as_ref();
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
async fn case_triggers_are_claimed_once(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let now = s.now().await.unwrap();
    let request = |id: &str| TriggerInfo {
        id: id.to_string(),
        job: "job".into(),
        requested_at: now,
        requested_by: "ops@host".into(),
        state: "pending".into(),
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
    s.settle_trigger(&a, "started", Some(7), None)
        .await
        .unwrap();
    let t = s.trigger(&a).await.unwrap().unwrap();
    assert_eq!(
        (t.state.as_str(), t.node.as_deref(), t.token),
        ("started", Some("node-a"), Some(7))
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

// --------------------------------------------------------------- the macro

// ------------------------------------------------------- the fencing proxy

async fn admit(store: &dyn Store, r: &Name, token: Token) -> AdmitOutcome {
    store
        .admit(&AdmitRequest {
            resource: r,
            token,
            node: NODE,
            operation_id: Uuid::new_v4(),
        })
        .await
        .expect("admit reaches the store")
}

/// The refusal `out` must be: reason and the token that beat it.
fn refused(out: AdmitOutcome, what: &str) -> (String, Option<Token>) {
    match out {
        AdmitOutcome::Refused(rec) => {
            assert_eq!(
                (rec.kind, rec.stage.as_str(), rec.key.as_deref()),
                (StaleKind::WriteRejected, "proxy", None),
                "{what}: {rec:?}"
            );
            (rec.reason, rec.accepted_token)
        }
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

/// The proxy admits only tokens the store issued for the resource, and
/// never one below the highest it admitted; every refusal is recorded.
async fn case_proxy_admits_issued_tokens_never_older_ones(store: Arc<dyn Store>) {
    let s = store.as_ref();
    let (r, gens) = generations(s, "proxy-admit", 2).await;
    let (old, new) = (gens[0].token, gens[1].token);
    let never = resource("proxy-never-leased");
    assert_eq!(
        refused(admit(s, &never, 1).await, "never leased"),
        ("forged".into(), None)
    );
    assert_eq!(
        refused(admit(s, &r, new + 1).await, "above the fence"),
        ("forged".into(), Some(new))
    );
    assert_eq!(
        refused(admit(s, &r, 0).await, "not positive"),
        ("forged".into(), Some(new))
    );
    // Both were issued; the older passes until the newer was admitted.
    assert_eq!(admit(s, &r, old).await, AdmitOutcome::Admitted);
    assert_eq!(admit(s, &r, old).await, AdmitOutcome::Admitted);
    assert_eq!(admit(s, &r, new).await, AdmitOutcome::Admitted);
    assert_eq!(admit(s, &r, new).await, AdmitOutcome::Admitted);
    assert_eq!(
        refused(admit(s, &r, old).await, "older than the admitted"),
        ("stale".into(), Some(new))
    );
    // Another resource's higher token counts nothing here.
    let (other, other_gens) = generations(s, "proxy-other", 3).await;
    assert_eq!(
        refused(admit(s, &other, other_gens[2].token + 1).await, "forged"),
        ("forged".into(), Some(other_gens[2].token))
    );
    assert_eq!(
        admit(s, &other, other_gens[0].token).await,
        AdmitOutcome::Admitted
    );
    assert_eq!(admit(s, &r, new).await, AdmitOutcome::Admitted);
    let recs = stale_of(s, None, &r).await;
    let got: Vec<_> = recs
        .iter()
        .map(|x| {
            (
                x.reason.as_str(),
                x.token,
                x.accepted_token,
                x.stage.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("forged", new + 1, Some(new), "proxy"),
            ("forged", 0, Some(new), "proxy"),
            ("stale", old, Some(new), "proxy"),
        ]
    );
    assert!(recs.iter().all(|x| x.node == NODE && x.owner_id.is_none()));
    assert_eq!(stale_of(s, None, &never).await.len(), 1);
}

/// Many admissions of an old token race one of a newer token: once the
/// newer one was admitted, no admission of the old one that starts later
/// passes (the check and the raise are one linearisable step).
async fn case_proxy_concurrent_admissions(store: Arc<dyn Store>) {
    const CHECKERS: usize = 6;
    let s = store.as_ref();
    let (r, gens) = generations(s, "proxy-race", 2).await;
    let (old, new) = (gens[0].token, gens[1].token);
    assert_eq!(admit(s, &r, old).await, AdmitOutcome::Admitted);
    let newer_admitted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let old_admitted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(CHECKERS + 1));
    let mut tasks = Vec::new();
    for c in 0..CHECKERS {
        let (store, r, flag, count, barrier) = (
            store.clone(),
            r.clone(),
            newer_admitted.clone(),
            old_admitted.clone(),
            barrier.clone(),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut admitted = 0u32;
            loop {
                let after = flag.load(std::sync::atomic::Ordering::SeqCst);
                match admit(store.as_ref(), &r, old).await {
                    AdmitOutcome::Admitted => {
                        assert!(
                            !after,
                            "checker {c}: old token admitted after the newer one"
                        );
                        admitted += 1;
                        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    AdmitOutcome::Refused(rec) => {
                        assert_eq!(
                            (rec.reason.as_str(), rec.accepted_token),
                            ("stale", Some(new))
                        );
                        return admitted;
                    }
                }
            }
        }));
    }
    barrier.wait().await;
    // The newer token arrives while the checkers are busy admitting.
    while old_admitted.load(std::sync::atomic::Ordering::SeqCst) < CHECKERS * 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(admit(s, &r, new).await, AdmitOutcome::Admitted);
    newer_admitted.store(true, std::sync::atomic::Ordering::SeqCst);
    for t in tasks {
        t.await.expect("checker task");
    }
    assert_eq!(admit(s, &r, new).await, AdmitOutcome::Admitted);
}

/// Opens the backend's store, migrates it, and runs one case under a time
/// limit. Skips (loudly, or fails under CI=true) when the server is not
/// configured.
async fn run_case<F, Fut>(backend: Backend, test: &str, case: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let store = open_store(&ts, 20).await;
    tokio::time::timeout(Duration::from_secs(90), case(store))
        .await
        .unwrap_or_else(|_| panic!("{test} on {backend:?} did not finish within 90 s"));
    drop(ts);
}

macro_rules! backend_tests {
    ($module:ident, $backend:expr, [$($case:ident),* $(,)?]) => {
        mod $module {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    run_case(
                        $backend,
                        concat!(stringify!($module), "::", stringify!($case)),
                        super::$case,
                    )
                    .await;
                }
            )*
        }
    };
}

/// Like [`run_case`], on a database of the case's own.
async fn run_isolated_case<F, Fut>(backend: Backend, test: &str, case: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let test = test.to_string();
    with_fresh_database(&ts, move |url| async move {
        let fresh = TestStore::at(backend, url);
        let store = open_store(&fresh, 20).await;
        tokio::time::timeout(Duration::from_secs(90), case(store))
            .await
            .unwrap_or_else(|_| panic!("{test} on {backend:?} did not finish within 90 s"));
    })
    .await;
}

macro_rules! isolated_tests {
    ($module:ident, $backend:expr, [$($case:ident),* $(,)?]) => {
        mod $module {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    run_isolated_case(
                        $backend,
                        concat!(stringify!($module), "::", stringify!($case)),
                        super::$case,
                    )
                    .await;
                }
            )*
        }
    };
}

/// Cases that change store-wide state, each on a database of its own.
macro_rules! isolated_conformance {
    ($($case:ident),* $(,)?) => {
        isolated_tests!(sqlite_isolated, Backend::Sqlite, [$($case),*]);
        isolated_tests!(postgres_isolated, Backend::Postgres, [$($case),*]);
        isolated_tests!(mysql_isolated, Backend::MySql, [$($case),*]);
    };
}

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        backend_tests!(sqlite, Backend::Sqlite, [$($case),*]);
        backend_tests!(postgres, Backend::Postgres, [$($case),*]);
        backend_tests!(mysql, Backend::MySql, [$($case),*]);
    };
}

conformance!(
    case_token_increases_across_release,
    case_token_increases_across_expiry,
    case_renew_keeps_token,
    case_old_owner_refused,
    case_concurrent_first_acquire,
    case_occurrence_dedup,
    case_occurrence_not_yet_due,
    case_longest_names_round_trip,
    case_put_accepts_equal_token,
    case_put_once,
    case_put_forged,
    case_put_wrong_owner,
    case_put_other_resources_token,
    case_put_after_release_and_expiry,
    case_stale_rejection_recorded,
    case_record_stale_lease_lost,
    case_concurrent_puts,
    case_values_round_trip,
    case_purge_prefix,
    case_release_is_no_takeover,
    case_expiry_is_a_takeover,
    case_preempt_ends_only_an_earlier_instants_lease,
    case_losing_acquire_changes_nothing,
    case_retry_adopts_its_own_win,
    case_retry_adopts_an_expired_win,
    case_superseded_occurrence_is_refused,
    case_give_back_leaves_the_instant_runnable,
    case_give_back_unseen_sweeps_many_at_once,
    case_run_history_records_winners_only,
    case_finish_and_release_ends_the_run_and_frees_the_lease,
    case_pause_is_honoured_by_the_acquire,
    case_pause_twice_is_refused_unless_replaced,
    case_triggers_are_claimed_once,
    case_claim_wins_like_the_acquire,
    case_claim_once_under_concurrency_and_skips_locked_rows,
    case_proxy_admits_issued_tokens_never_older_ones,
    case_proxy_concurrent_admissions,
    case_forget_hides_a_free_lease_and_keeps_its_fence,
);

isolated_conformance!(
    case_epoch_advance,
    case_run_history_prune_keeps_the_newest,
    case_claim_takes_its_share_of_the_live_nodes,
    case_nodes_register_publish_and_are_forgotten,
    case_retention_prunes_stale_records_and_unused_values,
);

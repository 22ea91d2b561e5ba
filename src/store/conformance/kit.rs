//! The helpers every case shares: names, acquisitions, fenced writes,
//! claims and runs as the cases send them, and the reads that check them.

use std::time::Duration;

use uuid::Uuid;

pub(crate) use crate::domain::{LossReason, NodeState, RunOutcome, Stage, TriggerState};
use crate::names::Name;
use crate::store::{
    AcquireOutcome, AcquireRequest, ClaimItem, ClaimOutcome, ClaimRequest, Lease, LeaseInfo,
    OwnerId, PutOutcome, PutRequest, ReleaseOutcome, RunEnd, RunInfo, RunQuery, RunStart,
    StaleRecord, StartedBy, Store, StoreTime, Token,
};

/// A name no other case (or earlier run) uses.
pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::new_v4().simple())
}

pub(crate) const LEASE: Duration = Duration::from_secs(5);

/// An owner id printed as text (as the cases compare them) back as one.
pub(crate) fn oid(s: &str) -> OwnerId {
    s.parse().expect("owner ids are UUIDs")
}

pub(crate) const NODE: &str = "conformance-node";

pub(crate) fn name(kind: &str, s: &str) -> Name {
    Name::parse(kind, s).unwrap_or_else(|e| panic!("{s:?} should be a valid {kind}: {e}"))
}

pub(crate) fn resource(prefix: &str) -> Name {
    name("resource", &unique(prefix))
}

pub(crate) async fn acquire_at(
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

pub(crate) async fn try_acquire(store: &dyn Store, r: &Name) -> AcquireOutcome {
    acquire_at(store, r, LEASE, None).await
}

pub(crate) async fn must_acquire(store: &dyn Store, r: &Name) -> Lease {
    match try_acquire(store, r).await {
        AcquireOutcome::Acquired(l) => l,
        other => panic!("expected to acquire {r}, got {other:?}"),
    }
}

pub(crate) async fn must_release(store: &dyn Store, l: &Lease) {
    let r = name("resource", &l.resource);
    let out = store
        .release(&r, l.owner_id, l.token)
        .await
        .expect("release reaches the store");
    assert_eq!(out, ReleaseOutcome::Released, "releasing {l:?}");
}

/// Acquires and releases `n` generations of a fresh resource; returns the
/// tokens (1..=n) and the resource.
pub(crate) async fn generations(store: &dyn Store, prefix: &str, n: usize) -> (Name, Vec<Lease>) {
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
pub(crate) async fn row(store: &dyn Store, r: &Name) -> LeaseInfo {
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
pub(crate) struct Put<'a> {
    pub(crate) resource: &'a Name,
    pub(crate) key: &'a Name,
    pub(crate) value: &'a [u8],
    pub(crate) token: Token,
    pub(crate) owner_id: &'a str,
    pub(crate) once: bool,
    pub(crate) job: Option<&'a str>,
    pub(crate) stage: &'a str,
    pub(crate) operation_id: Uuid,
}

impl<'a> Put<'a> {
    /// A write as `owner` with `token`: the pair a lease of `resource` came
    /// with, or not.
    pub(crate) fn new(
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

    pub(crate) fn once(mut self) -> Self {
        self.once = true;
        self
    }

    pub(crate) async fn send(&self, store: &dyn Store) -> PutOutcome {
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
                stage: crate::domain::stored(self.stage),
                operation_id: self.operation_id,
            })
            .await
            .expect("put reaches the store")
    }
}

impl Put<'_> {
    pub(crate) fn once_if(self, once: bool) -> Self {
        if once {
            self.once()
        } else {
            self
        }
    }
}

pub(crate) fn assert_accepted(out: &PutOutcome, what: &str) {
    assert!(
        matches!(out, PutOutcome::Accepted { .. }),
        "{what}: expected Accepted, got {out:?}"
    );
}

pub(crate) fn rejection(out: PutOutcome, what: &str) -> StaleRecord {
    match out {
        PutOutcome::Rejected(rec) => *rec,
        other => panic!("{what}: expected Rejected, got {other:?}"),
    }
}

pub(crate) async fn value_of(store: &dyn Store, r: &Name, k: &Name) -> Option<(Vec<u8>, Token)> {
    store
        .get(r, k)
        .await
        .expect("get reaches the store")
        .map(|v| (v.value, v.token))
}

pub(crate) async fn stale_of(
    store: &dyn Store,
    since: Option<StoreTime>,
    r: &Name,
) -> Vec<StaleRecord> {
    store
        .stale(since)
        .await
        .expect("stale reaches the store")
        .into_iter()
        .filter(|s| s.resource == r.as_str())
        .collect()
}

/// Waits until the store's own clock has passed `t`.
pub(crate) async fn wait_until_store_time(store: &dyn Store, t: StoreTime) {
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

/// One attempt at an occurrence, as the daemon sends it: its owner id (one
/// per occurrence and node), the instant and the job's next instant.
pub(crate) async fn attempt(
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

pub(crate) async fn acquire_as(
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

pub(crate) fn acquired(out: AcquireOutcome, what: &str) -> Lease {
    match out {
        AcquireOutcome::Acquired(l) => l,
        other => panic!("{what}: expected to acquire, got {other:?}"),
    }
}

/// One scheduled item per resource (job = resource name) at `at`.
pub(crate) fn claim_items<'a>(rs: &'a [Name], at: StoreTime) -> Vec<ClaimItem<'a>> {
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
pub(crate) async fn claim(
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
pub(crate) async fn released_rows(s: &dyn Store, prefix: &str, n: usize) -> Vec<Name> {
    let mut rs = Vec::new();
    for _ in 0..n {
        let r = resource(prefix);
        let l = must_acquire(s, &r).await;
        must_release(s, &l).await;
        rs.push(r);
    }
    rs
}

/// A scheduled acquire for `job` as a new owner.
pub(crate) async fn acquire_run(
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

pub(crate) async fn runs_of(s: &dyn Store, job: &str) -> Vec<RunInfo> {
    s.runs(&RunQuery {
        job: Some(job),
        limit: 100,
        ..RunQuery::default()
    })
    .await
    .expect("runs reaches the store")
}

pub(crate) fn end(l: &Lease, outcome: &str, output: &'static str) -> RunEnd<'static> {
    RunEnd {
        resource: Box::leak(l.resource.clone().into_boxed_str()),
        token: l.token,
        outcome: outcome.parse().expect("a run outcome"),
        exit_code: Some(3),
        signal: None,
        duration_ms: 1_500,
        elapsed_ms: 1_600,
        output,
    }
}

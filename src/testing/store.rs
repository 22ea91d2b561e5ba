//! `MemoryStore`: the [`Store`] trait in memory, for in-process tests, with
//! faults injected on purpose.
//!
//! Semantics are those of the SQL backends, statement by statement (see the
//! SQLite store's `ACQUIRE`, `RENEW`, `RELEASE`, `GIVE_BACK`, `PUT`): the
//! fence only grows, expiry is decided by the *store's* clock, a scheduled
//! occurrence is taken at most once and only between its being due and its
//! successor's being due, the same owner adopts its own unreleased win of
//! the same occurrence, `give_back` makes an unused occurrence takeable
//! again, a takeover reports the vanished owner, and a loser writes nothing.
//! The losing outcomes are classified by the same shared code the backends
//! use.
//!
//! The store's clock is the test's [`Clock`] plus an offset
//! ([`MemoryStore::set_offset_ms`]), so a test on tokio's paused clock can
//! put this host ahead of or behind its store. Faults ([`Fault`]) are queued
//! per operation: fail the next calls, refuse renewals, or hang a call until
//! a [`Gate`] opens (or forever), its statement committed before the hang
//! (the answer is what is late) or after it (the statement itself waits,
//! and commits when the gate opens even if nobody waits for it any more).
//! Like every real store, each call has a time limit (5 s by default, the
//! daemon's), after which the caller gets `StoreError::Timeout`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::Clock;
use crate::domain::{NodeState, RunState, TriggerState};
use crate::names::Name;
use crate::store::{
    classify_admission, classify_loss, classify_paused, classify_refusal, classify_rejection,
    first_token_of, AcquireOutcome, AcquireRequest, Admission, AdmitOutcome, AdmitRequest, Backend,
    ClaimOutcome, ClaimRequest, Claimed, EpochInfo, Lease, LeaseInfo, LeaseRow, LossRow,
    NewStaleRecord, OwnerId, PauseInfo, PauseSeen, PutOutcome, PutRequest, ReleaseOutcome,
    RenewOutcome, RunEnd, RunInfo, RunQuery, RunStart, StaleKind, StaleRecord, StartedBy, Store,
    StoreError, StoreTime, StoreUrl, StoredValue, Takeover, Token, TriggerInfo, Unseen,
    EPOCH_SHIFT,
};
use crate::store::{BeatAnswer, NodeBeat, NodeInfo, PublishedJob};

/// The operations faults can be aimed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    Migrate,
    Acquire,
    Renew,
    Release,
    GiveBack,
    /// `preempt` (`overlap = "replace"`).
    Preempt,
    /// `claim` (batch claims, as the SQL backends make them).
    Claim,
    /// `give_back_unseen`: one entry per call, how many owner ids it
    /// sweeps (each also logged as a `GiveBack`).
    Sweep,
    Put,
    /// `admit` (the fencing proxy's check).
    Admit,
    RecordStale,
    /// `finish_run`.
    FinishRun,
    /// Every other fleet operation (runs, pauses, triggers).
    Fleet,
    /// The nodes' registry: `beat`, `nodes`, `publish_jobs`,
    /// `published_jobs`, `prune_nodes`.
    Nodes,
}

/// When a hung call's statement takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Commit {
    /// At once; only the answer hangs (a reply lost on a stalled network).
    Before,
    /// When the gate opens, whether or not the caller still waits (a
    /// statement queued behind a lock or a stalled server).
    After,
}

/// One injected fault, for one call.
#[derive(Debug, Clone)]
pub(crate) enum Fault {
    /// The call fails at once ("unreachable"); nothing is written.
    Fail,
    /// The call hangs until the gate opens (forever if it never does).
    Hang(Gate, Commit),
    /// A renewal is refused: another owner holds the lease now.
    Refuse,
    /// A claim decides nothing: `Ask` for every item, nothing written (as
    /// PostgreSQL answers for a new row another caller created while the
    /// claim ran), so every occurrence goes to its single acquire.
    Ask,
}

/// Opens hung calls. Dropping every handle unopened hangs them forever.
#[derive(Debug, Clone)]
pub(crate) struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    pub(crate) fn new() -> Gate {
        Gate(Arc::new(watch::channel(false).0))
    }

    /// Lets every call waiting on this gate go on.
    pub(crate) fn open(&self) {
        self.0.send_replace(true);
    }

    async fn wait(&self) {
        let mut rx = self.0.subscribe();
        // Only an open gate ends the wait; this handle keeps the sender.
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// A lease row, as the SQL tables hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    pub fence: Token,
    pub owner_id: OwnerId,
    pub node: String,
    pub acquired_at: i64,
    pub expires_at: i64,
    pub last_occurrence: Option<i64>,
    pub released: bool,
    pub prev: Option<Takeover>,
}

impl Row {
    /// What an acquire that lost to this row classifies, at `now`.
    fn loss(&self, now: i64) -> LossRow {
        LossRow {
            fence: self.fence,
            owner_id: self.owner_id,
            node: self.node.clone(),
            expires_at: self.expires_at,
            last_occurrence: self.last_occurrence,
            now,
        }
    }
}

/// What the store did, for tests to read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    /// When (tokio's clock).
    pub at: Instant,
    pub op: Op,
    /// `acquired 3`, `adopted 3`, `held`, `taken`, `not_yet_due`,
    /// `superseded`, `renewed`, `refused`, `released`, `failed`,
    /// `hung`, `timed_out`, …
    pub what: String,
}

#[derive(Default)]
struct State {
    /// Store clock minus test clock, in milliseconds.
    offset_ms: i64,
    epoch: i64,
    leases: BTreeMap<String, Row>,
    values: BTreeMap<(String, String), StoredValue>,
    /// `lease forget`: when each forgotten row was forgotten
    /// (`forgotten_at_ms`).
    forgotten: BTreeMap<String, i64>,
    stale: Vec<StaleRecord>,
    faults: HashMap<Op, VecDeque<Fault>>,
    history: Vec<Entry>,
    /// Run history rows; an unfinished row has no `finished_at` (its
    /// `outcome` is derived when read).
    runs: Vec<RunInfo>,
    /// Pauses by job, with the instant last noted as skipped.
    pauses: BTreeMap<String, (PauseInfo, Option<i64>)>,
    triggers: Vec<TriggerInfo>,
    /// Node rows (`fencecron_nodes`), by node id.
    nodes: BTreeMap<String, NodeInfo>,
    /// Published job definitions (`fencecron_node_jobs`), by node and job.
    node_jobs: BTreeMap<(String, String), (String, String)>,
    /// The fencing proxy's highest admitted token per resource
    /// (`fencecron_proxy_fences`).
    proxy: BTreeMap<String, Token>,
    /// Every claim answered: who asked, for what.
    claims: Vec<ClaimSeen>,
}

/// One claim the store answered ([`MemoryStore::claims`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClaimSeen {
    /// When (tokio's clock).
    pub at: Instant,
    pub node: String,
    /// The items' resources, in the request's order.
    pub resources: Vec<String>,
    /// Whether the claim was bounded by the node's share.
    pub share: bool,
}

impl State {
    fn note(&mut self, op: Op, what: impl Into<String>) {
        self.history.push(Entry {
            at: Instant::now(),
            op,
            what: what.into(),
        });
    }
}

/// The in-memory store. Cheap to clone; clones share the state.
#[derive(Clone)]
pub(crate) struct MemoryStore {
    url: StoreUrl,
    clock: Clock,
    call_timeout: Option<Duration>,
    state: Arc<Mutex<State>>,
    outages: Arc<crate::store::Outages>,
}

impl MemoryStore {
    /// A store whose clock is `clock` (plus an offset, 0 until set), with
    /// the daemon's 5 s limit on each call.
    pub(crate) fn new(clock: Clock) -> MemoryStore {
        MemoryStore {
            url: StoreUrl::parse("sqlite://in-memory-test-store").expect("a valid URL"),
            clock,
            call_timeout: Some(Duration::from_secs(5)),
            state: Arc::default(),
            outages: Arc::default(),
        }
    }

    /// Sets the time limit of each call (`None`: wait as long as it takes).
    pub(crate) fn with_call_timeout(mut self, limit: Option<Duration>) -> MemoryStore {
        self.call_timeout = limit;
        self
    }

    /// Marks `node` as having claimed now (it counts for a claim's share).
    pub(crate) fn node_seen(&self, node: &str) {
        let now = self.now_ms();
        mark(&mut self.lock(), node, now);
    }

    /// Puts the store's clock `ms` milliseconds ahead of the test's clock
    /// (behind when negative).
    pub(crate) fn set_offset_ms(&self, ms: i64) {
        self.lock().offset_ms = ms;
    }

    /// Queues `fault` for the next `times` calls of `op`.
    pub(crate) fn fault(&self, op: Op, fault: Fault, times: usize) {
        let mut s = self.lock();
        let queue = s.faults.entry(op).or_default();
        queue.extend(std::iter::repeat_n(fault, times));
    }

    /// Drops every queued fault.
    #[allow(dead_code)]
    pub(crate) fn heal(&self) {
        self.lock().faults.clear();
    }

    /// The lease row of `resource`.
    pub(crate) fn row(&self, resource: &str) -> Option<Row> {
        self.lock().leases.get(resource).cloned()
    }

    /// What the store did for `op`, in order (see [`Entry::what`]).
    pub(crate) fn history(&self, op: Op) -> Vec<String> {
        self.entries(op).into_iter().map(|e| e.what).collect()
    }

    /// What the store did for `op`, with times.
    pub(crate) fn entries(&self, op: Op) -> Vec<Entry> {
        self.lock()
            .history
            .iter()
            .filter(|e| e.op == op)
            .cloned()
            .collect()
    }

    /// Every claim answered, in order.
    pub(crate) fn claims(&self) -> Vec<ClaimSeen> {
        self.lock().claims.clone()
    }

    /// The store's clock now, in milliseconds.
    pub(crate) fn now_ms(&self) -> i64 {
        let offset = self.lock().offset_ms;
        store_ms(self.clock, offset)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn unavailable(&self) -> StoreError {
        StoreError::Unavailable {
            url: self.url.to_string(),
            source: sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "injected fault",
            )),
        }
    }

    /// Runs one call: its fault, if one is queued, then `apply` on the
    /// state at the store's clock, all under the call's time limit.
    async fn call<T: Send + 'static>(
        &self,
        op: Op,
        apply: impl FnOnce(&mut State, i64) -> T + Send + 'static,
    ) -> Result<T, StoreError> {
        let fault = self
            .lock()
            .faults
            .get_mut(&op)
            .and_then(VecDeque::pop_front);
        let work = async {
            match fault {
                None => Ok(self.apply(apply)),
                Some(Fault::Fail) => {
                    self.lock().note(op, "failed");
                    Err(self.unavailable())
                }
                Some(Fault::Refuse) => Err(StoreError::Corrupt {
                    url: self.url.to_string(),
                    detail: format!("Fault::Refuse is for renewals, not {op:?}"),
                }),
                Some(Fault::Ask) => Err(StoreError::Corrupt {
                    url: self.url.to_string(),
                    detail: format!("Fault::Ask is for claims, not {op:?}"),
                }),
                Some(Fault::Hang(gate, Commit::Before)) => {
                    let answer = self.apply(apply);
                    self.lock().note(op, "hung");
                    gate.wait().await;
                    Ok(answer)
                }
                Some(Fault::Hang(gate, Commit::After)) => {
                    self.lock().note(op, "hung");
                    // The statement runs when the gate opens, whether or not
                    // its caller still waits for the answer.
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    let store = self.clone();
                    tokio::spawn(async move {
                        gate.wait().await;
                        let _ = tx.send(store.apply(apply));
                    });
                    match rx.await {
                        Ok(answer) => Ok(answer),
                        Err(_) => std::future::pending().await,
                    }
                }
            }
        };
        match self.call_timeout {
            None => work.await,
            Some(limit) => match tokio::time::timeout(limit, work).await {
                Ok(r) => r,
                Err(_) => {
                    self.lock().note(op, "timed_out");
                    Err(StoreError::Timeout {
                        url: self.url.to_string(),
                        limit,
                    })
                }
            },
        }
    }

    fn apply<T>(&self, apply: impl FnOnce(&mut State, i64) -> T) -> T {
        let mut s = self.lock();
        let now = store_ms(self.clock, s.offset_ms);
        apply(&mut s, now)
    }

    /// A renewal that a [`Fault::Refuse`] turns down.
    fn refused_renewal(&self, resource: &str) -> RenewOutcome {
        let s = self.lock();
        let fence = s.leases.get(resource).map_or(0, |r| r.fence);
        RenewOutcome::Refused(crate::store::Refusal::NotOwner {
            current_owner: OwnerId::fresh(),
            current_token: fence + 1,
        })
    }
}

fn store_ms(clock: Clock, offset_ms: i64) -> i64 {
    clock.now().timestamp_millis() + offset_ms
}

fn millis(d: Duration) -> i64 {
    crate::store::millis(d)
}

/// `acquire` on the state, as the SQL statements do it.
fn acquire(s: &mut State, now: i64, req: &OwnedAcquire) -> AcquireOutcome {
    let occ = req.occurrence.map(|o| o.0);
    let next = req.next_occurrence.map(|o| o.0);
    let floor = first_token_of(s.epoch);
    let due = occ.is_none_or(|o| o <= now) && next.is_none_or(|n| n > now);
    let honours_pause = |by: &StartedBy| occ.is_some() || *by == StartedBy::Retry;
    if let Some((job, _, _)) = req.run.as_ref().filter(|(_, by, _)| honours_pause(by)) {
        if let Some((pause, last_skipped)) = s.pauses.get_mut(job) {
            if pause.until.is_none_or(|u| u.0 > now) {
                let first = occ.is_some_and(|occ| due && last_skipped.is_none_or(|l| l < occ));
                if first {
                    *last_skipped = occ;
                }
                let seen = PauseSeen {
                    note: pause.note.clone(),
                    until: pause.until.map(|u| u.0),
                    first,
                };
                return classify_paused(seen, &req.borrowed(), now);
            }
        }
    }
    let out = acquire_lease(s, now, req, floor, due);
    if let (AcquireOutcome::Acquired(lease), Some((job, by, at))) = (&out, &req.run) {
        let exists = s
            .runs
            .iter()
            .any(|r| r.resource == req.resource && r.token == lease.token);
        if !exists {
            let started_at = s.leases.get(&req.resource).map_or(now, |r| r.acquired_at);
            s.runs.push(RunInfo {
                job: job.clone(),
                resource: req.resource.clone(),
                scheduled_at: *at,
                trigger: by.as_str().to_string(),
                node: req.node.clone(),
                owner_id: req.owner_id,
                token: lease.token,
                started_at: StoreTime(started_at),
                finished_at: None,
                // Until it ends, `runs` says whether it still runs.
                outcome: RunState::Unknown,
                exit_code: None,
                signal: None,
                duration_ms: None,
                output: None,
            });
        }
    }
    out
}

/// The lease part of `acquire`.
fn acquire_lease(
    s: &mut State,
    now: i64,
    req: &OwnedAcquire,
    floor: Token,
    due: bool,
) -> AcquireOutcome {
    let owner = req.owner_id;
    let occ = req.occurrence.map(|o| o.0);
    let next = req.next_occurrence.map(|o| o.0);
    let lease = millis(req.lease);
    let Some(row) = s.leases.get_mut(&req.resource) else {
        if occ.is_some_and(|o| o > now) {
            return AcquireOutcome::NotYetDue {
                store_now: StoreTime(now),
            };
        }
        if next.is_some_and(|n| n <= now) {
            return AcquireOutcome::Superseded {
                store_now: StoreTime(now),
            };
        }
        let row = Row {
            fence: floor,
            owner_id: owner,
            node: req.node.clone(),
            acquired_at: now,
            expires_at: now + lease,
            last_occurrence: occ,
            released: false,
            prev: None,
        };
        let lease = lease_of(req, &row);
        s.leases.insert(req.resource.clone(), row);
        return AcquireOutcome::Acquired(lease);
    };
    let adopt =
        occ.is_some() && row.owner_id == owner && row.last_occurrence == occ && !row.released;
    let free = row.expires_at <= now
        && (occ.is_none() || row.last_occurrence.is_none_or(|l| Some(l) < occ));
    if !((free || adopt) && due) {
        return classify_loss(row.loss(now), &req.borrowed());
    }
    if adopt {
        row.expires_at = row.expires_at.max(now + lease);
    } else {
        row.prev = (!row.released).then(|| Takeover {
            owner_id: row.owner_id,
            node: row.node.clone(),
            token: row.fence,
            expired_at: StoreTime(row.expires_at),
        });
        row.fence = (row.fence + 1).max(floor);
        row.acquired_at = now;
        row.expires_at = now + lease;
    }
    row.owner_id = owner;
    row.node = req.node.clone();
    row.released = false;
    row.last_occurrence = occ.or(row.last_occurrence);
    AcquireOutcome::Acquired(lease_of(req, row))
}

fn lease_of(req: &OwnedAcquire, row: &Row) -> Lease {
    Lease {
        resource: req.resource.clone(),
        owner_id: req.owner_id,
        token: row.fence,
        expires_at: StoreTime(row.expires_at),
        taken_over: row.prev.clone(),
    }
}

/// An [`AcquireRequest`] that a late statement can own.
struct OwnedAcquire {
    resource: String,
    name: Name,
    lease: Duration,
    node: String,
    owner_id: OwnerId,
    occurrence: Option<StoreTime>,
    next_occurrence: Option<StoreTime>,
    run: Option<(String, StartedBy, Option<StoreTime>)>,
}

impl OwnedAcquire {
    fn of(req: &AcquireRequest<'_>) -> OwnedAcquire {
        OwnedAcquire {
            resource: req.resource.to_string(),
            name: req.resource.clone(),
            lease: req.lease,
            node: req.node.to_string(),
            owner_id: req.owner_id,
            occurrence: req.occurrence,
            next_occurrence: req.next_occurrence,
            run: req
                .run
                .map(|r| (r.job.to_string(), r.started_by, r.scheduled_at)),
        }
    }

    fn borrowed(&self) -> AcquireRequest<'_> {
        AcquireRequest {
            resource: &self.name,
            lease: self.lease,
            node: &self.node,
            owner_id: self.owner_id,
            occurrence: self.occurrence,
            next_occurrence: self.next_occurrence,
            run: self.run.as_ref().map(|(job, by, at)| RunStart {
                job,
                started_by: *by,
                scheduled_at: *at,
            }),
        }
    }
}

fn describe_acquire(out: &AcquireOutcome, adopted: bool) -> String {
    match out {
        AcquireOutcome::Acquired(l) if adopted => format!("adopted {}", l.token),
        AcquireOutcome::Acquired(l) => format!("acquired {}", l.token),
        AcquireOutcome::Held { .. } | AcquireOutcome::LostRace => "held".to_string(),
        AcquireOutcome::OccurrenceTaken { .. } => "taken".to_string(),
        AcquireOutcome::NotYetDue { .. } => "not_yet_due".to_string(),
        AcquireOutcome::Superseded { .. } => "superseded".to_string(),
        AcquireOutcome::Paused { first: true, .. } => "paused first".to_string(),
        AcquireOutcome::Paused { .. } => "paused".to_string(),
    }
}

fn refusal_row(s: &State, resource: &str) -> Option<LeaseRow> {
    s.leases.get(resource).map(|r| LeaseRow {
        owner_id: r.owner_id,
        fence: r.fence,
        expires_at: r.expires_at,
    })
}

#[async_trait]
impl Store for MemoryStore {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    fn url(&self) -> &StoreUrl {
        &self.url
    }

    fn outages(&self) -> &crate::store::Outages {
        &self.outages
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.call(Op::Migrate, |_, _| ()).await
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        let req = OwnedAcquire::of(req);
        self.call(Op::Acquire, move |s, now| {
            let before = s.leases.get(&req.resource).cloned();
            let out = acquire(s, now, &req);
            let adopted = matches!(&out, AcquireOutcome::Acquired(l)
                if before.as_ref().is_some_and(|b| b.fence == l.token));
            s.note(Op::Acquire, describe_acquire(&out, adopted));
            out
        })
        .await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let node = req.node.to_string();
        let items: Vec<OwnedAcquire> = req
            .items
            .iter()
            .map(|i| OwnedAcquire::of(&i.as_acquire(req.node)))
            .collect();
        let (limit, share) = (req.limit, req.share);
        let ask = {
            let mut s = self.lock();
            let q = s.faults.get_mut(&Op::Claim);
            if q.as_ref()
                .is_some_and(|q| matches!(q.front(), Some(Fault::Ask)))
            {
                q.and_then(VecDeque::pop_front);
                s.note(Op::Claim, "asked");
                true
            } else {
                false
            }
        };
        if ask {
            return Ok(ClaimOutcome {
                items: vec![Claimed::Ask; items.len()],
                limit,
            });
        }
        self.call(Op::Claim, move |s, now| {
            let others = s
                .nodes
                .values()
                .filter(|n| n.node != node && n.live(StoreTime(now)))
                .count();
            mark(s, &node, now);
            let limit = if share {
                limit.min(items.len().div_ceil(others + 1) + 1)
            } else {
                limit
            };
            let mut won = 0;
            let mut out = Vec::with_capacity(items.len());
            for req in &items {
                let job = req.run.as_ref().map(|(j, _, _)| j.as_str()).unwrap_or("");
                let paused = s
                    .pauses
                    .get(job)
                    .is_some_and(|(p, _)| p.until.is_none_or(|u| u.0 > now));
                let (occ, next) = (
                    req.occurrence.map_or(0, |o| o.0),
                    req.next_occurrence.map(|n| n.0),
                );
                let due = occ <= now && next.is_none_or(|n| n > now);
                if paused {
                    out.push(Claimed::Ask);
                    continue;
                }
                // Never leased: created and won as the first acquisition
                // would (within the limit), or left to the single acquire
                // while not due.
                let row = s.leases.get(&req.resource);
                let takeable = row.is_none_or(|row| {
                    row.expires_at <= now && row.last_occurrence.is_none_or(|l| l < occ)
                }) && due;
                if row.is_none() && !takeable {
                    out.push(Claimed::Ask);
                    continue;
                }
                let loss = row.filter(|_| !takeable).map(|row| row.loss(now));
                out.push(if takeable && won < limit {
                    won += 1;
                    match acquire(s, now, req) {
                        AcquireOutcome::Acquired(l) => Claimed::Won(l),
                        other => Claimed::from_loss(other),
                    }
                } else if let Some(loss) = loss {
                    Claimed::from_loss(classify_loss(loss, &req.borrowed()))
                } else {
                    Claimed::Skipped
                });
            }
            let what: Vec<String> = out
                .iter()
                .map(|c| match c {
                    Claimed::Won(l) => format!("won {}", l.token),
                    Claimed::Lost(_) => "lost".to_string(),
                    Claimed::Skipped => "skipped".to_string(),
                    Claimed::Ask => "ask".to_string(),
                })
                .collect();
            s.note(Op::Claim, format!("limit {limit}: {}", what.join(", ")));
            s.claims.push(ClaimSeen {
                at: Instant::now(),
                node: node.clone(),
                resources: items.iter().map(|i| i.resource.to_string()).collect(),
                share,
            });
            ClaimOutcome { items: out, limit }
        })
        .await
    }

    async fn renew(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        let resource = resource.to_string();
        let refuse = {
            let mut s = self.lock();
            let q = s.faults.get_mut(&Op::Renew);
            if q.as_ref()
                .is_some_and(|q| matches!(q.front(), Some(Fault::Refuse)))
            {
                q.and_then(VecDeque::pop_front);
                s.note(Op::Renew, "refused");
                true
            } else {
                false
            }
        };
        if refuse {
            return Ok(self.refused_renewal(&resource));
        }
        self.call(Op::Renew, move |s, now| {
            let out = match s.leases.get_mut(&resource) {
                Some(r) if owner_id == r.owner_id && r.fence == token && r.expires_at > now => {
                    r.expires_at = now + millis(lease);
                    RenewOutcome::Renewed {
                        expires_at: StoreTime(r.expires_at),
                    }
                }
                _ => RenewOutcome::Refused(classify_refusal(
                    refusal_row(s, &resource),
                    owner_id,
                    token,
                )),
            };
            let what = match &out {
                RenewOutcome::Renewed { .. } => "renewed",
                RenewOutcome::Refused(_) => "refused",
            };
            s.note(Op::Renew, what);
            out
        })
        .await
    }

    async fn release(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<ReleaseOutcome, StoreError> {
        let resource = resource.to_string();
        self.call(Op::Release, move |s, now| {
            let out = match s.leases.get_mut(&resource) {
                Some(r) if owner_id == r.owner_id && r.fence == token => {
                    r.expires_at = r.expires_at.min(now);
                    r.released = true;
                    ReleaseOutcome::Released
                }
                _ => ReleaseOutcome::Refused(classify_refusal(
                    refusal_row(s, &resource),
                    owner_id,
                    token,
                )),
            };
            let what = match &out {
                ReleaseOutcome::Released => format!("released {token}"),
                ReleaseOutcome::Refused(_) => "refused".to_string(),
            };
            s.note(Op::Release, what);
            out
        })
        .await
    }

    async fn give_back_unseen(&self, items: &[Unseen<'_>]) -> Result<Vec<bool>, StoreError> {
        let n = items.len();
        self.call(Op::Sweep, move |s, _| s.note(Op::Sweep, n.to_string()))
            .await?;
        crate::store::give_back_each(self, items).await
    }

    async fn give_back(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Option<Token>,
        occurrence: StoreTime,
    ) -> Result<ReleaseOutcome, StoreError> {
        let resource = resource.to_string();
        let occ = occurrence.0;
        self.call(Op::GiveBack, move |s, now| {
            let out = match s.leases.get_mut(&resource) {
                Some(r)
                    if owner_id == r.owner_id
                        && (Some(r.fence) == token
                            || (token.is_none()
                                && !r.released
                                && r.last_occurrence == Some(occ))) =>
                {
                    r.expires_at = r.expires_at.min(now);
                    r.released = true;
                    if r.last_occurrence == Some(occ) {
                        r.last_occurrence = Some(occ - 1);
                    }
                    s.runs.retain(|run| {
                        !(run.resource == resource
                            && owner_id == run.owner_id
                            && run.finished_at.is_none())
                    });
                    ReleaseOutcome::Released
                }
                _ => ReleaseOutcome::Refused(classify_refusal(
                    refusal_row(s, &resource),
                    owner_id,
                    token.unwrap_or(0),
                )),
            };
            let what = match (&out, token) {
                (ReleaseOutcome::Released, Some(t)) => format!("given_back {t}"),
                (ReleaseOutcome::Released, None) => "given_back".to_string(),
                (ReleaseOutcome::Refused(_), _) => "refused".to_string(),
            };
            s.note(Op::GiveBack, what);
            out
        })
        .await
    }

    async fn preempt(
        &self,
        resource: &Name,
        token: Token,
        occurrence: StoreTime,
    ) -> Result<bool, StoreError> {
        let resource = resource.to_string();
        let occ = occurrence.0;
        self.call(Op::Preempt, move |s, _| {
            let ended = match s.leases.get_mut(&resource) {
                Some(r)
                    if r.fence == token
                        && !r.released
                        && r.expires_at > r.acquired_at
                        && r.last_occurrence.is_none_or(|last| last < occ) =>
                {
                    r.expires_at = r.acquired_at;
                    true
                }
                _ => false,
            };
            s.note(
                Op::Preempt,
                if ended {
                    format!("preempted {token}")
                } else {
                    "refused".to_string()
                },
            );
            ended
        })
        .await
    }

    async fn list(&self) -> Result<Vec<LeaseInfo>, StoreError> {
        Ok(self.apply(|s, now| {
            s.leases
                .iter()
                .filter(|(resource, r)| {
                    s.forgotten
                        .get(*resource)
                        .is_none_or(|f| r.acquired_at >= *f)
                })
                .map(|(resource, r)| LeaseInfo {
                    resource: resource.clone(),
                    owner_id: r.owner_id,
                    node: r.node.clone(),
                    token: r.fence,
                    expires_at: StoreTime(r.expires_at),
                    held: r.expires_at > now,
                    last_occurrence: r.last_occurrence.map(StoreTime),
                })
                .collect()
        }))
    }

    async fn put(&self, req: &PutRequest<'_>) -> Result<PutOutcome, StoreError> {
        let resource = req.resource.to_string();
        let key = req.key.to_string();
        let value = req.value.to_vec();
        let (token, once) = (req.token, req.once);
        let owner_id = req.owner_id;
        let (node, job, stage) = (
            req.node.to_string(),
            req.job.map(str::to_string),
            req.stage.clone(),
        );
        let op = req.operation_id.to_string();
        self.call(Op::Put, move |s, now| {
            // The SQL write boundary: the resource's current token from the
            // owner it was issued to, and the key's rule.
            let lease = s.leases.get(&resource).map(|r| (r.fence, r.owner_id));
            let slot = (resource.clone(), key.clone());
            let accepted = s.values.get(&slot).map(|v| v.token);
            let writes = lease
                .as_ref()
                .is_some_and(|(fence, owner)| *fence == token && *owner == owner_id)
                && accepted.is_none_or(|a| a < token || (a == token && !once));
            if writes {
                s.values.insert(
                    slot,
                    StoredValue {
                        resource,
                        key,
                        value,
                        token,
                        owner_id: Some(owner_id),
                        written_at: StoreTime(now),
                    },
                );
                return PutOutcome::Accepted {
                    written_at: StoreTime(now),
                };
            }
            let lease = lease
                .as_ref()
                .map(|(fence, owner)| (*fence, owner.as_str()));
            let Some(rejection) =
                classify_rejection(token, owner_id.as_str(), once, accepted, lease)
            else {
                return PutOutcome::AlreadyApplied;
            };
            let rec = NewStaleRecord {
                kind: StaleKind::WriteRejected,
                reason: rejection.reason.into(),
                resource: &resource,
                key: Some(&key),
                owner_id: Some(owner_id),
                token,
                accepted_token: rejection.accepted_token,
                node: &node,
                job: job.as_deref(),
                stage,
                operation_id: &op,
            }
            .stored(now);
            s.stale.push(rec.clone());
            PutOutcome::Rejected(Box::new(rec))
        })
        .await
    }

    async fn admit(&self, req: &AdmitRequest<'_>) -> Result<AdmitOutcome, StoreError> {
        let name = req.resource.clone();
        let (token, node) = (req.token, req.node.to_string());
        let resource = name.to_string();
        let op = req.operation_id.to_string();
        let id = req.operation_id;
        self.call(Op::Admit, move |s, now| {
            let req = AdmitRequest {
                resource: &name,
                token,
                node: &node,
                operation_id: id,
            };
            let issued = s.leases.get(&resource).map(|r| r.fence);
            let mut raised = false;
            loop {
                let highest = s.proxy.get(&resource).copied();
                match classify_admission(req.token, highest, issued, raised) {
                    Admission::Admit => return AdmitOutcome::Admitted,
                    Admission::Raise => {
                        s.proxy.insert(resource.clone(), req.token);
                        raised = true;
                    }
                    Admission::Refuse(reason, accepted) => {
                        let rec = req.record(reason, accepted, &op).stored(now);
                        s.stale.push(rec.clone());
                        return AdmitOutcome::Refused(Box::new(rec));
                    }
                }
            }
        })
        .await
    }

    async fn get(&self, resource: &Name, key: &Name) -> Result<Option<StoredValue>, StoreError> {
        let slot = (resource.to_string(), key.to_string());
        Ok(self.lock().values.get(&slot).cloned())
    }

    async fn record_stale(&self, rec: &NewStaleRecord<'_>) -> Result<StaleRecord, StoreError> {
        let rec = rec.stored(0);
        self.call(Op::RecordStale, move |s, now| {
            let rec = StaleRecord {
                at: StoreTime(now),
                ..rec
            };
            s.stale.push(rec.clone());
            rec
        })
        .await
    }

    async fn stale(&self, since: Option<StoreTime>) -> Result<Vec<StaleRecord>, StoreError> {
        let s = self.lock();
        let mut out: Vec<StaleRecord> = s
            .stale
            .iter()
            .filter(|r| since.is_none_or(|t| r.at >= t))
            .cloned()
            .collect();
        // Stable: records of the same millisecond stay in insertion order.
        out.sort_by_key(|r| r.at);
        Ok(out)
    }

    async fn latest_stale(
        &self,
        since: StoreTime,
        limit: u32,
    ) -> Result<Vec<StaleRecord>, StoreError> {
        let mut out = self.stale(Some(since)).await?;
        out.reverse();
        out.truncate(limit as usize);
        Ok(out)
    }

    async fn now(&self) -> Result<StoreTime, StoreError> {
        Ok(StoreTime(self.now_ms()))
    }

    async fn epoch(&self) -> Result<EpochInfo, StoreError> {
        let s = self.lock();
        let highest = s.leases.values().map(|r| r.fence).max();
        Ok(EpochInfo::new(s.epoch, None, highest))
    }

    async fn advance_epoch(&self) -> Result<EpochInfo, StoreError> {
        let mut s = self.lock();
        let highest = s.leases.values().map(|r| r.fence).max();
        s.epoch = s.epoch.max(highest.unwrap_or(0) >> EPOCH_SHIFT) + 1;
        Ok(EpochInfo::new(s.epoch, None, highest))
    }

    async fn finish_run(&self, end: &RunEnd<'_>) -> Result<bool, StoreError> {
        let (resource, token) = (end.resource.to_string(), end.token);
        let (outcome, signal) = (RunState::from(end.outcome), end.signal.map(str::to_string));
        let (exit_code, duration_ms) = (end.exit_code.map(i64::from), end.duration_ms);
        let (elapsed, output) = (end.elapsed_ms, end.output.to_string());
        self.call(Op::FinishRun, move |s, _| {
            let run = s
                .runs
                .iter_mut()
                .find(|r| r.resource == resource && r.token == token && r.finished_at.is_none());
            let Some(run) = run else { return false };
            run.finished_at = Some(StoreTime(run.started_at.0 + elapsed));
            run.outcome = outcome;
            run.exit_code = exit_code;
            run.signal = signal;
            run.duration_ms = Some(duration_ms);
            run.output = Some(output);
            s.note(Op::FinishRun, format!("finished {token}"));
            true
        })
        .await
    }

    async fn runs(&self, q: &RunQuery<'_>) -> Result<Vec<RunInfo>, StoreError> {
        let job = q.job.map(str::to_string);
        let outcome = q.outcome.map(RunState::Ended);
        let node = q.node.map(str::to_string);
        let owner_id = q.owner_id;
        let (since, limit) = (q.since.map_or(i64::MIN, |t| t.0), q.limit as usize);
        self.call(Op::Fleet, move |s, now| {
            let mut found: Vec<RunInfo> = s
                .runs
                .iter()
                .filter(|r| job.as_ref().is_none_or(|j| &r.job == j) && r.started_at.0 >= since)
                .filter(|r| outcome.as_ref().is_none_or(|o| &r.outcome == o))
                .filter(|r| node.as_ref().is_none_or(|n| &r.node == n))
                .filter(|r| owner_id.as_ref().is_none_or(|o| &r.owner_id == o))
                .cloned()
                .collect();
            found.reverse();
            found.sort_by_key(|r| std::cmp::Reverse(r.started_at));
            found.truncate(limit);
            for r in &mut found {
                if r.finished_at.is_none() {
                    let lease = s.leases.get(&r.resource);
                    let held = lease.is_some_and(|l| {
                        l.fence == r.token && l.owner_id == r.owner_id && l.expires_at > now
                    });
                    r.outcome = if held {
                        RunState::Running
                    } else {
                        RunState::Unknown
                    };
                }
            }
            found
        })
        .await
    }

    async fn prune_runs(&self, keep: u32, before: StoreTime) -> Result<u64, StoreError> {
        self.call(Op::Fleet, move |s, _| {
            let count = s.runs.len();
            let mut newer: HashMap<String, u32> = HashMap::new();
            let mut keep_flags = vec![true; count];
            for (i, r) in s.runs.iter().enumerate().rev() {
                let n = newer.entry(r.job.clone()).or_default();
                *n += 1;
                keep_flags[i] = *n <= keep.max(1) && r.started_at >= before;
            }
            let mut flags = keep_flags.into_iter();
            s.runs.retain(|_| flags.next().unwrap_or(true));
            (count - s.runs.len()) as u64
        })
        .await
    }

    async fn pause(
        &self,
        pause: &PauseInfo,
        replace: bool,
    ) -> Result<Option<PauseInfo>, StoreError> {
        let pause = pause.clone();
        self.call(Op::Fleet, move |s, _| {
            let old = s.pauses.get(&pause.job);
            if let Some((p, _)) = old {
                let ended = p.until.is_some_and(|u| u <= pause.since);
                if !replace && !ended {
                    return Some(p.clone());
                }
            }
            let last = old.and_then(|p| p.1);
            s.pauses.insert(pause.job.clone(), (pause, last));
            None
        })
        .await
    }

    async fn resume(&self, job: &str) -> Result<bool, StoreError> {
        let job = job.to_string();
        self.call(Op::Fleet, move |s, _| s.pauses.remove(&job).is_some())
            .await
    }

    async fn pauses(&self, now: StoreTime) -> Result<Vec<PauseInfo>, StoreError> {
        self.call(Op::Fleet, move |s, _| {
            s.note(Op::Fleet, "pauses");
            s.pauses
                .values()
                .filter(|(p, _)| p.until.is_none_or(|u| u > now))
                .map(|(p, _)| p.clone())
                .collect()
        })
        .await
    }

    async fn request_trigger(&self, trigger: &TriggerInfo) -> Result<(), StoreError> {
        let trigger = trigger.clone();
        self.call(Op::Fleet, move |s, _| s.triggers.push(trigger))
            .await
    }

    async fn trigger(&self, id: &str) -> Result<Option<TriggerInfo>, StoreError> {
        let id = id.to_string();
        self.call(Op::Fleet, move |s, _| {
            s.triggers.iter().find(|t| t.id == id).cloned()
        })
        .await
    }

    async fn pending_triggers(&self) -> Result<Vec<TriggerInfo>, StoreError> {
        self.call(Op::Fleet, |s, _| {
            s.note(Op::Fleet, "pending_triggers");
            s.triggers
                .iter()
                .filter(|t| t.state == TriggerState::Pending)
                .cloned()
                .collect()
        })
        .await
    }

    async fn claim_trigger(&self, id: &str, node: &str) -> Result<bool, StoreError> {
        let (id, node) = (id.to_string(), node.to_string());
        self.call(Op::Fleet, move |s, _| {
            match s
                .triggers
                .iter_mut()
                .find(|t| t.id == id && t.state == TriggerState::Pending)
            {
                Some(t) => {
                    t.state = TriggerState::Claimed;
                    t.node = Some(node);
                    true
                }
                None => false,
            }
        })
        .await
    }

    async fn settle_trigger(
        &self,
        id: &str,
        state: crate::domain::TriggerState,
        token: Option<Token>,
        detail: Option<&str>,
    ) -> Result<(), StoreError> {
        let id = id.to_string();
        let detail = detail.map(str::to_string);
        self.call(Op::Fleet, move |s, _| {
            if let Some(t) = s.triggers.iter_mut().find(|t| t.id == id) {
                t.state = state;
                t.token = token;
                t.detail = detail;
            }
        })
        .await
    }

    async fn cancel_trigger(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.call(Op::Fleet, move |s, _| {
            let before = s.triggers.len();
            s.triggers
                .retain(|t| !(t.id == id && t.state == TriggerState::Pending));
            s.triggers.len() < before
        })
        .await
    }

    async fn prune_fleet(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call(Op::Fleet, move |s, _| {
            let n = s.triggers.len() + s.pauses.len();
            s.triggers.retain(|t| t.requested_at >= before);
            s.pauses
                .retain(|_, (p, _)| p.until.is_none_or(|u| u >= before));
            (n - s.triggers.len() - s.pauses.len()) as u64
        })
        .await
    }

    async fn beat(&self, beat: &NodeBeat<'_>) -> Result<BeatAnswer, StoreError> {
        let row = NodeInfo {
            node: beat.node.to_string(),
            hostname: beat.hostname.to_string(),
            pid: i64::from(beat.pid),
            version: beat.version.to_string(),
            config_digest: beat.config_digest.to_string(),
            started_at: beat.started_at.unwrap_or(StoreTime(0)),
            last_seen: StoreTime(0),
            state: beat.state.clone(),
            running: i64::from(beat.running),
        };
        let started = beat.started_at;
        self.call(Op::Nodes, move |s, now| {
            let now = StoreTime(now);
            let row = NodeInfo {
                started_at: started.unwrap_or(now),
                last_seen: now,
                ..row
            };
            s.nodes.insert(row.node.clone(), row);
            let live = s.nodes.values().filter(|n| n.live(now)).cloned().collect();
            BeatAnswer { now, live }
        })
        .await
    }

    async fn nodes(&self) -> Result<Vec<NodeInfo>, StoreError> {
        self.call(Op::Nodes, |s, _| s.nodes.values().cloned().collect())
            .await
    }

    async fn publish_jobs(
        &self,
        node: &str,
        jobs: &[(String, String, String)],
    ) -> Result<(), StoreError> {
        let (node, jobs) = (node.to_string(), jobs.to_vec());
        self.call(Op::Nodes, move |s, _| {
            s.node_jobs.retain(|(n, _), _| *n != node);
            for (job, digest, def) in jobs {
                s.node_jobs.insert((node.clone(), job), (digest, def));
            }
        })
        .await
    }

    async fn published_jobs(
        &self,
        node: &str,
        definitions: bool,
    ) -> Result<Vec<PublishedJob>, StoreError> {
        let node = node.to_string();
        self.call(Op::Nodes, move |s, _| {
            s.node_jobs
                .iter()
                .filter(|((n, _), _)| *n == node)
                .map(|((n, job), (digest, def))| PublishedJob {
                    node: n.clone(),
                    job: job.clone(),
                    digest: digest.clone(),
                    definition: definitions.then(|| def.clone()),
                })
                .collect()
        })
        .await
    }

    async fn forget(&self, resource: &Name, now: StoreTime) -> Result<Option<bool>, StoreError> {
        let resource = resource.to_string();
        self.call(Op::Release, move |s, _| {
            let held = s.leases.get(&resource).map(|r| r.expires_at > now.0)?;
            if !held {
                s.forgotten.insert(resource.clone(), now.0);
            }
            Some(!held)
        })
        .await
    }

    async fn prune_stale(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call(Op::RecordStale, move |s, _| {
            let n = s.stale.len();
            s.stale.retain(|r| r.at >= before);
            (n - s.stale.len()) as u64
        })
        .await
    }

    async fn prune_values(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call(Op::Put, move |s, _| {
            let n = s.values.len();
            let leases = &s.leases;
            s.values.retain(|(resource, _), v| {
                v.written_at >= before
                    || leases
                        .get(resource)
                        .is_some_and(|row| row.expires_at >= before.0)
            });
            (n - s.values.len()) as u64
        })
        .await
    }

    async fn prune_nodes(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call(Op::Nodes, move |s, _| {
            let old: Vec<String> = s
                .nodes
                .values()
                .filter(|r| r.last_seen < before)
                .map(|r| r.node.clone())
                .collect();
            s.node_jobs.retain(|(node, _), _| !old.contains(node));
            s.nodes.retain(|_, r| r.last_seen >= before);
            old.len() as u64
        })
        .await
    }
}

/// A batch claim's mark: the row's `seen_ms`, the rest as the columns'
/// defaults when the row is new (as a claim writes it in SQL).
fn mark(s: &mut State, node: &str, now: i64) {
    s.nodes
        .entry(node.to_string())
        .or_insert_with(|| NodeInfo {
            node: node.to_string(),
            hostname: String::new(),
            pid: 0,
            version: String::new(),
            config_digest: String::new(),
            started_at: StoreTime(0),
            last_seen: StoreTime(now),
            state: NodeState::Running,
            running: 0,
        })
        .last_seen = StoreTime(now);
}

impl MemoryStore {
    /// The run history rows as stored (unfinished ones with an empty
    /// outcome).
    pub(crate) fn run_rows(&self) -> Vec<RunInfo> {
        self.lock().runs.clone()
    }

    /// The benchmark's purge (`BenchStore::purge_prefix`, which only the
    /// SQL stores are): deletes every value, stale record and lease whose
    /// resource starts with `prefix`, and counts them.
    pub(crate) fn purge_prefix(&self, prefix: &str) -> u64 {
        let mut s = self.lock();
        let before = s.values.len() + s.stale.len() + s.leases.len();
        s.values
            .retain(|(resource, _), _| !resource.starts_with(prefix));
        s.stale.retain(|r| !r.resource.starts_with(prefix));
        s.leases.retain(|resource, _| !resource.starts_with(prefix));
        (before - s.values.len() - s.stale.len() - s.leases.len()) as u64
    }
}

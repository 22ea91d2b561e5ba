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
//!
//! Laid out as a SQL backend, one store trait per file: this file holds the
//! state, the faults, the call machinery and `Admin`; `lease.rs` (the one
//! takeable rule for acquire and claim), `fence.rs`, `runs.rs` and
//! `fleet.rs` the other concerns.

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
    first_token_of, prelude::*, AcquireOutcome, AcquireRequest, Admission, AdmitOutcome,
    AdmitRequest, Backend, ClaimOutcome, ClaimRequest, Claimed, EpochInfo, Lease, LeaseInfo,
    LeaseRow, LossRow, NewStaleRecord, OwnerId, PauseInfo, PauseSeen, PutOutcome, PutRequest,
    ReleaseOutcome, RenewOutcome, RunEnd, RunInfo, RunQuery, RunStart, StaleKind, StaleRecord,
    StartedBy, StoreError, StoreTime, StoreUrl, StoredValue, Takeover, Token, TriggerInfo, Unseen,
    EPOCH_SHIFT,
};
use crate::store::{BeatAnswer, NodeBeat, NodeInfo, PublishedJob};

mod fence;
mod fleet;
mod lease;
mod runs;

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
        let fence = s
            .leases
            .get(resource)
            .map_or_else(Token::default, |r| r.fence);
        RenewOutcome::Refused(crate::store::Refusal::NotOwner {
            current_owner: OwnerId::fresh(),
            current_token: fence.next(),
        })
    }
}

fn store_ms(clock: Clock, offset_ms: i64) -> i64 {
    clock.now().timestamp_millis() + offset_ms
}

fn millis(d: Duration) -> i64 {
    crate::store::millis(d)
}

#[async_trait]
impl Admin for MemoryStore {
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
        s.epoch = s
            .epoch
            .max(highest.unwrap_or_default().get() >> EPOCH_SHIFT)
            + 1;
        Ok(EpochInfo::new(s.epoch, None, highest))
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

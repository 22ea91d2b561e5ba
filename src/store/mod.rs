//! The lease store: one trait, implemented once for SQL (`sql::SqlStore`)
//! over one dialect per backend.
//!
//! Everything that speaks SQL lives below this module. The rest of the crate
//! sees typed outcomes ([`AcquireOutcome`], [`RenewOutcome`], [`PutOutcome`])
//! and never a row. The semantics every backend must share are written once
//! here, in the trait's docs, and proven once against every backend (and
//! the in-memory store of the crate's own tests) by the conformance suite,
//! `src/store/conformance/`:
//!
//! * the fence of a resource only ever grows; release and expiry keep it;
//! * acquiring is one atomic state transition decided by the **store's
//!   clock** (for SQLite, the host kernel's clock read by a direct system
//!   call, so per-process clock fakes cannot skew it);
//! * renew and release match owner id *and* token;
//! * a fenced write is accepted only with the resource's current token
//!   (its fence) and the owner id that token was issued to, and a token not
//!   below the key's accepted one; it checks, writes and records a
//!   rejection in one statement or one transaction;
//! * tokens are `epoch << 32 | counter` (see [`EPOCH_SHIFT`]): a winning
//!   acquire sets the fence to `max(fence + 1, (epoch << 32) + 1)`, the
//!   epoch being read by the acquiring statement itself, so a store that
//!   lost its last commits in a failover still issues tokens above every
//!   earlier one once its epoch moved on;
//! * a winning acquire reports the previous generation when that one
//!   expired without being released ([`Takeover`]); a losing acquire
//!   writes nothing.

mod bench;
mod classify;
#[cfg(test)]
mod conformance;
mod diagnose;
mod error;
mod fleet;
mod hook;
mod migrator;
mod mysql;
pub(crate) mod outages;
mod postgres;
mod probe;
pub(crate) mod rows;
mod sql;
mod sqlite;
mod types;
mod url;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::names::Name;

pub(crate) use bench::{open_bench, BenchStore, RawOp};
pub(crate) use classify::{
    classify_admission, classify_loss, classify_paused, classify_refusal, classify_rejection,
    run_binds, Admission, LeaseRow, LossRow, Rejection,
};
pub(crate) use diagnose::first_connection;
pub use error::StoreError;
pub(crate) use error::{migrate_error, timed, unavailable};
pub(crate) use hook::{CallEnd, Notice, StoreHook};
use mysql::MySqlStore;
pub(crate) use outages::Outages;
use postgres::PostgresStore;
pub(crate) use postgres::{first_connection as pg_first_connection, Hosts as PgHosts};
#[cfg(test)]
pub(crate) use probe::Migrations;
pub(crate) use probe::{probe, Clock, Probe};
use sqlite::SqliteStore;
pub(crate) use types::*;
pub use types::{
    AcquireOutcome, AcquireRequest, Lease, OwnerId, PutRequest, ReleaseOutcome, Token,
};
pub use url::StoreUrl;
pub(crate) use url::{
    group_name, is_secret_param, read_url_file, url_in_file_text, Backend, TargetSessionAttrs,
};
pub(crate) use url::{parse_lenient, unparse};

/// The lease store: the operations of every concern, [`Admin`], [`Leases`],
/// [`Fences`], [`Runs`] and [`Fleet`], so that `Arc<dyn Store>` is the
/// whole store. One SQL implementation of each (one dialect per backend),
/// and the in-memory one of the crate's own tests; every method is one
/// atomic operation on the store (one statement, or one short transaction
/// where the backend needs it).
pub trait Store: Admin + Leases + Fences + Runs + Fleet {}

/// Every type that implements each concern is a [`Store`].
impl<S: Admin + Leases + Fences + Runs + Fleet + ?Sized> Store for S {}

/// The store's traits, to call any operation on a concrete store
/// (`use crate::store::prelude::*`); on `dyn Store` they need no import.
pub mod prelude {
    pub use super::{Admin, Fences, Fleet, Leases, Runs, Store};
}

/// What a store is, and its housekeeping: which backend and URL, the
/// outages its users are in, migrations, the store's clock, the epoch of
/// tokens, the list of leases, and retention (every `prune_*`, `forget`).
#[async_trait]
pub trait Admin: Send + Sync + 'static {
    /// Which backend this is.
    fn backend(&self) -> Backend;

    /// The (redacted) URL, for messages.
    fn url(&self) -> &StoreUrl;

    /// The outages this handle's users are in: what decides whether a
    /// failure is logged at WARN (the first of an outage) or DEBUG.
    fn outages(&self) -> &Outages;

    /// Applies pending migrations. Safe when many processes start at once.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Every lease ever taken, held or not, ordered by resource.
    async fn list(&self) -> Result<Vec<LeaseInfo>, StoreError>;

    /// The store's clock.
    async fn now(&self) -> Result<StoreTime, StoreError>;

    /// The stored and effective epoch of fencing tokens.
    async fn epoch(&self) -> Result<EpochInfo, StoreError>;

    /// Raises the stored epoch, in one transaction, so that the effective
    /// epoch becomes `max(effective, highest fence >> 32) + 1`: every token
    /// issued afterwards, for any resource (also one never leased), is
    /// greater than every token this store, or a primary it replicated from,
    /// could have issued before. For failover hooks.
    async fn advance_epoch(&self) -> Result<EpochInfo, StoreError>;

    /// Deletes every job's runs started before `before`, and all but each
    /// job's newest `keep`, in one statement; how many went. Off the hot
    /// path (the daemon's hourly housekeeping).
    async fn prune_runs(&self, keep: u32, before: StoreTime) -> Result<u64, StoreError>;

    /// Deletes triggers requested before `before` and pauses that ended
    /// before it; how many rows went.
    async fn prune_fleet(&self, before: StoreTime) -> Result<u64, StoreError>;

    /// Deletes the stale-owner records made before `before`; how many
    /// went.
    async fn prune_stale(&self, before: StoreTime) -> Result<u64, StoreError>;

    /// `lease forget`: hides the lease row of `resource` from [`Store::list`](crate::store::Admin::list)
    /// until it is acquired again, if it is not held at `now` (the store's
    /// clock, read just before). The row and its fence stay, so the next
    /// token is still greater than every earlier one. `None`: no such row;
    /// `Some(false)`: held, nothing changed.
    async fn forget(&self, resource: &Name, now: StoreTime) -> Result<Option<bool>, StoreError>;

    /// Deletes the stored values written before `before` whose resource's
    /// lease is neither held nor was held (renewed, released) since then:
    /// a value of a resource still in use always stays. The lease row and
    /// its fence are never touched (tokens keep growing). How many went.
    async fn prune_values(&self, before: StoreTime) -> Result<u64, StoreError>;

    /// Deletes the rows of nodes last seen before `before`, and their
    /// definitions; how many nodes went.
    async fn prune_nodes(&self, before: StoreTime) -> Result<u64, StoreError>;
}

/// The lease: the single acquire, the batch claim, renewal, release, giving
/// an occurrence back, preemption (`overlap = "replace"`). Every guarantee
/// of a token is made here.
#[async_trait]
pub trait Leases: Send + Sync + 'static {
    /// Takes the lease if it is free or expired by the store's clock (and,
    /// with an occurrence, only if that occurrence is newer than the last one
    /// taken, due, and not superseded by `next_occurrence`, all by the
    /// store's clock): creates the row if needed, increments the fence,
    /// records the request's owner id and returns the new token and the
    /// store's expiry. With an occurrence, a row this owner already won for
    /// the same occurrence and has not released is adopted: same token,
    /// expiry extended to at least now + lease.
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError>;

    /// Extends an unexpired lease, keeping the token. Matches owner id and token.
    async fn renew(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError>;

    /// Gives the lease up (expires it now), keeping the fence. Matches owner
    /// id and token.
    async fn release(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<ReleaseOutcome, StoreError>;

    /// Gives back a lease under which nothing ran, and with it `occurrence`:
    /// like `release`, and if `occurrence` is still the last one taken for
    /// the resource, it becomes takeable again (the last occurrence moves to
    /// just before it), so another node still trying it can run it. Matches
    /// owner id and token; without a token (an acquire whose answer never
    /// came back may have won it), the owner's unreleased win of exactly
    /// this occurrence, if any.
    async fn give_back(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Option<Token>,
        occurrence: StoreTime,
    ) -> Result<ReleaseOutcome, StoreError>;

    /// [`Store::give_back`](crate::store::Leases::give_back) without a token for each item, in one
    /// operation where the backend can (PostgreSQL): an unswept ghost costs
    /// the fleet as much as a run, so a node sweeps everything it has to in
    /// one statement. Answers, per item, whether a win was given back.
    async fn give_back_unseen(&self, items: &[Unseen<'_>]) -> Result<Vec<bool>, StoreError> {
        give_back_each(self, items).await
    }

    /// Claims several scheduled occurrences in one operation, with every
    /// guarantee of [`Store::acquire`](crate::store::Leases::acquire) for each item it wins (store clock,
    /// occurrence identity, fence bump, pause, the run recorded, losers
    /// writing nothing), trying them in the request's order, winning at
    /// most the claim's limit, and skipping rows another caller has locked
    /// instead of waiting for them. A resource never leased is created and
    /// won as the acquire's first acquisition would (once among concurrent
    /// creators; a paused job's is left to the acquire). Every backend
    /// claims; it is the daemon's first attempt at every scheduled
    /// occurrence.
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError>;

    /// `overlap = "replace"`: ends the unexpired lease generation `token` of
    /// `resource` early (expired as of when it was acquired, and not
    /// released, so the next acquire reports it as taken over) unless it was
    /// taken for `occurrence` or a later instant. The next acquire for
    /// `occurrence` then takes the lease with a new, higher token; the
    /// replaced owner's renewals are refused from then on, and its writes
    /// with the old token once the new one exists. `true` when it ended that
    /// generation, `false` when the lease had moved on (released, expired,
    /// another generation, or taken for this instant already).
    async fn preempt(
        &self,
        resource: &Name,
        token: Token,
        occurrence: StoreTime,
    ) -> Result<bool, StoreError>;
}

/// The write boundary: fenced writes (`put`), the proxy's admission,
/// reads, and the stale-owner records.
#[async_trait]
pub trait Fences: Send + Sync + 'static {
    /// A fenced write, accepted only when the token *is* the resource's
    /// fence (the newest token issued for it: no newer generation exists),
    /// the lease row's owner id is `req.owner_id` (the store issued exactly
    /// this token for this resource to exactly this owner; a released or
    /// expired lease keeps both until the next acquisition), and the token
    /// is `>=` (with `once`: `>`) the one the key last accepted. `once` with
    /// the key's own token is `AlreadyApplied`. Anything else is rejected
    /// ([`classify_rejection`] names the reason) and the rejection recorded,
    /// all in one atomic operation.
    async fn put(&self, req: &PutRequest<'_>) -> Result<PutOutcome, StoreError>;

    /// The fencing proxy's check: admits `req.token` for `req.resource`
    /// when the store issued it for that resource (a lease row exists and
    /// `1 <= token <= fence`) and it is not below the highest token admitted
    /// for the resource so far, raising that to it in one conditional
    /// statement, so that once a token was admitted no older one is, by any
    /// proxy on this store. A refusal ([`classify_admission`] names the
    /// reason) is recorded as a stale-owner record with stage `proxy`. The
    /// common case (the highest token again) is one read.
    async fn admit(&self, req: &AdmitRequest<'_>) -> Result<AdmitOutcome, StoreError>;

    /// Reads a value and the token that wrote it.
    async fn get(&self, resource: &Name, key: &Name) -> Result<Option<StoredValue>, StoreError>;

    /// Records a stale-owner event that happened outside `put` (a lost lease,
    /// a rejection reported by a job from its own storage).
    async fn record_stale(&self, rec: &NewStaleRecord<'_>) -> Result<StaleRecord, StoreError>;

    /// Stale-owner records at or after `since` (store time), oldest first.
    async fn stale(&self, since: Option<StoreTime>) -> Result<Vec<StaleRecord>, StoreError>;

    /// The newest `limit` stale-owner records at or after `since` (store
    /// time), newest first: a bounded read for a page that shows the latest
    /// (the web view).
    async fn latest_stale(
        &self,
        since: StoreTime,
        limit: u32,
    ) -> Result<Vec<StaleRecord>, StoreError>;
}

/// The run history: a run's end (the winning acquire recorded its start),
/// alone or with the release, and the history's reads.
#[async_trait]
pub trait Runs: Leases {
    // Statements in the `fleet` module. None of these is on a losing
    // acquire's path; a run adds exactly one statement, `finish_run` (the
    // winning acquire inserts the row).

    /// Writes how a run ended into the row its winning acquire inserted
    /// (matched by resource and token, once). False if no unfinished row
    /// matched.
    async fn finish_run(&self, end: &RunEnd<'_>) -> Result<bool, StoreError>;

    /// The end of a run under a lease still held: [`Store::finish_run`](crate::store::Runs::finish_run)
    /// and [`Store::release`](crate::store::Leases::release) in one operation where the backend can
    /// (PostgreSQL: one statement), so the history's end and the lease go
    /// back together and the store sees one round trip per run's end, not
    /// two. Whether a history row was finished, and the release's outcome.
    async fn finish_and_release(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        end: &RunEnd<'_>,
    ) -> Result<(bool, ReleaseOutcome), StoreError> {
        let finished = self.finish_run(end).await?;
        let released = self.release(resource, owner_id, end.token).await?;
        Ok((finished, released))
    }

    /// Runs of the history, newest first, each with its state derived from
    /// its lease when it has not ended ([`RUNNING`], [`UNKNOWN`]).
    async fn runs(&self, q: &RunQuery<'_>) -> Result<Vec<RunInfo>, StoreError>;
}

/// Operating the fleet: pauses, triggers, the nodes' beats and the job
/// definitions they published. Off the occurrence's path.
#[async_trait]
pub trait Fleet: Send + Sync + 'static {
    /// Pauses a job fleet-wide, atomically: written where the job has no
    /// pause in force (none, or a timed one that ended by `pause.since`,
    /// the store's time), or over one when `replace`. `None` once written;
    /// else the pause in force that refused it, left as it was.
    async fn pause(
        &self,
        pause: &PauseInfo,
        replace: bool,
    ) -> Result<Option<PauseInfo>, StoreError>;

    /// Ends a job's pause; false if it had none.
    async fn resume(&self, job: &str) -> Result<bool, StoreError>;

    /// The pauses still in force at `now` (store time), by job.
    async fn pauses(&self, now: StoreTime) -> Result<Vec<PauseInfo>, StoreError>;

    /// Stores a new pending trigger.
    async fn request_trigger(&self, trigger: &TriggerInfo) -> Result<(), StoreError>;

    /// One trigger by id.
    async fn trigger(&self, id: &str) -> Result<Option<TriggerInfo>, StoreError>;

    /// The pending triggers, oldest first.
    async fn pending_triggers(&self) -> Result<Vec<TriggerInfo>, StoreError>;

    /// Claims a pending trigger for `node`: true for exactly one caller.
    async fn claim_trigger(&self, id: &str, node: &str) -> Result<bool, StoreError>;

    /// Settles a claimed trigger: started (with the run's token) or refused.
    async fn settle_trigger(
        &self,
        id: &str,
        state: crate::domain::TriggerState,
        token: Option<Token>,
        detail: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Withdraws a trigger nobody claimed; false if a daemon claimed it.
    async fn cancel_trigger(&self, id: &str) -> Result<bool, StoreError>;

    // The fleet's nodes: `fencecron_nodes` (one row per node id, see
    // [`NodeInfo::live`]) and `fencecron_node_jobs` (the job definitions
    // each node published). Off the occurrence's path: a heartbeat every
    // [`HEARTBEAT`], the rest at start, reload and on a drift.

    /// Registers or refreshes this node's row, `last_seen` (and on the
    /// first beat `started_at`) being the store's clock; answers that time
    /// and the nodes live then, this one included ([`BeatAnswer`]). One
    /// statement on PostgreSQL (a CTE) and MySQL (a procedure, migration
    /// 0010); on SQLite, whose clock is the host's, the upsert and the read.
    async fn beat(&self, beat: &NodeBeat<'_>) -> Result<BeatAnswer, StoreError>;

    /// Every node row, by node id.
    async fn nodes(&self) -> Result<Vec<NodeInfo>, StoreError>;

    /// Replaces the job definitions `node` published with `jobs` (name,
    /// digest, canonical JSON), in one transaction.
    async fn publish_jobs(&self, node: &str, jobs: &[Definition<'_>]) -> Result<(), StoreError>;

    /// The job definitions `node` published, by job; the canonical JSON
    /// only with `definitions`.
    async fn published_jobs(
        &self,
        node: &str,
        definitions: bool,
    ) -> Result<Vec<PublishedJob>, StoreError>;
}

/// One job's published definition: its name, its digest and its canonical
/// JSON (`fleet::JobDef`), borrowed from whoever holds them.
pub(crate) type Definition<'a> = (&'a str, &'a str, &'a str);

/// How often a daemon looks for triggers: the idle cost of `fencecron
/// trigger`, 30 indexed reads a minute per daemon of a table that is empty
/// unless a request waits. (PostgreSQL's LISTEN/NOTIFY would need a
/// connection of its own per daemon: at 20 daemons with 4 each, it took
/// PostgreSQL's default 100 and the fleet benchmark could not connect.)
pub(crate) const TRIGGER_POLL: Duration = Duration::from_secs(2);

/// Options for opening a store.
#[derive(Clone)]
pub struct OpenOptions {
    /// Most connections the pool may open.
    pub max_connections: u32,
    /// Time limit for one store call, including waiting for a connection.
    pub call_timeout: Duration,
    /// Told how every operation went and what the store noticed (the store
    /// logs nothing itself): the opener logs the notices
    /// (`events::store_hook`) and, with `[http]`, moves the store metrics.
    /// Without one, notices go unheard.
    pub hook: Option<Arc<dyn StoreHook>>,
}

impl std::fmt::Debug for OpenOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenOptions")
            .field("max_connections", &self.max_connections)
            .field("call_timeout", &self.call_timeout)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            max_connections: 4,
            call_timeout: Duration::from_secs(10),
            hook: None,
        }
    }
}

/// Opens a store without touching the network: connections are made on
/// first use, so a daemon can start while its database is down.
pub fn open(url: &StoreUrl, opts: &OpenOptions) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match url.backend() {
        Backend::Sqlite => Arc::new(SqliteStore::open(url.clone(), opts)?),
        Backend::Postgres => Arc::new(PostgresStore::open(url.clone(), opts)?),
        Backend::MySql => Arc::new(MySqlStore::open(url.clone(), opts)?),
    })
}

/// PostgreSQL connection options for `url` made as the store makes its own
/// (TLS left out on a loopback host when neither the URL nor `PGSSLMODE`
/// asked for it), named `application_name`: for a pool on a database that
/// is not the store (the SQL guard's).
pub(crate) fn postgres_options(
    url: &StoreUrl,
    application_name: &str,
) -> Result<sqlx::postgres::PgConnectOptions, StoreError> {
    let env_chose = std::env::var_os("PGSSLMODE").is_some();
    postgres::host_options(url, 0, application_name, env_chose)
}

/// [`Store::give_back_unseen`](crate::store::Leases::give_back_unseen) as one [`Store::give_back`](crate::store::Leases::give_back) per item.
pub(crate) async fn give_back_each<S: Leases + ?Sized>(
    store: &S,
    items: &[Unseen<'_>],
) -> Result<Vec<bool>, StoreError> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let outcome = store
            .give_back(item.resource, item.owner_id, None, item.occurrence)
            .await?;
        out.push(outcome == ReleaseOutcome::Released);
    }
    Ok(out)
}

//! Operating the fleet from the store: run history, pauses and triggers,
//! written once for every SQL backend.
//!
//! None of these statements reads a clock: every time they store or compare
//! comes bound from the caller (the store's clock read by an earlier call,
//! or a run's `started_at` plus the time it took), so one text serves all
//! three backends. It is written with PostgreSQL's `$n` placeholders, each
//! used once and in order, and rewritten at start-up for SQLite (`?n`) and
//! MySQL (`?`). The statements on the acquire's path (inserting a run,
//! honouring a pause) are part of each backend's acquire, not here.

use async_trait::async_trait;
use sqlx::query::Query;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

use super::rows::Affected;
use super::sql::placeholders;
use super::{
    Backend, BeatAnswer, NodeBeat, NodeInfo, OwnerId, PauseInfo, PublishedJob, RunEnd, RunInfo,
    RunQuery, StoreTime, Token, TriggerInfo,
};
use crate::domain::{self, NodeState, RunOutcome, RunState, TriggerState};

mod db;
mod publish;

use publish::publish_in;
pub(super) use publish::{publish_chunks, PUBLISH_ROWS};

pub(super) const FINISH_RUN: &str = "UPDATE fencecron_runs
    SET finished_at_ms = started_at_ms + $1, outcome = $2, exit_code = $3, signal_name = $4,
        duration_ms = $5, output_tail = $6
  WHERE resource = $7 AND token = $8 AND finished_at_ms IS NULL";

/// A win given back unused ([`super::Leases::give_back`]): no run happened.
/// An occurrence's owner id is its own, so it names the row.
const FORGET_UNRUN: &str = "DELETE FROM fencecron_runs
 WHERE resource = $1 AND owner_id = $2 AND finished_at_ms IS NULL";

/// `overlap = "replace"` ([`super::Leases::preempt`]): the lease generation
/// `$2` of `$1`, unexpired and not taken for instant `$3` or a later one,
/// expires as of the moment it was acquired (a time the store's clock has
/// passed, so no clock is read here), unreleased, so that the next acquire
/// takes it over with a new token and records whom it replaced.
const PREEMPT: &str = "UPDATE fencecron_leases SET expires_at_ms = acquired_at_ms
 WHERE resource = $1 AND fence = $2 AND NOT released AND expires_at_ms > acquired_at_ms
   AND (last_occurrence_ms IS NULL OR last_occurrence_ms < $3)";

/// Each run with its lease row, to tell a run in progress from one whose
/// node died ([`run_state`]). `{resource}` is the run's resource as text
/// (MySQL keeps names as bytes).
const RUNS: &str = "SELECT r.job, {resource}, r.scheduled_at_ms, r.started_by, r.node, r.owner_id,
       r.token, r.started_at_ms, r.finished_at_ms, r.outcome, r.exit_code, r.signal_name,
       r.duration_ms, r.output_tail, l.fence AS lease_fence, l.owner_id AS lease_owner_id,
       l.expires_at_ms AS lease_expires_at_ms
  FROM fencecron_runs r LEFT JOIN fencecron_leases l ON l.resource = r.resource
 WHERE ($1 = '' OR r.job = $2) AND r.started_at_ms >= $3 AND ($4 = '' OR r.outcome = $5)
   AND ($6 = '' OR r.node = $7) AND ($8 = '' OR r.owner_id = $9)
 ORDER BY r.started_at_ms DESC, r.id DESC
 LIMIT $10";

/// Every job's runs started before `$1`, and all but each job's newest
/// `$2`, in one statement (window functions: PostgreSQL, SQLite 3.25+,
/// MariaDB 10.2+, MySQL 8). The derived table keeps MySQL from refusing a
/// subquery on the table being deleted from.
const PRUNE_RUNS: &str = "DELETE FROM fencecron_runs
 WHERE started_at_ms < $1
    OR id IN (SELECT k.id FROM (SELECT id, ROW_NUMBER() OVER (PARTITION BY job ORDER BY id DESC) AS n
                                  FROM fencecron_runs) k
               WHERE k.n > $2)";

/// A pause ([`super::Fleet::pause`]), written only where no pause is in
/// force: the job has no row, `$6` is 1 (`--replace`) or the row's timed
/// pause ended by `$7` (the store's time; an ended pause is no pause). One
/// statement, so two CLIs pausing at once cannot both win.
const PAUSE: &str = "INSERT INTO fencecron_pauses (job, note, since_ms, until_ms, paused_by)
 VALUES ($1, $2, $3, $4, $5)
 ON CONFLICT (job) DO UPDATE
    SET note = excluded.note, since_ms = excluded.since_ms, until_ms = excluded.until_ms,
        paused_by = excluded.paused_by
  WHERE $6 = 1 OR fencecron_pauses.until_ms <= $7";

/// [`PAUSE`] for MySQL, which has no `WHERE` on an upsert: each column keeps
/// its value unless the same condition holds, `until_ms` last, as MySQL
/// assigns left to right and the conditions must read the old `until_ms`.
/// The condition's two parameters are bound once per column
/// ([`PAUSE_CONDITIONS_MYSQL`]).
const PAUSE_MYSQL: &str = "INSERT INTO fencecron_pauses (job, note, since_ms, until_ms, paused_by)
 VALUES ($1, $2, $3, $4, $5)
 ON DUPLICATE KEY UPDATE
    note = IF($6 = 1 OR until_ms <= $7, VALUES(note), note),
    since_ms = IF($8 = 1 OR until_ms <= $9, VALUES(since_ms), since_ms),
    paused_by = IF($10 = 1 OR until_ms <= $11, VALUES(paused_by), paused_by),
    until_ms = IF($12 = 1 OR until_ms <= $13, VALUES(until_ms), until_ms)";

/// How many times [`PAUSE_MYSQL`] binds the condition's parameters.
const PAUSE_CONDITIONS_MYSQL: usize = 4;

/// One job's pause row, in force or not: what refused a [`PAUSE`].
const PAUSE_OF: &str = "SELECT job, note, since_ms, until_ms, paused_by FROM fencecron_pauses
 WHERE job = $1";

const RESUME: &str = "DELETE FROM fencecron_pauses WHERE job = $1";

const PAUSES: &str = "SELECT job, note, since_ms, until_ms, paused_by FROM fencecron_pauses
 WHERE until_ms IS NULL OR until_ms > $1 ORDER BY job";

const REQUEST_TRIGGER: &str = "INSERT INTO fencecron_triggers
   (id, job, requested_at_ms, requested_by, state) VALUES ($1, $2, $3, $4, $5)";

const TRIGGER: &str = "SELECT id, job, requested_at_ms, requested_by, state, node, token, detail
  FROM fencecron_triggers WHERE id = $1";

const PENDING_TRIGGERS: &str = "SELECT id, job, requested_at_ms, requested_by, state, node,
       token, detail
  FROM fencecron_triggers WHERE state = $1 ORDER BY requested_at_ms, id";

const CLAIM_TRIGGER: &str =
    "UPDATE fencecron_triggers SET state = $1, node = $2 WHERE id = $3 AND state = $4";

const SETTLE_TRIGGER: &str =
    "UPDATE fencecron_triggers SET state = $1, token = $2, detail = $3 WHERE id = $4";

const CANCEL_TRIGGER: &str = "DELETE FROM fencecron_triggers WHERE id = $1 AND state = $2";

const PRUNE_TRIGGERS: &str = "DELETE FROM fencecron_triggers WHERE requested_at_ms < $1";

const PRUNE_PAUSES: &str = "DELETE FROM fencecron_pauses WHERE until_ms < $1";

/// A node's heartbeat ([`super::Fleet::beat`]): its whole row, `$2` the
/// store's time read just before. A row only a batch claim of an older
/// release wrote gains the rest here.
const BEAT: &str = "INSERT INTO fencecron_nodes
   (node, seen_ms, hostname, pid, version, config_digest, started_at_ms, state, running)
 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
 ON CONFLICT (node) DO UPDATE
    SET seen_ms = excluded.seen_ms, hostname = excluded.hostname, pid = excluded.pid,
        version = excluded.version, config_digest = excluded.config_digest,
        started_at_ms = excluded.started_at_ms, state = excluded.state, running = excluded.running";

const BEAT_MYSQL: &str = "INSERT INTO fencecron_nodes
   (node, seen_ms, hostname, pid, version, config_digest, started_at_ms, state, running)
 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
 ON DUPLICATE KEY UPDATE
    seen_ms = VALUES(seen_ms), hostname = VALUES(hostname), pid = VALUES(pid),
    version = VALUES(version), config_digest = VALUES(config_digest),
    started_at_ms = VALUES(started_at_ms), state = VALUES(state), running = VALUES(running)";

const NODES: &str = "SELECT node, seen_ms, hostname, pid, version, config_digest, started_at_ms,
       state, running
  FROM fencecron_nodes ORDER BY node";

/// The nodes live at the time a beat wrote (`$2` = that time minus
/// [`super::NODE_LIVE`], `$1` = `stopped`): [`NodeInfo::live`] in SQL. The
/// backends that answer a beat in one statement (PostgreSQL, MySQL) hold
/// the same condition in it.
const LIVE_NODES: &str = "SELECT node, seen_ms, hostname, pid, version, config_digest,
       started_at_ms, state, running
  FROM fencecron_nodes WHERE state <> $1 AND seen_ms > $2 ORDER BY node";

const UNPUBLISH: &str = "DELETE FROM fencecron_node_jobs WHERE node = $1";

const PUBLISHED_DIGESTS: &str = "SELECT node, job, digest FROM fencecron_node_jobs
 WHERE node = $1 ORDER BY job";

const PUBLISHED_DEFINITIONS: &str = "SELECT node, job, digest, definition FROM fencecron_node_jobs
 WHERE node = $1 ORDER BY job";

const PRUNE_NODES: &str = "DELETE FROM fencecron_nodes WHERE seen_ms < $1";

/// `lease forget`: only a lease not held at `$2`.
const FORGET: &str = "UPDATE fencecron_leases SET forgotten_at_ms = $1
 WHERE resource = $2 AND expires_at_ms <= $3";

const LEASE_EXISTS: &str = "SELECT fence FROM fencecron_leases WHERE resource = $1";

const PRUNE_STALE: &str = "DELETE FROM fencecron_stale WHERE at_ms < $1";

/// Values written before `$1` of resources whose lease has not been held
/// since `$2` (a lease row's expiry is its last use: acquire and renew
/// move it forward, release sets it to the release's time).
const PRUNE_VALUES: &str = "DELETE FROM fencecron_values
 WHERE written_at_ms < $1
   AND resource NOT IN (SELECT resource FROM fencecron_leases WHERE expires_at_ms >= $2)";

/// The definitions of the nodes [`PRUNE_NODES`] is about to delete. Not
/// "of nodes without a row": a node publishes its definitions before its
/// first beat writes its row.
const PRUNE_NODE_JOBS: &str = "DELETE FROM fencecron_node_jobs
 WHERE node IN (SELECT node FROM fencecron_nodes WHERE seen_ms < $1)";

/// The fleet statements in one backend's placeholders.
pub(super) struct FleetSql {
    finish_run: String,
    forget_unrun: String,
    preempt: String,
    runs: String,
    prune_runs: String,
    pause: String,
    /// How many times the pause binds its condition; MySQL's also counts
    /// a matched row left unchanged as affected (sqlx asks for found rows),
    /// so only there is one affected row ambiguous.
    pause_conditions: usize,
    pause_of: String,
    resume: String,
    pauses: String,
    request_trigger: String,
    trigger: String,
    pending_triggers: String,
    claim_trigger: String,
    settle_trigger: String,
    cancel_trigger: String,
    prune_triggers: String,
    prune_pauses: String,
    beat: String,
    nodes: String,
    live_nodes: String,
    unpublish: String,
    /// [`publish`] of [`PUBLISH_ROWS`] rows, in the backend's placeholders.
    publish_full: String,
    backend: Backend,
    published_digests: String,
    published_definitions: String,
    prune_nodes: String,
    prune_node_jobs: String,
    prune_stale: String,
    prune_values: String,
    forget: String,
    lease_exists: String,
}

impl FleetSql {
    /// The statement publishing `rows` definitions.
    fn publish(&self, rows: usize) -> std::borrow::Cow<'_, str> {
        if rows == PUBLISH_ROWS {
            std::borrow::Cow::Borrowed(&self.publish_full)
        } else {
            std::borrow::Cow::Owned(publish_in(self.backend, rows))
        }
    }

    pub(super) fn new(backend: Backend) -> FleetSql {
        let sql = |text: &str| placeholders(backend, text);
        FleetSql {
            finish_run: sql(FINISH_RUN),
            forget_unrun: sql(FORGET_UNRUN),
            preempt: sql(PREEMPT),
            runs: sql(&RUNS.replace(
                "{resource}",
                match backend {
                    Backend::MySql => "CAST(r.resource AS CHAR CHARACTER SET utf8mb4) AS resource",
                    _ => "r.resource",
                },
            )),
            prune_runs: sql(PRUNE_RUNS),
            pause: sql(match backend {
                Backend::MySql => PAUSE_MYSQL,
                _ => PAUSE,
            }),
            pause_conditions: match backend {
                Backend::MySql => PAUSE_CONDITIONS_MYSQL,
                _ => 1,
            },
            pause_of: sql(PAUSE_OF),
            resume: sql(RESUME),
            pauses: sql(PAUSES),
            request_trigger: sql(REQUEST_TRIGGER),
            trigger: sql(TRIGGER),
            pending_triggers: sql(PENDING_TRIGGERS),
            claim_trigger: sql(CLAIM_TRIGGER),
            settle_trigger: sql(SETTLE_TRIGGER),
            cancel_trigger: sql(CANCEL_TRIGGER),
            prune_triggers: sql(PRUNE_TRIGGERS),
            prune_pauses: sql(PRUNE_PAUSES),
            beat: sql(match backend {
                Backend::MySql => BEAT_MYSQL,
                _ => BEAT,
            }),
            nodes: sql(NODES),
            live_nodes: sql(LIVE_NODES),
            unpublish: sql(UNPUBLISH),
            publish_full: publish_in(backend, PUBLISH_ROWS),
            backend,
            published_digests: sql(PUBLISHED_DIGESTS),
            published_definitions: sql(PUBLISHED_DEFINITIONS),
            prune_nodes: sql(PRUNE_NODES),
            prune_node_jobs: sql(PRUNE_NODE_JOBS),
            prune_stale: sql(PRUNE_STALE),
            prune_values: sql(PRUNE_VALUES),
            forget: sql(FORGET),
            lease_exists: sql(LEASE_EXISTS),
        }
    }
}

/// What a run row says, read with its lease: its own outcome once it
/// ended; else [`RunState::Running`] while the lease is held by the run's
/// owner under its token at `now`, [`RunState::Unknown`] once it is not.
pub(super) fn run_state(
    outcome: Option<String>,
    token: Token,
    owner_id: OwnerId,
    lease: Option<(Token, OwnerId, i64)>,
    now: i64,
) -> RunState {
    if let Some(outcome) = outcome {
        return domain::stored(&outcome);
    }
    match lease {
        Some((fence, owner, expires_at))
            if fence == token && owner == owner_id && expires_at > now =>
        {
            RunState::Running
        }
        _ => RunState::Unknown,
    }
}

/// The fleet statements on any sqlx database whose connections execute
/// queries and whose rows give back text and integers (the bounds are stated
/// once, on the one implementation, as for `sql::SqlDb`).
#[async_trait]
pub(super) trait FleetDb: Database {
    async fn finish_run(
        pool: &Pool<Self>,
        sql: &FleetSql,
        end: &RunEnd<'_>,
    ) -> Result<bool, sqlx::Error>;

    async fn forget_unrun(
        pool: &Pool<Self>,
        sql: &FleetSql,
        resource: &str,
        owner_id: OwnerId,
    ) -> Result<u64, sqlx::Error>;

    async fn preempt(
        pool: &Pool<Self>,
        sql: &FleetSql,
        resource: &str,
        token: Token,
        occurrence: StoreTime,
    ) -> Result<bool, sqlx::Error>;

    async fn runs(
        pool: &Pool<Self>,
        sql: &FleetSql,
        q: &RunQuery<'_>,
        now: StoreTime,
    ) -> Result<Vec<RunInfo>, sqlx::Error>;

    async fn prune_runs(
        pool: &Pool<Self>,
        sql: &FleetSql,
        keep: u32,
        before: StoreTime,
    ) -> Result<u64, sqlx::Error>;

    async fn pause(
        pool: &Pool<Self>,
        sql: &FleetSql,
        p: &PauseInfo,
        replace: bool,
    ) -> Result<Option<PauseInfo>, sqlx::Error>;

    async fn resume(pool: &Pool<Self>, sql: &FleetSql, job: &str) -> Result<bool, sqlx::Error>;

    async fn pauses(
        pool: &Pool<Self>,
        sql: &FleetSql,
        now: StoreTime,
    ) -> Result<Vec<PauseInfo>, sqlx::Error>;

    async fn request_trigger(
        pool: &Pool<Self>,
        sql: &FleetSql,
        t: &TriggerInfo,
    ) -> Result<(), sqlx::Error>;

    async fn trigger(
        pool: &Pool<Self>,
        sql: &FleetSql,
        id: &str,
    ) -> Result<Option<TriggerInfo>, sqlx::Error>;

    async fn pending_triggers(
        pool: &Pool<Self>,
        sql: &FleetSql,
    ) -> Result<Vec<TriggerInfo>, sqlx::Error>;

    async fn claim_trigger(
        pool: &Pool<Self>,
        sql: &FleetSql,
        id: &str,
        node: &str,
    ) -> Result<bool, sqlx::Error>;

    async fn settle_trigger(
        pool: &Pool<Self>,
        sql: &FleetSql,
        id: &str,
        state: TriggerState,
        token: Option<Token>,
        detail: Option<&str>,
    ) -> Result<(), sqlx::Error>;

    async fn cancel_trigger(
        pool: &Pool<Self>,
        sql: &FleetSql,
        id: &str,
    ) -> Result<bool, sqlx::Error>;

    async fn prune_fleet(
        pool: &Pool<Self>,
        sql: &FleetSql,
        before: StoreTime,
    ) -> Result<u64, sqlx::Error>;

    async fn forget(
        pool: &Pool<Self>,
        sql: &FleetSql,
        resource: &str,
        now: StoreTime,
    ) -> Result<Option<bool>, sqlx::Error>;

    /// `prune_stale` (`values: false`) or `prune_values` (`true`).
    async fn prune_kept(
        pool: &Pool<Self>,
        sql: &FleetSql,
        values: bool,
        before: StoreTime,
    ) -> Result<u64, sqlx::Error>;

    async fn beat(
        pool: &Pool<Self>,
        sql: &FleetSql,
        beat: &NodeBeat<'_>,
        now: StoreTime,
    ) -> Result<(), sqlx::Error>;

    async fn nodes(pool: &Pool<Self>, sql: &FleetSql) -> Result<Vec<NodeInfo>, sqlx::Error>;

    /// The nodes live at `now` ([`LIVE_NODES`]).
    async fn live_nodes(
        pool: &Pool<Self>,
        sql: &FleetSql,
        now: StoreTime,
    ) -> Result<Vec<NodeInfo>, sqlx::Error>;

    /// Replaces `node`'s definitions, on the caller's transaction.
    async fn publish(
        conn: &mut Self::Connection,
        sql: &FleetSql,
        node: &str,
        jobs: &[crate::store::Definition<'_>],
    ) -> Result<(), sqlx::Error>;

    async fn published(
        pool: &Pool<Self>,
        sql: &FleetSql,
        node: &str,
        definitions: bool,
    ) -> Result<Vec<PublishedJob>, sqlx::Error>;

    async fn prune_nodes(
        pool: &Pool<Self>,
        sql: &FleetSql,
        before: StoreTime,
    ) -> Result<u64, sqlx::Error>;
}

/// A row of `fencecron_nodes`, by column name.
pub(super) fn node_info<R>(r: &R) -> Result<NodeInfo, sqlx::Error>
where
    R: Row,
    for<'c> &'c str: ColumnIndex<R>,
    i64: Type<R::Database> + for<'r> Decode<'r, R::Database>,
    String: Type<R::Database> + for<'r> Decode<'r, R::Database>,
{
    Ok(NodeInfo {
        node: r.try_get("node")?,
        hostname: r.try_get("hostname")?,
        pid: r.try_get("pid")?,
        version: r.try_get("version")?,
        config_digest: r.try_get("config_digest")?,
        started_at: StoreTime(r.try_get("started_at_ms")?),
        last_seen: StoreTime(r.try_get("seen_ms")?),
        state: domain::stored(&r.try_get::<String, _>("state")?),
        running: r.try_get("running")?,
    })
}

/// A one-statement beat's answer, read by position (sqlx describes a
/// MySQL `CALL` without its column names): one row per live node, each
/// `now_ms` (the beat's time), then `node`, `seen_ms`, `hostname`, `pid`,
/// `version`, `config_digest`, `started_at_ms`, `state`, `running`; or one
/// row with `now_ms` and a NULL node when no node is live (the beat said
/// `stopped` and nobody else beats).
pub(super) fn beat_answer<R>(rows: &[R]) -> Result<BeatAnswer, sqlx::Error>
where
    R: Row,
    usize: ColumnIndex<R>,
    i64: Type<R::Database> + for<'r> Decode<'r, R::Database>,
    String: Type<R::Database> + for<'r> Decode<'r, R::Database>,
{
    let first = rows.first().ok_or_else(|| {
        sqlx::Error::Protocol("the heartbeat statement answered no row".to_string())
    })?;
    let now = StoreTime(first.try_get(0)?);
    let mut live = Vec::with_capacity(rows.len());
    for r in rows {
        let Some(node) = r.try_get::<Option<String>, _>(1)? else {
            continue;
        };
        live.push(NodeInfo {
            node,
            last_seen: StoreTime(r.try_get(2)?),
            hostname: r.try_get(3)?,
            pid: r.try_get(4)?,
            version: r.try_get(5)?,
            config_digest: r.try_get(6)?,
            started_at: StoreTime(r.try_get(7)?),
            state: domain::stored(&r.try_get::<String, _>(8)?),
            running: r.try_get(9)?,
        });
    }
    Ok(BeatAnswer { now, live })
}

/// A run's end bound to [`FINISH_RUN`]'s `$1`..`$8`.
pub(super) fn bind_end<'q, DB>(
    query: Query<'q, DB, DB::Arguments<'q>>,
    end: &RunEnd<'q>,
) -> Query<'q, DB, DB::Arguments<'q>>
where
    DB: Database,
    &'q str: Encode<'q, DB> + Type<DB>,
    i64: Encode<'q, DB> + Type<DB>,
    Option<i64>: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
{
    query
        .bind(end.elapsed_ms)
        .bind(end.outcome.as_str())
        .bind(end.exit_code.map(i64::from))
        .bind(end.signal)
        .bind(end.duration_ms)
        .bind(end.output)
        .bind(end.resource)
        .bind(end.token)
}

#[cfg(test)]
mod tests;

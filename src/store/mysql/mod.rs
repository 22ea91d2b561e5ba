//! MySQL/MariaDB (MariaDB 10.11 is what is tested; MySQL 8 is not): several hosts without PostgreSQL.
//!
//! Clock choice: comparisons and expiries use `SYSDATE(3)`, the time at which
//! the expression is evaluated. `NOW()` is fixed at statement start, so a
//! statement that waited on InnoDB's row lock would compare against an old
//! time. (A server started with `--sysdate-is-now` loses this;
//! docs/operations.md says so.) sqlx sets the session `time_zone` to `+00:00`, so
//! `UNIX_TIMESTAMP()` of it is unambiguous even across DST changes.
//!
//! MySQL has no `UPDATE … RETURNING`. The renew passes its one value, the new
//! expiry, back in the OK packet through `LAST_INSERT_ID(expr)`. The acquire
//! needs a whole row back (the expiry for a winner, the holder for a loser),
//! so it is a stored procedure (migration 0002) that runs the conditional
//! `UPDATE` and reads the row on the server: one round trip, and a losing
//! acquire still writes nothing. Migration 0003 replaced it with one that
//! also applies the stored epoch (MySQL has no timeline to derive one from;
//! `fencecron epoch advance` in the promotion hook raises it) and returns
//! the vanished owner of a takeover.
//!
//! The documented exception to "one source per rule": the rule "this
//! occurrence is takeable" (expired by the store's clock, newer than the
//! last instant taken, due, not superseded, not paused), which PostgreSQL
//! and SQLite each write once (their `takeable!` fragment, shared by
//! acquire and claim), is written twice here, inside the procedures
//! `fencecron_acquire_v3` (migration 0005) and `fencecron_claim_v1`
//! (migration 0011, which also creates never-leased rows; within it the
//! row part is written once, in the locking read of an existing row, and
//! the instant and pause part once, in its candidates' cursor).
//! Migrations are immutable, and a new one sharing the
//! rule through a stored function would need `log_bin_trust_function_creators`
//! (or SUPER) on a server that logs binary (a function reading
//! `SYSDATE(3)` is not deterministic), and would change the plan of the
//! procedures older daemons still call during a rolling upgrade; the
//! store conformance tests hold both procedures to the same outcomes as
//! the other backends instead.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{MySql, Row, Transaction};

use super::bench::{like_escape, RawDialect};
use super::sql::{Db, Dialect, Sql, SqlDb, SqlStore, Written};
use super::*;

/// `SYSDATE(3)` as milliseconds since the epoch.
macro_rules! now_ms {
    () => {
        "CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED)"
    };
}

mod claim;
mod lease;
mod values;

use lease::*;
use values::*;

/// A node's heartbeat in one round trip: the procedure of migration 0010
/// upserts the row with `SYSDATE(3)` and answers the live nodes with it.
const CALL_BEAT: &str = "CALL fencecron_beat_v1(?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// The MySQL/MariaDB dialect.
pub(super) struct My;

/// The MySQL/MariaDB store.
pub(super) type MySqlStore = SqlStore<My>;

impl MySqlStore {
    /// Prepares a lazily connecting pool.
    pub fn open(url: StoreUrl, opts: &OpenOptions) -> Result<Self, StoreError> {
        let connect: MySqlConnectOptions =
            url.expose().parse().map_err(|e| unavailable(&url, e))?;
        let connect = connect.timezone(Some("+00:00".to_string()));
        Ok(SqlStore::new(
            Db::connect_lazy(url, opts, connect, |pool| pool),
            My,
        ))
    }
}

#[async_trait]
impl Dialect for My {
    type DB = MySql;
    const BACKEND: Backend = Backend::MySql;
    const GET: &'static str = GET;
    const STALE: &'static str = STALE;
    const LATEST_STALE: &'static str = LATEST_STALE;
    const LIST: &'static str = LIST;
    const PUT_STATE: &'static str = PUT_STATE;
    const EPOCH: &'static str = EPOCH;
    const ADVANCE_EPOCH: &'static str = ADVANCE_EPOCH;
    const ADMIT_STATE: &'static str = ADMIT_STATE;
    const ADMIT_RAISE: &'static str = ADMIT_RAISE;

    async fn migrate(&self, db: &Db<MySql>) -> Result<(), StoreError> {
        // sqlx's own MySQL lock is `GET_LOCK(name, -1)`, which MariaDB
        // answers with NULL instead of waiting, so concurrent starts would
        // race into "migration partially applied". Take our own named lock
        // with a finite wait on one connection and migrate on that same
        // connection.
        let err = |e| unavailable(&db.url, e);
        timed(&db.url, db.call_timeout * 3, async {
            let mut conn = super::diagnose::first_connection(&db.pool)
                .await
                .map_err(err)?;
            let wait = i64::try_from((db.call_timeout * 2).as_secs()).unwrap_or(60);
            let locked: Option<i64> =
                sqlx::query_scalar("SELECT GET_LOCK(CONCAT('fencecron-migrate:', DATABASE()), ?)")
                    .bind(wait)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(err)?;
            if locked != Some(1) {
                return Err(StoreError::Timeout {
                    url: db.url.to_string(),
                    limit: db.call_timeout * 2,
                });
            }
            let result = super::migrator::run::<MySql>(
                &mut conn,
                Backend::MySql,
                &sqlx::migrate!("migrations/mysql"),
                &db.hook,
            )
            .await
            .map_err(|source| migrate_error(Backend::MySql, &db.url, source));
            sqlx::query("SELECT RELEASE_LOCK(CONCAT('fencecron-migrate:', DATABASE()))")
                .execute(&mut *conn)
                .await
                .map_err(err)?;
            result
        })
        .await
    }

    async fn claim(&self, db: &Db<MySql>, req: &ClaimRequest<'_>) -> Sql<ClaimOutcome> {
        self.claim_leases(db, req).await
    }

    async fn acquire(&self, db: &Db<MySql>, req: &AcquireRequest<'_>) -> Sql<AcquireOutcome> {
        self.acquire_lease(db, req).await
    }

    async fn renew(
        &self,
        db: &Db<MySql>,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
        lease: Duration,
    ) -> Sql<RenewOutcome> {
        let done = sqlx::query(RENEW)
            .bind(millis(lease))
            .bind(resource.as_str())
            .bind(owner_id.as_str())
            .bind(token)
            .execute(&db.pool)
            .await?;
        if done.rows_affected() == 1 {
            return Ok(RenewOutcome::Renewed {
                expires_at: StoreTime(done.last_insert_id() as i64),
            });
        }
        Ok(RenewOutcome::Refused(classify_refusal(
            MySql::lease_row(&db.pool, LEASE_ROW, resource).await?,
            owner_id,
            token,
        )))
    }

    async fn release(
        &self,
        db: &Db<MySql>,
        resource: &Name,
        owner_id: OwnerId,
        token: Option<Token>,
        occurrence: Option<StoreTime>,
    ) -> Sql<ReleaseOutcome> {
        let query = match occurrence {
            None => sqlx::query(RELEASE)
                .bind(resource.as_str())
                .bind(owner_id.as_str())
                .bind(token),
            Some(occ) => sqlx::query(GIVE_BACK)
                .bind(occ.0)
                .bind(occ.0)
                .bind(resource.as_str())
                .bind(owner_id.as_str())
                .bind(token)
                .bind(token)
                .bind(occ.0),
        };
        let done = query.execute(&db.pool).await?;
        if done.rows_affected() == 1 {
            return Ok(ReleaseOutcome::Released);
        }
        Ok(ReleaseOutcome::Refused(classify_refusal(
            MySql::lease_row(&db.pool, LEASE_ROW, resource).await?,
            owner_id,
            token.unwrap_or_default(),
        )))
    }

    /// MySQL cannot tell from the write whether it wrote (an `ON
    /// DUPLICATE KEY UPDATE` that keeps every column still counts): the
    /// key's row, read after it in the transaction, carries this
    /// operation's id if it did, and otherwise says what beat it.
    async fn put_write(
        &self,
        tx: &mut Transaction<'static, MySql>,
        req: &PutRequest<'_>,
        op: &str,
        _now: Option<i64>,
    ) -> Sql<Written> {
        sqlx::query(PUT)
            .bind(req.resource.as_str())
            .bind(req.key.as_str())
            .bind(req.value)
            .bind(req.token)
            .bind(req.owner_id.as_str())
            .bind(op)
            .bind(req.resource.as_str())
            .bind(req.token)
            .bind(req.owner_id.as_str())
            .bind(req.once)
            .bind(req.once)
            .bind(req.once)
            .bind(req.once)
            .bind(req.once)
            .execute(&mut **tx)
            .await?;
        let row = My::put_row(tx, req).await?;
        let written_op: Option<String> = row.try_get("op")?;
        if written_op.as_deref() == Some(op) {
            let at: Option<i64> = row.try_get("written_at")?;
            return Ok(Written::At(at.unwrap_or_default()));
        }
        Ok(Written::Refused(Some(rows::put_state(&row)?)))
    }

    /// [`PUT_STATE`] binds each parameter where it stands (MySQL's `?`).
    async fn put_state(
        &self,
        tx: &mut Transaction<'static, MySql>,
        req: &PutRequest<'_>,
    ) -> Sql<rows::PutState> {
        Ok(rows::put_state(&My::put_row(tx, req).await?)?)
    }

    async fn insert_stale(
        &self,
        tx: &mut Transaction<'static, MySql>,
        rec: &NewStaleRecord<'_>,
        _now: Option<i64>,
    ) -> Sql<i64> {
        Ok(My::insert_stale(tx, rec).await?)
    }

    /// A failed `put`, named for what it is when the value was too large for
    /// the server: error 1153 (ER_NET_PACKET_TOO_LARGE), or, for a value far
    /// over the limit, the server closing the connection while it is still
    /// being sent (seen as a reset or broken pipe; MariaDB does this for a
    /// 100 MB value against its 16 MiB default). In the second case the
    /// server's `max_allowed_packet` is read on another connection to make
    /// sure before blaming the value; otherwise the error stays
    /// "unreachable".
    async fn put_failed(&self, db: &Db<MySql>, source: sqlx::Error, size: usize) -> StoreError {
        let too_large = match &source {
            sqlx::Error::Database(e) => e
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .is_some_and(|e| e.number() == ER_NET_PACKET_TOO_LARGE),
            _ => false,
        };
        let cut_off = matches!(&source, sqlx::Error::Io(e) if matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::UnexpectedEof
        ));
        if !too_large && !cut_off {
            return unavailable(&db.url, source);
        }
        let max = tokio::time::timeout(Duration::from_secs(2), async {
            sqlx::query_scalar::<_, i64>("SELECT CAST(@@max_allowed_packet AS SIGNED)")
                .fetch_one(&db.pool)
                .await
                .ok()
        })
        .await
        .ok()
        .flatten()
        .and_then(|m| u64::try_from(m).ok());
        if too_large || max.is_some_and(|m| size as u64 >= m) {
            StoreError::PacketTooLarge {
                url: db.url.to_string(),
                size,
                max,
                detail: source.to_string(),
            }
        } else {
            unavailable(&db.url, source)
        }
    }

    /// One call of `fencecron_beat_v1` (migration 0010).
    async fn beat(
        &self,
        db: &Db<MySql>,
        _fleet: &super::fleet::FleetSql,
        beat: &NodeBeat<'_>,
    ) -> Sql<BeatAnswer> {
        let rows = sqlx::query(CALL_BEAT)
            .bind(beat.node)
            .bind(beat.hostname)
            .bind(i64::from(beat.pid))
            .bind(beat.version)
            .bind(beat.config_digest)
            .bind(beat.started_at.map(|t| t.0))
            .bind(beat.state.as_str())
            .bind(i64::from(beat.running))
            .bind(millis(NODE_LIVE))
            .fetch_all(&db.pool)
            .await?;
        Ok(super::fleet::beat_answer(&rows)?)
    }

    async fn now(&self, db: &Db<MySql>) -> Sql<StoreTime> {
        let now: i64 = sqlx::query_scalar(concat!("SELECT ", now_ms!()))
            .fetch_one(&db.pool)
            .await?;
        Ok(StoreTime(now))
    }
}

#[async_trait]
impl RawDialect for My {
    async fn raw_write(
        &self,
        db: &Db<MySql>,
        op: RawOp,
        r: &str,
        owner_id: &str,
        token: Token,
    ) -> Sql<Option<Token>> {
        let lease = millis(MIN_LEASE);
        Ok(match op {
            RawOp::AcquireFree | RawOp::AcquireHeld => {
                let row = sqlx::query(CALL_ACQUIRE)
                    .bind(r)
                    .bind(owner_id)
                    .bind("bench")
                    .bind(lease)
                    .bind(None::<i64>)
                    .bind(None::<i64>)
                    .bind(None::<&str>)
                    .bind(StartedBy::Schedule.as_str())
                    .bind(None::<i64>)
                    .fetch_one(&db.pool)
                    .await?;
                let won: i64 = row.try_get(0)?;
                let fence: Option<Token> = row.try_get(1)?;
                fence.filter(|_| won == 1)
            }
            RawOp::Renew => {
                sqlx::query(RENEW)
                    .bind(lease)
                    .bind(r)
                    .bind(owner_id)
                    .bind(token)
                    .execute(&db.pool)
                    .await?;
                None
            }
            RawOp::Release => {
                sqlx::query(RELEASE)
                    .bind(r)
                    .bind(owner_id)
                    .bind(token)
                    .execute(&db.pool)
                    .await?;
                None
            }
            RawOp::Put | RawOp::Ping | RawOp::Get => {
                let mut tx = db.pool.begin().await?;
                sqlx::query(PUT)
                    .bind(r)
                    .bind("bench")
                    .bind(&b"bench"[..])
                    .bind(token)
                    .bind(owner_id)
                    .bind(owner_id)
                    .bind(r)
                    .bind(token)
                    .bind(owner_id)
                    .bind(false)
                    .bind(false)
                    .bind(false)
                    .bind(false)
                    .bind(false)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                None
            }
        })
    }

    async fn purge(&self, db: &Db<MySql>, prefix: &str) -> Sql<u64> {
        let pattern = format!("{}%", like_escape(prefix));
        Ok(MySql::execute_each(
            &db.pool,
            &[
                "DELETE FROM fencecron_values WHERE resource LIKE ? ESCAPE '\\\\'",
                "DELETE FROM fencecron_stale WHERE resource LIKE ? ESCAPE '\\\\'",
                "DELETE FROM fencecron_leases WHERE resource LIKE ? ESCAPE '\\\\'",
            ],
            &pattern,
        )
        .await?)
    }
}

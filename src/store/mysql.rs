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
//! (migration 0008). Migrations are immutable, and a new one sharing the
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

/// The acquisition: the procedure of migration 0004 (0003's with adoption
/// of this occurrence's own win and the next instant's refusal), which
/// holds the conditional `UPDATE`.
const CALL_ACQUIRE: &str = "CALL fencecron_acquire_v3(?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// A batch claim (migration 0006): the items as JSON, node, limit, share,
/// how often the node's mark is refreshed and how long a mark counts.
const CALL_CLAIM: &str = "CALL fencecron_claim_v1(?, ?, ?, ?, ?, ?)";

const RENEW: &str = concat!(
    "UPDATE fencecron_leases SET expires_at_ms = LAST_INSERT_ID(",
    now_ms!(),
    " + ?) WHERE resource = ? AND owner_id = ? AND fence = ? AND expires_at_ms > ",
    now_ms!()
);

const RELEASE: &str = concat!(
    "UPDATE fencecron_leases SET expires_at_ms = LEAST(expires_at_ms, ",
    now_ms!(),
    "), released = TRUE WHERE resource = ? AND owner_id = ? AND fence = ?"
);

/// `give_back`: a release that also makes the occurrence takeable again
/// when it is still the last one taken (`occurrence - 1` keeps older
/// instants refused). The `WHERE` sees the row before the `SET`. Without a
/// token: this owner's unreleased win of exactly this occurrence.
const GIVE_BACK: &str = concat!(
    "UPDATE fencecron_leases
        SET last_occurrence_ms = IF(last_occurrence_ms = ?, ? - 1, last_occurrence_ms),
            expires_at_ms = LEAST(expires_at_ms, ",
    now_ms!(),
    "), released = TRUE
      WHERE resource = ? AND owner_id = ?
        AND (fence = ? OR (? IS NULL AND NOT released AND last_occurrence_ms = ?))"
);

/// `fencecron epoch`: the stored epoch and the highest fence.
const EPOCH: &str =
    "SELECT COALESCE((SELECT epoch FROM fencecron_epoch WHERE id = 1), 0) AS stored,
            (SELECT MAX(fence) FROM fencecron_leases) AS highest";

/// `fencecron epoch advance`: max(stored, highest fence >> 32) + 1, in one
/// transaction with the read of the result. The read of the leases is a
/// locking read inside the `INSERT … SELECT`, so an acquire still running
/// with the old epoch finishes first or waits for the new one.
const ADVANCE_EPOCH: &str = "INSERT INTO fencecron_epoch (id, epoch)
     SELECT 1, COALESCE(MAX(fence), 0) DIV 4294967296 + 1 FROM fencecron_leases
     ON DUPLICATE KEY UPDATE epoch = GREATEST(fencecron_epoch.epoch, VALUES(epoch) - 1) + 1";

const LEASE_ROW: &str =
    "SELECT owner_id, fence, expires_at_ms FROM fencecron_leases WHERE resource = ?";

const LIST: &str = concat!(
    "SELECT CAST(resource AS CHAR CHARACTER SET utf8mb4) AS resource, owner_id, node, fence,
            expires_at_ms, last_occurrence_ms, ",
    now_ms!(),
    " AS now_ms FROM fencecron_leases
     WHERE forgotten_at_ms IS NULL OR acquired_at_ms >= forgotten_at_ms ORDER BY resource"
);

/// The conditional write. Writes only when the token is the resource's
/// fence and was issued to this owner; on an existing key, every column
/// changes only when the token is at least (with `once`: above) the accepted
/// one. `token` is assigned last because MySQL evaluates the assignments
/// left to right and the earlier conditions must see the old token.
const PUT: &str = concat!(
    "INSERT INTO fencecron_values
       (resource, key_name, value, token, owner_id, operation_id, written_at_ms)
     SELECT ?, ?, ?, ?, ?, ?, ",
    now_ms!(),
    " FROM fencecron_leases l WHERE l.resource = ? AND l.fence = ? AND l.owner_id = ?
     ON DUPLICATE KEY UPDATE
       value = IF(fencecron_values.token < VALUES(token) OR (fencecron_values.token = VALUES(token) AND NOT ?), VALUES(value), fencecron_values.value),
       owner_id = IF(fencecron_values.token < VALUES(token) OR (fencecron_values.token = VALUES(token) AND NOT ?), VALUES(owner_id), fencecron_values.owner_id),
       written_at_ms = IF(fencecron_values.token < VALUES(token) OR (fencecron_values.token = VALUES(token) AND NOT ?), VALUES(written_at_ms), fencecron_values.written_at_ms),
       operation_id = IF(fencecron_values.token < VALUES(token) OR (fencecron_values.token = VALUES(token) AND NOT ?), VALUES(operation_id), fencecron_values.operation_id),
       token = IF(fencecron_values.token < VALUES(token) OR (fencecron_values.token = VALUES(token) AND NOT ?), VALUES(token), fencecron_values.token)"
);

const PUT_STATE: &str = "SELECT
       (SELECT operation_id FROM fencecron_values WHERE resource = ? AND key_name = ?) AS op,
       (SELECT written_at_ms FROM fencecron_values WHERE resource = ? AND key_name = ?) AS written_at,
       (SELECT token FROM fencecron_values WHERE resource = ? AND key_name = ?) AS accepted,
       (SELECT fence FROM fencecron_leases WHERE resource = ?) AS issued,
       (SELECT owner_id FROM fencecron_leases WHERE resource = ?) AS issued_to";

const INSERT_STALE: &str = concat!(
    "INSERT INTO fencecron_stale
       (at_ms, kind, reason, resource, key_name, owner_id, token, accepted_token, node, job, stage, operation_id)
     VALUES (",
    now_ms!(),
    ", ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
);

/// The fencing proxy's read: the highest token admitted for the resource
/// and the resource's fence.
const ADMIT_STATE: &str =
    "SELECT (SELECT highest FROM fencecron_proxy_fences WHERE resource = ?) AS highest,
            (SELECT fence FROM fencecron_leases WHERE resource = ?) AS issued";

/// The fencing proxy's raise: only a token the lease row issued, only
/// upwards.
const ADMIT_RAISE: &str = "INSERT INTO fencecron_proxy_fences (resource, highest)
 SELECT ?, ? FROM fencecron_leases l WHERE l.resource = ? AND l.fence >= ? AND ? > 0
 ON DUPLICATE KEY UPDATE highest = GREATEST(highest, VALUES(highest))";

const GET: &str = "SELECT value, token, owner_id, written_at_ms FROM fencecron_values
                    WHERE resource = ? AND key_name = ?";

/// Names are stored as bytes (VARBINARY); they are read back as text under
/// the column names every backend uses.
const STALE: &str = "SELECT at_ms, kind, reason,
            CAST(resource AS CHAR CHARACTER SET utf8mb4) AS resource,
            CAST(key_name AS CHAR CHARACTER SET utf8mb4) AS `key`, owner_id, token, accepted_token,
                            node, job, stage, operation_id
                       FROM fencecron_stale WHERE at_ms >= ? ORDER BY at_ms, id";

/// MySQL's error number for a packet larger than `max_allowed_packet`.
const ER_NET_PACKET_TOO_LARGE: u16 = 1153;

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

impl My {
    /// The key's row and the lease row after a write ([`PUT_STATE`]).
    async fn put_row(
        tx: &mut Transaction<'static, MySql>,
        req: &PutRequest<'_>,
    ) -> Result<sqlx::mysql::MySqlRow, sqlx::Error> {
        let r = req.resource.as_str();
        let k = req.key.as_str();
        sqlx::query(PUT_STATE)
            .bind(r)
            .bind(k)
            .bind(r)
            .bind(k)
            .bind(r)
            .bind(k)
            .bind(r)
            .bind(r)
            .fetch_one(&mut **tx)
            .await
    }

    async fn insert_stale(
        tx: &mut Transaction<'static, MySql>,
        rec: &NewStaleRecord<'_>,
    ) -> Result<i64, sqlx::Error> {
        let done = MySql::bind_stale(sqlx::query(INSERT_STALE), rec)
            .execute(&mut **tx)
            .await?;
        sqlx::query_scalar("SELECT at_ms FROM fencecron_stale WHERE id = ?")
            .bind(done.last_insert_id())
            .fetch_one(&mut **tx)
            .await
    }
}

#[async_trait]
impl Dialect for My {
    type DB = MySql;
    const BACKEND: Backend = Backend::MySql;
    const GET: &'static str = GET;
    const STALE: &'static str = STALE;
    const LIST: &'static str = LIST;
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

    const CLAIMS: bool = true;

    /// One `CALL fencecron_claim_v1(…)` (migration 0006): the claim's
    /// transaction (`FOR UPDATE SKIP LOCKED` over the items in order) and
    /// the read of every item's row run on the server, in one round trip.
    async fn claim(&self, db: &Db<MySql>, req: &ClaimRequest<'_>) -> Sql<Option<ClaimOutcome>> {
        let items: Vec<serde_json::Value> = req
            .items
            .iter()
            .map(|i| {
                let mut item = serde_json::json!({
                    "r": i.resource.as_str(),
                    "o": i.owner_id.to_string(),
                    "j": i.job,
                    "q": i.occurrence.0,
                    "l": millis(i.lease),
                });
                if let Some(next) = i.next_occurrence {
                    item["n"] = next.0.into();
                }
                item
            })
            .collect();
        let rows = sqlx::query(CALL_CLAIM)
            .bind(serde_json::Value::Array(items).to_string())
            .bind(req.node)
            .bind(i64::try_from(req.limit).unwrap_or(i64::MAX))
            .bind(i32::from(req.share))
            .bind(millis(NODE_BEAT))
            .bind(millis(NODE_LIVE))
            .fetch_all(&db.pool)
            .await?;
        Ok(Some(rows::claim_outcome(&rows, req, &db.url)?))
    }

    /// One `CALL fencecron_acquire_v3(…)` (migration 0005): the pause check,
    /// the conditional
    /// `UPDATE` (or the first `INSERT` of the row) and the read of the
    /// row after it, and a winner's run row, run on the server, so a winner
    /// learns its expiry and a loser who holds the lease in one round trip.
    async fn acquire(&self, db: &Db<MySql>, req: &AcquireRequest<'_>) -> Sql<AcquireOutcome> {
        let owner = req.owner_id;
        let (job, started_by, scheduled_at) = run_binds(req);
        let row = sqlx::query(CALL_ACQUIRE)
            .bind(req.resource.as_str())
            .bind(owner.to_string())
            .bind(req.node)
            .bind(millis(req.lease))
            .bind(req.occurrence.map(|o| o.0))
            .bind(req.next_occurrence.map(|o| o.0))
            .bind(job)
            .bind(started_by)
            .bind(scheduled_at)
            .fetch_one(&db.pool)
            .await?;
        // Read by position: sqlx describes a CALL without its result's
        // column names.
        let won: i64 = row.try_get(0)?;
        let fence: Option<i64> = row.try_get(1)?;
        let owner_id: Option<String> = row.try_get(2)?;
        let node: Option<String> = row.try_get(3)?;
        let expires_at: Option<i64> = row.try_get(4)?;
        let last_occurrence: Option<i64> = row.try_get(5)?;
        let now: i64 = row.try_get(6)?;
        let taken_over = rows::takeover(&row, [7, 8, 9, 10])?;
        if won == 0 && row.try_get::<i64, _>(11)? == 1 {
            let pause = PauseSeen {
                note: row.try_get(12)?,
                until: row.try_get(14)?,
                first: row.try_get::<i64, _>(15)? == 1,
            };
            return Ok(classify_paused(pause, req, now));
        }
        let (Some(fence), Some(owner_id), Some(node), Some(expires_at)) =
            (fence, owner_id, node, expires_at)
        else {
            // No row: only an occurrence not yet due, or already
            // superseded, keeps the first acquisition from creating it.
            return match (req.occurrence, req.next_occurrence) {
                (Some(occ), _) if occ.0 > now => Ok(AcquireOutcome::NotYetDue {
                    store_now: StoreTime(now),
                }),
                (_, Some(next)) if next.0 <= now => Ok(AcquireOutcome::Superseded {
                    store_now: StoreTime(now),
                }),
                _ => Err(StoreError::Corrupt {
                    url: db.url.to_string(),
                    detail: format!(
                        "the lease row for {} neither exists nor can be created",
                        req.resource
                    ),
                }
                .into()),
            };
        };
        if won == 1 && owner == owner_id {
            return Ok(AcquireOutcome::Acquired(Lease {
                resource: req.resource.to_string(),
                owner_id: owner,
                token: fence,
                expires_at: StoreTime(expires_at),
                taken_over,
            }));
        }
        Ok(classify_loss(
            LossRow {
                fence,
                owner_id,
                node,
                expires_at,
                last_occurrence,
                now,
            },
            req,
        ))
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
            token.unwrap_or(0),
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
                let fence: Option<i64> = row.try_get(1)?;
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

//! The SQL guard: the fence check for data a job writes into its **own**
//! database (PostgreSQL, MySQL/MariaDB or SQLite), not fencecron's store.
//!
//! A token protects only data whose writer checks it. The guard puts the
//! check where the job's data lives: a table of the highest token accepted
//! per resource (`fencecron_guard`) and a check the job calls inside its own
//! transaction, fed from `FENCECRON_RESOURCE` and `FENCECRON_TOKEN`:
//!
//! * PostgreSQL: `SELECT fencecron_guard($resource, $token)`, a function;
//! * MySQL/MariaDB: `CALL fencecron_guard(?, ?)`, a procedure;
//! * SQLite: `INSERT INTO fencecron_guard_check (resource, token) VALUES (?, ?)`,
//!   an insert into a view whose `INSTEAD OF` trigger does the check.
//!
//! The check accepts a token `>=` the highest accepted for the resource
//! (equal: the same owner writing again) and raises the highest to it; it
//! refuses an older one so that the caller's **whole transaction** fails:
//! PostgreSQL aborts the transaction on the error (SQLSTATE `FC001`),
//! the MySQL procedure runs `ROLLBACK` before it signals `FC001`, and
//! SQLite's trigger uses `RAISE(ROLLBACK, …)` (`ABORT` would undo only the
//! check's own statement and leave earlier writes to be committed). The
//! check locks the resource's guard row until the transaction ends, so of
//! two transactions checking one resource the second waits for the first;
//! an older token can never commit after a newer one's check.
//!
//! A refused transaction leaves a row in `fencecron_guard_rejections` only
//! where the database can keep a row its transaction rolled back: MySQL and
//! MariaDB, whose procedure writes it into a MyISAM table (not
//! transactional) after its `ROLLBACK`. PostgreSQL and SQLite have no
//! autonomous transactions, so there the job reports the refusal after its
//! rollback (`fencecron guard record`, [`GuardDb::record`]), which writes the
//! same row; `fencecron stale --guard URL` lists these rows.
//!
//! The DDL is written once, as the statements below: `fencecron guard ddl`
//! prints them ([`script`]) and `fencecron guard install` runs them
//! ([`GuardDb::install`]). Every statement is idempotent and touches only
//! the `fencecron_guard*` objects, never fencecron's own tables.

mod ddl;

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::Row;

use crate::domain::Stage;
use crate::names::Name;
use crate::store::{
    first_connection, pg_first_connection, postgres_options, timed, unavailable, Backend, OwnerId,
    PgHosts, RejectReason, StaleKind, StaleRecord, StoreError, StoreTime, StoreUrl, Token,
};
pub use ddl::{script, trigger_script};
use ddl::{MYSQL, POSTGRES, SQLITE};

/// How long one guard call may take (install waits for a concurrent
/// install's lock).
const CALL_LIMIT: Duration = Duration::from_secs(30);

/// A connection to a job's own database, where the guard lives.
pub struct GuardDb {
    url: StoreUrl,
    pool: Pool,
    /// A multi-host PostgreSQL URL's hosts, walked as the store walks them.
    hosts: Option<std::sync::Arc<PgHosts>>,
}

enum Pool {
    Pg(PgPool),
    My(MySqlPool),
    Lite(SqlitePool),
}

/// A refusal a job reports after its rollback ([`GuardDb::record`]).
#[derive(Debug, Clone)]
pub struct GuardReport<'a> {
    pub resource: &'a Name,
    pub token: Token,
    pub node: Option<&'a str>,
    pub job: Option<&'a str>,
    pub owner_id: Option<OwnerId>,
}

/// What [`GuardDb::record`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// The guard refused the token; the row (new, or the one already there
    /// for this resource and token) as `fencecron stale` lists it.
    Rejection { record: Box<StaleRecord>, new: bool },
    /// The guard accepts the token (`highest` is `None` when it never saw
    /// the resource): whatever failed, it was not the guard; nothing
    /// recorded.
    NotStale { highest: Option<Token> },
}

const REJECTION_COLUMNS: &str =
    "at_ms, resource, token, accepted_token, source, db_user, node, job, owner_id, operation_id";

impl GuardDb {
    /// Opens a small pool on the job's database, connecting on first use.
    /// A SQLite file must exist (a typo must not create an empty database
    /// that guards nothing); its journal mode and other settings are left
    /// as the application set them.
    pub fn open(url: &StoreUrl) -> Result<GuardDb, StoreError> {
        let url = url.clone();
        let hosts = match url.backend() {
            Backend::Postgres => PgHosts::new(&url, "fencecron-guard", CALL_LIMIT)?,
            _ => None,
        };
        let pool = match url.backend() {
            Backend::Postgres => {
                let pool = PgPoolOptions::new()
                    .max_connections(2)
                    .acquire_timeout(CALL_LIMIT);
                Pool::Pg(match &hosts {
                    Some(h) => h.pool_options(pool).connect_lazy_with(h.first_options()),
                    None => pool.connect_lazy_with(postgres_options(&url, "fencecron-guard")?),
                })
            }
            Backend::MySql => {
                let c: MySqlConnectOptions =
                    url.expose().parse().map_err(|e| unavailable(&url, e))?;
                Pool::My(
                    MySqlPoolOptions::new()
                        .max_connections(2)
                        .acquire_timeout(CALL_LIMIT)
                        .connect_lazy_with(c),
                )
            }
            Backend::Sqlite => {
                let c = SqliteConnectOptions::from_str(url.expose())
                    .map_err(|e| unavailable(&url, e))?
                    .create_if_missing(false)
                    .busy_timeout(Duration::from_secs(10));
                Pool::Lite(
                    SqlitePoolOptions::new()
                        .max_connections(1)
                        .acquire_timeout(CALL_LIMIT)
                        .connect_lazy_with(c),
                )
            }
        };
        Ok(GuardDb { url, pool, hosts })
    }

    /// Gets the first connection fast, with the real reason when there is
    /// none (the pool alone would retry a refused connection until its
    /// timeout and report only that): every operation starts here.
    async fn connected(&self) -> Result<(), sqlx::Error> {
        match &self.pool {
            Pool::Pg(p) => pg_first_connection(self.hosts.as_deref(), p)
                .await
                .map(drop),
            Pool::My(p) => first_connection(p).await.map(drop),
            Pool::Lite(p) => first_connection(p).await.map(drop),
        }
    }

    /// Runs the guard's DDL ([`ddl::statements`]): on PostgreSQL and SQLite in
    /// one transaction, on MySQL (whose DDL commits by itself) under a named
    /// lock; concurrent installs are serialised either way. Re-running it is
    /// safe and replaces the check with this version's.
    pub async fn install(&self) -> Result<(), StoreError> {
        timed(&self.url, CALL_LIMIT, async {
            let r: Result<(), sqlx::Error> = async {
                self.connected().await?;
                match &self.pool {
                    Pool::Pg(p) => {
                        let mut tx = p.begin().await?;
                        sqlx::query(
                            "SELECT pg_advisory_xact_lock(hashtext('fencecron_guard_install'))",
                        )
                        .execute(&mut *tx)
                        .await?;
                        for s in POSTGRES {
                            sqlx::raw_sql(s).execute(&mut *tx).await?;
                        }
                        tx.commit().await
                    }
                    Pool::My(p) => {
                        let mut c = p.acquire().await?;
                        sqlx::query("SELECT GET_LOCK('fencecron_guard_install', 25)")
                            .execute(&mut *c)
                            .await?;
                        let mut r = Ok(());
                        for s in MYSQL {
                            if let Err(e) = sqlx::raw_sql(s).execute(&mut *c).await {
                                r = Err(e);
                                break;
                            }
                        }
                        sqlx::query("SELECT RELEASE_LOCK('fencecron_guard_install')")
                            .execute(&mut *c)
                            .await?;
                        r
                    }
                    Pool::Lite(p) => {
                        let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
                        for s in SQLITE {
                            sqlx::raw_sql(s).execute(&mut *tx).await?;
                        }
                        tx.commit().await
                    }
                }
            }
            .await;
            r.map_err(|e| unavailable(&self.url, e))
        })
        .await
    }

    /// The highest token the guard accepted for `resource`, if any.
    pub async fn highest(&self, resource: &Name) -> Result<Option<Token>, StoreError> {
        timed(&self.url, CALL_LIMIT, async {
            self.connected()
                .await
                .map_err(|e| unavailable(&self.url, e))?;
            let r = match &self.pool {
                Pool::Pg(p) => {
                    sqlx::query_scalar("SELECT token FROM fencecron_guard WHERE resource = $1")
                        .bind(resource.as_str())
                        .fetch_optional(p)
                        .await
                }
                Pool::My(p) => {
                    sqlx::query_scalar("SELECT token FROM fencecron_guard WHERE resource = ?")
                        .bind(resource.as_str())
                        .fetch_optional(p)
                        .await
                }
                Pool::Lite(p) => {
                    sqlx::query_scalar("SELECT token FROM fencecron_guard WHERE resource = ?")
                        .bind(resource.as_str())
                        .fetch_optional(p)
                        .await
                }
            };
            r.map_err(|e| unavailable(&self.url, e))
        })
        .await
    }

    /// A job's report of a refusal, after its rollback: when the guard's
    /// highest token for the resource is above the job's, writes the
    /// rejection row (source `job`) unless one for this resource and token
    /// is already there (MySQL's procedure wrote it, or the job reported
    /// twice), fills in the node, job and owner id such a row lacks, and
    /// returns it. A token the guard accepts records nothing.
    pub async fn record(&self, rep: &GuardReport<'_>) -> Result<Recorded, StoreError> {
        let highest = self.highest(rep.resource).await?;
        let accepted = match highest {
            Some(h) if h > rep.token => h,
            _ => return Ok(Recorded::NotStale { highest }),
        };
        let op = uuid::Uuid::new_v4().to_string();
        let res = rep.resource.as_str();
        timed(&self.url, CALL_LIMIT, async {
            let r: Result<(u64, Option<RejectionRow>), sqlx::Error> = async {
                macro_rules! record {
                    ($pool:expr, $insert:expr, $fill:expr, $select:expr) => {{
                        let done = sqlx::query($insert)
                            .bind(res)
                            .bind(rep.token)
                            .bind(accepted)
                            .bind(rep.node)
                            .bind(rep.job)
                            .bind(rep.owner_id.as_ref().map(OwnerId::as_str))
                            .bind(&op)
                            .execute($pool)
                            .await?;
                        // A row the procedure wrote names no node, job or
                        // owner: this report does.
                        sqlx::query($fill)
                            .bind(rep.node)
                            .bind(rep.job)
                            .bind(rep.owner_id.as_ref().map(OwnerId::as_str))
                            .bind(res)
                            .bind(rep.token)
                            .execute($pool)
                            .await?;
                        let row = sqlx::query(&$select)
                            .bind(res)
                            .bind(rep.token)
                            .fetch_optional($pool)
                            .await?;
                        let rec = row.as_ref().map(RejectionRow::read).transpose()?;
                        (done.rows_affected(), rec)
                    }};
                }
                Ok(match &self.pool {
                    Pool::Pg(p) => record!(
                        p,
                        "INSERT INTO fencecron_guard_rejections
                           (at_ms, resource, token, accepted_token, source, db_user, node, job, owner_id, operation_id)
                         SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT, $1, $2, $3, 'job',
                                session_user, $4, $5, $6, $7
                          WHERE NOT EXISTS (SELECT 1 FROM fencecron_guard_rejections
                                             WHERE resource = $1 AND token = $2)",
                        "UPDATE fencecron_guard_rejections
                            SET node = COALESCE(node, $1), job = COALESCE(job, $2), owner_id = COALESCE(owner_id, $3)
                          WHERE resource = $4 AND token = $5",
                        format!("SELECT {REJECTION_COLUMNS} FROM fencecron_guard_rejections WHERE resource = $1 AND token = $2 ORDER BY id LIMIT 1")
                    ),
                    Pool::My(p) => {
                        // MySQL numbers no placeholders: the NOT EXISTS
                        // compares with the values of the row selected.
                        record!(
                            p,
                            "INSERT INTO fencecron_guard_rejections
                               (at_ms, resource, token, accepted_token, source, db_user, node, job, owner_id, operation_id)
                             SELECT * FROM (SELECT ROUND(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS at_ms, ? AS resource,
                                                   ? AS token, ? AS accepted_token, 'job' AS source, USER() AS db_user,
                                                   ? AS node, ? AS job, ? AS owner_id, ? AS operation_id) AS incoming
                              WHERE NOT EXISTS (SELECT 1 FROM fencecron_guard_rejections AS r
                                                 WHERE r.resource = incoming.resource AND r.token = incoming.token)",
                            "UPDATE fencecron_guard_rejections
                                SET node = COALESCE(node, ?), job = COALESCE(job, ?), owner_id = COALESCE(owner_id, ?)
                              WHERE resource = ? AND token = ?",
                            format!("SELECT {REJECTION_COLUMNS} FROM fencecron_guard_rejections WHERE resource = ? AND token = ? ORDER BY id LIMIT 1")
                        )
                    }
                    Pool::Lite(p) => record!(
                        p,
                        "INSERT INTO fencecron_guard_rejections
                           (at_ms, resource, token, accepted_token, source, db_user, node, job, owner_id, operation_id)
                         SELECT CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER), ?1, ?2, ?3, 'job',
                                NULL, ?4, ?5, ?6, ?7
                          WHERE NOT EXISTS (SELECT 1 FROM fencecron_guard_rejections
                                             WHERE resource = ?1 AND token = ?2)",
                        "UPDATE fencecron_guard_rejections
                            SET node = COALESCE(node, ?1), job = COALESCE(job, ?2), owner_id = COALESCE(owner_id, ?3)
                          WHERE resource = ?4 AND token = ?5",
                        format!("SELECT {REJECTION_COLUMNS} FROM fencecron_guard_rejections WHERE resource = ?1 AND token = ?2 ORDER BY id LIMIT 1")
                    ),
                })
            }
            .await;
            match r {
                Ok((n, Some(row))) => Ok(Recorded::Rejection {
                    record: Box::new(rejection(row)),
                    new: n > 0,
                }),
                Ok((_, None)) => Err(StoreError::Corrupt {
                    url: self.url.to_string(),
                    detail: "the rejection row just written is not there".to_string(),
                }),
                Err(e) => Err(unavailable(&self.url, e)),
            }
        })
        .await
    }

    /// The rejections the guard keeps, at or after `since_ms` (ms since the
    /// Unix epoch, by the guard database's clock), oldest first, in the
    /// shape `fencecron stale` lists.
    pub async fn rejections(&self, since_ms: i64) -> Result<Vec<StaleRecord>, StoreError> {
        timed(&self.url, CALL_LIMIT, async {
            let r: Result<Vec<StaleRecord>, sqlx::Error> = async {
                self.connected().await?;
                macro_rules! list {
                    ($pool:expr, $sql:expr) => {{
                        let rows = sqlx::query(&$sql).bind(since_ms).fetch_all($pool).await?;
                        let mut out = Vec::with_capacity(rows.len());
                        for row in rows {
                            out.push(rejection(RejectionRow::read(&row)?));
                        }
                        out
                    }};
                }
                Ok(match &self.pool {
                    Pool::Pg(p) => list!(
                        p,
                        format!("SELECT {REJECTION_COLUMNS} FROM fencecron_guard_rejections WHERE at_ms >= $1 ORDER BY at_ms, id")
                    ),
                    Pool::My(p) => list!(
                        p,
                        format!("SELECT {REJECTION_COLUMNS} FROM fencecron_guard_rejections WHERE at_ms >= ? ORDER BY at_ms, id")
                    ),
                    Pool::Lite(p) => list!(
                        p,
                        format!("SELECT {REJECTION_COLUMNS} FROM fencecron_guard_rejections WHERE at_ms >= ? ORDER BY at_ms, id")
                    ),
                })
            }
            .await;
            r.map_err(|e| unavailable(&self.url, e))
        })
        .await
    }

    /// Closes the pool.
    pub async fn close(&self) {
        match &self.pool {
            Pool::Pg(p) => p.close().await,
            Pool::My(p) => p.close().await,
            Pool::Lite(p) => p.close().await,
        }
    }
}

/// The node a rejection names when neither the job nor the database said
/// which host it came from.
const UNKNOWN_NODE: &str = "-";

/// A row of `fencecron_guard_rejections`.
struct RejectionRow {
    at_ms: i64,
    resource: String,
    token: Token,
    accepted_token: Token,
    source: String,
    db_user: Option<String>,
    node: Option<String>,
    job: Option<String>,
    owner_id: Option<String>,
    operation_id: String,
}

impl RejectionRow {
    /// A row of the [`REJECTION_COLUMNS`], by position.
    fn read<'r, R>(row: &'r R) -> Result<RejectionRow, sqlx::Error>
    where
        R: Row,
        usize: sqlx::ColumnIndex<R>,
        i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        Ok(RejectionRow {
            at_ms: row.try_get(0)?,
            resource: row.try_get(1)?,
            token: row.try_get(2)?,
            accepted_token: row.try_get(3)?,
            source: row.try_get(4)?,
            db_user: row.try_get(5)?,
            node: row.try_get(6)?,
            job: row.try_get(7)?,
            owner_id: row.try_get(8)?,
            operation_id: row.try_get(9)?,
        })
    }
}

/// A rejection row as a stale-owner record: `write_rejected`, reason
/// `stale`, stage `guard` (refused and recorded by the database's
/// procedure) or `guard_reported` (refused by the guard, recorded by the
/// job's `fencecron guard record`); the node is the job's, else the
/// database user and client host MySQL saw.
fn rejection(r: RejectionRow) -> StaleRecord {
    StaleRecord {
        at: StoreTime(r.at_ms),
        kind: StaleKind::WriteRejected,
        reason: RejectReason::Stale.into(),
        resource: r.resource,
        key: None,
        // The job's own database, which the job (or anyone with access)
        // writes: a value that is not an owner id is not shown as one.
        owner_id: r.owner_id.and_then(|o| o.parse().ok()),
        token: r.token,
        accepted_token: Some(r.accepted_token),
        node: r
            .node
            .or(r.db_user)
            .unwrap_or_else(|| UNKNOWN_NODE.to_string()),
        job: r.job,
        stage: if r.source == "guard" {
            Stage::Guard
        } else {
            Stage::GuardReported
        },
        operation_id: r.operation_id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_names_its_node_and_stage() {
        let row = |source: &str, node: Option<&str>, user: Option<&str>| RejectionRow {
            at_ms: 1,
            resource: "r".into(),
            token: Token::new(4),
            accepted_token: Token::new(5),
            source: source.into(),
            db_user: user.map(str::to_string),
            node: node.map(str::to_string),
            job: None,
            owner_id: None,
            operation_id: "op".into(),
        };
        let rec = rejection(row("guard", None, Some("app@10.0.0.7")));
        assert_eq!(
            (rec.stage.as_str(), rec.node.as_str()),
            ("guard", "app@10.0.0.7")
        );
        assert_eq!(rec.accepted_token, Some(Token::new(5)));
        let rec = rejection(row("job", Some("host-a"), Some("app")));
        assert_eq!(
            (rec.stage.as_str(), rec.node.as_str()),
            ("guard_reported", "host-a")
        );
        assert_eq!(rejection(row("job", None, None)).node, "-");
    }
}

//! SQLite: the embedded default, for several instances on one host.
//!
//! Clock: SQLite runs inside each process, so "the store's clock" is the
//! host's kernel clock. We read it with `clock_gettime` through rustix (the
//! vDSO or the system call) rather than through libc, so that a per-process clock override
//! (libfaketime, some container time namespaces set up by LD_PRELOAD) cannot
//! make one instance disagree with another about expiry. The time is read
//! *after* the write lock is taken (`BEGIN IMMEDIATE`), so a call that waited
//! seconds on `busy_timeout` still decides with the current time.
//!
//! Writes take the write lock up front with `BEGIN IMMEDIATE` and hold it
//! for a couple of statements; the database runs in WAL mode with
//! `synchronous = FULL`, because losing a committed fence increment on power
//! loss could hand out the same token twice.
//!
//! A connection goes back to the pool only outside any transaction: an
//! error inside a write transaction (a COMMIT refused with `SQLITE_FULL`,
//! a call cut off by its time limit) leaves the rollback to sqlx, which
//! cannot always do it — SQLite may already have rolled the transaction
//! back itself, and then sqlx's ROLLBACK fails and its transaction depth
//! stays at 1, so every later `BEGIN IMMEDIATE` on that connection fails
//! ("non-zero transaction depth"). The pool's `after_release` check
//! ([`left_clean`]) discards any connection that sqlx or SQLite still
//! count as inside a transaction; the next call opens a fresh one.

use std::os::unix::fs::OpenOptionsExt;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use nix::fcntl::{Flock, FlockArg};
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Row, Sqlite, Transaction};

use super::bench::RawDialect;
use super::sql::{Db, Dialect, Sql, SqlDb, SqlStore, Written};
use super::*;

/// How long one SQLite call may wait for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The host kernel's real-time clock in milliseconds, bypassing libc
/// (rustix reads it through the vDSO or the system call).
pub(crate) fn kernel_now_ms() -> i64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Realtime);
    ts.tv_sec * 1000 + ts.tv_nsec / 1_000_000
}

/// The first token of the stored epoch, `(epoch << 32) + 1` (SQLite has no
/// timeline: the epoch is only the stored one).
macro_rules! epoch_floor {
    () => {
        "((COALESCE((SELECT e.epoch FROM fencecron_epoch e WHERE e.id = 1), 0) << 32) + 1)"
    };
}

/// The adoption condition on the row as it was: this owner won this
/// occurrence and has not released it (never true for ad-hoc leases, `?6`
/// NULL). See the PostgreSQL store for why a retry adopts its own win.
macro_rules! adopt {
    () => {
        "(owner_id = ?2 AND last_occurrence_ms = ?6 AND NOT released)"
    };
}

/// The rule "this occurrence is takeable", the one text of it on SQLite
/// (the acquire's `UPDATE`, the claim's read): the lease expired at `$now`
/// (the kernel's clock, bound) and the instant `$occ` (NULL: an ad-hoc
/// lease) newer than the last one taken (or `$adopt`: the acquire's
/// adoption of its own win, `0` for a claim), the instant due and its
/// successor `$next` not. Whether the job is paused is [`PAUSED`], read
/// first in the same write transaction by both.
macro_rules! takeable {
    ($now:expr, $occ:expr, $next:expr, $adopt:expr) => {
        concat!(
            "((expires_at_ms <= ",
            $now,
            " AND (",
            $occ,
            " IS NULL OR last_occurrence_ms IS NULL OR last_occurrence_ms < ",
            $occ,
            ")) OR ",
            $adopt,
            ") AND (",
            $occ,
            " IS NULL OR ",
            $occ,
            " <= ",
            $now,
            ") AND (",
            $next,
            " IS NULL OR ",
            $next,
            " > ",
            $now,
            ")"
        )
    };
}

/// The winning acquire: `prev_*` copy the vanished owner when the previous
/// generation was not released (every `SET` expression sees the old row),
/// and the fence moves to at least the epoch's first token. The epoch
/// subquery runs only for a row that matched: a losing acquire reads and
/// writes nothing more than before. An adopted win keeps its token and
/// `prev_*`, and its expiry becomes at least now + lease. Refused once the
/// job's next instant (`?7`) is due.
const ACQUIRE: &str = concat!(
    "UPDATE fencecron_leases
    SET prev_owner_id = CASE WHEN ",
    adopt!(),
    " THEN prev_owner_id WHEN released THEN NULL ELSE owner_id END,
        prev_node = CASE WHEN ",
    adopt!(),
    " THEN prev_node WHEN released THEN NULL ELSE node END,
        prev_fence = CASE WHEN ",
    adopt!(),
    " THEN prev_fence WHEN released THEN NULL ELSE fence END,
        prev_expires_at_ms = CASE WHEN ",
    adopt!(),
    " THEN prev_expires_at_ms WHEN released THEN NULL ELSE expires_at_ms END,
        released = 0,
        fence = CASE WHEN ",
    adopt!(),
    " THEN fence ELSE max(fence + 1, ",
    epoch_floor!(),
    ") END, owner_id = ?2, node = ?3,
        acquired_at_ms = CASE WHEN ",
    adopt!(),
    " THEN acquired_at_ms ELSE ?4 END,
        expires_at_ms = CASE WHEN ",
    adopt!(),
    " THEN max(expires_at_ms, ?4 + ?5) ELSE ?4 + ?5 END,
        last_occurrence_ms = COALESCE(?6, last_occurrence_ms)
  WHERE resource = ?1 AND ",
    takeable!("?4", "?6", "?7", adopt!()),
    "
RETURNING fence, expires_at_ms, prev_owner_id, prev_node, prev_fence, prev_expires_at_ms"
);

/// A scheduled acquire's pause check (`?1` the job, `?2` now), in the
/// acquire's transaction.
const PAUSED: &str = "SELECT note, until_ms FROM fencecron_pauses
  WHERE job = ?1 AND (until_ms IS NULL OR until_ms > ?2)";

/// The one acquire per paused instant that notes the skip (and logs it).
const NOTE_PAUSED_SKIP: &str = "UPDATE fencecron_pauses SET last_skipped_ms = ?2
  WHERE job = ?1 AND (last_skipped_ms IS NULL OR last_skipped_ms < ?2)";

/// The run a winning acquire records, in its transaction; a retry that
/// adopts its own win finds the row already there.
const INSERT_RUN: &str = "INSERT INTO fencecron_runs
   (job, resource, scheduled_at_ms, started_by, node, owner_id, token, started_at_ms)
 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
 ON CONFLICT (resource, token) DO NOTHING";

/// The first acquisition of a resource.
const CREATE: &str = concat!(
    "INSERT INTO fencecron_leases
       (resource, fence, owner_id, node, acquired_at_ms, expires_at_ms, last_occurrence_ms,
        released)
     VALUES (?1, ",
    epoch_floor!(),
    ", ?2, ?3, ?4, ?4 + ?5, ?6, 0)
     RETURNING fence, expires_at_ms, prev_owner_id, prev_node, prev_fence, prev_expires_at_ms"
);

/// The lease row as a losing acquire classifies it (`?1` the resource),
/// and whether a claim could take it ([`takeable!`], `?2` now, `?3` the
/// instant, `?4` the next one).
const LOSS_ROW: &str = concat!(
    "SELECT fence, owner_id, node, expires_at_ms, last_occurrence_ms, (",
    takeable!("?2", "?3", "?4", "0"),
    ") AS takeable
   FROM fencecron_leases WHERE resource = ?1"
);

/// `fencecron epoch advance`: max(stored, highest fence >> 32) + 1.
const ADVANCE_EPOCH: &str = "INSERT INTO fencecron_epoch (id, epoch)
     SELECT 1, (COALESCE(max(fence), 0) >> 32) + 1 FROM fencecron_leases WHERE 1
     ON CONFLICT (id) DO UPDATE SET epoch = max(epoch, excluded.epoch - 1) + 1";

/// `fencecron epoch`: the stored epoch and the highest fence.
const EPOCH: &str =
    "SELECT COALESCE((SELECT epoch FROM fencecron_epoch WHERE id = 1), 0) AS stored,
            (SELECT max(fence) FROM fencecron_leases) AS highest";

const RENEW: &str = "UPDATE fencecron_leases SET expires_at_ms = ?4 + ?5
  WHERE resource = ?1 AND owner_id = ?2 AND fence = ?3 AND expires_at_ms > ?4
RETURNING expires_at_ms";

const RELEASE: &str =
    "UPDATE fencecron_leases SET expires_at_ms = MIN(expires_at_ms, ?4), released = 1
  WHERE resource = ?1 AND owner_id = ?2 AND fence = ?3";

/// `give_back`: a release that also makes the occurrence `?5` takeable again
/// when it is still the last one taken (`?5 - 1` keeps older instants
/// refused). Without a token (`?3` NULL): this owner's unreleased win of
/// exactly this occurrence.
const GIVE_BACK: &str =
    "UPDATE fencecron_leases SET expires_at_ms = MIN(expires_at_ms, ?4), released = 1,
        last_occurrence_ms = CASE WHEN last_occurrence_ms = ?5 THEN ?5 - 1
                                  ELSE last_occurrence_ms END
  WHERE resource = ?1 AND owner_id = ?2
    AND (fence = ?3 OR (?3 IS NULL AND NOT released AND last_occurrence_ms = ?5))";

/// The conditional write; the `WHERE` before `ON CONFLICT` (which SQLite's
/// grammar needs for INSERT … SELECT … ON CONFLICT) binds the token to its
/// resource and owner: it must be the fence, issued to this owner id.
const PUT: &str = "INSERT INTO fencecron_values AS v
   (resource, key, value, token, owner_id, operation_id, written_at_ms)
 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
   FROM fencecron_leases l WHERE l.resource = ?1 AND l.fence = ?4 AND l.owner_id = ?5
 ON CONFLICT (resource, key) DO UPDATE
    SET value = excluded.value, token = excluded.token, owner_id = excluded.owner_id,
        operation_id = excluded.operation_id, written_at_ms = excluded.written_at_ms
  WHERE v.token < excluded.token OR (v.token = excluded.token AND NOT ?8)";

/// The fencing proxy's read: the highest token admitted for the resource
/// and the resource's fence.
const ADMIT_STATE: &str =
    "SELECT (SELECT highest FROM fencecron_proxy_fences WHERE resource = ?1) AS highest,
            (SELECT fence FROM fencecron_leases WHERE resource = ?2) AS issued";

/// The fencing proxy's raise: only a token the lease row issued, only
/// upwards.
const ADMIT_RAISE: &str = "INSERT INTO fencecron_proxy_fences AS f (resource, highest)
 SELECT ?1, ?2 FROM fencecron_leases l WHERE l.resource = ?3 AND l.fence >= ?4 AND ?5 > 0
 ON CONFLICT (resource) DO UPDATE SET highest = excluded.highest
  WHERE f.highest < excluded.highest";

const GET: &str = "SELECT value, token, owner_id, written_at_ms FROM fencecron_values
  WHERE resource = ?1 AND key = ?2";

const LEASE_ROW: &str =
    "SELECT owner_id, fence, expires_at_ms FROM fencecron_leases WHERE resource = ?1";

const LIST: &str = "SELECT resource, owner_id, node, fence, expires_at_ms, last_occurrence_ms
                      FROM fencecron_leases
                     WHERE forgotten_at_ms IS NULL OR acquired_at_ms >= forgotten_at_ms
                     ORDER BY resource";

/// After a refused write, within the same transaction: what beat it.
const PUT_STATE: &str =
    "SELECT (SELECT token FROM fencecron_values WHERE resource = ?1 AND key = ?2) AS accepted,
            (SELECT fence FROM fencecron_leases WHERE resource = ?1) AS issued,
            (SELECT owner_id FROM fencecron_leases WHERE resource = ?1) AS issued_to";

const STALE: &str = "SELECT at_ms, kind, reason, resource, key, owner_id, token, accepted_token,
                            node, job, stage, operation_id
                       FROM fencecron_stale WHERE at_ms >= ?1 ORDER BY at_ms, id";

/// The SQLite dialect: where the database file is, for the checks and
/// messages that name it.
pub(super) struct Lite {
    path: std::path::PathBuf,
    /// `sqlite::memory:` and `?mode=memory`: no file to create.
    in_memory: bool,
}

/// The SQLite store.
pub(super) type SqliteStore = SqlStore<Lite>;

impl SqliteStore {
    /// Prepares a pool on the database file, creating it on first use.
    pub fn open(url: StoreUrl, opts: &OpenOptions) -> Result<Self, StoreError> {
        let connect = SqliteConnectOptions::from_str(url.expose())
            .map_err(|e| unavailable(&url, e))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(false);
        let path = connect.get_filename().to_path_buf();
        let in_memory = connect
            .to_url_lossy()
            .query_pairs()
            .any(|(k, v)| k == "mode" && v == "memory");
        if !in_memory {
            check_protected(&path)?;
        }
        // Never pool a connection left inside a transaction (see the
        // module documentation): close it instead.
        let db = Db::connect_lazy(url, opts, connect, |pool| {
            pool.after_release(|conn, _| Box::pin(left_clean(conn)))
        });
        Ok(SqlStore::new(db, Lite { path, in_memory }))
    }
}

async fn insert_stale(
    tx: &mut Transaction<'static, Sqlite>,
    rec: &NewStaleRecord<'_>,
    now: i64,
) -> Result<(), sqlx::Error> {
    let query = sqlx::query(
        "INSERT INTO fencecron_stale
           (at_ms, kind, reason, resource, key, owner_id, token, accepted_token, node, job, stage, operation_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )
    .bind(now);
    Sqlite::bind_stale(query, rec)
        .execute(&mut **tx)
        .await
        .map(|_| ())
}

#[async_trait]
impl Dialect for Lite {
    type DB = Sqlite;
    const BACKEND: Backend = Backend::Sqlite;
    const GET: &'static str = GET;
    const STALE: &'static str = STALE;
    const LIST: &'static str = LIST;
    const EPOCH: &'static str = EPOCH;
    const ADVANCE_EPOCH: &'static str = ADVANCE_EPOCH;
    const ADMIT_STATE: &'static str = ADMIT_STATE;
    const ADMIT_RAISE: &'static str = ADMIT_RAISE;

    /// Takes the database's write lock up front (`BEGIN IMMEDIATE`).
    async fn begin(&self, db: &Db<Sqlite>) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        db.pool.begin_with("BEGIN IMMEDIATE").await
    }

    fn error(&self, url: &StoreUrl, e: sqlx::Error) -> StoreError {
        if is_disk_full(&e) {
            return StoreError::DiskFull {
                path: self.path.display().to_string(),
                source: e,
            };
        }
        unavailable(url, e)
    }

    async fn migrate(&self, db: &Db<Sqlite>) -> Result<(), StoreError> {
        // sqlx does not lock SQLite migrations across processes; an exclusive
        // lock on a sidecar file makes concurrent starts apply them once.
        let lock_path = {
            let mut p = self.path.clone().into_os_string();
            p.push(".migrate-lock");
            std::path::PathBuf::from(p)
        };
        let url = db.url.clone();
        let db_path = (!self.in_memory).then(|| self.path.clone());
        let lock = tokio::task::spawn_blocking(move || {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .open(&lock_path)
                .map_err(|e| unavailable(&url, sqlx::Error::Io(e)))?;
            // The lock file as opened, not as named: another user's file
            // could have been put there between a check and the open.
            let meta = file
                .metadata()
                .map_err(|e| unavailable(&url, sqlx::Error::Io(e)))?;
            refuse_unprotected(&lock_path, &meta, "migration lock file")?;
            if let Some(db) = &db_path {
                create_private(db);
                // Created just now by this user, or there before: either
                // way it must be this user's alone.
                check_protected(db)?;
            }
            Flock::lock(file, FlockArg::LockExclusive)
                .map_err(|(_, errno)| unavailable(&url, sqlx::Error::Io(errno.into())))
        })
        .await
        .map_err(|e| StoreError::Corrupt {
            url: db.url.to_string(),
            detail: format!("migration lock task failed: {e}"),
        })??;
        let result = timed(&db.url, db.call_timeout * 3, async {
            let fail = |source| migrate_error(Backend::Sqlite, &db.url, source);
            let mut conn = db
                .pool
                .acquire()
                .await
                .map_err(|e| unavailable(&db.url, e))?;
            super::migrator::run::<Sqlite>(
                &mut conn,
                Backend::Sqlite,
                &sqlx::migrate!("migrations/sqlite"),
            )
            .await
            .map_err(fail)
        })
        .await;
        drop(lock);
        result
    }

    async fn acquire(&self, db: &Db<Sqlite>, req: &AcquireRequest<'_>) -> Sql<AcquireOutcome> {
        let owner = req.owner_id;
        let owner_s = owner.to_string();
        let lease = millis(req.lease);
        let occ = req.occurrence.map(|o| o.0);
        let next = req.next_occurrence.map(|o| o.0);
        let (job, started_by, scheduled_at) = run_binds(req);
        let mut tx = self.begin(db).await?;
        let now = kernel_now_ms();
        // Scheduled runs and their retries honour a pause; manual ones not.
        if let Some(job) = job.filter(|_| occ.is_some() || started_by == StartedBy::Retry.as_str())
        {
            let paused = sqlx::query(PAUSED)
                .bind(job)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(p) = paused {
                let due = occ.is_some_and(|o| o <= now) && next.is_none_or(|n| n > now);
                let first = due
                    && sqlx::query(NOTE_PAUSED_SKIP)
                        .bind(job)
                        .bind(occ)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected()
                        == 1;
                let pause = PauseSeen {
                    note: p.try_get("note")?,
                    until: p.try_get("until_ms")?,
                    first,
                };
                tx.commit().await?;
                return Ok(classify_paused(pause, req, now));
            }
        }
        let won = sqlx::query(ACQUIRE)
            .bind(req.resource.as_str())
            .bind(&owner_s)
            .bind(req.node)
            .bind(now)
            .bind(lease)
            .bind(occ)
            .bind(next)
            .fetch_optional(&mut *tx)
            .await?;
        let row = match won {
            Some(row) => row,
            None => {
                if let Some((loss, _)) = loss_row(&mut tx, req.resource, now, occ, next).await? {
                    tx.rollback().await?;
                    return Ok(classify_loss(loss, req));
                }
                if occ.is_some_and(|o| o > now) {
                    tx.rollback().await?;
                    return Ok(AcquireOutcome::NotYetDue {
                        store_now: StoreTime(now),
                    });
                }
                if next.is_some_and(|n| n <= now) {
                    tx.rollback().await?;
                    return Ok(AcquireOutcome::Superseded {
                        store_now: StoreTime(now),
                    });
                }
                sqlx::query(CREATE)
                    .bind(req.resource.as_str())
                    .bind(&owner_s)
                    .bind(req.node)
                    .bind(now)
                    .bind(lease)
                    .bind(occ)
                    .fetch_one(&mut *tx)
                    .await?
            }
        };
        let token: i64 = row.try_get("fence")?;
        let expires_at: i64 = row.try_get("expires_at_ms")?;
        let taken_over = rows::takeover(&row, rows::PREV)?;
        if let Some(job) = job {
            sqlx::query(INSERT_RUN)
                .bind(job)
                .bind(req.resource.as_str())
                .bind(scheduled_at)
                .bind(started_by)
                .bind(req.node)
                .bind(&owner_s)
                .bind(token)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(AcquireOutcome::Acquired(Lease {
            resource: req.resource.to_string(),
            owner_id: owner,
            token,
            expires_at: StoreTime(expires_at),
            taken_over,
        }))
    }

    const CLAIMS: bool = true;

    /// One write transaction for the instant's items, in order: each
    /// within the limit goes through the single acquire's `UPDATE` (and
    /// its run row), each past it is only read. One host, one writer at a
    /// time: nothing is locked by another claimer, so nothing is skipped
    /// for that, and there is no share (the daemons of one host share one
    /// writer; `fencecron_nodes` is only their registry). What
    /// it saves is a transaction, and so a commit, per occurrence.
    async fn claim(&self, db: &Db<Sqlite>, req: &ClaimRequest<'_>) -> Sql<Option<ClaimOutcome>> {
        let mut tx = self.begin(db).await?;
        let now = kernel_now_ms();
        let mut won = 0;
        let mut out = Vec::with_capacity(req.items.len());
        for item in req.items {
            let acquire = item.as_acquire(req.node);
            let (occ, next) = (item.occurrence.0, item.next_occurrence.map(|n| n.0));
            // No row yet, or paused: the single acquire decides.
            let Some((loss, takeable)) =
                loss_row(&mut tx, item.resource, now, Some(occ), next).await?
            else {
                out.push(Claimed::Ask);
                continue;
            };
            let paused = sqlx::query(PAUSED)
                .bind(item.job)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
            if paused.is_some() {
                out.push(Claimed::Ask);
                continue;
            }
            if !takeable {
                out.push(Claimed::from_loss(classify_loss(loss, &acquire)));
                continue;
            }
            if won >= req.limit {
                out.push(Claimed::Skipped);
                continue;
            }
            let owner = item.owner_id.to_string();
            let row = sqlx::query(ACQUIRE)
                .bind(item.resource.as_str())
                .bind(&owner)
                .bind(req.node)
                .bind(now)
                .bind(millis(item.lease))
                .bind(occ)
                .bind(next)
                .fetch_one(&mut *tx)
                .await?;
            let token: i64 = row.try_get("fence")?;
            sqlx::query(INSERT_RUN)
                .bind(item.job)
                .bind(item.resource.as_str())
                .bind(occ)
                .bind(StartedBy::Schedule.as_str())
                .bind(req.node)
                .bind(&owner)
                .bind(token)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            won += 1;
            out.push(Claimed::Won(Lease {
                resource: item.resource.to_string(),
                owner_id: item.owner_id,
                token,
                expires_at: StoreTime(row.try_get("expires_at_ms")?),
                taken_over: rows::takeover(&row, rows::PREV)?,
            }));
        }
        tx.commit().await?;
        Ok(Some(ClaimOutcome {
            items: out,
            limit: req.limit,
        }))
    }

    async fn renew(
        &self,
        db: &Db<Sqlite>,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
        lease: Duration,
    ) -> Sql<RenewOutcome> {
        let mut tx = self.begin(db).await?;
        let now = kernel_now_ms();
        let renewed: Option<i64> = sqlx::query_scalar(RENEW)
            .bind(resource.as_str())
            .bind(owner_id.as_str())
            .bind(token)
            .bind(now)
            .bind(millis(lease))
            .fetch_optional(&mut *tx)
            .await?;
        let outcome = match renewed {
            Some(at) => RenewOutcome::Renewed {
                expires_at: StoreTime(at),
            },
            None => RenewOutcome::Refused(classify_refusal(
                Sqlite::lease_row(&mut *tx, LEASE_ROW, resource).await?,
                owner_id,
                token,
            )),
        };
        tx.commit().await?;
        Ok(outcome)
    }

    async fn release(
        &self,
        db: &Db<Sqlite>,
        resource: &Name,
        owner_id: OwnerId,
        token: Option<Token>,
        occurrence: Option<StoreTime>,
    ) -> Sql<ReleaseOutcome> {
        let mut tx = self.begin(db).await?;
        let now = kernel_now_ms();
        let query = sqlx::query(if occurrence.is_some() {
            GIVE_BACK
        } else {
            RELEASE
        })
        .bind(resource.as_str())
        .bind(owner_id.as_str())
        .bind(token)
        .bind(now);
        let query = match occurrence {
            Some(occ) => query.bind(occ.0),
            None => query,
        };
        let released = query.execute(&mut *tx).await?.rows_affected();
        let outcome = if released == 1 {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::Refused(classify_refusal(
                Sqlite::lease_row(&mut *tx, LEASE_ROW, resource).await?,
                owner_id,
                token.unwrap_or(0),
            ))
        };
        tx.commit().await?;
        Ok(outcome)
    }

    /// By the kernel's clock, read after the rows.
    async fn list(&self, db: &Db<Sqlite>) -> Sql<Vec<LeaseInfo>> {
        let found = sqlx::query(LIST).fetch_all(&db.pool).await?;
        let now = kernel_now_ms();
        Ok(found
            .iter()
            .map(|r| rows::lease_info(r, now))
            .collect::<Result<Vec<_>, sqlx::Error>>()?)
    }

    /// The kernel's clock, read under the write lock.
    fn tx_now(&self) -> Option<i64> {
        Some(kernel_now_ms())
    }

    async fn put_write(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        req: &PutRequest<'_>,
        op: &str,
        now: Option<i64>,
    ) -> Sql<Written> {
        let now = now.unwrap_or_else(kernel_now_ms);
        let written = sqlx::query(PUT)
            .bind(req.resource.as_str())
            .bind(req.key.as_str())
            .bind(req.value)
            .bind(req.token)
            .bind(req.owner_id.as_str())
            .bind(op)
            .bind(now)
            .bind(req.once)
            .execute(&mut **tx)
            .await?
            .rows_affected();
        Ok(if written == 1 {
            Written::At(now)
        } else {
            Written::Refused(None)
        })
    }

    async fn put_state(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        req: &PutRequest<'_>,
    ) -> Sql<rows::PutState> {
        Ok(Sqlite::put_state(&mut **tx, PUT_STATE, req).await?)
    }

    async fn insert_stale(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        rec: &NewStaleRecord<'_>,
        now: Option<i64>,
    ) -> Sql<i64> {
        let now = now.unwrap_or_else(kernel_now_ms);
        insert_stale(tx, rec, now).await?;
        Ok(now)
    }

    async fn now(&self, _db: &Db<Sqlite>) -> Sql<StoreTime> {
        Ok(StoreTime(kernel_now_ms()))
    }
}

#[async_trait]
impl RawDialect for Lite {
    async fn raw_write(
        &self,
        db: &Db<Sqlite>,
        op: RawOp,
        r: &str,
        owner_id: &str,
        token: Token,
    ) -> Sql<Option<Token>> {
        let lease = millis(MIN_LEASE);
        // Every write is the statement the store sends, inside the same
        // BEGIN IMMEDIATE transaction.
        let mut tx = self.begin(db).await?;
        let now = kernel_now_ms();
        let query = match op {
            RawOp::AcquireFree | RawOp::AcquireHeld => sqlx::query(ACQUIRE)
                .bind(r)
                .bind(owner_id)
                .bind("bench")
                .bind(now)
                .bind(lease)
                .bind(None::<i64>)
                .bind(None::<i64>),
            RawOp::Renew => sqlx::query(RENEW)
                .bind(r)
                .bind(owner_id)
                .bind(token)
                .bind(now)
                .bind(lease),
            RawOp::Release => sqlx::query(RELEASE)
                .bind(r)
                .bind(owner_id)
                .bind(token)
                .bind(now),
            RawOp::Put | RawOp::Ping | RawOp::Get => sqlx::query(PUT)
                .bind(r)
                .bind("bench")
                .bind(&b"bench"[..])
                .bind(token)
                .bind(owner_id)
                .bind(owner_id)
                .bind(now)
                .bind(false),
        };
        let row = query.fetch_optional(&mut *tx).await?;
        tx.commit().await?;
        Ok(match op {
            RawOp::AcquireFree | RawOp::AcquireHeld => row.and_then(|r| r.try_get("fence").ok()),
            _ => None,
        })
    }

    async fn purge(&self, db: &Db<Sqlite>, prefix: &str) -> Sql<u64> {
        // Not LIKE: SQLite's LIKE ignores ASCII case, so `Bench-` would also
        // purge `bench-…`. `substr` counts characters, as `length` does.
        let mut tx = self.begin(db).await?;
        let mut n = 0;
        for sql in [
            "DELETE FROM fencecron_values WHERE substr(resource, 1, length(?1)) = ?1",
            "DELETE FROM fencecron_stale WHERE substr(resource, 1, length(?1)) = ?1",
            "DELETE FROM fencecron_leases WHERE substr(resource, 1, length(?1)) = ?1",
        ] {
            n += sqlx::query(sql)
                .bind(prefix)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(n)
    }
}

/// Whether a connection coming back to the pool may be used again: it is
/// outside any transaction both by sqlx's count and by SQLite's own
/// (`sqlite3_get_autocommit`). Locking the handle first lets the worker run
/// what is queued before it, such as the ROLLBACK of a dropped transaction,
/// so the check sees the connection as the next caller would.
async fn left_clean(conn: &mut SqliteConnection) -> Result<bool, sqlx::Error> {
    let autocommit = {
        let mut handle = conn.lock_handle().await?;
        // SAFETY: the handle is locked away from the worker thread for the
        // duration of this call, and sqlite3_get_autocommit only reads the
        // connection's state.
        unsafe { libsqlite3_sys::sqlite3_get_autocommit(handle.as_raw_handle().as_ptr()) != 0 }
    };
    let in_tx = conn.is_in_transaction();
    if autocommit && !in_tx {
        return Ok(true);
    }
    crate::events::store_connection_discarded(autocommit, in_tx);
    Ok(false)
}

/// Whether SQLite could not write because the disk (or the filesystem's
/// quota) is full: `SQLITE_FULL` (13), or `ENOSPC` from a file operation.
fn is_disk_full(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            db.code().as_deref() == Some("13") || db.message().contains("disk is full")
        }
        sqlx::Error::Io(io) => io.raw_os_error() == Some(libc::ENOSPC),
        _ => false,
    }
}

/// Refuses a database that another user could rewrite. Whoever can write
/// the database file, its `-wal` (SQLite replays it on open) or `-shm`, or
/// plant those files in its directory, can set a lease's fence back and get
/// a token issued twice, so:
///
/// * the database, `-wal`, `-shm`, `-journal` and `.migrate-lock` files, as
///   far as they exist, must be owned by this user and writable by no one
///   else (no group or other write bit);
/// * their directory must be owned by this user or root and writable by no
///   one else: in a group- or world-writable directory (even a sticky one
///   such as `/tmp`) another user can create the `-wal` or `-shm` file
///   whenever it does not exist, between two of our connections.
///
/// The path is resolved first (symlinks), because SQLite puts the `-wal`
/// and `-shm` files beside the file it opens.
pub(super) fn check_protected(db: &std::path::Path) -> Result<(), StoreError> {
    let db = std::fs::canonicalize(db).unwrap_or_else(|_| db.to_path_buf());
    let dir = match db.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    if let Ok(meta) = std::fs::metadata(&dir) {
        use std::os::unix::fs::MetadataExt;
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me && meta.uid() != 0 {
            return Err(StoreError::Unprotected {
                detail: format!(
                    "the directory {} of the SQLite database is owned by {}, not by {} (the user this fencecron runs as) or root, so that user could replace the database and rewind its fencing tokens; keep the database in a directory of its own, such as the service's StateDirectory",
                    dir.display(),
                    user_name(meta.uid()),
                    user_name(me)
                ),
            });
        }
        if meta.mode() & 0o022 != 0 {
            return Err(StoreError::Unprotected {
                detail: format!(
                    "the directory {} of the SQLite database is writable by other users (mode {:04o}), who could plant its -wal or -shm file and rewind its fencing tokens; keep the database in a directory only this user can write (not /tmp), such as the service's StateDirectory",
                    dir.display(),
                    meta.mode() & 0o7777
                ),
            });
        }
    }
    let name = db.as_os_str().to_os_string();
    for (suffix, what) in [
        ("", "database file"),
        ("-wal", "write-ahead log"),
        ("-shm", "shared-memory file"),
        ("-journal", "journal"),
        (".migrate-lock", "migration lock file"),
    ] {
        let mut p = name.clone();
        p.push(suffix);
        let p = std::path::PathBuf::from(p);
        if let Ok(meta) = std::fs::metadata(&p) {
            refuse_unprotected(&p, &meta, what)?;
        }
    }
    Ok(())
}

/// The check of one existing file for [`check_protected`].
fn refuse_unprotected(
    path: &std::path::Path,
    meta: &std::fs::Metadata,
    what: &str,
) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    let me = user_name(nix::unistd::geteuid().as_raw());
    // A foreign lock file cannot change a fence, but its owner could hold
    // it and keep every fencecron here from starting.
    let harm = if what.contains("lock") {
        "hold it and keep fencecron from starting"
    } else {
        "rewrite its leases and rewind fencing tokens"
    };
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        let owner = user_name(meta.uid());
        return Err(StoreError::Unprotected {
            detail: format!(
                "the SQLite {what} {} is owned by {owner}, not by {me}, the user this fencecron runs as, so {owner} could {harm}; if it is your store, run fencecron as {owner} (e.g. sudo -u {owner} fencecron …; all instances on a host must run as one user), else move it away and let fencecron create its own",
                path.display(),
            ),
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(StoreError::Unprotected {
            detail: format!(
                "the SQLite {what} {} is writable by other users (mode {:04o}), who could {harm}; run chmod go-w on it (fencecron creates it 0600)",
                path.display(),
                meta.mode() & 0o7777
            ),
        });
    }
    Ok(())
}

/// A user's name, or `uid N` for a uid without one.
fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => format!("uid {uid}"),
    }
}

/// Creates the database file, if it does not exist yet, readable and
/// writable by this user only (0600, less the umask): SQLite would create
/// it 0644, and it holds every lease and fenced value. SQLite gives its
/// `-wal` and `-shm` files the database file's mode. An existing file keeps
/// its mode (an operator may have let a group read it), as long as no one
/// else may write it ([`check_protected`]). Errors are left for SQLite to
/// report when it opens the file.
fn create_private(path: &std::path::Path) {
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
}

/// The lease row as a losing acquire classifies it, if there is one, and
/// whether the instant `occ` (before `next`) could take it ([`LOSS_ROW`]).
async fn loss_row(
    tx: &mut Transaction<'static, Sqlite>,
    resource: &Name,
    now: i64,
    occ: Option<i64>,
    next: Option<i64>,
) -> Result<Option<(LossRow, bool)>, sqlx::Error> {
    let existing = sqlx::query(LOSS_ROW)
        .bind(resource.as_str())
        .bind(now)
        .bind(occ)
        .bind(next)
        .fetch_optional(&mut **tx)
        .await?;
    existing
        .map(|r| {
            let loss = LossRow {
                fence: r.try_get("fence")?,
                owner_id: r.try_get("owner_id")?,
                node: r.try_get("node")?,
                expires_at: r.try_get("expires_at_ms")?,
                last_occurrence: r.try_get("last_occurrence_ms")?,
                now,
            };
            Ok((loss, r.try_get("takeable")?))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_disk_is_named_not_unreachable() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("fencecron.db");
        let url = StoreUrl::parse(&format!("sqlite://{}", db.display())).unwrap();
        let store = SqliteStore::open(url, &OpenOptions::default()).unwrap();
        let enospc = sqlx::Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC));
        let msg = store.err(enospc).to_string();
        let holding = format!(
            "free space on the filesystem holding {}",
            dir.path().display()
        );
        assert!(
            msg.contains(&db.display().to_string())
                && msg.contains("disk is full")
                && msg.contains(&holding)
                && !msg.contains("unreachable"),
            "{msg}"
        );
        let refused = sqlx::Error::Io(std::io::Error::from_raw_os_error(libc::ECONNREFUSED));
        assert!(store.err(refused).to_string().contains("unreachable"));
    }
}

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
use super::hook::{notice, Hook};
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

#[macro_use]
mod lease;
mod claim;
mod protect;
mod values;

use lease::*;
pub(super) use protect::check_protected;
use protect::*;
use values::*;

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
        let hook = opts.hook.clone();
        let db = Db::connect_lazy(url, opts, connect, |pool| {
            pool.after_release(move |conn, _| {
                let hook = hook.clone();
                Box::pin(async move { left_clean(conn, &hook).await })
            })
        });
        Ok(SqlStore::new(db, Lite { path, in_memory }))
    }
}

#[async_trait]
impl Dialect for Lite {
    type DB = Sqlite;
    const BACKEND: Backend = Backend::Sqlite;
    const GET: &'static str = GET;
    const STALE: &'static str = STALE;
    const LATEST_STALE: &'static str = LATEST_STALE;
    const LIST: &'static str = LIST;
    const PUT_STATE: &'static str = PUT_STATE;
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
                &db.hook,
            )
            .await
            .map_err(fail)
        })
        .await;
        drop(lock);
        result
    }

    async fn acquire(&self, db: &Db<Sqlite>, req: &AcquireRequest<'_>) -> Sql<AcquireOutcome> {
        self.acquire_lease(db, req).await
    }

    /// [`Lite::claim_leases`].
    async fn claim(&self, db: &Db<Sqlite>, req: &ClaimRequest<'_>) -> Sql<ClaimOutcome> {
        self.claim_leases(db, req).await
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
                token.unwrap_or_default(),
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
async fn left_clean(conn: &mut SqliteConnection, hook: &Hook) -> Result<bool, sqlx::Error> {
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
    notice(
        hook,
        Notice::ConnectionDiscarded {
            sqlite_autocommit: autocommit,
            sqlx_in_transaction: in_tx,
        },
    );
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

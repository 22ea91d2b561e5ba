//! What every SQL backend shares, written once: the pool set-up, the time
//! limit of each call, the mapping of driver errors, the statements that
//! differ only in their SQL text, and the [`Store`] implementation itself.
//! A backend is a [`Dialect`]: its SQL, and the operations whose shape its
//! database dictates (how an acquire returns its row, whether a write takes
//! the write lock first, how an insert reports its time).

use std::time::Duration;

use async_trait::async_trait;
use sqlx::pool::PoolOptions;
use sqlx::query::Query;
use sqlx::{
    ColumnIndex, Connection, Database, Decode, Encode, Executor, IntoArguments, Pool, Row,
    Transaction, Type,
};

use super::error::Failure;
pub(super) use super::error::Sql;
use super::fleet::{FleetDb, FleetSql};
use super::hook::{self, Hook};
pub(super) use super::rows::Affected;
use super::{
    classify_admission, prelude::*, rows, timed, unavailable, AcquireOutcome, AcquireRequest,
    Admission, AdmitOutcome, AdmitRequest, Backend, EpochInfo, LeaseInfo, LeaseRow, NewStaleRecord,
    OpenOptions, Outages, PutOutcome, PutRequest, ReleaseOutcome, RenewOutcome, StaleRecord,
    StoreError, StoreTime, StoreUrl, StoredValue, Token,
};
use super::{
    ClaimOutcome, ClaimRequest, NodeBeat, NodeInfo, OwnerId, PauseInfo, PublishedJob, RunEnd,
    RunInfo, RunQuery, TriggerInfo, Unseen,
};
use crate::names::Name;

mod db;
mod store;

pub(super) use db::SqlDb;

/// `$n` as the backend spells a placeholder: `$n` (PostgreSQL), `?n`
/// (SQLite), `?` (MySQL, positional: every statement given to it uses each
/// parameter once, in order). The one spelling for the statements written
/// once for all backends: the fleet's and the migrator's.
pub(super) fn placeholders(backend: Backend, text: &str) -> String {
    if backend == Backend::Postgres {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
            let mut n = String::new();
            while let Some(d) = chars.peek().copied().filter(char::is_ascii_digit) {
                n.push(d);
                chars.next();
            }
            out.push('?');
            if backend == Backend::Sqlite {
                out.push_str(&n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A backend's connection pool, URL, per-call time limit, and its opener's
/// hook.
pub(super) struct Db<DB: Database> {
    pub url: StoreUrl,
    pub pool: Pool<DB>,
    pub call_timeout: Duration,
    pub hook: Hook,
}

impl<DB: Database> Db<DB> {
    /// A pool that connects on first use, so a daemon can start while its
    /// database is down, with the settings every backend shares; `tune`
    /// adds the backend's own.
    pub fn connect_lazy(
        url: StoreUrl,
        opts: &OpenOptions,
        connect: <DB::Connection as Connection>::Options,
        tune: impl FnOnce(PoolOptions<DB>) -> PoolOptions<DB>,
    ) -> Self {
        let pool = PoolOptions::<DB>::new()
            .max_connections(opts.max_connections)
            .min_connections(0)
            .acquire_timeout(opts.call_timeout)
            .idle_timeout(Some(Duration::from_secs(60)))
            // sqlx would otherwise ping before every checkout: a hidden
            // extra round trip per operation. A dead connection instead
            // fails its call, which every caller already retries.
            .test_before_acquire(false);
        Db {
            url,
            pool: tune(pool).connect_lazy_with(connect),
            call_timeout: opts.call_timeout,
            hook: opts.hook.clone(),
        }
    }
}

/// One backend: its SQL and the operations whose shape its database
/// dictates. Each operation returns [`Sql`]: the shared code puts it under
/// the call's time limit and names its driver error ([`Dialect::error`]).
#[async_trait]
pub(super) trait Dialect: Send + Sync + 'static {
    type DB: SqlDb + FleetDb;
    const BACKEND: Backend;
    /// `get` ([`SqlDb::get`]).
    const GET: &'static str;
    /// `stale` ([`SqlDb::stale`]).
    const STALE: &'static str;
    /// `latest_stale` ([`SqlDb::latest_stale`]): binds the earliest time,
    /// then the limit.
    const LATEST_STALE: &'static str;
    /// `lease list` ([`SqlDb::list`]).
    const LIST: &'static str;
    /// What beat a refused write ([`Dialect::put_state`]).
    const PUT_STATE: &'static str;
    /// `fencecron epoch` ([`SqlDb::epoch`]).
    const EPOCH: &'static str;
    /// `fencecron epoch advance` ([`SqlDb::advance_epoch`]).
    const ADVANCE_EPOCH: &'static str;
    /// The fencing proxy's read ([`SqlDb::admit_state`]).
    const ADMIT_STATE: &'static str;
    /// The fencing proxy's raise ([`SqlDb::admit_raise`]): inserts or
    /// raises the resource's highest admitted token to the token, only if
    /// the resource's lease row issued it (`1 <= token <= fence`) and only
    /// upwards.
    const ADMIT_RAISE: &'static str;

    /// A transaction for a write.
    async fn begin(
        &self,
        db: &Db<Self::DB>,
    ) -> Result<Transaction<'static, Self::DB>, sqlx::Error> {
        db.pool.begin().await
    }

    /// Runs one call on the backend's pool: as it is, unless the backend
    /// watches its calls (PostgreSQL with several hosts follows which one
    /// to use).
    fn watch<'a, T, F>(
        &'a self,
        db: &'a Db<Self::DB>,
        op: F,
    ) -> impl std::future::Future<Output = T> + Send + 'a
    where
        T: Send + 'a,
        F: std::future::Future<Output = T> + Send + 'a,
    {
        let _ = db;
        op
    }

    /// A driver error as the caller sees it: unreachable or failing, unless
    /// the backend can name the cause better.
    fn error(&self, url: &StoreUrl, e: sqlx::Error) -> StoreError {
        unavailable(url, e)
    }

    /// [`Store::migrate`](crate::store::Admin::migrate), with its own time limit.
    async fn migrate(&self, db: &Db<Self::DB>) -> Result<(), StoreError>;

    async fn acquire(&self, db: &Db<Self::DB>, req: &AcquireRequest<'_>) -> Sql<AcquireOutcome>;

    /// [`Store::claim`](crate::store::Leases::claim).
    async fn claim(&self, db: &Db<Self::DB>, req: &ClaimRequest<'_>) -> Sql<ClaimOutcome>;

    async fn renew(
        &self,
        db: &Db<Self::DB>,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
        lease: Duration,
    ) -> Sql<RenewOutcome>;

    /// `release`, or with an occurrence `give_back` (whose token may be
    /// unknown).
    async fn release(
        &self,
        db: &Db<Self::DB>,
        resource: &Name,
        owner_id: OwnerId,
        token: Option<Token>,
        occurrence: Option<StoreTime>,
    ) -> Sql<ReleaseOutcome>;

    /// [`Store::give_back_unseen`](crate::store::Leases::give_back_unseen) without the run rows: which items were
    /// given back. One `give_back` each unless the backend does better.
    async fn give_back_unseen(&self, db: &Db<Self::DB>, items: &[Unseen<'_>]) -> Sql<Vec<bool>> {
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let outcome = self
                .release(
                    db,
                    item.resource,
                    item.owner_id,
                    None,
                    Some(item.occurrence),
                )
                .await?;
            out.push(outcome == ReleaseOutcome::Released);
        }
        Ok(out)
    }

    /// [`Store::finish_and_release`](crate::store::Runs::finish_and_release) in one statement, if the backend has
    /// one; `None` (the default): the store makes the two calls.
    async fn finish_and_release(
        &self,
        db: &Db<Self::DB>,
        resource: &Name,
        owner_id: OwnerId,
        end: &RunEnd<'_>,
    ) -> Sql<Option<(bool, ReleaseOutcome)>> {
        let _ = (db, resource, owner_id, end);
        Ok(None)
    }

    async fn list(&self, db: &Db<Self::DB>) -> Sql<Vec<LeaseInfo>> {
        Ok(Self::DB::list(&db.pool, Self::LIST).await?)
    }

    /// The store's time of a write transaction when the backend reads it
    /// on the host, once, after [`Dialect::begin`] (SQLite: the kernel's
    /// clock under the write lock); `None` (the default): each statement
    /// reads the server's clock.
    fn tx_now(&self) -> Option<i64> {
        None
    }

    /// `put`'s conditional write, in the transaction [`SqlStore`]'s `put`
    /// holds: written (when, by the store's clock), or refused (with what
    /// beat it when the backend had to read that anyway to know).
    async fn put_write(
        &self,
        tx: &mut Transaction<'static, Self::DB>,
        req: &PutRequest<'_>,
        op: &str,
        now: Option<i64>,
    ) -> Sql<Written>;

    /// After a refused write, in its transaction: what beat it
    /// ([`SqlDb::put_state`]; unless the backend reads it its own way).
    async fn put_state(
        &self,
        tx: &mut Transaction<'static, Self::DB>,
        req: &PutRequest<'_>,
    ) -> Sql<rows::PutState> {
        Ok(Self::DB::put_state(&mut **tx, Self::PUT_STATE, req).await?)
    }

    /// Inserts a stale-owner record in `tx`; its store time.
    async fn insert_stale(
        &self,
        tx: &mut Transaction<'static, Self::DB>,
        rec: &NewStaleRecord<'_>,
        now: Option<i64>,
    ) -> Sql<i64>;

    /// A `put` that ended with a driver error, after its time limit: named
    /// as the backend knows best (MySQL: a value too large for the server).
    async fn put_failed(&self, db: &Db<Self::DB>, source: sqlx::Error, _size: usize) -> StoreError {
        unavailable(&db.url, source)
    }

    /// A stale-owner record of its own (the fencing proxy's refusals): in
    /// a write transaction unless the backend does better.
    async fn record_stale(&self, db: &Db<Self::DB>, rec: &NewStaleRecord<'_>) -> Sql<StaleRecord> {
        let mut tx = self.begin(db).await?;
        let now = self.tx_now();
        let at = self.insert_stale(&mut tx, rec, now).await?;
        tx.commit().await?;
        Ok(rec.stored(at))
    }

    async fn now(&self, db: &Db<Self::DB>) -> Sql<StoreTime>;

    /// [`Store::beat`](crate::store::Fleet::beat): the store's clock, the upsert and the read of the
    /// live nodes, one after the other, unless the backend does it in one
    /// statement (PostgreSQL, MySQL). Left as is on SQLite, whose clock is
    /// the host's (no round trip) and whose statements run in process.
    async fn beat(
        &self,
        db: &Db<Self::DB>,
        fleet: &FleetSql,
        beat: &NodeBeat<'_>,
    ) -> Sql<super::BeatAnswer> {
        let now = self.now(db).await?;
        Self::DB::beat(&db.pool, fleet, beat, now).await?;
        let live = Self::DB::live_nodes(&db.pool, fleet, now).await?;
        Ok(super::BeatAnswer { now, live })
    }

    async fn epoch(&self, db: &Db<Self::DB>) -> Sql<EpochInfo> {
        Ok(Self::DB::epoch(&db.pool, Self::EPOCH).await?)
    }

    /// In one write transaction with the read of the result.
    async fn advance_epoch(&self, db: &Db<Self::DB>) -> Sql<EpochInfo> {
        let mut tx = self.begin(db).await?;
        let info = Self::DB::advance_epoch(&mut tx, Self::ADVANCE_EPOCH, Self::EPOCH).await?;
        tx.commit().await?;
        Ok(info)
    }
}

/// A SQL store: a pool and a dialect. Its [`Store`] implementation is the
/// only one of the three backends.
pub(super) struct SqlStore<D: Dialect> {
    pub(super) db: Db<D::DB>,
    pub(super) dialect: D,
    /// The run history, pause and trigger statements in this backend's
    /// placeholders.
    fleet: FleetSql,
    /// The outages of this handle's users (`store_unavailable`).
    outages: Outages,
}

impl<D: Dialect> SqlStore<D> {
    pub(super) fn new(db: Db<D::DB>, dialect: D) -> Self {
        SqlStore {
            db,
            dialect,
            fleet: FleetSql::new(D::BACKEND),
            outages: Default::default(),
        }
    }

    /// A failure as the caller sees it.
    pub(super) fn failed(&self, f: Failure) -> StoreError {
        match f {
            Failure::Sql(e) => self.err(e),
            Failure::Store(e) => e,
        }
    }

    /// A driver error as the caller sees it ([`Dialect::error`]).
    pub(super) fn err(&self, e: sqlx::Error) -> StoreError {
        self.dialect.error(&self.db.url, e)
    }

    /// `put`'s transaction, the same on every backend (principle 6: the
    /// check is atomic with the write): the conditional write; refused, in
    /// the same transaction, what beat it (the conflicting row, if any, is
    /// now locked by this transaction, so what is read is what beat the
    /// write), why ([`rows::PutState::rejection`]), and its record.
    async fn put_tx(&self, req: &PutRequest<'_>) -> Sql<PutOutcome> {
        let op = req.operation_id.to_string();
        let mut tx = self.dialect.begin(&self.db).await?;
        let now = self.dialect.tx_now();
        let state = match self.dialect.put_write(&mut tx, req, &op, now).await? {
            Written::At(at) => {
                tx.commit().await?;
                return Ok(PutOutcome::Accepted {
                    written_at: StoreTime(at),
                });
            }
            Written::Refused(Some(state)) => state,
            Written::Refused(None) => self.dialect.put_state(&mut tx, req).await?,
        };
        let Some(rejection) = state.rejection(req) else {
            tx.rollback().await?;
            return Ok(PutOutcome::AlreadyApplied);
        };
        let rec = rejection.record(req, &op);
        let at = self.dialect.insert_stale(&mut tx, &rec, now).await?;
        tx.commit().await?;
        Ok(PutOutcome::Rejected(Box::new(rec.stored(at))))
    }
}

/// What `put`'s conditional write did ([`Dialect::put_write`]).
pub(super) enum Written {
    /// Written, at this store time.
    At(i64),
    /// Refused; with what beat it if the backend read that already.
    Refused(Option<rows::PutState>),
}

#[cfg(test)]
mod tests {
    use super::super::error::Failure;
    use super::super::SqliteStore;
    use super::*;

    /// The shared call names a driver error the backend's way (SQLite: a
    /// full disk), passes an error already named through, and ends a call
    /// that hangs at the time limit.
    #[tokio::test(start_paused = true)]
    async fn a_call_names_its_error_once_and_has_a_time_limit() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("fencecron.db");
        let url = StoreUrl::parse(&format!("sqlite://{}", db.display())).unwrap();
        let limit = Duration::from_secs(3);
        let opts = OpenOptions {
            max_connections: 1,
            call_timeout: limit,
            ..OpenOptions::default()
        };
        let store = SqliteStore::open(url, &opts).unwrap();

        let enospc = sqlx::Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC));
        let e = store
            .limited(async { Err::<(), _>(Failure::Sql(enospc)) })
            .await
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::DiskFull { path, .. } if path == &db.display().to_string()),
            "{e}"
        );

        let named = StoreError::Unprotected {
            detail: "named".to_string(),
        };
        let e = store
            .limited(async { Err::<(), _>(Failure::Store(named)) })
            .await
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Unprotected { detail } if detail == "named"),
            "{e}"
        );

        let started = tokio::time::Instant::now();
        let hung =
            tokio::time::timeout(limit * 2, store.limited(std::future::pending::<Sql<()>>()))
                .await
                .expect("the call ends by its own limit");
        let e = hung.unwrap_err();
        assert!(
            matches!(e, StoreError::Timeout { limit: l, .. } if l == limit),
            "{e}"
        );
        assert_eq!(started.elapsed(), limit);
    }

    /// Records what a store tells its hook.
    #[derive(Default)]
    struct Heard(std::sync::Mutex<Vec<(&'static str, super::super::CallEnd)>>);

    impl super::super::StoreHook for Heard {
        fn called(&self, operation: &'static str, _took: Duration, end: super::super::CallEnd) {
            self.0.lock().unwrap().push((operation, end));
        }

        fn noticed(&self, _notice: super::super::Notice<'_>) {}
    }

    /// The hook hears every operation once, by its method's name, however
    /// many statements it takes (`runs` reads the store's clock first,
    /// `admit` reads, raises and reads again), migrations included, and
    /// how each ended: the one place the metrics and `/readyz` see the
    /// store through.
    #[tokio::test]
    async fn the_hook_hears_every_operation_once_by_name() {
        use super::super::CallEnd;
        use std::sync::Arc;

        let dir = tempfile::tempdir().unwrap();
        let url = StoreUrl::parse(&format!(
            "sqlite://{}",
            dir.path().join("fencecron.db").display()
        ))
        .unwrap();
        let heard = Arc::new(Heard::default());
        let opts = OpenOptions {
            hook: Some(heard.clone()),
            ..OpenOptions::default()
        };
        let store = SqliteStore::open(url, &opts).unwrap();
        store.migrate().await.unwrap();
        store.now().await.unwrap();
        let resource = Name::parse("resource", "hooked").unwrap();
        let token = match store
            .acquire(&AcquireRequest {
                resource: &resource,
                lease: Duration::from_secs(30),
                node: "n",
                owner_id: OwnerId::fresh(),
                occurrence: None,
                next_occurrence: None,
                run: None,
            })
            .await
            .unwrap()
        {
            AcquireOutcome::Acquired(lease) => lease.token,
            other => panic!("{other:?}"),
        };
        let admitted = store
            .admit(&AdmitRequest {
                resource: &resource,
                token,
                node: "n",
                operation_id: uuid::Uuid::new_v4(),
            })
            .await
            .unwrap();
        assert_eq!(admitted, AdmitOutcome::Admitted);
        store
            .runs(&RunQuery {
                job: None,
                outcome: None,
                since: None,
                node: None,
                owner_id: None,
                limit: 10,
            })
            .await
            .unwrap();
        let e = store
            .call("get", async {
                Err::<(), _>(Failure::Store(StoreError::Corrupt {
                    url: "u".into(),
                    detail: "d".into(),
                }))
            })
            .await;
        assert!(e.is_err());
        assert_eq!(
            *heard.0.lock().unwrap(),
            [
                ("migrate", CallEnd::Answered),
                ("now", CallEnd::Answered),
                ("acquire", CallEnd::Answered),
                ("admit", CallEnd::Answered),
                ("runs", CallEnd::Answered),
                ("get", CallEnd::Failed),
            ]
        );
    }
}

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

use super::fleet::{FleetDb, FleetSql};
use super::{
    classify_admission, rows, timed, unavailable, AcquireOutcome, AcquireRequest, Admission,
    AdmitOutcome, AdmitRequest, Backend, EpochInfo, LeaseInfo, LeaseRow, NewStaleRecord,
    OpenOptions, PutOutcome, PutRequest, ReleaseOutcome, RenewOutcome, StaleRecord, Store,
    StoreError, StoreTime, StoreUrl, StoredValue, Token,
};
use super::{
    ClaimOutcome, ClaimRequest, NodeBeat, NodeInfo, OwnerId, PauseInfo, PublishedJob, RunEnd,
    RunInfo, RunQuery, TriggerInfo, Unseen,
};
use crate::names::Name;

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

/// How a store call failed before it was given its public form: a driver
/// error (which the backend names, with its URL, at the end of the call:
/// [`Dialect::error`]) or an error already named. `?` turns either into
/// this, so backend code never maps errors itself.
pub(super) enum Failure {
    Sql(sqlx::Error),
    Store(StoreError),
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        Failure::Sql(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

/// The result of a backend operation before its error is named.
pub(super) type Sql<T> = Result<T, Failure>;

/// A backend's connection pool, URL and per-call time limit.
pub(super) struct Db<DB: Database> {
    pub url: StoreUrl,
    pub pool: Pool<DB>,
    pub call_timeout: Duration,
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
        }
    }
}

/// The statements every backend sends the same way, only in its own SQL,
/// for any sqlx database whose connections execute queries, whose arguments
/// take text and integers and whose rows give back text, integers and bytes
/// by column name. The bounds are stated once, on the one implementation,
/// instead of on every function that runs a statement.
#[async_trait]
pub(super) trait SqlDb: Database {
    /// `get`: one `(value, token, owner_id, written_at_ms)` row of
    /// `sql`, which binds the resource and the key.
    async fn get(
        pool: &Pool<Self>,
        sql: &'static str,
        resource: &Name,
        key: &Name,
    ) -> Result<Option<StoredValue>, sqlx::Error>;

    /// `stale`: the stale-owner rows of `sql`, which binds the earliest
    /// time.
    async fn stale(
        pool: &Pool<Self>,
        sql: &'static str,
        since: i64,
    ) -> Result<Vec<StaleRecord>, sqlx::Error>;

    /// `lease list`: the rows of `sql`, each with the store's clock in
    /// `now_ms`.
    async fn list(pool: &Pool<Self>, sql: &'static str) -> Result<Vec<LeaseInfo>, sqlx::Error>;

    /// The lease row as a refused renew or release finds it: `owner_id,
    /// fence, expires_at_ms` of `sql`, which binds the resource.
    async fn lease_row<'e, E>(
        ex: E,
        sql: &'static str,
        resource: &Name,
    ) -> Result<Option<LeaseRow>, sqlx::Error>
    where
        E: Executor<'e, Database = Self>;

    /// `fencecron epoch` where the epoch is only the stored one (no
    /// timeline): `stored` and `highest` of `sql`.
    async fn epoch(pool: &Pool<Self>, sql: &'static str) -> Result<EpochInfo, sqlx::Error>;

    /// `fencecron epoch advance` where the epoch is only the stored one:
    /// `advance`, then [`SqlDb::epoch`] of `epoch`, on one connection (in
    /// the caller's transaction).
    async fn advance_epoch(
        conn: &mut Self::Connection,
        advance: &'static str,
        epoch: &'static str,
    ) -> Result<EpochInfo, sqlx::Error>;

    /// After a refused write, in its transaction: what beat it, from
    /// `sql`, which binds the resource and the key ([`rows::PutState`]).
    async fn put_state<'e, E>(
        ex: E,
        sql: &'static str,
        req: &PutRequest<'_>,
    ) -> Result<rows::PutState, sqlx::Error>
    where
        E: Executor<'e, Database = Self>;

    /// Binds the columns of a stale-owner record after whatever `query`
    /// bound already: kind, reason, resource, key, owner_id, token,
    /// accepted_token, node, job, stage, operation_id.
    fn bind_stale<'q>(
        query: Query<'q, Self, Self::Arguments<'q>>,
        rec: &'q NewStaleRecord<'_>,
    ) -> Query<'q, Self, Self::Arguments<'q>>;

    /// The fencing proxy's read: the highest token admitted for the
    /// resource and its fence, `highest` and `issued` of `sql`, which binds
    /// the resource twice.
    async fn admit_state(
        pool: &Pool<Self>,
        sql: &'static str,
        resource: &Name,
    ) -> Result<(Option<Token>, Option<Token>), sqlx::Error>;

    /// The fencing proxy's raise: `sql` binds resource, token, resource,
    /// token, token.
    async fn admit_raise(
        pool: &Pool<Self>,
        sql: &'static str,
        resource: &Name,
        token: Token,
    ) -> Result<(), sqlx::Error>;

    /// `SELECT 1`, the benchmark's floor.
    async fn ping(pool: &Pool<Self>) -> Result<Option<Token>, sqlx::Error>;

    /// Fetches the first row of `sql` with text parameters and drops it
    /// (the benchmark's raw read).
    async fn probe(
        pool: &Pool<Self>,
        sql: &'static str,
        params: &[&str],
    ) -> Result<Option<Token>, sqlx::Error>;

    /// Runs each statement with one text parameter; the rows they changed.
    async fn execute_each(
        pool: &Pool<Self>,
        sqls: &[&'static str],
        param: &str,
    ) -> Result<u64, sqlx::Error>;
}

#[async_trait]
impl<DB> SqlDb for DB
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB>,
    for<'q> Option<i64>: Encode<'q, DB>,
    for<'q> Option<&'q str>: Encode<'q, DB>,
    i64: Type<DB> + for<'r> Decode<'r, DB>,
    String: Type<DB> + for<'r> Decode<'r, DB>,
    Vec<u8>: Type<DB> + for<'r> Decode<'r, DB>,
    for<'a> &'a str: ColumnIndex<DB::Row>,
    DB::QueryResult: Affected,
{
    async fn get(
        pool: &Pool<Self>,
        sql: &'static str,
        resource: &Name,
        key: &Name,
    ) -> Result<Option<StoredValue>, sqlx::Error> {
        let row = sqlx::query(sql)
            .bind(resource.as_str())
            .bind(key.as_str())
            .fetch_optional(pool)
            .await?;
        row.map(|r| rows::stored_value(&r, resource.as_str(), key.as_str()))
            .transpose()
    }

    async fn stale(
        pool: &Pool<Self>,
        sql: &'static str,
        since: i64,
    ) -> Result<Vec<StaleRecord>, sqlx::Error> {
        let found = sqlx::query(sql).bind(since).fetch_all(pool).await?;
        found.iter().map(rows::stale_record).collect()
    }

    async fn list(pool: &Pool<Self>, sql: &'static str) -> Result<Vec<LeaseInfo>, sqlx::Error> {
        let found = sqlx::query(sql).fetch_all(pool).await?;
        found
            .iter()
            .map(|r| rows::lease_info(r, r.try_get("now_ms")?))
            .collect()
    }

    async fn lease_row<'e, E>(
        ex: E,
        sql: &'static str,
        resource: &Name,
    ) -> Result<Option<LeaseRow>, sqlx::Error>
    where
        E: Executor<'e, Database = Self>,
    {
        let row = sqlx::query(sql)
            .bind(resource.as_str())
            .fetch_optional(ex)
            .await?;
        row.map(|r| {
            Ok(LeaseRow {
                owner_id: r.try_get("owner_id")?,
                fence: r.try_get("fence")?,
                expires_at: r.try_get("expires_at_ms")?,
            })
        })
        .transpose()
    }

    async fn epoch(pool: &Pool<Self>, sql: &'static str) -> Result<EpochInfo, sqlx::Error> {
        stored_epoch(pool, sql).await
    }

    async fn advance_epoch(
        conn: &mut Self::Connection,
        advance: &'static str,
        epoch: &'static str,
    ) -> Result<EpochInfo, sqlx::Error> {
        sqlx::query(advance).execute(&mut *conn).await?;
        stored_epoch(&mut *conn, epoch).await
    }

    async fn put_state<'e, E>(
        ex: E,
        sql: &'static str,
        req: &PutRequest<'_>,
    ) -> Result<rows::PutState, sqlx::Error>
    where
        E: Executor<'e, Database = Self>,
    {
        let row = sqlx::query(sql)
            .bind(req.resource.as_str())
            .bind(req.key.as_str())
            .fetch_one(ex)
            .await?;
        rows::put_state(&row)
    }

    fn bind_stale<'q>(
        query: Query<'q, Self, Self::Arguments<'q>>,
        rec: &'q NewStaleRecord<'_>,
    ) -> Query<'q, Self, Self::Arguments<'q>> {
        query
            .bind(rec.kind.as_str())
            .bind(rec.reason)
            .bind(rec.resource)
            .bind(rec.key)
            .bind(rec.owner_id)
            .bind(rec.token)
            .bind(rec.accepted_token)
            .bind(rec.node)
            .bind(rec.job)
            .bind(rec.stage)
            .bind(rec.operation_id)
    }

    async fn admit_state(
        pool: &Pool<Self>,
        sql: &'static str,
        resource: &Name,
    ) -> Result<(Option<Token>, Option<Token>), sqlx::Error> {
        let row = sqlx::query(sql)
            .bind(resource.as_str())
            .bind(resource.as_str())
            .fetch_one(pool)
            .await?;
        Ok((row.try_get("highest")?, row.try_get("issued")?))
    }

    async fn admit_raise(
        pool: &Pool<Self>,
        sql: &'static str,
        resource: &Name,
        token: Token,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(sql)
            .bind(resource.as_str())
            .bind(token)
            .bind(resource.as_str())
            .bind(token)
            .bind(token)
            .execute(pool)
            .await
            .map(|_| ())
    }

    async fn ping(pool: &Pool<Self>) -> Result<Option<Token>, sqlx::Error> {
        sqlx::query("SELECT 1").execute(pool).await.map(|_| None)
    }

    async fn probe(
        pool: &Pool<Self>,
        sql: &'static str,
        params: &[&str],
    ) -> Result<Option<Token>, sqlx::Error> {
        let mut query = sqlx::query(sql);
        for p in params {
            query = query.bind(*p);
        }
        query.fetch_optional(pool).await.map(|_| None)
    }

    async fn execute_each(
        pool: &Pool<Self>,
        sqls: &[&'static str],
        param: &str,
    ) -> Result<u64, sqlx::Error> {
        let mut n = 0;
        for sql in sqls {
            let done = sqlx::query(sql).bind(param).execute(pool).await?;
            n += Affected::rows_affected(&done);
        }
        Ok(n)
    }
}

/// [`SqlDb::epoch`] on any executor.
async fn stored_epoch<'e, DB, E>(ex: E, sql: &'static str) -> Result<EpochInfo, sqlx::Error>
where
    DB: Database,
    E: Executor<'e, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    i64: Type<DB> + for<'r> Decode<'r, DB>,
    for<'a> &'a str: ColumnIndex<DB::Row>,
{
    let row = sqlx::query(sql).fetch_one(ex).await?;
    Ok(EpochInfo::new(
        row.try_get("stored")?,
        None,
        row.try_get("highest")?,
    ))
}

/// How many rows a statement changed: each driver's result type has the
/// method, but sqlx names it in no trait.
pub(super) trait Affected {
    fn rows_affected(&self) -> u64;
}

impl Affected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}

impl Affected for sqlx::mysql::MySqlQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
    }
}

impl Affected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        self.rows_affected()
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
    /// `lease list` ([`SqlDb::list`]).
    const LIST: &'static str;
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

    /// A driver error as the caller sees it: unreachable or failing, unless
    /// the backend can name the cause better.
    fn error(&self, url: &StoreUrl, e: sqlx::Error) -> StoreError {
        unavailable(url, e)
    }

    /// [`Store::migrate`], with its own time limit.
    async fn migrate(&self, db: &Db<Self::DB>) -> Result<(), StoreError>;

    async fn acquire(&self, db: &Db<Self::DB>, req: &AcquireRequest<'_>) -> Sql<AcquireOutcome>;

    /// Whether [`Dialect::claim`] claims.
    const CLAIMS: bool = false;

    /// [`Store::claim`]; `None` (the default): no batch claims.
    async fn claim(&self, db: &Db<Self::DB>, req: &ClaimRequest<'_>) -> Sql<Option<ClaimOutcome>> {
        let _ = (db, req);
        Ok(None)
    }

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

    /// [`Store::give_back_unseen`] without the run rows: which items were
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

    /// [`Store::finish_and_release`] in one statement, if the backend has
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
    /// ([`SqlDb::put_state`]).
    async fn put_state(
        &self,
        tx: &mut Transaction<'static, Self::DB>,
        req: &PutRequest<'_>,
    ) -> Sql<rows::PutState>;

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
    outages: crate::events::Outages,
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

    /// Runs one operation under the per-call time limit and names its
    /// error.
    pub(super) async fn call<T>(
        &self,
        op: impl std::future::Future<Output = Sql<T>>,
    ) -> Result<T, StoreError> {
        timed(&self.db.url, self.db.call_timeout, async {
            op.await.map_err(|f| self.failed(f))
        })
        .await
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

#[async_trait]
impl<D: Dialect> Store for SqlStore<D> {
    fn backend(&self) -> Backend {
        D::BACKEND
    }

    fn url(&self) -> &StoreUrl {
        &self.db.url
    }

    fn outages(&self) -> &crate::events::Outages {
        &self.outages
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.dialect.migrate(&self.db).await
    }

    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError> {
        self.call(self.dialect.acquire(&self.db, req)).await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Option<ClaimOutcome>, StoreError> {
        self.call(self.dialect.claim(&self.db, req)).await
    }

    fn claims(&self) -> bool {
        D::CLAIMS
    }

    async fn renew(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError> {
        self.call(
            self.dialect
                .renew(&self.db, resource, owner_id, token, lease),
        )
        .await
    }

    async fn release(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<ReleaseOutcome, StoreError> {
        self.call(
            self.dialect
                .release(&self.db, resource, owner_id, Some(token), None),
        )
        .await
    }

    async fn give_back(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        token: Option<Token>,
        occurrence: StoreTime,
    ) -> Result<ReleaseOutcome, StoreError> {
        let outcome = self
            .call(
                self.dialect
                    .release(&self.db, resource, owner_id, token, Some(occurrence)),
            )
            .await?;
        if outcome == ReleaseOutcome::Released {
            // Nothing ran under the lease: its run row goes too. Rare (a win
            // whose answer came too late), so a statement of its own.
            self.call(async {
                Ok(D::DB::forget_unrun(
                    &self.db.pool,
                    &self.fleet,
                    resource.as_str(),
                    owner_id.as_str(),
                )
                .await?)
            })
            .await?;
        }
        Ok(outcome)
    }

    async fn give_back_unseen(&self, items: &[Unseen<'_>]) -> Result<Vec<bool>, StoreError> {
        let given = self
            .call(self.dialect.give_back_unseen(&self.db, items))
            .await?;
        for (item, _) in items.iter().zip(&given).filter(|(_, g)| **g) {
            // Nothing ran under these leases: their run rows go too (rare).
            self.call(async {
                Ok(D::DB::forget_unrun(
                    &self.db.pool,
                    &self.fleet,
                    item.resource.as_str(),
                    item.owner_id.as_str(),
                )
                .await?)
            })
            .await?;
        }
        Ok(given)
    }

    async fn list(&self) -> Result<Vec<LeaseInfo>, StoreError> {
        self.call(self.dialect.list(&self.db)).await
    }

    async fn put(&self, req: &PutRequest<'_>) -> Result<PutOutcome, StoreError> {
        match self.call(self.put_tx(req)).await {
            Err(StoreError::Unavailable { source, .. }) => Err(self
                .dialect
                .put_failed(&self.db, source, req.value.len())
                .await),
            other => other,
        }
    }

    async fn get(&self, resource: &Name, key: &Name) -> Result<Option<StoredValue>, StoreError> {
        self.call(async { Ok(D::DB::get(&self.db.pool, D::GET, resource, key).await?) })
            .await
    }

    /// One read; a token newer than the highest admitted adds the raise
    /// and a second read (at most once per resource and token). No
    /// transaction: each statement is atomic, and the decision is the last
    /// read's (highest, fence only ever grow), so an admission holds as of
    /// that read.
    async fn admit(&self, req: &AdmitRequest<'_>) -> Result<AdmitOutcome, StoreError> {
        let mut raised = false;
        loop {
            let (highest, issued) = self
                .call(async {
                    Ok(D::DB::admit_state(&self.db.pool, D::ADMIT_STATE, req.resource).await?)
                })
                .await?;
            match classify_admission(req.token, highest, issued, raised) {
                Admission::Admit => return Ok(AdmitOutcome::Admitted),
                Admission::Raise => {
                    self.call(async {
                        Ok(D::DB::admit_raise(
                            &self.db.pool,
                            D::ADMIT_RAISE,
                            req.resource,
                            req.token,
                        )
                        .await?)
                    })
                    .await?;
                    raised = true;
                }
                Admission::Refuse(reason, accepted) => {
                    let op = req.operation_id.to_string();
                    let rec = req.record(reason, accepted, &op);
                    let stored = self.call(self.dialect.record_stale(&self.db, &rec)).await?;
                    return Ok(AdmitOutcome::Refused(Box::new(stored)));
                }
            }
        }
    }

    async fn record_stale(&self, rec: &NewStaleRecord<'_>) -> Result<StaleRecord, StoreError> {
        self.call(self.dialect.record_stale(&self.db, rec)).await
    }

    async fn stale(&self, since: Option<StoreTime>) -> Result<Vec<StaleRecord>, StoreError> {
        let since = since.map_or(i64::MIN, |s| s.0);
        self.call(async { Ok(D::DB::stale(&self.db.pool, D::STALE, since).await?) })
            .await
    }

    async fn now(&self) -> Result<StoreTime, StoreError> {
        self.call(self.dialect.now(&self.db)).await
    }

    async fn epoch(&self) -> Result<EpochInfo, StoreError> {
        self.call(self.dialect.epoch(&self.db)).await
    }

    async fn advance_epoch(&self) -> Result<EpochInfo, StoreError> {
        self.call(self.dialect.advance_epoch(&self.db)).await
    }

    async fn preempt(
        &self,
        resource: &Name,
        token: Token,
        occurrence: StoreTime,
    ) -> Result<bool, StoreError> {
        self.call(async {
            Ok(D::DB::preempt(
                &self.db.pool,
                &self.fleet,
                resource.as_str(),
                token,
                occurrence,
            )
            .await?)
        })
        .await
    }

    async fn finish_and_release(
        &self,
        resource: &Name,
        owner_id: OwnerId,
        end: &RunEnd<'_>,
    ) -> Result<(bool, ReleaseOutcome), StoreError> {
        let one = self
            .call(
                self.dialect
                    .finish_and_release(&self.db, resource, owner_id, end),
            )
            .await?;
        match one {
            Some(done) => Ok(done),
            None => {
                let finished = self.finish_run(end).await?;
                Ok((finished, self.release(resource, owner_id, end.token).await?))
            }
        }
    }

    async fn finish_run(&self, end: &RunEnd<'_>) -> Result<bool, StoreError> {
        self.call(async { Ok(D::DB::finish_run(&self.db.pool, &self.fleet, end).await?) })
            .await
    }

    async fn runs(&self, q: &RunQuery<'_>) -> Result<Vec<RunInfo>, StoreError> {
        let now = self.now().await?;
        self.call(async { Ok(D::DB::runs(&self.db.pool, &self.fleet, q, now).await?) })
            .await
    }

    async fn prune_runs(&self, keep: u32, before: StoreTime) -> Result<u64, StoreError> {
        self.call(async { Ok(D::DB::prune_runs(&self.db.pool, &self.fleet, keep, before).await?) })
            .await
    }

    async fn pause(
        &self,
        pause: &PauseInfo,
        replace: bool,
    ) -> Result<Option<PauseInfo>, StoreError> {
        self.call(async { Ok(D::DB::pause(&self.db.pool, &self.fleet, pause, replace).await?) })
            .await
    }

    async fn resume(&self, job: &str) -> Result<bool, StoreError> {
        self.call(async { Ok(D::DB::resume(&self.db.pool, &self.fleet, job).await?) })
            .await
    }

    async fn pauses(&self, now: StoreTime) -> Result<Vec<PauseInfo>, StoreError> {
        self.call(async { Ok(D::DB::pauses(&self.db.pool, &self.fleet, now).await?) })
            .await
    }

    async fn request_trigger(&self, trigger: &TriggerInfo) -> Result<(), StoreError> {
        self.call(async { Ok(D::DB::request_trigger(&self.db.pool, &self.fleet, trigger).await?) })
            .await
    }

    async fn trigger(&self, id: &str) -> Result<Option<TriggerInfo>, StoreError> {
        self.call(async { Ok(D::DB::trigger(&self.db.pool, &self.fleet, id).await?) })
            .await
    }

    async fn pending_triggers(&self) -> Result<Vec<TriggerInfo>, StoreError> {
        self.call(async { Ok(D::DB::pending_triggers(&self.db.pool, &self.fleet).await?) })
            .await
    }

    async fn claim_trigger(&self, id: &str, node: &str) -> Result<bool, StoreError> {
        self.call(async { Ok(D::DB::claim_trigger(&self.db.pool, &self.fleet, id, node).await?) })
            .await
    }

    async fn settle_trigger(
        &self,
        id: &str,
        state: &str,
        token: Option<Token>,
        detail: Option<&str>,
    ) -> Result<(), StoreError> {
        self.call(async {
            Ok(D::DB::settle_trigger(&self.db.pool, &self.fleet, id, state, token, detail).await?)
        })
        .await
    }

    async fn cancel_trigger(&self, id: &str) -> Result<bool, StoreError> {
        self.call(async { Ok(D::DB::cancel_trigger(&self.db.pool, &self.fleet, id).await?) })
            .await
    }

    async fn prune_fleet(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call(async { Ok(D::DB::prune_fleet(&self.db.pool, &self.fleet, before).await?) })
            .await
    }

    async fn beat(&self, beat: &NodeBeat<'_>) -> Result<StoreTime, StoreError> {
        // The store's clock, read first: the fleet statements bind every
        // time they write (one text for all backends).
        self.call(async {
            let now = self.dialect.now(&self.db).await?;
            D::DB::beat(&self.db.pool, &self.fleet, beat, now).await?;
            Ok(now)
        })
        .await
    }

    async fn nodes(&self) -> Result<Vec<NodeInfo>, StoreError> {
        self.call(async { Ok(D::DB::nodes(&self.db.pool, &self.fleet).await?) })
            .await
    }

    async fn publish_jobs(
        &self,
        node: &str,
        jobs: &[(String, String, String)],
    ) -> Result<(), StoreError> {
        self.call(async {
            let mut tx = self.dialect.begin(&self.db).await?;
            D::DB::publish(&mut tx, &self.fleet, node, jobs).await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    async fn published_jobs(
        &self,
        node: &str,
        definitions: bool,
    ) -> Result<Vec<PublishedJob>, StoreError> {
        self.call(async {
            Ok(D::DB::published(&self.db.pool, &self.fleet, node, definitions).await?)
        })
        .await
    }

    async fn forget(&self, resource: &Name, now: StoreTime) -> Result<Option<bool>, StoreError> {
        self.call(async {
            Ok(D::DB::forget(&self.db.pool, &self.fleet, resource.as_str(), now).await?)
        })
        .await
    }

    async fn prune_stale(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call(async { Ok(D::DB::prune_kept(&self.db.pool, &self.fleet, false, before).await?) })
            .await
    }

    async fn prune_values(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call(async { Ok(D::DB::prune_kept(&self.db.pool, &self.fleet, true, before).await?) })
            .await
    }

    async fn prune_nodes(&self, before: StoreTime) -> Result<u64, StoreError> {
        self.call(async { Ok(D::DB::prune_nodes(&self.db.pool, &self.fleet, before).await?) })
            .await
    }
}

#[cfg(test)]
mod tests {
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
        };
        let store = SqliteStore::open(url, &opts).unwrap();

        let enospc = sqlx::Error::Io(std::io::Error::from_raw_os_error(libc::ENOSPC));
        let e = store
            .call(async { Err::<(), _>(Failure::Sql(enospc)) })
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
            .call(async { Err::<(), _>(Failure::Store(named)) })
            .await
            .unwrap_err();
        assert!(
            matches!(&e, StoreError::Unprotected { detail } if detail == "named"),
            "{e}"
        );

        let started = tokio::time::Instant::now();
        let hung = tokio::time::timeout(limit * 2, store.call(std::future::pending::<Sql<()>>()))
            .await
            .expect("the call ends by its own limit");
        let e = hung.unwrap_err();
        assert!(
            matches!(e, StoreError::Timeout { limit: l, .. } if l == limit),
            "{e}"
        );
        assert_eq!(started.elapsed(), limit);
    }
}

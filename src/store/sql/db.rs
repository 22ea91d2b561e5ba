//! [`SqlDb`]: the statements every backend sends the same way, run once for
//! every sqlx database.

use super::*;

/// The statements every backend sends the same way, only in its own SQL,
/// for any sqlx database whose connections execute queries, whose arguments
/// take text and integers and whose rows give back text, integers and bytes
/// by column name. The bounds are stated once, on the one implementation,
/// instead of on every function that runs a statement.
#[async_trait]
pub(in crate::store) trait SqlDb: Database {
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

    /// `latest_stale`: the rows of `sql`, which binds the earliest time and
    /// the limit.
    async fn latest_stale(
        pool: &Pool<Self>,
        sql: &'static str,
        since: i64,
        limit: i64,
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
    async fn put_state(
        conn: &mut Self::Connection,
        sql: &'static str,
        req: &PutRequest<'_>,
    ) -> Result<rows::PutState, sqlx::Error>;

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

    async fn latest_stale(
        pool: &Pool<Self>,
        sql: &'static str,
        since: i64,
        limit: i64,
    ) -> Result<Vec<StaleRecord>, sqlx::Error> {
        let found = sqlx::query(sql)
            .bind(since)
            .bind(limit)
            .fetch_all(pool)
            .await?;
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

    async fn put_state(
        conn: &mut Self::Connection,
        sql: &'static str,
        req: &PutRequest<'_>,
    ) -> Result<rows::PutState, sqlx::Error> {
        let row = sqlx::query(sql)
            .bind(req.resource.as_str())
            .bind(req.key.as_str())
            .fetch_one(&mut *conn)
            .await?;
        rows::put_state(&row)
    }

    fn bind_stale<'q>(
        query: Query<'q, Self, Self::Arguments<'q>>,
        rec: &'q NewStaleRecord<'_>,
    ) -> Query<'q, Self, Self::Arguments<'q>> {
        query
            .bind(rec.kind.as_str())
            .bind(rec.reason.as_str())
            .bind(rec.resource)
            .bind(rec.key)
            .bind(rec.owner_id.as_ref().map(OwnerId::as_str))
            .bind(rec.token)
            .bind(rec.accepted_token.map(Token::get))
            .bind(rec.node)
            .bind(rec.job)
            .bind(rec.stage.as_str())
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

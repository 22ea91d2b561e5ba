//! What only `fencecron bench` may do: send the store's statements raw and
//! delete its own rows. Kept off [`Store`] so that nothing in production
//! (the daemon, the CLI's lease commands, the write boundary) can reach it;
//! `src/commands/bench.rs` gets it through [`open_bench`] alone.

use std::sync::Arc;

use async_trait::async_trait;

use super::error::{Failure, Sql};
use super::sql::{Db, Dialect, SqlDb, SqlStore};
use super::{
    Backend, MySqlStore, OpenOptions, PostgresStore, SqliteStore, Store, StoreError, StoreUrl,
    Token,
};
use crate::names::Name;

/// Raw statements for `fencecron bench`: the same SQL the store sends, so
/// the benchmark can compare the store's cost with the bare floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawOp {
    /// `SELECT 1`.
    Ping,
    /// The winning acquire statement for a free (expired) lease.
    AcquireFree,
    /// The acquire statement against a held lease (loses).
    AcquireHeld,
    Renew,
    Release,
    Put,
    Get,
}

/// A SQL store as the benchmark sees it: the whole [`Store`], plus raw
/// statements and the purge of its own rows.
#[async_trait]
pub(crate) trait BenchStore: Store {
    /// Sends one raw statement for the benchmark. `resource` must be a
    /// bench resource; `owner_id`/`token` come from a previous
    /// `AcquireFree`. Returns the token for acquire statements.
    async fn raw(
        &self,
        op: RawOp,
        resource: &Name,
        owner_id: &str,
        token: Token,
    ) -> Result<Option<Token>, StoreError>;

    /// Deletes every lease, value and stale record whose resource starts with
    /// `prefix` (the benchmark's own resources only).
    async fn purge_prefix(&self, prefix: &str) -> Result<u64, StoreError>;
}

/// What a backend adds for the benchmark: its writes sent raw, and the
/// purge (a read is the same everywhere).
#[async_trait]
pub(super) trait RawDialect: Dialect {
    /// The statement `op` names (an acquire, renew, release or put) sent
    /// raw, as the store sends it; the token for an acquire that won.
    async fn raw_write(
        &self,
        db: &Db<Self::DB>,
        op: RawOp,
        resource: &str,
        owner_id: &str,
        token: Token,
    ) -> Sql<Option<Token>>;

    /// [`BenchStore::purge_prefix`].
    async fn purge(&self, db: &Db<Self::DB>, prefix: &str) -> Sql<u64>;
}

/// Without a time limit, as the benchmark measures.
#[async_trait]
impl<D: RawDialect> BenchStore for SqlStore<D> {
    async fn raw(
        &self,
        op: RawOp,
        resource: &Name,
        owner_id: &str,
        token: Token,
    ) -> Result<Option<Token>, StoreError> {
        let pool = &self.db.pool;
        let r = resource.as_str();
        let sent = match op {
            RawOp::Ping => D::DB::ping(pool).await.map_err(Failure::from),
            RawOp::Get => D::DB::probe(pool, D::GET, &[r, "bench"])
                .await
                .map_err(Failure::from),
            _ => {
                self.dialect
                    .raw_write(&self.db, op, r, owner_id, token)
                    .await
            }
        };
        sent.map_err(|f| self.failed(f))
    }

    async fn purge_prefix(&self, prefix: &str) -> Result<u64, StoreError> {
        self.dialect
            .purge(&self.db, prefix)
            .await
            .map_err(|f| self.failed(f))
    }
}

/// Opens a store for the benchmark, like [`super::open`].
pub(crate) fn open_bench(
    url: &StoreUrl,
    opts: &OpenOptions,
) -> Result<Arc<dyn BenchStore>, StoreError> {
    Ok(match url.backend() {
        Backend::Sqlite => Arc::new(SqliteStore::open(url.clone(), opts)?),
        Backend::Postgres => Arc::new(PostgresStore::open(url.clone(), opts)?),
        Backend::MySql => Arc::new(MySqlStore::open(url.clone(), opts)?),
    })
}

/// Escapes `%`, `_` and `\` for a `LIKE … ESCAPE '\'` pattern.
pub(super) fn like_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '%' | '_' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

//! PostgreSQL: the production choice for several hosts.
//!
//! Clock choice: every comparison and every computed expiry uses
//! `clock_timestamp()`, the time at the moment the expression is evaluated.
//! `now()` is the transaction start, so a caller that waited on a row lock
//! would compare against an old time (a lease already free would look held);
//! `statement_timestamp()` has the same flaw within one statement. Under
//! READ COMMITTED, PostgreSQL re-evaluates an `UPDATE`'s `WHERE` against the
//! newest row version after the lock wait, and with `clock_timestamp()` that
//! re-evaluation also sees the current time.
//!
//! Losing is cheap: the acquire is a conditional `UPDATE` that, when the
//! lease is held, matches no row and writes nothing (no WAL, no fsync); the
//! row is created by a separate `INSERT … ON CONFLICT DO NOTHING` only the
//! first time a resource is ever leased.
//!
//! Failover: the epoch of a new token (see [`super::EPOCH_SHIFT`]) is the
//! stored epoch plus `(timeline − 1) × 1024`, the timeline read by the
//! acquiring statement itself from `pg_walfile_name(pg_current_wal_lsn())`
//! (both executable by any role; no grant needed). A standby promoted after
//! missing the old primary's last commits is on a later timeline, so its
//! first token for any resource is above every token the old primary could
//! have issued on its timeline. The epoch's first token comes from the
//! PL/pgSQL function `fencecron_token_floor()` (migration 0002), called in
//! the `UPDATE`'s `SET`, which PostgreSQL evaluates only for a row that
//! matched; being opaque to the planner, it also keeps `fencecron_epoch`
//! out of a losing acquire's plan. A loser writes nothing and reads nothing
//! more than before.

use std::time::Duration;

use async_trait::async_trait;
use std::sync::Arc;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Postgres, Row, Transaction};

use super::bench::{like_escape, RawDialect};
use super::sql::{Db, Dialect, Sql, SqlDb, SqlStore, Written};
use super::*;

/// `clock_timestamp()` as milliseconds since the epoch.
macro_rules! now_ms {
    () => {
        "(floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint"
    };
}

/// The current timeline: the first 8 hex digits of the current WAL file's
/// name. `pg_walfile_name` uses the timeline WAL is being inserted on, which
/// a promotion moves to a new one at once (the control file's checkpoint
/// timeline would lag until the next checkpoint).
macro_rules! timeline {
    () => {
        "(('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint)"
    };
}

/// The first token of the effective epoch, `(epoch << 32) + 1`: migration
/// 0002's PL/pgSQL function, which reads the stored epoch and the timeline.
/// A function rather than a subquery so that a losing acquire's plan does
/// not even open `fencecron_epoch`.
macro_rules! epoch_floor {
    () => {
        "fencecron_token_floor()"
    };
}

mod hosts;
// Its statement macros (`takeable!`, `due!`, `pause_holds!`) are the claim's too.
#[macro_use]
mod lease;
mod claim;
mod values;

pub(crate) use hosts::{first_connection, host_options, Hosts, NoHost};
use lease::*;
use values::*;

/// The PostgreSQL dialect: with the hosts of a multi-host URL (or one
/// with a `target_session_attrs` to check), which every call watches.
pub(super) struct Pg {
    pub(super) hosts: Option<Arc<Hosts>>,
}

/// The PostgreSQL store.
pub(super) type PostgresStore = SqlStore<Pg>;

impl PostgresStore {
    /// Prepares a lazily connecting pool.
    pub fn open(url: StoreUrl, opts: &OpenOptions) -> Result<Self, StoreError> {
        let hosts = Hosts::new(&url, "fencecron", opts.call_timeout)?;
        let env_chose = std::env::var_os("PGSSLMODE").is_some();
        let connect: PgConnectOptions = match &hosts {
            Some(h) => h.first_options(),
            None => host_options(&url, 0, "fencecron", env_chose)?,
        };
        let tune = |pool| match &hosts {
            Some(h) => h.pool_options(pool),
            None => pool,
        };
        let db = Db::connect_lazy(url, opts, connect, tune);
        Ok(SqlStore::new(db, Pg { hosts }))
    }
}

/// Whether TLS would only cost time: the server is on this host (a
/// loopback address or `localhost`), and neither the URL (`sslmode`) nor
/// `PGSSLMODE` asks for anything. libpq's and sqlx's default, `prefer`,
/// would wrap every loopback round trip in TLS: about 17 µs each here
/// (BENCHMARKS.md, "The client path"), and sqlx adds a second round trip
/// per call (its ping when a connection returns to the pool).
pub(super) fn loopback_without_ssl_choice(url: &str, host: &str, env_chose: bool) -> bool {
    let chosen_in_url = ::url::Url::parse(url).is_ok_and(|u| {
        u.query_pairs()
            .any(|(k, _)| k == "sslmode" || k == "ssl-mode")
    });
    if chosen_in_url || env_chose {
        return false;
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

impl Pg {
    async fn epoch_of<'e, E>(db: &Db<Postgres>, ex: E) -> Sql<EpochInfo>
    where
        E: sqlx::PgExecutor<'e>,
    {
        let row = sqlx::query(EPOCH).fetch_one(ex).await?;
        let info = EpochInfo::new(
            row.try_get("stored")?,
            Some(row.try_get("timeline")?),
            row.try_get("highest")?,
        );
        let effective: i64 = row.try_get("effective")?;
        if effective != info.effective {
            return Err(StoreError::Corrupt {
                url: db.url.to_string(),
                detail: format!(
                    "fencecron_token_floor() says epoch {effective}, fencecron computes {}; was the function changed?",
                    info.effective
                ),
            }
            .into());
        }
        Ok(info)
    }
}

/// A node's heartbeat in one statement: the store's clock read once (`t`),
/// the node's row upserted with it (`$1`..`$8`; `$6`, `started_at`, NULL
/// on the first beat: this beat's time), and the rows live at that time
/// answered (`$9` = `stopped`, `$10` = `NODE_LIVE` in ms: `NodeInfo::live`),
/// each with the time; one row with a NULL node when none is. The node's
/// own row comes from `RETURNING`: the main query's snapshot does not see
/// the upsert, so the table read leaves that node out.
const BEAT: &str = concat!(
    "WITH t AS (SELECT ",
    now_ms!(),
    " AS now_ms),
beat AS (
  INSERT INTO fencecron_nodes AS n
    (node, seen_ms, hostname, pid, version, config_digest, started_at_ms, state, running)
  SELECT $1, t.now_ms, $2, $3, $4, $5, COALESCE($6::bigint, t.now_ms), $7, $8 FROM t
  ON CONFLICT (node) DO UPDATE
     SET seen_ms = excluded.seen_ms, hostname = excluded.hostname, pid = excluded.pid,
         version = excluded.version, config_digest = excluded.config_digest,
         started_at_ms = excluded.started_at_ms, state = excluded.state,
         running = excluded.running
  RETURNING n.node, n.seen_ms, n.hostname, n.pid, n.version, n.config_digest,
            n.started_at_ms, n.state, n.running
),
nodes AS (
  SELECT * FROM beat
  UNION ALL
  SELECT node, seen_ms, hostname, pid, version, config_digest, started_at_ms, state, running
    FROM fencecron_nodes WHERE node NOT IN (SELECT node FROM beat)
)
SELECT t.now_ms, l.node, l.seen_ms, l.hostname, l.pid, l.version, l.config_digest,
       l.started_at_ms, l.state, l.running
  FROM t LEFT JOIN nodes l ON l.state <> $9 AND l.seen_ms > t.now_ms - $10
 ORDER BY l.node"
);

#[async_trait]
impl Dialect for Pg {
    type DB = Postgres;
    const BACKEND: Backend = Backend::Postgres;
    const GET: &'static str = GET;
    const STALE: &'static str = STALE;
    const LATEST_STALE: &'static str = LATEST_STALE;
    const LIST: &'static str = LIST;
    const PUT_STATE: &'static str = PUT_STATE;
    const EPOCH: &'static str = EPOCH;
    const ADVANCE_EPOCH: &'static str = ADVANCE_EPOCH;
    const ADMIT_STATE: &'static str = ADMIT_STATE;
    const ADMIT_RAISE: &'static str = ADMIT_RAISE;
    // Not `async fn`: under `#[async_trait]` it would become a boxed
    // future, which is not the trait's signature.
    #[allow(clippy::manual_async_fn)]
    fn watch<'a, T, F>(
        &'a self,
        db: &'a Db<Postgres>,
        op: F,
    ) -> impl std::future::Future<Output = T> + Send + 'a
    where
        T: Send + 'a,
        F: std::future::Future<Output = T> + Send + 'a,
    {
        async move {
            match &self.hosts {
                None => op.await,
                Some(h) => hosts::watched(h, &db.pool, op).await,
            }
        }
    }

    /// With several hosts: a write refused as read-only retires the pooled
    /// connections, and a call that could not connect fails with every
    /// host's reason when the last walk found none.
    fn error(&self, url: &StoreUrl, e: sqlx::Error) -> StoreError {
        let Some(h) = &self.hosts else {
            return unavailable(url, e);
        };
        h.saw(&e);
        let connecting =
            matches!(e, sqlx::Error::PoolTimedOut | sqlx::Error::Io(_)) && NoHost::of(&e).is_none();
        match h.recent_failure() {
            Some(no) if connecting => unavailable(url, no.into_sqlx()),
            _ => unavailable(url, e),
        }
    }

    async fn migrate(&self, db: &Db<Postgres>) -> Result<(), StoreError> {
        // Under fencecron's advisory lock, so many instances starting at
        // once apply each migration exactly once.
        timed(&db.url, db.call_timeout * 3, async {
            let fail = |source| migrate_error(Backend::Postgres, &db.url, source);
            let mut conn = first_connection(self.hosts.as_deref(), &db.pool)
                .await
                .map_err(|e| unavailable(&db.url, e))?;
            let key = super::migrator::lock_postgres(&mut conn)
                .await
                .map_err(fail)?;
            let result = super::migrator::run::<Postgres>(
                &mut conn,
                Backend::Postgres,
                &sqlx::migrate!("migrations/postgres"),
                &db.hook,
            )
            .await;
            if super::migrator::unlock_postgres(&mut conn, key)
                .await
                .is_err()
            {
                // Never pool a connection that may still hold the lock.
                drop(conn.detach());
            }
            result.map_err(fail)
        })
        .await
    }

    async fn acquire(&self, db: &Db<Postgres>, req: &AcquireRequest<'_>) -> Sql<AcquireOutcome> {
        self.acquire_lease(db, req).await
    }

    async fn claim(&self, db: &Db<Postgres>, req: &ClaimRequest<'_>) -> Sql<ClaimOutcome> {
        self.claim_leases(db, req).await
    }

    async fn renew(
        &self,
        db: &Db<Postgres>,
        resource: &Name,
        owner_id: OwnerId,
        token: Token,
        lease: Duration,
    ) -> Sql<RenewOutcome> {
        let renewed: Option<i64> = sqlx::query_scalar(RENEW)
            .bind(resource.as_str())
            .bind(owner_id.as_str())
            .bind(token)
            .bind(millis(lease))
            .fetch_optional(&db.pool)
            .await?;
        Ok(match renewed {
            Some(at) => RenewOutcome::Renewed {
                expires_at: StoreTime(at),
            },
            None => RenewOutcome::Refused(classify_refusal(
                Postgres::lease_row(&db.pool, LEASE_ROW, resource).await?,
                owner_id,
                token,
            )),
        })
    }

    async fn release(
        &self,
        db: &Db<Postgres>,
        resource: &Name,
        owner_id: OwnerId,
        token: Option<Token>,
        occurrence: Option<StoreTime>,
    ) -> Sql<ReleaseOutcome> {
        let query = match occurrence {
            None => sqlx::query_scalar(RELEASE),
            Some(_) => sqlx::query_scalar(GIVE_BACK),
        };
        let mut query = query
            .bind(resource.as_str())
            .bind(owner_id.as_str())
            .bind(token);
        if let Some(occ) = occurrence {
            query = query.bind(occ.0);
        }
        let released: Option<i64> = query.fetch_optional(&db.pool).await?;
        Ok(match released {
            Some(_) => ReleaseOutcome::Released,
            None => ReleaseOutcome::Refused(classify_refusal(
                Postgres::lease_row(&db.pool, LEASE_ROW, resource).await?,
                owner_id,
                token.unwrap_or_default(),
            )),
        })
    }

    async fn finish_and_release(
        &self,
        db: &Db<Postgres>,
        resource: &Name,
        owner_id: OwnerId,
        end: &RunEnd<'_>,
    ) -> Sql<Option<(bool, ReleaseOutcome)>> {
        let row = super::fleet::bind_end(sqlx::query(&FINISH_AND_RELEASE), end)
            .bind(owner_id.as_str())
            .fetch_one(&db.pool)
            .await?;
        let finished = row.try_get::<i64, _>("finished")? > 0;
        let released = if row.try_get::<i64, _>("released")? > 0 {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::Refused(classify_refusal(
                Postgres::lease_row(&db.pool, LEASE_ROW, resource).await?,
                owner_id,
                end.token,
            ))
        };
        Ok(Some((finished, released)))
    }

    async fn give_back_unseen(&self, db: &Db<Postgres>, items: &[Unseen<'_>]) -> Sql<Vec<bool>> {
        let resources: Vec<&str> = items.iter().map(|i| i.resource.as_str()).collect();
        let owners: Vec<String> = items.iter().map(|i| i.owner_id.to_string()).collect();
        let occs: Vec<i64> = items.iter().map(|i| i.occurrence.0).collect();
        let given: Vec<i64> = sqlx::query_scalar(GIVE_BACK_UNSEEN)
            .bind(&resources)
            .bind(&owners)
            .bind(&occs)
            .fetch_all(&db.pool)
            .await?;
        let mut out = vec![false; items.len()];
        for ord in given {
            if let Some(g) = usize::try_from(ord - 1).ok().and_then(|i| out.get_mut(i)) {
                *g = true;
            }
        }
        Ok(out)
    }

    async fn put_write(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        req: &PutRequest<'_>,
        op: &str,
        _now: Option<i64>,
    ) -> Sql<Written> {
        let written = sqlx::query(PUT)
            .bind(req.resource.as_str())
            .bind(req.key.as_str())
            .bind(req.value)
            .bind(req.token)
            .bind(req.owner_id.as_str())
            .bind(op)
            .bind(req.once)
            .fetch_optional(&mut **tx)
            .await?;
        Ok(match written {
            Some(row) => Written::At(row.try_get("written_at_ms")?),
            None => Written::Refused(None),
        })
    }

    async fn insert_stale(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        rec: &NewStaleRecord<'_>,
        _now: Option<i64>,
    ) -> Sql<i64> {
        Ok(insert_stale(&mut **tx, rec).await?)
    }

    /// Without a transaction: one statement.
    async fn record_stale(&self, db: &Db<Postgres>, rec: &NewStaleRecord<'_>) -> Sql<StaleRecord> {
        let at = insert_stale(&db.pool, rec).await?;
        Ok(rec.stored(at))
    }

    /// One statement ([`BEAT`]).
    async fn beat(
        &self,
        db: &Db<Postgres>,
        _fleet: &super::fleet::FleetSql,
        beat: &NodeBeat<'_>,
    ) -> Sql<BeatAnswer> {
        let rows = sqlx::query(BEAT)
            .bind(beat.node)
            .bind(beat.hostname)
            .bind(i64::from(beat.pid))
            .bind(beat.version)
            .bind(beat.config_digest)
            .bind(beat.started_at.map(|t| t.0))
            .bind(beat.state.as_str())
            .bind(i64::from(beat.running))
            .bind(crate::domain::NodeState::Stopped.as_str())
            .bind(millis(NODE_LIVE))
            .fetch_all(&db.pool)
            .await?;
        Ok(super::fleet::beat_answer(&rows)?)
    }

    async fn now(&self, db: &Db<Postgres>) -> Sql<StoreTime> {
        let now: i64 = sqlx::query_scalar(concat!("SELECT ", now_ms!()))
            .fetch_one(&db.pool)
            .await?;
        Ok(StoreTime(now))
    }

    /// With the timeline, checked against `fencecron_token_floor()`.
    async fn epoch(&self, db: &Db<Postgres>) -> Sql<EpochInfo> {
        Pg::epoch_of(db, &db.pool).await
    }

    async fn advance_epoch(&self, db: &Db<Postgres>) -> Sql<EpochInfo> {
        let mut tx = db.pool.begin().await?;
        sqlx::query(ADVANCE_EPOCH).execute(&mut *tx).await?;
        let info = Pg::epoch_of(db, &mut *tx).await?;
        tx.commit().await?;
        Ok(info)
    }
}

#[async_trait]
impl RawDialect for Pg {
    async fn raw_write(
        &self,
        db: &Db<Postgres>,
        op: RawOp,
        r: &str,
        owner_id: &str,
        token: Token,
    ) -> Sql<Option<Token>> {
        let lease = millis(MIN_LEASE);
        Ok(match op {
            RawOp::AcquireFree | RawOp::AcquireHeld => {
                let rows = sqlx::query(ACQUIRE)
                    .bind(r)
                    .bind(owner_id)
                    .bind("bench")
                    .bind(lease)
                    .bind(None::<i64>)
                    .bind(None::<i64>)
                    .bind(None::<&str>)
                    .bind(StartedBy::Schedule.as_str())
                    .bind(None::<i64>)
                    .fetch_all(&db.pool)
                    .await?;
                rows.first()
                    .and_then(|row| row.try_get::<Token, _>("fence").ok())
            }
            RawOp::Renew => {
                sqlx::query(RENEW)
                    .bind(r)
                    .bind(owner_id)
                    .bind(token)
                    .bind(lease)
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
                // The same statement `put` sends, in the same kind of
                // transaction.
                let mut tx = db.pool.begin().await?;
                sqlx::query(PUT)
                    .bind(r)
                    .bind("bench")
                    .bind(&b"bench"[..])
                    .bind(token)
                    .bind(owner_id)
                    .bind(owner_id)
                    .bind(false)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                None
            }
        })
    }

    async fn purge(&self, db: &Db<Postgres>, prefix: &str) -> Sql<u64> {
        let pattern = format!("{}%", like_escape(prefix));
        Ok(Postgres::execute_each(
            &db.pool,
            &[
                "DELETE FROM fencecron_values WHERE resource LIKE $1 ESCAPE '\\'",
                "DELETE FROM fencecron_stale WHERE resource LIKE $1 ESCAPE '\\'",
                "DELETE FROM fencecron_leases WHERE resource LIKE $1 ESCAPE '\\'",
            ],
            &pattern,
        )
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::loopback_without_ssl_choice as plain;

    #[test]
    fn tls_is_left_out_only_on_loopback_when_nobody_asked_for_it() {
        assert!(plain("postgres://u@127.0.0.1/db", "127.0.0.1", false));
        assert!(plain("postgres://u@127.0.0.2:5433/db", "127.0.0.2", false));
        assert!(plain("postgres://u@localhost/db", "localhost", false));
        assert!(plain("postgres://u@[::1]/db", "[::1]", false));
        assert!(plain("postgres://u@[::1]/db", "::1", false));
        // Another host, an explicit choice in the URL or in PGSSLMODE: as asked.
        assert!(!plain("postgres://u@db.internal/db", "db.internal", false));
        assert!(!plain("postgres://u@10.0.0.5/db", "10.0.0.5", false));
        assert!(!plain(
            "postgres://u@127.0.0.1/db?sslmode=require",
            "127.0.0.1",
            false
        ));
        assert!(!plain(
            "postgres://u@127.0.0.1/db?ssl-mode=prefer",
            "127.0.0.1",
            false
        ));
        assert!(!plain("postgres://u@127.0.0.1/db", "127.0.0.1", true));
    }
}

//! The fenced values' and the rest of the reads' statements on
//! PostgreSQL: `put` and what beat it, stale-owner records, the fencing
//! proxy, `get`, `lease list`.

use super::*;

pub(super) const LEASE_ROW: &str =
    "SELECT owner_id, fence, expires_at_ms FROM fencecron_leases WHERE resource = $1";

pub(super) const LIST: &str = concat!(
    "SELECT resource, owner_id, node, fence, expires_at_ms, last_occurrence_ms, ",
    now_ms!(),
    " AS now_ms FROM fencecron_leases
     WHERE forgotten_at_ms IS NULL OR acquired_at_ms >= forgotten_at_ms ORDER BY resource"
);

/// The conditional write: writes only when the token is the resource's
/// fence and was issued to this owner (the lease row as the statement's
/// snapshot sees it), and on an existing key only when the token is at
/// least (or, for `once`, above) the accepted one.
pub(super) const PUT: &str = concat!(
    "INSERT INTO fencecron_values AS v
       (resource, key, value, token, owner_id, operation_id, written_at_ms)
     SELECT $1, $2, $3, $4, $5, $6, ",
    now_ms!(),
    "
       FROM fencecron_leases l WHERE l.resource = $1 AND l.fence = $4 AND l.owner_id = $5
     ON CONFLICT (resource, key) DO UPDATE
        SET value = EXCLUDED.value, token = EXCLUDED.token, owner_id = EXCLUDED.owner_id,
            operation_id = EXCLUDED.operation_id, written_at_ms = EXCLUDED.written_at_ms
      WHERE v.token < EXCLUDED.token OR (v.token = EXCLUDED.token AND NOT $7)
     RETURNING written_at_ms"
);

/// After a refused write, within the same transaction: what beat it.
pub(super) const PUT_STATE: &str = "SELECT
       (SELECT token FROM fencecron_values WHERE resource = $1 AND key = $2) AS accepted,
       (SELECT fence FROM fencecron_leases WHERE resource = $1) AS issued,
       (SELECT owner_id FROM fencecron_leases WHERE resource = $1) AS issued_to";

pub(super) const INSERT_STALE: &str = concat!(
    "INSERT INTO fencecron_stale
       (at_ms, kind, reason, resource, key, owner_id, token, accepted_token, node, job, stage, operation_id)
     VALUES (",
    now_ms!(),
    ", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
     RETURNING at_ms"
);

/// The fencing proxy's read: the highest token admitted for the resource
/// and the resource's fence.
pub(super) const ADMIT_STATE: &str =
    "SELECT (SELECT highest FROM fencecron_proxy_fences WHERE resource = $1) AS highest,
            (SELECT fence FROM fencecron_leases WHERE resource = $2) AS issued";

/// The fencing proxy's raise: only a token the lease row issued, only
/// upwards.
pub(super) const ADMIT_RAISE: &str = "INSERT INTO fencecron_proxy_fences AS f (resource, highest)
 SELECT $1, $2 FROM fencecron_leases l WHERE l.resource = $3 AND l.fence >= $4 AND $5 > 0
 ON CONFLICT (resource) DO UPDATE SET highest = excluded.highest
  WHERE f.highest < excluded.highest";

pub(super) const GET: &str = "SELECT value, token, owner_id, written_at_ms FROM fencecron_values
                    WHERE resource = $1 AND key = $2";

pub(super) const STALE: &str =
    "SELECT at_ms, kind, reason, resource, key, owner_id, token, accepted_token,
                            node, job, stage, operation_id
                       FROM fencecron_stale WHERE at_ms >= $1 ORDER BY at_ms, id";

/// `latest_stale`: the newest first, bounded.
pub(super) const LATEST_STALE: &str = "SELECT at_ms, kind, reason, resource, key, owner_id, token, accepted_token,
                            node, job, stage, operation_id
                       FROM fencecron_stale WHERE at_ms >= $1 ORDER BY at_ms DESC, id DESC LIMIT $2";

/// Inserts a stale record and returns its store time.
pub(super) async fn insert_stale<'e, E>(ex: E, rec: &NewStaleRecord<'_>) -> Result<i64, sqlx::Error>
where
    E: sqlx::PgExecutor<'e>,
{
    Postgres::bind_stale(sqlx::query(INSERT_STALE), rec)
        .fetch_one(ex)
        .await?
        .try_get("at_ms")
}

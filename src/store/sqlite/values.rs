//! The fenced values' and the rest of the reads' statements on SQLite:
//! `put` and what beat it, stale-owner records, the fencing proxy, `get`,
//! `lease list`.

use super::*;

/// The conditional write; the `WHERE` before `ON CONFLICT` (which SQLite's
/// grammar needs for INSERT … SELECT … ON CONFLICT) binds the token to its
/// resource and owner: it must be the fence, issued to this owner id.
pub(super) const PUT: &str = "INSERT INTO fencecron_values AS v
   (resource, key, value, token, owner_id, operation_id, written_at_ms)
 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
   FROM fencecron_leases l WHERE l.resource = ?1 AND l.fence = ?4 AND l.owner_id = ?5
 ON CONFLICT (resource, key) DO UPDATE
    SET value = excluded.value, token = excluded.token, owner_id = excluded.owner_id,
        operation_id = excluded.operation_id, written_at_ms = excluded.written_at_ms
  WHERE v.token < excluded.token OR (v.token = excluded.token AND NOT ?8)";

/// The fencing proxy's read: the highest token admitted for the resource
/// and the resource's fence.
pub(super) const ADMIT_STATE: &str =
    "SELECT (SELECT highest FROM fencecron_proxy_fences WHERE resource = ?1) AS highest,
            (SELECT fence FROM fencecron_leases WHERE resource = ?2) AS issued";

/// The fencing proxy's raise: only a token the lease row issued, only
/// upwards.
pub(super) const ADMIT_RAISE: &str = "INSERT INTO fencecron_proxy_fences AS f (resource, highest)
 SELECT ?1, ?2 FROM fencecron_leases l WHERE l.resource = ?3 AND l.fence >= ?4 AND ?5 > 0
 ON CONFLICT (resource) DO UPDATE SET highest = excluded.highest
  WHERE f.highest < excluded.highest";

pub(super) const GET: &str = "SELECT value, token, owner_id, written_at_ms FROM fencecron_values
  WHERE resource = ?1 AND key = ?2";

pub(super) const LEASE_ROW: &str =
    "SELECT owner_id, fence, expires_at_ms FROM fencecron_leases WHERE resource = ?1";

pub(super) const LIST: &str =
    "SELECT resource, owner_id, node, fence, expires_at_ms, last_occurrence_ms
                      FROM fencecron_leases
                     WHERE forgotten_at_ms IS NULL OR acquired_at_ms >= forgotten_at_ms
                     ORDER BY resource";

/// After a refused write, within the same transaction: what beat it.
pub(super) const PUT_STATE: &str =
    "SELECT (SELECT token FROM fencecron_values WHERE resource = ?1 AND key = ?2) AS accepted,
            (SELECT fence FROM fencecron_leases WHERE resource = ?1) AS issued,
            (SELECT owner_id FROM fencecron_leases WHERE resource = ?1) AS issued_to";

pub(super) const STALE: &str =
    "SELECT at_ms, kind, reason, resource, key, owner_id, token, accepted_token,
                            node, job, stage, operation_id
                       FROM fencecron_stale WHERE at_ms >= ?1 ORDER BY at_ms, id";

/// `latest_stale`: the newest first, bounded.
pub(super) const LATEST_STALE: &str = "SELECT at_ms, kind, reason, resource, key, owner_id, token, accepted_token,
                            node, job, stage, operation_id
                       FROM fencecron_stale WHERE at_ms >= ?1 ORDER BY at_ms DESC, id DESC LIMIT ?2";

pub(super) async fn insert_stale(
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

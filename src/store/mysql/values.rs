//! The fenced values' and the rest of the reads' statements on
//! MySQL/MariaDB: `put` and what beat it, stale-owner records, the fencing
//! proxy, `get`, `lease list`.

use super::*;

pub(super) const LIST: &str = concat!(
    "SELECT CAST(resource AS CHAR CHARACTER SET utf8mb4) AS resource, owner_id, node, fence,
            expires_at_ms, last_occurrence_ms, ",
    now_ms!(),
    " AS now_ms FROM fencecron_leases
     WHERE forgotten_at_ms IS NULL OR acquired_at_ms >= forgotten_at_ms ORDER BY resource"
);

/// The conditional write. Writes only when the token is the resource's
/// fence and was issued to this owner; on an existing key, every column
/// changes only when the token is at least (with `once`: above) the accepted
/// one. `token` is assigned last because MySQL evaluates the assignments
/// left to right and the earlier conditions must see the old token.
pub(super) const PUT: &str = concat!(
    "INSERT INTO fencecron_values
       (resource, key_name, value, token, owner_id, operation_id, written_at_ms)
     SELECT ?, ?, ?, ?, ?, ?, ",
    now_ms!(),
    " FROM fencecron_leases l WHERE l.resource = ? AND l.fence = ? AND l.owner_id = ?
     ON DUPLICATE KEY UPDATE
       value = IF(fencecron_values.token < VALUES(token) OR (fencecron_values.token = VALUES(token) AND NOT ?), VALUES(value), fencecron_values.value),
       owner_id = IF(fencecron_values.token < VALUES(token) OR (fencecron_values.token = VALUES(token) AND NOT ?), VALUES(owner_id), fencecron_values.owner_id),
       written_at_ms = IF(fencecron_values.token < VALUES(token) OR (fencecron_values.token = VALUES(token) AND NOT ?), VALUES(written_at_ms), fencecron_values.written_at_ms),
       operation_id = IF(fencecron_values.token < VALUES(token) OR (fencecron_values.token = VALUES(token) AND NOT ?), VALUES(operation_id), fencecron_values.operation_id),
       token = IF(fencecron_values.token < VALUES(token) OR (fencecron_values.token = VALUES(token) AND NOT ?), VALUES(token), fencecron_values.token)"
);

pub(super) const PUT_STATE: &str = "SELECT
       (SELECT operation_id FROM fencecron_values WHERE resource = ? AND key_name = ?) AS op,
       (SELECT written_at_ms FROM fencecron_values WHERE resource = ? AND key_name = ?) AS written_at,
       (SELECT token FROM fencecron_values WHERE resource = ? AND key_name = ?) AS accepted,
       (SELECT fence FROM fencecron_leases WHERE resource = ?) AS issued,
       (SELECT owner_id FROM fencecron_leases WHERE resource = ?) AS issued_to";

pub(super) const INSERT_STALE: &str = concat!(
    "INSERT INTO fencecron_stale
       (at_ms, kind, reason, resource, key_name, owner_id, token, accepted_token, node, job, stage, operation_id)
     VALUES (",
    now_ms!(),
    ", ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
);

/// The fencing proxy's read: the highest token admitted for the resource
/// and the resource's fence.
pub(super) const ADMIT_STATE: &str =
    "SELECT (SELECT highest FROM fencecron_proxy_fences WHERE resource = ?) AS highest,
            (SELECT fence FROM fencecron_leases WHERE resource = ?) AS issued";

/// The fencing proxy's raise: only a token the lease row issued, only
/// upwards.
pub(super) const ADMIT_RAISE: &str = "INSERT INTO fencecron_proxy_fences (resource, highest)
 SELECT ?, ? FROM fencecron_leases l WHERE l.resource = ? AND l.fence >= ? AND ? > 0
 ON DUPLICATE KEY UPDATE highest = GREATEST(highest, VALUES(highest))";

pub(super) const GET: &str = "SELECT value, token, owner_id, written_at_ms FROM fencecron_values
                    WHERE resource = ? AND key_name = ?";

/// Names are stored as bytes (VARBINARY); they are read back as text under
/// the column names every backend uses.
pub(super) const STALE: &str = "SELECT at_ms, kind, reason,
            CAST(resource AS CHAR CHARACTER SET utf8mb4) AS resource,
            CAST(key_name AS CHAR CHARACTER SET utf8mb4) AS `key`, owner_id, token, accepted_token,
                            node, job, stage, operation_id
                       FROM fencecron_stale WHERE at_ms >= ? ORDER BY at_ms, id";

/// `latest_stale`: the newest first, bounded.
pub(super) const LATEST_STALE: &str = "SELECT at_ms, kind, reason,
            CAST(resource AS CHAR CHARACTER SET utf8mb4) AS resource,
            CAST(key_name AS CHAR CHARACTER SET utf8mb4) AS `key`, owner_id, token, accepted_token,
                            node, job, stage, operation_id
                       FROM fencecron_stale WHERE at_ms >= ? ORDER BY at_ms DESC, id DESC LIMIT ?";

/// MySQL's error number for a packet larger than `max_allowed_packet`.
pub(super) const ER_NET_PACKET_TOO_LARGE: u16 = 1153;

impl My {
    /// The key's row and the lease row after a write ([`PUT_STATE`]).
    pub(super) async fn put_row(
        tx: &mut Transaction<'static, MySql>,
        req: &PutRequest<'_>,
    ) -> Result<sqlx::mysql::MySqlRow, sqlx::Error> {
        let r = req.resource.as_str();
        let k = req.key.as_str();
        sqlx::query(PUT_STATE)
            .bind(r)
            .bind(k)
            .bind(r)
            .bind(k)
            .bind(r)
            .bind(k)
            .bind(r)
            .bind(r)
            .fetch_one(&mut **tx)
            .await
    }

    pub(super) async fn insert_stale(
        tx: &mut Transaction<'static, MySql>,
        rec: &NewStaleRecord<'_>,
    ) -> Result<i64, sqlx::Error> {
        let done = MySql::bind_stale(sqlx::query(INSERT_STALE), rec)
            .execute(&mut **tx)
            .await?;
        sqlx::query_scalar("SELECT at_ms FROM fencecron_stale WHERE id = ?")
            .bind(done.last_insert_id())
            .fetch_one(&mut **tx)
            .await
    }
}

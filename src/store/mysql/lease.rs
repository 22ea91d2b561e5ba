//! The lease's statements on MySQL/MariaDB (acquire is a call of the
//! migrations' procedure; renew, release, give back, epoch) and the
//! operation whose shape they dictate, the single acquire. The batch claim
//! is `claim.rs`.

use super::*;

/// The acquisition: the procedure of migration 0005 (0004's with the
/// pause check and the run row), which holds the conditional `UPDATE`.
pub(super) const CALL_ACQUIRE: &str = "CALL fencecron_acquire_v3(?, ?, ?, ?, ?, ?, ?, ?, ?)";

pub(super) const RENEW: &str = concat!(
    "UPDATE fencecron_leases SET expires_at_ms = LAST_INSERT_ID(",
    now_ms!(),
    " + ?) WHERE resource = ? AND owner_id = ? AND fence = ? AND expires_at_ms > ",
    now_ms!()
);

pub(super) const RELEASE: &str = concat!(
    "UPDATE fencecron_leases SET expires_at_ms = LEAST(expires_at_ms, ",
    now_ms!(),
    "), released = TRUE WHERE resource = ? AND owner_id = ? AND fence = ?"
);

/// `give_back`: a release that also makes the occurrence takeable again
/// when it is still the last one taken (`occurrence - 1` keeps older
/// instants refused). The `WHERE` sees the row before the `SET`. Without a
/// token: this owner's unreleased win of exactly this occurrence.
pub(super) const GIVE_BACK: &str = concat!(
    "UPDATE fencecron_leases
        SET last_occurrence_ms = IF(last_occurrence_ms = ?, ? - 1, last_occurrence_ms),
            expires_at_ms = LEAST(expires_at_ms, ",
    now_ms!(),
    "), released = TRUE
      WHERE resource = ? AND owner_id = ?
        AND (fence = ? OR (? IS NULL AND NOT released AND last_occurrence_ms = ?))"
);

/// `fencecron epoch`: the stored epoch and the highest fence.
pub(super) const EPOCH: &str =
    "SELECT COALESCE((SELECT epoch FROM fencecron_epoch WHERE id = 1), 0) AS stored,
            (SELECT MAX(fence) FROM fencecron_leases) AS highest";

/// `fencecron epoch advance`: max(stored, highest fence >> 32) + 1, in one
/// transaction with the read of the result. The read of the leases is a
/// locking read inside the `INSERT … SELECT`, so an acquire still running
/// with the old epoch finishes first or waits for the new one.
pub(super) const ADVANCE_EPOCH: &str = "INSERT INTO fencecron_epoch (id, epoch)
     SELECT 1, COALESCE(MAX(fence), 0) DIV 4294967296 + 1 FROM fencecron_leases
     ON DUPLICATE KEY UPDATE epoch = GREATEST(fencecron_epoch.epoch, VALUES(epoch) - 1) + 1";

pub(super) const LEASE_ROW: &str =
    "SELECT owner_id, fence, expires_at_ms FROM fencecron_leases WHERE resource = ?";

impl My {
    /// One `CALL fencecron_acquire_v3(…)` (migration 0005): the pause check,
    /// the conditional
    /// `UPDATE` (or the first `INSERT` of the row) and the read of the
    /// row after it, and a winner's run row, run on the server, so a winner
    /// learns its expiry and a loser who holds the lease in one round trip.
    pub(super) async fn acquire_lease(
        &self,
        db: &Db<MySql>,
        req: &AcquireRequest<'_>,
    ) -> Sql<AcquireOutcome> {
        let owner = req.owner_id;
        let (job, started_by, scheduled_at) = run_binds(req);
        let row = sqlx::query(CALL_ACQUIRE)
            .bind(req.resource.as_str())
            .bind(owner.to_string())
            .bind(req.node)
            .bind(millis(req.lease))
            .bind(req.occurrence.map(|o| o.0))
            .bind(req.next_occurrence.map(|o| o.0))
            .bind(job)
            .bind(started_by)
            .bind(scheduled_at)
            .fetch_one(&db.pool)
            .await?;
        // Read by position: sqlx describes a CALL without its result's
        // column names.
        let won: i64 = row.try_get(0)?;
        let fence: Option<Token> = row.try_get(1)?;
        let owner_id: Option<OwnerId> = row.try_get(2)?;
        let node: Option<String> = row.try_get(3)?;
        let expires_at: Option<i64> = row.try_get(4)?;
        let last_occurrence: Option<i64> = row.try_get(5)?;
        let now: i64 = row.try_get(6)?;
        let taken_over = rows::takeover(&row, [7, 8, 9, 10])?;
        if won == 0 && row.try_get::<i64, _>(11)? == 1 {
            let pause = PauseSeen {
                note: row.try_get(12)?,
                until: row.try_get(14)?,
                first: row.try_get::<i64, _>(15)? == 1,
            };
            return Ok(classify_paused(pause, req, now));
        }
        let (Some(fence), Some(owner_id), Some(node), Some(expires_at)) =
            (fence, owner_id, node, expires_at)
        else {
            // No row: only an occurrence not yet due, or already
            // superseded, keeps the first acquisition from creating it.
            return match (req.occurrence, req.next_occurrence) {
                (Some(occ), _) if occ.0 > now => Ok(AcquireOutcome::NotYetDue {
                    store_now: StoreTime(now),
                }),
                (_, Some(next)) if next.0 <= now => Ok(AcquireOutcome::Superseded {
                    store_now: StoreTime(now),
                }),
                _ => Err(StoreError::Corrupt {
                    url: db.url.to_string(),
                    detail: format!(
                        "the lease row for {} neither exists nor can be created",
                        req.resource
                    ),
                }
                .into()),
            };
        };
        if won == 1 && owner == owner_id {
            return Ok(AcquireOutcome::Acquired(Lease {
                resource: req.resource.to_string(),
                owner_id: owner,
                token: fence,
                expires_at: StoreTime(expires_at),
                taken_over,
            }));
        }
        Ok(classify_loss(
            LossRow {
                fence,
                owner_id,
                node,
                expires_at,
                last_occurrence,
                now,
            },
            req,
        ))
    }
}

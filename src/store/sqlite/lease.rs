//! The lease's statements on SQLite (acquire, claim, renew, release, give
//! back, epoch) and the operation whose shape they dictate, the single
//! acquire, in one `BEGIN IMMEDIATE` transaction. The batch claim, which
//! shares the takeable rule's macros and statements here, is `claim.rs`.

use super::*;

/// The first token of the stored epoch, `(epoch << 32) + 1` (SQLite has no
/// timeline: the epoch is only the stored one).
macro_rules! epoch_floor {
    () => {
        "((COALESCE((SELECT e.epoch FROM fencecron_epoch e WHERE e.id = 1), 0) << 32) + 1)"
    };
}

/// The adoption condition on the row as it was: this owner won this
/// occurrence and has not released it (never true for ad-hoc leases, `?6`
/// NULL). See the PostgreSQL store for why a retry adopts its own win.
macro_rules! adopt {
    () => {
        "(owner_id = ?2 AND last_occurrence_ms = ?6 AND NOT released)"
    };
}

/// The rule "this occurrence is takeable", the one text of it on SQLite
/// (the acquire's `UPDATE`, the claim's read): the lease expired at `$now`
/// (the kernel's clock, bound) and the instant `$occ` (NULL: an ad-hoc
/// lease) newer than the last one taken (or `$adopt`: the acquire's
/// adoption of its own win, `0` for a claim), the instant due and its
/// successor `$next` not. Whether the job is paused is [`PAUSED`], read
/// first in the same write transaction by both.
macro_rules! takeable {
    ($now:expr, $occ:expr, $next:expr, $adopt:expr) => {
        concat!(
            "((expires_at_ms <= ",
            $now,
            " AND (",
            $occ,
            " IS NULL OR last_occurrence_ms IS NULL OR last_occurrence_ms < ",
            $occ,
            ")) OR ",
            $adopt,
            ") AND (",
            $occ,
            " IS NULL OR ",
            $occ,
            " <= ",
            $now,
            ") AND (",
            $next,
            " IS NULL OR ",
            $next,
            " > ",
            $now,
            ")"
        )
    };
}

/// The winning acquire: `prev_*` copy the vanished owner when the previous
/// generation was not released (every `SET` expression sees the old row),
/// and the fence moves to at least the epoch's first token. The epoch
/// subquery runs only for a row that matched: a losing acquire reads and
/// writes nothing more than before. An adopted win keeps its token and
/// `prev_*`, and its expiry becomes at least now + lease. Refused once the
/// job's next instant (`?7`) is due.
pub(super) const ACQUIRE: &str = concat!(
    "UPDATE fencecron_leases
    SET prev_owner_id = CASE WHEN ",
    adopt!(),
    " THEN prev_owner_id WHEN released THEN NULL ELSE owner_id END,
        prev_node = CASE WHEN ",
    adopt!(),
    " THEN prev_node WHEN released THEN NULL ELSE node END,
        prev_fence = CASE WHEN ",
    adopt!(),
    " THEN prev_fence WHEN released THEN NULL ELSE fence END,
        prev_expires_at_ms = CASE WHEN ",
    adopt!(),
    " THEN prev_expires_at_ms WHEN released THEN NULL ELSE expires_at_ms END,
        released = 0,
        fence = CASE WHEN ",
    adopt!(),
    " THEN fence ELSE max(fence + 1, ",
    epoch_floor!(),
    ") END, owner_id = ?2, node = ?3,
        acquired_at_ms = CASE WHEN ",
    adopt!(),
    " THEN acquired_at_ms ELSE ?4 END,
        expires_at_ms = CASE WHEN ",
    adopt!(),
    " THEN max(expires_at_ms, ?4 + ?5) ELSE ?4 + ?5 END,
        last_occurrence_ms = COALESCE(?6, last_occurrence_ms)
  WHERE resource = ?1 AND ",
    takeable!("?4", "?6", "?7", adopt!()),
    "
RETURNING fence, expires_at_ms, prev_owner_id, prev_node, prev_fence, prev_expires_at_ms"
);

/// A scheduled acquire's pause check (`?1` the job, `?2` now), in the
/// acquire's transaction.
pub(super) const PAUSED: &str = "SELECT note, until_ms FROM fencecron_pauses
  WHERE job = ?1 AND (until_ms IS NULL OR until_ms > ?2)";

/// The one acquire per paused instant that notes the skip (and logs it).
pub(super) const NOTE_PAUSED_SKIP: &str = "UPDATE fencecron_pauses SET last_skipped_ms = ?2
  WHERE job = ?1 AND (last_skipped_ms IS NULL OR last_skipped_ms < ?2)";

/// The run a winning acquire records, in its transaction; a retry that
/// adopts its own win finds the row already there.
pub(super) const INSERT_RUN: &str = "INSERT INTO fencecron_runs
   (job, resource, scheduled_at_ms, started_by, node, owner_id, token, started_at_ms)
 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
 ON CONFLICT (resource, token) DO NOTHING";

/// The first acquisition of a resource.
pub(super) const CREATE: &str = concat!(
    "INSERT INTO fencecron_leases
       (resource, fence, owner_id, node, acquired_at_ms, expires_at_ms, last_occurrence_ms,
        released)
     VALUES (?1, ",
    epoch_floor!(),
    ", ?2, ?3, ?4, ?4 + ?5, ?6, 0)
     RETURNING fence, expires_at_ms, prev_owner_id, prev_node, prev_fence, prev_expires_at_ms"
);

/// The lease row as a losing acquire classifies it (`?1` the resource),
/// and whether a claim could take it ([`takeable!`], `?2` now, `?3` the
/// instant, `?4` the next one).
pub(super) const LOSS_ROW: &str = concat!(
    "SELECT fence, owner_id, node, expires_at_ms, last_occurrence_ms, (",
    takeable!("?2", "?3", "?4", "0"),
    ") AS takeable
   FROM fencecron_leases WHERE resource = ?1"
);

/// `fencecron epoch advance`: max(stored, highest fence >> 32) + 1.
pub(super) const ADVANCE_EPOCH: &str = "INSERT INTO fencecron_epoch (id, epoch)
     SELECT 1, (COALESCE(max(fence), 0) >> 32) + 1 FROM fencecron_leases WHERE 1
     ON CONFLICT (id) DO UPDATE SET epoch = max(epoch, excluded.epoch - 1) + 1";

/// `fencecron epoch`: the stored epoch and the highest fence.
pub(super) const EPOCH: &str =
    "SELECT COALESCE((SELECT epoch FROM fencecron_epoch WHERE id = 1), 0) AS stored,
            (SELECT max(fence) FROM fencecron_leases) AS highest";

pub(super) const RENEW: &str = "UPDATE fencecron_leases SET expires_at_ms = ?4 + ?5
  WHERE resource = ?1 AND owner_id = ?2 AND fence = ?3 AND expires_at_ms > ?4
RETURNING expires_at_ms";

pub(super) const RELEASE: &str =
    "UPDATE fencecron_leases SET expires_at_ms = MIN(expires_at_ms, ?4), released = 1
  WHERE resource = ?1 AND owner_id = ?2 AND fence = ?3";

/// `give_back`: a release that also makes the occurrence `?5` takeable again
/// when it is still the last one taken (`?5 - 1` keeps older instants
/// refused). Without a token (`?3` NULL): this owner's unreleased win of
/// exactly this occurrence.
pub(super) const GIVE_BACK: &str =
    "UPDATE fencecron_leases SET expires_at_ms = MIN(expires_at_ms, ?4), released = 1,
        last_occurrence_ms = CASE WHEN last_occurrence_ms = ?5 THEN ?5 - 1
                                  ELSE last_occurrence_ms END
  WHERE resource = ?1 AND owner_id = ?2
    AND (fence = ?3 OR (?3 IS NULL AND NOT released AND last_occurrence_ms = ?5))";

impl Lite {
    pub(super) async fn acquire_lease(
        &self,
        db: &Db<Sqlite>,
        req: &AcquireRequest<'_>,
    ) -> Sql<AcquireOutcome> {
        let owner = req.owner_id;
        let owner_s = owner.to_string();
        let lease = millis(req.lease);
        let occ = req.occurrence.map(|o| o.0);
        let next = req.next_occurrence.map(|o| o.0);
        let (job, started_by, scheduled_at) = run_binds(req);
        let mut tx = self.begin(db).await?;
        let now = kernel_now_ms();
        // Scheduled runs and their retries honour a pause; manual ones not.
        if let Some(job) = job.filter(|_| occ.is_some() || started_by == StartedBy::Retry.as_str())
        {
            let paused = sqlx::query(PAUSED)
                .bind(job)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
            if let Some(p) = paused {
                let due = occ.is_some_and(|o| o <= now) && next.is_none_or(|n| n > now);
                let first = due
                    && sqlx::query(NOTE_PAUSED_SKIP)
                        .bind(job)
                        .bind(occ)
                        .execute(&mut *tx)
                        .await?
                        .rows_affected()
                        == 1;
                let pause = PauseSeen {
                    note: p.try_get("note")?,
                    until: p.try_get("until_ms")?,
                    first,
                };
                tx.commit().await?;
                return Ok(classify_paused(pause, req, now));
            }
        }
        let won = sqlx::query(ACQUIRE)
            .bind(req.resource.as_str())
            .bind(&owner_s)
            .bind(req.node)
            .bind(now)
            .bind(lease)
            .bind(occ)
            .bind(next)
            .fetch_optional(&mut *tx)
            .await?;
        let row = match won {
            Some(row) => row,
            None => {
                if let Some((loss, _)) = loss_row(&mut tx, req.resource, now, occ, next).await? {
                    tx.rollback().await?;
                    return Ok(classify_loss(loss, req));
                }
                if let Some(refused) = uncreatable(now, occ, next) {
                    tx.rollback().await?;
                    return Ok(refused);
                }
                sqlx::query(CREATE)
                    .bind(req.resource.as_str())
                    .bind(&owner_s)
                    .bind(req.node)
                    .bind(now)
                    .bind(lease)
                    .bind(occ)
                    .fetch_one(&mut *tx)
                    .await?
            }
        };
        let token: Token = row.try_get("fence")?;
        let expires_at: i64 = row.try_get("expires_at_ms")?;
        let taken_over = rows::takeover(&row, rows::PREV)?;
        if let Some(job) = job {
            sqlx::query(INSERT_RUN)
                .bind(job)
                .bind(req.resource.as_str())
                .bind(scheduled_at)
                .bind(started_by)
                .bind(req.node)
                .bind(&owner_s)
                .bind(token)
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(AcquireOutcome::Acquired(Lease {
            resource: req.resource.to_string(),
            owner_id: owner,
            token,
            expires_at: StoreTime(expires_at),
            taken_over,
        }))
    }
}

/// Why a resource with no lease row may not be created for the instant
/// `occ` (`None`: ad hoc) before `next` at `now` (`None`: it may): the
/// single acquire's and the claim's one rule for a first acquisition (the
/// row part of [`takeable!`] holds for a row that does not exist).
pub(super) fn uncreatable(now: i64, occ: Option<i64>, next: Option<i64>) -> Option<AcquireOutcome> {
    if occ.is_some_and(|o| o > now) {
        return Some(AcquireOutcome::NotYetDue {
            store_now: StoreTime(now),
        });
    }
    if next.is_some_and(|n| n <= now) {
        return Some(AcquireOutcome::Superseded {
            store_now: StoreTime(now),
        });
    }
    None
}

/// The lease row as a losing acquire classifies it, if there is one, and
/// whether the instant `occ` (before `next`) could take it ([`LOSS_ROW`]).
pub(super) async fn loss_row(
    tx: &mut Transaction<'static, Sqlite>,
    resource: &Name,
    now: i64,
    occ: Option<i64>,
    next: Option<i64>,
) -> Result<Option<(LossRow, bool)>, sqlx::Error> {
    let existing = sqlx::query(LOSS_ROW)
        .bind(resource.as_str())
        .bind(now)
        .bind(occ)
        .bind(next)
        .fetch_optional(&mut **tx)
        .await?;
    existing
        .map(|r| {
            let loss = LossRow {
                fence: r.try_get("fence")?,
                owner_id: r.try_get("owner_id")?,
                node: r.try_get("node")?,
                expires_at: r.try_get("expires_at_ms")?,
                last_occurrence: r.try_get("last_occurrence_ms")?,
                now,
            };
            Ok((loss, r.try_get("takeable")?))
        })
        .transpose()
}

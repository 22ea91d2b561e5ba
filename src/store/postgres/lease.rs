//! The lease's statements on PostgreSQL (acquire, renew, release, give
//! back, epoch) and the operation whose shape they dictate, the single
//! acquire. The takeable rule's macros here are the batch claim's too
//! (`claim.rs`).

use super::*;

/// The adoption condition on the row as it was: this owner won this
/// occurrence and has not released it (false for ad-hoc leases, `$5` NULL).
macro_rules! adopt {
    () => {
        "(owner_id = $2 AND last_occurrence_ms = $5 AND NOT released)"
    };
}

/// The run a winning acquire records, once per row its `UPDATE` (or first
/// `INSERT`) returned, i.e. once per win: `$7` the job (NULL: no run), `$8`
/// how it was started, `$9` its instant; migration 0003's PL/pgSQL
/// function, so that a losing acquire, which never calls it, does not open
/// `fencecron_runs` and its indexes (as a data-modifying CTE would, win or
/// lose; `fencecron bench` showed no difference either way). A retry that
/// adopts its own win finds the row already there.
macro_rules! record_run {
    () => {
        "fencecron_record_run($7, $1, $9::bigint, $8, $3, $2, fence, acquired_at_ms)"
    };
}

/// Whether the instant `$occ` (NULL: an ad-hoc lease, no instant) is due
/// and its successor `$next` (NULL: none) is not yet, by the store's clock.
macro_rules! due {
    ($occ:expr, $next:expr) => {
        concat!(
            "(",
            $occ,
            " IS NULL OR ",
            $occ,
            " <= ",
            now_ms!(),
            ") AND (",
            $next,
            " IS NULL OR ",
            $next,
            " > ",
            now_ms!(),
            ")"
        )
    };
}

/// Whether the pause row `$p` (an alias with its dot, or nothing) still
/// holds by the store's clock.
macro_rules! pause_holds {
    ($p:expr) => {
        concat!(
            "(",
            $p,
            "until_ms IS NULL OR ",
            $p,
            "until_ms > ",
            now_ms!(),
            ")"
        )
    };
}

/// The rule "this occurrence is takeable", the one text of it on
/// PostgreSQL (the single acquire's `UPDATE`, the claim's candidates and the
/// new rows it creates): the lease row `$l` (an alias with its dot, or
/// nothing) expired by the store's clock and the instant `$occ` newer than
/// the last one taken (or `$adopt`: the acquire's adoption of its own win,
/// `FALSE` for a claim's existing row, `TRUE` for a resource with no row
/// yet, which has no lease to wait for and no instant taken),
/// the instant due and its successor `$next` not ([`due!`]), and no pause
/// holding for the job (`$paused`, the pause lookup, is false).
macro_rules! takeable {
    ($l:expr, $occ:expr, $next:expr, $adopt:expr, $paused:expr) => {
        concat!(
            "((",
            $l,
            "expires_at_ms <= ",
            now_ms!(),
            " AND (",
            $occ,
            " IS NULL OR ",
            $l,
            "last_occurrence_ms IS NULL OR ",
            $l,
            "last_occurrence_ms < ",
            $occ,
            ")) OR ",
            $adopt,
            ") AND ",
            due!($occ, $next),
            " AND NOT ",
            $paused
        )
    };
}

/// The winning path assigns `prev_*` from the row as it was (PostgreSQL's
/// `SET` expressions all see the old row) when the previous generation was
/// not released, and `RETURNING` hands them back with the new fence.
///
/// Two ways to win:
/// - the lease is free (expired by the store's clock) and the occurrence is
///   newer than the last one taken: a fresh token;
/// - adoption ([`ADOPT`]): this very owner already won this very
///   occurrence and has not released it. An occurrence uses one owner id
///   for all of its attempts, so this is an earlier attempt that committed
///   after its caller stopped waiting for the answer; the retry takes that
///   win over (same token, which nobody else ever saw, and expiry at least
///   now + lease) instead of finding its own occurrence "taken".
///
/// Either way only while the occurrence is due and its successor (`$6`,
/// the job's next instant) is not, by the store's clock.
pub(super) const ACQUIRE: &str = concat!(
    "WITH paused AS (
       SELECT TRUE AS paused, note, until_ms FROM fencecron_pauses
        WHERE ($5::bigint IS NOT NULL OR $8::text = 'retry') AND job = $7::text
          AND ",
    pause_holds!(""),
    "),
     won AS (
       UPDATE fencecron_leases
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
              released = FALSE,
              fence = CASE WHEN ",
    adopt!(),
    " THEN fence ELSE GREATEST(fence + 1, ",
    epoch_floor!(),
    ") END, owner_id = $2, node = $3,
              acquired_at_ms = CASE WHEN ",
    adopt!(),
    " THEN acquired_at_ms ELSE ",
    now_ms!(),
    " END, expires_at_ms = CASE WHEN ",
    adopt!(),
    " THEN GREATEST(expires_at_ms, ",
    now_ms!(),
    " + $4) ELSE ",
    now_ms!(),
    " + $4 END,
              last_occurrence_ms = COALESCE($5, last_occurrence_ms)
        WHERE resource = $1 AND ",
    takeable!(
        "",
        "$5::bigint",
        "$6::bigint",
        adopt!(),
        "EXISTS (SELECT 1 FROM paused)"
    ),
    "
    RETURNING fence, expires_at_ms, acquired_at_ms,
              prev_owner_id, prev_node, prev_fence, prev_expires_at_ms)
     SELECT TRUE AS won, fence, expires_at_ms, ''::text AS owner_id, ''::text AS node,
            NULL::bigint AS last_occurrence_ms, 0::bigint AS now_ms,
            prev_owner_id, prev_node, prev_fence, prev_expires_at_ms, ",
    record_run!(),
    " AS recorded, FALSE AS paused, NULL::text AS pause_note, NULL::bigint AS pause_until_ms,
            FALSE AS pause_first
       FROM won
     UNION ALL
     SELECT FALSE, l.fence, l.expires_at_ms, l.owner_id, l.node, l.last_occurrence_ms, ",
    now_ms!(),
    ", NULL::text, NULL::text, NULL::bigint, NULL::bigint, FALSE,
            p.paused IS NOT NULL, p.note, p.until_ms,
            CASE WHEN p.paused AND $5::bigint <= ",
    now_ms!(),
    " AND ($6::bigint IS NULL OR $6 > ",
    now_ms!(),
    ") THEN fencecron_note_paused_skip($7, $5, ",
    now_ms!(),
    ") ELSE FALSE END
       FROM fencecron_leases l LEFT JOIN paused p ON TRUE
      WHERE l.resource = $1 AND NOT EXISTS (SELECT 1 FROM won)"
);

/// A paused job whose resource was never leased (the acquire found no row
/// and `CREATE` created none): the pause, noting the instant as skipped
/// for the first caller. `$1` job, `$2` occurrence, `$3` next instant, `$4`
/// how the run was started.
pub(super) const PAUSED_FIRST_LEASE: &str = concat!(
    "SELECT note, until_ms, ",
    now_ms!(),
    " AS now_ms,
            CASE WHEN $2::bigint <= ",
    now_ms!(),
    " AND ($3::bigint IS NULL OR $3 > ",
    now_ms!(),
    ") THEN fencecron_note_paused_skip($1, $2, ",
    now_ms!(),
    ") ELSE FALSE END AS first
       FROM fencecron_pauses
      WHERE job = $1::text AND ($2::bigint IS NOT NULL OR $4::text = 'retry')
        AND ",
    pause_holds!("")
);

/// The first acquisition of a resource: creates its row (unless a
/// concurrent first acquisition did, or the job is paused), with the run.
pub(super) const CREATE: &str = concat!(
    "WITH created AS (
     INSERT INTO fencecron_leases
       (resource, fence, owner_id, node, acquired_at_ms, expires_at_ms, last_occurrence_ms,
        released)
     SELECT $1, ",
    epoch_floor!(),
    ", $2, $3, ",
    now_ms!(),
    ", ",
    now_ms!(),
    " + $4, $5::bigint, FALSE WHERE ",
    due!("$5::bigint", "$6::bigint"),
    "
       AND NOT EXISTS (SELECT 1 FROM fencecron_pauses
                        WHERE ($5::bigint IS NOT NULL OR $8::text = 'retry') AND job = $7::text
                          AND ",
    pause_holds!(""),
    ")
     ON CONFLICT (resource) DO NOTHING
     RETURNING fence, expires_at_ms, acquired_at_ms)
     SELECT fence, expires_at_ms, ",
    record_run!(),
    " AS recorded FROM created"
);

pub(super) const RENEW: &str = concat!(
    "UPDATE fencecron_leases SET expires_at_ms = ",
    now_ms!(),
    " + $4
      WHERE resource = $1 AND owner_id = $2 AND fence = $3 AND expires_at_ms > ",
    now_ms!(),
    " RETURNING expires_at_ms"
);

/// `give_back`: a release that also makes the occurrence takeable again
/// when it is still the last one taken (`$4 - 1` keeps every older instant
/// refused). Without a token (`$3` NULL): this owner's unreleased win of
/// exactly this occurrence.
pub(super) const GIVE_BACK: &str = concat!(
    "UPDATE fencecron_leases SET expires_at_ms = LEAST(expires_at_ms, ",
    now_ms!(),
    "), released = TRUE,
            last_occurrence_ms = CASE WHEN last_occurrence_ms = $4 THEN $4 - 1
                                      ELSE last_occurrence_ms END
      WHERE resource = $1 AND owner_id = $2
        AND (fence = $3
             OR ($3::bigint IS NULL AND NOT released AND last_occurrence_ms = $4))
      RETURNING fence"
);

/// [`Store::give_back_unseen`](crate::store::Leases::give_back_unseen): `GIVE_BACK` without a token for every
/// (`$1` resource, `$2` owner id, `$3` occurrence) at once; the ordinals
/// of the items given back.
pub(super) const GIVE_BACK_UNSEEN: &str = concat!(
    "UPDATE fencecron_leases l SET expires_at_ms = LEAST(l.expires_at_ms, ",
    now_ms!(),
    "), released = TRUE,
            last_occurrence_ms = u.occ - 1
       FROM unnest($1::text[], $2::text[], $3::bigint[])
            WITH ORDINALITY AS u(resource, owner_id, occ, ord)
      WHERE l.resource = u.resource AND l.owner_id = u.owner_id
        AND NOT l.released AND l.last_occurrence_ms = u.occ
      RETURNING u.ord"
);

/// [`Store::finish_and_release`](crate::store::Runs::finish_and_release): the fleet's `FINISH_RUN` (`$1`..`$8`:
/// the run's end, matched by `$7` resource and `$8` token, once) and the
/// release of the lease (`$9` owner id, `$8` token), in one statement; how
/// many rows each changed.
pub(super) static FINISH_AND_RELEASE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| {
        format!(
            "WITH f AS ({} RETURNING 1), r AS ({RELEASE_RUN} RETURNING 1)
         SELECT (SELECT count(*) FROM f) AS finished, (SELECT count(*) FROM r) AS released",
            crate::store::fleet::FINISH_RUN
        )
    });

/// The release half of [`FINISH_AND_RELEASE`].
pub(super) const RELEASE_RUN: &str = concat!(
    "UPDATE fencecron_leases SET expires_at_ms = LEAST(expires_at_ms, ",
    now_ms!(),
    "), released = TRUE WHERE resource = $7 AND owner_id = $9 AND fence = $8"
);

pub(super) const RELEASE: &str = concat!(
    "UPDATE fencecron_leases SET expires_at_ms = LEAST(expires_at_ms, ",
    now_ms!(),
    "), released = TRUE
      WHERE resource = $1 AND owner_id = $2 AND fence = $3
      RETURNING fence"
);

/// `fencecron epoch`: the stored epoch, the timeline, the effective epoch
/// (from the same function the acquire uses) and the highest fence.
pub(super) const EPOCH: &str = concat!(
    "SELECT COALESCE((SELECT epoch FROM fencecron_epoch WHERE id = 1), 0) AS stored, ",
    timeline!(),
    " AS timeline, (",
    epoch_floor!(),
    " - 1) >> 32 AS effective, (SELECT max(fence) FROM fencecron_leases) AS highest"
);

/// `fencecron epoch advance`: the stored epoch such that the effective one
/// becomes max(effective, highest fence >> 32) + 1. In one statement (its
/// own transaction); a concurrent acquire that still used the old epoch
/// issued a token below the new epoch's first one.
pub(super) const ADVANCE_EPOCH: &str = concat!(
    "INSERT INTO fencecron_epoch AS e (id, epoch)
     SELECT 1, GREATEST(0, (COALESCE(max(fence), 0) >> 32) - (",
    timeline!(),
    " - 1) * 1024) + 1 FROM fencecron_leases
     ON CONFLICT (id) DO UPDATE
        SET epoch = GREATEST(e.epoch, EXCLUDED.epoch - 1) + 1
     RETURNING e.epoch"
);

impl Pg {
    pub(super) async fn acquire_lease(
        &self,
        db: &Db<Postgres>,
        req: &AcquireRequest<'_>,
    ) -> Sql<AcquireOutcome> {
        let owner = req.owner_id;
        let owner_s = owner.to_string();
        let lease = millis(req.lease);
        let occ = req.occurrence.map(|o| o.0);
        let next = req.next_occurrence.map(|o| o.0);
        // Bounded: the row is created at most once, so the second round
        // always finds it.
        let (job, started_by, scheduled_at) = run_binds(req);
        for _ in 0..3 {
            let rows = sqlx::query(ACQUIRE)
                .bind(req.resource.as_str())
                .bind(&owner_s)
                .bind(req.node)
                .bind(lease)
                .bind(occ)
                .bind(next)
                .bind(job)
                .bind(started_by)
                .bind(scheduled_at)
                .fetch_all(&db.pool)
                .await?;
            if let Some(row) = rows.first() {
                let won: bool = row.try_get("won")?;
                if !won && row.try_get::<bool, _>("paused")? {
                    let pause = PauseSeen {
                        note: row.try_get("pause_note")?,
                        until: row.try_get("pause_until_ms")?,
                        first: row.try_get("pause_first")?,
                    };
                    return Ok(classify_paused(pause, req, row.try_get("now_ms")?));
                }
                let fence: Token = row.try_get("fence")?;
                let expires_at: i64 = row.try_get("expires_at_ms")?;
                if won {
                    return Ok(AcquireOutcome::Acquired(Lease {
                        resource: req.resource.to_string(),
                        owner_id: owner,
                        token: fence,
                        expires_at: StoreTime(expires_at),
                        taken_over: rows::takeover(row, rows::PREV)?,
                    }));
                }
                let loss = LossRow {
                    fence,
                    expires_at,
                    owner_id: row.try_get("owner_id")?,
                    node: row.try_get("node")?,
                    last_occurrence: row.try_get("last_occurrence_ms")?,
                    now: row.try_get("now_ms")?,
                };
                return Ok(classify_loss(loss, req));
            }
            // No row at all: this is the resource's first acquisition.
            let created = sqlx::query(CREATE)
                .bind(req.resource.as_str())
                .bind(&owner_s)
                .bind(req.node)
                .bind(lease)
                .bind(occ)
                .bind(next)
                .bind(job)
                .bind(started_by)
                .bind(scheduled_at)
                .fetch_optional(&db.pool)
                .await?;
            if let Some(row) = created {
                return Ok(AcquireOutcome::Acquired(Lease {
                    resource: req.resource.to_string(),
                    owner_id: owner,
                    token: row.try_get("fence")?,
                    expires_at: StoreTime(row.try_get("expires_at_ms")?),
                    taken_over: None,
                }));
            }
            // Not created: the job is paused, the occurrence is not due yet
            // or already superseded by the store's clock, or someone else
            // created the row concurrently (then compete for it normally).
            if let Some(job) = job {
                let paused = sqlx::query(PAUSED_FIRST_LEASE)
                    .bind(job)
                    .bind(occ)
                    .bind(next)
                    .bind(started_by)
                    .fetch_optional(&db.pool)
                    .await?;
                if let Some(p) = paused {
                    let pause = PauseSeen {
                        note: p.try_get("note")?,
                        until: p.try_get("until_ms")?,
                        first: p.try_get("first")?,
                    };
                    return Ok(classify_paused(pause, req, p.try_get("now_ms")?));
                }
            }
            if occ.is_some() || next.is_some() {
                let now = self.now(db).await?;
                if occ.is_some_and(|occ| occ > now.0) {
                    return Ok(AcquireOutcome::NotYetDue { store_now: now });
                }
                if next.is_some_and(|next| next <= now.0) {
                    return Ok(AcquireOutcome::Superseded { store_now: now });
                }
            }
        }
        Err(StoreError::Corrupt {
            url: db.url.to_string(),
            detail: format!(
                "the lease row for {} neither exists nor can be created",
                req.resource
            ),
        }
        .into())
    }
}

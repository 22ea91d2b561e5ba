//! The batch claim on PostgreSQL: one statement that tries the items in
//! order, skips rows another caller has locked, creates never-leased rows,
//! and wins at most the claim's limit.

use super::*;

/// A claim item's pause lookup (`r` the item, `p` the pause).
macro_rules! claim_paused {
    () => {
        concat!(
            "EXISTS (SELECT 1 FROM fencecron_pauses p WHERE p.job = r.job AND ",
            pause_holds!("p."),
            ")"
        )
    };
}

/// A batch claim ([`Store::claim`](crate::store::Leases::claim)): `$1`..`$6` the items' resources, owner
/// ids, jobs, instants, next instants and lease lengths (parallel arrays, in
/// this node's order), `$7` the node, `$8` the limit, `$9` whether to bound
/// it by the node's share, `$10`/`$11` [`NODE_BEAT`]/[`NODE_LIVE`] in ms
/// (the live nodes are those of [`NodeInfo::live`]).
///
/// `cand` is the single acquire's winning condition for a free lease
/// (expired by the store's clock, instant newer than the last one taken,
/// due, not superseded, job not paused), tried in order with `FOR UPDATE
/// SKIP LOCKED` and the limit: a row another caller has locked is skipped,
/// not waited for, and a row changed since the snapshot is re-checked
/// against its newest version before it counts (READ COMMITTED). `fresh`
/// is the same rule for a resource that has no lease row in the
/// statement's snapshot (never leased: nothing to be free of, so only the
/// instant and the pause count). `pick` is the first `lim` of both, in the
/// node's order. `won` is the acquire's `UPDATE` on the picked rows (fence
/// bump, `prev_*`, owner, expiry); `created` is `CREATE`'s `INSERT` of the
/// picked new rows (the fence at the epoch's floor), in resource order so
/// that two claimers creating overlapping sets wait for each other in one
/// order, never in a cycle. `ON CONFLICT DO NOTHING` makes a row another
/// caller created since the snapshot (committed, or in flight: the insert
/// waits for it) not this claim's: exactly one creator wins it. Rows a CTE
/// inserted or updated are invisible to its siblings and to the final
/// `SELECT` (one snapshot), so wins are read from `RETURNING` (`w`), and a
/// row created by someone else since the snapshot reads as absent: `Ask`,
/// and the single acquire meets that row. The final `SELECT` records each
/// win's run (`fencecron_record_run`, called for won rows only) and
/// reports every other item's row as the statement's snapshot saw it,
/// classified like a losing acquire; `skipped` marks a new resource this
/// claim could have created but stopped before (its limit). The limit it
/// reports leaves out the places lost to another creator, so that
/// [`ClaimOutcome::left_some`] still sees a claim that stopped at its limit.
/// Adoption is not needed: a claim's owner ids are fresh, and every later
/// attempt is a single acquire. `beat` marks the node at most every `$10`
/// ms, the only write a claim that wins nothing can make.
pub(super) const CLAIM: &str = concat!(
    "WITH req AS (
       SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[],
                            $6::bigint[])
              WITH ORDINALITY AS r(resource, owner_id, job, occ, next_occ, lease_ms, ord)),
     beat AS (
       INSERT INTO fencecron_nodes (node, seen_ms)
       SELECT $7, ",
    now_ms!(),
    " WHERE NOT EXISTS (SELECT 1 FROM fencecron_nodes
                          WHERE node = $7 AND seen_ms > ",
    now_ms!(),
    " - $10::bigint)
       ON CONFLICT (node) DO UPDATE SET seen_ms = EXCLUDED.seen_ms),
     lim AS (
       SELECT CASE WHEN $9::boolean THEN LEAST($8::bigint,
                CEIL((SELECT count(*) FROM req)::numeric
                     / (1 + (SELECT count(*) FROM fencecron_nodes
                              WHERE node <> $7 AND seen_ms > ",
    now_ms!(),
    " - $11::bigint AND state <> 'stopped')))::bigint + 1)
              ELSE $8::bigint END AS n),
     cand AS (
       SELECT l.resource, r.owner_id, r.job, r.occ, r.lease_ms, r.ord
         FROM fencecron_leases l JOIN req r ON r.resource = l.resource
        WHERE ",
    takeable!("l.", "r.occ", "r.next_occ", "FALSE", claim_paused!()),
    "
        ORDER BY r.ord
        LIMIT (SELECT n FROM lim)
        FOR UPDATE OF l SKIP LOCKED),
     fresh AS (
       SELECT r.resource, r.owner_id, r.job, r.occ, r.lease_ms, r.ord
         FROM req r LEFT JOIN fencecron_leases l ON l.resource = r.resource
        WHERE l.resource IS NULL AND ",
    takeable!("l.", "r.occ", "r.next_occ", "TRUE", claim_paused!()),
    "),
     pick AS (
       SELECT p.*
         FROM (SELECT c.*, FALSE AS new FROM cand c
               UNION ALL SELECT f.*, TRUE AS new FROM fresh f) p
        ORDER BY p.ord
        LIMIT (SELECT n FROM lim)),
     won AS (
       UPDATE fencecron_leases l
          SET prev_owner_id = CASE WHEN l.released THEN NULL ELSE l.owner_id END,
              prev_node = CASE WHEN l.released THEN NULL ELSE l.node END,
              prev_fence = CASE WHEN l.released THEN NULL ELSE l.fence END,
              prev_expires_at_ms = CASE WHEN l.released THEN NULL ELSE l.expires_at_ms END,
              released = FALSE,
              fence = GREATEST(l.fence + 1, ",
    epoch_floor!(),
    "),
              owner_id = c.owner_id, node = $7,
              acquired_at_ms = ",
    now_ms!(),
    ", expires_at_ms = ",
    now_ms!(),
    " + c.lease_ms,
              last_occurrence_ms = c.occ
         FROM pick c
        WHERE l.resource = c.resource AND NOT c.new
    RETURNING l.resource, l.fence, l.expires_at_ms, l.acquired_at_ms, l.prev_owner_id,
              l.prev_node, l.prev_fence, l.prev_expires_at_ms, c.job, c.occ, c.owner_id),
     created AS (
       INSERT INTO fencecron_leases
         (resource, fence, owner_id, node, acquired_at_ms, expires_at_ms, last_occurrence_ms,
          released)
       SELECT c.resource, ",
    epoch_floor!(),
    ", c.owner_id, $7, ",
    now_ms!(),
    ", ",
    now_ms!(),
    " + c.lease_ms, c.occ, FALSE
         FROM pick c WHERE c.new
        ORDER BY c.resource
       ON CONFLICT (resource) DO NOTHING
    RETURNING resource, fence, expires_at_ms, acquired_at_ms, owner_id, last_occurrence_ms),
     w AS (
       SELECT resource, fence, expires_at_ms, acquired_at_ms, prev_owner_id, prev_node,
              prev_fence, prev_expires_at_ms, job, occ, owner_id
         FROM won
       UNION ALL
       SELECT c.resource, c.fence, c.expires_at_ms, c.acquired_at_ms, NULL::text, NULL::text,
              NULL::bigint, NULL::bigint, p.job, c.last_occurrence_ms, c.owner_id
         FROM created c JOIN pick p ON p.resource = c.resource AND p.owner_id = c.owner_id)
     SELECT (w.resource IS NOT NULL)::int::int8 AS won, w.fence AS won_fence,
            w.expires_at_ms AS won_expires_at_ms, w.prev_owner_id, w.prev_node, w.prev_fence,
            w.prev_expires_at_ms,
            (l.resource IS NOT NULL)::int::int8 AS present, l.fence, l.expires_at_ms, l.owner_id,
            l.node, l.last_occurrence_ms,
            CASE WHEN w.resource IS NULL THEN ",
    claim_paused!(),
    " ELSE FALSE END::int::int8 AS paused, ",
    now_ms!(),
    " AS now_ms,
            (SELECT n FROM lim) - (SELECT count(*) FROM pick WHERE new)
              + (SELECT count(*) FROM created) AS lim,
            (w.resource IS NULL AND l.resource IS NULL AND f.ord IS NOT NULL
             AND p.ord IS NULL)::int::int8 AS skipped,
            CASE WHEN w.resource IS NOT NULL
                 THEN fencecron_record_run(w.job, w.resource, w.occ, 'schedule', $7, w.owner_id,
                                           w.fence, w.acquired_at_ms)
                 ELSE FALSE END AS recorded
       FROM req r LEFT JOIN w ON w.resource = r.resource AND w.owner_id = r.owner_id
                  LEFT JOIN fencecron_leases l ON l.resource = r.resource
                  LEFT JOIN fresh f ON f.ord = r.ord
                  LEFT JOIN pick p ON p.ord = r.ord
      ORDER BY r.ord"
);

impl Pg {
    pub(super) async fn claim_leases(
        &self,
        db: &Db<Postgres>,
        req: &ClaimRequest<'_>,
    ) -> Sql<ClaimOutcome> {
        let items = req.items;
        let resources: Vec<&str> = items.iter().map(|i| i.resource.as_str()).collect();
        let owners: Vec<String> = items.iter().map(|i| i.owner_id.to_string()).collect();
        let jobs: Vec<&str> = items.iter().map(|i| i.job).collect();
        let occs: Vec<i64> = items.iter().map(|i| i.occurrence.0).collect();
        let nexts: Vec<Option<i64>> = items
            .iter()
            .map(|i| i.next_occurrence.map(|t| t.0))
            .collect();
        let leases: Vec<i64> = items.iter().map(|i| millis(i.lease)).collect();
        let rows = sqlx::query(CLAIM)
            .bind(&resources)
            .bind(&owners)
            .bind(&jobs)
            .bind(&occs)
            .bind(&nexts)
            .bind(&leases)
            .bind(req.node)
            .bind(i64::try_from(req.limit).unwrap_or(i64::MAX))
            .bind(req.share)
            .bind(millis(NODE_BEAT))
            .bind(millis(NODE_LIVE))
            .fetch_all(&db.pool)
            .await?;
        rows::claim_outcome(&rows, req, &db.url)
    }
}

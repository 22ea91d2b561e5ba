-- fencecron 0011: the claim creates and wins a never-leased resource's row
-- itself, as PostgreSQL's CLAIM does, instead of leaving it to a single
-- fencecron_acquire_v3 per occurrence (on a fleet whose rows are all new,
-- every daemon used to ask for every occurrence alone). fencecron_claim_v1
-- is defined again with the same parameters; what changes:
-- - the candidates, in the items' order, are the due items of jobs not
--   paused (a plain read of whether each resource has a row, nothing
--   locked); a resource with a row is taken only if its row is free (expired
--   by the store's clock, the occurrence newer than the last taken), locked
--   with FOR UPDATE SKIP LOCKED: a row another claimer holds is skipped, not
--   waited for; a resource without one takes a place too and is created
--   after the loop, with the others, in resource order (two claimers
--   creating overlapping sets wait for each other in one order, never in a
--   cycle), as v3's first acquisition creates it (the fence at the epoch's
--   floor, the occurrence as the last taken) with its run; INSERT IGNORE
--   leaves a row another caller created first (committed, or in flight: the
--   insert waits for it) to that caller: exactly one creator wins it;
-- - READ COMMITTED for the claim's transaction: no gap locks, so two
--   claimers looking for the same absent row do not deadlock on the gap;
-- - a 17th column, skipped: a resource still without a row that this claim
--   could have created but stopped before (its limit);
-- - the limit it answers leaves out the places spent on rows another caller
--   created first, so that a claim that stopped at its limit is seen to.
-- A paused job's never-leased resource is still left to v3, which notes the
-- skip. A daemon of the previous release reads the first 16 columns only,
-- so it keeps working during a rolling upgrade (winning new rows too).
DROP PROCEDURE IF EXISTS fencecron_claim_v1;

CREATE PROCEDURE fencecron_claim_v1(
    IN p_items   LONGTEXT CHARACTER SET utf8mb4,
    IN p_node    VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_limit   BIGINT,
    IN p_share   INT,
    IN p_beat_ms BIGINT,
    IN p_live_ms BIGINT
)
    MODIFIES SQL DATA
    SQL SECURITY INVOKER
BEGIN
    DECLARE v_now BIGINT;
    DECLARE v_lim BIGINT;
    DECLARE v_others BIGINT;
    -- Places taken: rows won, and new rows to create.
    DECLARE v_places BIGINT DEFAULT 0;
    DECLARE v_new BIGINT DEFAULT 0;
    DECLARE v_created BIGINT DEFAULT 0;
    -- One byte per item, by ordinal: '1' a new row to create, '2' a new row
    -- past the limit.
    DECLARE v_marks LONGBLOB;
    DECLARE v_free VARBINARY(800);
    DECLARE v_done INT DEFAULT 0;
    DECLARE c_ord BIGINT;
    DECLARE c_resource VARBINARY(800);
    DECLARE c_owner VARCHAR(64);
    DECLARE c_job VARCHAR(200) CHARACTER SET utf8mb4;
    DECLARE c_occ BIGINT;
    DECLARE c_lease BIGINT;
    DECLARE c_present INT;
    DECLARE cand CURSOR FOR
        SELECT j.ord, j.r, j.o, j.j, j.q, j.l, l.resource IS NOT NULL
          FROM JSON_TABLE(p_items, '$[*]' COLUMNS(
                   ord FOR ORDINALITY,
                   r VARBINARY(800) PATH '$.r',
                   o VARCHAR(64) PATH '$.o',
                   j VARCHAR(200) CHARACTER SET utf8mb4 PATH '$.j',
                   q BIGINT PATH '$.q',
                   n BIGINT PATH '$.n',
                   l BIGINT PATH '$.l')) AS j
          LEFT JOIN fencecron_leases l ON l.resource = j.r
         WHERE j.q <= v_now
           AND (j.n IS NULL OR j.n > v_now)
           AND NOT EXISTS (SELECT 1 FROM fencecron_pauses p
                            WHERE p.job = j.j AND (p.until_ms IS NULL OR p.until_ms > v_now))
         ORDER BY j.ord;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
    -- Never leave the transaction open on a pooled connection.
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;

    SET v_now = CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED);
    IF NOT EXISTS (SELECT 1 FROM fencecron_nodes
                    WHERE node = p_node AND seen_ms > v_now - p_beat_ms) THEN
        INSERT INTO fencecron_nodes (node, seen_ms) VALUES (p_node, v_now)
            ON DUPLICATE KEY UPDATE seen_ms = VALUES(seen_ms);
    END IF;
    SELECT COUNT(*) INTO v_others FROM fencecron_nodes
     WHERE node <> p_node AND seen_ms > v_now - p_live_ms AND state <> 'stopped';
    SET v_lim = p_limit;
    IF p_share <> 0 THEN
        SET v_lim = LEAST(p_limit, CEIL(JSON_LENGTH(p_items) / (1 + v_others)) + 1);
    END IF;
    SET v_marks = CAST(REPEAT('0', JSON_LENGTH(p_items)) AS BINARY);

    SET TRANSACTION ISOLATION LEVEL READ COMMITTED;
    START TRANSACTION;
    OPEN cand;
    claim: LOOP
        FETCH cand INTO c_ord, c_resource, c_owner, c_job, c_occ, c_lease, c_present;
        IF v_done = 1 THEN
            LEAVE claim;
        END IF;
        IF c_present = 0 THEN
            -- Never leased: a place now, created after the loop; past the
            -- limit, marked for another look.
            SET v_marks = INSERT(v_marks, c_ord, 1, IF(v_places < v_lim, '1', '2'));
            IF v_places < v_lim THEN
                SET v_places = v_places + 1;
                SET v_new = v_new + 1;
            END IF;
        ELSEIF v_places < v_lim THEN
            SET v_free = NULL;
            SELECT resource INTO v_free FROM fencecron_leases
             WHERE resource = c_resource
               AND expires_at_ms <= v_now
               AND (last_occurrence_ms IS NULL OR last_occurrence_ms < c_occ)
               FOR UPDATE SKIP LOCKED;
            -- A free row nobody else holds, or nothing (NOT FOUND).
            SET v_done = 0;
            IF v_free IS NOT NULL THEN
                -- Assigned left to right: every prev_* reads the row as it was.
                UPDATE fencecron_leases
                   SET prev_owner_id = IF(released, NULL, owner_id),
                       prev_node = IF(released, NULL, node),
                       prev_fence = IF(released, NULL, fence),
                       prev_expires_at_ms = IF(released, NULL, expires_at_ms),
                       released = FALSE,
                       fence = GREATEST(fence + 1,
                           COALESCE((SELECT e.epoch FROM fencecron_epoch e WHERE e.id = 1), 0)
                           * 4294967296 + 1),
                       owner_id = c_owner, node = p_node,
                       acquired_at_ms = v_now,
                       expires_at_ms = v_now + c_lease,
                       last_occurrence_ms = c_occ
                 WHERE resource = c_resource;
                INSERT INTO fencecron_runs
                       (job, resource, scheduled_at_ms, started_by, node, owner_id, token,
                        started_at_ms)
                SELECT c_job, resource, c_occ, 'schedule', p_node, owner_id, fence, acquired_at_ms
                  FROM fencecron_leases WHERE resource = c_resource
                ON DUPLICATE KEY UPDATE id = id;
                SET v_places = v_places + 1;
            END IF;
        END IF;
    END LOOP claim;
    CLOSE cand;

    IF v_new > 0 THEN
        INSERT IGNORE INTO fencecron_leases
               (resource, fence, owner_id, node, acquired_at_ms, expires_at_ms,
                last_occurrence_ms, released)
        SELECT j.r,
               COALESCE((SELECT e.epoch FROM fencecron_epoch e WHERE e.id = 1), 0) * 4294967296 + 1,
               j.o, p_node, v_now, v_now + j.l, j.q, FALSE
          FROM JSON_TABLE(p_items, '$[*]' COLUMNS(
                   ord FOR ORDINALITY,
                   r VARBINARY(800) PATH '$.r',
                   o VARCHAR(64) PATH '$.o',
                   q BIGINT PATH '$.q',
                   l BIGINT PATH '$.l')) AS j
         WHERE SUBSTRING(v_marks, j.ord, 1) = '1'
         ORDER BY j.r;
        SET v_created = ROW_COUNT();
        INSERT INTO fencecron_runs
               (job, resource, scheduled_at_ms, started_by, node, owner_id, token, started_at_ms)
        SELECT j.j, l.resource, j.q, 'schedule', p_node, l.owner_id, l.fence, l.acquired_at_ms
          FROM JSON_TABLE(p_items, '$[*]' COLUMNS(
                   ord FOR ORDINALITY,
                   r VARBINARY(800) PATH '$.r',
                   o VARCHAR(64) PATH '$.o',
                   j VARCHAR(200) CHARACTER SET utf8mb4 PATH '$.j',
                   q BIGINT PATH '$.q')) AS j
          JOIN fencecron_leases l ON l.resource = j.r
         WHERE SUBSTRING(v_marks, j.ord, 1) = '1'
           AND l.owner_id = j.o AND l.last_occurrence_ms = j.q AND NOT l.released
        ON DUPLICATE KEY UPDATE id = id;
    END IF;
    COMMIT;

    -- Won: this claim's owner id holds this very occurrence (owner ids are
    -- fresh per occurrence, so no earlier call can have won it with them).
    SELECT CAST(COALESCE(l.owner_id = j.o AND l.last_occurrence_ms = j.q AND NOT l.released, 0)
                AS SIGNED) AS won,
           IF(l.owner_id = j.o AND l.last_occurrence_ms = j.q, l.fence, NULL) AS won_fence,
           IF(l.owner_id = j.o AND l.last_occurrence_ms = j.q, l.expires_at_ms, NULL)
               AS won_expires_at_ms,
           IF(l.owner_id = j.o AND l.last_occurrence_ms = j.q, l.prev_owner_id, NULL)
               AS prev_owner_id,
           IF(l.owner_id = j.o AND l.last_occurrence_ms = j.q, l.prev_node, NULL) AS prev_node,
           IF(l.owner_id = j.o AND l.last_occurrence_ms = j.q, l.prev_fence, NULL) AS prev_fence,
           IF(l.owner_id = j.o AND l.last_occurrence_ms = j.q, l.prev_expires_at_ms, NULL)
               AS prev_expires_at_ms,
           CAST(l.resource IS NOT NULL AS SIGNED) AS present,
           l.fence, l.expires_at_ms, l.owner_id, l.node, l.last_occurrence_ms,
           CAST(EXISTS (SELECT 1 FROM fencecron_pauses p
                         WHERE p.job = j.j AND (p.until_ms IS NULL OR p.until_ms > v_now))
                AS SIGNED) AS paused,
           CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED) AS now_ms,
           v_lim - (v_new - v_created) AS lim,
           CAST(l.resource IS NULL AND SUBSTRING(v_marks, j.ord, 1) = '2' AS SIGNED) AS skipped
      FROM JSON_TABLE(p_items, '$[*]' COLUMNS(
               ord FOR ORDINALITY,
               r VARBINARY(800) PATH '$.r',
               o VARCHAR(64) PATH '$.o',
               j VARCHAR(200) CHARACTER SET utf8mb4 PATH '$.j',
               q BIGINT PATH '$.q')) AS j
      LEFT JOIN fencecron_leases l ON l.resource = j.r
     ORDER BY j.ord;
END;

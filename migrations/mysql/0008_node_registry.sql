-- fencecron 0008: the fleet's nodes (`fencecron nodes`, config drift). See
-- migrations/postgres/0006 for what the new columns hold. Every new column
-- has a default, so a daemon of the previous release, which only upserts
-- (node, seen_ms) in fencecron_claim_v1, keeps working during a rolling
-- upgrade. fencecron_claim_v1 is defined again with the same parameters;
-- the only change: a node that stopped cleanly (state 'stopped') no longer
-- counts for the share, the same "live" as `fencecron nodes`.
ALTER TABLE fencecron_nodes
    ADD COLUMN hostname VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL DEFAULT '',
    ADD COLUMN pid BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN version VARCHAR(64) CHARACTER SET utf8mb4 NOT NULL DEFAULT '',
    ADD COLUMN config_digest VARCHAR(64) CHARACTER SET utf8mb4 NOT NULL DEFAULT '',
    ADD COLUMN started_at_ms BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN state VARCHAR(16) CHARACTER SET utf8mb4 NOT NULL DEFAULT 'running',
    ADD COLUMN running BIGINT NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS fencecron_node_jobs (
    node       VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
    job        VARCHAR(200) CHARACTER SET utf8mb4 NOT NULL,
    digest     VARCHAR(64) CHARACTER SET utf8mb4 NOT NULL,
    definition MEDIUMTEXT CHARACTER SET utf8mb4 NOT NULL,
    PRIMARY KEY (node, job)
) ENGINE = InnoDB;

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
    DECLARE v_done INT DEFAULT 0;
    DECLARE c_resource VARBINARY(800);
    DECLARE c_owner VARCHAR(64);
    DECLARE c_job VARCHAR(200) CHARACTER SET utf8mb4;
    DECLARE c_occ BIGINT;
    DECLARE c_lease BIGINT;
    DECLARE cand CURSOR FOR
        SELECT l.resource, j.o, j.j, j.q, j.l
          FROM JSON_TABLE(p_items, '$[*]' COLUMNS(
                   ord FOR ORDINALITY,
                   r VARBINARY(800) PATH '$.r',
                   o VARCHAR(64) PATH '$.o',
                   j VARCHAR(200) CHARACTER SET utf8mb4 PATH '$.j',
                   q BIGINT PATH '$.q',
                   n BIGINT PATH '$.n',
                   l BIGINT PATH '$.l')) AS j
          JOIN fencecron_leases l ON l.resource = j.r
         WHERE l.expires_at_ms <= v_now
           AND (l.last_occurrence_ms IS NULL OR l.last_occurrence_ms < j.q)
           AND j.q <= v_now
           AND (j.n IS NULL OR j.n > v_now)
           AND NOT EXISTS (SELECT 1 FROM fencecron_pauses p
                            WHERE p.job = j.j AND (p.until_ms IS NULL OR p.until_ms > v_now))
         ORDER BY j.ord
         LIMIT v_lim
           FOR UPDATE SKIP LOCKED;
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

    START TRANSACTION;
    OPEN cand;
    claim: LOOP
        FETCH cand INTO c_resource, c_owner, c_job, c_occ, c_lease;
        IF v_done = 1 THEN
            LEAVE claim;
        END IF;
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
               (job, resource, scheduled_at_ms, started_by, node, owner_id, token, started_at_ms)
        SELECT c_job, resource, c_occ, 'schedule', p_node, owner_id, fence, acquired_at_ms
          FROM fencecron_leases WHERE resource = c_resource
        ON DUPLICATE KEY UPDATE id = id;
    END LOOP claim;
    CLOSE cand;
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
           v_lim AS lim
      FROM JSON_TABLE(p_items, '$[*]' COLUMNS(
               ord FOR ORDINALITY,
               r VARBINARY(800) PATH '$.r',
               o VARCHAR(64) PATH '$.o',
               j VARCHAR(200) CHARACTER SET utf8mb4 PATH '$.j',
               q BIGINT PATH '$.q')) AS j
      LEFT JOIN fencecron_leases l ON l.resource = j.r
     ORDER BY j.ord;
END;

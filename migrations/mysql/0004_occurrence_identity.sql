-- One identity per occurrence, and instants superseded by the store's
-- clock refused (issue 16, items 2 and 3).
--
-- fencecron_acquire_v2 is fencecron_acquire (migration 0003) with:
-- - adoption: when this very owner already won this very occurrence and has
--   not released it, the call wins again with the same token (nobody else
--   ever saw it), its prev_* kept and its expiry at least now + lease. A
--   daemon uses one owner id for every attempt at one occurrence, so a retry
--   takes over the win of an earlier attempt that committed after the
--   daemon stopped waiting for its answer, instead of finding its own
--   occurrence "taken" and leaving the instant to no one. The adopted
--   expiry also moves by at least 1 ms, so ROW_COUNT() says 1 whatever the
--   connection's CLIENT_FOUND_ROWS flag.
-- - p_next_ms, the job's next instant: refused (nothing written) once it is
--   due by the store's clock, so a node whose clock runs behind cannot take
--   an instant the fleet has already moved past.
-- Every IF below tests the adoption condition on the row as it was: MySQL
-- assigns a single-table UPDATE's SET list left to right, so released,
-- owner_id and last_occurrence_ms are assigned after every use of it.
--
-- The old procedure stays: a daemon of the previous release, during a
-- rolling upgrade, keeps calling it.
DROP PROCEDURE IF EXISTS fencecron_acquire_v2;

CREATE PROCEDURE fencecron_acquire_v2(
    IN p_resource VARBINARY(800),
    IN p_owner    VARCHAR(64),
    IN p_node     VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_lease_ms BIGINT,
    IN p_occ_ms   BIGINT,
    IN p_next_ms  BIGINT
)
    MODIFIES SQL DATA
    SQL SECURITY INVOKER
BEGIN
    DECLARE v_won BIGINT DEFAULT 0;
    DECLARE v_found INT DEFAULT 1;
    DECLARE v_dup INT DEFAULT 0;
    DECLARE v_round INT DEFAULT 0;
    DECLARE v_fence BIGINT;
    DECLARE v_owner VARCHAR(64);
    DECLARE v_node VARCHAR(255) CHARACTER SET utf8mb4;
    DECLARE v_expires BIGINT;
    DECLARE v_last BIGINT;
    DECLARE v_prev_owner VARCHAR(64);
    DECLARE v_prev_node VARCHAR(255) CHARACTER SET utf8mb4;
    DECLARE v_prev_fence BIGINT;
    DECLARE v_prev_expires BIGINT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
    -- Never leave the transaction open on a pooled connection.
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        ROLLBACK;
        RESIGNAL;
    END;
    -- Two callers creating the same new row: the second one's INSERT hits
    -- the primary key and competes through the UPDATE instead.
    DECLARE CONTINUE HANDLER FOR 1062 SET v_dup = 1;

    attempt: LOOP
        SET v_round = v_round + 1;
        START TRANSACTION;
        UPDATE fencecron_leases
           SET prev_owner_id = IF((owner_id = p_owner AND last_occurrence_ms = p_occ_ms AND NOT released), prev_owner_id, IF(released, NULL, owner_id)),
               prev_node = IF((owner_id = p_owner AND last_occurrence_ms = p_occ_ms AND NOT released), prev_node, IF(released, NULL, node)),
               prev_fence = IF((owner_id = p_owner AND last_occurrence_ms = p_occ_ms AND NOT released), prev_fence, IF(released, NULL, fence)),
               prev_expires_at_ms = IF((owner_id = p_owner AND last_occurrence_ms = p_occ_ms AND NOT released), prev_expires_at_ms, IF(released, NULL, expires_at_ms)),
               fence = IF((owner_id = p_owner AND last_occurrence_ms = p_occ_ms AND NOT released), fence, fence + 1),
               acquired_at_ms = IF((owner_id = p_owner AND last_occurrence_ms = p_occ_ms AND NOT released), acquired_at_ms, CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED)),
               expires_at_ms = IF((owner_id = p_owner AND last_occurrence_ms = p_occ_ms AND NOT released),
                                  GREATEST(expires_at_ms + 1, CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED) + p_lease_ms),
                                  CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED) + p_lease_ms),
               released = FALSE,
               owner_id = p_owner, node = p_node,
               last_occurrence_ms = COALESCE(p_occ_ms, last_occurrence_ms)
         WHERE resource = p_resource
           AND ((expires_at_ms <= CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED)
                 AND (p_occ_ms IS NULL OR last_occurrence_ms IS NULL OR last_occurrence_ms < p_occ_ms))
                OR (owner_id = p_owner AND last_occurrence_ms = p_occ_ms AND NOT released))
           AND (p_occ_ms IS NULL OR p_occ_ms <= CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED))
           AND (p_next_ms IS NULL OR p_next_ms > CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED));
        SET v_won = ROW_COUNT();
        IF v_won = 1 THEN
            UPDATE fencecron_leases
               SET fence = GREATEST(fence,
                   COALESCE((SELECT e.epoch FROM fencecron_epoch e WHERE e.id = 1), 0)
                   * 4294967296 + 1)
             WHERE resource = p_resource;
        END IF;
        COMMIT;
        SET v_found = 1;
        SELECT fence, owner_id, node, expires_at_ms, last_occurrence_ms,
               prev_owner_id, prev_node, prev_fence, prev_expires_at_ms
          INTO v_fence, v_owner, v_node, v_expires, v_last,
               v_prev_owner, v_prev_node, v_prev_fence, v_prev_expires
          FROM fencecron_leases WHERE resource = p_resource;
        IF v_found = 1 OR v_round > 1 THEN
            LEAVE attempt;
        END IF;
        -- First acquisition of this resource ever (refused while the
        -- occurrence is not yet due by the store's clock).
        SET v_dup = 0;
        INSERT INTO fencecron_leases
               (resource, fence, owner_id, node, acquired_at_ms, expires_at_ms, last_occurrence_ms,
                released)
        SELECT p_resource,
               COALESCE((SELECT e.epoch FROM fencecron_epoch e WHERE e.id = 1), 0) * 4294967296 + 1,
               p_owner, p_node,
               CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED),
               CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED) + p_lease_ms,
               p_occ_ms, FALSE
          FROM DUAL
         WHERE (p_occ_ms IS NULL OR p_occ_ms <= CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED))
           AND (p_next_ms IS NULL OR p_next_ms > CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED));
        IF v_dup = 0 THEN
            SET v_won = ROW_COUNT();
            IF v_won = 1 THEN
                SET v_found = 1;
                SELECT fence, owner_id, node, expires_at_ms, last_occurrence_ms,
                       prev_owner_id, prev_node, prev_fence, prev_expires_at_ms
                  INTO v_fence, v_owner, v_node, v_expires, v_last,
                       v_prev_owner, v_prev_node, v_prev_fence, v_prev_expires
                  FROM fencecron_leases WHERE resource = p_resource;
            END IF;
            LEAVE attempt;
        END IF;
    END LOOP attempt;

    SELECT v_won AS won,
           IF(v_found = 1, v_fence, NULL) AS fence,
           IF(v_found = 1, v_owner, NULL) AS owner_id,
           IF(v_found = 1, v_node, NULL) AS node,
           IF(v_found = 1, v_expires, NULL) AS expires_at_ms,
           IF(v_found = 1, v_last, NULL) AS last_occurrence_ms,
           CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED) AS now_ms,
           IF(v_found = 1 AND v_won = 1, v_prev_owner, NULL) AS prev_owner_id,
           IF(v_found = 1 AND v_won = 1, v_prev_node, NULL) AS prev_node,
           IF(v_found = 1 AND v_won = 1, v_prev_fence, NULL) AS prev_fence,
           IF(v_found = 1 AND v_won = 1, v_prev_expires, NULL) AS prev_expires_at_ms;
END;

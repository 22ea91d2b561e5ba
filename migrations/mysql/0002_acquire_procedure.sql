-- Acquire in one round trip. MySQL has no UPDATE ... RETURNING, so a caller
-- that won had to read the store's expiry back, and a caller that lost had
-- to read who holds the lease: two statements per acquire. This procedure
-- runs the same conditional UPDATE as before and then reads the row, on the
-- server, and answers with one row:
--   won (1 if this call took the lease), fence, owner_id, node,
--   expires_at_ms, last_occurrence_ms (NULL columns when the resource has no
--   row), now_ms (SYSDATE(3) in milliseconds).
-- Each statement inside commits on its own (autocommit), exactly as when the
-- client sent them one by one. Times are SYSDATE(3), evaluated when each
-- statement runs, never NOW() (fixed at statement start).
DROP PROCEDURE IF EXISTS fencecron_acquire;

CREATE PROCEDURE fencecron_acquire(
    IN p_resource VARBINARY(800),
    IN p_owner    VARCHAR(64),
    IN p_node     VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_lease_ms BIGINT,
    IN p_occ_ms   BIGINT
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
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = 0;
    -- Two callers creating the same new row: the second one's INSERT hits
    -- the primary key and competes through the UPDATE instead.
    DECLARE CONTINUE HANDLER FOR 1062 SET v_dup = 1;

    attempt: LOOP
        SET v_round = v_round + 1;
        UPDATE fencecron_leases
           SET fence = fence + 1, owner_id = p_owner, node = p_node,
               acquired_at_ms = CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED),
               expires_at_ms = CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED) + p_lease_ms,
               last_occurrence_ms = COALESCE(p_occ_ms, last_occurrence_ms)
         WHERE resource = p_resource
           AND expires_at_ms <= CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED)
           AND (p_occ_ms IS NULL OR last_occurrence_ms IS NULL OR last_occurrence_ms < p_occ_ms)
           AND (p_occ_ms IS NULL OR p_occ_ms <= CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED));
        SET v_won = ROW_COUNT();
        SET v_found = 1;
        SELECT fence, owner_id, node, expires_at_ms, last_occurrence_ms
          INTO v_fence, v_owner, v_node, v_expires, v_last
          FROM fencecron_leases WHERE resource = p_resource;
        IF v_found = 1 OR v_round > 1 THEN
            LEAVE attempt;
        END IF;
        -- First acquisition of this resource ever (refused while the
        -- occurrence is not yet due by the store's clock).
        SET v_dup = 0;
        INSERT INTO fencecron_leases
               (resource, fence, owner_id, node, acquired_at_ms, expires_at_ms, last_occurrence_ms)
        SELECT p_resource, 1, p_owner, p_node,
               CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED),
               CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED) + p_lease_ms,
               p_occ_ms
          FROM DUAL
         WHERE p_occ_ms IS NULL OR p_occ_ms <= CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED);
        IF v_dup = 0 THEN
            SET v_won = ROW_COUNT();
            IF v_won = 1 THEN
                SET v_found = 1;
                SELECT fence, owner_id, node, expires_at_ms, last_occurrence_ms
                  INTO v_fence, v_owner, v_node, v_expires, v_last
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
           CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED) AS now_ms;
END;

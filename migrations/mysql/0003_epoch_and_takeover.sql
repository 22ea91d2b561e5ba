-- Failover-safe tokens and visible takeovers (issue 9, parts 3 and 4).
--
-- Tokens are `epoch << 32 | counter`: a winning acquire sets the fence to
-- GREATEST(fence + 1, epoch * 2^32 + 1), so a token is greater than the
-- previous one of its resource and above every token of earlier epochs.
-- MySQL/MariaDB have no timeline a promoted replica could be recognised by:
-- the epoch is only the stored one, raised by `fencecron epoch advance` in
-- the promotion hook. With epoch 0 tokens stay 1, 2, 3, ... as before;
-- existing rows keep their fences.
CREATE TABLE IF NOT EXISTS fencecron_epoch (
    id    TINYINT NOT NULL,
    epoch BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (id),
    CONSTRAINT fencecron_epoch_one_row CHECK (id = 1),
    CONSTRAINT fencecron_epoch_not_negative CHECK (epoch >= 0)
) ENGINE = InnoDB;
INSERT IGNORE INTO fencecron_epoch (id, epoch) VALUES (1, 0);

-- Takeovers: `released` is set by release and cleared by acquire; a winning
-- acquire that finds it clear copies the vanished owner's id, node, token and
-- expiry into prev_* (NULL after a clean hand-over), and the procedure
-- returns them. Existing rows count as released.
ALTER TABLE fencecron_leases
    ADD COLUMN released           BOOLEAN NOT NULL DEFAULT TRUE,
    ADD COLUMN prev_owner_id      VARCHAR(64) NULL,
    ADD COLUMN prev_node          VARCHAR(255) CHARACTER SET utf8mb4 NULL,
    ADD COLUMN prev_fence         BIGINT NULL,
    ADD COLUMN prev_expires_at_ms BIGINT NULL;

-- The acquire of migration 0002, with the epoch and the takeover columns.
-- Answers one row:
--   won, fence, owner_id, node, expires_at_ms, last_occurrence_ms, now_ms
--   (as in 0002), then prev_owner_id, prev_node, prev_fence,
--   prev_expires_at_ms (the vanished owner a winner took over from; NULL
--   after a clean hand-over, and for a loser).
--
-- The conditional UPDATE and, only when it won, a second UPDATE that lifts
-- the fence to the epoch's first token run in one transaction: one commit
-- as before, and no other session can see the row between the two (it is
-- locked by the first). A losing call's UPDATE matches no row and its
-- transaction is empty: it writes nothing and costs what it cost before.
-- Reading the epoch inside the first UPDATE's SET would cost every loser
-- too (measured on MariaDB 10.11: a `WHERE id = 1` subquery is read as a
-- constant while optimising, one more index read per losing call; a
-- correlated one is prepared on every execution, about 9 us more per
-- losing UPDATE; a stored function pre-locks its table, about 4 us).
-- MySQL assigns a single-table UPDATE's SET list left to right, each
-- assignment seeing the ones before it: prev_* and released are assigned
-- before the columns they copy from change.
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
           SET prev_owner_id = IF(released, NULL, owner_id),
               prev_node = IF(released, NULL, node),
               prev_fence = IF(released, NULL, fence),
               prev_expires_at_ms = IF(released, NULL, expires_at_ms),
               released = FALSE,
               fence = fence + 1,
               owner_id = p_owner, node = p_node,
               acquired_at_ms = CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED),
               expires_at_ms = CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED) + p_lease_ms,
               last_occurrence_ms = COALESCE(p_occ_ms, last_occurrence_ms)
         WHERE resource = p_resource
           AND expires_at_ms <= CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED)
           AND (p_occ_ms IS NULL OR last_occurrence_ms IS NULL OR last_occurrence_ms < p_occ_ms)
           AND (p_occ_ms IS NULL OR p_occ_ms <= CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED));
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
         WHERE p_occ_ms IS NULL OR p_occ_ms <= CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED);
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

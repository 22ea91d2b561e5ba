-- Operating the fleet from the store (issue 10): run history, pauses and
-- manual triggers. See migrations/postgres/0003 for what each table holds.

CREATE TABLE IF NOT EXISTS fencecron_runs (
    id              BIGINT NOT NULL AUTO_INCREMENT,
    job             VARCHAR(200) CHARACTER SET utf8mb4 NOT NULL,
    resource        VARBINARY(800) NOT NULL,
    scheduled_at_ms BIGINT NULL,
    started_by      VARCHAR(16) NOT NULL,
    node            VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
    owner_id        VARCHAR(64) NOT NULL,
    token           BIGINT NOT NULL,
    started_at_ms   BIGINT NOT NULL,
    finished_at_ms  BIGINT NULL,
    outcome         VARCHAR(32) NULL,
    exit_code       BIGINT NULL,
    signal_name     VARCHAR(16) NULL,
    duration_ms     BIGINT NULL,
    output_tail     TEXT CHARACTER SET utf8mb4 NULL,
    PRIMARY KEY (id),
    UNIQUE KEY fencecron_runs_token (resource, token),
    KEY fencecron_runs_job (job, id),
    KEY fencecron_runs_started (started_at_ms)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS fencecron_pauses (
    job             VARCHAR(200) CHARACTER SET utf8mb4 NOT NULL,
    note            TEXT CHARACTER SET utf8mb4 NULL,
    since_ms        BIGINT NOT NULL,
    until_ms        BIGINT NULL,
    paused_by       VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
    last_skipped_ms BIGINT NULL,
    PRIMARY KEY (job)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS fencecron_triggers (
    id              VARCHAR(64) NOT NULL,
    job             VARCHAR(200) CHARACTER SET utf8mb4 NOT NULL,
    requested_at_ms BIGINT NOT NULL,
    requested_by    VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
    state           VARCHAR(16) NOT NULL,
    node            VARCHAR(255) CHARACTER SET utf8mb4 NULL,
    token           BIGINT NULL,
    detail          TEXT CHARACTER SET utf8mb4 NULL,
    PRIMARY KEY (id),
    KEY fencecron_triggers_state (state)
) ENGINE = InnoDB;

-- fencecron_acquire_v3 is fencecron_acquire_v2 (migration 0004) with:
-- - p_job, p_by, p_sched_ms: a winning call for a job inserts the run's
--   row into fencecron_runs in the same transaction (a losing call writes
--   nothing); p_by is how the run was started (schedule, manual, retry),
--   p_sched_ms its instant (NULL for a manual run);
-- - pauses: a scheduled call (p_occ_ms set) for a paused job wins nothing
--   and reports the pause; the one call per instant that moves the pause's
--   last_skipped_ms is told it was the first (pause_first = 1).
-- v2 stays for daemons of the previous release during a rolling upgrade.
DROP PROCEDURE IF EXISTS fencecron_acquire_v3;

CREATE PROCEDURE fencecron_acquire_v3(
    IN p_resource VARBINARY(800),
    IN p_owner    VARCHAR(64),
    IN p_node     VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_lease_ms BIGINT,
    IN p_occ_ms   BIGINT,
    IN p_next_ms  BIGINT,
    IN p_job      VARCHAR(200) CHARACTER SET utf8mb4,
    IN p_by       VARCHAR(16),
    IN p_sched_ms BIGINT
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
    DECLARE v_now BIGINT;
    DECLARE v_paused BIGINT DEFAULT 0;
    DECLARE v_pause_note TEXT CHARACTER SET utf8mb4;
    DECLARE v_pause_since BIGINT;
    DECLARE v_pause_until BIGINT;
    DECLARE v_pause_first BIGINT DEFAULT 0;
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

    -- A paused job's scheduled instant (or its retry): nothing is won; the
    -- one caller per instant that moves last_skipped_ms is told it was the
    -- first.
    IF p_job IS NOT NULL AND (p_occ_ms IS NOT NULL OR p_by = 'retry') THEN
        SET v_now = CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED);
        SELECT 1, note, since_ms, until_ms
          INTO v_paused, v_pause_note, v_pause_since, v_pause_until
          FROM fencecron_pauses
         WHERE job = p_job AND (until_ms IS NULL OR until_ms > v_now);
        SET v_found = 1;
        IF v_paused = 1 AND p_occ_ms <= v_now
           AND (p_next_ms IS NULL OR p_next_ms > v_now) THEN
            UPDATE fencecron_pauses SET last_skipped_ms = p_occ_ms
             WHERE job = p_job AND (last_skipped_ms IS NULL OR last_skipped_ms < p_occ_ms);
            SET v_pause_first = ROW_COUNT();
        END IF;
    END IF;

    attempt: LOOP
        IF v_paused = 1 THEN
            SET v_found = 0;
            LEAVE attempt;
        END IF;
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
            IF p_job IS NOT NULL THEN
                INSERT INTO fencecron_runs
                       (job, resource, scheduled_at_ms, started_by, node, owner_id, token,
                        started_at_ms)
                SELECT p_job, resource, p_sched_ms, p_by, p_node,
                       owner_id, fence, acquired_at_ms
                  FROM fencecron_leases WHERE resource = p_resource
                ON DUPLICATE KEY UPDATE id = id;
            END IF;
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
        START TRANSACTION;
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
        SET v_won = IF(v_dup = 0, ROW_COUNT(), 0);
        IF v_won = 1 AND p_job IS NOT NULL THEN
            INSERT INTO fencecron_runs
                   (job, resource, scheduled_at_ms, started_by, node, owner_id, token,
                    started_at_ms)
            SELECT p_job, resource, p_sched_ms, p_by, p_node,
                   owner_id, fence, acquired_at_ms
              FROM fencecron_leases WHERE resource = p_resource;
        END IF;
        COMMIT;
        IF v_dup = 0 THEN
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
           IF(v_found = 1 AND v_won = 1, v_prev_expires, NULL) AS prev_expires_at_ms,
           v_paused AS paused,
           v_pause_note AS pause_note,
           v_pause_since AS pause_since_ms,
           v_pause_until AS pause_until_ms,
           v_pause_first AS pause_first;
END;

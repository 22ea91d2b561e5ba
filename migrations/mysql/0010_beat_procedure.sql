-- fencecron 0010: a node's heartbeat in one round trip. A beat was three
-- statements (the store's clock, the upsert of the node's row, the read of
-- the node rows for the drift check); PostgreSQL does it in one statement,
-- MySQL has no INSERT ... RETURNING, so this procedure does it on the
-- server and answers with the live nodes:
-- - the row of p_node is inserted or replaced, seen_ms being SYSDATE(3)
--   in milliseconds, started_at_ms that same time when p_started_ms is
--   NULL (the node's first beat);
-- - it answers one row per node live at that time (seen within p_live_ms
--   and not 'stopped': NodeInfo::live, the claim's share counts the same
--   nodes), ordered by node, each with that time as now_ms; when no node is
--   live (the beat said 'stopped' and nobody else beats), one row with
--   now_ms and NULL columns.
-- A new procedure beside the others: the previous release, which reads
-- the clock and upserts with its own statements, keeps working during a
-- rolling upgrade.
DROP PROCEDURE IF EXISTS fencecron_beat_v1;

CREATE PROCEDURE fencecron_beat_v1(
    IN p_node       VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_hostname   VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_pid        BIGINT,
    IN p_version    VARCHAR(64) CHARACTER SET utf8mb4,
    IN p_digest     VARCHAR(64) CHARACTER SET utf8mb4,
    IN p_started_ms BIGINT,
    IN p_state      VARCHAR(16) CHARACTER SET utf8mb4,
    IN p_running    BIGINT,
    IN p_live_ms    BIGINT
)
    MODIFIES SQL DATA
    SQL SECURITY INVOKER
BEGIN
    DECLARE v_now BIGINT;

    SET v_now = CAST(FLOOR(UNIX_TIMESTAMP(SYSDATE(3)) * 1000) AS SIGNED);
    INSERT INTO fencecron_nodes
           (node, seen_ms, hostname, pid, version, config_digest, started_at_ms, state, running)
    VALUES (p_node, v_now, p_hostname, p_pid, p_version, p_digest,
            COALESCE(p_started_ms, v_now), p_state, p_running)
    ON DUPLICATE KEY UPDATE
        seen_ms = v_now, hostname = p_hostname, pid = p_pid, version = p_version,
        config_digest = p_digest, started_at_ms = COALESCE(p_started_ms, v_now),
        state = p_state, running = p_running;
    SELECT v_now AS now_ms, n.node, n.seen_ms, n.hostname, n.pid, n.version, n.config_digest,
           n.started_at_ms, n.state, n.running
      FROM (SELECT 1 AS one) AS t
      LEFT JOIN fencecron_nodes n ON n.state <> 'stopped' AND n.seen_ms > v_now - p_live_ms
     ORDER BY n.node;
END;

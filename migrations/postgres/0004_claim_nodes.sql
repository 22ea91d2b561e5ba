-- fencecron 0004: the nodes that claim scheduled occurrences in batches.
-- A batch claim marks its node here (at most every 10 s, so a claim that
-- loses everything writes nothing most of the time) and counts the nodes
-- marked in the last 30 s to take only its share of a burst. Nothing else
-- reads the table. One small row per node id ever used; a node that is gone
-- stops counting 30 s after its last claim.
CREATE TABLE IF NOT EXISTS fencecron_nodes (
    node     TEXT PRIMARY KEY,
    seen_ms  BIGINT NOT NULL
);

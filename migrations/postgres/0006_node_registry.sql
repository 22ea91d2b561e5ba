-- fencecron 0006: the fleet's nodes (`fencecron nodes`, config drift).
-- fencecron_nodes (0004) becomes the registry of daemons: each refreshes
-- its row every 5 s with the store's clock (seen_ms) and what it is:
-- host name, pid, version, a digest of its whole job set, when it started
-- (store clock), its state (running, draining, stopped) and how many runs
-- it holds. A node is live while seen within 15 s and not stopped (the
-- claim's share counts the same nodes). Every new column has a default, so
-- a daemon of the previous release, which only upserts (node, seen_ms) in
-- its batch claim, keeps working during a rolling upgrade.
-- fencecron_node_jobs holds each node's job definitions (canonical JSON and
-- its SHA-256), rewritten when the node's job set changes (start, reload).
-- Rows of nodes not seen for 7 days are deleted.
ALTER TABLE fencecron_nodes
    ADD COLUMN IF NOT EXISTS hostname TEXT NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS pid BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS version TEXT NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS config_digest TEXT NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS started_at_ms BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS state TEXT NOT NULL DEFAULT 'running',
    ADD COLUMN IF NOT EXISTS running BIGINT NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS fencecron_node_jobs (
    node       TEXT NOT NULL,
    job        TEXT NOT NULL,
    digest     TEXT NOT NULL,
    definition TEXT NOT NULL,
    PRIMARY KEY (node, job)
);

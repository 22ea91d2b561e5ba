-- fencecron 0005: the fleet's nodes (`fencecron nodes`, config drift): the
-- daemons of this host on this file. See migrations/postgres/0006 for what
-- the columns hold. SQLite has no batch claim share, so the table is new
-- here.
CREATE TABLE IF NOT EXISTS fencecron_nodes (
    node          TEXT PRIMARY KEY,
    seen_ms       INTEGER NOT NULL,
    hostname      TEXT NOT NULL DEFAULT '',
    pid           INTEGER NOT NULL DEFAULT 0,
    version       TEXT NOT NULL DEFAULT '',
    config_digest TEXT NOT NULL DEFAULT '',
    started_at_ms INTEGER NOT NULL DEFAULT 0,
    state         TEXT NOT NULL DEFAULT 'running',
    running       INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE IF NOT EXISTS fencecron_node_jobs (
    node       TEXT NOT NULL,
    job        TEXT NOT NULL,
    digest     TEXT NOT NULL,
    definition TEXT NOT NULL,
    PRIMARY KEY (node, job)
);

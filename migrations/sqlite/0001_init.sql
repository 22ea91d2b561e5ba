-- Leases: one row per resource, created by the first acquisition and never
-- deleted, so the fence survives release and expiry. Times are milliseconds
-- since the Unix epoch by the host kernel's clock.
CREATE TABLE IF NOT EXISTS fencecron_leases (
    resource           TEXT PRIMARY KEY,
    fence              BIGINT NOT NULL CHECK (fence > 0),
    owner_id           TEXT NOT NULL,
    node               TEXT NOT NULL,
    acquired_at_ms     BIGINT NOT NULL,
    expires_at_ms      BIGINT NOT NULL,
    -- The last scheduled occurrence taken for this resource: each occurrence
    -- runs at most once across the fleet.
    last_occurrence_ms BIGINT NULL
);

-- The built-in fenced key/value store.
CREATE TABLE IF NOT EXISTS fencecron_values (
    resource      TEXT NOT NULL,
    key           TEXT NOT NULL,
    value         BLOB NOT NULL,
    token         BIGINT NOT NULL,
    owner_id      TEXT NULL,
    operation_id  TEXT NOT NULL,
    written_at_ms BIGINT NOT NULL,
    PRIMARY KEY (resource, key)
);

-- Stale-owner records: rejected writes and lost leases, from every host.
CREATE TABLE IF NOT EXISTS fencecron_stale (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms          BIGINT NOT NULL,
    kind           TEXT NOT NULL,
    reason         TEXT NOT NULL,
    resource       TEXT NOT NULL,
    key            TEXT NULL,
    owner_id       TEXT NULL,
    token          BIGINT NOT NULL,
    accepted_token BIGINT NULL,
    node           TEXT NOT NULL,
    job            TEXT NULL,
    stage          TEXT NOT NULL,
    operation_id   TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS fencecron_stale_at ON fencecron_stale (at_ms);

-- Failover-safe tokens and visible takeovers (issue 9, parts 3 and 4).
--
-- Tokens are `epoch << 32 | counter`: a winning acquire sets the fence to
-- max(fence + 1, (epoch << 32) + 1). The epoch is raised by
-- `fencecron epoch advance` (e.g. after restoring an old copy of the file).
-- With epoch 0 tokens stay 1, 2, 3, ... as before; existing rows keep their
-- fences.
CREATE TABLE IF NOT EXISTS fencecron_epoch (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL DEFAULT 0 CHECK (epoch >= 0)
);
INSERT OR IGNORE INTO fencecron_epoch (id, epoch) VALUES (1, 0);

-- Takeovers: `released` is set by release and cleared by acquire; a winning
-- acquire that finds it clear copies the vanished owner's id, node, token and
-- expiry into prev_* (NULL after a clean hand-over). Existing rows count as
-- released.
ALTER TABLE fencecron_leases ADD COLUMN released BOOLEAN NOT NULL DEFAULT 1;
ALTER TABLE fencecron_leases ADD COLUMN prev_owner_id TEXT NULL;
ALTER TABLE fencecron_leases ADD COLUMN prev_node TEXT NULL;
ALTER TABLE fencecron_leases ADD COLUMN prev_fence BIGINT NULL;
ALTER TABLE fencecron_leases ADD COLUMN prev_expires_at_ms BIGINT NULL;

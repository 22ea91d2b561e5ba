-- fencecron 0009: `fencecron lease forget`. See migrations/postgres/0007:
-- the row and its fence stay, only hidden from `lease list` until the
-- resource is acquired again. A nullable column: the acquire procedures of
-- the previous release keep working during a rolling upgrade.
ALTER TABLE fencecron_leases ADD COLUMN IF NOT EXISTS forgotten_at_ms BIGINT NULL;

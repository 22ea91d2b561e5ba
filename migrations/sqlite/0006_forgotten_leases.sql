-- fencecron 0006: `fencecron lease forget`. See migrations/postgres/0007:
-- the row and its fence stay, only hidden from `lease list` until the
-- resource is acquired again.
ALTER TABLE fencecron_leases ADD COLUMN forgotten_at_ms INTEGER NULL;

-- fencecron 0007: `fencecron lease forget`. A forgotten lease row is hidden
-- from `lease list` and `status` until its resource is acquired again
-- (acquired_at_ms moves past forgotten_at_ms). The row itself, and its
-- fence, stay: deleting it would issue tokens again from 1.
ALTER TABLE fencecron_leases ADD COLUMN IF NOT EXISTS forgotten_at_ms BIGINT NULL;

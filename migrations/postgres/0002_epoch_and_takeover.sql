-- Failover-safe tokens and visible takeovers (issue 9, parts 3 and 4).
--
-- Tokens are `epoch << 32 | counter`. A winning acquire sets the fence to
-- GREATEST(fence + 1, (epoch << 32) + 1), so a token is always greater than
-- the previous one of its resource *and* above every token of earlier
-- epochs. The effective epoch on PostgreSQL is
--     stored epoch + (timeline - 1) * 1024
-- where the timeline is read by the acquiring statement itself: a standby
-- promoted after missing the primary's last commits is on a later timeline,
-- so its tokens start above anything the old primary could have issued. The
-- stored epoch is raised by `fencecron epoch advance` (failover hooks, and
-- cases the timeline does not cover). With epoch 0 on timeline 1 tokens stay
-- 1, 2, 3, ... as before. Existing rows keep their fences.
CREATE TABLE IF NOT EXISTS fencecron_epoch (
    id    SMALLINT PRIMARY KEY CHECK (id = 1),
    epoch BIGINT NOT NULL DEFAULT 0 CHECK (epoch >= 0)
);
INSERT INTO fencecron_epoch (id, epoch) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;

-- The lowest token the effective epoch can issue: (epoch << 32) + 1. The
-- timeline is the first 8 hex digits of the current WAL file name, which
-- uses the timeline WAL is being inserted on: a promotion moves it at once
-- (the control file's checkpoint timeline would lag until the next
-- checkpoint). pg_walfile_name and pg_current_wal_lsn are executable by
-- every role; pg_walfile_name fails on a standby, where no acquire can
-- write anyway.
--
-- PL/pgSQL on purpose: the acquire calls it in its UPDATE's SET, so it runs
-- only for a row that matched, and the planner cannot inline it. A
-- subquery on fencecron_epoch there would put that table in every
-- acquire's plan, opened and locked at each executor start also when the
-- acquire loses (measured: about 4 us more per losing acquire).
CREATE OR REPLACE FUNCTION fencecron_token_floor() RETURNS BIGINT
    LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN ((COALESCE((SELECT epoch FROM fencecron_epoch WHERE id = 1), 0)
             + (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1)
               * 1024) << 32) + 1;
END
$$;

-- Takeovers: `released` is set by release and cleared by acquire. A winning
-- acquire that finds it clear took over a lease whose owner vanished
-- without releasing it; the same UPDATE copies that owner's id, node, token
-- and store-clock expiry into prev_* (NULL after a clean hand-over), so the
-- acquire can return them. Rows that exist before this migration count as
-- released: nothing is known about how their last owner ended.
ALTER TABLE fencecron_leases
    ADD COLUMN IF NOT EXISTS released           BOOLEAN NOT NULL DEFAULT TRUE,
    ADD COLUMN IF NOT EXISTS prev_owner_id      TEXT NULL,
    ADD COLUMN IF NOT EXISTS prev_node          TEXT NULL,
    ADD COLUMN IF NOT EXISTS prev_fence         BIGINT NULL,
    ADD COLUMN IF NOT EXISTS prev_expires_at_ms BIGINT NULL;

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

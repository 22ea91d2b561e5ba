-- Operating the fleet from the store (issue 10): run history, pauses and
-- manual triggers. Times are milliseconds since the Unix epoch by the
-- database server's clock.

-- One row per run the fleet started: inserted by the winning acquire itself
-- (a losing acquire writes nothing), finished by one UPDATE when the run
-- ends. A row with no finished_at_ms whose lease is no longer held by its
-- token is a run whose node died: `fencecron runs` shows it as `unknown`.
CREATE TABLE IF NOT EXISTS fencecron_runs (
    id              BIGSERIAL PRIMARY KEY,
    job             TEXT NOT NULL,
    resource        TEXT NOT NULL,
    scheduled_at_ms BIGINT NULL,
    started_by      TEXT NOT NULL,
    node            TEXT NOT NULL,
    owner_id        TEXT NOT NULL,
    token           BIGINT NOT NULL,
    started_at_ms   BIGINT NOT NULL,
    finished_at_ms  BIGINT NULL,
    outcome         TEXT NULL,
    exit_code       BIGINT NULL,
    signal_name     TEXT NULL,
    duration_ms     BIGINT NULL,
    output_tail     TEXT NULL,
    -- A retry that adopts its own earlier win inserts nothing twice.
    UNIQUE (resource, token)
);
CREATE INDEX IF NOT EXISTS fencecron_runs_job ON fencecron_runs (job, id);
CREATE INDEX IF NOT EXISTS fencecron_runs_started ON fencecron_runs (started_at_ms);

-- Records a winning acquire's run: called by the acquire's final SELECT
-- once per row its UPDATE (or first INSERT) returned, i.e. exactly once per
-- win. A losing acquire never calls it, so it does not open fencecron_runs
-- and its indexes (as a data-modifying CTE would, win or lose). A retry
-- adopting its own win finds the row already there.
CREATE OR REPLACE FUNCTION fencecron_record_run(
    p_job TEXT, p_resource TEXT, p_scheduled BIGINT, p_by TEXT, p_node TEXT,
    p_owner TEXT, p_token BIGINT, p_started BIGINT) RETURNS BOOLEAN
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF p_job IS NULL THEN
        RETURN FALSE;
    END IF;
    INSERT INTO fencecron_runs
           (job, resource, scheduled_at_ms, started_by, node, owner_id, token, started_at_ms)
    VALUES (p_job, p_resource, p_scheduled, p_by, p_node, p_owner, p_token, p_started)
    ON CONFLICT (resource, token) DO NOTHING;
    RETURN FOUND;
END
$$;

-- Paused jobs, fleet-wide. The scheduled acquire of a paused job wins
-- nothing; the one acquire per instant that moves last_skipped_ms logs the
-- skip at INFO, every other host at DEBUG.
CREATE TABLE IF NOT EXISTS fencecron_pauses (
    job             TEXT PRIMARY KEY,
    note            TEXT NULL,
    since_ms        BIGINT NOT NULL,
    until_ms        BIGINT NULL,
    paused_by       TEXT NOT NULL,
    last_skipped_ms BIGINT NULL
);

-- Notes the paused instant p_occ as skipped; true for the one caller per
-- instant whose UPDATE moved last_skipped_ms (it logs the skip at INFO).
-- Called by a scheduled acquire only when the job is paused.
CREATE OR REPLACE FUNCTION fencecron_note_paused_skip(
    p_job TEXT, p_occ BIGINT, p_now BIGINT) RETURNS BOOLEAN
    LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    UPDATE fencecron_pauses SET last_skipped_ms = p_occ
     WHERE job = p_job AND (until_ms IS NULL OR until_ms > p_now)
       AND (last_skipped_ms IS NULL OR last_skipped_ms < p_occ);
    RETURN FOUND;
END
$$;

-- Requests to run a job now (`fencecron trigger`), with an id the CLI
-- makes up (a UUID): pending until one daemon claims the row, then started
-- (with the run's token) or refused (with the holder).
CREATE TABLE IF NOT EXISTS fencecron_triggers (
    id              TEXT PRIMARY KEY,
    job             TEXT NOT NULL,
    requested_at_ms BIGINT NOT NULL,
    requested_by    TEXT NOT NULL,
    state           TEXT NOT NULL,
    node            TEXT NULL,
    token           BIGINT NULL,
    detail          TEXT NULL
);
CREATE INDEX IF NOT EXISTS fencecron_triggers_state ON fencecron_triggers (state);

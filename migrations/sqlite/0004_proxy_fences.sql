-- fencecron 0004: the fencing HTTP proxy (`fencecron proxy`). One row per
-- resource a proxy has forwarded a request for: the highest token it
-- accepted. A proxy forwards a request only with a token at least this high
-- and raises it in one conditional statement, so every proxy on this store
-- agrees. A row is created only by an accepted token (one the store issued
-- for the resource), never by a refused one.
CREATE TABLE IF NOT EXISTS fencecron_proxy_fences (
    resource TEXT PRIMARY KEY,
    highest  BIGINT NOT NULL CHECK (highest > 0)
);

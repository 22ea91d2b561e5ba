-- Leases: one row per resource, created by the first acquisition and never
-- deleted, so the fence survives release and expiry. Times are milliseconds
-- since the Unix epoch by the database server's clock. Resource and key
-- names are stored as their UTF-8 bytes (VARBINARY) so they compare exactly:
-- `Job` and `job`, or `a` and `a `, are different resources, as on the other
-- backends (a _bin collation would still ignore trailing spaces).
CREATE TABLE IF NOT EXISTS fencecron_leases (
    resource           VARBINARY(800) NOT NULL,
    fence              BIGINT NOT NULL,
    owner_id           VARCHAR(64) NOT NULL,
    node               VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
    acquired_at_ms     BIGINT NOT NULL,
    expires_at_ms      BIGINT NOT NULL,
    last_occurrence_ms BIGINT NULL,
    PRIMARY KEY (resource)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS fencecron_values (
    resource      VARBINARY(800) NOT NULL,
    key_name      VARBINARY(800) NOT NULL,
    value         LONGBLOB NOT NULL,
    token         BIGINT NOT NULL,
    owner_id      VARCHAR(64) NULL,
    operation_id  VARCHAR(64) NOT NULL,
    written_at_ms BIGINT NOT NULL,
    PRIMARY KEY (resource, key_name)
) ENGINE = InnoDB;

CREATE TABLE IF NOT EXISTS fencecron_stale (
    id             BIGINT NOT NULL AUTO_INCREMENT,
    at_ms          BIGINT NOT NULL,
    kind           VARCHAR(32) NOT NULL,
    reason         VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
    resource       VARBINARY(800) NOT NULL,
    key_name       VARBINARY(800) NULL,
    owner_id       VARCHAR(64) NULL,
    token          BIGINT NOT NULL,
    accepted_token BIGINT NULL,
    node           VARCHAR(255) CHARACTER SET utf8mb4 NOT NULL,
    job            VARCHAR(200) CHARACTER SET utf8mb4 NULL,
    stage          VARCHAR(200) CHARACTER SET utf8mb4 NOT NULL,
    operation_id   VARCHAR(64) NOT NULL,
    PRIMARY KEY (id),
    KEY fencecron_stale_at (at_ms)
) ENGINE = InnoDB;

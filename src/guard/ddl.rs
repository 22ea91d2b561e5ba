//! The SQL guard's DDL: one list of idempotent statements per backend,
//! printed by `fencecron guard ddl` ([`script`]) and run by `fencecron
//! guard install` (`GuardDb::install`), and the per-table triggers `fencecron
//! guard trigger` prints ([`trigger_script`]).

use crate::names::Name;
use crate::store::Backend;

/// The SQLSTATE of a refusal, on PostgreSQL and MySQL/MariaDB (SQLite has
/// none; its message starts with [`MESSAGE_PREFIX`] there as everywhere).
#[cfg(test)]
const SQLSTATE: &str = "FC001";

/// How every refusal's message starts, on every backend.
#[cfg(test)]
const MESSAGE_PREFIX: &str = "fencecron_guard: stale token";

/// The guard's objects in PostgreSQL. The function raises the highest with
/// one `INSERT … ON CONFLICT DO UPDATE … WHERE`, which locks the row also
/// when its `WHERE` refuses; a refusal then reads the highest under that
/// lock (READ COMMITTED sees the newest commit; REPEATABLE READ and
/// SERIALIZABLE fail with 40001 instead, an error to retry, never an
/// acceptance).
pub(super) const POSTGRES: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS fencecron_guard (
    resource   TEXT   PRIMARY KEY,
    token      BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL
)",
    "CREATE TABLE IF NOT EXISTS fencecron_guard_rejections (
    id             BIGSERIAL PRIMARY KEY,
    at_ms          BIGINT NOT NULL,
    resource       TEXT   NOT NULL,
    token          BIGINT NOT NULL,
    accepted_token BIGINT NOT NULL,
    source         TEXT   NOT NULL,
    db_user        TEXT,
    node           TEXT,
    job            TEXT,
    owner_id       TEXT,
    operation_id   TEXT   NOT NULL
)",
    "CREATE OR REPLACE FUNCTION fencecron_guard(p_resource TEXT, p_token BIGINT) RETURNS BIGINT
LANGUAGE plpgsql AS $fencecron$
DECLARE
    highest BIGINT;
BEGIN
    IF p_resource IS NULL OR p_token IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22004',
            MESSAGE = 'fencecron_guard: resource and token are required (FENCECRON_RESOURCE, FENCECRON_TOKEN)';
    END IF;
    INSERT INTO fencecron_guard AS g (resource, token, updated_ms)
    VALUES (p_resource, p_token, (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT)
    ON CONFLICT (resource) DO UPDATE
       SET token = EXCLUDED.token, updated_ms = EXCLUDED.updated_ms
     WHERE g.token <= EXCLUDED.token
    RETURNING g.token INTO highest;
    IF FOUND THEN
        RETURN highest;
    END IF;
    SELECT g.token INTO highest FROM fencecron_guard AS g WHERE g.resource = p_resource;
    RAISE EXCEPTION USING ERRCODE = 'FC001',
        MESSAGE = format('fencecron_guard: stale token %s for resource %L: the guard has accepted token %s; this owner was replaced and its transaction is refused', p_token, p_resource, highest),
        HINT = 'Roll back and stop; never retry with this token. Report it with: fencecron guard record --db URL';
END
$fencecron$",
    "CREATE OR REPLACE FUNCTION fencecron_guard_row() RETURNS trigger
LANGUAGE plpgsql AS $fencecron$
BEGIN
    -- TG_ARGV: the resource, the name of the row's fence column.
    PERFORM fencecron_guard(TG_ARGV[0], (to_jsonb(NEW) ->> TG_ARGV[1])::BIGINT);
    RETURN NEW;
END
$fencecron$",
];

/// The guard's objects in MySQL/MariaDB. The rejections table is MyISAM on
/// purpose: not transactional, so the row the procedure writes after its
/// `ROLLBACK` stays whatever the caller does next. The message is cut to
/// the 128 characters `MESSAGE_TEXT` holds.
pub(super) const MYSQL: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS fencecron_guard (
    resource   VARCHAR(255) NOT NULL PRIMARY KEY,
    token      BIGINT       NOT NULL,
    updated_ms BIGINT       NOT NULL
) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS fencecron_guard_rejections (
    id             BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at_ms          BIGINT       NOT NULL,
    resource       VARCHAR(255) NOT NULL,
    token          BIGINT       NOT NULL,
    accepted_token BIGINT       NOT NULL,
    source         VARCHAR(16)  NOT NULL,
    db_user        VARCHAR(255) NULL,
    node           VARCHAR(255) NULL,
    job            VARCHAR(255) NULL,
    owner_id       VARCHAR(64)  NULL,
    operation_id   VARCHAR(64)  NOT NULL,
    KEY fencecron_guard_rejections_at (at_ms)
) ENGINE=MyISAM",
    "DROP PROCEDURE IF EXISTS fencecron_guard",
    "CREATE PROCEDURE fencecron_guard(IN p_resource VARCHAR(255), IN p_token BIGINT)
    MODIFIES SQL DATA
BEGIN
    DECLARE v_highest BIGINT;
    DECLARE v_message VARCHAR(128);
    IF p_resource IS NULL OR p_token IS NULL THEN
        SIGNAL SQLSTATE '22004'
            SET MESSAGE_TEXT = 'fencecron_guard: resource and token are required';
    END IF;
    INSERT INTO fencecron_guard (resource, token, updated_ms)
    VALUES (p_resource, p_token, ROUND(UNIX_TIMESTAMP(SYSDATE(3)) * 1000))
    ON DUPLICATE KEY UPDATE
        updated_ms = IF(token <= p_token, ROUND(UNIX_TIMESTAMP(SYSDATE(3)) * 1000), updated_ms),
        token      = GREATEST(token, p_token);
    SELECT token INTO v_highest FROM fencecron_guard WHERE resource = p_resource FOR UPDATE;
    IF v_highest > p_token THEN
        ROLLBACK;
        INSERT INTO fencecron_guard_rejections
            (at_ms, resource, token, accepted_token, source, db_user, operation_id)
        VALUES (ROUND(UNIX_TIMESTAMP(SYSDATE(3)) * 1000), p_resource, p_token, v_highest,
                'guard', USER(), UUID());
        SET v_message = LEFT(CONCAT('fencecron_guard: stale token ', p_token, ' for ',
                                    LEFT(p_resource, 40), ', accepted ', v_highest), 128);
        SIGNAL SQLSTATE 'FC001' SET MESSAGE_TEXT = v_message;
    END IF;
END",
];

/// The guard's objects in SQLite. The token is compared as an integer
/// whatever type it was bound as (SQLite orders any text above any number,
/// so a token bound as text would otherwise pass every check), and one that
/// is not a whole number is refused. Messages are constants: RAISE takes
/// only a literal before SQLite 3.47.
pub(super) const SQLITE: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS fencecron_guard (
    resource   TEXT    NOT NULL PRIMARY KEY,
    token      INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
)",
    "CREATE TABLE IF NOT EXISTS fencecron_guard_rejections (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms          INTEGER NOT NULL,
    resource       TEXT    NOT NULL,
    token          INTEGER NOT NULL,
    accepted_token INTEGER NOT NULL,
    source         TEXT    NOT NULL,
    db_user        TEXT,
    node           TEXT,
    job            TEXT,
    owner_id       TEXT,
    operation_id   TEXT    NOT NULL
)",
    "CREATE VIEW IF NOT EXISTS fencecron_guard_check (resource, token) AS SELECT NULL, NULL WHERE 0",
    "DROP TRIGGER IF EXISTS fencecron_guard_check_insert",
    "CREATE TRIGGER fencecron_guard_check_insert INSTEAD OF INSERT ON fencecron_guard_check
BEGIN
    SELECT RAISE(ROLLBACK, 'fencecron_guard: resource and token are required, the token a whole number (FENCECRON_RESOURCE, FENCECRON_TOKEN)')
     WHERE NEW.resource IS NULL OR NEW.token IS NULL
        OR CAST(CAST(NEW.token AS INTEGER) AS TEXT) <> CAST(NEW.token AS TEXT);
    SELECT RAISE(ROLLBACK, 'fencecron_guard: stale token: the guard has accepted a newer token for this resource; this owner was replaced and its transaction is rolled back')
     WHERE CAST(NEW.token AS INTEGER) < (SELECT token FROM fencecron_guard WHERE resource = NEW.resource);
    INSERT OR IGNORE INTO fencecron_guard (resource, token, updated_ms)
    VALUES (NEW.resource, CAST(NEW.token AS INTEGER),
            CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER));
    UPDATE fencecron_guard
       SET token = CAST(NEW.token AS INTEGER),
           updated_ms = CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)
     WHERE resource = NEW.resource AND token <= CAST(NEW.token AS INTEGER);
END",
];

/// The guard's DDL for `backend`, one statement per item, each idempotent.
pub fn statements(backend: Backend) -> &'static [&'static str] {
    match backend {
        Backend::Postgres => POSTGRES,
        Backend::MySql => MYSQL,
        Backend::Sqlite => SQLITE,
    }
}

/// The guard's DDL as a script for the backend's own client (`psql`,
/// `mysql`/`mariadb`, `sqlite3`): the same statements [`GuardDb::install`]
/// runs, in one transaction where the backend's DDL is transactional, with
/// `DELIMITER` lines for the MySQL client's sake.
pub fn script(backend: Backend) -> String {
    let mut s = format!(
        "-- fencecron {} SQL guard for {backend}: `fencecron guard install` runs exactly these statements.\n\
         -- Idempotent; creates only fencecron_guard* objects. See docs/guard.md.\n",
        env!("CARGO_PKG_VERSION")
    );
    match backend {
        Backend::MySql => {
            s.push_str("DELIMITER //\n");
            for stmt in statements(backend) {
                s.push_str(stmt);
                s.push_str("\n//\n");
            }
            s.push_str("DELIMITER ;\n");
        }
        Backend::Postgres | Backend::Sqlite => {
            s.push_str("BEGIN;\n");
            for stmt in statements(backend) {
                s.push_str(stmt);
                s.push_str(";\n");
            }
            s.push_str("COMMIT;\n");
        }
    }
    s
}

/// The DDL that attaches the guard to a table whose rows carry their
/// writer's token in `column`: every INSERT and UPDATE of a row runs the
/// check for `resource` with the row's token, so a row written with an
/// older token than the guard's highest fails its whole transaction, and a
/// newer one raises the highest. PostgreSQL: a `BEFORE INSERT OR UPDATE`
/// row trigger calling `fencecron_guard_row()` (installed with the guard);
/// SQLite: two `BEFORE` triggers inserting into `fencecron_guard_check`.
/// MySQL has none: a trigger may not run `ROLLBACK`, so its refusal would
/// fail only the statement, not the transaction. The table and column
/// must be plain identifiers (optionally `schema.table`) and are quoted;
/// the resource is a string literal.
pub fn trigger_script(
    backend: Backend,
    table: &str,
    column: &str,
    resource: &Name,
) -> Result<String, String> {
    let table_parts: Vec<&str> = table.split('.').collect();
    if table_parts.len() > 2 || !table_parts.iter().all(|p| is_identifier(p)) {
        return Err(format!(
            "the table name `{table}` is not a plain identifier (letters, digits and `_`, not starting with a digit, at most 63 characters; optionally schema.table)"
        ));
    }
    if !is_identifier(column) {
        return Err(format!(
            "the column name `{column}` is not a plain identifier (letters, digits and `_`, not starting with a digit, at most 63 characters)"
        ));
    }
    let quoted_table = table_parts
        .iter()
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join(".");
    let bare_table = table_parts[table_parts.len() - 1];
    let literal = format!("'{}'", resource.as_str().replace('\'', "''"));
    let header = format!(
        "-- fencecron {} SQL guard: check every row of {table} against resource {literal} with its token in {column}.\n",
        env!("CARGO_PKG_VERSION")
    );
    match backend {
        Backend::Postgres => Ok(format!(
            "{header}CREATE OR REPLACE TRIGGER \"fencecron_guard_{column}\"
    BEFORE INSERT OR UPDATE ON {quoted_table}
    FOR EACH ROW EXECUTE FUNCTION fencecron_guard_row({literal}, '{column}');
"
        )),
        Backend::Sqlite => {
            let mut s = header;
            for (event, suffix) in [("INSERT", "insert"), ("UPDATE", "update")] {
                s.push_str(&format!(
                    "DROP TRIGGER IF EXISTS \"fencecron_guard_{bare_table}_{column}_{suffix}\";
CREATE TRIGGER \"fencecron_guard_{bare_table}_{column}_{suffix}\" BEFORE {event} ON {quoted_table}
BEGIN
    INSERT INTO fencecron_guard_check (resource, token) VALUES ({literal}, NEW.\"{column}\");
END;
"
                ));
            }
            Ok(s)
        }
        Backend::MySql => Err(
            "MySQL and MariaDB get no guard trigger: a trigger may not run ROLLBACK, so its refusal would fail only the statement and leave the rest of the transaction to be committed; call fencecron_guard in the transaction instead"
                .to_string(),
        ),
    }
}

/// A plain SQL identifier: ASCII letters, digits and `_`, not starting with
/// a digit, at most 63 characters (PostgreSQL's limit).
fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 63
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_the_statements_install_runs() {
        for backend in [Backend::Postgres, Backend::MySql, Backend::Sqlite] {
            let script = script(backend);
            let mut rest = script.as_str();
            for stmt in statements(backend) {
                let at = rest
                    .find(stmt)
                    .unwrap_or_else(|| panic!("{backend}: statement missing from the script"));
                rest = &rest[at + stmt.len()..];
            }
            for stmt in statements(backend) {
                assert!(!stmt.trim_end().ends_with(';'), "{backend}: {stmt}");
            }
        }
    }

    #[test]
    fn every_refusal_has_the_documented_sqlstate_and_message_prefix() {
        for backend in [Backend::Postgres, Backend::MySql, Backend::Sqlite] {
            let script = script(backend);
            assert!(script.contains(MESSAGE_PREFIX), "{backend}");
            if backend != Backend::Sqlite {
                assert!(script.contains(SQLSTATE), "{backend}");
            }
        }
    }

    #[test]
    fn every_object_is_a_guard_object_and_every_create_idempotent() {
        for backend in [Backend::Postgres, Backend::MySql, Backend::Sqlite] {
            for stmt in statements(backend) {
                let head: String = stmt.lines().next().unwrap().to_string();
                assert!(head.contains("fencecron_guard"), "{backend}: {head}");
                assert!(
                    head.contains("IF NOT EXISTS")
                        || head.contains("OR REPLACE")
                        || head.contains("IF EXISTS")
                        // Created right after its DROP … IF EXISTS.
                        || head.starts_with("CREATE PROCEDURE")
                        || head.starts_with("CREATE TRIGGER"),
                    "{backend}: {head}"
                );
            }
        }
    }

    #[test]
    fn trigger_names_are_validated_and_quoted() {
        let r = Name::parse("resource", "it's").unwrap();
        for bad in [
            "",
            "1x",
            "x y",
            "x;DROP TABLE y",
            "a.b.c",
            "x\"",
            "é",
            &"x".repeat(64),
        ] {
            assert!(
                trigger_script(Backend::Postgres, bad, "fence", &r).is_err(),
                "table {bad:?}"
            );
            assert!(
                trigger_script(Backend::Sqlite, "t", bad, &r).is_err(),
                "column {bad:?}"
            );
        }
        let pg = trigger_script(Backend::Postgres, "app.ledger", "fence_token", &r).unwrap();
        assert!(pg.contains("ON \"app\".\"ledger\""), "{pg}");
        assert!(
            pg.contains("fencecron_guard_row('it''s', 'fence_token')"),
            "{pg}"
        );
        let lite = trigger_script(Backend::Sqlite, "ledger", "fence_token", &r).unwrap();
        assert!(
            lite.contains("VALUES ('it''s', NEW.\"fence_token\")"),
            "{lite}"
        );
        assert!(trigger_script(Backend::MySql, "ledger", "fence_token", &r).is_err());
    }
}

//! `fencecron check --connect`: what a store says about itself, read
//! without changing it. [`probe`] connects once (under one time limit for
//! the whole look), and reports whether fencecron's migrations are applied
//! or can be, which privileges the daemon needs that the user lacks, and
//! how far the store's clock is from this host's. Nothing is created,
//! migrated or written; on SQLite a database file that does not exist yet
//! is not created.

use std::time::{Duration, Instant};

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{Connection, MySql, Postgres, Row};

use super::diagnose::{first_connection, host_port, migrate_message, sqlite_path};
use super::migrator::{self, Plan};
use super::mysql::MySqlStore;
use super::postgres::{first_connection as pg_first_connection, Hosts, PostgresStore};
use super::{migrate_error, timed, unavailable, Backend, OpenOptions, StoreError, StoreUrl};

/// What the store said.
#[derive(Debug)]
pub(crate) struct Probe {
    pub(crate) backend: Backend,
    /// What answered, as a phrase: the server and its version, where, the
    /// database and the user (SQLite: the file).
    pub(crate) answered: String,
    /// The user connected as (SQLite: this process's user).
    pub(crate) user: String,
    /// The time the first connection took (none for a SQLite database not
    /// created yet).
    pub(crate) connect_time: Option<Duration>,
    pub(crate) migrations: Migrations,
    /// What the daemon needs and does not have, each a phrase such as
    /// `UPDATE on fencecron_leases`; empty when it has everything.
    pub(crate) missing: Vec<String>,
    /// What was checked, as a phrase, for the line that says it is there.
    pub(crate) checked: String,
    pub(crate) clock: Clock,
    /// PostgreSQL: why the session cannot write (a standby, read-only),
    /// when it cannot.
    pub(crate) read_only: Option<String>,
}

/// The migrations: applied, pending, and whether they can be applied.
#[derive(Debug)]
pub(crate) struct Migrations {
    /// Every migration this fencecron embeds.
    pub(crate) known: Vec<i64>,
    /// Those still to apply (the daemon applies them at its start).
    pub(crate) pending: Vec<i64>,
    /// Why the pending ones cannot be applied by this user, each a phrase
    /// (a missing privilege); empty when they can.
    pub(crate) cannot_apply: Vec<String>,
    /// The migrator's refusal (a newer fencecron migrated the store, a
    /// changed or half-applied migration), as its one-sentence message.
    pub(crate) refused: Option<String>,
    /// The user may not read `fencecron_migrations` (the missing privilege
    /// is among [`Probe::missing`]): which are applied is unknown.
    pub(crate) unreadable: bool,
}

/// The store's clock against this host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Clock {
    /// The store's clock minus this host's, read at the middle of the
    /// shortest of a few round trips, and that round trip.
    Measured { offset: i64, round_trip: Duration },
    /// SQLite: the store's clock is this host's kernel clock.
    Kernel,
}

/// How many times the clock is read; the shortest round trip is kept.
const CLOCK_SAMPLES: usize = 5;

/// Looks at the store at `url`, all within `limit` (connecting included):
/// a store that does not answer in time is [`StoreError::Timeout`]; one
/// that cannot be reached or refuses the login is the same error any
/// command would give, with its cause and advice.
pub(crate) async fn probe(url: &StoreUrl, limit: Duration) -> Result<Probe, StoreError> {
    // The pool's own wait for a connection outlasts the limit, so that a
    // store that does not answer is named by the limit, not as a pool
    // whose connections did not come free.
    let opts = OpenOptions {
        max_connections: 1,
        call_timeout: limit * 2,
        hook: None,
    };
    match url.backend() {
        Backend::Postgres => {
            let store = PostgresStore::open(url.clone(), &opts)?;
            let hosts = store.dialect.hosts.as_deref();
            let result = timed(url, limit, postgres(&store.db.pool, hosts, url)).await;
            if result.is_ok() {
                store.db.pool.close().await;
            }
            result
        }
        Backend::MySql => {
            let store = MySqlStore::open(url.clone(), &opts)?;
            let result = timed(url, limit, mysql(&store.db.pool, url)).await;
            if result.is_ok() {
                store.db.pool.close().await;
            }
            result
        }
        Backend::Sqlite => timed(url, limit, sqlite(url)).await,
    }
}

/// The plan, or the refusal's message; an error reaching the store stays
/// an error.
fn migrations(
    backend: Backend,
    url: &StoreUrl,
    migrator: &Migrator,
    status: Result<Plan, MigrateError>,
) -> Result<Migrations, StoreError> {
    let known: Vec<i64> = migrator
        .migrations
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| m.version)
        .collect();
    let (pending, refused) = match status {
        Ok(plan) => (plan.apply, None),
        Err(e) if denied(&e) => {
            return Ok(Migrations {
                known,
                pending: Vec::new(),
                cannot_apply: Vec::new(),
                refused: None,
                unreadable: true,
            })
        }
        Err(e) => match migrate_error(backend, url, e) {
            StoreError::Migrate { source, .. } => (
                Vec::new(),
                Some(migrate_message(backend, &url.to_string(), &source)),
            ),
            other => return Err(other),
        },
    };
    Ok(Migrations {
        known,
        pending,
        cannot_apply: Vec::new(),
        refused,
        unreadable: false,
    })
}

/// The time in microseconds since the epoch on this host.
fn host_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// The offset of the store's clock (`$sql` answers microseconds since
/// the epoch) from this host's, at the middle of the shortest of
/// [`CLOCK_SAMPLES`] round trips on `$conn`.
macro_rules! measure {
    ($conn:expr, $sql:expr) => {{
        let mut best: Option<(Duration, i64)> = None;
        let mut failed = None;
        for _ in 0..CLOCK_SAMPLES {
            let (before, start) = (host_micros(), Instant::now());
            let store: i64 = match sqlx::query_scalar($sql).fetch_one(&mut *$conn).await {
                Ok(t) => t,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            let (after, round_trip) = (host_micros(), start.elapsed());
            let offset = offset_at_midpoint(store, before, after);
            if best.is_none_or(|(r, _)| round_trip < r) {
                best = Some((round_trip, offset));
            }
        }
        match failed {
            Some(e) => Err(e),
            None => {
                let (round_trip, offset) = best.unwrap_or_default();
                Ok(Clock::Measured { offset, round_trip })
            }
        }
    }};
}

/// The store's time minus this host's at the middle of the round trip, in
/// milliseconds (all times in microseconds).
fn offset_at_midpoint(store: i64, before: i64, after: i64) -> i64 {
    let middle = before + (after - before) / 2;
    (store - middle) / 1000
}

/// The privileges a user lacks, from `(privilege, object, held)` rows, as
/// `PRIVILEGE/PRIVILEGE on OBJECT` phrases, one per object, in the rows'
/// order.
fn lacking(rows: &[(String, String, bool)]) -> Vec<String> {
    let mut by_object: Vec<(&str, Vec<&str>)> = Vec::new();
    for (privilege, object, held) in rows {
        if *held {
            continue;
        }
        match by_object.iter_mut().find(|(o, _)| o == object) {
            Some((_, privileges)) => privileges.push(privilege),
            None => by_object.push((object, vec![privilege])),
        }
    }
    by_object
        .into_iter()
        .map(|(o, p)| format!("{} on {o}", p.join("/")))
        .collect()
}

/// Whether reading the migrations failed because the user may not read
/// the table (PostgreSQL 42501, MySQL 1142): the missing privilege is
/// reported with the others.
fn denied(e: &MigrateError) -> bool {
    let MigrateError::Execute(sqlx::Error::Database(db)) = e else {
        return false;
    };
    db.code().as_deref() == Some("42501")
        || db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|m| m.number() == 1142)
}

// PostgreSQL ---------------------------------------------------------------

/// Every fencecron table and sequence in the schema unqualified names find,
/// with each privilege the daemon uses on it and whether the user has it.
const PG_TABLE_PRIVILEGES: &str = "SELECT p.priv, c.relname::text,
        CASE WHEN c.relkind = 'S' THEN has_sequence_privilege(c.oid, p.priv)
             ELSE has_table_privilege(c.oid, p.priv) END
   FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  CROSS JOIN LATERAL unnest(CASE WHEN c.relkind = 'S' THEN ARRAY['USAGE']
                                 ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE'] END)
        WITH ORDINALITY AS p(priv, n)
  WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'S')
    AND c.relname LIKE 'fencecron\\_%'
  ORDER BY c.relname, p.n";

/// fencecron's functions in that schema, and whether the user may call them.
const PG_FUNCTION_PRIVILEGES: &str = "SELECT 'EXECUTE', p.proname::text || '()',
        has_function_privilege(p.oid, 'EXECUTE')
   FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
  WHERE n.nspname = current_schema() AND p.proname LIKE 'fencecron\\_%'
  ORDER BY p.proname";

/// fencecron's tables and functions the user does not own (as owner or
/// member of the owning role): a migration that alters or replaces one
/// fails.
const PG_NOT_OWNED: &str = "SELECT c.relname::text FROM pg_class c
   JOIN pg_namespace n ON n.oid = c.relnamespace
  WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
    AND c.relname LIKE 'fencecron\\_%' AND NOT pg_has_role(c.relowner, 'USAGE')
  UNION ALL
 SELECT p.proname::text || '()' FROM pg_proc p
   JOIN pg_namespace n ON n.oid = p.pronamespace
  WHERE n.nspname = current_schema() AND p.proname LIKE 'fencecron\\_%'
    AND NOT pg_has_role(p.proowner, 'USAGE')
  ORDER BY 1";

async fn postgres(
    pool: &sqlx::PgPool,
    hosts: Option<&Hosts>,
    url: &StoreUrl,
) -> Result<Probe, StoreError> {
    let err = |e| unavailable(url, e);
    let start = Instant::now();
    let mut conn = pg_first_connection(hosts, pool).await.map_err(err)?;
    let connect_time = start.elapsed();
    let row = sqlx::query(
        "SELECT current_setting('server_version'), current_user::text, current_database()::text,
                current_schema()::text,
                COALESCE(has_schema_privilege(current_schema(), 'CREATE'), FALSE),
                pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(err)?;
    let (version, user, database): (String, String, String) = (
        row.try_get(0).map_err(err)?,
        row.try_get(1).map_err(err)?,
        row.try_get(2).map_err(err)?,
    );
    let schema: Option<String> = row.try_get(3).map_err(err)?;
    let can_create: bool = row.try_get(4).map_err(err)?;
    let (standby, read_only): (bool, bool) =
        (row.try_get(5).map_err(err)?, row.try_get(6).map_err(err)?);
    let read_only = match (standby, read_only) {
        (true, _) => Some("a standby (in recovery)".to_string()),
        (false, true) => Some("read-only (default_transaction_read_only is on)".to_string()),
        (false, false) => None,
    };

    let migrator = sqlx::migrate!("migrations/postgres");
    let status = migrator::status::<Postgres>(&mut conn, Backend::Postgres, &migrator).await;
    let mut migrations = migrations(Backend::Postgres, url, &migrator, status)?;

    // Every start runs `CREATE TABLE IF NOT EXISTS fencecron_migrations`,
    // which PostgreSQL refuses without CREATE on the schema even when the
    // table exists.
    let create = match &schema {
        Some(s) => format!("CREATE on schema {s}"),
        None => "a schema to create tables in (none of the search_path exists)".to_string(),
    };
    let mut missing = Vec::new();
    if !can_create {
        missing.push(format!(
            "{create} (every start of the daemon runs CREATE TABLE IF NOT EXISTS {})",
            migrator::TABLE
        ));
    }
    let mut rows: Vec<(String, String, bool)> = sqlx::query_as(PG_TABLE_PRIVILEGES)
        .fetch_all(&mut *conn)
        .await
        .map_err(err)?;
    let tables = rows.iter().filter(|r| r.0 == "SELECT").count();
    let functions: Vec<(String, String, bool)> = sqlx::query_as(PG_FUNCTION_PRIVILEGES)
        .fetch_all(&mut *conn)
        .await
        .map_err(err)?;
    let function_count = functions.len();
    rows.extend(functions);
    missing.extend(lacking(&rows));

    if !migrations.pending.is_empty() {
        if !can_create {
            migrations.cannot_apply.push(create.clone());
        }
        let not_owned: Vec<String> = sqlx::query_scalar(PG_NOT_OWNED)
            .fetch_all(&mut *conn)
            .await
            .map_err(err)?;
        migrations
            .cannot_apply
            .extend(not_owned.into_iter().map(|o| format!("ownership of {o}")));
    }

    let clock = measure!(
        conn,
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    )
    .map_err(err)?;
    // Not pooled again: the pool is closed after this look anyway.
    let _ = conn.detach().close().await;

    Ok(Probe {
        backend: Backend::Postgres,
        answered: format!(
            "PostgreSQL {version} at {}, database {database}, user {user}",
            match hosts {
                // The host the walk chose, of the URL's several.
                Some(h) => h.current().to_string(),
                None => host_port(&url.to_string(), Backend::Postgres),
            }
        ),
        user,
        connect_time: Some(connect_time),
        migrations,
        missing,
        checked: if tables == 0 {
            format!("{create}; no fencecron tables yet")
        } else {
            format!(
                "{create}; SELECT, INSERT, UPDATE, DELETE on {tables} fencecron tables; EXECUTE on {function_count} fencecron functions"
            )
        },
        clock,
        read_only,
    })
}

// MySQL --------------------------------------------------------------------

/// The privileges a user needs to apply fencecron's MySQL migrations:
/// tables and their indexes, changed tables, and the stored procedures
/// (each migration drops the procedure it replaces).
const MY_MIGRATE: [&str; 5] = [
    "CREATE",
    "ALTER",
    "INDEX",
    "CREATE ROUTINE",
    "ALTER ROUTINE",
];

async fn mysql(pool: &sqlx::MySqlPool, url: &StoreUrl) -> Result<Probe, StoreError> {
    let err = |e| unavailable(url, e);
    let start = Instant::now();
    let mut conn = first_connection(pool).await.map_err(err)?;
    let connect_time = start.elapsed();
    let (version, user, database): (String, String, Option<String>) =
        sqlx::query_as("SELECT VERSION(), CURRENT_USER(), DATABASE()")
            .fetch_one(&mut *conn)
            .await
            .map_err(err)?;
    let database = database.unwrap_or_default();

    let migrator = sqlx::migrate!("migrations/mysql");
    let status = migrator::status::<MySql>(&mut conn, Backend::MySql, &migrator).await;
    let mut migrations = migrations(Backend::MySql, url, &migrator, status)?;

    // `SHOW GRANTS` lists the grants of the user and of its active roles.
    let lines: Vec<String> = sqlx::query_scalar("SHOW GRANTS")
        .fetch_all(&mut *conn)
        .await
        .map_err(err)?;
    let grants: Vec<Grant> = lines.iter().filter_map(|l| Grant::parse(l)).collect();
    let holds = |privilege: &str, object: Option<&str>| {
        grants
            .iter()
            .any(|g| g.grants(privilege, &database, object))
    };

    // The tables and procedures are those the migrations create: a user
    // without privileges on a table does not see it in information_schema.
    let (tables, procedures) = objects(&migrator);
    let mut rows = Vec::new();
    rows.push((
        "CREATE".to_string(),
        format!(
            "{} (every start of the daemon runs CREATE TABLE IF NOT EXISTS)",
            migrator::TABLE
        ),
        holds("CREATE", Some(migrator::TABLE)),
    ));
    for table in std::iter::once(migrator::TABLE.to_string()).chain(tables.iter().cloned()) {
        for privilege in ["SELECT", "INSERT", "UPDATE", "DELETE"] {
            rows.push((
                privilege.to_string(),
                table.clone(),
                holds(privilege, Some(&table)),
            ));
        }
    }
    for procedure in &procedures {
        rows.push((
            "EXECUTE".to_string(),
            format!("procedure {procedure}"),
            holds("EXECUTE", Some(procedure)),
        ));
    }
    let missing = lacking(&rows);
    if !migrations.pending.is_empty() {
        migrations.cannot_apply = MY_MIGRATE
            .iter()
            .filter(|p| !holds(p, None))
            .map(|p| format!("{p} on database {database}"))
            .collect();
    }

    let clock = measure!(
        conn,
        "SELECT CAST(UNIX_TIMESTAMP(SYSDATE(6)) * 1000000 AS SIGNED)"
    )
    .map_err(err)?;
    let _ = conn.detach().close().await;

    Ok(Probe {
        backend: Backend::MySql,
        answered: format!(
            "MySQL {version} at {}, database {database}, user {user}",
            host_port(&url.to_string(), Backend::MySql)
        ),
        user,
        connect_time: Some(connect_time),
        migrations,
        missing,
        checked: format!(
            "SELECT, INSERT, UPDATE, DELETE on {} fencecron tables; EXECUTE on {} procedures",
            tables.len() + 1,
            procedures.len()
        ),
        clock,
        read_only: None,
    })
}

/// The tables fencecron's migrations create, and the procedures that exist
/// once all of them ran (one a migration drops is gone unless it is
/// created again), read from the embedded migrations' SQL.
fn objects(migrator: &Migrator) -> (Vec<String>, Vec<String>) {
    let (mut tables, mut procedures) = (Vec::<String>::new(), Vec::<String>::new());
    for m in migrator.migrations.iter() {
        let words: Vec<&str> = m
            .sql
            .split(|c: char| c.is_whitespace() || c == '(' || c == ';' || c == '`')
            .filter(|w| !w.is_empty())
            .collect();
        let is = |i: usize, word: &str| words.get(i).is_some_and(|w| w.eq_ignore_ascii_case(word));
        for i in 0..words.len() {
            // The name after `CREATE TABLE`, `DROP PROCEDURE IF EXISTS`, …
            let mut at = i + 2;
            if is(at, "IF") {
                at += if is(at + 1, "NOT") { 3 } else { 2 };
            }
            let Some(name) = words
                .get(at)
                .map(|w| w.to_ascii_lowercase())
                .filter(|n| n.starts_with("fencecron_"))
            else {
                continue;
            };
            if is(i, "CREATE") && is(i + 1, "TABLE") && !tables.contains(&name) {
                tables.push(name);
            } else if is(i, "CREATE") && is(i + 1, "PROCEDURE") && !procedures.contains(&name) {
                procedures.push(name);
            } else if is(i, "DROP") && is(i + 1, "PROCEDURE") {
                procedures.retain(|p| *p != name);
            }
        }
    }
    (tables, procedures)
}

/// One line of MySQL's `SHOW GRANTS`: `GRANT privileges ON target TO …`.
#[derive(Debug, PartialEq, Eq)]
struct Grant {
    /// Upper case; `ALL` for `ALL PRIVILEGES`. Column privileges
    /// (`SELECT (a, b)`) are left out: they do not cover a whole table.
    privileges: Vec<String>,
    target: Target,
}

#[derive(Debug, PartialEq, Eq)]
enum Target {
    /// `*.*`
    Global,
    /// `db`.*, a pattern (`_` and `%` are wildcards, `\_` a literal `_`).
    Database(String),
    /// `db`.`table`, or `PROCEDURE db`.`name`.
    Object(String, String),
}

impl Grant {
    fn parse(line: &str) -> Option<Grant> {
        let rest = line.strip_prefix("GRANT ")?;
        let on = rest.find(" ON ")?;
        let (privs, rest) = (&rest[..on], &rest[on + 4..]);
        let to = rest.rfind(" TO ")?;
        let target = rest[..to].trim();
        let target = ["PROCEDURE ", "FUNCTION ", "PACKAGE BODY ", "PACKAGE "]
            .iter()
            .find_map(|p| target.strip_prefix(p))
            .unwrap_or(target);
        let (db, object) = split_target(target)?;
        let target = match (db.as_str(), object.as_str()) {
            ("*", "*") => Target::Global,
            (_, "*") => Target::Database(db),
            _ => Target::Object(db, object),
        };
        let mut privileges = Vec::new();
        let mut depth = 0;
        let mut current = String::new();
        for c in privs.chars().chain(std::iter::once(',')) {
            match c {
                '(' => {
                    depth += 1;
                    current.push(c);
                }
                ')' => {
                    depth -= 1;
                    current.push(c);
                }
                ',' if depth == 0 => {
                    let p = current.trim().to_ascii_uppercase();
                    if !p.contains('(') && !p.is_empty() {
                        privileges.push(if p == "ALL PRIVILEGES" {
                            "ALL".into()
                        } else {
                            p
                        });
                    }
                    current.clear();
                }
                _ => current.push(c),
            }
        }
        Some(Grant { privileges, target })
    }

    /// Whether this grant gives `privilege` on `object` (a table or
    /// procedure of `database`), or on the whole database when `object` is
    /// `None`.
    fn grants(&self, privilege: &str, database: &str, object: Option<&str>) -> bool {
        if !self.privileges.iter().any(|p| p == privilege || p == "ALL") {
            return false;
        }
        match &self.target {
            Target::Global => true,
            Target::Database(pattern) => like(pattern, database),
            Target::Object(db, name) => {
                db == database && object.is_some_and(|o| o.eq_ignore_ascii_case(name))
            }
        }
    }
}

/// `db`.`object` (backquoted, with doubled backquotes inside, or bare).
fn split_target(target: &str) -> Option<(String, String)> {
    let mut parts = Vec::new();
    let mut chars = target.chars().peekable();
    while parts.len() < 2 {
        let mut part = String::new();
        if chars.peek() == Some(&'`') {
            chars.next();
            loop {
                match chars.next()? {
                    '`' if chars.peek() == Some(&'`') => {
                        chars.next();
                        part.push('`');
                    }
                    '`' => break,
                    c => part.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == '.' {
                    break;
                }
                part.push(c);
                chars.next();
            }
        }
        parts.push(part);
        if parts.len() < 2 && chars.next() != Some('.') {
            return None;
        }
    }
    let object = parts.pop()?;
    Some((parts.pop()?, object))
}

/// SQL `LIKE` with `\` as the escape, as MySQL matches a database-level
/// grant's name.
fn like(pattern: &str, text: &str) -> bool {
    fn go(p: &[char], t: &[char]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some('%') => (0..=t.len()).any(|i| go(&p[1..], &t[i..])),
            Some('_') => !t.is_empty() && go(&p[1..], &t[1..]),
            Some('\\') if p.len() > 1 => t.first() == Some(&p[1]) && go(&p[2..], &t[1..]),
            Some(c) => t.first() == Some(c) && go(&p[1..], &t[1..]),
        }
    }
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    go(&p, &t)
}

// SQLite -------------------------------------------------------------------

async fn sqlite(url: &StoreUrl) -> Result<Probe, StoreError> {
    use std::str::FromStr;

    use sqlx::sqlite::SqliteConnectOptions;
    use sqlx::ConnectOptions;

    let start = Instant::now();
    // An in-memory database is each process's own: it fences nothing
    // between daemons (the same refusal as a file others could rewrite).
    let path = sqlite_path(url.expose()).ok_or_else(|| StoreError::Unprotected {
        detail: format!(
            "the SQLite store {url} is an in-memory database, which each process has to itself, so it fences nothing between daemons; point the store URL at a file, such as sqlite:///var/lib/fencecron/fencecron.db"
        ),
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {}", nix::unistd::geteuid()), |u| u.name);
    if !dir.is_dir() {
        // The same message as the daemon's start.
        let e = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::NotFound));
        return Err(unavailable(url, e));
    }
    // Whoever else could write the files could rewind the fences.
    super::sqlite::check_protected(&path)?;
    let writable =
        |p: &std::path::Path| nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok();
    let mut missing = Vec::new();
    if !writable(&dir) {
        missing.push(format!(
            "write access to the directory {} (SQLite creates the database's -wal and -shm files there, fencecron its lock file)",
            dir.display()
        ));
    }
    let migrator = sqlx::migrate!("migrations/sqlite");
    let exists = path.exists();
    let mut migrations = if exists {
        if !writable(&path) {
            missing.push(format!("write access to the database {}", path.display()));
        }
        let options = SqliteConnectOptions::from_str(url.expose())
            .map_err(|e| unavailable(url, e))?
            .create_if_missing(false)
            .busy_timeout(Duration::from_secs(5));
        let mut conn = options.connect().await.map_err(|e| unavailable(url, e))?;
        let status = migrator::status::<sqlx::Sqlite>(&mut conn, Backend::Sqlite, &migrator).await;
        let _ = conn.close().await;
        migrations(Backend::Sqlite, url, &migrator, status)?
    } else {
        migrations(Backend::Sqlite, url, &migrator, Ok(fresh_plan(&migrator)))?
    };
    if !migrations.pending.is_empty() && !writable(&dir) {
        migrations
            .cannot_apply
            .push(format!("write access to the directory {}", dir.display()));
    }
    let connect_time = start.elapsed();
    Ok(Probe {
        backend: Backend::Sqlite,
        answered: if exists {
            format!("SQLite database {}", path.display())
        } else {
            format!(
                "SQLite database {} (not created yet: the daemon creates it, private to {user}, at its first start)",
                path.display()
            )
        },
        user,
        connect_time: exists.then_some(connect_time),
        migrations,
        missing,
        checked: "the database and its directory writable by this user and by no other".into(),
        clock: Clock::Kernel,
        read_only: None,
    })
}

/// Every migration to apply, for a database that does not exist yet.
fn fresh_plan(migrator: &Migrator) -> Plan {
    Plan {
        apply: migrator
            .migrations
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .map(|m| m.version)
            .collect(),
        ..Plan::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_read_from_show_grants() {
        let g = Grant::parse("GRANT SELECT, INSERT, UPDATE (`a`, `b`) ON `wt\\_x`.* TO `u`@`%`")
            .unwrap();
        assert_eq!(g.privileges, ["SELECT", "INSERT"]);
        assert_eq!(g.target, Target::Database("wt\\_x".into()));
        assert!(g.grants("SELECT", "wt_x", Some("fencecron_leases")));
        assert!(!g.grants("UPDATE", "wt_x", Some("fencecron_leases")));
        assert!(!g.grants("SELECT", "wtax", None));
        let all = Grant::parse(
            "GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` IDENTIFIED BY PASSWORD '*AB' WITH GRANT OPTION",
        )
        .unwrap();
        assert!(all.grants("CREATE ROUTINE", "any", None));
        let table = Grant::parse("GRANT DELETE ON `db`.`fencecron_leases` TO `r`").unwrap();
        assert!(table.grants("DELETE", "db", Some("fencecron_leases")));
        assert!(!table.grants("DELETE", "db", Some("fencecron_values")));
        assert!(!table.grants("DELETE", "db", None));
        let proc_ = Grant::parse(
            "GRANT EXECUTE, ALTER ROUTINE ON PROCEDURE `db`.`fencecron_claim_v1` TO `u`@`%`",
        )
        .unwrap();
        assert!(proc_.grants("EXECUTE", "db", Some("fencecron_claim_v1")));
        assert_eq!(Grant::parse("GRANT `role` TO `u`@`%`"), None);
        // Wildcards in a database-level grant.
        assert!(like("wt%", "wt_connect") && like("w_", "wt") && !like("w\\_", "wt"));
    }

    #[test]
    fn the_objects_are_those_the_migrations_leave() {
        let (tables, procedures) = objects(&sqlx::migrate!("migrations/mysql"));
        assert!(
            tables.contains(&"fencecron_leases".to_string()),
            "{tables:?}"
        );
        assert!(tables.contains(&"fencecron_runs".to_string()), "{tables:?}");
        // Every version of the acquire stays (older binaries of a rolling
        // upgrade call theirs), with the claim and the heartbeat.
        assert!(
            [
                "fencecron_acquire",
                "fencecron_acquire_v2",
                "fencecron_acquire_v3",
                "fencecron_claim_v1",
                "fencecron_beat_v1"
            ]
            .iter()
            .all(|p| procedures.contains(&p.to_string())),
            "{procedures:?}"
        );
    }

    #[test]
    fn the_offset_is_taken_at_the_middle_of_the_round_trip() {
        // Sent at 1.000 s, answered at 1.010 s, the store read 1.105 s.
        assert_eq!(offset_at_midpoint(1_105_000, 1_000_000, 1_010_000), 100);
        assert_eq!(offset_at_midpoint(900_000, 1_000_000, 1_010_000), -105);
    }
}

//! fencecron's own migrator: the migrations embedded with `sqlx::migrate!`
//! (version, description, SQL, checksum), recorded in `fencecron_migrations`
//! instead of sqlx's `_sqlx_migrations`, so that fencecron can share a
//! database with an application that uses sqlx migrations itself. sqlx
//! 0.8.6 has no option for the name of its table.
//!
//! The caller holds the backend's cross-process migration lock (PostgreSQL:
//! [`lock_postgres`]; MySQL: the named `GET_LOCK` older fencecron versions
//! take too; SQLite: the lock file) and hands one connection to [`run`].
//!
//! Databases that an older fencecron migrated record its migrations in
//! `_sqlx_migrations`, possibly next to an application's rows. [`run`]
//! upgrades them in place: a row that is exactly one of fencecron's
//! migrations (same version *and* checksum) is copied to
//! `fencecron_migrations` and deleted from `_sqlx_migrations` in one
//! transaction; nothing is applied again, and rows of other versions or
//! other checksums (an application's) are never touched. The same clean-up
//! removes rows that an older fencecron binary records again later
//! (docs/stores.md, "Upgrading").

use std::collections::HashMap;
use std::time::Instant;

use sqlx::migrate::{MigrateError, Migration, Migrator};
use sqlx::{ColumnIndex, Connection, Database, Decode, Encode, Executor, IntoArguments, Type};

use super::hook::{notice, Hook, Notice};
use super::sql::placeholders;
use super::Backend;

/// fencecron's migrations table.
pub(crate) const TABLE: &str = "fencecron_migrations";
/// sqlx's default table, where fencecron recorded its migrations before.
pub(crate) const LEGACY_TABLE: &str = "_sqlx_migrations";

/// One row of a migrations table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Applied {
    pub version: i64,
    pub description: String,
    pub checksum: Vec<u8>,
    pub success: bool,
}

/// What [`run`] does, decided from the embedded migrations and the two
/// tables before anything is written.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Legacy rows (version, checksum) to move to `fencecron_migrations`.
    pub adopt: Vec<(i64, Vec<u8>)>,
    /// Legacy rows of migrations `fencecron_migrations` already records
    /// (an older binary recorded them again): delete them.
    pub forget: Vec<(i64, Vec<u8>)>,
    /// Versions to apply, in order.
    pub apply: Vec<i64>,
}

/// Decides what to do, or refuses:
///
/// * `Dirty(v)`: migration `v` was left partially applied (MySQL cannot roll
///   DDL back), in either table;
/// * `VersionMissing(v)`: `fencecron_migrations` records a migration this
///   binary does not know: a newer fencecron migrated the database;
/// * `VersionMismatch(v)`: migration `v` was recorded with another checksum
///   (the migration was changed after it was applied, or the row edited).
///
/// `legacy` is every row of `_sqlx_migrations` (empty when there is none).
/// A legacy row is fencecron's only when its version and checksum are those
/// of one of `known`. When the table holds such rows, a row with a known
/// version and description but another checksum counts as a changed
/// fencecron migration (as it did before the move); any other row is an
/// application's.
pub(crate) fn plan(
    known: &[Migration],
    applied: &[Applied],
    legacy: &[Applied],
) -> Result<Plan, MigrateError> {
    let known: Vec<&Migration> = known
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .collect();
    let by_version: HashMap<i64, &Migration> = known.iter().map(|m| (m.version, *m)).collect();
    let recorded: HashMap<i64, &Applied> = applied.iter().map(|a| (a.version, a)).collect();

    let mut rows: Vec<&Applied> = applied.iter().collect();
    rows.sort_by_key(|a| a.version);
    for a in &rows {
        if !a.success {
            return Err(MigrateError::Dirty(a.version));
        }
        match by_version.get(&a.version) {
            None => return Err(MigrateError::VersionMissing(a.version)),
            Some(m) if *m.checksum != *a.checksum => {
                return Err(MigrateError::VersionMismatch(a.version))
            }
            Some(_) => {}
        }
    }

    let mut plan = Plan::default();
    let exact = |row: &Applied| {
        by_version
            .get(&row.version)
            .is_some_and(|m| *m.checksum == *row.checksum)
    };
    // An older fencecron recorded its migrations here: only then can a row
    // with one of fencecron's versions and descriptions be a changed
    // fencecron migration rather than an application's (`0001_init.sql` is
    // a common name).
    let fencecron_was_here = legacy.iter().any(exact);
    let mut legacy: Vec<&Applied> = legacy.iter().collect();
    legacy.sort_by_key(|a| a.version);
    for row in legacy {
        let Some(m) = by_version.get(&row.version) else {
            continue;
        };
        let ours = exact(row);
        let key = (row.version, row.checksum.clone());
        match (ours, recorded.contains_key(&row.version)) {
            (true, true) => plan.forget.push(key),
            (true, false) if row.success => plan.adopt.push(key),
            (true, false) => return Err(MigrateError::Dirty(row.version)),
            (false, false) if fencecron_was_here && row.description == m.description => {
                return Err(MigrateError::VersionMismatch(row.version))
            }
            (false, _) => {}
        }
    }

    plan.apply = known
        .iter()
        .map(|m| m.version)
        .filter(|v| !recorded.contains_key(v) && !plan.adopt.iter().any(|(a, _)| a == v))
        .collect();
    Ok(plan)
}

/// `CREATE TABLE` for `fencecron_migrations`: sqlx's columns, in each
/// dialect.
fn create_table(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => {
            "CREATE TABLE IF NOT EXISTS fencecron_migrations (
                version        BIGINT PRIMARY KEY,
                description    TEXT NOT NULL,
                installed_on   TIMESTAMPTZ NOT NULL DEFAULT now(),
                success        BOOLEAN NOT NULL,
                checksum       BYTEA NOT NULL,
                execution_time BIGINT NOT NULL
            )"
        }
        Backend::MySql => {
            "CREATE TABLE IF NOT EXISTS fencecron_migrations (
                version        BIGINT PRIMARY KEY,
                description    TEXT NOT NULL,
                installed_on   TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
                success        BOOLEAN NOT NULL,
                checksum       BLOB NOT NULL,
                execution_time BIGINT NOT NULL
            ) ENGINE = InnoDB"
        }
        Backend::Sqlite => {
            "CREATE TABLE IF NOT EXISTS fencecron_migrations (
                version        BIGINT PRIMARY KEY,
                description    TEXT NOT NULL,
                installed_on   TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
                success        BOOLEAN NOT NULL,
                checksum       BLOB NOT NULL,
                execution_time BIGINT NOT NULL
            )"
        }
    }
}

/// Whether `_sqlx_migrations` exists where an unqualified name finds it
/// (the schema search path on PostgreSQL, the connection's database on
/// MySQL), as a count.
fn legacy_exists(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "SELECT count(*) FROM (SELECT to_regclass('_sqlx_migrations') AS t) r WHERE t IS NOT NULL",
        Backend::MySql => "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '_sqlx_migrations'",
        Backend::Sqlite => "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    }
}

/// Applies `migrator`'s pending migrations on `conn`, recording them in
/// `fencecron_migrations`, after upgrading a database whose fencecron
/// migrations are recorded in `_sqlx_migrations` (see the module docs). The
/// caller holds the migration lock. A guard that could not be put on
/// `_sqlx_migrations` is told to `hook` ([`Notice::MigrationGuardFailed`]).
pub(crate) async fn run<DB>(
    conn: &mut DB::Connection,
    backend: Backend,
    migrator: &Migrator,
    hook: &Hook,
) -> Result<(), MigrateError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Vec<u8>: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> bool: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    conn.execute(create_table(backend)).await?;
    let applied = read_rows::<DB>(conn, TABLE).await?;
    let has_legacy: i64 = sqlx::query_scalar(legacy_exists(backend))
        .fetch_one(&mut *conn)
        .await?;
    let legacy = if has_legacy > 0 {
        read_rows::<DB>(conn, LEGACY_TABLE).await?
    } else {
        Vec::new()
    };
    let known: &[Migration] = &migrator.migrations;
    let plan = plan(known, &applied, &legacy)?;

    // The guard first: from the moment fencecron's rows leave
    // `_sqlx_migrations`, an older binary migrating at the same time (it
    // does not take this lock) can no longer record them again.
    if has_legacy > 0 {
        guard_legacy::<DB>(conn, backend, known, hook).await;
    }

    if !plan.adopt.is_empty() || !plan.forget.is_empty() {
        let copy = placeholders(
            backend,
            "INSERT INTO fencecron_migrations
               (version, description, installed_on, success, checksum, execution_time)
             SELECT version, description, installed_on, success, checksum, execution_time
               FROM _sqlx_migrations WHERE version = $1 AND checksum = $2",
        );
        let delete = placeholders(
            backend,
            "DELETE FROM _sqlx_migrations WHERE version = $1 AND checksum = $2",
        );
        let mut tx = conn.begin().await?;
        for (version, checksum) in &plan.adopt {
            sqlx::query(&copy)
                .bind(*version)
                .bind(checksum.clone())
                .execute(&mut *tx)
                .await?;
        }
        for (version, checksum) in plan.adopt.iter().chain(&plan.forget) {
            sqlx::query(&delete)
                .bind(*version)
                .bind(checksum.clone())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
    }

    let insert = placeholders(
        backend,
        "INSERT INTO fencecron_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, $2, FALSE, $3, -1)",
    );
    let done = placeholders(
        backend,
        "UPDATE fencecron_migrations SET success = TRUE, execution_time = $1 WHERE version = $2",
    );
    for version in plan.apply {
        let Some(m) = known.iter().find(|m| m.version == version) else {
            continue;
        };
        let start = Instant::now();
        // As sqlx does: the record first (MySQL commits DDL at once, so a
        // failure there leaves the row marked unfinished, and the next start
        // refuses instead of running the migration's first half again), the
        // migration, then the record finished; one transaction, which
        // PostgreSQL and SQLite roll back whole on failure.
        let mut tx = conn.begin().await?;
        sqlx::query(&insert)
            .bind(m.version)
            .bind(m.description.to_string())
            .bind(m.checksum.to_vec())
            .execute(&mut *tx)
            .await?;
        tx.execute(&*m.sql)
            .await
            .map_err(|e| MigrateError::ExecuteMigration(e, m.version))?;
        let nanos = i64::try_from(start.elapsed().as_nanos()).unwrap_or(i64::MAX);
        sqlx::query(&done)
            .bind(nanos)
            .bind(m.version)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
    }
    Ok(())
}

/// Whether a table exists where an unqualified name finds it, as a count;
/// binds the table's name.
fn table_exists(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "SELECT count(*) FROM (SELECT to_regclass($1) AS t) r WHERE t IS NOT NULL",
        Backend::MySql => "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
        Backend::Sqlite => "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
    }
}

/// What [`run`] would do on `conn`, read without writing anything (for
/// `fencecron check --connect`): the plan, or the migrator's refusal.
pub(crate) async fn status<DB>(
    conn: &mut DB::Connection,
    backend: Backend,
    migrator: &Migrator,
) -> Result<Plan, MigrateError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Decode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Vec<u8>: Decode<'q, DB> + Type<DB>,
    for<'q> bool: Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let mut rows = Vec::with_capacity(2);
    for table in [TABLE, LEGACY_TABLE] {
        let present: i64 = sqlx::query_scalar(table_exists(backend))
            .bind(table.to_string())
            .fetch_one(&mut *conn)
            .await?;
        rows.push(if present > 0 {
            read_rows::<DB>(conn, table).await?
        } else {
            Vec::new()
        });
    }
    plan(&migrator.migrations, &rows[0], &rows[1])
}

/// The name of the trigger (and, on PostgreSQL, its function) that keeps
/// older fencecron binaries from recording their migrations in
/// `_sqlx_migrations` again.
pub(crate) const GUARD: &str = "fencecron_legacy_guard";

/// What an older fencecron reads when the guard stops it (MySQL keeps at
/// most 128 characters of a `SIGNAL`'s text).
pub(crate) const GUARD_MESSAGE: &str =
    "a newer fencecron moved its migrations to fencecron_migrations: upgrade this fencecron";

/// The guard, in each dialect: a trigger that refuses to insert into
/// `_sqlx_migrations` a row with the checksum of one of fencecron's
/// migrations. Only fencecron binaries from before `fencecron_migrations`
/// write such rows, and their migrations are all among `known` (migrations
/// are never changed once released), so the list never needs to grow.
/// An application's rows have other checksums and pass.
fn guard_sql(backend: Backend, known: &[Migration]) -> String {
    let hex = |m: &Migration| -> String { m.checksum.iter().map(|b| format!("{b:02x}")).collect() };
    let list = |f: &dyn Fn(String) -> String| -> String {
        known
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .map(|m| f(hex(m)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match backend {
        Backend::Postgres => format!(
            "CREATE OR REPLACE FUNCTION {GUARD}() RETURNS trigger LANGUAGE plpgsql AS $fencecron$
             BEGIN
                 IF NEW.checksum IN ({}) THEN
                     RAISE EXCEPTION '{GUARD_MESSAGE}';
                 END IF;
                 RETURN NEW;
             END
             $fencecron$;
             CREATE TRIGGER {GUARD} BEFORE INSERT ON _sqlx_migrations
                 FOR EACH ROW EXECUTE FUNCTION {GUARD}();",
            list(&|h| format!("decode('{h}', 'hex')"))
        ),
        Backend::MySql => format!(
            "CREATE TRIGGER {GUARD} BEFORE INSERT ON _sqlx_migrations FOR EACH ROW
             BEGIN
                 IF NEW.checksum IN ({}) THEN
                     SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{GUARD_MESSAGE}';
                 END IF;
             END",
            list(&|h| format!("x'{h}'"))
        ),
        Backend::Sqlite => format!(
            "CREATE TRIGGER IF NOT EXISTS {GUARD} BEFORE INSERT ON _sqlx_migrations
             WHEN NEW.checksum IN ({})
             BEGIN SELECT RAISE(ABORT, '{GUARD_MESSAGE}'); END",
            list(&|h| format!("x'{h}'"))
        ),
    }
}

/// Whether the guard trigger exists on `_sqlx_migrations`, as a count.
fn guard_exists(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "SELECT count(*) FROM pg_trigger WHERE tgname = 'fencecron_legacy_guard' AND tgrelid = to_regclass('_sqlx_migrations')",
        Backend::MySql => "SELECT COUNT(*) FROM information_schema.triggers WHERE trigger_schema = DATABASE() AND trigger_name = 'fencecron_legacy_guard'",
        Backend::Sqlite => "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name = 'fencecron_legacy_guard'",
    }
}

/// Puts the guard on an existing `_sqlx_migrations` (kept, even empty, for
/// it), so that an older fencecron started on this database stops before
/// it changes anything instead of running its migrations again
/// (docs/stores.md, "Upgrading"). Best effort: without the right to create a trigger on the
/// table (an application's role may own it), fencecron warns and goes on;
/// [`plan`] still removes any rows an older binary records.
async fn guard_legacy<DB>(
    conn: &mut DB::Connection,
    backend: Backend,
    known: &[Migration],
    hook: &Hook,
) where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let present: Result<i64, sqlx::Error> = sqlx::query_scalar(guard_exists(backend))
        .fetch_one(&mut *conn)
        .await;
    let result = match present {
        Ok(0) => conn.execute(&*guard_sql(backend, known)).await.map(|_| ()),
        Ok(_) => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(e) = result {
        let error = e.to_string();
        notice(
            hook,
            Notice::MigrationGuardFailed {
                guard: GUARD,
                error: &error,
            },
        );
    }
}

/// Every row of a migrations table.
async fn read_rows<DB>(conn: &mut DB::Connection, table: &str) -> Result<Vec<Applied>, MigrateError>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> i64: Decode<'q, DB> + Type<DB>,
    for<'q> String: Decode<'q, DB> + Type<DB>,
    for<'q> Vec<u8>: Decode<'q, DB> + Type<DB>,
    for<'q> bool: Decode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let sql =
        format!("SELECT version, description, checksum, success FROM {table} ORDER BY version");
    let rows: Vec<(i64, String, Vec<u8>, bool)> =
        sqlx::query_as(&sql).fetch_all(&mut *conn).await?;
    Ok(rows
        .into_iter()
        .map(|(version, description, checksum, success)| Applied {
            version,
            description,
            checksum,
            success,
        })
        .collect())
}

/// The PostgreSQL advisory lock of fencecron's migrator ("fencecro" in
/// ASCII). Advisory locks are per database. Not the lock sqlx's migrator
/// takes: sqlx keeps that one on its connection when a migration fails, so
/// an older fencecron stopped by the guard would hold it, and every start
/// of this version would wait for it, for as long as that older daemon
/// runs. Against older binaries migrating at the same moment, the guard
/// trigger (put on before any row moves) is what keeps them out.
const PG_LOCK: i64 = 0x6665_6e63_6563_726f;

/// Takes [`PG_LOCK`], waiting for it.
pub(crate) async fn lock_postgres(conn: &mut sqlx::PgConnection) -> Result<i64, MigrateError> {
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(PG_LOCK)
        .execute(&mut *conn)
        .await?;
    Ok(PG_LOCK)
}

/// Releases the lock [`lock_postgres`] took.
pub(crate) async fn unlock_postgres(
    conn: &mut sqlx::PgConnection,
    key: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .execute(&mut *conn)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests;

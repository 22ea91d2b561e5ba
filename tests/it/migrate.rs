//! Migrations are applied at start-up by every command and are safe when
//! many processes start at once on a database that has no tables yet.

use crate::common;

use std::process::{Child, Stdio};

use common::fresh::{with_database, with_fresh_database};
use common::harness::fencecron;
use common::{unique, Backend, TestStore};
use sqlx::Executor;

/// Starts `n` processes at once, each taking a lease on its own resource
/// against the fresh store at `url`; all must succeed.
fn race(url: &str, n: usize) {
    let dir = tempfile::tempdir().expect("temp dir");
    let children: Vec<Child> = (0..n)
        .map(|i| {
            let mut cmd = fencecron(dir.path());
            cmd.args([
                "--store",
                url,
                "lease",
                "acquire",
                &format!("migrate-race-{i}"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            cmd.spawn().expect("spawn fencecron")
        })
        .collect();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "process {i} failed on a fresh store: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut list = fencecron(dir.path());
    list.args(["--store", url, "lease", "list", "--json"]);
    let out = list.output().expect("lease list");
    assert!(out.status.success());
    let leases: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(leases.as_array().map(Vec::len), Some(n), "{leases}");
}

#[test]
fn sqlite_fresh_file_many_processes() {
    let ts = TestStore::new(Backend::Sqlite, "sqlite_fresh_file_many_processes").expect("sqlite");
    race(&ts.url, 8);
}

#[tokio::test]
async fn postgres_fresh_database_many_processes() {
    let Some(ts) = TestStore::new(Backend::Postgres, "postgres_fresh_database_many_processes")
    else {
        return;
    };
    let db = unique("fencecron_migrate").replace('-', "_");
    let admin = sqlx::PgPool::connect(&ts.url).await.expect("connect");
    admin
        .execute(format!("CREATE DATABASE {db}").as_str())
        .await
        .expect("create database");
    let url = with_database(&ts.url, &db);
    let result = std::panic::catch_unwind(|| race(&url, 8));
    admin
        .execute(format!("DROP DATABASE {db} WITH (FORCE)").as_str())
        .await
        .expect("drop database");
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

#[tokio::test]
async fn mysql_fresh_database_many_processes() {
    let Some(ts) = TestStore::new(Backend::MySql, "mysql_fresh_database_many_processes") else {
        return;
    };
    let db = unique("fencecron_migrate").replace('-', "_");
    let admin = sqlx::MySqlPool::connect(&ts.url).await.expect("connect");
    admin
        .execute(format!("CREATE DATABASE {db}").as_str())
        .await
        .expect("create database");
    let url = with_database(&ts.url, &db);
    let result = std::panic::catch_unwind(|| race(&url, 8));
    admin
        .execute(format!("DROP DATABASE {db}").as_str())
        .await
        .expect("drop database");
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// A MySQL database created by a fencecron that knew only migration 0001
/// (before the acquire procedure) upgrades in place: the next command applies
/// the rest, and the fence of an existing lease continues where it was.
#[tokio::test]
async fn mysql_upgrade_from_0001_keeps_fences() {
    let Some(ts) = TestStore::new(Backend::MySql, "mysql_upgrade_from_0001_keeps_fences") else {
        return;
    };
    let db = unique("fencecron_upgrade").replace('-', "_");
    let admin = sqlx::MySqlPool::connect(&ts.url).await.expect("connect");
    admin
        .execute(format!("CREATE DATABASE {db}").as_str())
        .await
        .expect("create database");
    let url = with_database(&ts.url, &db);
    let result = async move {
        let only_0001 = tempfile::tempdir().expect("temp dir");
        std::fs::copy(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/migrations/mysql/0001_init.sql"
            ),
            only_0001.path().join("0001_init.sql"),
        )
        .expect("copy 0001");
        let old = sqlx::MySqlPool::connect(&url).await.expect("connect");
        sqlx::migrate::Migrator::new(only_0001.path())
            .await
            .expect("read 0001")
            .run(&old)
            .await
            .expect("apply 0001");
        old.execute(
            "INSERT INTO fencecron_leases
               (resource, fence, owner_id, node, acquired_at_ms, expires_at_ms, last_occurrence_ms)
             VALUES ('upgraded', 41, '00000000-0000-4000-8000-0000000001d0', 'old-node', 0, 0, NULL)",
        )
        .await
        .expect("old lease row");
        old.close().await;

        let dir = tempfile::tempdir().expect("temp dir");
        let out = fencecron(dir.path())
            .args(["--store", &url, "lease", "acquire", "upgraded", "--json"])
            .output()
            .expect("lease acquire");
        assert!(
            out.status.success(),
            "acquire after upgrade: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let lease: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(lease["token"], 42, "{lease}");
        let check = Db::open(Backend::MySql, &url).await;
        assert_eq!(check.versions(OWN).await, all_versions(Backend::MySql));
        assert_eq!(check.versions(LEGACY).await, Vec::<i64>::new());
        check.close().await;
    };
    let result = tokio::spawn(result).await;
    admin
        .execute(format!("DROP DATABASE {db}").as_str())
        .await
        .expect("drop database");
    if let Err(p) = result {
        std::panic::resume_unwind(p.into_panic());
    }
}

/// Applies only the migrations `files` of `backend` (the state a previous
/// fencecron left) to the empty database at `url`, then inserts lease rows
/// as that version wrote them: `upgraded` (fence 41, expired) and `held`
/// (fence 7, held for an hour).
async fn previous_version_database(backend: Backend, url: &str, files: &[&str]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let sub = match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
        Backend::MySql => "mysql",
    };
    for f in files {
        std::fs::copy(
            format!("{}/migrations/{sub}/{f}", env!("CARGO_MANIFEST_DIR")),
            dir.path().join(f),
        )
        .expect("copy migration");
    }
    let migrator = sqlx::migrate::Migrator::new(dir.path())
        .await
        .expect("read old migrations");
    let rows = "INSERT INTO fencecron_leases
           (resource, fence, owner_id, node, acquired_at_ms, expires_at_ms, last_occurrence_ms)
         VALUES ('upgraded', 41, '00000000-0000-4000-8000-0000000001d0', 'old-node', 0, 0, NULL),
                ('held', 7, '00000000-0000-4000-8000-0000000001d1', 'old-node', 0, 4102444800000, NULL)";
    match backend {
        Backend::Sqlite => {
            let opts = url
                .parse::<sqlx::sqlite::SqliteConnectOptions>()
                .expect("sqlite URL")
                .create_if_missing(true);
            let pool = sqlx::SqlitePool::connect_with(opts).await.expect("connect");
            migrator.run(&pool).await.expect("apply old migrations");
            pool.execute(rows).await.expect("old lease rows");
            pool.close().await;
        }
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(url).await.expect("connect");
            migrator.run(&pool).await.expect("apply old migrations");
            pool.execute(rows).await.expect("old lease rows");
            pool.close().await;
        }
        Backend::MySql => {
            let pool = sqlx::MySqlPool::connect(url).await.expect("connect");
            migrator.run(&pool).await.expect("apply old migrations");
            pool.execute(rows).await.expect("old lease rows");
            pool.close().await;
        }
    }
}

/// Runs the binary against `url` and returns its JSON output (exit 0).
fn json_of(url: &str, args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = fencecron(dir.path())
        .args(["--store", url])
        .args(args)
        .output()
        .expect("run fencecron");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// A database a previous fencecron created (before epochs and takeovers)
/// upgrades in place on the next command: existing fences continue (an
/// expired lease's next token is fence + 1, a held lease stays held),
/// existing rows count as released (no takeover reported for them), the
/// new migration is recorded, and `epoch advance` then works on it.
async fn upgrade_keeps_fences(backend: Backend, test: &str, old: &[&str]) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let old: Vec<String> = old.iter().map(|s| s.to_string()).collect();
    let versions = all_versions(backend);
    with_fresh_database(&ts, move |url| async move {
        let old: Vec<&str> = old.iter().map(String::as_str).collect();
        previous_version_database(backend, &url, &old).await;
        let db = Db::open(backend, &url).await;
        let before = db.timings(LEGACY).await;
        assert_eq!(before.len(), old.len(), "{before:?}");
        db.close().await;

        let lease = json_of(&url, &["lease", "acquire", "upgraded", "--json"]);
        let epoch = json_of(&url, &["epoch", "--json"]);
        let first = epoch["lowest_token"].as_i64().expect("lowest_token");
        assert_eq!(
            lease["token"].as_i64(),
            Some(first.max(42)),
            "the fence continues: {lease} ({epoch})"
        );
        assert!(lease.get("taken_over").is_none(), "{lease}");

        let dir = tempfile::tempdir().expect("temp dir");
        let held = fencecron(dir.path())
            .args(["--store", &url, "lease", "acquire", "held"])
            .output()
            .expect("lease acquire");
        assert_eq!(
            held.status.code(),
            Some(75),
            "a lease held before the upgrade stays held: {}",
            String::from_utf8_lossy(&held.stderr)
        );
        let listed = json_of(&url, &["lease", "list", "--json"]);
        let held_row = listed
            .as_array()
            .expect("array")
            .iter()
            .find(|l| l["resource"] == "held")
            .expect("held row")
            .clone();
        assert_eq!(held_row["token"], 7, "{held_row}");

        // The old rows moved to fencecron_migrations as they were (the
        // time sqlx measured for each is still there: adopted, not run
        // again); _sqlx_migrations keeps no row of fencecron's.
        let db = Db::open(backend, &url).await;
        assert_eq!(db.versions(OWN).await, versions);
        assert_eq!(db.versions(LEGACY).await, Vec::<i64>::new());
        let kept = db.timings(OWN).await;
        for (version, nanos) in &before {
            assert!(
                kept.contains(&(*version, *nanos)),
                "migration {version} was applied again: {before:?} -> {kept:?}"
            );
        }
        db.close().await;

        let advanced = json_of(&url, &["epoch", "advance", "--json"]);
        let lowest = advanced["lowest_token"].as_i64().expect("lowest_token");
        assert!(lowest > 42, "{advanced}");
        let next = json_of(&url, &["lease", "acquire", "never-before", "--json"]);
        assert_eq!(next["token"].as_i64(), Some(lowest), "{next}");
    })
    .await;
}

#[tokio::test]
async fn sqlite_upgrade_from_0001_keeps_fences() {
    upgrade_keeps_fences(
        Backend::Sqlite,
        "sqlite_upgrade_from_0001_keeps_fences",
        &["0001_init.sql"],
    )
    .await;
}

#[tokio::test]
async fn postgres_upgrade_from_0001_keeps_fences() {
    upgrade_keeps_fences(
        Backend::Postgres,
        "postgres_upgrade_from_0001_keeps_fences",
        &["0001_init.sql"],
    )
    .await;
}

#[tokio::test]
async fn mysql_upgrade_from_0002_keeps_fences() {
    upgrade_keeps_fences(
        Backend::MySql,
        "mysql_upgrade_from_0002_keeps_fences",
        &["0001_init.sql", "0002_acquire_procedure.sql"],
    )
    .await;
}

#[tokio::test]
async fn sqlite_upgrade_from_the_last_sqlx_recorded_version() {
    upgrade_keeps_fences(
        Backend::Sqlite,
        "sqlite_upgrade_from_the_last_sqlx_recorded_version",
        &["0001_init.sql", "0002_epoch_and_takeover.sql"],
    )
    .await;
}

#[tokio::test]
async fn postgres_upgrade_from_the_last_sqlx_recorded_version() {
    upgrade_keeps_fences(
        Backend::Postgres,
        "postgres_upgrade_from_the_last_sqlx_recorded_version",
        &["0001_init.sql", "0002_epoch_and_takeover.sql"],
    )
    .await;
}

#[tokio::test]
async fn mysql_upgrade_from_the_last_sqlx_recorded_version() {
    upgrade_keeps_fences(
        Backend::MySql,
        "mysql_upgrade_from_the_last_sqlx_recorded_version",
        &[
            "0001_init.sql",
            "0002_acquire_procedure.sql",
            "0003_epoch_and_takeover.sql",
            "0004_occurrence_identity.sql",
        ],
    )
    .await;
}

/// One test per backend of an async check taking the backend and the
/// test's name.
macro_rules! on_every_backend {
    ($check:ident: $sqlite:ident, $postgres:ident, $mysql:ident) => {
        #[tokio::test]
        async fn $sqlite() {
            $check(Backend::Sqlite, stringify!($sqlite)).await;
        }

        #[tokio::test]
        async fn $postgres() {
            $check(Backend::Postgres, stringify!($postgres)).await;
        }

        #[tokio::test]
        async fn $mysql() {
            $check(Backend::MySql, stringify!($mysql)).await;
        }
    };
}

/// fencecron's migrations table.
const OWN: &str = "fencecron_migrations";
/// sqlx's, where fencecron recorded its migrations before.
const LEGACY: &str = "_sqlx_migrations";

/// A pool on a test database of any backend, for the tests' own SQL.
enum Db {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
}

impl Db {
    async fn open(backend: Backend, url: &str) -> Db {
        match backend {
            Backend::Sqlite => {
                let opts = url
                    .parse::<sqlx::sqlite::SqliteConnectOptions>()
                    .expect("sqlite URL")
                    .create_if_missing(true);
                Db::Sqlite(sqlx::SqlitePool::connect_with(opts).await.expect("connect"))
            }
            Backend::Postgres => Db::Postgres(sqlx::PgPool::connect(url).await.expect("connect")),
            Backend::MySql => Db::MySql(sqlx::MySqlPool::connect(url).await.expect("connect")),
        }
    }

    async fn exec(&self, sql: &str) {
        match self {
            Db::Sqlite(p) => p.execute(sql).await.map(|_| ()),
            Db::Postgres(p) => p.execute(sql).await.map(|_| ()),
            Db::MySql(p) => p.execute(sql).await.map(|_| ()),
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    async fn count(&self, sql: &str) -> i64 {
        match self {
            Db::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await,
            Db::Postgres(p) => sqlx::query_scalar(sql).fetch_one(p).await,
            Db::MySql(p) => sqlx::query_scalar(sql).fetch_one(p).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Whether a table exists (in the schema or database of the URL).
    async fn has_table(&self, table: &str) -> bool {
        let sql = match self {
            Db::Sqlite(_) => {
                format!("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '{table}'")
            }
            Db::Postgres(_) => format!(
                "SELECT count(*) FROM (SELECT to_regclass('{table}') AS t) r WHERE t IS NOT NULL"
            ),
            Db::MySql(_) => format!(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = '{table}'"
            ),
        };
        self.count(&sql).await > 0
    }

    /// The versions recorded in a migrations table (none when it is missing).
    async fn versions(&self, table: &str) -> Vec<i64> {
        self.timings(table)
            .await
            .into_iter()
            .map(|(v, _)| v)
            .collect()
    }

    /// (version, execution_time) of every row of a migrations table.
    async fn timings(&self, table: &str) -> Vec<(i64, i64)> {
        if !self.has_table(table).await {
            return Vec::new();
        }
        let sql = format!("SELECT version, execution_time FROM {table} ORDER BY version");
        match self {
            Db::Sqlite(p) => sqlx::query_as(&sql).fetch_all(p).await,
            Db::Postgres(p) => sqlx::query_as(&sql).fetch_all(p).await,
            Db::MySql(p) => sqlx::query_as(&sql).fetch_all(p).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Runs sqlx's own migrator (as an application, or an older fencecron,
    /// does) on the migrations in `dir`.
    async fn sqlx_migrate(&self, dir: &std::path::Path) -> Result<(), sqlx::migrate::MigrateError> {
        let m = sqlx::migrate::Migrator::new(dir)
            .await
            .expect("read migrations");
        match self {
            Db::Sqlite(p) => m.run(p).await,
            Db::Postgres(p) => m.run(p).await,
            Db::MySql(p) => m.run(p).await,
        }
    }

    /// A blob literal.
    fn bytes(&self, hex: &str) -> String {
        match self {
            Db::Postgres(_) => format!("decode('{hex}', 'hex')"),
            _ => format!("x'{hex}'"),
        }
    }

    async fn close(self) {
        match self {
            Db::Sqlite(p) => p.close().await,
            Db::Postgres(p) => p.close().await,
            Db::MySql(p) => p.close().await,
        }
    }
}

fn sub(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
        Backend::MySql => "mysql",
    }
}

/// fencecron's migration files of `backend`, as the older fencecron that
/// recorded them in `_sqlx_migrations` ran them.
fn fencecron_files(backend: Backend) -> Vec<String> {
    let dir = format!("{}/migrations/{}", env!("CARGO_MANIFEST_DIR"), sub(backend));
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .expect("migrations dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    files
}

/// A directory of migrations: fencecron's (`fencecron`) and the
/// application's first `app` ones (app_users, then app_orders).
fn migrations_dir(backend: Backend, fencecron: bool, app: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    if fencecron {
        for f in fencecron_files(backend) {
            std::fs::copy(
                format!(
                    "{}/migrations/{}/{f}",
                    env!("CARGO_MANIFEST_DIR"),
                    sub(backend)
                ),
                dir.path().join(&f),
            )
            .expect("copy migration");
        }
    }
    let app_migrations = [
        (
            "20240101000000_app_users.sql",
            "CREATE TABLE app_users (id INT PRIMARY KEY);",
        ),
        (
            "20240202000000_app_orders.sql",
            "CREATE TABLE app_orders (id INT PRIMARY KEY);",
        ),
    ];
    for (name, sql) in app_migrations.iter().take(app) {
        std::fs::write(dir.path().join(name), sql).expect("write app migration");
    }
    dir
}

/// Runs the binary against `url` with `args`.
fn run_cli(url: &str, args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("temp dir");
    fencecron(dir.path())
        .args(["--store", url])
        .args(args)
        .output()
        .expect("run fencecron")
}

fn all_versions(backend: Backend) -> Vec<i64> {
    fencecron_files(backend)
        .iter()
        .map(|f| f[..4].parse().expect("numbered migration"))
        .collect()
}

/// A fresh database gets `fencecron_migrations` and no `_sqlx_migrations`.
async fn fresh_database_has_only_fencecron_migrations(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    with_fresh_database(&ts, move |url| async move {
        json_of(&url, &["lease", "list", "--json"]);
        let db = Db::open(backend, &url).await;
        assert_eq!(db.versions(OWN).await, all_versions(backend));
        assert!(!db.has_table(LEGACY).await, "a fresh database got {LEGACY}");
        db.close().await;
    })
    .await;
}

on_every_backend!(fresh_database_has_only_fencecron_migrations: sqlite_fresh_database_has_only_fencecron_migrations, postgres_fresh_database_has_only_fencecron_migrations, mysql_fresh_database_has_only_fencecron_migrations);

/// fencecron and an application that uses sqlx migrations share one
/// database, whichever came first: an application first, and a database
/// where an older fencecron recorded its migrations in `_sqlx_migrations`
/// next to the application's. Afterwards each migrator runs (also with a
/// new migration of the application's) without failing on the other's
/// rows, and `_sqlx_migrations` holds only the application's.
async fn shared_with_an_application(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    // The application first, then fencecron, then the application again.
    // Its first migration is its own `0001_init.sql`: fencecron's version
    // and description, other SQL.
    with_fresh_database(&ts, move |url| async move {
        let db = Db::open(backend, &url).await;
        let app = migrations_dir(backend, false, 0);
        std::fs::write(
            app.path().join("0001_init.sql"),
            "CREATE TABLE app_init (id INT PRIMARY KEY);",
        )
        .expect("write app migration");
        db.sqlx_migrate(app.path())
            .await
            .expect("the application's first migration");
        json_of(&url, &["lease", "acquire", "shared", "--json"]);
        std::fs::write(
            app.path().join("20240101000000_app_users.sql"),
            "CREATE TABLE app_users (id INT PRIMARY KEY);",
        )
        .expect("write app migration");
        db.sqlx_migrate(app.path())
            .await
            .expect("the application migrates after fencecron");
        json_of(&url, &["lease", "list", "--json"]);
        assert_eq!(db.versions(OWN).await, all_versions(backend));
        assert_eq!(db.versions(LEGACY).await, vec![1, 20240101000000]);
        assert_eq!(db.count("SELECT count(*) FROM app_users").await, 0);
        db.close().await;
    })
    .await;
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    // An older fencecron's rows next to the application's (the application
    // migrated with both sets of files, as it had to for the older
    // fencecron not to fail).
    with_fresh_database(&ts, move |url| async move {
        let db = Db::open(backend, &url).await;
        db.sqlx_migrate(migrations_dir(backend, true, 1).path())
            .await
            .expect("older fencecron and the application");
        db.exec(
            "INSERT INTO fencecron_leases
               (resource, fence, owner_id, node, acquired_at_ms, expires_at_ms)
             VALUES ('shared', 41, '00000000-0000-4000-8000-0000000001d0', 'old-node', 0, 0)",
        )
        .await;
        let before = db.timings(LEGACY).await;
        let lease = json_of(&url, &["lease", "acquire", "shared", "--json"]);
        assert_eq!(lease["token"], 42, "{lease}");
        let kept = db.timings(OWN).await;
        for row in before.iter().filter(|(v, _)| *v < 1000) {
            assert!(kept.contains(row), "applied again: {before:?} -> {kept:?}");
        }
        assert_eq!(db.versions(LEGACY).await, vec![20240101000000]);
        db.sqlx_migrate(migrations_dir(backend, false, 2).path())
            .await
            .expect("the application migrates after the upgrade");
        json_of(&url, &["lease", "list", "--json"]);
        assert_eq!(db.versions(OWN).await, all_versions(backend));
        assert_eq!(
            db.versions(LEGACY).await,
            vec![20240101000000, 20240202000000]
        );
        assert_eq!(db.count("SELECT count(*) FROM app_orders").await, 0);
        db.close().await;
    })
    .await;
}

on_every_backend!(shared_with_an_application: sqlite_shared_with_an_application, postgres_shared_with_an_application, mysql_shared_with_an_application);

/// The refusals: a recorded migration whose checksum differs, and a
/// migration this binary does not know (a newer fencecron migrated the
/// database). Each fails the command with its own message and changes
/// nothing.
async fn refuses_changed_and_newer_migrations(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    with_fresh_database(&ts, move |url| async move {
        json_of(&url, &["lease", "list", "--json"]);
        let db = Db::open(backend, &url).await;
        let zeros = db.bytes(&"00".repeat(48));
        db.exec(&format!(
            "UPDATE {OWN} SET checksum = {zeros} WHERE version = 1"
        ))
        .await;
        let out = run_cli(&url, &["lease", "list"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("migration 1 with another checksum") && !err.contains("create tables"),
            "{err}"
        );
        db.exec(&format!("DELETE FROM {OWN} WHERE version = 1"))
            .await;
        // Recorded again by the next command: migration 1 is idempotent.
        json_of(&url, &["lease", "list", "--json"]);

        db.exec(&format!(
            "INSERT INTO {OWN} (version, description, success, checksum, execution_time)
             VALUES (9999, 'from the future', TRUE, {zeros}, 0)"
        ))
        .await;
        let out = run_cli(&url, &["lease", "list"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("migrated by a newer fencecron") && err.contains("migration 9999"),
            "{err}"
        );
        let mut expected = all_versions(backend);
        expected.push(9999);
        assert_eq!(db.versions(OWN).await, expected);
        db.close().await;
    })
    .await;
}

on_every_backend!(refuses_changed_and_newer_migrations: sqlite_refuses_changed_and_newer_migrations, postgres_refuses_changed_and_newer_migrations, mysql_refuses_changed_and_newer_migrations);

/// An older fencecron (sqlx's migrator on fencecron's files, as it ran
/// them) started on a database this version upgraded stops before it
/// changes anything: the guard trigger on `_sqlx_migrations` refuses its
/// first record with a message to upgrade it, on MySQL before any statement
/// of its migrations ran. Nothing is applied again, and this version goes
/// on working.
async fn older_binary_stops_on_an_upgraded_database(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    with_fresh_database(&ts, move |url| async move {
        let db = Db::open(backend, &url).await;
        let old = migrations_dir(backend, true, 0);
        db.sqlx_migrate(old.path()).await.expect("older fencecron");
        let lease = json_of(&url, &["lease", "acquire", "guarded", "--json"]);
        assert_eq!(db.versions(LEGACY).await, Vec::<i64>::new());
        let own = db.timings(OWN).await;
        let procedure = if backend == Backend::MySql {
            db.count(
                "SELECT CAST(CRC32(ROUTINE_DEFINITION) AS SIGNED) FROM information_schema.routines
                  WHERE routine_schema = DATABASE() AND routine_name = 'fencecron_acquire'",
            )
            .await
        } else {
            0
        };

        let err = db
            .sqlx_migrate(old.path())
            .await
            .expect_err("an older fencecron must stop");
        assert!(
            err.to_string().contains("upgrade this fencecron"),
            "{err}"
        );
        // sqlx's migrator keeps its PostgreSQL advisory lock when it fails,
        // on a connection its pool keeps (an older daemon that goes on
        // running): this version does not wait for that lock.
        assert_eq!(db.versions(LEGACY).await, Vec::<i64>::new());
        assert_eq!(db.timings(OWN).await, own);
        if backend == Backend::MySql {
            let now = db
                .count(
                    "SELECT CAST(CRC32(ROUTINE_DEFINITION) AS SIGNED) FROM information_schema.routines
                      WHERE routine_schema = DATABASE() AND routine_name = 'fencecron_acquire'",
                )
                .await;
            assert_eq!(now, procedure, "migration 0002 ran again");
        }
        let listed = json_of(&url, &["lease", "list", "--json"]);
        assert_eq!(listed[0]["token"], lease["token"], "{listed}");
        db.close().await;
    })
    .await;
}

on_every_backend!(older_binary_stops_on_an_upgraded_database: sqlite_older_binary_stops_on_an_upgraded_database, postgres_older_binary_stops_on_an_upgraded_database, mysql_older_binary_stops_on_an_upgraded_database);

/// An older fencecron started on a database this version created (no
/// `_sqlx_migrations`, so no guard yet) runs its migrations again: on
/// PostgreSQL they are all idempotent and it succeeds; on SQLite and MySQL
/// it fails on a column that exists, changing nothing this version uses.
/// The next start of this version removes the rows it recorded (also
/// MySQL's unfinished one), keeps the data, and puts the guard on the table
/// it created, so the older binary stops at once from then on.
async fn older_binary_on_a_database_this_version_created(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    with_fresh_database(&ts, move |url| async move {
        let lease = json_of(&url, &["lease", "acquire", "fresh-first", "--json"]);
        let db = Db::open(backend, &url).await;
        let own = db.timings(OWN).await;
        let old = migrations_dir(backend, true, 0);
        let first = db.sqlx_migrate(old.path()).await;
        assert_eq!(
            first.is_ok(),
            backend == Backend::Postgres,
            "the older binary's first run: {first:?}"
        );
        db.close().await;

        let listed = json_of(&url, &["lease", "list", "--json"]);
        assert_eq!(listed[0]["token"], lease["token"], "{listed}");
        let db = Db::open(backend, &url).await;
        assert_eq!(db.versions(LEGACY).await, Vec::<i64>::new());
        assert_eq!(db.timings(OWN).await, own);
        let err = db
            .sqlx_migrate(old.path())
            .await
            .expect_err("guarded from now on");
        assert!(err.to_string().contains("upgrade this fencecron"), "{err}");
        db.close().await;
    })
    .await;
}

on_every_backend!(older_binary_on_a_database_this_version_created: sqlite_older_binary_on_a_database_this_version_created, postgres_older_binary_on_a_database_this_version_created, mysql_older_binary_on_a_database_this_version_created);

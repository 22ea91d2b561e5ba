//! Migrations are applied at start-up by every command and are safe when
//! many processes start at once on a database that has no tables yet.

use crate::common;

use std::process::{Child, Stdio};

use common::fresh::with_fresh_database;
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

/// The URL of `base` with its database name replaced.
fn with_database(base: &str, db: &str) -> String {
    let mut u = url::Url::parse(base).expect("test URL parses");
    u.set_path(&format!("/{db}"));
    u.to_string()
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
             VALUES ('upgraded', 41, 'old-owner', 'old-node', 0, 0, NULL)",
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
        let check = sqlx::MySqlPool::connect(&url).await.expect("connect");
        let versions: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
                .fetch_all(&check)
                .await
                .expect("migrations table");
        assert_eq!(versions, vec![1, 2, 3, 4]);
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
         VALUES ('upgraded', 41, 'old-owner', 'old-node', 0, 0, NULL),
                ('held', 7, 'old-holder', 'old-node', 0, 4102444800000, NULL)";
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
async fn upgrade_keeps_fences(backend: Backend, test: &str, old: &[&str], versions: &[i64]) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let old: Vec<String> = old.iter().map(|s| s.to_string()).collect();
    let versions = versions.to_vec();
    with_fresh_database(&ts, move |url| async move {
        let old: Vec<&str> = old.iter().map(String::as_str).collect();
        previous_version_database(backend, &url, &old).await;

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

        let applied: Vec<i64> = match backend {
            Backend::Sqlite => {
                let opts = url
                    .parse::<sqlx::sqlite::SqliteConnectOptions>()
                    .expect("sqlite URL");
                let pool = sqlx::SqlitePool::connect_with(opts).await.expect("connect");
                sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
                    .fetch_all(&pool)
                    .await
                    .expect("migrations table")
            }
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&url).await.expect("connect");
                sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
                    .fetch_all(&pool)
                    .await
                    .expect("migrations table")
            }
            Backend::MySql => {
                let pool = sqlx::MySqlPool::connect(&url).await.expect("connect");
                sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
                    .fetch_all(&pool)
                    .await
                    .expect("migrations table")
            }
        };
        assert_eq!(applied, versions);

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
        &[1, 2],
    )
    .await;
}

#[tokio::test]
async fn postgres_upgrade_from_0001_keeps_fences() {
    upgrade_keeps_fences(
        Backend::Postgres,
        "postgres_upgrade_from_0001_keeps_fences",
        &["0001_init.sql"],
        &[1, 2],
    )
    .await;
}

#[tokio::test]
async fn mysql_upgrade_from_0002_keeps_fences() {
    upgrade_keeps_fences(
        Backend::MySql,
        "mysql_upgrade_from_0002_keeps_fences",
        &["0001_init.sql", "0002_acquire_procedure.sql"],
        &[1, 2, 3, 4],
    )
    .await;
}

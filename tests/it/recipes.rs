//! `docs/RECIPES.md`, executed.
//!
//! * The conditional-write recipes: the SQL blocks tagged `postgres-recipe`,
//!   `mysql-recipe` and `sqlite-recipe` are read from the document at test
//!   time and run verbatim against the real PostgreSQL and MariaDB (each test
//!   in a fresh schema/database of its own, so the document's table name
//!   `invoices` works unchanged) and a temporary SQLite file.
//! * The immutable-file-plus-fenced-pointer job `report` of
//!   `jobs.example.toml`, run out of order: the newer run first, then a stale
//!   run holding the older token.
//! * `stale_exit_code`: a daemon job that exits with it is recorded and
//!   logged as a rejected write.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::Row;

use common::daemon::{ev, i64_field, job_toml, str_field, Daemon, DaemonOpts};
use common::harness::{clean, code, describe, fencecron, run};
use common::{bin, unique, Backend, TestStore};

// ------------------------------------------------------------ the document

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read_repo_file(rel: &str) -> String {
    let path = repo_file(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The body of the one fenced code block of `doc` whose info string is
/// exactly `info` (e.g. "sql postgres-recipe write").
fn block(doc: &str, info: &str) -> String {
    let wanted: Vec<&str> = info.split_whitespace().collect();
    let mut found = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(rest) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let is_wanted = rest.split_whitespace().collect::<Vec<_>>() == wanted;
        let mut body = String::new();
        for inner in lines.by_ref() {
            if inner.trim_start().starts_with("```") {
                break;
            }
            body.push_str(inner);
            body.push('\n');
        }
        if is_wanted {
            found.push(body);
        }
    }
    assert_eq!(
        found.len(),
        1,
        "docs/RECIPES.md must have exactly one ```{info} block, found {}",
        found.len()
    );
    found.pop().unwrap()
}

/// The CREATE and the write of one recipe, checked to be one statement each.
fn recipe(tag: &str) -> (String, String) {
    let doc = read_repo_file("docs/RECIPES.md");
    let create = block(&doc, &format!("sql {tag} create"));
    let write = block(&doc, &format!("sql {tag} write"));
    for (part, sql) in [("create", &create), ("write", &write)] {
        let body = sql.trim().trim_end_matches(';');
        assert!(
            !body.contains(';'),
            "the {tag} {part} block must be ONE statement:\n{sql}"
        );
    }
    assert!(
        create.contains("invoices") && write.contains("invoices"),
        "the {tag} recipe should use the table `invoices`"
    );
    (create, write)
}

// ------------------------------------------------------- the SQL scenario

/// What every recipe must do, written once for the three pool types: the
/// pool, the verbatim write (parameters invoice_id, amount_cents,
/// fence_token) and a read of one row.
macro_rules! scenario {
    ($name:expr, $pool:expr, $write:expr, $read:expr) => {{
        let name: &str = $name;
        let pool = $pool;
        let write_sql: &str = $write;
        let read_sql: &str = $read;

        let w = |id: &'static str, amount: i64, token: i64| {
            let pool = pool.clone();
            let sql = write_sql.to_string();
            async move {
                sqlx::query(&sql)
                    .bind(id)
                    .bind(amount)
                    .bind(token)
                    .execute(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("{id} token {token}: the recipe's write failed: {e}"))
                    .rows_affected()
            }
        };
        let r = |id: &'static str| {
            let pool = pool.clone();
            let sql = read_sql.to_string();
            async move {
                let row = sqlx::query(&sql)
                    .bind(id)
                    .fetch_optional(&pool)
                    .await
                    .expect("read the row back");
                row.map(|row| {
                    let amount: i64 = row.try_get(0).expect("amount_cents");
                    let token: i64 = row.try_get(1).expect("fence_token");
                    (amount, token)
                })
            }
        };

        // The first write of a key inserts it.
        assert_eq!(r("inv-1").await, None);
        let n = w("inv-1", 100, 5).await;
        assert!(n >= 1, "{name}: the first write must insert (rows affected {n})");
        assert_eq!(r("inv-1").await, Some((100, 5)), "{name}: after the first write");

        // A newer token applies.
        let n = w("inv-1", 200, 7).await;
        assert!(n >= 1, "{name}: a newer token must apply (rows affected {n})");
        assert_eq!(r("inv-1").await, Some((200, 7)), "{name}: after the newer write");

        // An equal token applies (several writes per generation), also when
        // it repeats exactly the same values (a retry after an error).
        let n = w("inv-1", 250, 7).await;
        assert!(n >= 1, "{name}: an equal token must apply (rows affected {n})");
        let n = w("inv-1", 250, 7).await;
        assert!(
            n >= 1,
            "{name}: an equal token repeating the same values must still count as applied (rows affected {n})"
        );
        assert_eq!(r("inv-1").await, Some((250, 7)), "{name}: after the equal writes");

        // An older token is rejected with 0 rows and the newer data stays.
        let n = w("inv-1", 999, 6).await;
        assert_eq!(n, 0, "{name}: an older token must be rejected with 0 rows affected");
        assert_eq!(
            r("inv-1").await,
            Some((250, 7)),
            "{name}: the rejected write must leave the newer data in place"
        );

        // Rows are fenced one by one: another key's first write inserts.
        let n = w("inv-2", 1, 1).await;
        assert!(n >= 1, "{name}: the first write of another key must insert");
        assert_eq!(r("inv-2").await, Some((1, 1)));
        assert_eq!(r("inv-1").await, Some((250, 7)));
    }};
}

/// A stale write that arrives while a newer write is uncommitted waits for
/// it and is then rejected; a newer write waiting behind an older one
/// applies. `$begin` opens a transaction on its own connection (SQLite needs
/// `BEGIN IMMEDIATE`, so the uncommitted write holds the write lock).
/// `$waiting` is how to see the queued write wait: its connection's id and
/// a count that is 1 while that connection waits (PostgreSQL, MariaDB);
/// `None` for SQLite, whose lock wait shows nowhere.
macro_rules! concurrent {
    ($name:expr, $pool:expr, $write:expr, $read:expr, $begin:expr, $waiting:expr) => {{
        let name: &str = $name;
        let pool = $pool;
        let write_sql: &str = $write;
        let read_sql: &str = $read;
        let seen_waiting: Option<(&'static str, &'static str)> = $waiting;

        for (held, queued, expect_applied) in [((300, 9), (666, 8), false), ((400, 10), (500, 11), true)] {
            // What taking the write lock costs when it is free, timed before
            // it is taken (SQLite's window below).
            let free = {
                let started = std::time::Instant::now();
                let probe = $begin;
                probe.rollback().await.expect("rollback the probe");
                started.elapsed()
            };
            let mut tx = $begin;
            let n = sqlx::query(write_sql)
                .bind("inv-1")
                .bind(held.0 as i64)
                .bind(held.1 as i64)
                .execute(&mut *tx)
                .await
                .expect("write inside the open transaction")
                .rows_affected();
            assert!(n >= 1, "{name}: the transaction's write (token {}) must apply", held.1);

            let (id_tx, id_rx) = tokio::sync::oneshot::channel::<i64>();
            let waiting = {
                let pool = pool.clone();
                let sql = write_sql.to_string();
                tokio::spawn(async move {
                    let mut conn = pool.acquire().await.expect("a connection for the queued write");
                    if let Some((id_sql, _)) = seen_waiting {
                        let id: i64 = sqlx::query_scalar(id_sql)
                            .fetch_one(&mut *conn)
                            .await
                            .expect("connection id");
                        let _ = id_tx.send(id);
                    }
                    sqlx::query(&sql)
                        .bind("inv-1")
                        .bind(queued.0 as i64)
                        .bind(queued.1 as i64)
                        .execute(&mut *conn)
                        .await
                        .map(|d| d.rows_affected())
                })
            };
            match seen_waiting {
                // Seen waiting on the row's lock: an observed wait, not a
                // window.
                Some((_, waiting_sql)) => {
                    let id = tokio::time::timeout(Duration::from_secs(20), id_rx)
                        .await
                        .expect("the queued write's connection")
                        .expect("id");
                    let deadline = std::time::Instant::now() + Duration::from_secs(20);
                    loop {
                        let n: i64 = sqlx::query_scalar(waiting_sql)
                            .bind(id)
                            .fetch_one(&pool)
                            .await
                            .expect("lock wait probe");
                        if n > 0 {
                            break;
                        }
                        assert!(
                            !waiting.is_finished(),
                            "{name}: the write with token {} finished while token {} was uncommitted on the same row: it must wait for it",
                            queued.1,
                            held.1
                        );
                        assert!(
                            std::time::Instant::now() < deadline,
                            "{name}: the queued write was never seen waiting"
                        );
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                // SQLite: the write waits for the write lock, which shows
                // nowhere. The window is measured, not guessed: many times
                // what taking the lock costs when it is free (timed above);
                // a write that did not wait would be done well within it.
                None => tokio::time::sleep(free.saturating_mul(20).max(Duration::from_millis(100))).await,
            }
            assert!(
                !waiting.is_finished(),
                "{name}: the write with token {} finished while token {} was uncommitted on the same row: it must wait for it",
                queued.1,
                held.1
            );
            tx.commit().await.expect("commit");
            let n = tokio::time::timeout(Duration::from_secs(20), waiting)
                .await
                .expect("the queued write finishes after the commit")
                .expect("join")
                .unwrap_or_else(|e| panic!("{name}: the queued write failed: {e}"));
            let row: Option<(i64, i64)> = sqlx::query(read_sql)
                .bind("inv-1")
                .fetch_optional(&pool)
                .await
                .expect("read back")
                .map(|row| (row.try_get(0).unwrap(), row.try_get(1).unwrap()));
            if expect_applied {
                assert!(n >= 1, "{name}: newer token {} queued behind {} must apply", queued.1, held.1);
                assert_eq!(row, Some((queued.0 as i64, queued.1 as i64)));
            } else {
                assert_eq!(
                    n, 0,
                    "{name}: stale token {} queued behind newer {} must be rejected with 0 rows once it commits",
                    queued.1, held.1
                );
                assert_eq!(row, Some((held.0 as i64, held.1 as i64)), "{name}: newer data retained");
            }
        }
    }};
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_recipe() {
    let Some(ts) = TestStore::new(Backend::Postgres, "postgres_recipe") else {
        return;
    };
    let (create, write) = recipe("postgres-recipe");
    let schema = unique("recipes").replace('-', "_");
    let admin = PgPool::connect(&ts.url)
        .await
        .expect("connect to PostgreSQL");
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await
        .expect("create schema");
    let opts = PgConnectOptions::from_str(&ts.url)
        .expect("postgres URL")
        .options([("search_path", schema.as_str())]);
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(opts)
        .await
        .expect("connect in the schema");
    sqlx::query(&create)
        .execute(&pool)
        .await
        .expect("the recipe's CREATE TABLE runs verbatim");
    let read = "SELECT amount_cents, fence_token FROM invoices WHERE invoice_id = $1";
    scenario!("postgres", pool.clone(), &write, read);
    concurrent!(
        "postgres",
        pool.clone(),
        &write,
        read,
        pool.begin().await.expect("begin"),
        Some((
            "SELECT pg_backend_pid()::BIGINT",
            "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'"
        ))
    );
    pool.close().await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&admin)
        .await
        .expect("drop schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_recipe() {
    let Some(ts) = TestStore::new(Backend::MySql, "mysql_recipe") else {
        return;
    };
    let (create, write) = recipe("mysql-recipe");
    let db = unique("recipes").replace('-', "_");
    let admin = MySqlPool::connect(&ts.url).await.expect("connect to MySQL");
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&admin)
        .await
        .expect("create database");
    let opts = MySqlConnectOptions::from_str(&ts.url)
        .expect("mysql URL")
        .database(&db);
    let pool = MySqlPoolOptions::new()
        .max_connections(3)
        .connect_with(opts)
        .await
        .expect("connect to the database");
    sqlx::query(&create)
        .execute(&pool)
        .await
        .expect("the recipe's CREATE TABLE runs verbatim");
    let read = "SELECT amount_cents, fence_token FROM invoices WHERE invoice_id = ?";
    scenario!("mysql", pool.clone(), &write, read);
    concurrent!(
        "mysql",
        pool.clone(),
        &write,
        read,
        pool.begin().await.expect("begin"),
        // MariaDB's INNODB_TRX does not always say LOCK WAIT for a row lock
        // wait (tests/it/guard.rs): the connection is seen inside its write.
        Some((
            "SELECT CAST(CONNECTION_ID() AS SIGNED)",
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO IS NOT NULL"
        ))
    );
    pool.close().await;
    sqlx::query(&format!("DROP DATABASE {db}"))
        .execute(&admin)
        .await
        .expect("drop database");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_recipe() {
    let (create, write) = recipe("sqlite-recipe");
    let dir = tempfile::tempdir().expect("temp dir");
    let opts = SqliteConnectOptions::new()
        .filename(dir.path().join("app.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(20));
    let pool: SqlitePool = SqlitePoolOptions::new()
        .max_connections(3)
        .connect_with(opts)
        .await
        .expect("open SQLite");
    sqlx::query(&create)
        .execute(&pool)
        .await
        .expect("the recipe's CREATE TABLE runs verbatim");
    let read = "SELECT amount_cents, fence_token FROM invoices WHERE invoice_id = ?";
    scenario!("sqlite", pool.clone(), &write, read);
    concurrent!(
        "sqlite",
        pool.clone(),
        &write,
        read,
        pool.begin_with("BEGIN IMMEDIATE")
            .await
            .expect("begin immediate"),
        None
    );
    pool.close().await;
}

// ------------------------------------------------- the file-pointer job

/// A `[[job]]` table by name from a TOML document.
fn job_table(doc: &str, name: &str, what: &str) -> toml::Table {
    let parsed: toml::Table =
        toml::from_str(doc).unwrap_or_else(|e| panic!("{what} is not valid TOML: {e}"));
    let jobs = parsed
        .get("job")
        .and_then(|j| j.as_array())
        .unwrap_or_else(|| panic!("{what} has no [[job]]"));
    jobs.iter()
        .filter_map(|j| j.as_table())
        .find(|j| j.get("name").and_then(|n| n.as_str()) == Some(name))
        .cloned()
        .unwrap_or_else(|| panic!("{what} has no job named {name}"))
}

fn strings(v: &toml::Value) -> Vec<String> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|s| s.as_str().expect("a string").to_string())
        .collect()
}

fn json(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", describe(out)))
}

/// The JSON events a `--log-format json` command wrote to stderr.
fn stderr_events(out: &std::process::Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(Value::is_object)
        .collect()
}

fn stale_records(dir: &Path, store: &str) -> Vec<Value> {
    let mut cmd = fencecron(dir);
    cmd.args(["stale", "--json", "--store", store]);
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "stale --json: {}", describe(&out));
    match json(&out) {
        Value::Array(a) => a,
        other => panic!("stale --json is not an array: {other}"),
    }
}

#[test]
fn pointer_job_stale_run_cannot_move_the_pointer_back() {
    // The job as shipped, and the copy the recipe shows, are the same job.
    let example = read_repo_file("jobs.example.toml");
    let job = job_table(&example, "report", "jobs.example.toml");
    let shown = block(&read_repo_file("docs/RECIPES.md"), "toml report-job");
    let shown = job_table(&shown, "report", "the report-job block of docs/RECIPES.md");
    assert_eq!(
        job, shown,
        "docs/RECIPES.md shows a different `report` job than jobs.example.toml"
    );
    let argv = strings(&job["command"]);
    let resource = job["resource"].as_str().expect("resource").to_string();
    assert!(
        job["env"].get("REPORT_DIR").is_some(),
        "the job names its directory in env.REPORT_DIR"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let reports = dir.path().join("reports");
    let store = format!("sqlite://{}", dir.path().join("fencecron.db").display());

    // The stale owner: it acquired token N, then stalled before publishing;
    // its lease ended (released here, as good as expired).
    let mut cmd = fencecron(dir.path());
    cmd.args(["lease", "acquire", &resource, "--json", "--store", &store]);
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "lease acquire: {}", describe(&out));
    let stale = json(&out);
    let old_token = stale["token"].as_i64().expect("token");
    let old_owner = stale["owner_id"].as_str().expect("owner_id").to_string();
    let mut cmd = fencecron(dir.path());
    cmd.args([
        "lease",
        "release",
        &resource,
        "--owner-id",
        &old_owner,
        "--token",
        &old_token.to_string(),
        "--store",
        &store,
    ]);
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "lease release: {}", describe(&out));

    // The newer run, under `fencecron exec` (token N+1), publishes first.
    let mut cmd = fencecron(dir.path());
    cmd.args(["exec", &resource, "--store", &store, "--"])
        .args(&argv)
        .env("REPORT_DIR", &reports)
        .env("FENCECRON_NODE", "node-new");
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "the newer run: {}", describe(&out));
    let new_token = old_token + 1;
    let new_file = format!("report-{new_token}.json");

    // The stale run resumes with token N, as the daemon would have started
    // it: the job's env, then the fencing variables.
    let mut cmd = clean(Command::new(&argv[0]), dir.path());
    cmd.args(&argv[1..])
        .env("REPORT_DIR", &reports)
        .env("FENCECRON_TOKEN", old_token.to_string())
        .env("FENCECRON_RESOURCE", &resource)
        .env("FENCECRON_OWNER_ID", &old_owner)
        .env(
            "FENCECRON_EXPIRES_AT",
            stale["expires_at"].as_str().unwrap(),
        )
        .env("FENCECRON_JOB", "report")
        .env("FENCECRON_SCHEDULED_AT", "2030-01-01T00:05:00.000Z")
        .env("FENCECRON_NODE", "node-stale")
        .env("FENCECRON_STORE", &store)
        .env("FENCECRON_BIN", bin())
        .env("FENCECRON_LOG_FORMAT", "json");
    let out = run(cmd, None);
    assert_eq!(
        code(&out),
        3,
        "the stale run's put must be rejected (exit 3) and the job must pass that on: {}",
        describe(&out)
    );
    let rejected = stderr_events(&out)
        .into_iter()
        .find(|e| str_field(e, "event") == Some("stale_write_rejected"))
        .unwrap_or_else(|| panic!("no stale_write_rejected event: {}", describe(&out)));
    assert_eq!(i64_field(&rejected, "token"), Some(old_token));
    assert_eq!(i64_field(&rejected, "accepted_token"), Some(new_token));
    assert_eq!(str_field(&rejected, "key"), Some("latest"));

    // The pointer still names the newer run's file, which is intact; the
    // stale run's file is gone and nothing half-written is left.
    let mut cmd = fencecron(dir.path());
    cmd.args(["get", "latest", "--resource", &resource, "--json"])
        .args(["--store", &store]);
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "get latest: {}", describe(&out));
    let latest = json(&out);
    assert_eq!(
        latest["value"].as_str(),
        Some(new_file.as_str()),
        "{latest}"
    );
    assert_eq!(latest["token"].as_i64(), Some(new_token), "{latest}");
    let published: Value = serde_json::from_str(
        &std::fs::read_to_string(reports.join(&new_file)).expect("the published file exists"),
    )
    .expect("the published file is JSON");
    assert_eq!(published["token"].as_i64(), Some(new_token));
    assert_eq!(published["node"].as_str(), Some("node-new"));
    let mut left: Vec<String> = std::fs::read_dir(&reports)
        .expect("reports dir")
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    left.sort();
    assert_eq!(
        left,
        vec![new_file.clone()],
        "only the published file may remain (the stale run deletes its orphan)"
    );

    // And the rejection is on record.
    let recs = stale_records(dir.path(), &store);
    let rec = recs
        .iter()
        .find(|r| r["resource"] == resource.as_str() && r["kind"] == "write_rejected")
        .unwrap_or_else(|| panic!("no write_rejected record in {recs:?}"));
    assert_eq!(rec["key"], "latest");
    assert_eq!(rec["token"].as_i64(), Some(old_token));
    assert_eq!(rec["accepted_token"].as_i64(), Some(new_token));
    assert_eq!(rec["stage"], "publish");
    assert_eq!(rec["node"], "node-stale");
    assert_eq!(rec["owner_id"], old_owner.as_str());
}

// ------------------------------------------------------- stale_exit_code

#[test]
fn stale_exit_code_is_recorded_and_logged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = format!("sqlite://{}", dir.path().join("fencecron.db").display());
    let reporter = unique("invoice-sync");
    let failing = unique("plain-failure");
    let sh = |script: &str| -> Vec<String> { vec!["sh".into(), "-c".into(), script.into()] };
    let mut config = String::new();
    config.push_str(&job_toml(
        &reporter,
        "* * * * * *",
        &sh(
            r#"echo "invoice inv-1: token $FENCECRON_TOKEN is stale, 0 rows written" >&2; exit 99"#,
        ),
        "lease = \"5s\"\nstale_exit_code = 99",
    ));
    config.push_str(&job_toml(
        &failing,
        "* * * * * *",
        &sh("exit 1"),
        "lease = \"5s\"\nstale_exit_code = 99",
    ));
    let config_path = dir.path().join("jobs.toml");
    std::fs::write(&config_path, &config).expect("write jobs.toml");

    let node = "node-stale-code";
    let mut daemon = Daemon::spawn(DaemonOpts::new(node, &config_path, &store));
    let wait = Duration::from_secs(20);
    let job_is = |name: String| move |e: &Value| str_field(e, "job") == Some(name.as_str());

    let rejected = daemon.expect(
        "stale_write_rejected for the job exiting with its stale_exit_code",
        |e| ev("stale_write_rejected")(e) && job_is(reporter.clone())(e),
        wait,
    );
    let finished_failing = daemon.expect(
        "job_finished of the job exiting 1",
        |e| ev("job_finished")(e) && job_is(failing.clone())(e),
        wait,
    );
    let token = i64_field(&rejected, "token").expect("token");
    let acquired = daemon.expect(
        "lease_acquired of the reporting run",
        |e| {
            ev("lease_acquired")(e)
                && job_is(reporter.clone())(e)
                && i64_field(e, "token") == Some(token)
        },
        wait,
    );
    let finished = daemon.expect(
        "job_finished of the reporting run",
        |e| {
            ev("job_finished")(e)
                && job_is(reporter.clone())(e)
                && i64_field(e, "token") == Some(token)
        },
        wait,
    );
    assert_eq!(daemon.stop(wait).map(|s| s.code()), Some(Some(0)));

    assert_eq!(i64_field(&finished, "exit_code"), Some(99), "{finished}");
    assert_eq!(str_field(&rejected, "level"), Some("WARN"), "{rejected}");
    assert_eq!(str_field(&rejected, "stage"), Some("job"), "{rejected}");
    assert_eq!(str_field(&rejected, "resource"), Some(reporter.as_str()));
    assert_eq!(str_field(&rejected, "node"), Some(node));
    assert_eq!(
        str_field(&rejected, "owner_id"),
        str_field(&acquired, "owner_id"),
        "{rejected}"
    );
    assert_eq!(i64_field(&finished_failing, "exit_code"), Some(1));
    assert!(
        !daemon
            .events("stale_write_rejected")
            .iter()
            .any(|e| str_field(e, "job") == Some(failing.as_str())),
        "an exit code other than stale_exit_code must not be reported as stale"
    );

    let recs = stale_records(dir.path(), &store);
    let rec = recs
        .iter()
        .find(|r| r["resource"] == reporter.as_str() && r["token"].as_i64() == Some(token))
        .unwrap_or_else(|| panic!("no stale record for {reporter} token {token}: {recs:?}"));
    assert_eq!(rec["kind"], "write_rejected", "{rec}");
    assert_eq!(rec["stage"], "job", "{rec}");
    assert_eq!(rec["job"], reporter.as_str(), "{rec}");
    assert_eq!(rec["node"], node, "{rec}");
    assert_eq!(rec["owner_id"].as_str(), str_field(&acquired, "owner_id"));
    assert!(
        rec["key"].is_null() && rec["accepted_token"].is_null(),
        "{rec}"
    );
    assert!(
        !recs.iter().any(|r| r["resource"] == failing.as_str()),
        "exit 1 is an ordinary failure, not a stale record: {recs:?}"
    );
}

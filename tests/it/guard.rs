//! The SQL guard (`fencecron guard`), on every backend, through the real
//! binary and the databases' own command-line clients (`psql`, `mysql`,
//! `sqlite3`), the way a job would use it.
//!
//! Each test works in databases of its own (a fresh PostgreSQL or MariaDB
//! database, dropped afterwards; a SQLite file in a temporary directory),
//! so the table names can be fixed and tests run in parallel with the
//! suite. fencecron's own store is a SQLite file beside them.

use crate::common;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{Executor, Row};

use common::fresh::with_database;
use common::harness::{code, describe, fencecron, run};
use common::{bin, unique, Backend, TestStore};

// ------------------------------------------------------------ databases

/// A database of a test's own where the guard is installed: its URL for
/// `--db`, the argv of the backend's client to run SQL from stdin, and a
/// directory for files (fencecron's store, job scripts, markers).
struct Target {
    backend: Backend,
    url: String,
    client: Vec<String>,
    dir: PathBuf,
}

/// Runs `body` with `n` fresh databases on `backend`'s server (or `None`
/// after a loud skip when the server or the client tool is missing), and
/// drops them whether the body passed or panicked.
async fn with_targets<F, Fut>(backend: Backend, test: &str, n: usize, body: F)
where
    F: FnOnce(Vec<Target>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let tool = match backend {
        Backend::Postgres => "psql",
        Backend::MySql => "mysql",
        Backend::Sqlite => "sqlite3",
    };
    if Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("{test}: the client `{tool}` is missing under CI=true; install it");
        }
        skipped!(
            "\n*** SKIPPED {test} on {backend:?}: the client `{tool}` is not installed. ***\n"
        );
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let mut names = Vec::new();
    let mut targets = Vec::new();
    for i in 0..n {
        let files = dir.path().join(format!("t{i}"));
        std::fs::create_dir(&files).expect("target dir");
        let name = unique("guard").replace('-', "_");
        let (url, client) = match backend {
            Backend::Sqlite => {
                let path = files.join("app.db");
                // An empty file is an empty SQLite database; the guard
                // refuses to create one on its own.
                std::fs::write(&path, b"").expect("create app.db");
                let url = format!("sqlite://{}", path.display());
                let client = vec![
                    "sqlite3".to_string(),
                    "-bail".to_string(),
                    "-cmd".to_string(),
                    ".timeout 20000".to_string(),
                    path.display().to_string(),
                ];
                (url, client)
            }
            Backend::Postgres => {
                let url = with_database(&ts.url, &name);
                let client = [
                    "psql",
                    "-X",
                    "-q",
                    "-v",
                    "ON_ERROR_STOP=1",
                    "-v",
                    "VERBOSITY=verbose",
                    &url,
                ]
                .map(str::to_string)
                .to_vec();
                (url, client)
            }
            Backend::MySql => {
                let url = with_database(&ts.url, &name);
                let u = url::Url::parse(&url).expect("mysql URL");
                let mut client = vec![
                    "mysql".to_string(),
                    "--batch".to_string(),
                    "-h".to_string(),
                    u.host_str().unwrap_or("127.0.0.1").to_string(),
                    "-P".to_string(),
                    u.port().unwrap_or(3306).to_string(),
                    "-u".to_string(),
                    u.username().to_string(),
                ];
                if let Some(p) = u.password() {
                    client.push(format!("--password={p}"));
                }
                client.push(name.clone());
                (url, client)
            }
        };
        names.push(name);
        targets.push(Target {
            backend,
            url,
            client,
            dir: files,
        });
    }
    let admin = Admin::connect(backend, &ts.url).await;
    for name in &names {
        admin.run(&format!("CREATE DATABASE {name}")).await;
    }
    let result = tokio::spawn(body(targets)).await;
    for name in &names {
        let drop = match backend {
            Backend::Postgres => format!("DROP DATABASE {name} WITH (FORCE)"),
            _ => format!("DROP DATABASE {name}"),
        };
        admin.run(&drop).await;
    }
    drop(dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

/// The server-wide connection that creates and drops the test's databases.
enum Admin {
    None,
    Pg(PgPool),
    My(MySqlPool),
}

impl Admin {
    async fn connect(backend: Backend, url: &str) -> Admin {
        match backend {
            Backend::Sqlite => Admin::None,
            Backend::Postgres => Admin::Pg(PgPool::connect(url).await.expect("connect")),
            Backend::MySql => Admin::My(MySqlPool::connect(url).await.expect("connect")),
        }
    }

    async fn run(&self, sql: &str) {
        match self {
            Admin::None => {}
            Admin::Pg(p) => {
                p.execute(sql).await.expect(sql);
            }
            Admin::My(p) => {
                p.execute(sql).await.expect(sql);
            }
        }
    }
}

/// A pool on a target, for the test's own reads (and the concurrency test's
/// transactions).
enum Db {
    Pg(PgPool),
    My(MySqlPool),
    Lite(SqlitePool),
}

impl Db {
    async fn connect(t: &Target) -> Db {
        match t.backend {
            Backend::Postgres => Db::Pg(
                PgPoolOptions::new()
                    .max_connections(3)
                    .connect(&t.url)
                    .await
                    .expect("connect"),
            ),
            Backend::MySql => Db::My(
                MySqlPoolOptions::new()
                    .max_connections(3)
                    .connect(&t.url)
                    .await
                    .expect("connect"),
            ),
            Backend::Sqlite => {
                let path = t.url.trim_start_matches("sqlite://");
                let opts = SqliteConnectOptions::new()
                    .filename(path)
                    .busy_timeout(Duration::from_secs(20));
                Db::Lite(
                    SqlitePoolOptions::new()
                        .max_connections(3)
                        .connect_with(opts)
                        .await
                        .expect("open SQLite"),
                )
            }
        }
    }

    /// Every row of `sql` as its columns, rendered as text and joined by `|`.
    async fn rows(&self, sql: &str) -> Vec<String> {
        macro_rules! render {
            ($pool:expr) => {{
                let rows = sqlx::query(sql)
                    .fetch_all($pool)
                    .await
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                rows.iter()
                    .map(|row| {
                        (0..row.len())
                            .map(|i| {
                                if let Ok(v) = row.try_get::<Option<String>, _>(i) {
                                    v.unwrap_or_else(|| "NULL".into())
                                } else if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
                                    v.map_or_else(|| "NULL".into(), |v| v.to_string())
                                } else {
                                    let v: Option<Vec<u8>> = row
                                        .try_get(i)
                                        .unwrap_or_else(|e| panic!("{sql} column {i}: {e}"));
                                    v.map_or_else(
                                        || "NULL".into(),
                                        |v| String::from_utf8_lossy(&v).into_owned(),
                                    )
                                }
                            })
                            .collect::<Vec<_>>()
                            .join("|")
                    })
                    .collect()
            }};
        }
        match self {
            Db::Pg(p) => render!(p),
            Db::My(p) => render!(p),
            Db::Lite(p) => render!(p),
        }
    }

    async fn close(&self) {
        match self {
            Db::Pg(p) => p.close().await,
            Db::My(p) => p.close().await,
            Db::Lite(p) => p.close().await,
        }
    }
}

// ------------------------------------------------- the backends' SQL

/// The job's side of the guard in each backend's SQL: what a job writes
/// into its own database, with `@RESOURCE@` and `@TOKEN@` for the values
/// its script puts in from `FENCECRON_RESOURCE` and `FENCECRON_TOKEN`.
impl Target {
    fn create_table(&self) -> &'static str {
        match self.backend {
            Backend::MySql => {
                "CREATE TABLE guarded (k VARCHAR(64) NOT NULL PRIMARY KEY, v TEXT NOT NULL, token BIGINT NOT NULL) ENGINE=InnoDB;"
            }
            _ => "CREATE TABLE guarded (k TEXT PRIMARY KEY, v TEXT NOT NULL, token BIGINT NOT NULL);",
        }
    }

    fn begin(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "BEGIN;",
            Backend::MySql => "START TRANSACTION;",
            // Take the write lock up front (RECIPES.md, SQLite).
            Backend::Sqlite => "BEGIN IMMEDIATE;",
        }
    }

    /// Writes row `k` with the run's token.
    fn write(&self, k: &str) -> String {
        match self.backend {
            Backend::MySql => format!(
                "INSERT INTO guarded (k, v, token) VALUES ('{k}', 'run-@TOKEN@', @TOKEN@) ON DUPLICATE KEY UPDATE v = VALUES(v), token = VALUES(token);"
            ),
            _ => format!(
                "INSERT INTO guarded (k, v, token) VALUES ('{k}', 'run-@TOKEN@', @TOKEN@) ON CONFLICT (k) DO UPDATE SET v = excluded.v, token = excluded.token;"
            ),
        }
    }

    /// The guard's check, as docs/guard.md shows it.
    fn check(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "SELECT fencecron_guard('@RESOURCE@', @TOKEN@);",
            Backend::MySql => "CALL fencecron_guard('@RESOURCE@', @TOKEN@);",
            Backend::Sqlite => {
                "INSERT INTO fencecron_guard_check (resource, token) VALUES ('@RESOURCE@', @TOKEN@);"
            }
        }
    }

    /// A shell command the client runs when it reaches this line (after
    /// every statement before it has finished).
    fn shell(&self, cmd: &str) -> String {
        match self.backend {
            Backend::Sqlite => format!(".shell {cmd}"),
            _ => format!("\\! {cmd}"),
        }
    }

    /// The store URL of fencecron's own (SQLite) store for this target.
    fn store(&self) -> String {
        format!("sqlite://{}", self.dir.join("fencecron.db").display())
    }

    /// Runs SQL through the client, as a DBA would.
    fn client(&self, sql: &str) -> Output {
        let mut cmd = Command::new(&self.client[0]);
        cmd.args(&self.client[1..]).current_dir(&self.dir);
        run(cmd, Some(sql.as_bytes()))
    }

    /// `fencecron` with the arguments, in this target's directory.
    fn fencecron(&self, args: &[&str]) -> Output {
        let mut cmd = fencecron(&self.dir);
        cmd.args(args);
        run(cmd, None)
    }

    fn install(&self) {
        let out = self.fencecron(&["guard", "install", "--db", &self.url]);
        assert_eq!(code(&out), 0, "guard install: {}", describe(&out));
    }

    /// A job: its SQL (with the placeholders) in a file, run through the
    /// client by a shell script that fills in the run's resource and token
    /// and, when the client fails, reports the refusal with `fencecron
    /// guard record` and exits 42 (not a stale_exit_code: the record is
    /// the guard's).
    fn job(&self, name: &str, sql: &[String]) -> Vec<String> {
        let file = self.dir.join(format!("{name}.sql"));
        std::fs::write(&file, sql.join("\n") + "\n").expect("write job SQL");
        let script = r#"
sed -e "s/@TOKEN@/$FENCECRON_TOKEN/g" -e "s/@RESOURCE@/$FENCECRON_RESOURCE/g" "$JOB_SQL" | "$@"
rc=$?
[ "$rc" -eq 0 ] && exit 0
"$FENCECRON_BIN" guard record --db "$GUARD_DB"
exit 42
"#;
        let mut argv = vec![
            "env".to_string(),
            format!("JOB_SQL={}", file.display()),
            format!("GUARD_DB={}", self.url),
            format!("FENCECRON_BIN={}", bin().display()),
            "sh".to_string(),
            "-c".to_string(),
            script.to_string(),
            name.to_string(),
        ];
        argv.extend(self.client.iter().cloned());
        argv
    }

    /// Runs a job under `fencecron exec` (a fresh token); its output.
    fn exec(&self, resource: &str, job: &[String]) -> Output {
        let store = self.store();
        let mut cmd = fencecron(&self.dir);
        cmd.args(["exec", resource, "--store", &store, "--"])
            .args(job)
            .env("FENCECRON_NODE", "node-new");
        run(cmd, None)
    }

    fn files(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", describe(out)))
}

/// Waits for `path` to exist (a marker a job's client writes).
fn wait_for_file(path: &Path, what: &str, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        if let Some(st) = child.try_wait().expect("try_wait") {
            panic!("{what}: the job exited ({st}) before {}", path.display());
        }
        assert!(Instant::now() < deadline, "{what}: no {}", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ------------------------------------------------ jobs, paused owner

/// Two runs (tokens N, N+1) write through the guard; then the paused-owner
/// scenario: the old owner (token N+2) has written inside its transaction
/// and stalls before its check (on SQLite, whose writers exclude each
/// other, before its transaction), its lease ends, a newer run (N+3)
/// writes and commits, and the old owner resumes: the guard refuses it, its
/// whole transaction — also the rows written before the check — is rolled
/// back, the newer data stays, and the refusal is recorded and listed by
/// `fencecron stale --guard`.
async fn paused_owner(t: Target) {
    t.install();
    let out = t.client(t.create_table());
    assert_eq!(code(&out), 0, "create table: {}", describe(&out));
    let resource = unique("guard");

    // Two runs, one after the other: both accepted, the newer one wins.
    let seq = t.job(
        "seq",
        &[
            t.begin().into(),
            t.write("shared"),
            t.check().into(),
            "COMMIT;".into(),
        ],
    );
    for _ in 0..2 {
        let out = t.exec(&resource, &seq);
        assert_eq!(code(&out), 0, "a current run: {}", describe(&out));
    }
    let db = Db::connect(&t).await;
    assert_eq!(
        db.rows("SELECT k, v, token FROM guarded ORDER BY k").await,
        vec!["shared|run-2|2"]
    );
    assert_eq!(
        db.rows("SELECT resource, token FROM fencecron_guard").await,
        vec![format!("{resource}|2")]
    );

    // The old owner: token 3, from a lease that then ends.
    let out = t.fencecron(&[
        "lease",
        "acquire",
        &resource,
        "--json",
        "--store",
        &t.store(),
    ]);
    assert_eq!(code(&out), 0, "lease acquire: {}", describe(&out));
    let lease = json(&out);
    let old_token = lease["token"].as_i64().expect("token");
    let old_owner = lease["owner_id"].as_str().expect("owner_id").to_string();
    assert_eq!(old_token, 3);

    let ready = t.files("old-ready");
    let go = t.files("old-go");
    let wait = t.files("wait.sh");
    std::fs::write(
        &wait,
        format!("while [ ! -e {} ]; do sleep 0.02; done\n", go.display()),
    )
    .expect("wait.sh");
    let pause = [
        t.shell(&format!("touch {}", ready.display())),
        t.shell(&format!("sh {}", wait.display())),
    ];
    let mut old_sql: Vec<String> = Vec::new();
    if t.backend == Backend::Sqlite {
        old_sql.extend(pause.iter().cloned());
        old_sql.extend([t.begin().into(), t.write("old-1")]);
    } else {
        old_sql.extend([t.begin().into(), t.write("old-1")]);
        old_sql.extend(pause.iter().cloned());
    }
    old_sql.extend([t.check().into(), t.write("old-2"), "COMMIT;".into()]);
    let old_job = t.job("old", &old_sql);
    let mut cmd = common::harness::clean(Command::new(&old_job[0]), &t.dir);
    cmd.args(&old_job[1..])
        .env("FENCECRON_TOKEN", old_token.to_string())
        .env("FENCECRON_RESOURCE", &resource)
        .env("FENCECRON_OWNER_ID", &old_owner)
        .env("FENCECRON_NODE", "node-stale")
        .env("FENCECRON_LOG_FORMAT", "json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut old = cmd.spawn().expect("start the old owner's job");
    wait_for_file(&ready, "the old owner", &mut old);

    // Its lease ends (released here: as good as expired).
    let out = t.fencecron(&[
        "lease",
        "release",
        &resource,
        "--owner-id",
        &old_owner,
        "--token",
        &old_token.to_string(),
        "--store",
        &t.store(),
    ]);
    assert_eq!(code(&out), 0, "lease release: {}", describe(&out));

    // The newer owner runs and commits while the old one is stalled.
    let new_job = t.job(
        "new",
        &[
            t.begin().into(),
            t.write("new-1"),
            t.write("shared"),
            t.check().into(),
            t.write("new-2"),
            "COMMIT;".into(),
        ],
    );
    let out = t.exec(&resource, &new_job);
    assert_eq!(code(&out), 0, "the newer run: {}", describe(&out));

    // The old owner resumes: refused, rolled back whole, reported.
    std::fs::write(&go, b"").expect("go");
    let out = old.wait_with_output().expect("old job");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(42),
        "the stale run must fail: {}",
        describe(&out)
    );
    assert!(
        err.contains("fencecron_guard: stale token"),
        "the client must show the guard's refusal: {}",
        describe(&out)
    );
    if t.backend != Backend::Sqlite {
        assert!(err.contains("FC001"), "SQLSTATE FC001: {}", describe(&out));
    }
    if t.backend != Backend::Sqlite {
        assert!(
            err.contains(&format!("stale token {old_token}")) && err.contains(&resource),
            "the refusal names the token and the resource: {err}"
        );
    }
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("recorded: token 3"),
        "guard record: {}",
        describe(&out)
    );
    assert_eq!(
        db.rows("SELECT k, v, token FROM guarded ORDER BY k").await,
        vec!["new-1|run-4|4", "new-2|run-4|4", "shared|run-4|4"],
        "the stale transaction left nothing, the newer run's rows are intact"
    );
    assert_eq!(
        db.rows("SELECT resource, token FROM fencecron_guard").await,
        vec![format!("{resource}|4")]
    );

    // One rejection on record, listed by `fencecron stale --guard`.
    let out = t.fencecron(&["stale", "--json", "--store", &t.store(), "--guard", &t.url]);
    assert_eq!(code(&out), 0, "stale --guard: {}", describe(&out));
    let recs = json(&out);
    let recs: Vec<&Value> = recs
        .as_array()
        .expect("array")
        .iter()
        .filter(|r| r["resource"] == resource.as_str())
        .collect();
    assert_eq!(recs.len(), 1, "{recs:?}");
    let rec = recs[0];
    assert_eq!(rec["kind"], "write_rejected", "{rec}");
    assert_eq!(rec["reason"], "stale", "{rec}");
    assert_eq!(rec["token"].as_i64(), Some(old_token), "{rec}");
    assert_eq!(rec["accepted_token"].as_i64(), Some(4), "{rec}");
    assert_eq!(rec["node"], "node-stale", "{rec}");
    assert_eq!(rec["owner_id"], old_owner.as_str(), "{rec}");
    // MySQL's procedure wrote the row itself; elsewhere the job's report did.
    let stage = match t.backend {
        Backend::MySql => "guard",
        _ => "guard_reported",
    };
    assert_eq!(rec["stage"], stage, "{rec}");
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_paused_owner_sqlite() {
    with_targets(Backend::Sqlite, "guard_paused_owner_sqlite", 1, |t| {
        paused_owner(t.into_iter().next().unwrap())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_paused_owner_postgres() {
    with_targets(Backend::Postgres, "guard_paused_owner_postgres", 1, |t| {
        paused_owner(t.into_iter().next().unwrap())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_paused_owner_mysql() {
    with_targets(Backend::MySql, "guard_paused_owner_mysql", 1, |t| {
        paused_owner(t.into_iter().next().unwrap())
    })
    .await;
}

// ------------------------------------------------------------ concurrency

/// Two transactions check one resource. While the first holds its check
/// uncommitted, the second waits for it (PostgreSQL and MariaDB: it is seen
/// waiting on a lock; SQLite: on the database's write lock). An older token
/// queued behind a newer one is refused once the newer commits, and its
/// transaction is rolled back whole, the row it wrote before the check
/// included, even though it then asks to COMMIT; a newer token queued behind
/// an older one is accepted. MySQL keeps the refusal as a row by itself,
/// PostgreSQL and SQLite cannot (their job reports it).
macro_rules! race {
    ($t:expr, $pool:expr, $begin:expr, $id_sql:expr, $waiting_sql:expr, $check:expr, $write:expr) => {{
        let t: &Target = $t;
        let pool = $pool.clone();
        let resource = unique("guard");
        for (held, queued, refused) in [(6_i64, 5_i64, true), (7, 8, false)] {
            // What beginning costs when nothing holds the lock, timed before
            // the first transaction takes it (SQLite's window below).
            let free = {
                let started = Instant::now();
                let probe = $begin(pool.clone()).await;
                probe.rollback().await.expect("rollback the probe");
                started.elapsed()
            };
            let mut tx = $begin(pool.clone()).await;
            sqlx::query($check)
                .bind(&resource)
                .bind(held)
                .execute(&mut *tx)
                .await
                .expect("the first check passes");
            sqlx::query($write)
                .bind(format!("held-{held}"))
                .bind(held)
                .execute(&mut *tx)
                .await
                .expect("the first transaction writes");

            let (id_tx, id_rx) = tokio::sync::oneshot::channel::<i64>();
            let second = {
                let pool = pool.clone();
                let resource = resource.clone();
                tokio::spawn(async move {
                    let mut tx = $begin(pool).await;
                    let id: i64 = sqlx::query_scalar($id_sql)
                        .fetch_one(&mut *tx)
                        .await
                        .expect("connection id");
                    let _ = id_tx.send(id);
                    sqlx::query($write)
                        .bind(format!("queued-{queued}"))
                        .bind(queued)
                        .execute(&mut *tx)
                        .await
                        .expect("the second transaction writes before its check");
                    let checked = sqlx::query($check)
                        .bind(&resource)
                        .bind(queued)
                        .execute(&mut *tx)
                        .await
                        .map(|_| ());
                    // A job that ignores the error and commits anyway.
                    let committed = tx.commit().await;
                    (checked, committed)
                })
            };
            match $waiting_sql {
                Some(sql) => {
                    let id = tokio::time::timeout(Duration::from_secs(20), id_rx)
                        .await
                        .expect("the second transaction began")
                        .expect("id");
                    let deadline = Instant::now() + Duration::from_secs(20);
                    loop {
                        let waiting: i64 = sqlx::query_scalar(sql)
                            .bind(id)
                            .fetch_one(&pool)
                            .await
                            .expect("lock wait probe");
                        if waiting > 0 {
                            break;
                        }
                        assert!(
                            !second.is_finished(),
                            "{:?}: token {queued} finished its check while token {held} was uncommitted",
                            t.backend
                        );
                        assert!(
                            Instant::now() < deadline,
                            "the second check never waited on the first"
                        );
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                // SQLite: the second waits for the write lock in BEGIN
                // IMMEDIATE, which shows nowhere. The window is measured,
                // not guessed: many times what the same BEGIN takes with
                // the lock free (timed above); a second that did not wait
                // would be past it well within.
                None => tokio::time::sleep(free.saturating_mul(20).max(Duration::from_millis(100))).await,
            }
            assert!(
                !second.is_finished(),
                "{:?}: token {queued} must wait while token {held} is uncommitted",
                t.backend
            );
            tx.commit().await.expect("the first transaction commits");
            let (checked, committed) = tokio::time::timeout(Duration::from_secs(20), second)
                .await
                .expect("the second transaction ends after the first commits")
                .expect("join");
            let keys: Vec<String> = sqlx::query_scalar("SELECT k FROM guarded ORDER BY k")
                .fetch_all(&pool)
                .await
                .expect("read back");
            let highest: i64 = sqlx::query_scalar(match t.backend {
                Backend::Postgres => "SELECT token FROM fencecron_guard WHERE resource = $1",
                _ => "SELECT token FROM fencecron_guard WHERE resource = ?",
            })
            .bind(&resource)
            .fetch_one(&pool)
            .await
            .expect("guard row");
            if refused {
                let e = checked.expect_err("the older token must be refused");
                let msg = e.to_string();
                assert!(msg.contains("fencecron_guard: stale token"), "{msg}");
                if t.backend != Backend::Sqlite {
                    let code = e.as_database_error().and_then(|d| d.code()).map(|c| c.to_string());
                    assert_eq!(code.as_deref(), Some("FC001"), "{msg}");
                    assert!(msg.contains(&format!("{queued}")) && msg.contains(&format!("{held}")), "{msg}");
                }
                let _ = committed;
                assert!(
                    !keys.contains(&format!("queued-{queued}")),
                    "{:?}: the refused transaction's write before the check was committed: {keys:?}",
                    t.backend
                );
                assert_eq!(highest, held);
            } else {
                checked.expect("the newer token is accepted");
                committed.expect("and commits");
                assert!(keys.contains(&format!("queued-{queued}")), "{keys:?}");
                assert_eq!(highest, queued);
            }
            assert!(keys.contains(&format!("held-{held}")), "{keys:?}");
        }
        let kept: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM fencecron_guard_rejections")
            .fetch_one(&pool)
            .await
            .expect("count rejections");
        let automatic = if t.backend == Backend::MySql { 1 } else { 0 };
        assert_eq!(kept, automatic, "{:?}: rejection rows kept by the database itself", t.backend);
    }};
}

async fn race(t: Target) {
    t.install();
    let out = t.client(t.create_table());
    assert_eq!(code(&out), 0, "create table: {}", describe(&out));
    let db = Db::connect(&t).await;
    match &db {
        Db::Pg(p) => race!(
            &t,
            p,
            |p: PgPool| async move { p.begin().await.expect("begin") },
            "SELECT pg_backend_pid()::BIGINT",
            Some("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock'"),
            "SELECT fencecron_guard($1, $2)",
            "INSERT INTO guarded (k, v, token) VALUES ($1, 'x', $2)"
        ),
        Db::My(p) => race!(
            &t,
            p,
            |p: MySqlPool| async move { p.begin().await.expect("begin") },
            "SELECT CAST(CONNECTION_ID() AS SIGNED)",
            // MariaDB's INNODB_TRX does not always say LOCK WAIT for this wait:
            // the connection is seen inside the guard's upsert instead.
            Some("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND INFO LIKE 'INSERT INTO fencecron_guard %'"),
            "CALL fencecron_guard(?, ?)",
            "INSERT INTO guarded (k, v, token) VALUES (?, 'x', ?)"
        ),
        Db::Lite(p) => race!(
            &t,
            p,
            // A connection of its own each time: after RAISE(ROLLBACK)
            // sqlx still counts the transaction as open, so a pooled
            // connection would refuse the next BEGIN.
            |p: SqlitePool| async move {
                let own = SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect_with((*p.connect_options()).clone())
                    .await
                    .expect("open SQLite");
                own.begin_with("BEGIN IMMEDIATE").await.expect("begin")
            },
            "SELECT 0",
            None::<&str>,
            "INSERT INTO fencecron_guard_check (resource, token) VALUES (?, ?)",
            "INSERT INTO guarded (k, v, token) VALUES (?, 'x', ?)"
        ),
    }
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_concurrent_checks_sqlite() {
    with_targets(Backend::Sqlite, "guard_concurrent_checks_sqlite", 1, |t| {
        race(t.into_iter().next().unwrap())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_concurrent_checks_postgres() {
    with_targets(
        Backend::Postgres,
        "guard_concurrent_checks_postgres",
        1,
        |t| race(t.into_iter().next().unwrap()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_concurrent_checks_mysql() {
    with_targets(Backend::MySql, "guard_concurrent_checks_mysql", 1, |t| {
        race(t.into_iter().next().unwrap())
    })
    .await;
}

// ------------------------------------------------- DDL and install

/// What a database holds, one line per object or column, led by the name
/// of the table (or routine) it belongs to.
async fn catalog(t: &Target, db: &Db) -> Vec<String> {
    let queries: &[&str] = match t.backend {
        Backend::Postgres => &[
            "SELECT c.relname, c.relkind::TEXT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'public' ORDER BY 1",
            "SELECT p.proname::TEXT, pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = 'public' ORDER BY 1",
            "SELECT table_name::TEXT, column_name::TEXT, data_type::TEXT, is_nullable::TEXT, COALESCE(column_default, '')
               FROM information_schema.columns WHERE table_schema = 'public' ORDER BY table_name, ordinal_position",
        ],
        Backend::MySql => &[
            "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() ORDER BY 1",
            "SELECT ROUTINE_NAME, ROUTINE_TYPE, ROUTINE_DEFINITION, SQL_DATA_ACCESS FROM information_schema.ROUTINES
              WHERE ROUTINE_SCHEMA = DATABASE() ORDER BY 1",
            "SELECT SPECIFIC_NAME, PARAMETER_NAME, DTD_IDENTIFIER FROM information_schema.PARAMETERS
              WHERE SPECIFIC_SCHEMA = DATABASE() ORDER BY SPECIFIC_NAME, ORDINAL_POSITION",
            "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COALESCE(COLUMN_DEFAULT, ''), COLUMN_KEY, EXTRA
               FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() ORDER BY TABLE_NAME, ORDINAL_POSITION",
            "SELECT TRIGGER_NAME, ACTION_STATEMENT FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() ORDER BY 1",
        ],
        Backend::Sqlite => &[
            "SELECT tbl_name, name, type, sql FROM sqlite_master WHERE name <> 'sqlite_sequence' ORDER BY tbl_name, name",
        ],
    };
    let mut all = Vec::new();
    for q in queries {
        all.extend(db.rows(q).await);
    }
    all
}

fn guard_objects(catalog: &[String]) -> Vec<String> {
    catalog
        .iter()
        .filter(|l| l.starts_with("fencecron_guard"))
        .cloned()
        .collect()
}

fn other_objects(catalog: &[String]) -> Vec<String> {
    catalog
        .iter()
        .filter(|l| !l.starts_with("fencecron_guard"))
        .cloned()
        .collect()
}

/// `guard ddl` piped into the backend's own client creates exactly what
/// `guard install` creates; `install` run twice keeps the guard's rows and
/// changes nothing else, also in a database that holds fencecron's own
/// store (its tables stay as they were).
async fn ddl_is_install(targets: Vec<Target>) {
    let (dba, installed) = (&targets[0], &targets[1]);
    let backend = match dba.backend {
        Backend::Postgres => "postgres",
        Backend::MySql => "mysql",
        Backend::Sqlite => "sqlite",
    };
    let out = dba.fencecron(&["guard", "ddl", "--backend", backend]);
    assert_eq!(code(&out), 0, "guard ddl: {}", describe(&out));
    let out = dba.client(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(
        code(&out),
        0,
        "the DDL through the client: {}",
        describe(&out)
    );
    let db = Db::connect(dba).await;
    let by_dba = catalog(dba, &db).await;
    db.close().await;
    assert!(
        by_dba
            .iter()
            .any(|l| l.starts_with("fencecron_guard_rejections")),
        "{by_dba:?}"
    );
    assert_eq!(
        guard_objects(&by_dba),
        by_dba,
        "the DDL creates only guard objects"
    );

    // fencecron's own store in the same database, then the guard, twice.
    let out = installed.fencecron(&["lease", "acquire", "shared-db", "--store", &installed.url]);
    assert_eq!(code(&out), 0, "fencecron's store: {}", describe(&out));
    let db = Db::connect(installed).await;
    let before = catalog(installed, &db).await;
    assert!(
        before.iter().any(|l| l.starts_with("fencecron_leases")),
        "{before:?}"
    );
    installed.install();
    let check = match installed.backend {
        Backend::Postgres => "SELECT fencecron_guard('kept', 5);",
        Backend::MySql => "CALL fencecron_guard('kept', 5);",
        Backend::Sqlite => {
            "INSERT INTO fencecron_guard_check (resource, token) VALUES ('kept', 5);"
        }
    };
    let out = installed.client(check);
    assert_eq!(code(&out), 0, "check: {}", describe(&out));
    installed.install();
    let after = catalog(installed, &db).await;
    assert_eq!(
        other_objects(&after),
        other_objects(&before),
        "install touched other objects"
    );
    assert_eq!(
        guard_objects(&after),
        by_dba,
        "printed DDL and install differ"
    );
    assert_eq!(
        db.rows("SELECT resource, token FROM fencecron_guard").await,
        vec!["kept|5"],
        "a second install keeps the guard's rows"
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_ddl_is_install_sqlite() {
    with_targets(
        Backend::Sqlite,
        "guard_ddl_is_install_sqlite",
        2,
        ddl_is_install,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_ddl_is_install_postgres() {
    with_targets(
        Backend::Postgres,
        "guard_ddl_is_install_postgres",
        2,
        ddl_is_install,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_ddl_is_install_mysql() {
    with_targets(
        Backend::MySql,
        "guard_ddl_is_install_mysql",
        2,
        ddl_is_install,
    )
    .await;
}

// ------------------------------------------------ the fence-column trigger

/// `guard trigger` attaches the guard to a table whose rows carry their
/// writer's token: a row with an older token than the guard's highest fails
/// its whole transaction, even when the client carries on after the error
/// and sends COMMIT; rows with the newest token (or an equal one) pass and
/// raise the highest. PostgreSQL and SQLite (MySQL has none: see
/// `trigger_script`).
async fn fence_column_trigger(t: Target) {
    t.install();
    let out = t.client(
        "CREATE TABLE ledger (id VARCHAR(16) PRIMARY KEY, amount BIGINT NOT NULL, fence BIGINT);
         CREATE TABLE other (id VARCHAR(16) PRIMARY KEY);",
    );
    assert_eq!(code(&out), 0, "create tables: {}", describe(&out));
    let resource = format!("{}'s", unique("guard"));
    let backend = if t.backend == Backend::Postgres {
        "postgres"
    } else {
        "sqlite"
    };
    for _ in 0..2 {
        let out = t.fencecron(&[
            "guard",
            "trigger",
            "--backend",
            backend,
            "--table",
            "ledger",
            "--column",
            "fence",
            "--resource",
            &resource,
        ]);
        assert_eq!(code(&out), 0, "guard trigger: {}", describe(&out));
        let out = t.client(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(code(&out), 0, "attach the trigger: {}", describe(&out));
    }
    let out = t.client(&format!(
        "{} INSERT INTO ledger VALUES ('a', 1, 5); COMMIT;",
        t.begin()
    ));
    assert_eq!(code(&out), 0, "token 5: {}", describe(&out));

    // A client that carries on after errors (no -bail / ON_ERROR_STOP).
    let mut client = t.client.clone();
    if let Some(i) = client.iter().position(|a| a == "ON_ERROR_STOP=1") {
        client.drain(i - 1..=i);
    }
    client.retain(|a| a != "-bail");
    let mut cmd = Command::new(&client[0]);
    cmd.args(&client[1..]).current_dir(&t.dir);
    let stale = format!(
        "{}\nINSERT INTO other VALUES ('o');\nINSERT INTO ledger VALUES ('b', 2, 4);\nINSERT INTO other VALUES ('p');\nCOMMIT;\n",
        t.begin()
    );
    let out = run(cmd, Some(stale.as_bytes()));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("fencecron_guard: stale token"),
        "the older row must be refused: {}",
        describe(&out)
    );
    let db = Db::connect(&t).await;
    // What came before the refusal is gone. What the client sent after it
    // is gone on PostgreSQL (the transaction stays aborted until it ends);
    // on SQLite the transaction has ended, so the next statement ran on its
    // own and committed: a job must stop at the error (docs/guard.md).
    let after = match t.backend {
        Backend::Postgres => Vec::<String>::new(),
        _ => vec!["p".to_string()],
    };
    assert_eq!(
        db.rows("SELECT id FROM other").await,
        after,
        "the refused transaction committed rows"
    );
    assert_eq!(
        db.rows("SELECT id, amount, fence FROM ledger ORDER BY id")
            .await,
        vec!["a|1|5"]
    );
    // The owner of token 5 updates again without touching the fence
    // column (equal token), then a newer owner writes.
    let out = t.client(&format!(
        "{} UPDATE ledger SET amount = 10 WHERE id = 'a'; INSERT INTO ledger VALUES ('c', 3, 6); COMMIT;",
        t.begin()
    ));
    assert_eq!(code(&out), 0, "tokens 5 and 6: {}", describe(&out));
    assert_eq!(
        db.rows("SELECT id, amount, fence FROM ledger ORDER BY id")
            .await,
        vec!["a|10|5", "c|3|6"]
    );
    assert_eq!(
        db.rows("SELECT resource, token FROM fencecron_guard").await,
        vec![format!("{resource}|6")]
    );
    // Now token 5 is stale for this table too.
    let out = t.client(&format!(
        "{} UPDATE ledger SET amount = 11 WHERE id = 'a'; COMMIT;",
        t.begin()
    ));
    assert_ne!(
        code(&out),
        0,
        "a row of token 5 after token 6: {}",
        describe(&out)
    );
    assert_eq!(
        db.rows("SELECT amount FROM ledger WHERE id = 'a'").await,
        vec!["10"]
    );
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_fence_column_trigger_sqlite() {
    with_targets(
        Backend::Sqlite,
        "guard_fence_column_trigger_sqlite",
        1,
        |t| fence_column_trigger(t.into_iter().next().unwrap()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_fence_column_trigger_postgres() {
    with_targets(
        Backend::Postgres,
        "guard_fence_column_trigger_postgres",
        1,
        |t| fence_column_trigger(t.into_iter().next().unwrap()),
    )
    .await;
}

#[test]
fn guard_trigger_is_refused_for_mysql_and_bad_names() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (args, why) in [
        (["mysql", "ledger", "fence"], "MySQL"),
        (["postgres", "ledger; DROP TABLE x", "fence"], "table name"),
        (["sqlite", "ledger", "fence\"--"], "column name"),
    ] {
        let mut cmd = fencecron(dir.path());
        cmd.args(["guard", "trigger", "--backend", args[0], "--table", args[1]])
            .args(["--column", args[2], "--resource", "r"]);
        let out = run(cmd, None);
        assert_eq!(code(&out), 2, "{args:?}: {}", describe(&out));
        assert!(out.stdout.is_empty(), "{args:?}: no DDL printed");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(why),
            "{}",
            describe(&out)
        );
    }
}

/// A password in `--db` or `--guard` never reaches the output: the URL is
/// printed redacted in every message, also when the database cannot be
/// reached (which is said at once, not after the pool's timeout).
#[test]
fn guard_urls_print_without_their_password() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = common::free_port();
    let store = format!("sqlite://{}", dir.path().join("fencecron.db").display());
    for (scheme, args) in [
        ("postgres", vec!["guard", "install", "--db"]),
        (
            "mysql",
            vec!["guard", "record", "--resource", "r", "--token", "3", "--db"],
        ),
        ("postgres", vec!["stale", "--store", &store, "--guard"]),
    ] {
        let url = format!("{scheme}://app:hunter2@127.0.0.1:{port}/app");
        let mut cmd = fencecron(dir.path());
        cmd.args(&args).arg(&url);
        let out = run(cmd, None);
        assert_eq!(code(&out), 1, "{args:?}: {}", describe(&out));
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!all.contains("hunter2"), "{args:?}: {all}");
        assert!(
            all.contains(&format!("app:***@127.0.0.1:{port}")),
            "{args:?}: {all}"
        );
    }
    // A SQLite file that does not exist is a usage error, and is not made.
    let missing = dir.path().join("missing.db");
    let mut cmd = fencecron(dir.path());
    cmd.args(["guard", "install", "--db"])
        .arg(format!("sqlite://{}", missing.display()));
    let out = run(cmd, None);
    assert_eq!(code(&out), 2, "{}", describe(&out));
    assert!(!missing.exists(), "the guard created a database");
}

//! `fencecron check --connect`, with the real binary against the real
//! servers: a closed port, a missing database, a wrong password and a store
//! that does not answer each exit 1 naming the cause; a good store exits 0
//! and says which migrations are applied, that the user has the privileges
//! the daemon needs, and the clock offset; a fresh database's migrations
//! "can be applied" and are not applied by the check; a user without the
//! privileges is named with what it lacks.
//!
//! The wrong password is provoked on MariaDB only: PostgreSQL here trusts
//! every loopback connection, so it accepts any password (its 28P01 is
//! classified by the unit tests of `src/store/diagnose.rs`, and
//! `check --connect` reports it through the same path as the MySQL case).

use crate::common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::harness::{describe, fencecron, run};
use common::proxy::Proxy;
use common::users::{DropRole, DropUser};
use common::{unique, Backend, TestStore};
use sqlx::Executor;

/// A bound on a hang only: the command's own limit is 5 s, which the
/// black-hole tests see in its message.
const HANG: Duration = Duration::from_secs(30);

/// Runs `fencecron --store URL check --connect` with a one-job config.
fn check_connect(url: &str) -> Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("jobs.toml");
    std::fs::write(
        &config,
        "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\n",
    )
    .expect("write jobs.toml");
    let mut cmd = fencecron(dir.path());
    cmd.args(["--store", url, "check", "--connect", "--config"])
        .arg(&config);
    run(cmd, None)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts exit 1 and returns stderr.
fn fails(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{}", describe(out));
    stderr(out)
}

/// Asserts exit 0 and the lines every good store prints; returns stdout.
fn passes(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(0), "{}", describe(out));
    let text = stdout(out);
    assert!(text.contains("store: answers: "), "{}", describe(out));
    assert!(
        text.contains("store: privileges: user ") && text.contains("has what the daemon needs"),
        "{}",
        describe(out)
    );
    assert!(text.contains("store: clock: "), "{}", describe(out));
    text
}

fn with_url(base: &str, edit: impl FnOnce(&mut url::Url)) -> String {
    let mut u = url::Url::parse(base).expect("test URL parses");
    edit(&mut u);
    u.to_string()
}

fn database_of(url: &str) -> String {
    url::Url::parse(url)
        .expect("test URL parses")
        .path()
        .trim_start_matches('/')
        .to_string()
}

async fn admin_execute(backend: Backend, url: &str, statements: &[String]) {
    match backend {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(url).await.expect("connect");
            for s in statements {
                pool.execute(s.as_str()).await.expect(s);
            }
            pool.close().await;
        }
        Backend::MySql => {
            let pool = sqlx::MySqlPool::connect(url).await.expect("connect");
            for s in statements {
                pool.execute(s.as_str()).await.expect(s);
            }
            pool.close().await;
        }
        Backend::Sqlite => unreachable!("no users on SQLite"),
    }
}

/// How many fencecron tables the database of `url` holds.
async fn fencecron_tables(backend: Backend, url: &str) -> i64 {
    match backend {
        Backend::Postgres => {
            let pool = sqlx::PgPool::connect(url).await.expect("connect");
            let n = sqlx::query_scalar(
                "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'fencecron%'",
            )
            .fetch_one(&pool)
            .await
            .expect("count");
            pool.close().await;
            n
        }
        Backend::MySql => {
            let pool = sqlx::MySqlPool::connect(url).await.expect("connect");
            let n = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.tables
                  WHERE table_schema = DATABASE() AND table_name LIKE 'fencecron%'",
            )
            .fetch_one(&pool)
            .await
            .expect("count");
            pool.close().await;
            n
        }
        Backend::Sqlite => unreachable!(),
    }
}

fn closed_port(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let port = common::free_port();
    let url = with_url(&ts.url, |u| {
        u.set_host(Some("127.0.0.1")).expect("host");
        u.set_port(Some(port)).expect("port");
    });
    let err = fails(&check_connect(&url));
    assert!(
        err.contains("connection refused") && err.contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[test]
fn postgres_check_connect_closed_port() {
    closed_port(Backend::Postgres, "postgres_check_connect_closed_port");
}

#[test]
fn mysql_check_connect_closed_port() {
    closed_port(Backend::MySql, "mysql_check_connect_closed_port");
}

fn missing_database(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let db = unique("fencecron_nodb").replace('-', "_");
    let url = with_url(&ts.url, |u| u.set_path(&format!("/{db}")));
    let err = fails(&check_connect(&url));
    assert!(
        err.contains(&format!("has no database `{db}`")) && err.contains("CREATE DATABASE"),
        "{err}"
    );
}

#[test]
fn postgres_check_connect_missing_database() {
    missing_database(Backend::Postgres, "postgres_check_connect_missing_database");
}

#[test]
fn mysql_check_connect_missing_database() {
    missing_database(Backend::MySql, "mysql_check_connect_missing_database");
}

#[test]
fn sqlite_check_connect_missing_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("not-there");
    let url = format!("sqlite://{}/fencecron.db", missing.display());
    let err = fails(&check_connect(&url));
    assert!(
        err.contains(&format!("the directory {}", missing.display()))
            && err.contains("does not exist")
            && err.contains("mkdir -p"),
        "{err}"
    );
    assert!(
        !missing.exists(),
        "check --connect created {}",
        missing.display()
    );
}

#[test]
fn mysql_check_connect_wrong_password() {
    let Some(ts) = TestStore::new(Backend::MySql, "mysql_check_connect_wrong_password") else {
        return;
    };
    let user = unique("fcck")[..16].replace('-', "_");
    let _guard = DropUser {
        admin_url: ts.url.clone(),
        user: user.clone(),
    };
    let database = database_of(&ts.url);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(admin_execute(
        Backend::MySql,
        &ts.url,
        &[
            format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'right-horse-9'"),
            format!("GRANT ALL ON `{database}`.* TO '{user}'@'%'"),
        ],
    ));
    let as_user = |password: &str| {
        with_url(&ts.url, |u| {
            u.set_username(&user).expect("user");
            u.set_password(Some(password)).expect("password");
        })
    };
    // The right password passes: the refusal below is the password's.
    passes(&check_connect(&as_user("right-horse-9")));
    let out = check_connect(&as_user("wrong-staple-7"));
    let err = fails(&out);
    assert!(
        err.contains(&format!("refused user `{user}` with the password given"))
            && err.contains("check the password"),
        "{err}"
    );
    let all = format!("{}{err}", stdout(&out));
    assert!(
        !all.contains("wrong-staple-7") && !all.contains("right-horse-9"),
        "{all}"
    );
}

/// A fresh database: its migrations "can be applied" and the check applies
/// none of them; once a command migrated it, all are applied. Either way
/// the privileges and the clock offset are reported.
async fn good_store(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    common::fresh::with_fresh_database(&ts, move |url| async move {
        let text = passes(&check_connect(&url));
        assert!(
            text.contains("applied yet (a fresh database); they can be applied by user"),
            "{text}"
        );
        assert!(
            text.contains("store: clock: the store's clock is ")
                && text.contains(" ms ")
                && text.contains("round trip"),
            "{text}"
        );
        assert_eq!(
            fencecron_tables(backend, &url).await,
            0,
            "check --connect changed the store"
        );

        let dir = tempfile::tempdir().expect("temp dir");
        let mut migrate = fencecron(dir.path());
        migrate.args(["--store", &url, "lease", "list"]);
        let out = run(migrate, None);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));

        let text = passes(&check_connect(&url));
        assert!(text.contains("store: migrations: all "), "{text}");
        assert!(!text.contains("SQLite"), "{text}");
    })
    .await;
}

#[tokio::test]
async fn postgres_check_connect_good_store() {
    good_store(Backend::Postgres, "postgres_check_connect_good_store").await;
}

#[tokio::test]
async fn mysql_check_connect_good_store() {
    good_store(Backend::MySql, "mysql_check_connect_good_store").await;
}

#[test]
fn sqlite_check_connect_good_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().join("state");
    std::fs::create_dir(&state).expect("mkdir");
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("chmod");
    let db = state.join("fencecron.db");
    let url = format!("sqlite://{}", db.display());

    let text = passes(&check_connect(&url));
    assert!(
        text.contains("not created yet") && text.contains("they can be applied by user"),
        "{text}"
    );
    assert!(!db.exists(), "check --connect created {}", db.display());
    let one_host = "SQLite fences only the daemons of one host";
    assert!(text.contains(one_host), "{text}");
    assert!(text.contains("offset is 0 by construction"), "{text}");

    let mut migrate = fencecron(dir.path());
    migrate.args(["--store", &url, "lease", "list"]);
    let out = run(migrate, None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let text = passes(&check_connect(&url));
    assert!(
        text.contains("store: migrations: all ") && text.contains(one_host),
        "{text}"
    );

    // A directory other users may write is refused, as the daemon would.
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    let err = fails(&check_connect(&url));
    assert!(err.contains("writable by other users"), "{err}");
}

/// Asserts that the user named `who` is reported lacking each of `lacks`.
fn lacks(out: &Output, who: &str, lacks: &[&str]) {
    let err = fails(out);
    assert!(err.contains(&format!("user {who}")), "{err}");
    for l in lacks {
        assert!(err.contains(l), "`{l}` not named: {err}");
    }
}

#[tokio::test]
async fn postgres_check_connect_names_missing_privileges() {
    let Some(ts) = TestStore::new(
        Backend::Postgres,
        "postgres_check_connect_names_missing_privileges",
    ) else {
        return;
    };
    let role = unique("fc_check").replace('-', "_");
    // Dropped after the fresh database, which holds the role's grants.
    let _guard = DropRole {
        admin_url: ts.url.clone(),
        role: role.clone(),
    };
    admin_execute(
        Backend::Postgres,
        &ts.url,
        &[format!("CREATE ROLE {role} LOGIN")],
    )
    .await;
    common::fresh::with_fresh_database(&ts, move |admin| async move {
        let as_role = with_url(&admin, |u| u.set_username(&role).expect("user"));
        // A fresh database: PostgreSQL 15 gives no one CREATE on public.
        let out = check_connect(&as_role);
        lacks(
            &out,
            &role,
            &["cannot apply the", "CREATE on schema public"],
        );

        let dir = tempfile::tempdir().expect("temp dir");
        let mut migrate = fencecron(dir.path());
        migrate.args(["--store", &admin, "lease", "list"]);
        assert_eq!(run(migrate, None).status.code(), Some(0));
        admin_execute(
            Backend::Postgres,
            &admin,
            &[format!("GRANT SELECT ON fencecron_leases TO {role}")],
        )
        .await;
        let out = check_connect(&as_role);
        lacks(
            &out,
            &role,
            &[
                "INSERT/UPDATE/DELETE on fencecron_leases",
                "CREATE on schema public",
            ],
        );
        assert!(
            stdout(&out).contains("store: clock: "),
            "{}",
            describe(&out)
        );

        // With what docs/stores.md's grants give, it passes.
        admin_execute(
            Backend::Postgres,
            &admin,
            &[
                format!("GRANT CREATE ON SCHEMA public TO {role}"),
                format!(
                    "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}"
                ),
                format!("GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {role}"),
            ],
        )
        .await;
        let text = passes(&check_connect(&as_role));
        assert!(text.contains("store: migrations: all "), "{text}");
    })
    .await;
}

#[tokio::test]
async fn mysql_check_connect_names_missing_privileges() {
    let Some(ts) = TestStore::new(
        Backend::MySql,
        "mysql_check_connect_names_missing_privileges",
    ) else {
        return;
    };
    let user = unique("fcpr")[..16].replace('-', "_");
    let _guard = DropUser {
        admin_url: ts.url.clone(),
        user: user.clone(),
    };
    common::fresh::with_fresh_database(&ts, move |admin| async move {
        let database = database_of(&admin);
        admin_execute(
            Backend::MySql,
            &admin,
            &[
                format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'few-grants-3'"),
                format!("GRANT SELECT ON `{database}`.* TO '{user}'@'%'"),
            ],
        )
        .await;
        let as_user = with_url(&admin, |u| {
            u.set_username(&user).expect("user");
            u.set_password(Some("few-grants-3")).expect("password");
        });
        let out = check_connect(&as_user);
        lacks(
            &out,
            &user,
            &["cannot apply the", "CREATE ROUTINE on database"],
        );

        let dir = tempfile::tempdir().expect("temp dir");
        let mut migrate = fencecron(dir.path());
        migrate.args(["--store", &admin, "lease", "list"]);
        assert_eq!(run(migrate, None).status.code(), Some(0));
        let out = check_connect(&as_user);
        lacks(
            &out,
            &user,
            &[
                "INSERT/UPDATE/DELETE on fencecron_leases",
                "EXECUTE on procedure fencecron_claim_v1",
            ],
        );

        admin_execute(
            Backend::MySql,
            &admin,
            &[format!(
                "GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE, CREATE, ALTER, INDEX, CREATE ROUTINE, ALTER ROUTINE ON `{database}`.* TO '{user}'@'%'"
            )],
        )
        .await;
        let text = passes(&check_connect(&as_user));
        assert!(text.contains("store: migrations: all "), "{text}");
        assert!(!stdout(&out).contains("few-grants-3"));
    })
    .await;
}

/// A store behind a black-holed link (connections accepted, nothing ever
/// answered) exits 1 naming its 5 s limit, not a hang.
fn black_holed(backend: Backend, test: &str, default_port: u16) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let (proxy, url) = Proxy::for_url(&ts.url, default_port);
    // The proxy's URL works before the link goes silent.
    passes(&check_connect(&url));
    proxy.blackhole();
    let start = Instant::now();
    let err = fails(&check_connect(&url));
    let took = start.elapsed();
    assert!(err.contains("did not answer within 5s"), "{err}");
    assert!(took < HANG, "took {took:?}: {err}");
}

#[test]
fn postgres_check_connect_black_holed() {
    black_holed(
        Backend::Postgres,
        "postgres_check_connect_black_holed",
        5432,
    );
}

#[test]
fn mysql_check_connect_black_holed() {
    black_holed(Backend::MySql, "mysql_check_connect_black_holed", 3306);
}

/// Without `--connect`, `check` does not touch the store: a closed port is
/// no error (the daemon may start before its database).
#[test]
fn check_without_connect_does_not_connect() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("jobs.toml");
    std::fs::write(
        &config,
        "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\n",
    )
    .expect("write");
    let url = format!("postgres://u@127.0.0.1:{}/db", common::free_port());
    let mut cmd = fencecron(dir.path());
    cmd.args(["--store", &url, "check", "--config"])
        .arg(&config);
    let out = run(cmd, None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(
        !stdout(&out).contains("store: answers"),
        "{}",
        describe(&out)
    );
}

/// A store a newer fencecron migrated (a migration this binary does not
/// know) is refused as the daemon's start would refuse it, and the check
/// changes nothing.
#[tokio::test]
async fn sqlite_check_connect_refuses_a_newer_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let db = dir.path().join("fencecron.db");
    let url = format!("sqlite://{}", db.display());
    let mut migrate = fencecron(dir.path());
    migrate.args(["--store", &url, "lease", "list"]);
    assert_eq!(run(migrate, None).status.code(), Some(0));
    let pool = sqlx::SqlitePool::connect(&url).await.expect("connect");
    pool.execute(
        "INSERT INTO fencecron_migrations (version, description, success, checksum, execution_time)
         VALUES (9999, 'from the future', TRUE, x'00', 0)",
    )
    .await
    .expect("insert");
    let err = fails(&check_connect(&url));
    assert!(
        err.contains("migrated by a newer fencecron") && err.contains("migration 9999"),
        "{err}"
    );
    let rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM fencecron_migrations WHERE version = 9999")
            .fetch_one(&pool)
            .await
            .expect("count");
    assert_eq!(rows, 1);
    pool.close().await;
}

/// An in-memory SQLite database is each process's own: it fences nothing.
#[test]
fn sqlite_check_connect_refuses_an_in_memory_store() {
    let err = fails(&check_connect("sqlite::memory:"));
    assert!(
        err.contains("in-memory database") && err.contains("fences nothing"),
        "{err}"
    );
}

//! Store errors at the process boundary, with the real binary against the
//! real servers: a missing database, a missing role or user, a wrong
//! password, a closed port and a SQLite file in a missing directory each
//! fail quickly, with their own message and advice, and never with the
//! password.
//!
//! PostgreSQL here trusts every local connection, so a wrong password
//! cannot be provoked on it; the classification of its 28P01 is covered by
//! the unit tests in `src/store/diagnose.rs` only.

use crate::common;

use std::process::Output;
use std::time::{Duration, Instant};

use common::harness::{describe, fencecron};
use common::users::{DropRole, DropUser};
use common::{unique, Backend, TestStore};
use sqlx::Executor;

/// A command that fails on a store must fail within this (the pool's own
/// acquire timeout is 10 s).
const QUICK: Duration = Duration::from_secs(3);

/// `lease list` against `url`: its output and how long it took.
fn lease_list(url: &str) -> (Output, Duration) {
    let dir = tempfile::tempdir().expect("temp dir");
    let start = Instant::now();
    let out = fencecron(dir.path())
        .args(["--store", url, "lease", "list"])
        .output()
        .expect("run fencecron");
    (out, start.elapsed())
}

/// Runs `lease list` against `url`, expects it to fail quickly with exit 1,
/// and returns its stderr.
fn fails_quickly(url: &str) -> String {
    let (out, took) = lease_list(url);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(took < QUICK, "took {took:?}: {}", describe(&out));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts that a message is not one of the generic ones it replaces.
fn not_generic(msg: &str) {
    for generic in [
        "create tables",
        "unreachable or failing",
        "came free in time",
        "connection limit",
    ] {
        assert!(!msg.contains(generic), "generic advice `{generic}`: {msg}");
    }
}

fn with_url(base: &str, edit: impl FnOnce(&mut url::Url)) -> String {
    let mut u = url::Url::parse(base).expect("test URL parses");
    edit(&mut u);
    u.to_string()
}

/// A loopback port nothing listens on: one the kernel just handed out and
/// that was closed again.
fn closed_port(host: &str) -> u16 {
    let listener = std::net::TcpListener::bind((host, 0)).expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

fn missing_database(backend: Backend, test: &str, name: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let db = unique("fencecron_nodb").replace('-', "_");
    let url = with_url(&ts.url, |u| u.set_path(&format!("/{db}")));
    let err = fails_quickly(&url);
    assert!(
        err.contains(&format!("the {name} server at"))
            && err.contains(&format!("has no database `{db}`"))
            && err.contains("CREATE DATABASE"),
        "{err}"
    );
    not_generic(&err);
}

#[test]
fn postgres_missing_database() {
    missing_database(Backend::Postgres, "postgres_missing_database", "PostgreSQL");
}

#[test]
fn mysql_missing_database() {
    missing_database(Backend::MySql, "mysql_missing_database", "MySQL");
}

#[test]
fn postgres_missing_role() {
    let Some(ts) = TestStore::new(Backend::Postgres, "postgres_missing_role") else {
        return;
    };
    let role = unique("fencecron_norole").replace('-', "_");
    let url = with_url(&ts.url, |u| u.set_username(&role).expect("user"));
    let err = fails_quickly(&url);
    assert!(
        err.contains(&format!("has no role `{role}`")) && err.contains("CREATE ROLE"),
        "{err}"
    );
    not_generic(&err);
}

#[test]
fn mysql_missing_user() {
    let Some(ts) = TestStore::new(Backend::MySql, "mysql_missing_user") else {
        return;
    };
    let user = unique("fcnouser")[..16].replace('-', "_");
    let url = with_url(&ts.url, |u| u.set_username(&user).expect("user"));
    let err = fails_quickly(&url);
    assert!(
        err.contains(&format!("refused user `{user}` without a password"))
            && err.contains("CREATE USER"),
        "{err}"
    );
    not_generic(&err);
}

#[test]
fn mysql_wrong_password() {
    let Some(ts) = TestStore::new(Backend::MySql, "mysql_wrong_password") else {
        return;
    };
    let user = unique("fcpw")[..16].replace('-', "_");
    let database = url::Url::parse(&ts.url)
        .expect("test URL parses")
        .path()
        .trim_start_matches('/')
        .to_string();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let _guard = DropUser {
        admin_url: ts.url.clone(),
        user: user.clone(),
    };
    rt.block_on(async {
        let admin = sqlx::MySqlPool::connect(&ts.url).await.expect("connect");
        admin
            .execute(format!("CREATE USER '{user}'@'%' IDENTIFIED BY 'right-horse-9'").as_str())
            .await
            .expect("create user");
        admin
            .execute(format!("GRANT ALL ON `{database}`.* TO '{user}'@'%'").as_str())
            .await
            .expect("grant");
        admin.close().await;
    });
    let as_user = |password: &str| {
        with_url(&ts.url, |u| {
            u.set_username(&user).expect("user");
            u.set_password(Some(password)).expect("password");
        })
    };
    // The right password works: the refusal below is the password's.
    let (out, _) = lease_list(&as_user("right-horse-9"));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));

    let err = fails_quickly(&as_user("wrong-staple-7"));
    assert!(
        err.contains(&format!("refused user `{user}` with the password given"))
            && err.contains("check the password"),
        "{err}"
    );
    assert!(
        !err.contains("wrong-staple-7") && !err.contains("right-horse-9"),
        "{err}"
    );
    not_generic(&err);
}

/// A closed port on the test server's own host fails within a couple of
/// seconds, naming the refused connection and the address, instead of
/// waiting out the pool's acquire timeout and suggesting a connection
/// limit.
fn closed_port_is_refused(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let host = url::Url::parse(&ts.url)
        .expect("test URL parses")
        .host_str()
        .expect("host")
        .to_string();
    let port = closed_port(&host);
    let url = with_url(&ts.url, |u| u.set_port(Some(port)).expect("port"));
    let err = fails_quickly(&url);
    assert!(
        err.contains("connection refused") && err.contains(&format!("{host}:{port}")),
        "{err}"
    );
    not_generic(&err);
}

#[test]
fn postgres_closed_port_is_refused_quickly() {
    closed_port_is_refused(Backend::Postgres, "postgres_closed_port_is_refused_quickly");
}

#[test]
fn mysql_closed_port_is_refused_quickly() {
    closed_port_is_refused(Backend::MySql, "mysql_closed_port_is_refused_quickly");
}

#[test]
fn sqlite_missing_directory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("not-there").join("state");
    let url = format!("sqlite://{}/fencecron.db", missing.display());
    let err = fails_quickly(&url);
    assert!(
        err.contains(&format!(
            "the directory {} of the SQLite database",
            missing.display()
        )) && err.contains("does not exist")
            && err.contains("mkdir -p"),
        "{err}"
    );
    not_generic(&err);
    assert!(!missing.exists(), "fencecron created {}", missing.display());
}

/// A row this version cannot decode (here a column whose type was changed
/// by hand) is named as such, not as an unreachable store. Not on SQLite:
/// its values carry their own types and sqlx reads them leniently (a
/// number as text, text as 0), so a changed column there does not fail to
/// decode.
async fn undecodable_row_is_not_unreachable(backend: Backend, test: &str, alter: &'static str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    common::fresh::with_fresh_database(&ts, move |url| async move {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = fencecron(dir.path())
            .args(["--store", &url, "lease", "acquire", "decode-me"])
            .output()
            .expect("run fencecron");
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        match backend {
            Backend::Sqlite => {
                let opts = url
                    .parse::<sqlx::sqlite::SqliteConnectOptions>()
                    .expect("sqlite URL");
                let pool = sqlx::SqlitePool::connect_with(opts).await.expect("connect");
                pool.execute(alter).await.expect(alter);
                pool.close().await;
            }
            Backend::Postgres => {
                let pool = sqlx::PgPool::connect(&url).await.expect("connect");
                pool.execute(alter).await.expect(alter);
                pool.close().await;
            }
            Backend::MySql => {
                let pool = sqlx::MySqlPool::connect(&url).await.expect("connect");
                pool.execute(alter).await.expect(alter);
                pool.close().await;
            }
        }
        let err = fails_quickly(&url);
        assert!(
            err.contains("returned a row this fencecron cannot read")
                && err.contains("same version"),
            "{err}"
        );
        not_generic(&err);
    })
    .await;
}

#[tokio::test]
async fn postgres_undecodable_row_is_not_unreachable() {
    undecodable_row_is_not_unreachable(
        Backend::Postgres,
        "postgres_undecodable_row_is_not_unreachable",
        "ALTER TABLE fencecron_leases ALTER COLUMN node TYPE integer USING 42",
    )
    .await;
}

#[tokio::test]
async fn mysql_undecodable_row_is_not_unreachable() {
    undecodable_row_is_not_unreachable(
        Backend::MySql,
        "mysql_undecodable_row_is_not_unreachable",
        "ALTER TABLE fencecron_leases MODIFY fence VARCHAR(20) NOT NULL",
    )
    .await;
}

/// A PostgreSQL role over its connection limit (53300, which sqlx's pool
/// retries until its acquire timeout, as a server may free a slot) is
/// named as the connection limit once the pool gives up, not as a pool
/// timeout that might be anything.
#[test]
fn postgres_connection_limit_is_named_after_the_pool_gives_up() {
    let Some(ts) = TestStore::new(
        Backend::Postgres,
        "postgres_connection_limit_is_named_after_the_pool_gives_up",
    ) else {
        return;
    };
    let role = unique("fc_limited").replace('-', "_");
    let _guard = DropRole {
        admin_url: ts.url.clone(),
        role: role.clone(),
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let admin = sqlx::PgPool::connect(&ts.url).await.expect("connect");
        admin
            .execute(format!("CREATE ROLE {role} LOGIN CONNECTION LIMIT 0").as_str())
            .await
            .expect("create role");
        admin.close().await;
    });
    let url = with_url(&ts.url, |u| u.set_username(&role).expect("user"));
    let (out, took) = lease_list(&url);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("reached its connection limit") && err.contains("max_connections"),
        "{err}"
    );
    assert!(!err.contains("came free in time"), "{err}");
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

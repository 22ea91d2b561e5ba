//! A database of its own for a test that changes store-wide state (the
//! epoch of fencing tokens) and so must not share the suite's database with
//! tests that run in parallel and expect tokens 1, 2, 3.
//!
//! [`with_fresh_database`] creates a uniquely named database on the test
//! server (PostgreSQL, MySQL; for SQLite the test's own file already is
//! one), runs the test body on a spawned task, drops the database whether
//! the body passed or panicked, and then re-raises the panic.

use std::future::Future;

use sqlx::Executor;

use super::{unique, Backend, TestStore};

/// The URL of `base` with its database name replaced.
pub fn with_database(base: &str, db: &str) -> String {
    let mut u = url::Url::parse(base).expect("test URL parses");
    u.set_path(&format!("/{db}"));
    u.to_string()
}

/// Runs `body` with the URL of a fresh, empty database on `ts`'s server.
pub async fn with_fresh_database<F, Fut>(ts: &TestStore, body: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let db = unique("fencecron_fresh").replace('-', "_");
    let result = match ts.backend {
        Backend::Sqlite => tokio::spawn(body(ts.url.clone())).await,
        Backend::Postgres => {
            let admin = sqlx::PgPool::connect(&ts.url).await.expect("connect");
            admin
                .execute(format!("CREATE DATABASE {db}").as_str())
                .await
                .expect("create database");
            let result = tokio::spawn(body(with_database(&ts.url, &db))).await;
            admin
                .execute(format!("DROP DATABASE {db} WITH (FORCE)").as_str())
                .await
                .expect("drop database");
            admin.close().await;
            result
        }
        Backend::MySql => {
            let admin = sqlx::MySqlPool::connect(&ts.url).await.expect("connect");
            admin
                .execute(format!("CREATE DATABASE {db}").as_str())
                .await
                .expect("create database");
            let result = tokio::spawn(body(with_database(&ts.url, &db))).await;
            admin
                .execute(format!("DROP DATABASE {db}").as_str())
                .await
                .expect("drop database");
            admin.close().await;
            result
        }
    };
    if let Err(e) = result {
        std::panic::resume_unwind(e.into_panic());
    }
}

//! Shared test support: which stores to test against, the real binary, and
//! unique names so tests can share one database and run in parallel.
//!
//! PostgreSQL and MySQL tests run whenever `FENCECRON_TEST_POSTGRES_URL` /
//! `FENCECRON_TEST_MYSQL_URL` are set (`.ci/run` sets them). When one is not
//! set the test says so loudly on stderr and skips; under `CI=true` a
//! missing URL is a failure instead.

use std::path::PathBuf;

/// A backend under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    MySql,
}

impl Backend {
    fn env_var(self) -> Option<&'static str> {
        match self {
            Backend::Sqlite => None,
            Backend::Postgres => Some("FENCECRON_TEST_POSTGRES_URL"),
            Backend::MySql => Some("FENCECRON_TEST_MYSQL_URL"),
        }
    }
}

/// A store to run one test against. For SQLite the database file lives in a
/// temporary directory owned by this value.
pub struct TestStore {
    pub backend: Backend,
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestStore {
    /// A store at a given URL (e.g. a database of a test's own, see
    /// [`fresh`]); nothing is removed when it is dropped.
    pub fn at(backend: Backend, url: String) -> TestStore {
        TestStore {
            backend,
            url,
            _dir: None,
        }
    }

    /// The store for `backend`, or `None` (after a loud message) when its
    /// server is not configured. Panics under `CI=true` instead of skipping.
    pub fn new(backend: Backend, test: &str) -> Option<TestStore> {
        match backend.env_var() {
            None => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("fencecron.db").display());
                Some(TestStore {
                    backend,
                    url,
                    _dir: Some(dir),
                })
            }
            Some(var) => match std::env::var(var) {
                Ok(url) if !url.is_empty() => Some(TestStore {
                    backend,
                    url,
                    _dir: None,
                }),
                _ => {
                    if std::env::var("CI").as_deref() == Ok("true") {
                        panic!("{test}: {var} is not set under CI=true; .ci/run must export it");
                    }
                    skipped!(
                        "\n*** SKIPPED {test} on {backend:?}: {var} is not set. \
                         Export it (see TESTING.md) to run this test. ***\n"
                    );
                    None
                }
            },
        }
    }
}

/// The `fencecron` binary built for this test run.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_fencecron"))
}

/// A loopback port nothing listens on right now (the kernel just handed it
/// out, and it was closed again).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

pub mod harness;

pub mod daemon;
pub mod fresh;
pub mod patroni;
pub mod pg;
pub mod proxy;
pub mod users;

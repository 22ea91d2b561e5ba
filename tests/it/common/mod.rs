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

/// A loopback port nothing listens on right now, handed out once per test
/// run, below the kernel's ephemeral range (32768-60999 by default). A port
/// the kernel picks for `bind(…:0)` is an ephemeral one: between the test
/// closing it and a daemon binding it, an outgoing connection (to
/// PostgreSQL, MariaDB, a proxy) could take it, and the daemon then failed
/// with "Address already in use" (seen in `daemon::metrics_across_…`).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    // A random start, so that two runs side by side rarely meet.
    static NEXT: std::sync::OnceLock<AtomicU32> = std::sync::OnceLock::new();
    let next = NEXT
        .get_or_init(|| AtomicU32::new((uuid::Uuid::new_v4().as_u128() % u128::from(SPAN)) as u32));
    for _ in 0..SPAN {
        let port = (FIRST + next.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port between {FIRST} and {}", FIRST + SPAN)
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

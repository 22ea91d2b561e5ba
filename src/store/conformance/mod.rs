//! The store conformance suite: what every [`Store`] must do, written once
//! and run against every implementation — the in-memory `MemoryStore` of
//! the crate's own tests, SQLite, PostgreSQL and MySQL/MariaDB.
//!
//! Each case is an `async fn case_…(subject: Subject)` in the file of its
//! concern ([`acquire`], [`occurrence`], [`renew`] (renew, release, takeovers),
//! [`give_back`], [`claim`], [`put`], [`stale`], [`admit`], [`epoch`],
//! [`runs`], [`fleet`] (pauses, triggers), [`nodes`], [`retention`]), using
//! the helpers of [`kit`]; the `conformance!` line at the end of each file
//! makes one test per case and backend, named
//! `store::conformance::<concern>::<backend>::<case>` (`memory`, `sqlite`,
//! `postgres`, `mysql`), so `cargo test --lib -- conformance::` runs the
//! suite and `cargo test --lib -- ::memory::case_` one backend of it.
//!
//! * `MemoryStore` runs on tokio's paused clock (its store clock follows
//!   it), so an expiry is a jump, not a wait; it claims in batches.
//! * SQLite runs on a database file of the test's own.
//! * PostgreSQL and MySQL run against `FENCECRON_TEST_POSTGRES_URL` and
//!   `FENCECRON_TEST_MYSQL_URL` (TESTING.md): cases share one database per
//!   server and run in parallel, so every resource name is unique to its
//!   case. Without the URL a case passes and says `*** SKIPPED … ***` on
//!   the terminal; under `CI=true` it fails instead.
//! * Cases that change store-wide state (listed after `isolated:`: the epoch,
//!   pruning every job, counting live nodes) run on a database of their own
//!   (created and dropped around the case on PostgreSQL and MySQL).
//!
//! Tests that need the real binary or a second process stay in `tests/it/`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Executor;

use crate::clock::Clock;
use crate::store::{open, open_bench, prelude::*, OpenOptions, StoreUrl};
use crate::testing::epoch_wall;
use crate::testing::store::MemoryStore;

/// One test per case and implementation:
/// `conformance!([cases…])`, or `conformance!([cases…], isolated: [cases…])`
/// where the isolated ones run on a database of their own. Each becomes
/// `<concern>::{memory,sqlite,postgres,mysql}::<case>`.
macro_rules! conformance {
    ([$($case:ident),* $(,)?]) => {
        conformance!([$($case),*], isolated: []);
    };
    ([$($case:ident),* $(,)?], isolated: [$($iso:ident),* $(,)?]) => {
        mod memory {
            // Every MemoryStore is new: each case is on a store of its own.
            $( memory_test!($case); )*
            $( memory_test!($iso); )*
        }
        backend_tests!(sqlite, Sqlite, [$($case),*], [$($iso),*]);
        backend_tests!(postgres, Postgres, [$($case),*], [$($iso),*]);
        backend_tests!(mysql, MySql, [$($case),*], [$($iso),*]);
    };
}

macro_rules! backend_tests {
    ($module:ident, $kind:ident, [$($case:ident),*], [$($iso:ident),*]) => {
        mod $module {
            $( backend_test!($kind, run_case, $case); )*
            $( backend_test!($kind, run_isolated_case, $iso); )*
        }
    };
}

macro_rules! backend_test {
    ($kind:ident, $run:ident, $case:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            $crate::store::conformance::$run(
                $crate::store::conformance::Kind::$kind,
                concat!(module_path!(), "::", stringify!($case)),
                super::$case,
            )
            .await;
        }
    };
}

macro_rules! memory_test {
    ($case:ident) => {
        #[tokio::test(start_paused = true)]
        async fn $case() {
            $crate::store::conformance::run_memory_case(
                concat!(module_path!(), "::", stringify!($case)),
                super::$case,
            )
            .await;
        }
    };
}

mod kit;

mod acquire;
mod admit;
mod claim;
mod epoch;
mod fleet;
mod give_back;
mod nodes;
mod occurrence;
mod put;
mod renew;
mod retention;
mod runs;
mod stale;

/// How long one case may take (on the paused clock for `MemoryStore`).
const CASE_LIMIT: Duration = Duration::from_secs(90);

/// A store implementation under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Memory,
    Sqlite,
    Postgres,
    MySql,
}

impl Kind {
    /// The variable naming the test server, for a server backend.
    fn env_var(self) -> Option<&'static str> {
        match self {
            Kind::Memory | Kind::Sqlite => None,
            Kind::Postgres => Some("FENCECRON_TEST_POSTGRES_URL"),
            Kind::MySql => Some("FENCECRON_TEST_MYSQL_URL"),
        }
    }

    /// Whether the store keeps the live nodes a claim's share counts
    /// (SQLite serves one host: no share).
    pub(crate) fn keeps_nodes(self) -> bool {
        self != Kind::Sqlite
    }

    /// Whether another transaction can hold a row lock that a claim skips
    /// (SQLite locks the whole database for a writer, `MemoryStore` runs
    /// each call whole: nothing to skip).
    pub(crate) fn locks_rows(self) -> bool {
        matches!(self, Kind::Postgres | Kind::MySql)
    }
}

/// What a case runs against: the store, which implementation it is, and
/// what only the harness can reach.
#[derive(Clone)]
pub(crate) struct Subject {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) kind: Kind,
    memory: Option<MemoryStore>,
}

impl Subject {
    /// The benchmark's purge of every row whose resource starts with
    /// `prefix` (not part of [`Store`]: a SQL store reaches it through its
    /// own [`open_bench`]); the number of rows deleted.
    pub(crate) async fn purge_prefix(&self, prefix: &str) -> u64 {
        match &self.memory {
            Some(memory) => memory.purge_prefix(prefix),
            None => open_bench(self.store.url(), &OpenOptions::default())
                .expect("store opens")
                .purge_prefix(prefix)
                .await
                .expect("purge reaches the store"),
        }
    }
}

/// Runs one case against a fresh `MemoryStore` (claiming in batches, as
/// every SQL backend does), under the case's time limit.
pub(crate) async fn run_memory_case<F, Fut>(test: &str, case: F)
where
    F: FnOnce(Subject) -> Fut,
    Fut: Future<Output = ()>,
{
    let test = test_name(test);
    let memory = MemoryStore::new(Clock::following_tokio(epoch_wall()));
    memory.migrate().await.expect("migrations apply");
    let subject = Subject {
        store: Arc::new(memory.clone()),
        kind: Kind::Memory,
        memory: Some(memory),
    };
    tokio::time::timeout(CASE_LIMIT, case(subject))
        .await
        .unwrap_or_else(|_| panic!("{test} on Memory did not finish within 90 s"));
}

/// Opens the backend's store, migrates it, and runs one case under its time
/// limit. Skips (loudly, or fails under `CI=true`) when the server is not
/// configured.
pub(crate) async fn run_case<F, Fut>(kind: Kind, test: &str, case: F)
where
    F: FnOnce(Subject) -> Fut,
    Fut: Future<Output = ()>,
{
    let test = test_name(test);
    let Some(db) = TestDb::new(kind, test) else {
        return;
    };
    let store = open_store(&db.url, 20).await;
    tokio::time::timeout(CASE_LIMIT, case(subject(kind, store)))
        .await
        .unwrap_or_else(|_| panic!("{test} on {kind:?} did not finish within 90 s"));
    drop(db);
}

/// Like [`run_case`], on a database of the case's own.
pub(crate) async fn run_isolated_case<F, Fut>(kind: Kind, test: &str, case: F)
where
    F: FnOnce(Subject) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let test = test_name(test);
    let Some(db) = TestDb::new(kind, test) else {
        return;
    };
    let test = test.to_string();
    with_fresh_database(kind, &db.url, move |url| async move {
        let store = open_store(&url, 20).await;
        tokio::time::timeout(CASE_LIMIT, case(subject(kind, store)))
            .await
            .unwrap_or_else(|_| panic!("{test} on {kind:?} did not finish within 90 s"));
    })
    .await;
}

/// A test's name as libtest prints it (its module path without the crate).
fn test_name(path: &str) -> &str {
    path.strip_prefix(concat!(env!("CARGO_CRATE_NAME"), "::"))
        .unwrap_or(path)
}

fn subject(kind: Kind, store: Arc<dyn Store>) -> Subject {
    Subject {
        store,
        kind,
        memory: None,
    }
}

/// The store at `url`, opened as the daemon opens it and migrated.
pub(crate) async fn open_store(url: &str, max_connections: u32) -> Arc<dyn Store> {
    let url = StoreUrl::parse(url).expect("test store URL parses");
    let store = open(
        &url,
        &OpenOptions {
            max_connections,
            call_timeout: Duration::from_secs(20),
            ..OpenOptions::default()
        },
    )
    .expect("store opens");
    store.migrate().await.expect("migrations apply");
    store
}

/// The database a test of a SQL backend runs against. For SQLite the
/// database file lives in a temporary directory owned by this value.
pub(crate) struct TestDb {
    pub(crate) url: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    /// The database for `kind`, or `None` (after a loud message) when its
    /// server is not configured. Panics under `CI=true` instead of skipping.
    pub(crate) fn new(kind: Kind, test: &str) -> Option<TestDb> {
        let Some(var) = kind.env_var() else {
            let dir = tempfile::tempdir().expect("temp dir");
            let url = format!("sqlite://{}", dir.path().join("fencecron.db").display());
            return Some(TestDb {
                url,
                _dir: Some(dir),
            });
        };
        match std::env::var(var) {
            Ok(url) if !url.is_empty() => Some(TestDb { url, _dir: None }),
            _ => {
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("{test}: {var} is not set under CI=true; .ci/run must export it");
                }
                skipped(&format!(
                    "\n*** SKIPPED {test} on {kind:?}: {var} is not set. \
                     Export it (see TESTING.md) to run this test. ***\n"
                ));
                None
            }
        }
    }
}

/// Says that a test did not run, and why, where a newcomer sees it: straight
/// to the process's stderr, which libtest does not capture (its capture
/// only takes `eprintln!`), as `tests/it`'s `skipped!` does.
fn skipped(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Runs `body` with the URL of a fresh, empty database on the server of
/// `base` (PostgreSQL, MySQL; for SQLite the test's own file already is
/// one), on a spawned task; drops the database whether the body passed or
/// panicked, then re-raises the panic.
async fn with_fresh_database<F, Fut>(kind: Kind, base: &str, body: F)
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let db = kit::unique("fencecron_fresh").replace('-', "_");
    let fresh = {
        let mut u = url::Url::parse(base).expect("test URL parses");
        u.set_path(&format!("/{db}"));
        u.to_string()
    };
    let result = match kind {
        Kind::Memory | Kind::Sqlite => tokio::spawn(body(base.to_string())).await,
        Kind::Postgres => {
            let admin = sqlx::PgPool::connect(base).await.expect("connect");
            admin
                .execute(format!("CREATE DATABASE {db}").as_str())
                .await
                .expect("create database");
            let result = tokio::spawn(body(fresh)).await;
            admin
                .execute(format!("DROP DATABASE {db} WITH (FORCE)").as_str())
                .await
                .expect("drop database");
            admin.close().await;
            result
        }
        Kind::MySql => {
            let admin = sqlx::MySqlPool::connect(base).await.expect("connect");
            admin
                .execute(format!("CREATE DATABASE {db}").as_str())
                .await
                .expect("create database");
            let result = tokio::spawn(body(fresh)).await;
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

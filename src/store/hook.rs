//! What a store handle tells whoever opened it, since the store logs
//! nothing and counts nothing itself: how each operation went (for the
//! metrics and `/readyz`) and what it noticed on the way that is no
//! operation's answer (for the log). The opener sets a [`StoreHook`] in
//! [`OpenOptions::hook`](super::OpenOptions::hook); the SQL store calls it
//! from the one place every operation passes (`SqlStore::observe`).

use std::sync::Arc;
use std::time::Duration;

use super::StoreError;

/// Told about every store operation and every [`Notice`].
pub trait StoreHook: Send + Sync + 'static {
    /// A [`Store`](super::Store) operation, named as its method, ended
    /// after `took` (all its statements and retries, connection waits
    /// included).
    fn called(&self, operation: &'static str, took: Duration, end: CallEnd);

    /// The store noticed something its caller should log.
    fn noticed(&self, notice: Notice<'_>);
}

/// How a store operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallEnd {
    /// The store answered (whatever the answer: a lost acquire is an
    /// answer).
    Answered,
    /// It failed (unreachable, refused, full disk, …).
    Failed,
    /// It hit its time limit.
    TimedOut,
}

impl CallEnd {
    pub(crate) fn of<T>(result: &Result<T, StoreError>) -> CallEnd {
        match result {
            Ok(_) => CallEnd::Answered,
            Err(StoreError::Timeout { .. }) => CallEnd::TimedOut,
            Err(_) => CallEnd::Failed,
        }
    }

    /// Whether the store answered.
    pub(crate) fn answered(self) -> bool {
        self == CallEnd::Answered
    }
}

/// Something the store noticed that is no operation's answer: the caller
/// logs it (`events::store_noticed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice<'a> {
    /// The trigger `guard` on `_sqlx_migrations`, which keeps older
    /// fencecron binaries from applying their migrations again, could not
    /// be created (migrations went on without it).
    MigrationGuardFailed { guard: &'a str, error: &'a str },
    /// A SQLite connection came back to the pool still inside a
    /// transaction (after an error in a write transaction) and was closed
    /// instead of being reused.
    ConnectionDiscarded {
        sqlite_autocommit: bool,
        sqlx_in_transaction: bool,
    },
}

/// A store handle's hook, if its opener set one.
pub(crate) type Hook = Option<Arc<dyn StoreHook>>;

/// Tells `hook`, if any, what the store noticed.
pub(crate) fn notice(hook: &Hook, notice: Notice<'_>) {
    if let Some(hook) = hook {
        hook.noticed(notice);
    }
}

/// Runs one store operation, telling `hook`, if any, how it went.
pub(crate) async fn observe<T>(
    hook: &Hook,
    operation: &'static str,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let Some(hook) = hook else {
        return call.await;
    };
    let started = std::time::Instant::now();
    let result = call.await;
    hook.called(operation, started.elapsed(), CallEnd::of(&result));
    result
}

//! What a store call can fail with, and how a driver error becomes one.

use std::time::Duration;

use super::{Backend, StoreUrl};

/// Errors a store call can end with. None of them means "stale" or "held":
/// those are outcomes, not errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or the call failed in transit. The
    /// caller may retry.
    #[error("{}", unavailable_message(url, source))]
    Unavailable {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    /// A call did not finish within its time limit.
    #[error("the store at {url} did not answer within {limit:?}; check the database's load and the network")]
    Timeout { url: String, limit: Duration },
    /// Migrations could not be applied.
    #[error("{}", super::diagnose::migrate_message(*backend, url, source))]
    Migrate {
        backend: Backend,
        url: String,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    /// The MySQL server refused a statement larger than its
    /// `max_allowed_packet` (a large `put` value); `max` is the server's
    /// setting when it could be read.
    #[error(
        "the MySQL server at {url} refused the value of {size} bytes: with the statement around it, it exceeds the server's max_allowed_packet{} ({detail}); raise max_allowed_packet on the server (SET GLOBAL max_allowed_packet = …, and in its config file) or store a smaller value",
        max.map_or_else(String::new, |m| format!(" of {m} bytes"))
    )]
    PacketTooLarge {
        url: String,
        size: usize,
        max: Option<u64>,
        detail: String,
    },
    /// SQLite could not write its database or write-ahead log because the
    /// filesystem is full. The caller may retry: nothing was written, and
    /// the store works again once there is room.
    #[error(
        "the SQLite database at {path} could not be written because the disk is full ({source}); free space on the filesystem holding {}; fencecron carries on by itself once there is room",
        std::path::Path::new(path).parent().map_or_else(|| ".".into(), |d| d.display().to_string())
    )]
    DiskFull {
        path: String,
        #[source]
        source: sqlx::Error,
    },
    /// A SQLite database file (or its directory, `-wal`, `-shm` or lock
    /// file) that another user could rewrite, rewinding its fences.
    #[error("{detail}")]
    Unprotected { detail: String },
    /// The store answered something this version cannot interpret.
    #[error("the store at {url} returned unexpected data: {detail}")]
    Corrupt { url: String, detail: String },
}

/// How a store call failed before it was given its public form: a driver
/// error (which the backend names, with its URL, at the end of the call:
/// [`Dialect::error`]) or an error already named. `?` turns either into
/// this, so backend code never maps errors itself.
pub(crate) enum Failure {
    Sql(sqlx::Error),
    Store(StoreError),
}

impl From<sqlx::Error> for Failure {
    fn from(e: sqlx::Error) -> Self {
        Failure::Sql(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

/// The result of a backend operation before its error is named.
pub(crate) type Sql<T> = Result<T, Failure>;

/// The message for [`StoreError::Unavailable`], with advice that fits the
/// cause: a database at its connection limit needs a different fix from one
/// that is down.
fn unavailable_message(url: &str, source: &sqlx::Error) -> String {
    if let Some(no) = super::postgres::NoHost::of(source) {
        return no.message(url);
    }
    if let Some(m) = super::diagnose::explain(url, source) {
        return m;
    }
    if is_connection_limit(source) {
        return format!(
            "the store at {url} refused a new connection because it has reached its connection limit ({source}); lower store.max_connections in jobs.toml on each host or raise the database's limit"
        );
    }
    if matches!(source, sqlx::Error::PoolTimedOut) {
        return format!(
            "no connection to the store at {url} came free in time ({source}): either the database is unreachable, or it refuses new connections because its connection limit is reached (each daemon opens up to store.max_connections); check that it is running and reachable, and its connection count"
        );
    }
    format!("the store at {url} is unreachable or failing ({source}); check that it is running and reachable from this host")
}

/// Whether the database refused a connection because of its connection
/// limit: PostgreSQL 53300 too_many_connections, MySQL 1040 "Too many
/// connections", 1203 and 1226 (a user's `max_user_connections`).
fn is_connection_limit(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            db.code().as_deref() == Some("53300")
                || db
                    .message()
                    .to_ascii_lowercase()
                    .contains("too many connections")
                || db.message().contains("max_user_connections")
        }
        _ => false,
    }
}

/// Wraps a driver error, redacting the URL.
pub(crate) fn unavailable(url: &StoreUrl, source: sqlx::Error) -> StoreError {
    StoreError::Unavailable {
        url: url.to_string(),
        source,
    }
}

/// Wraps a migration failure. Not reaching the database at all is
/// `Unavailable` ("check that it is running"), not a migration problem
/// ("check that the user may create tables").
pub(crate) fn migrate_error(
    backend: Backend,
    url: &StoreUrl,
    source: sqlx::migrate::MigrateError,
) -> StoreError {
    match source {
        sqlx::migrate::MigrateError::Execute(
            // Protocol: garbage on the wire while connecting (a broken
            // proxy or network path), not a schema or permission problem.
            e @ (sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)),
        ) => unavailable(url, e),
        sqlx::migrate::MigrateError::Execute(e)
            if is_connection_limit(&e)
                || super::diagnose::cause(&url.to_string(), &e).is_some() =>
        {
            unavailable(url, e)
        }
        source => StoreError::Migrate {
            backend,
            url: url.to_string(),
            source,
        },
    }
}

/// Runs a store future under the per-call time limit.
pub(crate) async fn timed<T>(
    url: &StoreUrl,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Timeout {
            url: url.to_string(),
            limit,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_garbage_during_migrations_is_unreachable_not_permissions() {
        let url = StoreUrl::parse("postgres://u:pw@h/db").unwrap();
        let e = migrate_error(
            Backend::Postgres,
            &url,
            sqlx::migrate::MigrateError::Execute(sqlx::Error::Protocol(
                "unexpected response from SSLRequest: 0x00".into(),
            )),
        );
        assert!(matches!(e, StoreError::Unavailable { .. }), "{e}");
        assert!(!e.to_string().contains("create tables"), "{e}");
    }
}

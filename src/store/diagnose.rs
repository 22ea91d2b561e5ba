//! What a driver error means at the process boundary, and the advice that
//! fits it: a missing database, role or user, a wrong password, a closed
//! port, a row this version cannot read, a SQLite file in a directory that
//! does not exist, and the migration refusals. [`super::unavailable`] and
//! [`super::migrate_error`] build their messages here.
//!
//! Every message names the store by its redacted URL (or its host and port,
//! or its file), never by a password.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sqlx::migrate::MigrateError;
use sqlx::pool::PoolConnection;
use sqlx::{ConnectOptions, Connection, Database, Pool};

use super::Backend;

/// Why a store could not be used, when the driver error says so precisely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cause {
    /// PostgreSQL 3D000, MySQL 1049.
    MissingDatabase,
    /// PostgreSQL 28000 "role … does not exist".
    MissingRole,
    /// PostgreSQL 28P01: the password (or, with password authentication,
    /// the role) is wrong.
    WrongPassword,
    /// MySQL 1045 (MariaDB 1698 without a password): no such user for
    /// this host, or a wrong password;
    /// `password` tells whether one was sent.
    AccessDenied { password: bool },
    /// MySQL 1044: the user may not use this database.
    NoDatabaseAccess,
    /// PostgreSQL 28000 "no pg_hba.conf entry", MySQL 1130: this host may
    /// not connect (as this user).
    HostNotAllowed,
    /// Nothing listens at the host and port.
    Refused,
    /// PostgreSQL 25006 read_only_sql_transaction: the server is a standby
    /// or read-only, so a write was refused.
    ReadOnly,
    /// A row or value this version cannot decode.
    Decode,
    /// The SQLite database's directory does not exist.
    MissingDirectory,
    /// The SQLite database (or its directory) cannot be opened: permissions.
    CannotOpen,
}

/// Classifies a driver error for the backend of `url` (a redacted URL).
pub(crate) fn cause(url: &str, e: &sqlx::Error) -> Option<Cause> {
    let backend = backend_of(url);
    match e {
        sqlx::Error::Io(io)
            if io.kind() == std::io::ErrorKind::ConnectionRefused
                && backend != Some(Backend::Sqlite) =>
        {
            Some(Cause::Refused)
        }
        sqlx::Error::Decode(_)
        | sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => Some(Cause::Decode),
        _ if backend == Some(Backend::Sqlite) => sqlite_cause(url, e),
        sqlx::Error::Database(db) => match backend? {
            Backend::Postgres => match db.code().as_deref()? {
                "3D000" => Some(Cause::MissingDatabase),
                "25006" => Some(Cause::ReadOnly),
                "28P01" => Some(Cause::WrongPassword),
                "28000" if db.message().contains("pg_hba.conf") => Some(Cause::HostNotAllowed),
                "28000" if db.message().contains("does not exist") => Some(Cause::MissingRole),
                _ => None,
            },
            Backend::MySql => {
                let number = db
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()?
                    .number();
                match number {
                    1049 => Some(Cause::MissingDatabase),
                    // 1698: MariaDB's "access denied" without a password.
                    // Whether a password was sent is read from the URL: the
                    // server's "(using password: YES)" is not reliable, since
                    // MariaDB may switch an unknown user to another
                    // authentication plugin, to which the client answers
                    // with a non-empty response even without a password.
                    1045 | 1698 => Some(Cause::AccessDenied {
                        password: url_has_password(url),
                    }),
                    1044 => Some(Cause::NoDatabaseAccess),
                    1130 => Some(Cause::HostNotAllowed),
                    _ => None,
                }
            }
            Backend::Sqlite => None,
        },
        _ => None,
    }
}

/// SQLite cannot open its file: the directory is missing (checked on the
/// filesystem, since SQLite says only "unable to open database file"), or
/// this user may not open it.
fn sqlite_cause(url: &str, e: &sqlx::Error) -> Option<Cause> {
    let cannot_open = match e {
        // SQLITE_CANTOPEN (14) and its extended codes.
        sqlx::Error::Database(db) => db
            .code()
            .and_then(|c| c.parse::<i64>().ok())
            .is_some_and(|c| c & 0xff == 14),
        sqlx::Error::Io(io) => matches!(
            io.kind(),
            std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
        ),
        _ => false,
    };
    if !cannot_open {
        return None;
    }
    let dir = sqlite_path(url)?.parent().map(Path::to_path_buf)?;
    let dir = if dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        dir
    };
    Some(if dir.is_dir() {
        Cause::CannotOpen
    } else {
        Cause::MissingDirectory
    })
}

fn backend_of(url: &str) -> Option<Backend> {
    super::StoreUrl::parse(url).ok().map(|u| u.backend())
}

/// The file of a `sqlite:` URL.
pub(super) fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then(|| PathBuf::from(path))
}

/// `host:port` of a server URL, with the backend's default port.
pub(super) fn host_port(url: &str, backend: Backend) -> String {
    let Ok((u, list)) = super::parse_lenient(url) else {
        return url.to_string();
    };
    // Several PostgreSQL hosts: the list as written.
    if let Some(list) = list {
        return list;
    }
    // A Unix socket (PostgreSQL `?host=/run/postgresql`, MySQL `?socket=`).
    if let Some((_, path)) = u
        .query_pairs()
        .find(|(k, v)| (k == "host" && v.starts_with('/')) || k == "socket")
    {
        return path.into_owned();
    }
    let default = if backend == Backend::MySql {
        3306
    } else {
        5432
    };
    format!(
        "{}:{}",
        u.host_str().unwrap_or("localhost"),
        u.port().unwrap_or(default)
    )
}

/// The database a server URL names.
pub(super) fn database(url: &str) -> String {
    super::parse_lenient(url)
        .map(|(u, _)| u)
        .ok()
        .map(|u| u.path().trim_start_matches('/').to_string())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "(none)".to_string())
}

/// The user a server URL names.
/// Whether the URL carries a password (in its user part or a password
/// parameter; a redacted URL keeps `***` in its place).
fn url_has_password(url: &str) -> bool {
    super::parse_lenient(url).is_ok_and(|(u, _)| {
        u.password().is_some_and(|p| !p.is_empty())
            || u.query_pairs()
                .any(|(k, v)| super::is_secret_param(&k) && !v.is_empty())
    })
}

fn user(url: &str) -> String {
    super::parse_lenient(url)
        .map(|(u, _)| u)
        .ok()
        .map(|u| u.username().to_string())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "(the default user)".to_string())
}

/// The message for an error with a known [`Cause`], or `None`.
pub(crate) fn explain(url: &str, source: &sqlx::Error) -> Option<String> {
    let cause = cause(url, source)?;
    let backend = backend_of(url)?;
    let server = match backend {
        Backend::Postgres => "PostgreSQL",
        Backend::MySql => "MySQL",
        Backend::Sqlite => "SQLite",
    };
    let at = host_port(url, backend);
    let (db, who) = (database(url), user(url));
    Some(match cause {
        Cause::MissingDatabase => format!(
            "the {server} server at {at} has no database `{db}` ({source}); create it (CREATE DATABASE {db}) or correct the database name in the store URL {url}"
        ),
        Cause::MissingRole => format!(
            "the PostgreSQL server at {at} has no role `{who}` ({source}); create it (CREATE ROLE {who} LOGIN …) or correct the user name in the store URL {url}"
        ),
        Cause::WrongPassword => format!(
            "the PostgreSQL server at {at} refused the password of role `{who}` ({source}); check the password in the store URL (PostgreSQL gives the same answer when the role does not exist and the server asks for a password)"
        ),
        Cause::AccessDenied { password: true } => format!(
            "the MySQL server at {at} refused user `{who}` with the password given ({source}): the password is wrong, or no user `{who}` may connect from this host; check the password in the store URL and the user's host (SELECT user, host FROM mysql.user)"
        ),
        Cause::AccessDenied { password: false } => format!(
            "the MySQL server at {at} refused user `{who}` without a password ({source}): there is no user `{who}` that may connect from this host, or it needs a password; create the user (CREATE USER) or put its password in the store URL {url}"
        ),
        Cause::NoDatabaseAccess => format!(
            "user `{who}` may not use the database `{db}` on the MySQL server at {at} ({source}); grant it (GRANT ALL ON {db}.* TO …) or use a database the user may use"
        ),
        Cause::HostNotAllowed => format!(
            "the {server} server at {at} does not accept user `{who}` from this host ({source}); allow this host (pg_hba.conf on PostgreSQL, the user's host part on MySQL)"
        ),
        Cause::Refused => format!(
            "the {server} store {url} is unreachable: connection refused at {at}, where nothing accepts connections ({source}); check that the database server is running and listens on that address and port, and that the store URL names the right host and port"
        ),
        Cause::ReadOnly => format!(
            "the PostgreSQL server at {at} takes no writes: it is a standby or read-only ({source}); point the store URL at the primary, or list the cluster's hosts with ?target_session_attrs=read-write so that each connection finds it"
        ),
        Cause::Decode => format!(
            "the store at {url} returned a row this fencecron cannot read ({source}); its tables differ from what this version expects: check that every fencecron using this store runs the same version and that nobody changed fencecron's tables by hand"
        ),
        Cause::MissingDirectory => {
            let path = sqlite_path(url).unwrap_or_default();
            let dir = path.parent().unwrap_or(Path::new("."));
            format!(
                "the directory {} of the SQLite database {} does not exist ({source}); create it (mkdir -p {}) or point the store URL at an existing directory",
                dir.display(),
                path.display(),
                dir.display()
            )
        }
        Cause::CannotOpen => {
            let path = sqlite_path(url).unwrap_or_default();
            let dir = path.parent().unwrap_or(Path::new("."));
            format!(
                "the SQLite database {} cannot be opened ({source}); check that this user may read and write it and create files in {}",
                path.display(),
                dir.display()
            )
        }
    })
}

/// The message for a migration failure ([`super::StoreError::Migrate`]).
pub(crate) fn migrate_message(backend: Backend, url: &str, source: &MigrateError) -> String {
    let table = super::migrator::TABLE;
    match source {
        MigrateError::VersionMissing(v) => format!(
            "the {backend} store at {url} was migrated by a newer fencecron: {table} records migration {v}, which this fencecron does not know; upgrade fencecron on this host to the version the others run (an older version must not use a newer schema)"
        ),
        MigrateError::VersionMismatch(v) => format!(
            "the {backend} store at {url} records fencecron migration {v} with another checksum than this fencecron's migration {v}: the migration was changed after it was applied, or its row edited; run a released fencecron and leave its migrations and {table} unchanged"
        ),
        MigrateError::Dirty(v) => format!(
            "fencecron migration {v} was left partially applied on the {backend} store at {url} (MySQL cannot roll back schema changes); check which of its statements took effect, complete or undo them by hand, then delete its row (version {v}) from {table} (or from _sqlx_migrations, where older versions of fencecron recorded it)"
        ),
        _ => format!(
            "could not apply the {backend} migrations to {url} ({source}); check that the user may create tables"
        ),
    }
}

/// How long the first connection may take before [`first_connection`]
/// asks the server directly why.
pub(crate) const PROBE_AFTER: Duration = Duration::from_millis(300);

/// The pool's first connection, failing fast with the real reason. sqlx's
/// pool retries a refused connection (the server may be starting) until
/// its acquire timeout and then reports only "timed out", which reads like
/// a connection limit. If the pool has no connection after
/// [`PROBE_AFTER`], one direct attempt runs beside it: a refused
/// connection, or any error sqlx would not retry, is returned at once; a
/// success, or an error sqlx retries by design (the server starting, at
/// its connection limit), leaves the pool to go on waiting, and if the pool
/// then times out, that error is the answer.
pub(crate) async fn first_connection<DB: Database>(
    pool: &Pool<DB>,
) -> Result<PoolConnection<DB>, sqlx::Error> {
    let acquire = pool.acquire();
    tokio::pin!(acquire);
    tokio::select! {
        r = &mut acquire => return r,
        () = tokio::time::sleep(PROBE_AFTER) => {}
    }
    let options = pool.connect_options();
    let probe = options.connect();
    tokio::pin!(probe);
    tokio::select! {
        r = &mut acquire => r,
        p = &mut probe => match p {
            Ok(conn) => {
                let _ = conn.close().await;
                acquire.await
            }
            // The pool retries these until its timeout; if it gives up,
            // the server's own words (PostgreSQL's 53300, "too many
            // connections") say more than "timed out".
            Err(sqlx::Error::Database(e)) if e.is_transient_in_connect_phase() => {
                match acquire.await {
                    Err(sqlx::Error::PoolTimedOut) => Err(sqlx::Error::Database(e)),
                    r => r,
                }
            }
            Err(e) => Err(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whether_a_password_was_sent_is_read_from_the_url() {
        assert!(!url_has_password("mysql://root@127.0.0.1:3306/test"));
        assert!(!url_has_password("mysql://root:@127.0.0.1:3306/test"));
        assert!(url_has_password("mysql://root:secret@127.0.0.1:3306/test"));
        assert!(url_has_password("mysql://root:***@127.0.0.1:3306/test"));
        assert!(url_has_password("postgres://u@db/x?password=s"));
    }

    fn io(kind: std::io::ErrorKind) -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::new(kind, "test"))
    }

    #[test]
    fn refused_names_host_and_port_and_not_a_connection_limit() {
        for (url, at) in [
            ("postgres://u:hunter2@127.0.0.1:1/db", "127.0.0.1:1"),
            ("mysql://root@db.example", "db.example:3306"),
            ("postgres://u@h/db", "h:5432"),
            (
                "postgres://u@localhost/db?host=/run/postgresql",
                "/run/postgresql",
            ),
            (
                "mysql://u@localhost/db?socket=/run/mysqld.sock",
                "/run/mysqld.sock",
            ),
        ] {
            let redacted = super::super::url::redact(url);
            let e = io(std::io::ErrorKind::ConnectionRefused);
            assert_eq!(cause(&redacted, &e), Some(Cause::Refused));
            let m = explain(&redacted, &e).unwrap();
            assert!(m.contains(at) && m.contains("refused"), "{m}");
            assert!(!m.contains("hunter2") && !m.contains("limit"), "{m}");
        }
    }

    #[test]
    fn decode_errors_are_not_unreachable() {
        let e = sqlx::Error::ColumnNotFound("fence".into());
        let m = explain("postgres://u@h/db", &e).unwrap();
        assert_eq!(cause("postgres://u@h/db", &e), Some(Cause::Decode));
        assert!(
            m.contains("cannot read") && !m.contains("unreachable"),
            "{m}"
        );
        let e = sqlx::Error::Decode("bad".into());
        assert_eq!(cause("mysql://u@h/db", &e), Some(Cause::Decode));
    }

    #[test]
    fn sqlite_missing_directory_and_unopenable_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = format!("sqlite://{}/nope/sub/f.db", dir.path().display());
        let e = io(std::io::ErrorKind::NotFound);
        assert_eq!(cause(&missing, &e), Some(Cause::MissingDirectory));
        let m = explain(&missing, &e).unwrap();
        assert!(
            m.contains("does not exist") && m.contains("mkdir -p"),
            "{m}"
        );
        assert!(m.contains("/nope/sub"), "{m}");
        let present = format!("sqlite://{}/f.db", dir.path().display());
        let e = io(std::io::ErrorKind::PermissionDenied);
        assert_eq!(cause(&present, &e), Some(Cause::CannotOpen));
        // Other errors on SQLite are not classified here.
        assert_eq!(cause(&present, &sqlx::Error::PoolTimedOut), None);
    }

    #[test]
    fn unknown_errors_are_left_to_the_generic_message() {
        assert_eq!(cause("postgres://u@h/db", &sqlx::Error::PoolTimedOut), None);
        assert_eq!(
            cause(
                "postgres://u@h/db",
                &sqlx::Error::Protocol("garbage".into())
            ),
            None
        );
        assert_eq!(
            cause("mysql://u@h/db", &io(std::io::ErrorKind::BrokenPipe)),
            None
        );
    }

    #[test]
    fn migration_refusals_name_the_cause() {
        let m = migrate_message(
            Backend::Postgres,
            "postgres://u:***@h/db",
            &MigrateError::VersionMissing(9),
        );
        assert!(
            m.contains("newer fencecron") && m.contains("migration 9"),
            "{m}"
        );
        let m = migrate_message(
            Backend::MySql,
            "mysql://u@h/db",
            &MigrateError::VersionMismatch(2),
        );
        assert!(m.contains("checksum") && m.contains("migration 2"), "{m}");
        let m = migrate_message(Backend::MySql, "mysql://u@h/db", &MigrateError::Dirty(3));
        assert!(m.contains("partially applied"), "{m}");
    }
}

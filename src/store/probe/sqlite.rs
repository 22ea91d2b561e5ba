//! What `check --connect` reads on SQLite: the file, the migrations, no
//! clock (it is this host's).

use super::*;

// SQLite -------------------------------------------------------------------

pub(super) async fn sqlite(url: &StoreUrl) -> Result<Probe, StoreError> {
    use std::str::FromStr;

    use sqlx::sqlite::SqliteConnectOptions;
    use sqlx::ConnectOptions;

    let start = Instant::now();
    // An in-memory database is each process's own: it fences nothing
    // between daemons (the same refusal as a file others could rewrite).
    let path = sqlite_path(url.expose()).ok_or_else(|| StoreError::Unprotected {
        detail: format!(
            "the SQLite store {url} is an in-memory database, which each process has to itself, so it fences nothing between daemons; point the store URL at a file, such as sqlite:///var/lib/fencecron/fencecron.db"
        ),
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {}", nix::unistd::geteuid()), |u| u.name);
    if !dir.is_dir() {
        // The same message as the daemon's start.
        let e = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::NotFound));
        return Err(unavailable(url, e));
    }
    // Whoever else could write the files could rewind the fences.
    super::super::sqlite::check_protected(&path)?;
    let writable =
        |p: &std::path::Path| nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok();
    let mut missing = Vec::new();
    if !writable(&dir) {
        missing.push(format!(
            "write access to the directory {} (SQLite creates the database's -wal and -shm files there, fencecron its lock file)",
            dir.display()
        ));
    }
    let migrator = sqlx::migrate!("migrations/sqlite");
    let exists = path.exists();
    let mut migrations = if exists {
        if !writable(&path) {
            missing.push(format!("write access to the database {}", path.display()));
        }
        let options = SqliteConnectOptions::from_str(url.expose())
            .map_err(|e| unavailable(url, e))?
            .create_if_missing(false)
            .busy_timeout(Duration::from_secs(5));
        let mut conn = options.connect().await.map_err(|e| unavailable(url, e))?;
        let status = migrator::status::<sqlx::Sqlite>(&mut conn, Backend::Sqlite, &migrator).await;
        let _ = conn.close().await;
        migrations(Backend::Sqlite, url, &migrator, status)?
    } else {
        migrations(Backend::Sqlite, url, &migrator, Ok(fresh_plan(&migrator)))?
    };
    if !migrations.pending.is_empty() && !writable(&dir) {
        migrations
            .cannot_apply
            .push(format!("write access to the directory {}", dir.display()));
    }
    let connect_time = start.elapsed();
    Ok(Probe {
        backend: Backend::Sqlite,
        answered: if exists {
            format!("SQLite database {}", path.display())
        } else {
            format!(
                "SQLite database {} (not created yet: the daemon creates it, private to {user}, at its first start)",
                path.display()
            )
        },
        user,
        connect_time: exists.then_some(connect_time),
        migrations,
        missing,
        checked: "the database and its directory writable by this user and by no other".into(),
        clock: Clock::Kernel,
        read_only: None,
    })
}

//! Who may write a SQLite store: only this user (a store another user
//! could rewrite could have its fencing tokens rewound).

use std::os::unix::fs::OpenOptionsExt;

use super::*;

/// Refuses a database that another user could rewrite. Whoever can write
/// the database file, its `-wal` (SQLite replays it on open) or `-shm`, or
/// plant those files in its directory, can set a lease's fence back and get
/// a token issued twice, so:
///
/// * the database, `-wal`, `-shm`, `-journal` and `.migrate-lock` files, as
///   far as they exist, must be owned by this user and writable by no one
///   else (no group or other write bit);
/// * their directory must be owned by this user or root and writable by no
///   one else: in a group- or world-writable directory (even a sticky one
///   such as `/tmp`) another user can create the `-wal` or `-shm` file
///   whenever it does not exist, between two of our connections.
///
/// The path is resolved first (symlinks), because SQLite puts the `-wal`
/// and `-shm` files beside the file it opens.
pub(in crate::store) fn check_protected(db: &std::path::Path) -> Result<(), StoreError> {
    let db = std::fs::canonicalize(db).unwrap_or_else(|_| db.to_path_buf());
    let dir = match db.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    if let Ok(meta) = std::fs::metadata(&dir) {
        use std::os::unix::fs::MetadataExt;
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me && meta.uid() != 0 {
            return Err(StoreError::Unprotected {
                detail: format!(
                    "the directory {} of the SQLite database is owned by {}, not by {} (the user this fencecron runs as) or root, so that user could replace the database and rewind its fencing tokens; keep the database in a directory of its own, such as the service's StateDirectory",
                    dir.display(),
                    user_name(meta.uid()),
                    user_name(me)
                ),
            });
        }
        if meta.mode() & 0o022 != 0 {
            return Err(StoreError::Unprotected {
                detail: format!(
                    "the directory {} of the SQLite database is writable by other users (mode {:04o}), who could plant its -wal or -shm file and rewind its fencing tokens; keep the database in a directory only this user can write (not /tmp), such as the service's StateDirectory",
                    dir.display(),
                    meta.mode() & 0o7777
                ),
            });
        }
    }
    let name = db.as_os_str().to_os_string();
    for (suffix, what) in [
        ("", "database file"),
        ("-wal", "write-ahead log"),
        ("-shm", "shared-memory file"),
        ("-journal", "journal"),
        (".migrate-lock", "migration lock file"),
    ] {
        let mut p = name.clone();
        p.push(suffix);
        let p = std::path::PathBuf::from(p);
        if let Ok(meta) = std::fs::metadata(&p) {
            refuse_unprotected(&p, &meta, what)?;
        }
    }
    Ok(())
}

/// The check of one existing file for [`check_protected`].
pub(super) fn refuse_unprotected(
    path: &std::path::Path,
    meta: &std::fs::Metadata,
    what: &str,
) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    let me = user_name(nix::unistd::geteuid().as_raw());
    // A foreign lock file cannot change a fence, but its owner could hold
    // it and keep every fencecron here from starting.
    let harm = if what.contains("lock") {
        "hold it and keep fencecron from starting"
    } else {
        "rewrite its leases and rewind fencing tokens"
    };
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        let owner = user_name(meta.uid());
        return Err(StoreError::Unprotected {
            detail: format!(
                "the SQLite {what} {} is owned by {owner}, not by {me}, the user this fencecron runs as, so {owner} could {harm}; if it is your store, run fencecron as {owner} (e.g. sudo -u {owner} fencecron …; all instances on a host must run as one user), else move it away and let fencecron create its own",
                path.display(),
            ),
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(StoreError::Unprotected {
            detail: format!(
                "the SQLite {what} {} is writable by other users (mode {:04o}), who could {harm}; run chmod go-w on it (fencecron creates it 0600)",
                path.display(),
                meta.mode() & 0o7777
            ),
        });
    }
    Ok(())
}

/// A user's name, or `uid N` for a uid without one.
fn user_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => u.name,
        _ => format!("uid {uid}"),
    }
}

/// Creates the database file, if it does not exist yet, readable and
/// writable by this user only (0600, less the umask): SQLite would create
/// it 0644, and it holds every lease and fenced value. SQLite gives its
/// `-wal` and `-shm` files the database file's mode. An existing file keeps
/// its mode (an operator may have let a group read it), as long as no one
/// else may write it ([`check_protected`]). Errors are left for SQLite to
/// report when it opens the file.
pub(super) fn create_private(path: &std::path::Path) {
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
}

//! A store URL kept in a file (`store.url_file`, a job's private URL file):
//! reading it, and who may.

use super::*;

/// The store URL in the text of a file that holds one (`[store] url_file`,
/// `$FENCECRON_STORE_FILE`): its one line (blank lines and `#` comments
/// aside, surrounding whitespace ignored), either the URL itself or
/// `NAME=URL` as in an environment file such as systemd's
/// `EnvironmentFile=` (`NAME` a variable name; the value may be quoted).
/// Errors never show the file's content, only the redacted URL.
pub(crate) fn url_in_file_text(text: &str) -> Result<StoreUrl, String> {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let line = match lines.as_slice() {
        [one] => *one,
        [] => return Err("the file is empty; write the store URL into it, on one line".into()),
        more => {
            return Err(format!(
                "the file has {} lines; it must hold the store URL alone, on one line",
                more.len()
            ))
        }
    };
    let value = match line.split_once('=') {
        Some((name, value)) if is_env_name(name) => {
            let v = value.trim();
            v.strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(v)
        }
        _ => line,
    };
    StoreUrl::parse(value)
}

/// Whether `s` is an environment variable name: a letter or `_`, then
/// letters, digits and `_`.
pub(super) fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Reads `[store] url_file`: the store URL kept in a file of its own, as
/// Docker's `_FILE` secrets are. The file must not grant other users any
/// access (a URL may hold a password): the package's is 0640, root's and
/// group `fencecron`'s. A file this user cannot read is named with who can.
/// The name of a file's group (its number when the group has no name
/// here): the group an error tells a user to join to read the file.
pub(crate) fn group_name(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    nix::unistd::Group::from_gid(meta.gid().into())
        .ok()
        .flatten()
        .map(|g| g.name)
        .unwrap_or_else(|| meta.gid().to_string())
}

pub(crate) fn read_url_file(path: &std::path::Path) -> Result<StoreUrl, String> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "{shown} does not exist; write the store URL into it (mode 0640, group fencecron) or fix store.url_file"
        ),
        _ => format!("cannot read {shown} ({e}); run this as root or as the user the daemon runs as"),
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o007 != 0 {
        return Err(format!(
            "{shown} is open to other users (mode {mode:04o}) and may hold a password; run `chmod o-rwx {shown}` (0640: its owner and group only)"
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            let group = group_name(&meta);
            format!(
                "cannot read {shown} ({e}): only its owner and group `{group}` may; run this as root or as a member of group `{group}` (e.g. the service user), or add your user to it with `usermod -aG {group} USER`"
            )
        } else {
            format!("cannot read {shown} ({e})")
        }
    })?;
    url_in_file_text(&text).map_err(|m| format!("{shown}: {m}"))
}

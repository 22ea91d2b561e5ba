//! Store URLs: which backend a URL selects, and how it prints without its
//! secrets.

use std::fmt;

/// Which database a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    MySql,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
            Backend::MySql => "mysql",
        })
    }
}

/// A store URL. Its `Display` never shows a password.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    raw: String,
    backend: Backend,
}

impl StoreUrl {
    /// Parses and classifies a store URL; the error says which schemes work.
    pub fn parse(raw: &str) -> Result<StoreUrl, String> {
        let raw = raw.trim();
        let backend = if raw.starts_with("sqlite:") {
            Backend::Sqlite
        } else if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
            Backend::Postgres
        } else if raw.starts_with("mysql://") || raw.starts_with("mariadb://") {
            Backend::MySql
        } else {
            return Err(format!(
                "store URL `{}` has an unsupported scheme; use sqlite://PATH, postgres://… or mysql://…",
                redact(raw)
            ));
        };
        if backend != Backend::Sqlite {
            let u = url::Url::parse(raw)
                .map_err(|e| format!("store URL `{}` is not a valid URL: {e}", redact(raw)))?;
            // sqlx's PostgreSQL driver reads only `password` (names are
            // case-sensitive) and logs any parameter it does not know *with
            // its value* at WARN: `?PASSWORD=…` would be ignored and could
            // reach a log with `FENCECRON_LOG=debug`.
            if backend == Backend::Postgres {
                if let Some((k, _)) = u
                    .query_pairs()
                    .find(|(k, _)| is_secret_param(k) && k != "password")
                {
                    return Err(format!(
                        "store URL `{}` has the query parameter `{k}`, which the PostgreSQL driver does not read (parameter names are case-sensitive), so the password would be ignored; write `password=` in lower case or put the password in the URL as postgres://USER:PASSWORD@HOST/DB",
                        redact(raw)
                    ));
                }
            }
        } else if raw
            .trim_start_matches("sqlite:")
            .trim_start_matches("//")
            .is_empty()
        {
            return Err("store URL `sqlite://` names no file; use sqlite://PATH".to_string());
        }
        let raw = if let Some(rest) = raw.strip_prefix("mariadb://") {
            format!("mysql://{rest}")
        } else {
            raw.to_string()
        };
        Ok(StoreUrl { raw, backend })
    }

    /// The embedded default: `fencecron.db` in `$STATE_DIRECTORY` (set by
    /// systemd) or else the current directory.
    pub fn default_sqlite() -> StoreUrl {
        let dir = std::env::var("STATE_DIRECTORY")
            .ok()
            // systemd may pass several directories separated by colons.
            .and_then(|d| d.split(':').next().map(str::to_string))
            .filter(|d| !d.is_empty());
        let path = match dir {
            Some(d) => format!("{}/fencecron.db", d.trim_end_matches('/')),
            None => "fencecron.db".to_string(),
        };
        StoreUrl {
            raw: format!("sqlite://{path}"),
            backend: Backend::Sqlite,
        }
    }

    /// For SQLite, the same URL with a relative path made absolute against
    /// the current directory, so that a job running in another `workdir`
    /// reaches the same file. Other URLs are returned unchanged.
    pub fn absolutize(self) -> StoreUrl {
        if self.backend != Backend::Sqlite {
            return self;
        }
        let rest = self
            .raw
            .strip_prefix("sqlite://")
            .or_else(|| self.raw.strip_prefix("sqlite:"))
            .unwrap_or(&self.raw);
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        if path.starts_with('/') || path == ":memory:" || path.is_empty() {
            return self;
        }
        let Ok(abs) = std::path::absolute(path) else {
            return self;
        };
        let mut raw = format!("sqlite://{}", abs.display());
        if let Some(q) = query {
            raw.push('?');
            raw.push_str(q);
        }
        StoreUrl {
            raw,
            backend: Backend::Sqlite,
        }
    }

    /// Which daemons this store fences against each other: `"host"` for
    /// SQLite (a file on this host: daemons elsewhere never see it, so
    /// every host with its own file is a fleet of one that runs every
    /// job), `"fleet"` for a database server every host can share.
    pub fn scope(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite => "host",
            Backend::Postgres | Backend::MySql => "fleet",
        }
    }

    /// [`StoreUrl::scope`] as the one line `check` prints.
    pub fn scope_line(&self) -> String {
        match self.backend {
            Backend::Sqlite => format!(
                "store {self} fences the daemons of this host only; set [store] url or url_file to a shared PostgreSQL or MySQL database for a fleet"
            ),
            Backend::Postgres | Backend::MySql => format!(
                "store {self} fences every daemon that uses it, on any host (a fleet)"
            ),
        }
    }

    /// Which backend the URL selects.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL including any password. Only for handing to the driver or to
    /// a child process's environment; never for logs or messages.
    pub fn expose(&self) -> &str {
        &self.raw
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.raw))
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({})", redact(&self.raw))
    }
}

/// The store URL in the text of a file that holds one (`[store] url_file`,
/// `$FENCECRON_STORE_FILE`): its one line (blank lines and `#` comments
/// aside, surrounding whitespace ignored), either the URL itself or
/// `NAME=URL` as in an environment file such as systemd's
/// `EnvironmentFile=` (`NAME` a variable name; the value may be quoted).
/// Errors never show the file's content, only the redacted URL.
pub fn url_in_file_text(text: &str) -> Result<StoreUrl, String> {
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
fn is_env_name(s: &str) -> bool {
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
pub fn group_name(meta: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    nix::unistd::Group::from_gid(meta.gid().into())
        .ok()
        .flatten()
        .map(|g| g.name)
        .unwrap_or_else(|| meta.gid().to_string())
}

pub fn read_url_file(path: &std::path::Path) -> Result<StoreUrl, String> {
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

/// Whether a URL query parameter holds a secret, however it is spelled:
/// its name, lower-cased and without `-` and `_`, contains `pass`, `pwd`,
/// `secret` or `token`. That covers `password` (the one sqlx's PostgreSQL
/// driver reads; its MySQL driver reads none), `PASSWORD`, `Password`,
/// `pass`, `passwd`, `pwd`, `sslpassword` (libpq), and does not hide the
/// paths in `sslkey`/`sslcert`/`sslrootcert`.
pub fn is_secret_param(name: &str) -> bool {
    let name: String = name
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .flat_map(char::to_lowercase)
        .collect();
    ["pass", "pwd", "secret", "token"]
        .iter()
        .any(|s| name.contains(s))
}

/// Replaces the password of a URL and the value of every query parameter
/// that holds a secret ([`is_secret_param`]) with `***`, for every message
/// and log line that mentions a store.
pub fn redact(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u)
            if u.password().is_some() || u.query_pairs().any(|(k, _)| is_secret_param(&k)) =>
        {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            if u.query().is_some() {
                let pairs: Vec<(String, String)> = u
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if is_secret_param(&k) {
                            "***".to_string()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        Ok(_) => raw.to_string(),
        // Not parseable as a URL: still hide anything between `:` and `@`
        // and the values of secret query parameters.
        Err(_) => {
            let (head, query) = match raw.split_once('?') {
                Some((h, q)) => (h, Some(q)),
                None => (raw, None),
            };
            let mut out = match (head.find("://"), head.rfind('@')) {
                (Some(s), Some(at)) if at > s => {
                    let userinfo = &head[s + 3..at];
                    match userinfo.find(':') {
                        Some(c) => {
                            format!("{}{}:***{}", &head[..s + 3], &userinfo[..c], &head[at..])
                        }
                        None => head.to_string(),
                    }
                }
                _ => head.to_string(),
            };
            if let Some(q) = query {
                let pairs: Vec<String> = q
                    .split('&')
                    .map(|pair| match pair.split_once('=') {
                        Some((k, _)) if is_secret_param(k) => format!("{k}=***"),
                        _ => pair.to_string(),
                    })
                    .collect();
                out.push('?');
                out.push_str(&pairs.join("&"));
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(redact("postgres://u:secret@db/x"), "postgres://u:***@db/x");
        assert_eq!(
            redact("mysql://root@127.0.0.1:3306/test"),
            "mysql://root@127.0.0.1:3306/test"
        );
        assert!(!redact("postgres://db/x?password=hunter2&sslmode=require").contains("hunter2"));
        assert!(!redact("postgres://u:p@ss@db/x").contains("p@ss"));
    }

    #[test]
    fn redacts_every_spelling_of_a_password_parameter() {
        for key in [
            "password",
            "PASSWORD",
            "Password",
            "pass",
            "PASS",
            "passwd",
            "pwd",
            "PWD",
            "sslpassword",
            "ssl-password",
            "PASS%57ORD",
            "secret",
            "auth_token",
        ] {
            for url in [
                format!("postgres://u@db/x?sslmode=require&{key}=hunter2&a=b"),
                format!("mysql://u@db/x?{key}=hunter2"),
                // Not a URL the url crate accepts: the fallback redacts too.
                format!("postgres://u:hunter2@[db/x?{key}=hunter2"),
            ] {
                let r = redact(&url);
                assert!(!r.contains("hunter2"), "{url} -> {r}");
                assert!(r.contains("***"), "{url} -> {r}");
            }
        }
        let r = redact("postgres://u@db/x?sslkey=/etc/k.pem&sslmode=require");
        assert!(r.contains("/etc/k.pem") && r.contains("require"), "{r}");
    }

    #[test]
    fn postgres_password_parameters_the_driver_ignores_are_refused() {
        let e = StoreUrl::parse("postgres://u@db/x?PASSWORD=hunter2").unwrap_err();
        assert!(e.contains("`PASSWORD`") && !e.contains("hunter2"), "{e}");
        assert!(StoreUrl::parse("postgres://u@db/x?pwd=hunter2").is_err());
        assert!(StoreUrl::parse("postgres://u@db/x?password=hunter2").is_ok());
        assert!(StoreUrl::parse("postgres://u@db/x?sslmode=require").is_ok());
    }

    #[test]
    fn url_schemes() {
        assert_eq!(
            StoreUrl::parse("sqlite://x.db").unwrap().backend(),
            Backend::Sqlite
        );
        assert_eq!(
            StoreUrl::parse("mariadb://root@h/db").unwrap().expose(),
            "mysql://root@h/db"
        );
        assert!(StoreUrl::parse("redis://h")
            .unwrap_err()
            .contains("unsupported"));
        let u = StoreUrl::parse("postgres://u:pw@h/db").unwrap();
        assert!(!format!("{u} {u:?}").contains("pw"));
    }
}

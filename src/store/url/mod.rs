//! Store URLs: which backend a URL selects, and how it prints without its
//! secrets.

use std::fmt;

mod file;
mod targets;

pub(crate) use file::*;
pub(crate) use targets::*;

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
    /// PostgreSQL: the hosts in order and what a session must be.
    pg: Option<PgTargets>,
}

/// `raw` read by the url crate even when it names several hosts: the list
/// is replaced by a placeholder, returned beside the URL to be put back by
/// [`unparse`].
pub(crate) fn parse_lenient(raw: &str) -> Result<(url::Url, Option<String>), url::ParseError> {
    match host_list_range(raw) {
        None => url::Url::parse(raw).map(|u| (u, None)),
        Some(r) => {
            let single = format!("{}{HOSTS_PLACEHOLDER}{}", &raw[..r.start], &raw[r.end..]);
            url::Url::parse(&single).map(|u| (u, Some(raw[r].to_string())))
        }
    }
}

/// The text of a URL from [`parse_lenient`], with its host list back.
pub(crate) fn unparse(u: &url::Url, hosts: Option<&str>) -> String {
    match hosts {
        None => u.to_string(),
        Some(list) => u.to_string().replacen(HOSTS_PLACEHOLDER, list, 1),
    }
}

impl StoreUrl {
    /// Parses and classifies a store URL; the error says which schemes work.
    /// A PostgreSQL URL may name several hosts and read
    /// `$PGTARGETSESSIONATTRS` and `$PGCONNECT_TIMEOUT` ([`PgTargets`]).
    pub fn parse(raw: &str) -> Result<StoreUrl, String> {
        Self::parse_with_env(raw, &|name| std::env::var(name).ok())
    }

    /// [`StoreUrl::parse`] with the environment given (`env` looks a
    /// variable up).
    pub(crate) fn parse_with_env(
        raw: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<StoreUrl, String> {
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
        let mut pg = None;
        if backend == Backend::Postgres {
            pg = Some(pg_targets(raw, env)?);
        }
        if backend != Backend::Sqlite {
            // Several hosts are PostgreSQL's alone.
            let parsed = if backend == Backend::Postgres {
                parse_lenient(raw).map(|(u, _)| u)
            } else {
                url::Url::parse(raw)
            };
            let u = parsed
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
        Ok(StoreUrl { raw, backend, pg })
    }

    /// The embedded default: `fencecron.db` in `$STATE_DIRECTORY` (set by
    /// systemd) or else the current directory.
    pub(crate) fn default_sqlite() -> StoreUrl {
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
            pg: None,
        }
    }

    /// For SQLite, the same URL with a relative path made absolute against
    /// the current directory, so that a job running in another `workdir`
    /// reaches the same file. Other URLs are returned unchanged.
    pub(crate) fn absolutize(self) -> StoreUrl {
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
            pg: None,
        }
    }

    /// Which daemons this store fences against each other: `"host"` for
    /// SQLite (a file on this host: daemons elsewhere never see it, so
    /// every host with its own file is a fleet of one that runs every
    /// job), `"fleet"` for a database server every host can share.
    pub(crate) fn scope(&self) -> &'static str {
        match self.backend {
            Backend::Sqlite => "host",
            Backend::Postgres | Backend::MySql => "fleet",
        }
    }

    /// [`StoreUrl::scope`] as the one line `check` prints.
    pub(crate) fn scope_line(&self) -> String {
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
    pub(crate) fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL including any password. Only for handing to the driver or to
    /// a child process's environment; never for logs or messages.
    pub(crate) fn expose(&self) -> &str {
        &self.raw
    }

    /// A PostgreSQL URL's hosts and session requirement.
    pub(crate) fn pg_targets(&self) -> Option<&PgTargets> {
        self.pg.as_ref()
    }

    /// The URL as the PostgreSQL driver is to read it (with any password):
    /// for host number `host` of a multi-host URL, that host alone; the
    /// parameters fencecron reads itself ([`PgTargets`]) left out. Other
    /// backends' URLs unchanged.
    pub(crate) fn driver_url(&self, host: usize) -> String {
        if self.backend != Backend::Postgres {
            return self.raw.clone();
        }
        let Ok((mut u, list)) = parse_lenient(&self.raw) else {
            return self.raw.clone();
        };
        if u.query_pairs().any(|(k, _)| PG_OWN_PARAMS.contains(&&*k)) {
            let kept: Vec<(String, String)> = u
                .query_pairs()
                .filter(|(k, _)| !PG_OWN_PARAMS.contains(&&**k))
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            if kept.is_empty() {
                u.set_query(None);
            } else {
                u.query_pairs_mut().clear().extend_pairs(kept);
            }
        }
        match list {
            None => u.to_string(),
            Some(list) => {
                let hosts = split_hosts(&list);
                let one = hosts.get(host).or(hosts.first()).copied().unwrap_or("");
                unparse(&u, Some(one))
            }
        }
    }

    /// The redacted URL of host number `host` alone (for messages about
    /// that host).
    #[cfg(test)]
    pub(crate) fn host_url(&self, host: usize) -> String {
        redact(&self.driver_url(host))
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

/// Whether a URL query parameter holds a secret, however it is spelled:
/// its name, lower-cased and without `-` and `_`, contains `pass`, `pwd`,
/// `secret` or `token`. That covers `password` (the one sqlx's PostgreSQL
/// driver reads; its MySQL driver reads none), `PASSWORD`, `Password`,
/// `pass`, `passwd`, `pwd`, `sslpassword` (libpq), and does not hide the
/// paths in `sslkey`/`sslcert`/`sslrootcert`.
pub(crate) fn is_secret_param(name: &str) -> bool {
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
pub(crate) fn redact(raw: &str) -> String {
    match parse_lenient(raw) {
        Ok((mut u, list))
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
            unparse(&u, list.as_deref())
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
mod tests;

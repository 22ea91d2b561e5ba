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
    /// PostgreSQL: the hosts in order and what a session must be.
    pg: Option<PgTargets>,
}

/// libpq's `target_session_attrs`: which of a URL's servers a session may
/// use. The first host in the URL's order whose session qualifies is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TargetSessionAttrs {
    /// Any server that accepts the connection (libpq's default).
    Any,
    /// A session that accepts writes: not a standby, and
    /// `default_transaction_read_only` off.
    ReadWrite,
    /// A session that does not accept writes (the converse).
    ReadOnly,
    /// A server that is not a standby (not in recovery).
    Primary,
    /// A standby (in recovery).
    Standby,
    /// A standby if any host is one, else any server.
    PreferStandby,
}

impl TargetSessionAttrs {
    /// Every value, as written in a URL.
    pub(crate) const ALL: [TargetSessionAttrs; 6] = [
        TargetSessionAttrs::Any,
        TargetSessionAttrs::ReadWrite,
        TargetSessionAttrs::ReadOnly,
        TargetSessionAttrs::Primary,
        TargetSessionAttrs::Standby,
        TargetSessionAttrs::PreferStandby,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::ReadOnly => "read-only",
            TargetSessionAttrs::Primary => "primary",
            TargetSessionAttrs::Standby => "standby",
            TargetSessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// The value named `s` (as libpq spells it); the error lists the
    /// accepted values.
    pub(crate) fn parse(s: &str) -> Result<TargetSessionAttrs, String> {
        Self::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = Self::ALL.iter().map(|a| a.as_str()).collect();
                format!(
                    "`{s}` is not a target_session_attrs value; use one of {}",
                    all.join(", ")
                )
            })
    }

    /// Whether a session on a server in recovery (`standby`) whose
    /// `transaction_read_only` is `read_only` qualifies.
    pub(crate) fn accepts(self, standby: bool, read_only: bool) -> bool {
        match self {
            TargetSessionAttrs::Any | TargetSessionAttrs::PreferStandby => true,
            TargetSessionAttrs::ReadWrite => !read_only,
            TargetSessionAttrs::ReadOnly => read_only,
            TargetSessionAttrs::Primary => !standby,
            TargetSessionAttrs::Standby => standby,
        }
    }
}

impl fmt::Display for TargetSessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a PostgreSQL URL's sessions go: its hosts in the order they are
/// tried (`postgres://h1:5432,h2:5433,h3/db`, default port 5432), the
/// session they must give (`target_session_attrs`, else
/// `$PGTARGETSESSIONATTRS`, else `any`) and how long each host may take to
/// answer (`connect_timeout` in seconds, else `$PGCONNECT_TIMEOUT`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PgTargets {
    /// Each host as written (`h1:5432`, `[::1]:5433`, `db`); one empty
    /// entry for a URL without a host (a Unix socket or the driver's
    /// default).
    pub(crate) hosts: Vec<String>,
    pub(crate) attrs: TargetSessionAttrs,
    /// Where `attrs` came from: `"the URL"`, `"PGTARGETSESSIONATTRS"` or
    /// `"the default"`.
    pub(crate) attrs_from: &'static str,
    /// Per host; `None`: not set.
    pub(crate) connect_timeout: Option<std::time::Duration>,
}

impl PgTargets {
    /// Whether the driver's one host and no check suffice: a single host
    /// and `any`.
    pub(crate) fn is_plain(&self) -> bool {
        self.hosts.len() == 1 && self.attrs == TargetSessionAttrs::Any
    }
}

/// The query parameters fencecron reads itself for PostgreSQL and does
/// not hand to the driver (which does not know them).
const PG_OWN_PARAMS: [&str; 2] = ["target_session_attrs", "connect_timeout"];

/// A placeholder for a multi-host list while the url crate reads the rest
/// of the URL (it accepts one host only).
const HOSTS_PLACEHOLDER: &str = "fencecron-host-list.invalid";

/// Where the host list of `raw` is: the byte range of the authority's
/// host part (after any `user:password@`, before the path or query), if it
/// names several hosts (`h1,h2`).
fn host_list_range(raw: &str) -> Option<std::ops::Range<usize>> {
    let start = raw.find("://")? + 3;
    let end = raw[start..]
        .find(['/', '?', '#'])
        .map_or(raw.len(), |i| start + i);
    let host_start = raw[start..end]
        .rfind('@')
        .map_or(start, |at| start + at + 1);
    raw[host_start..end]
        .contains(',')
        .then_some(host_start..end)
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

/// Splits a host list at its commas (not inside `[…]`).
fn split_hosts(list: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut from) = (0, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&list[from..i]);
                from = i + 1;
            }
            _ => {}
        }
    }
    out.push(&list[from..]);
    out
}

/// The PostgreSQL part of [`StoreUrl::parse`]: each host checked (the
/// error names the one that is wrong), the parameters fencecron reads
/// itself, and the environment's `PGTARGETSESSIONATTRS` and
/// `PGCONNECT_TIMEOUT` (`env` looks a variable up).
fn pg_targets(raw: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<PgTargets, String> {
    let shown = redact(raw);
    let (u, list) =
        parse_lenient(raw).map_err(|e| format!("store URL `{shown}` is not a valid URL: {e}"))?;
    let hosts: Vec<String> = match &list {
        None => vec![match (u.host_str(), u.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            _ => String::new(),
        }],
        Some(list) => split_hosts(list).into_iter().map(str::to_string).collect(),
    };
    if list.is_some() {
        for (i, h) in hosts.iter().enumerate() {
            if h.is_empty() {
                return Err(format!(
                    "store URL `{shown}` has an empty host (number {}) in its host list; write the hosts as host:port separated by commas, e.g. postgres://h1:5432,h2:5432/db",
                    i + 1
                ));
            }
            let one = format!("postgres://{h}/");
            url::Url::parse(&one).map_err(|e| {
                format!(
                    "store URL `{shown}` is not a valid URL: its host `{h}` (number {}): {e}; write each host as host, host:port or [IPv6]:port",
                    i + 1
                )
            })?;
        }
    }
    if let Some((_, v)) = u
        .query_pairs()
        .find(|(k, v)| k == "host" && v.contains(','))
    {
        return Err(format!(
            "store URL `{shown}` lists several hosts in `host={v}`, which fencecron does not read; write them in the URL's host part instead, e.g. postgres://h1:5432,h2:5432/db"
        ));
    }
    let param = |name: &str| {
        u.query_pairs()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.into_owned())
    };
    let (attrs, attrs_from) = match (param("target_session_attrs"), env("PGTARGETSESSIONATTRS")) {
        (Some(v), _) => (
            TargetSessionAttrs::parse(&v).map_err(|e| format!("store URL `{shown}`: {e}"))?,
            "the URL",
        ),
        (None, Some(v)) if !v.is_empty() => (
            TargetSessionAttrs::parse(&v).map_err(|e| {
                format!("the environment variable PGTARGETSESSIONATTRS (for the store URL `{shown}`): {e}")
            })?,
            "PGTARGETSESSIONATTRS",
        ),
        _ => (TargetSessionAttrs::Any, "the default"),
    };
    let seconds = |v: &str, from: &str| -> Result<Option<std::time::Duration>, String> {
        let n: i64 = v.trim().parse().map_err(|_| {
            format!("{from}: connect_timeout `{v}` is not a whole number of seconds; write e.g. connect_timeout=2")
        })?;
        // libpq: zero or negative waits indefinitely; 1 means 2.
        Ok((n > 0).then(|| std::time::Duration::from_secs(n.max(2) as u64)))
    };
    let connect_timeout = match (param("connect_timeout"), env("PGCONNECT_TIMEOUT")) {
        (Some(v), _) => seconds(&v, &format!("store URL `{shown}`"))?,
        (None, Some(v)) if !v.is_empty() => {
            seconds(&v, "the environment variable PGCONNECT_TIMEOUT")?
        }
        _ => None,
    };
    Ok(PgTargets {
        hosts,
        attrs,
        attrs_from,
        connect_timeout,
    })
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

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn pg(raw: &str) -> PgTargets {
        StoreUrl::parse_with_env(raw, &no_env)
            .unwrap_or_else(|e| panic!("{raw}: {e}"))
            .pg_targets()
            .cloned()
            .unwrap()
    }

    #[test]
    fn multi_host_urls_list_their_hosts_in_order() {
        let t = pg("postgres://u:pw@h1:5432,h2:5433,h3/db?target_session_attrs=read-write&connect_timeout=3");
        assert_eq!(t.hosts, ["h1:5432", "h2:5433", "h3"]);
        assert_eq!(t.attrs, TargetSessionAttrs::ReadWrite);
        assert_eq!(t.attrs_from, "the URL");
        assert_eq!(t.connect_timeout, Some(std::time::Duration::from_secs(3)));
        assert!(!t.is_plain());
        let t = pg("postgresql://[::1]:5432,127.0.0.1:5433/db");
        assert_eq!(t.hosts, ["[::1]:5432", "127.0.0.1:5433"]);
        assert_eq!(
            (t.attrs, t.attrs_from, t.connect_timeout),
            (TargetSessionAttrs::Any, "the default", None)
        );
        let t = pg("postgres://u@db.internal/x");
        assert_eq!(t.hosts, ["db.internal"]);
        assert!(t.is_plain());
        assert!(!pg("postgres://u@db/x?target_session_attrs=primary").is_plain());
    }

    #[test]
    fn each_host_alone_goes_to_the_driver_without_fencecrons_own_parameters() {
        let u = StoreUrl::parse_with_env(
            "postgres://u:p%40ss@h1:5432,[::1]:5433,h3/db?sslmode=require&target_session_attrs=primary&connect_timeout=2",
            &no_env,
        )
        .unwrap();
        assert_eq!(
            u.driver_url(0),
            "postgres://u:p%40ss@h1:5432/db?sslmode=require"
        );
        assert_eq!(
            u.driver_url(1),
            "postgres://u:p%40ss@[::1]:5433/db?sslmode=require"
        );
        assert_eq!(u.driver_url(2), "postgres://u:p%40ss@h3/db?sslmode=require");
        assert_eq!(u.host_url(2), "postgres://u:***@h3/db?sslmode=require");
        let one = StoreUrl::parse_with_env("postgres://u@h/db?connect_timeout=5", &no_env).unwrap();
        assert_eq!(one.driver_url(0), "postgres://u@h/db");
        let plain = StoreUrl::parse_with_env("postgres://u@h/db?sslmode=disable", &no_env).unwrap();
        assert_eq!(plain.driver_url(0), "postgres://u@h/db?sslmode=disable");
    }

    #[test]
    fn every_target_session_attrs_value_and_a_wrong_one() {
        for a in TargetSessionAttrs::ALL {
            let t = pg(&format!("postgres://h1,h2/db?target_session_attrs={a}"));
            assert_eq!(t.attrs, a);
            assert_eq!(TargetSessionAttrs::parse(a.as_str()), Ok(a));
        }
        let e = StoreUrl::parse_with_env(
            "postgres://u:hunter2@h1,h2/db?target_session_attrs=master",
            &no_env,
        )
        .unwrap_err();
        assert!(
            e.contains("`master`")
                && e.contains("any, read-write, read-only, primary, standby, prefer-standby"),
            "{e}"
        );
        assert!(!e.contains("hunter2") && e.contains("u:***@h1,h2"), "{e}");
        // What each accepts: (standby, read_only).
        use TargetSessionAttrs::*;
        assert!(ReadWrite.accepts(false, false) && !ReadWrite.accepts(true, true));
        assert!(
            !ReadWrite.accepts(false, true),
            "a read-only primary is not read-write"
        );
        assert!(ReadOnly.accepts(true, true) && ReadOnly.accepts(false, true));
        assert!(Primary.accepts(false, true) && !Primary.accepts(true, true));
        assert!(Standby.accepts(true, true) && !Standby.accepts(false, false));
        assert!(Any.accepts(true, true) && PreferStandby.accepts(false, false));
    }

    #[test]
    fn the_environment_gives_what_the_url_does_not_say() {
        let env = |name: &str| match name {
            "PGTARGETSESSIONATTRS" => Some("primary".to_string()),
            "PGCONNECT_TIMEOUT" => Some("1".to_string()),
            _ => None,
        };
        let t = StoreUrl::parse_with_env("postgres://h1,h2/db", &env).unwrap();
        let t = t.pg_targets().unwrap();
        assert_eq!(
            (t.attrs, t.attrs_from),
            (TargetSessionAttrs::Primary, "PGTARGETSESSIONATTRS")
        );
        // libpq: a timeout of 1 second means 2.
        assert_eq!(t.connect_timeout, Some(std::time::Duration::from_secs(2)));
        let t = StoreUrl::parse_with_env(
            "postgres://h1,h2/db?target_session_attrs=any&connect_timeout=0",
            &env,
        )
        .unwrap();
        let t = t.pg_targets().unwrap();
        assert_eq!(
            (t.attrs, t.attrs_from),
            (TargetSessionAttrs::Any, "the URL")
        );
        assert_eq!(t.connect_timeout, None);
        let bad = |name: &str| (name == "PGTARGETSESSIONATTRS").then(|| "rw".to_string());
        let e = StoreUrl::parse_with_env("postgres://h1,h2/db", &bad).unwrap_err();
        assert!(
            e.contains("PGTARGETSESSIONATTRS") && e.contains("read-write"),
            "{e}"
        );
        // Not read for other backends.
        assert!(StoreUrl::parse_with_env("mysql://root@h/db", &bad).is_ok());
        // Nor are several hosts.
        let e = StoreUrl::parse_with_env("mysql://root@h1:3306,h2:3306/db", &no_env).unwrap_err();
        assert!(e.contains("not a valid URL"), "{e}");
    }

    #[test]
    fn a_wrong_host_in_the_list_is_named() {
        let e =
            StoreUrl::parse_with_env("postgres://u:pw@h1:5432,h2:54x3/db", &no_env).unwrap_err();
        assert!(
            e.contains("`h2:54x3`") && e.contains("number 2") && !e.contains("pw@"),
            "{e}"
        );
        let e = StoreUrl::parse_with_env("postgres://h1,,h3/db", &no_env).unwrap_err();
        assert!(e.contains("empty host"), "{e}");
        let e = StoreUrl::parse_with_env("postgres:///db?host=h1,h2", &no_env).unwrap_err();
        assert!(e.contains("host part"), "{e}");
        let e = StoreUrl::parse_with_env("postgres://h1,h2/db?connect_timeout=soon", &no_env)
            .unwrap_err();
        assert!(e.contains("connect_timeout `soon`"), "{e}");
    }

    #[test]
    fn multi_host_urls_print_without_their_passwords() {
        for raw in [
            "postgres://u:hunter2@h1:5432,h2:5433/db",
            "postgres://u@h1,h2/db?password=hunter2&target_session_attrs=read-write",
            "postgresql://u:hunter2@[::1]:5432,h2/db?sslmode=disable",
        ] {
            let u = StoreUrl::parse_with_env(raw, &no_env).unwrap();
            for shown in [u.to_string(), format!("{u:?}"), redact(raw), u.host_url(1)] {
                assert!(!shown.contains("hunter2"), "{raw} -> {shown}");
                assert!(shown.contains("***"), "{raw} -> {shown}");
            }
            assert!(u.to_string().contains("h2"), "{u}");
        }
        assert_eq!(
            redact("postgres://u:pw@h1:5432,h2:5433/db?target_session_attrs=primary"),
            "postgres://u:***@h1:5432,h2:5433/db?target_session_attrs=primary"
        );
    }
}

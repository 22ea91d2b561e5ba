//! A PostgreSQL URL's host list and `target_session_attrs`: which hosts a
//! multi-host URL names, in order, and which session each must offer.

use super::*;

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
pub(super) const PG_OWN_PARAMS: [&str; 2] = ["target_session_attrs", "connect_timeout"];

/// A placeholder for a multi-host list while the url crate reads the rest
/// of the URL (it accepts one host only).
pub(super) const HOSTS_PLACEHOLDER: &str = "fencecron-host-list.invalid";

/// Where the host list of `raw` is: the byte range of the authority's
/// host part (after any `user:password@`, before the path or query), if it
/// names several hosts (`h1,h2`).
pub(super) fn host_list_range(raw: &str) -> Option<std::ops::Range<usize>> {
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

/// Splits a host list at its commas (not inside `[…]`).
pub(super) fn split_hosts(list: &str) -> Vec<&str> {
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
pub(super) fn pg_targets(
    raw: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PgTargets, String> {
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

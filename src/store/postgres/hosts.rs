//! Multi-host PostgreSQL URLs (`postgres://h1:5432,h2:5433/db`) with
//! libpq's rule: every new connection tries the hosts in the URL's order
//! and keeps the first whose session qualifies under
//! `target_session_attrs` ([`TargetSessionAttrs`]).
//!
//! sqlx's pool opens every connection to the one host of its connect
//! options, and lets code in only once a connection is open. So:
//!
//! - the pool's connect options name the *anchor*, the host the last walk
//!   chose (the first host at the start);
//! - every connection the pool opens is settled at once (`after_connect`):
//!   the hosts before the anchor are tried first, each with a connection of
//!   its own under `connect_timeout`, then the pool's connection is checked
//!   in the anchor's turn, then the hosts after it; the first that
//!   qualifies replaces the pool's connection and becomes the anchor. The
//!   outcome is libpq's: the first host in order that answers and
//!   qualifies. None: the connection fails with every host's reason
//!   ([`NoHost`]);
//! - a call still waiting after [`PROBE_AFTER`] may be waiting on a pool
//!   that retries an anchor that no longer answers, where sqlx lets no code
//!   in: the hosts are walked beside it and the anchor moved, which the
//!   pool's next attempt reads ([`Hosts::look`]);
//! - a write refused as read-only (SQLSTATE 25006: the server became a
//!   standby, or read-only) retires every pooled connection opened before
//!   it (`before_acquire`, no round trip), so the next calls walk again;
//! - a call that failed to reach its server (an I/O or protocol error: an
//!   address that accepts and then closes, as a proxy in front of a dead
//!   server does, fails at once, which the pool does not retry) makes the
//!   next call walk the hosts before it runs ([`Hosts::saw`]).
//!
//! A URL with one host and `any` (the default) needs none of this: the
//! pool connects as before ([`Hosts::new`] gives `None`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::pool::{PoolConnection, PoolOptions};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgSslMode};
use sqlx::{ConnectOptions, Connection, PgPool, Postgres};

use super::super::diagnose::PROBE_AFTER;
use super::super::{unavailable, StoreError, StoreUrl, TargetSessionAttrs};
use super::loopback_without_ssl_choice;

/// No host of a URL gave a session that qualifies: each host's reason, in
/// the URL's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NoHost {
    pub attrs: TargetSessionAttrs,
    /// Where `attrs` came from (the URL, `PGTARGETSESSIONATTRS`, the
    /// default).
    pub attrs_from: &'static str,
    /// `host:port: why`, one per attempt.
    pub tried: Vec<String>,
}

impl std::fmt::Display for NoHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.attrs == TargetSessionAttrs::Any {
            write!(f, "no host answered: {}", self.tried.join("; "))
        } else {
            write!(
                f,
                "no host gave a session that target_session_attrs={} accepts (from {}): {}",
                self.attrs,
                self.attrs_from,
                self.tried.join("; ")
            )
        }
    }
}

impl std::error::Error for NoHost {}

impl NoHost {
    /// As the driver error it travels as: a failure to connect.
    pub(crate) fn into_sqlx(self) -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::other(self))
    }

    /// The `NoHost` inside a driver error, if that is what it is.
    pub(crate) fn of(e: &sqlx::Error) -> Option<&NoHost> {
        match e {
            sqlx::Error::Io(io) => io.get_ref()?.downcast_ref::<NoHost>(),
            _ => None,
        }
    }

    /// The message for [`StoreError::Unavailable`]: each host's reason and
    /// what to do.
    pub(crate) fn message(&self, url: &str) -> String {
        let advice = if self.attrs == TargetSessionAttrs::Any {
            "start a server at one of them or correct the hosts in the store URL".to_string()
        } else {
            format!(
                "check that one of the listed servers qualifies as {} (after a failover: that the standby was promoted, and that the URL lists it) or choose another target_session_attrs",
                self.attrs
            )
        };
        format!("the PostgreSQL store {url} has no usable host, {self}; {advice}")
    }
}

/// The hosts of one multi-host URL, the anchor, and what the last walk
/// found. Shared by the pool's callbacks and the store.
pub(crate) struct Hosts {
    /// `host:port` of each, for messages.
    names: Vec<String>,
    options: Vec<PgConnectOptions>,
    attrs: TargetSessionAttrs,
    attrs_from: &'static str,
    /// How long each host may take to give a session.
    connect_timeout: Duration,
    /// The host new connections are opened to first.
    anchor: AtomicUsize,
    /// The anchor the pool's connect options name.
    given: AtomicUsize,
    /// Pooled connections opened at or before this are not used again.
    retired_before: Mutex<Option<Instant>>,
    /// The last walk's failure, when the last walk failed.
    failure: Mutex<Option<(Instant, NoHost)>>,
    /// One walk beside the pool at a time.
    looking: tokio::sync::Mutex<()>,
    /// How long a walk's failure explains a failed call.
    recent: Duration,
    /// A call failed to reach its server: the next call walks first.
    walk_next: AtomicBool,
}

impl Hosts {
    /// The hosts of `url`, or `None` for a URL with one host and `any`.
    /// Without `connect_timeout`, each host of a walk gets an equal share
    /// of `call_timeout`.
    pub(crate) fn new(
        url: &StoreUrl,
        application_name: &str,
        call_timeout: Duration,
    ) -> Result<Option<Arc<Hosts>>, StoreError> {
        let Some(targets) = url.pg_targets().filter(|t| !t.is_plain()) else {
            return Ok(None);
        };
        let env_chose = std::env::var_os("PGSSLMODE").is_some();
        let mut options = Vec::with_capacity(targets.hosts.len());
        for i in 0..targets.hosts.len() {
            options.push(host_options(url, i, application_name, env_chose)?);
        }
        let names = options
            .iter()
            .zip(&targets.hosts)
            .map(|(o, written)| match o.get_socket() {
                Some(s) if written.is_empty() => s.display().to_string(),
                _ if o.get_host().contains(':') && !o.get_host().starts_with('[') => {
                    format!("[{}]:{}", o.get_host(), o.get_port())
                }
                _ => format!("{}:{}", o.get_host(), o.get_port()),
            })
            .collect();
        let n = u32::try_from(targets.hosts.len()).unwrap_or(u32::MAX);
        Ok(Some(Arc::new(Hosts {
            names,
            options,
            attrs: targets.attrs,
            attrs_from: targets.attrs_from,
            connect_timeout: targets
                .connect_timeout
                .unwrap_or_else(|| (call_timeout / n).max(Duration::from_millis(100))),
            anchor: AtomicUsize::new(0),
            given: AtomicUsize::new(0),
            retired_before: Mutex::new(None),
            failure: Mutex::new(None),
            looking: tokio::sync::Mutex::new(()),
            recent: call_timeout * 2,
            walk_next: AtomicBool::new(false),
        })))
    }

    /// The connect options of the first host: the pool's at the start.
    pub(crate) fn first_options(&self) -> PgConnectOptions {
        self.options[0].clone()
    }

    /// `host:port` of the host new connections go to first now.
    pub(crate) fn current(&self) -> &str {
        &self.names[self.anchor.load(Ordering::Relaxed)]
    }

    /// The pool options with the walk on every new connection and the
    /// retirement of connections to a server that refused a write.
    pub(crate) fn pool_options(
        self: &Arc<Self>,
        pool: PoolOptions<Postgres>,
    ) -> PoolOptions<Postgres> {
        let settle = Arc::clone(self);
        let retire = Arc::clone(self);
        pool.after_connect(move |conn, _| {
            let hosts = Arc::clone(&settle);
            Box::pin(async move { hosts.settle(conn).await })
        })
        .before_acquire(move |_, meta| {
            let keep = !retire.is_retired(meta.age);
            Box::pin(async move { Ok(keep) })
        })
    }

    /// Gives the pool the anchor's connect options if it changed.
    pub(crate) fn sync(&self, pool: &PgPool) {
        let anchor = self.anchor.load(Ordering::Relaxed);
        if self.given.swap(anchor, Ordering::Relaxed) != anchor {
            pool.set_connect_options(self.options[anchor].clone());
        }
    }

    /// Notes what a call's driver error says about its server: a write
    /// refused as read-only retires the pooled connections; a connection
    /// that failed at the I/O or protocol level makes the next call walk
    /// the hosts first ([`watched`]). The pool retries only a refused
    /// connection: an address that accepts and then closes or resets
    /// (a proxy, load balancer or pooler in front of a dead server) fails
    /// each call at once, before the walk beside a slow call would start,
    /// and the pool would go on opening connections to it.
    pub(crate) fn saw(&self, e: &sqlx::Error) {
        match e {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("25006") => {
                *self
                    .retired_before
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            }
            sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::Tls(_) => {
                self.walk_next.store(true, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// The last walk's failure, if it failed recently: what a call that
    /// could not connect failed of.
    pub(crate) fn recent_failure(&self) -> Option<NoHost> {
        let failure = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        failure
            .as_ref()
            .filter(|(at, _)| at.elapsed() < self.recent)
            .map(|(_, no)| no.clone())
    }

    /// Whether a pooled connection of this age was opened when (or
    /// before) a write was refused as read-only.
    fn is_retired(&self, age: Duration) -> bool {
        let retired = *self
            .retired_before
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        retired.is_some_and(|at| {
            Instant::now()
                .checked_sub(age)
                .is_none_or(|opened| opened <= at)
        })
    }

    fn chose(&self, host: usize) {
        self.anchor.store(host, Ordering::Relaxed);
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn failed(&self, no: &NoHost) {
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), no.clone()));
    }

    /// `after_connect`: the pool's new connection (to the anchor it was
    /// given) is kept, or replaced by one to an earlier or later host, as
    /// the walk decides.
    async fn settle(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        // The host the pool was given (a connection does not say which
        // host it reached). Should the anchor move while the pool connects,
        // the connection is taken for the new anchor's: its session is
        // still checked, only the order may be off for that connection.
        let at = self.given.load(Ordering::Relaxed);
        match self.walk(Some((at, &mut *conn))).await {
            Ok(None) => {
                self.chose(at);
                Ok(())
            }
            Ok(Some((host, better))) => {
                let old = std::mem::replace(conn, better);
                let _ = old.close().await;
                self.chose(host);
                Ok(())
            }
            Err(no) => {
                self.failed(&no);
                Err(no.into_sqlx())
            }
        }
    }

    /// Walks the hosts beside a call that waits, and moves the anchor to
    /// the first that qualifies (the pool's next attempt reads it): whether
    /// that is another host than the pool was given. One walk at a time: a
    /// call that finds one under way does not add its own. Its error: no
    /// host qualifies.
    pub(crate) async fn look(&self, pool: &PgPool) -> Result<bool, NoHost> {
        let Ok(_one) = self.looking.try_lock() else {
            return Ok(false);
        };
        match self.walk(None).await {
            Ok(found) => {
                let Some((host, conn)) = found else {
                    return Ok(false);
                };
                let _ = conn.close().await;
                self.chose(host);
                let moved = self.given.load(Ordering::Relaxed) != host;
                self.sync(pool);
                Ok(moved)
            }
            Err(no) => {
                self.failed(&no);
                Err(no)
            }
        }
    }

    /// libpq's walk: each host in order, the first whose session qualifies.
    /// `open` is a connection already open to one of the hosts (the pool's
    /// new one), checked in that host's turn instead of a new one: `None`
    /// means it qualifies. `prefer-standby` walks twice, for a standby and
    /// then for any server, without trying again a host that did not
    /// answer.
    async fn walk(
        &self,
        mut open: Option<(usize, &mut PgConnection)>,
    ) -> Result<Option<(usize, PgConnection)>, NoHost> {
        let passes: &[TargetSessionAttrs] = match self.attrs {
            TargetSessionAttrs::PreferStandby => {
                &[TargetSessionAttrs::Standby, TargetSessionAttrs::Any]
            }
            ref one => std::slice::from_ref(one),
        };
        let mut tried = Vec::new();
        let mut silent = vec![false; self.options.len()];
        for &pass in passes {
            for (i, options) in self.options.iter().enumerate() {
                if silent[i] {
                    continue;
                }
                let name = &self.names[i];
                if let Some((at, conn)) = open.as_mut().filter(|(at, _)| *at == i) {
                    debug_assert_eq!(*at, i);
                    match qualifies(conn, pass).await {
                        Ok(()) => return Ok(None),
                        Err(why) => tried.push(format!("{name} {why}")),
                    }
                    continue;
                }
                match tokio::time::timeout(self.connect_timeout, options.connect()).await {
                    Err(_) => {
                        silent[i] = true;
                        tried.push(format!(
                            "{name} did not answer within {:?} (connect_timeout)",
                            self.connect_timeout
                        ));
                    }
                    Ok(Err(e)) => {
                        silent[i] = true;
                        tried.push(format!("{name} {}", refusal(&e)));
                    }
                    Ok(Ok(mut conn)) => match qualifies(&mut conn, pass).await {
                        Ok(()) => return Ok(Some((i, conn))),
                        Err(why) => {
                            tried.push(format!("{name} {why}"));
                            let _ = conn.close().await;
                        }
                    },
                }
            }
        }
        Err(NoHost {
            attrs: self.attrs,
            attrs_from: self.attrs_from,
            tried,
        })
    }
}

/// The connect options of host number `host` of `url`, as the store makes
/// them (TLS left out on a loopback host nobody asked TLS for).
pub(crate) fn host_options(
    url: &StoreUrl,
    host: usize,
    application_name: &str,
    env_chose: bool,
) -> Result<PgConnectOptions, StoreError> {
    let raw = url.driver_url(host);
    let c: PgConnectOptions = raw.parse().map_err(|e| unavailable(url, e))?;
    let c = c.application_name(application_name);
    Ok(
        if loopback_without_ssl_choice(&raw, c.get_host(), env_chose) {
            c.ssl_mode(PgSslMode::Disable)
        } else {
            c
        },
    )
}

/// Whether the session on `conn` qualifies as `attrs`: one round trip
/// (none for `any`). The error says why not, after the host's name.
async fn qualifies(conn: &mut PgConnection, attrs: TargetSessionAttrs) -> Result<(), String> {
    if attrs == TargetSessionAttrs::Any {
        return Ok(());
    }
    let (standby, read_only): (bool, bool) = sqlx::query_as(
        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(|e| format!("failed the session check ({e})"))?;
    if attrs.accepts(standby, read_only) {
        return Ok(());
    }
    let is = match (standby, read_only) {
        (true, _) => "is a standby (in recovery)",
        (false, true) => "is read-only (default_transaction_read_only is on)",
        (false, false) => "is a primary that accepts writes",
    };
    Err(format!("{is}, not {attrs}"))
}

/// Why a host refused a connection, after its name: the server's own
/// words for a refused login, the system's for a connection.
fn refusal(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "refused the connection (nothing listens there)".to_string()
        }
        sqlx::Error::Io(io) => format!("could not be reached ({io})"),
        sqlx::Error::Database(db) => format!("refused the login ({})", db.message()),
        other => format!("failed ({other})"),
    }
}

/// The pool's first connection ([`super::super::diagnose::first_connection`]);
/// for a multi-host URL the probe beside the pool is the walk, whose
/// failure (every host's reason) is the answer at once. A first host that
/// refuses at once is walked past too, as libpq walks past any host it
/// cannot connect to.
pub(crate) async fn first_connection(
    hosts: Option<&Hosts>,
    pool: &PgPool,
) -> Result<PoolConnection<Postgres>, sqlx::Error> {
    let Some(hosts) = hosts else {
        return super::super::diagnose::first_connection(pool).await;
    };
    hosts.sync(pool);
    let mut acquire = Box::pin(pool.acquire());
    tokio::select! {
        r = &mut acquire => return match r {
            Ok(conn) => Ok(conn),
            // The host the pool was given refused at once (a replica that
            // has not replayed the database's creation yet, a login it
            // refuses): as libpq does, the next hosts are tried.
            Err(e) => match hosts.look(pool).await {
                Ok(true) => pool.acquire().await,
                Ok(false) => Err(e),
                Err(no) => Err(no.into_sqlx()),
            },
        },
        () = tokio::time::sleep(PROBE_AFTER) => {}
    }
    let look = hosts.look(pool);
    tokio::pin!(look);
    tokio::select! {
        r = &mut acquire => r,
        l = &mut look => match l {
            // The pool's attempt may hang on a host that does not answer
            // (the driver bounds it only by the call's limit): dropped, and
            // made again to the host the walk found.
            Ok(true) => {
                drop(acquire);
                pool.acquire().await
            }
            Ok(false) => acquire.await,
            Err(no) => Err(no.into_sqlx()),
        },
    }
}

/// A call of a multi-host store: the pool given the anchor first, and, if
/// the call still waits after [`PROBE_AFTER`], the hosts walked beside it
/// ([`Hosts::look`]).
pub(crate) async fn watched<T>(
    hosts: &Hosts,
    pool: &PgPool,
    op: impl std::future::Future<Output = T>,
) -> T {
    hosts.sync(pool);
    if hosts.walk_next.swap(false, Ordering::Relaxed) {
        // The last call could not reach its server: the anchor is moved
        // to the first host that qualifies now (or the call fails with
        // every host's reason, [`Hosts::recent_failure`]).
        let _ = hosts.look(pool).await;
    }
    tokio::pin!(op);
    tokio::select! {
        r = &mut op => return r,
        () = tokio::time::sleep(PROBE_AFTER) => {}
    }
    let look = hosts.look(pool);
    tokio::pin!(look);
    tokio::select! {
        r = &mut op => r,
        _ = &mut look => op.await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn one_host_and_any_needs_no_walk() {
        let url = StoreUrl::parse_with_env("postgres://u@h/db", &no_env).unwrap();
        assert!(Hosts::new(&url, "t", Duration::from_secs(10))
            .unwrap()
            .is_none());
        let url =
            StoreUrl::parse_with_env("postgres://u@h/db?target_session_attrs=primary", &no_env)
                .unwrap();
        assert!(Hosts::new(&url, "t", Duration::from_secs(10))
            .unwrap()
            .is_some());
    }

    #[test]
    fn hosts_get_their_own_options_and_a_share_of_the_call_timeout() {
        let url = StoreUrl::parse_with_env(
            "postgres://u:pw@127.0.0.1:5432,db.internal:5433,[::1]/x",
            &no_env,
        )
        .unwrap();
        let h = Hosts::new(&url, "t", Duration::from_secs(9))
            .unwrap()
            .unwrap();
        assert_eq!(
            h.names,
            ["127.0.0.1:5432", "db.internal:5433", "[::1]:5432"]
        );
        assert_eq!(h.connect_timeout, Duration::from_secs(3));
        assert_eq!(h.current(), "127.0.0.1:5432");
        assert_eq!(h.options[1].get_port(), 5433);
        let url =
            StoreUrl::parse_with_env("postgres://h1,h2/x?connect_timeout=4", &no_env).unwrap();
        let h = Hosts::new(&url, "t", Duration::from_secs(9))
            .unwrap()
            .unwrap();
        assert_eq!(h.connect_timeout, Duration::from_secs(4));
    }

    #[test]
    fn a_read_only_refusal_retires_the_connections_opened_before_it() {
        let url = StoreUrl::parse_with_env("postgres://h1,h2/x", &no_env).unwrap();
        let h = Hosts::new(&url, "t", Duration::from_secs(9))
            .unwrap()
            .unwrap();
        assert!(!h.is_retired(Duration::from_secs(5)));
        // Refused a second ago: no wait for the clock to move past it.
        let refused = Instant::now()
            .checked_sub(Duration::from_secs(1))
            .expect("a monotonic clock past 1 s");
        *h.retired_before.lock().unwrap() = Some(refused);
        assert!(
            h.is_retired(Duration::from_secs(5)),
            "opened before: retired"
        );
        assert!(!h.is_retired(Duration::ZERO), "opened after: kept");
    }

    #[test]
    fn no_host_names_each_host_and_what_to_do() {
        let no = NoHost {
            attrs: TargetSessionAttrs::ReadWrite,
            attrs_from: "the URL",
            tried: vec![
                "h1:5432 refused the connection (nothing listens there)".into(),
                "h2:5433 is a standby (in recovery), not read-write".into(),
            ],
        };
        let e = no.clone().into_sqlx();
        assert_eq!(NoHost::of(&e), Some(&no));
        let m = no.message("postgres://u:***@h1:5432,h2:5433/db");
        assert!(
            m.contains("h1:5432 refused") && m.contains("h2:5433 is a standby"),
            "{m}"
        );
        assert!(m.contains("read-write") && m.contains("promoted"), "{m}");
    }
}

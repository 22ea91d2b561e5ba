//! The lease store: one trait, one implementation per backend.
//!
//! Everything that speaks SQL lives below this module. The rest of the crate
//! sees typed outcomes ([`AcquireOutcome`], [`RenewOutcome`], [`PutOutcome`])
//! and never a row. The semantics every backend must share are written once
//! here, in the trait's docs, and proven once against every backend by
//! `tests/store_conformance.rs`:
//!
//! * the fence of a resource only ever grows; release and expiry keep it;
//! * acquiring is one atomic state transition decided by the **store's
//!   clock** (for SQLite, the host kernel's clock read by a direct system
//!   call, so per-process clock fakes cannot skew it);
//! * renew and release match owner id *and* token;
//! * a fenced write is accepted only with the resource's current token
//!   (its fence) and the owner id that token was issued to, and a token not
//!   below the key's accepted one; it checks, writes and records a
//!   rejection in one statement or one transaction;
//! * tokens are `epoch << 32 | counter` (see [`EPOCH_SHIFT`]): a winning
//!   acquire sets the fence to `max(fence + 1, (epoch << 32) + 1)`, the
//!   epoch being read by the acquiring statement itself, so a store that
//!   lost its last commits in a failover still issues tokens above every
//!   earlier one once its epoch moved on;
//! * a winning acquire reports the previous generation when that one
//!   expired without being released ([`Takeover`]); a losing acquire
//!   writes nothing.

mod diagnose;
mod migrator;
mod mysql;
mod postgres;
mod sqlite;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::names::Name;

pub use mysql::MySqlStore;
pub use postgres::PostgresStore;
pub use sqlite::SqliteStore;

/// Shortest lease the store accepts.
pub const MIN_LEASE: Duration = Duration::from_secs(5);
/// Longest lease the store accepts.
pub const MAX_LEASE: Duration = Duration::from_secs(300);

/// A fencing token: the fence value of one ownership generation.
pub type Token = i64;

/// Tokens are `epoch << EPOCH_SHIFT | counter`. With epoch 0 (a database
/// that never failed over and never had its epoch advanced) tokens are
/// 1, 2, 3, …; a later epoch's tokens are above every token of an earlier
/// one, whatever the counter of a resource reached (up to 2^32 − 1
/// acquisitions of one resource per epoch).
pub const EPOCH_SHIFT: u32 = 32;

/// On PostgreSQL the effective epoch is `stored epoch + (timeline − 1) ×
/// TIMELINE_WEIGHT`. A promotion moves a standby to a later timeline, which
/// lifts the epoch by at least this much: above the old primary's epoch even
/// when the standby also missed up to `TIMELINE_WEIGHT − 1` epoch advances
/// (a plain `max(stored, timeline − 1)` would not move at all once the
/// stored epoch is above the timeline). 1024 keeps tokens below 2^53 (exact
/// in a JSON double) up to timeline 2048.
pub const TIMELINE_WEIGHT: i64 = 1024;

/// The lowest token an epoch can issue: `(epoch << 32) + 1`.
pub fn first_token_of(epoch: i64) -> Token {
    epoch.saturating_mul(1 << EPOCH_SHIFT).saturating_add(1)
}

/// A point in time as milliseconds since the Unix epoch, as read from the
/// store's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreTime(pub i64);

impl StoreTime {
    /// The time as a UTC date-time (saturating at the representable range).
    pub fn to_utc(self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.0).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// RFC 3339 UTC with millisecond precision, the format of every time
    /// fencecron prints.
    pub fn rfc3339(self) -> String {
        rfc3339(self.to_utc())
    }

    /// From a UTC date-time.
    pub fn from_utc(t: DateTime<Utc>) -> Self {
        StoreTime(t.timestamp_millis())
    }
}

impl fmt::Display for StoreTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.rfc3339())
    }
}

impl Serialize for StoreTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.rfc3339())
    }
}

/// RFC 3339 in UTC with milliseconds and a `Z` suffix.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

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
    #[error("{}", diagnose::migrate_message(*backend, url, source))]
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

/// The message for [`StoreError::Unavailable`], with advice that fits the
/// cause: a database at its connection limit needs a different fix from one
/// that is down.
fn unavailable_message(url: &str, source: &sqlx::Error) -> String {
    if let Some(m) = diagnose::explain(url, source) {
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

/// What `acquire` is asked to do.
#[derive(Debug, Clone)]
pub struct AcquireRequest<'a> {
    pub resource: &'a Name,
    pub lease: Duration,
    pub node: &'a str,
    /// The owner id to record. A scheduled occurrence uses one id for all of
    /// its attempts on a node, so that a retry recognises a win of an earlier
    /// attempt whose answer it never saw (a call that timed out on the
    /// client after the server committed it) and adopts it instead of
    /// finding its own occurrence "taken". Ad-hoc leases use a fresh one
    /// ([`fresh_owner`]).
    pub owner_id: Uuid,
    /// The scheduled occurrence this acquisition is for: the acquisition is
    /// refused unless it is newer than the last occurrence taken for the
    /// resource and already due by the store's clock. `None` for ad-hoc
    /// leases (`exec`, `lease acquire`).
    pub occurrence: Option<StoreTime>,
    /// The job's next instant after `occurrence`: the acquisition is refused
    /// ([`AcquireOutcome::Superseded`]) once that instant is due by the
    /// store's clock, so a node whose clock runs behind cannot take (and
    /// hold) an instant the fleet has already moved past.
    pub next_occurrence: Option<StoreTime>,
}

/// A lease that this caller holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lease {
    pub resource: String,
    pub owner_id: Uuid,
    pub token: Token,
    /// The expiry the store computed from its own clock.
    pub expires_at: StoreTime,
    /// Set when this acquisition took the lease over from an owner whose
    /// lease expired without being released (it crashed, hung, lost its
    /// network or was killed): that owner may still be running somewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub taken_over: Option<Takeover>,
}

/// The previous generation of a lease that was taken over: it expired by
/// the store's clock and was never released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Takeover {
    /// The vanished owner's id.
    pub owner_id: String,
    /// The node it ran on.
    pub node: String,
    /// Its token.
    pub token: Token,
    /// When its lease expired, by the store's clock.
    pub expired_at: StoreTime,
}

impl Takeover {
    /// From the `prev_*` columns a winning acquire returns: all set after a
    /// takeover, all NULL after a clean hand-over or a first acquisition.
    pub(crate) fn from_columns(
        owner_id: Option<String>,
        node: Option<String>,
        token: Option<Token>,
        expired_at: Option<i64>,
    ) -> Option<Takeover> {
        match (owner_id, node, token, expired_at) {
            (Some(owner_id), Some(node), Some(token), Some(expired_at)) => Some(Takeover {
                owner_id,
                node,
                token,
                expired_at: StoreTime(expired_at),
            }),
            _ => None,
        }
    }
}

/// The store-wide epoch of fencing tokens, as `fencecron epoch` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EpochInfo {
    /// The epoch stored in `fencecron_epoch` (raised by `epoch advance`).
    pub stored: i64,
    /// PostgreSQL's current timeline; `None` on other backends.
    pub timeline: Option<i64>,
    /// The epoch acquisitions use now: `stored` on SQLite and MySQL,
    /// `stored + (timeline − 1) × 1024` on PostgreSQL.
    pub effective: i64,
    /// The lowest token an acquisition can issue now: `(effective << 32) + 1`
    /// (a resource whose fence is already higher continues from its fence).
    pub lowest_token: Token,
    /// The highest token ever issued for any resource, if any.
    pub highest_token: Option<Token>,
}

impl EpochInfo {
    pub(crate) fn new(stored: i64, timeline: Option<i64>, highest_token: Option<Token>) -> Self {
        let effective = match timeline {
            Some(tl) => stored + (tl - 1) * TIMELINE_WEIGHT,
            None => stored,
        };
        EpochInfo {
            stored,
            timeline,
            effective,
            lowest_token: first_token_of(effective),
            highest_token,
        }
    }
}

/// What an acquisition attempt ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The caller owns the lease with a fresh, larger token.
    Acquired(Lease),
    /// Another owner holds an unexpired lease. Owner and node are unknown when
    /// a concurrent acquirer took it during this very call.
    Held {
        owner_id: Option<String>,
        node: Option<String>,
        token: Token,
        expires_at: Option<StoreTime>,
    },
    /// The occurrence was already taken (by this or another instance).
    OccurrenceTaken { last_occurrence: StoreTime },
    /// The occurrence is still in the future by the store's clock: this
    /// host's clock runs ahead. Try again once the store reaches it; taking
    /// it early could let this host take a later instant before the fleet
    /// had a chance at an earlier one.
    NotYetDue { store_now: StoreTime },
    /// The job's next instant is already due by the store's clock: this
    /// occurrence is over for the fleet, and this host's clock runs behind
    /// the store's (by at least `store_now − next_occurrence`). Nothing was
    /// written.
    Superseded { store_now: StoreTime },
}

/// Why a renew or release was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The resource has never been leased.
    Missing,
    /// Another acquisition (owner id and/or token) holds the row now.
    NotOwner {
        current_owner: String,
        current_token: Token,
    },
    /// Still ours by owner and token, but expired by the store's clock
    /// (renew only).
    Expired { expired_at: StoreTime },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Missing => f.write_str("the resource has never been leased"),
            Refusal::NotOwner {
                current_owner,
                current_token,
            } => write!(
                f,
                "the lease now belongs to owner {current_owner} with token {current_token}"
            ),
            Refusal::Expired { expired_at } => {
                write!(f, "the lease expired at {expired_at} by the store's clock")
            }
        }
    }
}

/// The outcome of `renew`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewOutcome {
    Renewed { expires_at: StoreTime },
    Refused(Refusal),
}

/// The outcome of `release`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseOutcome {
    Released,
    Refused(Refusal),
}

/// One row of `lease list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseInfo {
    pub resource: String,
    pub owner_id: String,
    pub node: String,
    pub token: Token,
    pub expires_at: StoreTime,
    pub held: bool,
    pub last_occurrence: Option<StoreTime>,
}

/// A fenced write.
#[derive(Debug, Clone)]
pub struct PutRequest<'a> {
    pub resource: &'a Name,
    pub key: &'a Name,
    pub value: &'a [u8],
    pub token: Token,
    /// The owner id the token was issued to (`Lease::owner_id`); the write
    /// is refused (`WrongOwner`) when the lease row names another.
    pub owner_id: &'a str,
    /// Require a strictly greater token (exactly-once application).
    pub once: bool,
    /// Recorded with a rejection: who tried.
    pub node: &'a str,
    pub job: Option<&'a str>,
    pub stage: &'a str,
    pub operation_id: Uuid,
}

/// Why a write was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// A newer token has been issued for the resource since (and may have
    /// written this key): the caller's generation is over.
    Stale,
    /// The token is larger than any the lease store ever issued for the
    /// resource, or the resource was never leased.
    Forged,
    /// The token is the resource's current one, but it was issued to
    /// another owner id: someone else's token (often another resource's
    /// lease: tokens count per resource, so their numbers overlap).
    WrongOwner,
}

impl RejectReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::Stale => "stale",
            RejectReason::Forged => "forged",
            RejectReason::WrongOwner => "wrong_owner",
        }
    }
}

/// The outcome of a fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    Accepted {
        written_at: StoreTime,
    },
    /// `--once` and the same token already wrote: nothing changed.
    AlreadyApplied,
    /// Refused; the rejection is recorded in the store (same transaction).
    Rejected(Box<StaleRecord>),
}

/// A value read back from the fenced store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredValue {
    pub resource: String,
    pub key: String,
    pub value: Vec<u8>,
    pub token: Token,
    pub owner_id: Option<String>,
    pub written_at: StoreTime,
}

/// What kind of stale-owner record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StaleKind {
    WriteRejected,
    LeaseLost,
    /// A lease that expired without being released was taken over: the
    /// record names the vanished owner (owner_id, token, node) and the new
    /// token (accepted_token).
    LeaseTakenOver,
}

impl StaleKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StaleKind::WriteRejected => "write_rejected",
            StaleKind::LeaseLost => "lease_lost",
            StaleKind::LeaseTakenOver => "lease_taken_over",
        }
    }

    fn parse(s: &str) -> StaleKind {
        match s {
            "lease_lost" => StaleKind::LeaseLost,
            "lease_taken_over" => StaleKind::LeaseTakenOver,
            _ => StaleKind::WriteRejected,
        }
    }
}

/// A stale-owner record as stored and listed by `fencecron stale`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StaleRecord {
    pub at: StoreTime,
    pub kind: StaleKind,
    pub reason: String,
    pub resource: String,
    pub key: Option<String>,
    pub owner_id: Option<String>,
    pub token: Token,
    pub accepted_token: Option<Token>,
    pub node: String,
    pub job: Option<String>,
    pub stage: String,
    pub operation_id: String,
}

/// A stale-owner record to store (the store stamps the time).
#[derive(Debug, Clone)]
pub struct NewStaleRecord<'a> {
    pub kind: StaleKind,
    pub reason: &'a str,
    pub resource: &'a str,
    pub key: Option<&'a str>,
    pub owner_id: Option<&'a str>,
    pub token: Token,
    pub accepted_token: Option<Token>,
    pub node: &'a str,
    pub job: Option<&'a str>,
    pub stage: &'a str,
    pub operation_id: &'a str,
}

/// Raw statements for `fencecron bench`: the same SQL the store sends, so
/// the benchmark can compare the store's cost with the bare floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawOp {
    /// `SELECT 1`.
    Ping,
    /// The winning acquire statement for a free (expired) lease.
    AcquireFree,
    /// The acquire statement against a held lease (loses).
    AcquireHeld,
    Renew,
    Release,
    Put,
    Get,
}

/// The lease store. One implementation per backend; every method is one
/// atomic operation on the store (one statement, or one short transaction
/// where the backend needs it).
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Which backend this is.
    fn backend(&self) -> Backend;

    /// The (redacted) URL, for messages.
    fn url(&self) -> &StoreUrl;

    /// Applies pending migrations. Safe when many processes start at once.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Takes the lease if it is free or expired by the store's clock (and,
    /// with an occurrence, only if that occurrence is newer than the last one
    /// taken, due, and not superseded by `next_occurrence`, all by the
    /// store's clock): creates the row if needed, increments the fence,
    /// records the request's owner id and returns the new token and the
    /// store's expiry. With an occurrence, a row this owner already won for
    /// the same occurrence and has not released is adopted: same token,
    /// expiry extended to at least now + lease.
    async fn acquire(&self, req: &AcquireRequest<'_>) -> Result<AcquireOutcome, StoreError>;

    /// Extends an unexpired lease, keeping the token. Matches owner id and token.
    async fn renew(
        &self,
        resource: &Name,
        owner_id: &str,
        token: Token,
        lease: Duration,
    ) -> Result<RenewOutcome, StoreError>;

    /// Gives the lease up (expires it now), keeping the fence. Matches owner
    /// id and token.
    async fn release(
        &self,
        resource: &Name,
        owner_id: &str,
        token: Token,
    ) -> Result<ReleaseOutcome, StoreError>;

    /// Gives back a lease under which nothing ran, and with it `occurrence`:
    /// like `release`, and if `occurrence` is still the last one taken for
    /// the resource, it becomes takeable again (the last occurrence moves to
    /// just before it), so another node still trying it can run it. Matches
    /// owner id and token; without a token (an acquire whose answer never
    /// came back may have won it), the owner's unreleased win of exactly
    /// this occurrence, if any.
    async fn give_back(
        &self,
        resource: &Name,
        owner_id: &str,
        token: Option<Token>,
        occurrence: StoreTime,
    ) -> Result<ReleaseOutcome, StoreError>;

    /// Every lease ever taken, held or not, ordered by resource.
    async fn list(&self) -> Result<Vec<LeaseInfo>, StoreError>;

    /// A fenced write, accepted only when the token *is* the resource's
    /// fence (the newest token issued for it: no newer generation exists),
    /// the lease row's owner id is `req.owner_id` (the store issued exactly
    /// this token for this resource to exactly this owner; a released or
    /// expired lease keeps both until the next acquisition), and the token
    /// is `>=` (with `once`: `>`) the one the key last accepted. `once` with
    /// the key's own token is `AlreadyApplied`. Anything else is rejected
    /// ([`classify_rejection`] names the reason) and the rejection recorded,
    /// all in one atomic operation.
    async fn put(&self, req: &PutRequest<'_>) -> Result<PutOutcome, StoreError>;

    /// Reads a value and the token that wrote it.
    async fn get(&self, resource: &Name, key: &Name) -> Result<Option<StoredValue>, StoreError>;

    /// Records a stale-owner event that happened outside `put` (a lost lease,
    /// a rejection reported by a job from its own storage).
    async fn record_stale(&self, rec: &NewStaleRecord<'_>) -> Result<StaleRecord, StoreError>;

    /// Stale-owner records at or after `since` (store time), oldest first.
    async fn stale(&self, since: Option<StoreTime>) -> Result<Vec<StaleRecord>, StoreError>;

    /// The store's clock.
    async fn now(&self) -> Result<StoreTime, StoreError>;

    /// The stored and effective epoch of fencing tokens.
    async fn epoch(&self) -> Result<EpochInfo, StoreError>;

    /// Raises the stored epoch, in one transaction, so that the effective
    /// epoch becomes `max(effective, highest fence >> 32) + 1`: every token
    /// issued afterwards, for any resource (also one never leased), is
    /// greater than every token this store, or a primary it replicated from,
    /// could have issued before. For failover hooks.
    async fn advance_epoch(&self) -> Result<EpochInfo, StoreError>;

    /// Sends one raw statement for the benchmark. `resource` must be a
    /// bench resource; `owner_id`/`token` come from a previous
    /// `AcquireFree`. Returns the token for acquire statements.
    async fn raw(
        &self,
        op: RawOp,
        resource: &Name,
        owner_id: &str,
        token: Token,
    ) -> Result<Option<Token>, StoreError>;

    /// Deletes every lease, value and stale record whose resource starts with
    /// `prefix` (the benchmark's own resources only).
    async fn purge_prefix(&self, prefix: &str) -> Result<u64, StoreError>;
}

/// Options for opening a store.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Most connections the pool may open.
    pub max_connections: u32,
    /// Time limit for one store call, including waiting for a connection.
    pub call_timeout: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            max_connections: 4,
            call_timeout: Duration::from_secs(10),
        }
    }
}

/// Opens a store without touching the network: connections are made on
/// first use, so a daemon can start while its database is down.
pub fn open(url: &StoreUrl, opts: &OpenOptions) -> Result<Arc<dyn Store>, StoreError> {
    Ok(match url.backend() {
        Backend::Sqlite => Arc::new(SqliteStore::open(url.clone(), opts)?),
        Backend::Postgres => Arc::new(PostgresStore::open(url.clone(), opts)?),
        Backend::MySql => Arc::new(MySqlStore::open(url.clone(), opts)?),
    })
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
            if is_connection_limit(&e) || diagnose::cause(&url.to_string(), &e).is_some() =>
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

/// Lease length in whole milliseconds, as the SQL takes it.
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Classifies a losing acquisition from the row as the caller's snapshot saw
/// it. Shared by every backend so they report the same reasons.
pub(crate) fn classify_loss(row: LossRow, req: &AcquireRequest<'_>) -> AcquireOutcome {
    if let Some(occ) = req.occurrence {
        if occ.0 > row.now {
            return AcquireOutcome::NotYetDue {
                store_now: StoreTime(row.now),
            };
        }
    }
    if req.next_occurrence.is_some_and(|next| next.0 <= row.now) {
        return AcquireOutcome::Superseded {
            store_now: StoreTime(row.now),
        };
    }
    let occurrence = req.occurrence;
    if let (Some(occ), Some(last)) = (occurrence, row.last_occurrence) {
        if last >= occ.0 {
            return AcquireOutcome::OccurrenceTaken {
                last_occurrence: StoreTime(last),
            };
        }
    }
    if row.expires_at > row.now {
        AcquireOutcome::Held {
            owner_id: Some(row.owner_id),
            node: Some(row.node),
            token: row.fence,
            expires_at: Some(StoreTime(row.expires_at)),
        }
    } else {
        // The snapshot shows a free lease, yet the update did not take it: a
        // concurrent acquirer won between our snapshot and our update. Its
        // owner and token are not known to this caller.
        AcquireOutcome::Held {
            owner_id: None,
            node: None,
            token: row.fence,
            expires_at: None,
        }
    }
}

/// The lease row as a losing acquirer saw it.
pub(crate) struct LossRow {
    pub fence: Token,
    pub owner_id: String,
    pub node: String,
    pub expires_at: i64,
    pub last_occurrence: Option<i64>,
    pub now: i64,
}

/// Classifies a refused renew or release from the row as it is now.
pub(crate) fn classify_refusal(
    row: Option<(String, Token, i64)>,
    owner_id: &str,
    token: Token,
) -> Refusal {
    match row {
        None => Refusal::Missing,
        Some((owner, fence, expires_at)) if owner == owner_id && fence == token => {
            Refusal::Expired {
                expired_at: StoreTime(expires_at),
            }
        }
        Some((owner, fence, _)) => Refusal::NotOwner {
            current_owner: owner,
            current_token: fence,
        },
    }
}

/// A refused write, as recorded: why, and the token it lost to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rejection {
    pub reason: RejectReason,
    /// The record's `accepted_token`: for `Stale` and `WrongOwner` the
    /// resource's current token (its fence, which no accepted token of a
    /// key exceeds), for `Forged` the key's accepted token (if any).
    pub accepted_token: Option<Token>,
}

/// Classifies a refused write from the state the refusing transaction sees:
/// the key's accepted token (if the key exists) and the lease row's fence
/// and owner id (if the resource was ever leased). `None` means the write
/// is "already applied" (`once` with the key's own token by its owner).
/// Shared by every backend so they report the same reasons.
///
/// In order: no lease or a token above the fence is `Forged`; a token
/// below the fence is `Stale` (a newer generation exists, whether or not it
/// wrote this key); the fence's token with another owner id is
/// `WrongOwner`; then the key: a newer accepted token is `Stale`, the same
/// one with `once` is already applied.
pub(crate) fn classify_rejection(
    token: Token,
    owner_id: &str,
    once: bool,
    accepted: Option<Token>,
    lease: Option<(Token, &str)>,
) -> Option<Rejection> {
    let reject = |reason, accepted_token| {
        Some(Rejection {
            reason,
            accepted_token,
        })
    };
    let Some((fence, issued_to)) = lease else {
        return reject(RejectReason::Forged, accepted);
    };
    if token > fence {
        return reject(RejectReason::Forged, accepted);
    }
    if token < fence {
        return reject(RejectReason::Stale, Some(fence));
    }
    if owner_id != issued_to {
        return reject(RejectReason::WrongOwner, Some(fence));
    }
    match accepted {
        Some(a) if a == token && once => None,
        // The key's token never exceeds the fence, and the statement
        // accepts everything else: reached only if the lease changed
        // between the statement and this read. Refused is refused; a newer
        // state than the write saw makes it stale.
        _ => reject(RejectReason::Stale, Some(fence)),
    }
}

/// Row decoding shared by every backend: each backend's SELECTs name their
/// columns the same way, so one function per row shape serves all three.
pub(crate) mod rows {
    use sqlx::{ColumnIndex, Database, Decode, Row, Type};

    use super::{LeaseInfo, StaleKind, StaleRecord, StoreTime, StoredValue};

    fn get<'r, R, T>(r: &'r R, col: &'static str) -> Result<T, sqlx::Error>
    where
        R: Row,
        &'static str: ColumnIndex<R>,
        T: Decode<'r, R::Database> + Type<R::Database>,
    {
        r.try_get(col)
    }

    /// A `lease list` row: resource, owner_id, node, fence, expires_at_ms,
    /// last_occurrence_ms; `now` is the store's clock.
    pub(crate) fn lease_info<'r, R, DB>(r: &'r R, now: i64) -> Result<LeaseInfo, sqlx::Error>
    where
        DB: Database,
        R: Row<Database = DB>,
        &'static str: ColumnIndex<R>,
        i64: Decode<'r, DB> + Type<DB>,
        Option<i64>: Decode<'r, DB> + Type<DB>,
        String: Decode<'r, DB> + Type<DB>,
    {
        let expires_at: i64 = get(r, "expires_at_ms")?;
        Ok(LeaseInfo {
            resource: get(r, "resource")?,
            owner_id: get(r, "owner_id")?,
            node: get(r, "node")?,
            token: get(r, "fence")?,
            expires_at: StoreTime(expires_at),
            held: expires_at > now,
            last_occurrence: get::<_, Option<i64>>(r, "last_occurrence_ms")?.map(StoreTime),
        })
    }

    /// A `stale` row.
    pub(crate) fn stale_record<'r, R, DB>(r: &'r R) -> Result<StaleRecord, sqlx::Error>
    where
        DB: Database,
        R: Row<Database = DB>,
        &'static str: ColumnIndex<R>,
        i64: Decode<'r, DB> + Type<DB>,
        Option<i64>: Decode<'r, DB> + Type<DB>,
        String: Decode<'r, DB> + Type<DB>,
        Option<String>: Decode<'r, DB> + Type<DB>,
    {
        let kind: String = get(r, "kind")?;
        Ok(StaleRecord {
            at: StoreTime(get(r, "at_ms")?),
            kind: StaleKind::parse(&kind),
            reason: get(r, "reason")?,
            resource: get(r, "resource")?,
            key: get(r, "key")?,
            owner_id: get(r, "owner_id")?,
            token: get(r, "token")?,
            accepted_token: get(r, "accepted_token")?,
            node: get(r, "node")?,
            job: get(r, "job")?,
            stage: get(r, "stage")?,
            operation_id: get(r, "operation_id")?,
        })
    }

    /// A `get` row (value, token, owner_id, written_at_ms) for a known
    /// resource and key.
    pub(crate) fn stored_value<'r, R, DB>(
        r: &'r R,
        resource: &str,
        key: &str,
    ) -> Result<StoredValue, sqlx::Error>
    where
        DB: Database,
        R: Row<Database = DB>,
        &'static str: ColumnIndex<R>,
        i64: Decode<'r, DB> + Type<DB>,
        Vec<u8>: Decode<'r, DB> + Type<DB>,
        Option<String>: Decode<'r, DB> + Type<DB>,
    {
        Ok(StoredValue {
            resource: resource.to_string(),
            key: key.to_string(),
            value: get(r, "value")?,
            token: get(r, "token")?,
            owner_id: get(r, "owner_id")?,
            written_at: StoreTime(get(r, "written_at_ms")?),
        })
    }
}

/// A new owner id for one acquisition (or one occurrence on one node).
pub fn fresh_owner() -> Uuid {
    Uuid::new_v4()
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

    #[test]
    fn rejection_reasons() {
        let rej = |reason, accepted_token| {
            Some(Rejection {
                reason,
                accepted_token,
            })
        };
        let (me, other) = ("owner-a", "owner-b");
        // Never leased, or above the fence: forged, naming the key's token.
        assert_eq!(
            classify_rejection(1, me, false, None, None),
            rej(RejectReason::Forged, None)
        );
        assert_eq!(
            classify_rejection(10, me, false, Some(6), Some((9, me))),
            rej(RejectReason::Forged, Some(6))
        );
        // Below the fence: stale, naming the current token, whether or not
        // the key was written since (and whoever holds the fence).
        assert_eq!(
            classify_rejection(5, me, false, Some(6), Some((9, me))),
            rej(RejectReason::Stale, Some(9))
        );
        assert_eq!(
            classify_rejection(5, me, false, None, Some((9, other))),
            rej(RejectReason::Stale, Some(9))
        );
        assert_eq!(
            classify_rejection(5, me, true, Some(5), Some((9, other))),
            rej(RejectReason::Stale, Some(9))
        );
        // The fence's token, issued to someone else.
        assert_eq!(
            classify_rejection(9, me, false, None, Some((9, other))),
            rej(RejectReason::WrongOwner, Some(9))
        );
        assert_eq!(
            classify_rejection(9, me, true, Some(9), Some((9, other))),
            rej(RejectReason::WrongOwner, Some(9))
        );
        // The owner's own token again with `once`: already applied.
        assert_eq!(
            classify_rejection(9, me, true, Some(9), Some((9, me))),
            None
        );
    }

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

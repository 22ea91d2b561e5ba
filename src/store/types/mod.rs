//! What the store is asked and what it answers: tokens, store time, the
//! requests, outcomes and records every backend shares.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use uuid::Uuid;

// Why a write was refused is a stored word too: it lives with the others.
pub(crate) use crate::domain::RejectReason;
use crate::domain::{NodeState, RunOutcome, RunState, Stage, StaleReason, TriggerState};
use crate::names::Name;

/// Shortest lease the store accepts.
pub(crate) const MIN_LEASE: Duration = Duration::from_secs(5);
/// Longest lease the store accepts.
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(300);

/// A fencing token: the fence value of one ownership generation.
pub type Token = i64;

/// Tokens are `epoch << EPOCH_SHIFT | counter`. With epoch 0 (a database
/// that never failed over and never had its epoch advanced) tokens are
/// 1, 2, 3, …; a later epoch's tokens are above every token of an earlier
/// one, whatever the counter of a resource reached (up to 2^32 − 1
/// acquisitions of one resource per epoch).
pub(crate) const EPOCH_SHIFT: u32 = 32;

/// On PostgreSQL the effective epoch is `stored epoch + (timeline − 1) ×
/// TIMELINE_WEIGHT`. A promotion moves a standby to a later timeline, which
/// lifts the epoch by at least this much: above the old primary's epoch even
/// when the standby also missed up to `TIMELINE_WEIGHT − 1` epoch advances
/// (a plain `max(stored, timeline − 1)` would not move at all once the
/// stored epoch is above the timeline). 1024 keeps tokens below 2^53 (exact
/// in a JSON double) up to timeline 2048.
pub(crate) const TIMELINE_WEIGHT: i64 = 1024;

/// The lowest token an epoch can issue: `(epoch << 32) + 1`.
pub(crate) fn first_token_of(epoch: i64) -> Token {
    epoch.saturating_mul(1 << EPOCH_SHIFT).saturating_add(1)
}

/// A point in time as milliseconds since the Unix epoch, as read from the
/// store's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreTime(pub i64);

impl StoreTime {
    /// The time as a UTC date-time (saturating at the representable range).
    pub(crate) fn to_utc(self) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(self.0).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    /// RFC 3339 UTC with millisecond precision, the format of every time
    /// fencecron prints.
    pub(crate) fn rfc3339(self) -> String {
        rfc3339(self.to_utc())
    }

    /// From a UTC date-time.
    pub(crate) fn from_utc(t: DateTime<Utc>) -> Self {
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

/// The RFC 3339 text [`Serialize`] writes (any offset is taken).
impl<'de> serde::Deserialize<'de> for StoreTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        text.parse::<DateTime<Utc>>()
            .map(StoreTime::from_utc)
            .map_err(serde::de::Error::custom)
    }
}

/// RFC 3339 in UTC with milliseconds and a `Z` suffix.
pub(crate) fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Lease length in whole milliseconds, as the SQL takes it.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
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
    /// ([`OwnerId::fresh`]).
    pub owner_id: OwnerId,
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
    /// The job run this acquisition is for, if any: a winning acquire
    /// records it in the run history in the same atomic operation (a losing
    /// one writes nothing), and a scheduled acquire (`occurrence` set) of a
    /// paused job wins nothing ([`AcquireOutcome::Paused`]). `None` for
    /// ad-hoc leases.
    pub run: Option<RunStart<'a>>,
}

/// A win this owner may have made of `occurrence` without seeing the
/// answer (an acquire or claim that went unanswered): what
/// [`super::Store::give_back_unseen`] looks for.
#[derive(Debug, Clone, Copy)]
pub struct Unseen<'a> {
    pub(crate) resource: &'a Name,
    pub(crate) owner_id: OwnerId,
    pub(crate) occurrence: StoreTime,
}

/// One scheduled occurrence in a batch claim ([`Store::claim`]): what an
/// [`AcquireRequest`] for it would say, the run being recorded as
/// `schedule`.
#[derive(Debug, Clone)]
pub(crate) struct ClaimItem<'a> {
    pub(crate) resource: &'a Name,
    pub(crate) job: &'a str,
    pub(crate) owner_id: OwnerId,
    pub(crate) lease: Duration,
    pub(crate) occurrence: StoreTime,
    pub(crate) next_occurrence: Option<StoreTime>,
}

impl<'a> ClaimItem<'a> {
    /// The single acquire this item stands for.
    pub(crate) fn as_acquire(&self, node: &'a str) -> AcquireRequest<'a> {
        AcquireRequest {
            resource: self.resource,
            lease: self.lease,
            node,
            owner_id: self.owner_id,
            occurrence: Some(self.occurrence),
            next_occurrence: self.next_occurrence,
            run: Some(RunStart {
                job: self.job,
                started_by: StartedBy::Schedule,
                scheduled_at: Some(self.occurrence),
            }),
        }
    }
}

/// A batch claim: this node's scheduled occurrences, in the order it tries
/// them.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    pub(crate) node: &'a str,
    pub(crate) items: &'a [ClaimItem<'a>],
    /// The most occurrences to win (this node's free capacity).
    pub(crate) limit: usize,
    /// Also bound the wins by this node's share of the live nodes
    /// ([`ClaimOutcome::limit`]); `false` for a second round that takes
    /// what the others left.
    pub(crate) share: bool,
}

/// What a batch claim did for one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claimed {
    /// Won, exactly as a winning [`Store::acquire`] (run recorded),
    /// including a resource never leased before, whose row the claim
    /// created as the acquire's first acquisition would.
    Won(Lease),
    /// Lost to a holder or an earlier taker, as a losing acquire reports it
    /// (`Held` with an owner, `OccurrenceTaken`).
    Lost(AcquireOutcome),
    /// Takeable by the statement's snapshot, not won: another claimer had
    /// the row locked (or took it meanwhile), or this claim reached its
    /// limit first (a row it could have created included).
    Skipped,
    /// Not decided by the claim (paused, not yet due or superseded by the
    /// store's clock, or a new row another caller created while this claim
    /// ran): the single acquire decides it.
    Ask,
}

impl Claimed {
    /// An item the claim did not win, from how a losing acquire of it is
    /// classified ([`super::classify_loss`]).
    pub(crate) fn from_loss(outcome: AcquireOutcome) -> Claimed {
        match outcome {
            // The snapshot showed the lease free: locked by another caller,
            // taken meanwhile, or past the claim's limit.
            AcquireOutcome::LostRace => Claimed::Skipped,
            AcquireOutcome::NotYetDue { .. } | AcquireOutcome::Superseded { .. } => Claimed::Ask,
            AcquireOutcome::Paused { .. } => Claimed::Ask,
            lost => Claimed::Lost(lost),
        }
    }
}

/// The answer of a batch claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimOutcome {
    /// One per item, in the request's order.
    pub(crate) items: Vec<Claimed>,
    /// The limit the claim applied: the request's, or with `share` at most
    /// `ceil(items / live nodes) + 1` ([`NodeInfo::live`]), less the places
    /// spent on new rows another caller created first (so that a claim
    /// that stopped at its limit still [`left_some`](Self::left_some)).
    pub(crate) limit: usize,
}

impl ClaimOutcome {
    /// The claim stopped at its limit while items it skipped may still be
    /// free: someone should look at them again.
    pub(crate) fn left_some(&self) -> bool {
        let won = self
            .items
            .iter()
            .filter(|c| matches!(c, Claimed::Won(_)))
            .count();
        won >= self.limit && self.items.contains(&Claimed::Skipped)
    }
}

/// A node is live while its row in `fencecron_nodes` was refreshed within
/// this long by the store's clock and it did not say it stopped
/// ([`NodeInfo::live`]): three missed heartbeats ([`HEARTBEAT`]). The one
/// definition of "live": the claim's share, `fencecron nodes`, `status` and
/// the drift check all count the same nodes. A claim also refreshes its
/// node's mark, at most every [`NODE_BEAT`].
pub(crate) const NODE_LIVE: Duration = Duration::from_secs(15);

/// How often a daemon refreshes its row in `fencecron_nodes`: one small
/// statement per node every 5 s (the upsert, which reads the store's clock
/// and answers the live nodes; [`super::Store::beat`]), whatever the number
/// of jobs.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(5);

/// A node's row is deleted (with its published job definitions) once it
/// was last seen this long ago.
pub(crate) const NODE_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// What a daemon's heartbeat writes into its row of `fencecron_nodes`.
#[derive(Debug, Clone)]
pub struct NodeBeat<'a> {
    pub(crate) node: &'a str,
    pub(crate) hostname: &'a str,
    pub(crate) pid: u32,
    pub(crate) version: &'a str,
    /// A digest of the whole job set (`fleet::config_digest`).
    pub(crate) config_digest: &'a str,
    /// When this process registered (store time); `None` on its first
    /// beat: the beat's own time.
    pub(crate) started_at: Option<StoreTime>,
    pub(crate) state: NodeState,
    /// Runs it holds now.
    pub(crate) running: u32,
}

/// A row of `fencecron_nodes`. A row written only by the batch claim of an
/// older release has empty texts and zeros.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub(crate) node: String,
    pub(crate) hostname: String,
    pub(crate) pid: i64,
    pub(crate) version: String,
    pub(crate) config_digest: String,
    pub(crate) started_at: StoreTime,
    pub(crate) last_seen: StoreTime,
    /// As stored.
    pub(crate) state: NodeState,
    pub(crate) running: i64,
}

impl NodeInfo {
    /// Live at `now` (store time): seen within [`NODE_LIVE`] and not
    /// stopped.
    pub(crate) fn live(&self, now: StoreTime) -> bool {
        self.state != NodeState::Stopped && self.last_seen.0 > now.0 - millis(NODE_LIVE)
    }

    /// The state shown: the stored one while live, else `gone`.
    pub(crate) fn shown_state(&self, now: StoreTime) -> &str {
        if self.live(now) {
            self.state.as_str()
        } else {
            NodeState::GONE
        }
    }
}

/// What a heartbeat answers ([`super::Store::beat`]): the store's time the
/// row was written with, and the node rows live at that time
/// ([`NodeInfo::live`]; the beating node's own among them unless it said
/// `stopped`), by node id: what the drift check reads, with the beat, in
/// one statement on PostgreSQL and MySQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BeatAnswer {
    pub(crate) now: StoreTime,
    pub(crate) live: Vec<NodeInfo>,
}

/// One job definition a node published (`fencecron_node_jobs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedJob {
    pub(crate) node: String,
    pub(crate) job: String,
    /// `fleet::JobDef::digest`.
    pub(crate) digest: String,
    /// The canonical JSON of the definition; read only when asked for.
    pub(crate) definition: Option<String>,
}

/// See [`NODE_LIVE`].
pub(crate) const NODE_BEAT: Duration = Duration::from_secs(10);

/// The run a winning acquire records ([`AcquireRequest::run`]).
#[derive(Debug, Clone, Copy)]
pub struct RunStart<'a> {
    pub(crate) job: &'a str,
    pub(crate) started_by: StartedBy,
    /// The instant the run is for: the occurrence, also for its retries;
    /// `None` for a manual run.
    pub(crate) scheduled_at: Option<StoreTime>,
}

/// How a run was started, as run history names it (`trigger`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StartedBy {
    /// The job's schedule.
    Schedule,
    /// `fencecron trigger`.
    Manual,
    /// A retry of a failed scheduled run.
    Retry,
}

impl StartedBy {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StartedBy::Schedule => "schedule",
            StartedBy::Manual => "manual",
            StartedBy::Retry => "retry",
        }
    }
}

/// A lease that this caller holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lease {
    pub resource: String,
    pub owner_id: OwnerId,
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
    pub(crate) owner_id: OwnerId,
    /// The node it ran on.
    pub(crate) node: String,
    /// Its token.
    pub(crate) token: Token,
    /// When its lease expired, by the store's clock.
    pub(crate) expired_at: StoreTime,
}

impl Takeover {
    /// From the `prev_*` columns a winning acquire returns: all set after a
    /// takeover, all NULL after a clean hand-over or a first acquisition.
    pub(crate) fn from_columns(
        owner_id: Option<OwnerId>,
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
    pub(crate) stored: i64,
    /// PostgreSQL's current timeline; `None` on other backends.
    pub(crate) timeline: Option<i64>,
    /// The epoch acquisitions use now: `stored` on SQLite and MySQL,
    /// `stored + (timeline − 1) × 1024` on PostgreSQL.
    pub(crate) effective: i64,
    /// The lowest token an acquisition can issue now: `(effective << 32) + 1`
    /// (a resource whose fence is already higher continues from its fence).
    pub(crate) lowest_token: Token,
    /// The highest token ever issued for any resource, if any.
    pub(crate) highest_token: Option<Token>,
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
    /// Another owner holds an unexpired lease.
    Held {
        owner_id: OwnerId,
        node: String,
        token: Token,
        expires_at: StoreTime,
    },
    /// The lease was free as this call saw it, yet a concurrent acquirer
    /// took it between that snapshot and this call's update: held, by an
    /// owner (and node and token) this caller cannot know. For a scheduled
    /// occurrence in a fleet, this very occurrence was taken elsewhere.
    LostRace,
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
    /// The job is paused fleet-wide (`fencecron pause`): nothing was won.
    /// `first` is true for exactly one caller per paused instant (the one
    /// that noted the skip in the store), so the skip is logged once.
    Paused {
        note: Option<String>,
        until: Option<StoreTime>,
        first: bool,
    },
}

/// The pause a scheduled acquire found, as the acquiring statement read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PauseSeen {
    pub(crate) note: Option<String>,
    pub(crate) until: Option<i64>,
    pub(crate) first: bool,
}

/// Why a renew or release was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The resource has never been leased.
    Missing,
    /// Another acquisition (owner id and/or token) holds the row now.
    NotOwner {
        current_owner: OwnerId,
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
    pub(crate) resource: String,
    pub(crate) owner_id: OwnerId,
    pub(crate) node: String,
    pub(crate) token: Token,
    pub(crate) expires_at: StoreTime,
    pub(crate) held: bool,
    pub(crate) last_occurrence: Option<StoreTime>,
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
    pub owner_id: OwnerId,
    /// Require a strictly greater token (exactly-once application).
    pub once: bool,
    /// Recorded with a rejection: who tried.
    pub node: &'a str,
    pub job: Option<&'a str>,
    pub stage: Stage,
    pub operation_id: Uuid,
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

/// A request at the fencing proxy (`fencecron proxy`): may a request
/// carrying `token` for `resource` be forwarded?
#[derive(Debug, Clone)]
pub struct AdmitRequest<'a> {
    pub(crate) resource: &'a Name,
    pub(crate) token: Token,
    /// Recorded with a refusal: the proxy's node id.
    pub(crate) node: &'a str,
    pub(crate) operation_id: Uuid,
}

impl AdmitRequest<'_> {
    /// The stale-owner record of this request's refusal.
    pub(crate) fn record<'r>(
        &'r self,
        reason: RejectReason,
        accepted_token: Option<Token>,
        operation_id: &'r str,
    ) -> NewStaleRecord<'r> {
        NewStaleRecord {
            kind: StaleKind::WriteRejected,
            reason: reason.into(),
            resource: self.resource.as_str(),
            // Never the request's path: it may carry credentials.
            key: None,
            owner_id: None,
            token: self.token,
            accepted_token,
            node: self.node,
            job: None,
            stage: Stage::Proxy,
            operation_id,
        }
    }
}

/// What the fencing proxy's check answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmitOutcome {
    /// Forward it: the token was issued for the resource and is the highest
    /// admitted for it (it may have just become so).
    Admitted,
    /// Refused (`stale`: a newer token was admitted, `accepted_token`;
    /// `forged`: the store never issued it, `accepted_token` being the
    /// resource's fence if it has one); the refusal is recorded in the store.
    Refused(Box<StaleRecord>),
}

/// A value read back from the fenced store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredValue {
    pub(crate) resource: String,
    pub(crate) key: String,
    pub(crate) value: Vec<u8>,
    pub(crate) token: Token,
    /// `None` for a value written before owners were recorded with it.
    pub(crate) owner_id: Option<OwnerId>,
    pub(crate) written_at: StoreTime,
}

/// What kind of stale-owner record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StaleKind {
    WriteRejected,
    LeaseLost,
    /// A lease that expired without being released was taken over: the
    /// record names the vanished owner (owner_id, token, node) and the new
    /// token (accepted_token).
    LeaseTakenOver,
}

impl StaleKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StaleKind::WriteRejected => "write_rejected",
            StaleKind::LeaseLost => "lease_lost",
            StaleKind::LeaseTakenOver => "lease_taken_over",
        }
    }

    pub(crate) fn parse(s: &str) -> StaleKind {
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
    pub(crate) at: StoreTime,
    pub(crate) kind: StaleKind,
    pub(crate) reason: StaleReason,
    pub(crate) resource: String,
    pub(crate) key: Option<String>,
    /// The owner the token was issued to, when known: not for a request
    /// at the fencing proxy, which carries a token only.
    pub(crate) owner_id: Option<OwnerId>,
    pub(crate) token: Token,
    pub(crate) accepted_token: Option<Token>,
    pub(crate) node: String,
    pub(crate) job: Option<String>,
    pub(crate) stage: Stage,
    pub(crate) operation_id: String,
}

/// A stale-owner record to store (the store stamps the time).
#[derive(Debug, Clone)]
pub struct NewStaleRecord<'a> {
    pub(crate) kind: StaleKind,
    pub(crate) reason: StaleReason,
    pub(crate) resource: &'a str,
    pub(crate) key: Option<&'a str>,
    pub(crate) owner_id: Option<OwnerId>,
    pub(crate) token: Token,
    pub(crate) accepted_token: Option<Token>,
    pub(crate) node: &'a str,
    pub(crate) job: Option<&'a str>,
    pub(crate) stage: Stage,
    pub(crate) operation_id: &'a str,
}

impl NewStaleRecord<'_> {
    /// The record as stored, stamped with the store's time `at`.
    pub(crate) fn stored(&self, at: i64) -> StaleRecord {
        StaleRecord {
            at: StoreTime(at),
            kind: self.kind,
            reason: self.reason.clone(),
            resource: self.resource.to_string(),
            key: self.key.map(str::to_string),
            owner_id: self.owner_id,
            token: self.token,
            accepted_token: self.accepted_token,
            node: self.node.to_string(),
            job: self.job.map(str::to_string),
            stage: self.stage.clone(),
            operation_id: self.operation_id.to_string(),
        }
    }
}

/// How a run ended, for the run history: one `UPDATE` of the row the
/// winning acquire inserted (matched by resource and token).
#[derive(Debug, Clone)]
pub struct RunEnd<'a> {
    pub(crate) resource: &'a str,
    pub(crate) token: Token,
    pub(crate) outcome: RunOutcome,
    pub(crate) exit_code: Option<i32>,
    /// The signal's name (`SIGKILL`).
    pub(crate) signal: Option<&'a str>,
    /// From the start of the job to its end.
    pub(crate) duration_ms: i64,
    /// From the acquisition to the end: the row's `finished_at` is its
    /// `started_at` (the store's clock at the acquisition) plus this, so the
    /// store stamps no second time and needs no clock of its own here.
    pub(crate) elapsed_ms: i64,
    /// The last bytes of the job's output (stdout and stderr as they came).
    pub(crate) output: &'a str,
}

/// Which runs `runs` lists: newest first.
#[derive(Debug, Clone, Default)]
pub struct RunQuery<'a> {
    pub(crate) job: Option<&'a str>,
    /// Only finished runs with this outcome.
    pub(crate) outcome: Option<RunOutcome>,
    /// Runs started at or after this store time.
    pub(crate) since: Option<StoreTime>,
    /// Only runs of this node.
    pub(crate) node: Option<&'a str>,
    /// Only the run of this acquisition (`runs show`).
    pub(crate) owner_id: Option<OwnerId>,
    pub(crate) limit: u32,
}

/// One run of the history, as `fencecron runs` shows it. The keys follow
/// the events' names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunInfo {
    pub(crate) job: String,
    pub(crate) resource: String,
    pub(crate) scheduled_at: Option<StoreTime>,
    pub(crate) trigger: String,
    pub(crate) node: String,
    pub(crate) owner_id: OwnerId,
    pub(crate) token: Token,
    pub(crate) started_at: StoreTime,
    pub(crate) finished_at: Option<StoreTime>,
    /// A finished run's outcome, or whether it still runs
    /// ([`RunState`]); shown under the key `outcome`.
    pub(crate) outcome: RunState,
    pub(crate) exit_code: Option<i64>,
    pub(crate) signal: Option<String>,
    pub(crate) duration_ms: Option<i64>,
    pub(crate) output: Option<String>,
}

/// A job paused fleet-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PauseInfo {
    pub(crate) job: String,
    pub(crate) note: Option<String>,
    pub(crate) since: StoreTime,
    /// When it resumes by itself (`pause --for`).
    pub(crate) until: Option<StoreTime>,
    /// Who paused it (`user@host`).
    pub(crate) paused_by: String,
}

/// A request to run a job now (`fencecron trigger`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TriggerInfo {
    /// A UUID the requesting CLI made up.
    pub(crate) id: String,
    pub(crate) job: String,
    pub(crate) requested_at: StoreTime,
    pub(crate) requested_by: String,
    pub(crate) state: TriggerState,
    /// The daemon that claimed it.
    pub(crate) node: Option<String>,
    /// The run's token once started.
    pub(crate) token: Option<Token>,
    /// Why it was refused (the holder), or why it failed to start.
    pub(crate) detail: Option<String>,
}

/// The id of one ownership: who a token was issued to. Every owner id the
/// store records is a random UUID, written lowercase and hyphenated; renew,
/// release, give-back and fenced writes match it together with the token.
/// A string that is not a UUID is refused where it enters (a flag, the job's
/// environment), never sent to the store as an owner that cannot exist.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct OwnerId {
    /// The UUID, lowercase and hyphenated: what the store binds and compares.
    text: [u8; 36],
}

impl OwnerId {
    /// A new owner id for one acquisition (or one occurrence on one node).
    pub fn fresh() -> OwnerId {
        OwnerId::from_uuid(Uuid::new_v4())
    }

    fn from_uuid(uuid: Uuid) -> OwnerId {
        let mut text = [0u8; 36];
        uuid.hyphenated().encode_lower(&mut text);
        OwnerId { text }
    }

    /// The id as the store binds and compares it.
    pub(crate) fn as_str(&self) -> &str {
        // A hyphenated UUID is ASCII.
        std::str::from_utf8(&self.text).unwrap_or_default()
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerId({})", self.as_str())
    }
}

impl Serialize for OwnerId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for OwnerId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<OwnerId, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl PartialEq<String> for OwnerId {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

/// An owner id column reads as an `OwnerId` wherever it reads as text, so
/// every row decodes straight into one; a stored value that is not a UUID
/// (no fencecron ever wrote one) fails the row's decoding with an error
/// that names it ([`BadOwnerId`]) instead of passing on as an owner that
/// cannot exist.
impl<DB: sqlx::Database> sqlx::Type<DB> for OwnerId
where
    String: sqlx::Type<DB>,
{
    fn type_info() -> DB::TypeInfo {
        <String as sqlx::Type<DB>>::type_info()
    }

    fn compatible(ty: &DB::TypeInfo) -> bool {
        <String as sqlx::Type<DB>>::compatible(ty)
    }
}

impl<'r, DB: sqlx::Database> sqlx::Decode<'r, DB> for OwnerId
where
    String: sqlx::Decode<'r, DB>,
{
    fn decode(value: DB::ValueRef<'r>) -> Result<OwnerId, sqlx::error::BoxDynError> {
        let text = <String as sqlx::Decode<'r, DB>>::decode(value)?;
        Ok(text.parse::<OwnerId>()?)
    }
}

/// An owner id that is not a UUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadOwnerId(pub String);

impl fmt::Display for BadOwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "owner id {:?} is not a UUID", self.0)
    }
}

impl std::error::Error for BadOwnerId {}

impl std::str::FromStr for OwnerId {
    type Err = BadOwnerId;

    fn from_str(s: &str) -> Result<OwnerId, BadOwnerId> {
        Uuid::parse_str(s.trim())
            .map(OwnerId::from_uuid)
            .map_err(|_| BadOwnerId(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::Row;

    /// An owner id column decodes into an `OwnerId`; one that is not a UUID
    /// fails its row by name instead of passing on as an owner.
    #[tokio::test]
    async fn an_owner_id_column_decodes_only_a_uuid_and_names_what_it_refuses() {
        let db = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        let id = OwnerId::fresh();
        let row = sqlx::query("SELECT ?1 AS owner_id, NULL AS none, 'not-a-uuid' AS bad")
            .bind(id.as_str())
            .fetch_one(&db)
            .await
            .unwrap();
        assert_eq!(row.try_get::<OwnerId, _>("owner_id").unwrap(), id);
        assert_eq!(row.try_get::<Option<OwnerId>, _>("none").unwrap(), None);
        let err = row.try_get::<OwnerId, _>("bad").unwrap_err().to_string();
        assert!(err.contains("\"not-a-uuid\" is not a UUID"), "{err}");
    }
}

//! The words fencecron stores and prints for what happened: how a run
//! ended and what state it is in, where a trigger is, why and where a
//! stale-owner record was made. One type per vocabulary, so code names a
//! variant instead of spelling a string; each `as_str` gives exactly the
//! text stored in the database and printed in logs, JSON and tables
//! (docs/events.md, docs/commands.md), and `FromStr` reads it back.
//!
//! *Reading back what a later release wrote.* A fleet is upgraded one node
//! at a time, so a row may hold a word this release does not know yet (a
//! new outcome, a new trigger state). The types read from the store
//! ([`RunState`], [`TriggerState`], [`StaleReason`], [`Stage`]) keep such a
//! word as `Other(text)` and show it exactly as stored, instead of refusing
//! the whole listing (`fencecron runs`, `stale`, `trigger --wait` would
//! fail on every host still running this release because of one row) or
//! guessing a wrong meaning. Only decoding makes `Other`: code that writes
//! always names a known variant. The closed vocabularies that only code
//! produces ([`RunOutcome`], [`LossReason`]) refuse an unknown word with
//! [`UnknownWord`], which names it.

use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::names::Name;

/// A word that is not one of its vocabulary's (`RunOutcome::from_str`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownWord {
    /// What the word was meant to be ("run outcome").
    pub(crate) what: &'static str,
    pub(crate) text: String,
}

impl fmt::Display for UnknownWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not a known {}", self.text, self.what)
    }
}

impl std::error::Error for UnknownWord {}

/// `Display` and `Serialize` as `as_str`, for every type here.
macro_rules! shown_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    )*};
}

/// A closed vocabulary: the variants and their words, `as_str`, `ALL`, and a
/// `FromStr` that refuses any other word.
macro_rules! closed_words {
    ($(#[$meta:meta])* $vis:vis enum $t:ident ($what:literal) {
        $($(#[$vmeta:meta])* $v:ident => $word:literal,)*
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        $vis enum $t {
            $($(#[$vmeta])* $v,)*
        }

        impl $t {
            /// Every variant, in declaration order.
            #[cfg(test)]
            pub(crate) const ALL: &'static [$t] = &[$($t::$v),*];

            /// The word as stored and shown.
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $($t::$v => $word,)*
                }
            }
        }

        impl FromStr for $t {
            type Err = UnknownWord;

            fn from_str(s: &str) -> Result<$t, UnknownWord> {
                match s {
                    $($word => Ok($t::$v),)*
                    _ => Err(UnknownWord { what: $what, text: s.to_string() }),
                }
            }
        }

        shown_as_str!($t);
    };
}

closed_words! {
    /// How a run ended: `job_finished`'s `outcome`, the run history's
    /// `outcome` column, an `on_failure` hook's `FENCECRON_OUTCOME`.
    pub enum RunOutcome ("run outcome") {
        /// Exit code 0.
        Succeeded => "succeeded",
        /// A non-zero exit code, or a signal fencecron did not send.
        Failed => "failed",
        /// Terminated at the job's `timeout`.
        TimedOut => "timed_out",
        /// Terminated because the lease was refused or could not be confirmed.
        LeaseLost => "lease_lost",
        /// Terminated because the daemon stopped.
        Shutdown => "shutdown",
        /// The command could not be started.
        SpawnFailed => "spawn_failed",
    }
}

impl RunOutcome {
    /// Whether a run that ended so may be retried: it failed by itself
    /// (exit code, signal), timed out, or could not start; not a lost lease
    /// (another owner may be running it) or a shutdown.
    pub(crate) fn retryable(self) -> bool {
        matches!(
            self,
            RunOutcome::Failed | RunOutcome::TimedOut | RunOutcome::SpawnFailed
        )
    }
}

/// Why a write was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
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
    /// Every reason, in declaration order.
    pub(crate) const ALL: &'static [RejectReason] = &[
        RejectReason::Stale,
        RejectReason::Forged,
        RejectReason::WrongOwner,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RejectReason::Stale => "stale",
            RejectReason::Forged => "forged",
            RejectReason::WrongOwner => "wrong_owner",
        }
    }
}

closed_words! {
    /// Why ownership could not be proven: `lease_lost`'s `reason`, the stale
    /// record's, and the label of `fencecron_leases_lost_total`.
    pub enum LossReason ("lease loss reason") {
        /// The store refused a renewal (someone else owns the lease, or it
        /// expired by the store's clock).
        RenewRefused => "renew_refused",
        /// No renewal was confirmed before the local deadline.
        DeadlinePassed => "deadline_passed",
        /// The store refused the release at the end of a run.
        ReleaseRefused => "release_refused",
    }
}

/// A run's state as the history shows it (`fencecron runs`, `status`,
/// `trigger --wait`): a row's own outcome once it ended; else `running`
/// while its lease is held under its token, and `unknown` once it is not
/// (its node died or lost the store mid-run and never wrote the end).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RunState {
    /// The run ended so (the row's `outcome`).
    Ended(RunOutcome),
    /// No end yet, and its lease is held under its token.
    Running,
    /// No end, and its lease is no longer held under its token.
    Unknown,
    /// An outcome a later release wrote, shown as stored (see the module).
    Other(String),
}

impl RunState {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            RunState::Ended(outcome) => outcome.as_str(),
            RunState::Running => "running",
            RunState::Unknown => "unknown",
            RunState::Other(text) => text,
        }
    }
}

impl FromStr for RunState {
    type Err = Infallible;

    fn from_str(s: &str) -> Result<RunState, Infallible> {
        Ok(match s {
            "running" => RunState::Running,
            "unknown" => RunState::Unknown,
            _ => s
                .parse()
                .map_or_else(|_| RunState::Other(s.to_string()), RunState::Ended),
        })
    }
}

impl From<RunOutcome> for RunState {
    fn from(outcome: RunOutcome) -> RunState {
        RunState::Ended(outcome)
    }
}

/// Where a request to run a job now (`fencecron trigger`) is:
/// pending → claimed by exactly one daemon → started (each attempt) →
/// ended, or refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TriggerState {
    /// Requested; no daemon took it yet.
    Pending,
    /// One daemon took it and is starting the run.
    Claimed,
    /// A run (attempt) started; `token` names it.
    Started,
    /// Not started: the lease was held, or the run could not begin.
    Refused,
    /// The manual run and its retries are over; `token` names the last
    /// attempt. Written after that attempt's end is in the run history.
    Ended,
    /// A state a later release wrote, shown as stored (see the module).
    Other(String),
}

impl TriggerState {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            TriggerState::Pending => "pending",
            TriggerState::Claimed => "claimed",
            TriggerState::Started => "started",
            TriggerState::Refused => "refused",
            TriggerState::Ended => "ended",
            TriggerState::Other(text) => text,
        }
    }
}

impl FromStr for TriggerState {
    type Err = Infallible;

    fn from_str(s: &str) -> Result<TriggerState, Infallible> {
        Ok(match s {
            "pending" => TriggerState::Pending,
            "claimed" => TriggerState::Claimed,
            "started" => TriggerState::Started,
            "refused" => TriggerState::Refused,
            "ended" => TriggerState::Ended,
            other => TriggerState::Other(other.to_string()),
        })
    }
}

/// Why a stale-owner record was made: its `reason`, which goes with its
/// kind (`write_rejected`: a [`RejectReason`]; `lease_lost`: a
/// [`LossReason`]; `lease_taken_over`: `expired_unreleased`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StaleReason {
    /// A fenced write (or a proxied request, or the SQL guard) was refused.
    Rejected(RejectReason),
    /// A run lost its lease.
    Lost(LossReason),
    /// A lease expired without being released and was taken over.
    ExpiredUnreleased,
    /// A reason a later release wrote, shown as stored (see the module).
    Other(String),
}

impl StaleReason {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            StaleReason::Rejected(r) => r.as_str(),
            StaleReason::Lost(r) => r.as_str(),
            StaleReason::ExpiredUnreleased => "expired_unreleased",
            StaleReason::Other(text) => text,
        }
    }
}

impl FromStr for StaleReason {
    type Err = Infallible;

    fn from_str(s: &str) -> Result<StaleReason, Infallible> {
        if s == "expired_unreleased" {
            return Ok(StaleReason::ExpiredUnreleased);
        }
        if let Some(r) = RejectReason::ALL.iter().find(|r| r.as_str() == s) {
            return Ok(StaleReason::Rejected(*r));
        }
        Ok(s.parse()
            .map_or_else(|_| StaleReason::Other(s.to_string()), StaleReason::Lost))
    }
}

impl From<RejectReason> for StaleReason {
    fn from(r: RejectReason) -> StaleReason {
        StaleReason::Rejected(r)
    }
}

impl From<LossReason> for StaleReason {
    fn from(r: LossReason) -> StaleReason {
        StaleReason::Lost(r)
    }
}

/// Where a stale-owner record was made: its `stage`. fencecron names its
/// own stages; a job's `fencecron put --stage S` gives a label of its own
/// (default `put`). The column holds only the text, so a label that spells
/// one of fencecron's stages reads back as that stage.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Stage {
    /// `fencecron put` without `--stage`.
    Put,
    /// The job exited with its stale code: its own storage refused a write.
    Job,
    /// A lease was taken over at its acquisition.
    Acquire,
    /// A run lost its lease (renewal refused or unconfirmed, release
    /// refused).
    Renew,
    /// The fencing proxy refused a request.
    Proxy,
    /// The SQL guard refused a write and its procedure recorded it.
    Guard,
    /// The SQL guard refused a write and the job reported it
    /// (`fencecron guard record`).
    GuardReported,
    /// `fencecron bench`'s own writes.
    Bench,
    /// A label the job chose (`put --stage`), or a stage a later release
    /// wrote: shown as stored.
    Label(String),
}

impl Stage {
    const NAMED: &'static [Stage] = &[
        Stage::Put,
        Stage::Job,
        Stage::Acquire,
        Stage::Renew,
        Stage::Proxy,
        Stage::Guard,
        Stage::GuardReported,
        Stage::Bench,
    ];

    pub(crate) fn as_str(&self) -> &str {
        match self {
            Stage::Put => "put",
            Stage::Job => "job",
            Stage::Acquire => "acquire",
            Stage::Renew => "renew",
            Stage::Proxy => "proxy",
            Stage::Guard => "guard",
            Stage::GuardReported => "guard_reported",
            Stage::Bench => "bench",
            Stage::Label(text) => text,
        }
    }
}

impl FromStr for Stage {
    type Err = Infallible;

    fn from_str(s: &str) -> Result<Stage, Infallible> {
        Ok(Stage::NAMED
            .iter()
            .find(|stage| stage.as_str() == s)
            .cloned()
            .unwrap_or_else(|| Stage::Label(s.to_string())))
    }
}

shown_as_str!(RunState, TriggerState, StaleReason, Stage, NodeState);

/// A daemon's state as its heartbeat stores it in `fencecron_nodes.state`
/// (`fencecron nodes`, `status`): scheduling, draining for a stop, stopped.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NodeState {
    /// Scheduling.
    Running,
    /// Stopping: hands new instants to the others, lets its runs end.
    Draining,
    /// Stored by a clean exit; shown as [`NodeState::GONE`].
    Stopped,
    /// A state a later release wrote, shown as stored (see the module).
    Other(String),
}

impl NodeState {
    /// Shown (never stored) for a node that stopped or missed its
    /// heartbeats.
    pub(crate) const GONE: &'static str = "gone";

    pub(crate) fn as_str(&self) -> &str {
        match self {
            NodeState::Running => "running",
            NodeState::Draining => "draining",
            NodeState::Stopped => "stopped",
            NodeState::Other(text) => text,
        }
    }
}

impl FromStr for NodeState {
    type Err = Infallible;

    fn from_str(s: &str) -> Result<NodeState, Infallible> {
        Ok(match s {
            "running" => NodeState::Running,
            "draining" => NodeState::Draining,
            "stopped" => NodeState::Stopped,
            other => NodeState::Other(other.to_string()),
        })
    }
}

/// A daemon's node id, validated once where it enters (`node.id` when the
/// config is loaded, else `--node-id`, `$FENCECRON_NODE` or the host name
/// when `fencecron run` starts) and kept as this type up to the daemon: a
/// name (1..=200 characters, no control characters), never parsed again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct NodeId(Name);

impl NodeId {
    /// Validates `text` as a node id; the error is one sentence.
    pub(crate) fn parse(text: &str) -> Result<NodeId, String> {
        Name::parse("node", text).map(NodeId)
    }

    pub(crate) fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Reads a stored word into its type. Every type here reads any text
/// (an unknown word is kept as `Other`/`Label`), so this cannot fail.
pub(crate) fn stored<T: FromStr<Err = Infallible>>(text: &str) -> T {
    match text.parse() {
        Ok(t) => t,
        Err(never) => match never {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words are stored and printed: they must not change. This pins
    /// each one as docs/events.md and docs/commands.md show it, and that
    /// reading it back gives the same value.
    #[test]
    fn every_word_is_todays_and_reads_back() {
        let outcomes: Vec<&str> = RunOutcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            outcomes,
            [
                "succeeded",
                "failed",
                "timed_out",
                "lease_lost",
                "shutdown",
                "spawn_failed"
            ]
        );
        let losses: Vec<&str> = LossReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            losses,
            ["renew_refused", "deadline_passed", "release_refused"]
        );
        for o in RunOutcome::ALL {
            assert_eq!(o.as_str().parse(), Ok(*o));
            assert_eq!(stored::<RunState>(o.as_str()), RunState::Ended(*o));
        }
        for (state, word) in [
            (RunState::Running, "running"),
            (RunState::Unknown, "unknown"),
        ] {
            assert_eq!(state.as_str(), word);
            assert_eq!(stored::<RunState>(word), state);
        }
        let triggers = [
            (TriggerState::Pending, "pending"),
            (TriggerState::Claimed, "claimed"),
            (TriggerState::Started, "started"),
            (TriggerState::Refused, "refused"),
            (TriggerState::Ended, "ended"),
        ];
        for (state, word) in triggers {
            assert_eq!(state.as_str(), word);
            assert_eq!(stored::<TriggerState>(word), state);
        }
        let reasons = [
            (RejectReason::Stale.into(), "stale"),
            (RejectReason::Forged.into(), "forged"),
            (RejectReason::WrongOwner.into(), "wrong_owner"),
            (LossReason::RenewRefused.into(), "renew_refused"),
            (LossReason::DeadlinePassed.into(), "deadline_passed"),
            (LossReason::ReleaseRefused.into(), "release_refused"),
            (StaleReason::ExpiredUnreleased, "expired_unreleased"),
        ];
        for (reason, word) in reasons {
            assert_eq!(reason.as_str(), word);
            assert_eq!(stored::<StaleReason>(word), reason);
        }
        for (state, word) in [
            (NodeState::Running, "running"),
            (NodeState::Draining, "draining"),
            (NodeState::Stopped, "stopped"),
        ] {
            assert_eq!(state.as_str(), word);
            assert_eq!(stored::<NodeState>(word), state);
        }
        let stages: Vec<&str> = Stage::NAMED.iter().map(Stage::as_str).collect();
        assert_eq!(
            stages,
            [
                "put",
                "job",
                "acquire",
                "renew",
                "proxy",
                "guard",
                "guard_reported",
                "bench"
            ]
        );
        for stage in Stage::NAMED {
            assert_eq!(&stored::<Stage>(stage.as_str()), stage);
        }
    }

    /// metrics takes the outcome as text and moves the last-success gauge
    /// on its own `SUCCEEDED`: the same word as the run history's.
    #[test]
    fn metrics_success_is_the_succeeded_outcome() {
        assert_eq!(RunOutcome::Succeeded.as_str(), crate::metrics::SUCCEEDED);
    }

    #[test]
    fn a_word_of_a_later_release_is_kept_as_stored() {
        assert_eq!(
            stored::<RunState>("cancelled"),
            RunState::Other("cancelled".into())
        );
        assert_eq!(stored::<RunState>("cancelled").to_string(), "cancelled");
        assert_eq!(stored::<TriggerState>("expired").as_str(), "expired");
        assert_eq!(stored::<StaleReason>("odd").as_str(), "odd");
        assert_eq!(stored::<Stage>("publish"), Stage::Label("publish".into()));
        assert_eq!(
            serde_json::to_string(&stored::<RunState>("cancelled")).unwrap(),
            "\"cancelled\""
        );
    }

    #[test]
    fn a_closed_vocabulary_names_the_word_it_refuses() {
        let err = "cancelled".parse::<RunOutcome>().unwrap_err();
        assert_eq!(err.to_string(), "\"cancelled\" is not a known run outcome");
        assert!("x".parse::<LossReason>().is_err());
    }

    #[test]
    fn a_node_id_is_a_name() {
        assert_eq!(NodeId::parse("node-a").unwrap().as_str(), "node-a");
        assert!(NodeId::parse("").is_err());
        assert!(NodeId::parse("a\nb")
            .unwrap_err()
            .contains("control character"));
        assert!(NodeId::parse(&"n".repeat(201)).is_err());
    }

    #[test]
    fn only_failures_of_the_job_itself_are_retried() {
        let retryable: Vec<&str> = RunOutcome::ALL
            .iter()
            .filter(|o| o.retryable())
            .map(|o| o.as_str())
            .collect();
        assert_eq!(retryable, ["failed", "timed_out", "spawn_failed"]);
    }
}

//! What the lease operations are asked and answer: acquire, claim, renew,
//! release, give back, list.

use super::*;

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
/// [`super::Store::give_back_unseen`](crate::store::Leases::give_back_unseen) looks for.
#[derive(Debug, Clone, Copy)]
pub struct Unseen<'a> {
    pub(crate) resource: &'a Name,
    pub(crate) owner_id: OwnerId,
    pub(crate) occurrence: StoreTime,
}

/// One scheduled occurrence in a batch claim ([`Store::claim`](crate::store::Leases::claim)): what an
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
    /// Won, exactly as a winning [`Store::acquire`](crate::store::Leases::acquire) (run recorded),
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
    /// classified ([`super::classify_loss`](crate::store::classify_loss)).
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

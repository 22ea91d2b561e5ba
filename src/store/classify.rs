//! How a refused call is explained: the reasons are decided here once, from
//! the row the refusing backend read, so all backends (and the in-memory
//! test store) report the same ones.

use super::{
    AcquireOutcome, AcquireRequest, NewStaleRecord, OwnerId, PauseSeen, PutRequest, Refusal,
    RejectReason, StaleKind, StartedBy, StoreTime, Token,
};

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
            owner_id: row.owner_id,
            node: row.node,
            token: row.fence,
            expires_at: StoreTime(row.expires_at),
        }
    } else {
        // The snapshot shows a free lease, yet the update did not take it: a
        // concurrent acquirer won between our snapshot and our update. Its
        // owner and token are not known to this caller.
        AcquireOutcome::LostRace
    }
}

/// A scheduled acquire that found its job paused: `Paused`, unless the
/// occurrence is not due yet, or already superseded, by the store's clock
/// (then as any other losing acquire, so a host whose clock runs ahead
/// waits for the instant and one running behind skips it as such).
pub(crate) fn classify_paused(
    pause: PauseSeen,
    req: &AcquireRequest<'_>,
    now: i64,
) -> AcquireOutcome {
    if req.occurrence.is_some_and(|occ| occ.0 > now) {
        return AcquireOutcome::NotYetDue {
            store_now: StoreTime(now),
        };
    }
    if req.next_occurrence.is_some_and(|next| next.0 <= now) {
        return AcquireOutcome::Superseded {
            store_now: StoreTime(now),
        };
    }
    AcquireOutcome::Paused {
        note: pause.note,
        until: pause.until.map(StoreTime),
        first: pause.first,
    }
}

/// What an acquire binds for its run ([`AcquireRequest::run`]): the job
/// (`None`: no run, no pause), how the run was started, and its instant.
pub(crate) fn run_binds<'a>(
    req: &AcquireRequest<'a>,
) -> (Option<&'a str>, &'static str, Option<i64>) {
    match req.run {
        Some(run) => (
            Some(run.job),
            run.started_by.as_str(),
            run.scheduled_at.map(|t| t.0),
        ),
        None => (None, StartedBy::Schedule.as_str(), None),
    }
}

/// The lease row as a losing acquirer saw it.
pub(crate) struct LossRow {
    pub fence: Token,
    pub owner_id: OwnerId,
    pub node: String,
    pub expires_at: i64,
    pub last_occurrence: Option<i64>,
    pub now: i64,
}

/// The lease row as a refused renew or release finds it.
pub(crate) struct LeaseRow {
    pub owner_id: OwnerId,
    pub fence: Token,
    pub expires_at: i64,
}

/// Classifies a refused renew or release from the row as it is now.
pub(crate) fn classify_refusal(row: Option<LeaseRow>, owner_id: OwnerId, token: Token) -> Refusal {
    match row {
        None => Refusal::Missing,
        Some(row) if owner_id == row.owner_id && row.fence == token => Refusal::Expired {
            expired_at: StoreTime(row.expires_at),
        },
        Some(row) => Refusal::NotOwner {
            current_owner: row.owner_id,
            current_token: row.fence,
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

impl Rejection {
    /// The record of `req`'s rejection, stored in the refusing transaction.
    pub(crate) fn record<'r>(
        &self,
        req: &'r PutRequest<'r>,
        operation_id: &'r str,
    ) -> NewStaleRecord<'r> {
        NewStaleRecord {
            kind: StaleKind::WriteRejected,
            reason: self.reason.into(),
            resource: req.resource.as_str(),
            key: Some(req.key.as_str()),
            owner_id: Some(req.owner_id),
            token: req.token,
            accepted_token: self.accepted_token,
            node: req.node,
            job: req.job,
            stage: req.stage.clone(),
            operation_id,
        }
    }
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
    owner_id: OwnerId,
    once: bool,
    accepted: Option<Token>,
    lease: Option<(Token, OwnerId)>,
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

/// What the fencing proxy's check does next, from the highest token
/// admitted for the resource so far and the resource's fence (the newest
/// token issued for it), as one read saw them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// The token is the highest admitted: forward.
    Admit,
    /// Issued and newer than every admitted one: raise the highest to it
    /// (conditionally, in one statement), then read again.
    Raise,
    /// Refused, why, and the token that beat it or the fence.
    Refuse(RejectReason, Option<Token>),
}

/// The fencing proxy's rule. A token below the highest admitted one is
/// `Stale`. A token the store cannot have issued for the resource (no lease
/// row, not positive, above the fence: tokens are issued in increasing
/// order per resource) is `Forged`. After a raise (`raised`), the token
/// passes only if it *is* the highest now: a raise that did not take lost
/// to a newer token.
pub(crate) fn classify_admission(
    token: Token,
    highest: Option<Token>,
    issued: Option<Token>,
    raised: bool,
) -> Admission {
    if highest == Some(token) {
        return Admission::Admit;
    }
    if let Some(h) = highest.filter(|h| *h > token) {
        return Admission::Refuse(RejectReason::Stale, Some(h));
    }
    match issued {
        Some(fence) if (Token::new(1)..=fence).contains(&token) && !raised => Admission::Raise,
        _ => Admission::Refuse(RejectReason::Forged, issued),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn t(n: i64) -> Token {
        Token::new(n)
    }

    #[test]
    fn admission_at_the_proxy() {
        use Admission::*;
        use RejectReason::*;
        // Never leased, not positive, above the fence: never issued.
        assert_eq!(
            classify_admission(t(1), None, None, false),
            Refuse(Forged, None)
        );
        assert_eq!(
            classify_admission(t(0), None, Some(t(3)), false),
            Refuse(Forged, Some(t(3)))
        );
        assert_eq!(
            classify_admission(t(-1), Some(t(2)), Some(t(3)), false),
            Refuse(Stale, Some(t(2)))
        );
        assert_eq!(
            classify_admission(t(4), Some(t(3)), Some(t(3)), false),
            Refuse(Forged, Some(t(3)))
        );
        // The highest admitted passes; a newer issued one is raised to.
        assert_eq!(
            classify_admission(t(3), Some(t(3)), Some(t(5)), false),
            Admit
        );
        assert_eq!(
            classify_admission(t(5), Some(t(3)), Some(t(5)), false),
            Raise
        );
        assert_eq!(classify_admission(t(2), None, Some(t(5)), false), Raise);
        // Below the highest admitted: stale, whatever was issued.
        assert_eq!(
            classify_admission(t(2), Some(t(3)), Some(t(5)), false),
            Refuse(Stale, Some(t(3)))
        );
        // After a raise: only if it took.
        assert_eq!(
            classify_admission(t(5), Some(t(5)), Some(t(5)), true),
            Admit
        );
        assert_eq!(
            classify_admission(t(4), Some(t(5)), Some(t(5)), true),
            Refuse(Stale, Some(t(5)))
        );
    }

    #[test]
    fn rejection_reasons() {
        let rej = |reason, accepted_token| {
            Some(Rejection {
                reason,
                accepted_token,
            })
        };
        let (me, other) = (OwnerId::fresh(), OwnerId::fresh());
        // Never leased, or above the fence: forged, naming the key's token.
        assert_eq!(
            classify_rejection(t(1), me, false, None, None),
            rej(RejectReason::Forged, None)
        );
        assert_eq!(
            classify_rejection(t(10), me, false, Some(t(6)), Some((t(9), me))),
            rej(RejectReason::Forged, Some(t(6)))
        );
        // Below the fence: stale, naming the current token, whether or not
        // the key was written since (and whoever holds the fence).
        assert_eq!(
            classify_rejection(t(5), me, false, Some(t(6)), Some((t(9), me))),
            rej(RejectReason::Stale, Some(t(9)))
        );
        assert_eq!(
            classify_rejection(t(5), me, false, None, Some((t(9), other))),
            rej(RejectReason::Stale, Some(t(9)))
        );
        assert_eq!(
            classify_rejection(t(5), me, true, Some(t(5)), Some((t(9), other))),
            rej(RejectReason::Stale, Some(t(9)))
        );
        // The fence's token, issued to someone else.
        assert_eq!(
            classify_rejection(t(9), me, false, None, Some((t(9), other))),
            rej(RejectReason::WrongOwner, Some(t(9)))
        );
        assert_eq!(
            classify_rejection(t(9), me, true, Some(t(9)), Some((t(9), other))),
            rej(RejectReason::WrongOwner, Some(t(9)))
        );
        // The owner's own token again with `once`: already applied.
        assert_eq!(
            classify_rejection(t(9), me, true, Some(t(9)), Some((t(9), me))),
            None
        );
    }
}

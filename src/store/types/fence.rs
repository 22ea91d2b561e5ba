//! What the fenced writes are asked and answer: put, admit, get, and the
//! stale-owner records.

use super::*;

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

//! What operating the fleet is asked and answers: nodes and their beats,
//! published jobs, pauses, triggers.

use super::*;

/// A node is live while its row in `fencecron_nodes` was refreshed within
/// this long by the store's clock and it did not say it stopped
/// ([`NodeInfo::live`]): three missed heartbeats ([`HEARTBEAT`]). The one
/// definition of "live": the claim's share, `fencecron nodes`, `status` and
/// the drift check all count the same nodes. A claim also refreshes its
/// node's mark, at most every [`NODE_BEAT`].
pub(crate) const NODE_LIVE: Duration = Duration::from_secs(15);

/// How often a daemon refreshes its row in `fencecron_nodes`: one small
/// statement per node every 5 s (the upsert, which reads the store's clock
/// and answers the live nodes; [`super::Store::beat`](crate::store::Fleet::beat)), whatever the number
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

/// What a heartbeat answers ([`super::Store::beat`](crate::store::Fleet::beat)): the store's time the
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

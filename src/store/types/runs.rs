//! What the run history is asked and answers: a run's start (recorded by
//! the winning acquire), its end, and the queries.

use super::*;

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

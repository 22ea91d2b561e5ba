//! The event catalogue: one function per event (the log set-up is
//! [`crate::logging`]).
//!
//! Nothing else in the crate names an event. With `--log-format json` each
//! line is one JSON object with top-level `timestamp`, `level`, `event`,
//! `message` and the event's fields; docs/events.md documents the catalogue and
//! it is a stable interface for log-based monitoring.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tracing::{debug, error, info, warn};

use crate::domain::RunOutcome;
use crate::store::outages::{Ended, Outages};
use crate::store::{
    rfc3339, CallEnd, EpochInfo, Lease, Notice, OwnerId, StaleRecord, StoreHook, StoreTime,
    Takeover, Token,
};

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A lease was taken.
pub fn lease_acquired(job: Option<&str>, lease: &Lease, node: &str) {
    info!(
        event = "lease_acquired",
        job,
        resource = %lease.resource,
        owner_id = %lease.owner_id,
        token = lease.token.get(),
        expires_at = %lease.expires_at,
        node,
        "lease acquired"
    );
}

/// This acquisition took over a lease that expired without being released:
/// its previous owner vanished (crashed, hung, was partitioned or killed)
/// and may still be running somewhere. A stale-owner event.
pub fn lease_taken_over(job: Option<&str>, lease: &Lease, previous: &Takeover, node: &str) {
    warn!(
        event = "lease_taken_over",
        job,
        resource = %lease.resource,
        owner_id = %lease.owner_id,
        token = lease.token.get(),
        previous_owner_id = %previous.owner_id,
        previous_node = %previous.node,
        previous_token = previous.token.get(),
        expired_at = %previous.expired_at,
        node,
        "lease taken over from an owner that never released it"
    );
}

/// `fencecron epoch advance` raised the epoch of fencing tokens.
pub fn epoch_advanced(info: &EpochInfo) {
    info!(
        event = "epoch_advanced",
        stored_epoch = info.stored,
        effective_epoch = info.effective,
        timeline = info.timeline,
        lowest_token = info.lowest_token.get(),
        highest_token = info.highest_token.map(Token::get),
        "epoch of fencing tokens advanced"
    );
}

/// A lease was renewed (debug: one per renew interval per job).
pub fn lease_renewed(job: Option<&str>, lease: &Lease, expires_at: StoreTime) {
    debug!(
        event = "lease_renewed",
        job,
        resource = %lease.resource,
        owner_id = %lease.owner_id,
        token = lease.token.get(),
        expires_at = %expires_at,
        "lease renewed"
    );
}

/// The local deadline by which the job must be dead, computed from the send
/// time of the last confirmed acquire/renew.
pub fn lease_deadline(job: Option<&str>, lease: &Lease, kill_in: Duration, term_in: Duration) {
    debug!(
        event = "lease_deadline",
        job,
        resource = %lease.resource,
        token = lease.token.get(),
        sigterm_in_ms = ms(term_in),
        sigkill_in_ms = ms(kill_in),
        "local kill deadline set"
    );
}

/// A lease was given up.
pub fn lease_released(job: Option<&str>, lease: &Lease) {
    info!(
        event = "lease_released",
        job,
        resource = %lease.resource,
        owner_id = %lease.owner_id,
        token = lease.token.get(),
        "lease released"
    );
}

/// Ownership can no longer be proven. A stale-owner event. `reason` is a
/// stable code (`renew_refused`, `deadline_passed`, `release_refused`);
/// `detail` says what happened in words.
pub fn lease_lost(job: Option<&str>, lease: &Lease, node: &str, reason: LossReason, detail: &str) {
    let reason = reason.as_str();
    crate::metrics::lease_lost(job.unwrap_or(""), reason);
    warn!(
        event = "lease_lost",
        job,
        resource = %lease.resource,
        owner_id = %lease.owner_id,
        token = lease.token.get(),
        node,
        reason,
        detail,
        "lease lost"
    );
}

/// The child process was spawned; `scheduled_at` is `None` for `exec`
/// (logged as an empty string).
pub fn job_started(
    job: &str,
    resource: &str,
    token: Token,
    pid: Option<u32>,
    scheduled_at: Option<DateTime<Utc>>,
) {
    crate::metrics::run_started(
        job,
        scheduled_at.and_then(|at| (Utc::now() - at).to_std().ok()),
    );
    let scheduled_at = scheduled_at.map(rfc3339).unwrap_or_default();
    info!(
        event = "job_started",
        job,
        resource,
        token = token.get(),
        pid,
        scheduled_at,
        "job started"
    );
}

/// One line of the job's stdout or stderr.
pub fn job_output(job: &str, token: Token, stream: &'static str, line: &str) {
    info!(
        event = "job_output",
        job,
        token = token.get(),
        stream,
        line,
        "job output"
    );
}

// Why a lease was lost is the stale records' word too: it lives in
// `domain` (as does how a run ended, `domain::RunOutcome`).
pub(crate) use crate::domain::LossReason;

/// Why an occurrence was not run here: `occurrence_skipped`'s `reason`,
/// and the `reason` label of `fencecron_occurrences_skipped_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// An earlier occurrence of the job is still acquired or run on this
    /// node, or another owner holds the lease.
    Held,
    /// The store did not answer in time.
    StoreUnavailable,
    /// Not started within the job's `starting_deadline`.
    Deadline,
    /// The job is paused fleet-wide.
    Paused,
    /// This host's clock is ahead of the store's.
    ClockAhead,
    /// This host's clock is behind the store's.
    ClockBehind,
    /// A later instant was already due (or `catchup = "none"`).
    Missed,
    /// The store answered too late to run the job safely within the lease.
    AcquiredTooLate,
    /// This node held `node.max_running` runs until the occurrence was no
    /// longer worth starting.
    Capacity,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Held => "held",
            SkipReason::StoreUnavailable => "store_unavailable",
            SkipReason::Deadline => "deadline",
            SkipReason::Paused => "paused",
            SkipReason::ClockAhead => "clock_ahead",
            SkipReason::ClockBehind => "clock_behind",
            SkipReason::Missed => "missed",
            SkipReason::AcquiredTooLate => "acquired_too_late",
            SkipReason::Capacity => "capacity",
        }
    }
}

/// Why a retry did not run: `retry_abandoned`'s `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbandonReason {
    /// It would start after the job's next instant is due.
    NextInstant,
    Paused,
    Held,
    StoreUnavailable,
}

impl AbandonReason {
    pub fn as_str(self) -> &'static str {
        match self {
            AbandonReason::NextInstant => "next_instant",
            AbandonReason::Paused => "paused",
            AbandonReason::Held => "held",
            AbandonReason::StoreUnavailable => "store_unavailable",
        }
    }
}

/// A signal's name as every event spells it (`SIGTERM`), or `SIG<n>` for a
/// number without one.
pub fn signal_name(signal: i32) -> String {
    nix::sys::signal::Signal::try_from(signal)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("SIG{signal}"))
}

/// One ended run, for `job_finished` / `job_failed`.
#[derive(Debug, Clone, Copy)]
pub struct JobEnd<'a> {
    pub job: &'a str,
    pub resource: &'a str,
    pub node: &'a str,
    pub token: Token,
    /// The scheduled instant; `None` for `exec`.
    pub scheduled_at: Option<&'a str>,
    pub outcome: RunOutcome,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration: Duration,
}

/// The child ended on its own or after a signal. Every run that started
/// ends with exactly one `job_finished` (INFO); one that did not succeed
/// also logs `job_failed` (WARN, same fields) for alerting, except a run
/// stopped by a shutdown, which is not a failure ([`job_stopped`]).
pub fn job_finished(end: &JobEnd<'_>) {
    let signal = end.signal.map(signal_name);
    let JobEnd {
        job,
        resource,
        node,
        token,
        scheduled_at,
        outcome,
        exit_code,
        duration,
        ..
    } = *end;
    crate::metrics::run_finished(job, outcome.as_str(), duration);
    let failed = !matches!(outcome, RunOutcome::Succeeded | RunOutcome::Shutdown);
    let outcome = outcome.as_str();
    let duration_ms = ms(duration);
    // The same fields under two names and levels: tracing needs each
    // level at its call site.
    macro_rules! job_end {
        ($level:ident, $event:literal, $message:literal) => {
            $level!(
                event = $event,
                job,
                resource,
                node,
                token = token.get(),
                scheduled_at,
                outcome,
                exit_code,
                signal,
                duration_ms,
                $message
            )
        };
    }
    job_end!(info, "job_finished", "job finished");
    if failed {
        job_end!(warn, "job_failed", "job did not succeed");
    }
}

/// A job's `on_failure` hook ran and exited 0.
pub fn on_failure_finished(job: &str) {
    info!(
        event = "on_failure_finished",
        job, "on_failure hook finished"
    );
}

/// A job's `on_failure` hook could not start, failed or timed out; it is
/// not retried.
pub fn on_failure_failed(job: &str, error: &str) {
    warn!(
        event = "on_failure_failed",
        job, error, "on_failure hook failed"
    );
}

/// The supervisor is terminating the job.
pub fn job_cancelled(job: &str, token: Token, reason: &str, signal: &str) {
    warn!(
        event = "job_cancelled",
        job,
        token = token.get(),
        reason,
        signal,
        "job cancelled"
    );
}

/// A run was stopped because its daemon (or `exec`) shut down: logged
/// right after its `job_finished` (outcome `shutdown`), instead of
/// `job_failed`. A restart is not a failure: INFO. `signal` is the last
/// signal fencecron sent the job (`SIGTERM`, or `SIGKILL` when it outlived
/// `kill_grace`); `reason` is `shutdown`.
pub fn job_stopped(end: &JobEnd<'_>, signal: &str) {
    let JobEnd {
        job,
        resource,
        node,
        token,
        scheduled_at,
        duration,
        ..
    } = *end;
    let duration_ms = ms(duration);
    info!(
        event = "job_stopped",
        job,
        resource,
        node,
        token = token.get(),
        scheduled_at,
        signal,
        duration_ms,
        reason = "shutdown",
        "job stopped for a shutdown"
    );
}

/// The command could not be started at all.
pub fn job_spawn_failed(job: &str, token: Token, error: &str) {
    error!(
        event = "job_spawn_failed",
        job,
        token = token.get(),
        error,
        "job could not be started"
    );
}

/// `overlap = "replace"`: this node's acquire for `scheduled_at` ended the
/// lease generation `previous_token` of a run still holding the job's lease
/// (an earlier instant's, or a manual run), and takes the lease over with a
/// new token. The replaced run is terminated when its next renewal is
/// refused (`lease_lost` with `renew_refused` on its node). WARN: a run
/// outlived its interval.
pub fn run_replaced(
    job: &str,
    scheduled_at: &str,
    node: &str,
    previous_owner_id: OwnerId,
    previous_node: Option<&str>,
    previous_token: Token,
) {
    warn!(
        event = "run_replaced",
        job,
        scheduled_at,
        node,
        previous_owner_id = previous_owner_id.as_str(),
        previous_node,
        previous_token = previous_token.get(),
        "a run still holding the lease is replaced (overlap = \"replace\")"
    );
}

/// An occurrence was not run here.
pub fn occurrence_skipped(job: &str, scheduled_at: &str, reason: SkipReason, detail: &str) {
    let reason = reason.as_str();
    crate::metrics::occurrence_skipped(job, reason);
    info!(
        event = "occurrence_skipped",
        job, scheduled_at, reason, detail, "occurrence skipped"
    );
}

/// A failed run is tried again after `delay` (`retries`).
pub fn retry_scheduled(job: &str, scheduled_at: &str, attempt: u32, delay: Duration) {
    let delay_ms = delay.as_millis() as u64;
    info!(
        event = "retry_scheduled",
        job, scheduled_at, attempt, delay_ms, "retry scheduled"
    );
}

/// A retry that did not run: `next_instant` (it would start after the
/// job's next instant), `paused`, `held`, `store_unavailable`. WARN: the
/// instant ends failed.
pub fn retry_abandoned(
    job: &str,
    scheduled_at: &str,
    attempt: u32,
    reason: AbandonReason,
    detail: &str,
) {
    let reason = reason.as_str();
    warn!(
        event = "retry_abandoned",
        job, scheduled_at, attempt, reason, detail, "retry abandoned"
    );
}

/// `fencecron pause` stored a pause.
pub fn job_paused(p: &crate::store::PauseInfo) {
    crate::metrics::paused(&p.job, true);
    let until = p.until.map(|u| u.rfc3339());
    info!(
        event = "job_paused",
        job = p.job.as_str(),
        note = p.note.as_deref(),
        until = until.as_deref(),
        paused_by = p.paused_by.as_str(),
        "job paused fleet-wide"
    );
}

/// `fencecron resume` ended a pause (`was_paused` false: there was none).
pub fn job_resumed(job: &str, was_paused: bool) {
    crate::metrics::paused(job, false);
    info!(
        event = "job_resumed",
        job, was_paused, "job resumed fleet-wide"
    );
}

/// The web view stored a trigger request (`POST /jobs/NAME/trigger`), as
/// asked by `requested_by` (`web:NAME`, the token's name).
pub fn trigger_requested(job: &str, trigger_id: &str, requested_by: &str) {
    info!(
        event = "trigger_requested",
        job, trigger_id, requested_by, "manual run requested"
    );
}

/// A daemon claimed a trigger (`fencecron trigger`) and started the job
/// under a new token.
pub fn trigger_started(job: &str, trigger_id: &str, requested_by: &str, token: Token) {
    info!(
        event = "trigger_started",
        job,
        trigger_id,
        requested_by,
        token = token.get(),
        "manual run started"
    );
}

/// A daemon claimed a trigger but could not run the job (it is running, or
/// the store failed).
pub fn trigger_refused(job: &str, trigger_id: &str, detail: &str) {
    warn!(
        event = "trigger_refused",
        job, trigger_id, detail, "manual run refused"
    );
}

/// The daemon's housekeeping pruned the run history (`runs` rows), old
/// triggers and ended pauses (`other` rows), stale-owner records (`stale`)
/// and stored values of resources no longer used (`values`). DEBUG:
/// routine.
pub fn history_pruned(runs: u64, other: u64, stale: u64, values: u64) {
    debug!(
        event = "history_pruned",
        runs, other, stale, values, "run history pruned"
    );
}

/// A paused job's instant (`fencecron pause`): skipped with reason
/// `paused`. Logged at INFO by the one daemon that noted the skip in the
/// store (`first`), at DEBUG by every other, so a fleet logs it once.
pub fn occurrence_paused(
    job: &str,
    scheduled_at: &str,
    note: Option<&str>,
    until: Option<StoreTime>,
    first: bool,
) {
    crate::metrics::occurrence_skipped(job, SkipReason::Paused.as_str());
    crate::metrics::paused(job, true);
    let until = until.map(|u| u.rfc3339());
    let until = until.as_deref();
    let detail = "the job is paused fleet-wide; `fencecron resume` runs it again";
    if first {
        info!(
            event = "occurrence_skipped",
            job,
            scheduled_at,
            reason = SkipReason::Paused.as_str(),
            note,
            until,
            detail,
            "occurrence skipped"
        );
    } else {
        debug!(
            event = "occurrence_skipped",
            job,
            scheduled_at,
            reason = SkipReason::Paused.as_str(),
            note,
            until,
            detail,
            "occurrence skipped"
        );
    }
}

/// An occurrence skipped because this host's clock disagrees with the
/// store's: `clock_ahead` or `clock_behind`. WARN: the host's time
/// synchronisation needs fixing. `offset_ms` is this host's clock minus the
/// store's (positive ahead, negative behind), as far as one call can tell.
pub fn occurrence_skipped_clock(
    job: &str,
    scheduled_at: &str,
    reason: SkipReason,
    offset_ms: i64,
    detail: &str,
) {
    let reason = reason.as_str();
    crate::metrics::occurrence_skipped(job, reason);
    warn!(
        event = "occurrence_skipped",
        job, scheduled_at, reason, offset_ms, detail, "occurrence skipped"
    );
}

/// An acquire of this occurrence whose answer never came back (the store
/// timed out or dropped the call) had won it after all; nothing ran under
/// it, so the lease and the occurrence were given back. WARN: the trace of
/// a store that hung or lost connections across an instant.
pub fn occurrence_given_back(job: &str, scheduled_at: &str, owner_id: OwnerId, node: &str) {
    warn!(
        event = "occurrence_given_back",
        job,
        scheduled_at,
        owner_id = %owner_id,
        node,
        "an unanswered acquire had won the occurrence; lease and occurrence given back"
    );
}

/// Another instance took this occurrence (normal in a fleet; debug level).
pub fn occurrence_taken(job: &str, scheduled_at: &str) {
    debug!(
        event = "occurrence_taken",
        job, scheduled_at, "occurrence taken by another instance"
    );
}

/// A batch claim answered (debug level): of `items` occurrences due at
/// `scheduled_at`, this node won `won`, under a limit of `limit` (its free
/// capacity and, in the first `round`, its share of the live nodes).
pub fn occurrences_claimed(scheduled_at: &str, round: u32, items: usize, won: usize, limit: usize) {
    debug!(
        event = "occurrences_claimed",
        scheduled_at, round, items, won, limit, "batch claim answered"
    );
}

/// The occurrences of one instant split among its claimers (debug level,
/// one line per instant): this node claims `primary` at the instant and
/// `backup` after the primary, and asks nothing about `others` (the other
/// claimers' chunks), of the instant's `due`, among `claimers` of `nodes`.
pub fn occurrences_assigned(
    scheduled_at: &str,
    due: usize,
    claimers: usize,
    nodes: usize,
    primary: usize,
    backup: usize,
    others: usize,
) {
    debug!(
        event = "occurrences_assigned",
        scheduled_at,
        due,
        claimers,
        nodes,
        primary,
        backup,
        others,
        "occurrences split among the instant's claimers"
    );
}

/// From now on this node claims only what the assignment gives it: its
/// last beats answered the same `nodes` running live nodes, with the same
/// jobs and version (logged when the mode changes).
pub fn claims_assigned(nodes: usize) {
    info!(
        event = "claims_assigned",
        nodes,
        "the live nodes are steady: where it saves claims (three nodes or more), each instant's occurrences are split among a few claimers"
    );
}

/// From now on this node claims every occurrence, as every node does
/// while its view of the fleet cannot be trusted (`reason`; logged when
/// the mode changes).
pub fn claims_competed(reason: &str) {
    info!(
        event = "claims_competed",
        reason, "every node claims every occurrence until the live nodes are steady"
    );
}

/// This node holds `node.max_running` runs: the occurrence waits for one
/// to end before it competes (debug level; `occurrence_skipped` with
/// reason `capacity` if none ends in time).
pub fn occurrence_waiting(job: &str, scheduled_at: &str, max_running: usize) {
    debug!(
        event = "occurrence_waiting",
        job, scheduled_at, max_running, "node at capacity; the occurrence waits for a run to end"
    );
}

/// The daemon stopped while this occurrence's claim or acquire was still
/// unanswered: it stops waiting, and should the answer be a win, that
/// lease is given back before the daemon exits (debug level).
pub fn occurrence_abandoned(job: &str, scheduled_at: &str) {
    debug!(
        event = "occurrence_abandoned",
        job,
        scheduled_at,
        "stopping: no longer waiting for the store's answer; a win it brings is given back"
    );
}

/// This host's clock is ahead of the store's: the occurrence is attempted
/// again when the store's clock reaches it (debug level).
pub fn occurrence_early(job: &str, scheduled_at: &str, ahead_ms: i64) {
    debug!(
        event = "occurrence_early",
        job, scheduled_at, ahead_ms, "occurrence not yet due by the store's clock; waiting"
    );
}

/// A fenced write was refused. A stale-owner event.
pub fn stale_write_rejected(rec: &StaleRecord) {
    crate::metrics::stale_write_rejected(rec.job.as_deref());
    warn!(
        event = "stale_write_rejected",
        resource = %rec.resource,
        key = rec.key.as_deref(),
        owner_id = rec.owner_id.as_ref().map(OwnerId::as_str),
        token = rec.token.get(),
        accepted_token = rec.accepted_token.map(Token::get),
        node = %rec.node,
        job = rec.job.as_deref(),
        stage = %rec.stage,
        reason = %rec.reason,
        operation_id = %rec.operation_id,
        "stale write rejected"
    );
}

/// The trigger that keeps older fencecron binaries from applying their
/// migrations again (on a kept `_sqlx_migrations`) could not be created.
fn migration_guard_failed(guard: &str, error: &str) {
    warn!(
        event = "migration_guard_failed",
        error,
        "could not put the guard trigger {guard} on _sqlx_migrations, which stops older fencecron binaries from applying their migrations again; allow this user to create a trigger on that table"
    );
}

/// A store call failed; the caller will retry. WARN for the first failure
/// of an outage (per job, or per operation without a job), DEBUG for the
/// rest ([`Outages`]).
pub fn store_unavailable(
    outages: &Outages,
    operation: &str,
    job: Option<&str>,
    error: &str,
    retry_in: Option<Duration>,
) {
    let retry_in_ms = retry_in.map(ms);
    if outages.failed(operation, job) {
        warn!(
            event = "store_unavailable",
            operation, job, error, retry_in_ms, "store unavailable"
        );
    } else {
        debug!(
            event = "store_unavailable",
            operation, job, error, retry_in_ms, "store still unavailable"
        );
    }
}

/// The store answered again for `job` (or for the `operation` of a call
/// without a job) after `failures` failed calls over `took`: the outage
/// [`store_unavailable`] began is over.
fn store_available(ended: &Ended) {
    info!(
        event = "store_available",
        job = ended.job.as_deref(),
        operation = ended.operation.as_deref(),
        failures = ended.failures,
        duration_ms = ms(ended.took),
        "store available again"
    );
}

/// The store answered a call for `job`: logs the end of its outage, if it
/// was in one ([`Outages::answered`]).
pub fn store_answered(outages: &Outages, job: &str) {
    if let Some(ended) = outages.answered(job) {
        store_available(&ended);
    }
}

/// The store answered a call that shows it reachable for all: logs the end
/// of every outage ([`Outages::answered_all`]).
pub fn store_answered_all(outages: &Outages) {
    for ended in outages.answered_all() {
        store_available(&ended);
    }
}

/// A SQLite connection came back to the pool still inside a transaction
/// (after an error in a write transaction) and was closed instead of being
/// reused; the next call opens a fresh one.
fn store_connection_discarded(sqlite_autocommit: bool, sqlx_in_transaction: bool) {
    warn!(
        event = "store_connection_discarded",
        sqlite_autocommit,
        sqlx_in_transaction,
        "closed a SQLite connection left inside a failed transaction"
    );
}

/// The hook every store is opened with ([`crate::store::OpenOptions::hook`]):
/// what the store noticed becomes its event, and with `metrics` (the daemon
/// with `[http]`) every call moves the store metrics and `/readyz`.
pub fn store_hook(metrics: bool) -> Arc<dyn StoreHook> {
    Arc::new(StoreEvents { metrics })
}

/// See [`store_hook`].
struct StoreEvents {
    metrics: bool,
}

impl StoreHook for StoreEvents {
    fn called(&self, operation: &'static str, took: Duration, end: CallEnd) {
        if self.metrics {
            crate::metrics::store_call(operation, took, end.answered());
        }
    }

    fn noticed(&self, notice: Notice<'_>) {
        match notice {
            Notice::MigrationGuardFailed { guard, error } => migration_guard_failed(guard, error),
            Notice::ConnectionDiscarded {
                sqlite_autocommit,
                sqlx_in_transaction,
            } => store_connection_discarded(sqlite_autocommit, sqlx_in_transaction),
        }
    }
}

/// A stale-owner record could not be stored (it is still logged).
pub fn stale_record_failed(resource: &str, error: &str) {
    error!(
        event = "stale_record_failed",
        resource, error, "could not record a stale-owner event in the store"
    );
}

/// The daemon is up and scheduling. `scope` is which daemons its store
/// fences against each other: `host` (SQLite: this host's only) or `fleet`
/// (a shared database server). `process_tree` names how each run's whole
/// process tree is stopped: `cgroup` (a cgroup of its own per run, under a
/// delegated cgroup v2) or `subreaper` (the run's watchdog as child
/// subreaper alone).
pub fn daemon_started(
    node: &str,
    jobs: usize,
    store: &str,
    scope: &str,
    config: &str,
    process_tree: &str,
) {
    if scope == "host" {
        info!(
            event = "daemon_started",
            node,
            jobs,
            store,
            scope,
            config,
            process_tree,
            "daemon started; its store fences the daemons of this host only (set [store] for a fleet)"
        );
    } else {
        info!(
            event = "daemon_started",
            node,
            jobs,
            store,
            scope,
            config,
            process_tree,
            "daemon started; its store fences every daemon that uses it (a fleet)"
        );
    }
}

/// `fencecron proxy` is listening.
pub fn proxy_started(listen: &str, upstream: &str, node: &str, store: &str) {
    info!(
        event = "proxy_started",
        listen, upstream, node, store, "fencing proxy listening"
    );
}

/// `fencecron proxy` got a stop signal: it accepts no more connections and
/// lets the `open` ones finish their requests.
pub fn proxy_stopping(open: usize) {
    info!(
        event = "proxy_stopping",
        open, "fencing proxy stopping; finishing in-flight requests"
    );
}

/// `fencecron proxy` has stopped; `abandoned` connections were still busy
/// when its drain time ran out.
pub fn proxy_stopped(abandoned: usize) {
    info!(event = "proxy_stopped", abandoned, "fencing proxy stopped");
}

/// The proxy admitted a request but its upstream could not be reached or
/// did not answer in time (answered 502 or 504).
pub fn proxy_upstream_failed(resource: &str, token: Token, upstream: &str, error: &str) {
    warn!(
        event = "proxy_upstream_failed",
        resource,
        token = token.get(),
        upstream,
        error,
        "the fencing proxy's upstream failed"
    );
}

/// The daemon is shutting down. `running` counts the occurrences being
/// acquired or run on this node. `drain` is how long running jobs may still
/// finish by themselves (`node.shutdown_grace` on a first SIGTERM): the
/// node competes for nothing more meanwhile; zero when it stops them at
/// once (SIGINT, a second SIGTERM, `shutdown_grace = "0s"`).
pub fn daemon_stopping(reason: &str, running: usize, drain: Duration) {
    let drain_ms = ms(drain);
    if drain.is_zero() {
        info!(
            event = "daemon_stopping",
            reason, running, drain_ms, "daemon stopping: terminating running jobs"
        );
    } else {
        info!(
            event = "daemon_stopping",
            reason,
            running,
            drain_ms,
            "daemon stopping: draining, running jobs may finish by themselves"
        );
    }
}

/// A drain ended after `took`: `reason` is `runs_finished` (nothing was
/// left to stop), `grace_expired` (`running` runs are stopped now), or the
/// signal that cut it short (`SIGTERM`, `SIGINT`).
pub fn drain_ended(reason: &str, running: usize, took: Duration) {
    let duration_ms = ms(took);
    info!(
        event = "drain_ended",
        reason, running, duration_ms, "drain ended"
    );
}

/// The daemon has stopped.
pub fn daemon_stopped() {
    info!(event = "daemon_stopped", "daemon stopped");
}

/// A new config took effect.
pub fn config_reloaded(added: usize, removed: usize, changed: usize, jobs: usize) {
    info!(
        event = "config_reloaded",
        added, removed, changed, jobs, "configuration reloaded"
    );
}

/// A reload was refused; the old config stays.
pub fn config_invalid(error: &str) {
    error!(
        event = "config_invalid",
        error, "configuration reload failed; keeping the previous configuration"
    );
}

/// The config asks for something this daemon cannot change on reload.
pub fn config_ignored(key: &str, detail: &str) {
    warn!(
        event = "config_ignored",
        key, detail, "configuration change needs a restart"
    );
}

/// A run an earlier daemon process on this node left behind, as
/// [`run_recovered`] names it (`runs::RunRecord::left`).
#[derive(Debug, Clone, Copy)]
pub struct LeftRun<'a> {
    pub job: &'a str,
    pub resource: &'a str,
    pub owner_id: OwnerId,
    pub token: Token,
    /// The job's process group.
    pub pid: u32,
}

/// A run left behind by an earlier daemon process on this node was dealt
/// with at start-up: `outcome` is `released` (provably dead; its lease given
/// back), `already_ended` (the store no longer held it for that run) or
/// `still_alive` (left to expire by itself).
pub fn run_recovered(rec: &LeftRun<'_>, node: &str, outcome: &str, detail: &str) {
    warn!(
        event = "run_recovered",
        job = %rec.job,
        resource = %rec.resource,
        owner_id = %rec.owner_id,
        token = rec.token.get(),
        pid = rec.pid,
        node,
        outcome,
        detail,
        "run of an earlier daemon process recovered"
    );
}

/// The daemon could not note a run for its successor (the run goes on; after
/// a crash its lease would expire by itself instead of being given back).
pub fn run_record_failed(job: Option<&str>, error: &str) {
    warn!(
        event = "run_record_failed",
        job, error, "could not write the run record"
    );
}

/// A run's cgroup could not be removed once its processes were gone (it
/// is left empty under the delegated cgroup).
pub fn run_cgroup_left(cgroup: &str, error: &str) {
    warn!(
        event = "run_cgroup_left",
        cgroup, error, "could not remove the run's cgroup"
    );
}

/// The spawner that forks the runs' watchdogs could not be started or
/// reached (twice): this run's watchdog is executed by the daemon itself,
/// which costs more CPU but runs the job the same way.
pub fn spawner_unavailable(error: &str) {
    warn!(
        event = "spawner_unavailable",
        error, "could not hand the run to the spawner; the daemon starts its watchdog itself"
    );
}

/// Inherited variables whose value contains the store's password are kept
/// out of every job's environment (names only, never values).
pub fn job_env_filtered(variables: &str) {
    warn!(
        event = "job_env_filtered",
        variables,
        "these variables contain the store's password and are removed from every job's environment"
    );
}

/// The live nodes disagree about a job: a different definition (the nodes
/// with each one, by digest) or some lack it. Logged once per change of
/// the job's drift by each daemon that sees it, not per heartbeat.
pub fn config_drift(d: &crate::fleet::Drift, jobs_in_drift: usize) {
    crate::metrics::config_drift_jobs(jobs_in_drift);
    warn!(
        event = "config_drift",
        job = d.job.as_str(),
        nodes_with = d.with_text().as_str(),
        nodes_without = d.nodes_without.join(",").as_str(),
        definitions = d.nodes_with.len(),
        "the live nodes disagree about a job's definition"
    );
}

/// The live nodes agree again about a job (changed, left, or the nodes that
/// disagreed are gone).
pub fn config_drift_resolved(job: &str, jobs_in_drift: usize) {
    crate::metrics::config_drift_jobs(jobs_in_drift);
    info!(
        event = "config_drift_resolved",
        job, "the live nodes agree about the job again"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the store tells its hook reaches the log as the events
    /// docs/events.md lists, with their fields.
    #[test]
    fn the_store_hook_logs_notices_as_their_events() {
        let (events, _guard) = crate::testing::events::Captured::start();
        let hook = store_hook(false);
        hook.noticed(Notice::MigrationGuardFailed {
            guard: "fencecron_legacy_guard",
            error: "no trigger for you",
        });
        hook.noticed(Notice::ConnectionDiscarded {
            sqlite_autocommit: false,
            sqlx_in_transaction: true,
        });
        let guard = events.named("migration_guard_failed");
        assert_eq!(guard.len(), 1);
        assert_eq!(guard[0].level, tracing::Level::WARN);
        assert_eq!(guard[0].get("error"), "no trigger for you");
        let discarded = events.named("store_connection_discarded");
        assert_eq!(discarded.len(), 1);
        assert_eq!(discarded[0].level, tracing::Level::WARN);
        assert_eq!(discarded[0].get("sqlite_autocommit"), "false");
        assert_eq!(discarded[0].get("sqlx_in_transaction"), "true");
    }
}

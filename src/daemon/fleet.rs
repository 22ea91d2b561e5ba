//! The daemon's part in operating the fleet from the store: runs asked for
//! with `fencecron trigger`, and the run history's retention.
//!
//! Triggers are polled: every [`crate::store::TRIGGER_POLL`] (2 s) the
//! scheduler loop starts one `pending_triggers` read (never two at once),
//! the idle cost of the feature: one indexed read of a table that is empty
//! unless a trigger waits, 30 statements a minute per daemon; while the
//! node's view of the live nodes is trusted, only the period's two pollers
//! read (`super::assign::pollers`), 30 a minute for the whole fleet. A pending trigger for one of this
//! daemon's jobs is claimed (exactly one daemon's claim succeeds; a daemon
//! at `node.max_running` claims none), then the
//! job's lease is acquired like `exec` acquires one (no occurrence: a new
//! token) with the run recorded as `manual`; the trigger then says
//! `started` with that token, or `refused` with the holder when the job is
//! running somewhere. A manual run follows the job's `retries` like a
//! scheduled one (the same back-off and `retry_scheduled`/`retry_abandoned`,
//! each attempt a fresh acquire recorded as `manual`); each attempt's start
//! moves the trigger's token to it (detail `attempt N of M`), and once the
//! last attempt's end is recorded the trigger says `ended` with its token:
//! what `trigger --wait` waits for.
//!
//! Retention runs every [`PRUNE_EVERY`] (first a minute after start): in
//! one statement, every job's runs beyond its newest `history.keep` or
//! older than `history.max_age` go; then triggers and ended pauses older
//! than a day, stale-owner records older than `history.stale` and values
//! of resources unused for `history.values`. Lease rows and the proxy's
//! fences are never pruned (a fence must keep growing).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::occurrence::{on_failure, run_under_lease, Slot};
use super::{ensure_ready, Shared};
use crate::backoff::Backoff;
use crate::config::Job;
use crate::domain::TriggerState;
use crate::events::{self, AbandonReason};
use crate::store::{
    self, millis, AcquireOutcome, AcquireRequest, RunStart, StartedBy, StoreTime, TriggerInfo,
};

/// How often a daemon prunes the run history.
pub(super) const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// The first prune after start.
pub(super) const FIRST_PRUNE: Duration = Duration::from_secs(60);

/// Triggers and ended pauses are kept this long.
const TRIGGER_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Looks for pending triggers of `jobs` and starts each one this daemon
/// claims.
pub(super) async fn poll_triggers(shared: Shared, jobs: HashMap<String, Arc<Job>>) {
    let store = shared.supervisor.store().clone();
    if ensure_ready(&shared.ready, store.as_ref()).await.is_err() {
        return;
    }
    let pending = match store.pending_triggers().await {
        Ok(p) => {
            events::store_answered_all(store.outages());
            p
        }
        Err(e) => {
            events::store_unavailable(
                store.outages(),
                "pending_triggers",
                None,
                &e.to_string(),
                None,
            );
            return;
        }
    };
    for trigger in pending {
        if shared.draining.is_cancelled() {
            // A stopping node claims nothing: the trigger stays pending
            // for another daemon.
            break;
        }
        let Some(job) = jobs.get(&trigger.job) else {
            continue;
        };
        // A node at capacity does not claim: the trigger stays pending for
        // another daemon, or for this one's next poll.
        let Some(slot) = shared.capacity.try_take() else {
            break;
        };
        match store
            .claim_trigger(&trigger.id, shared.supervisor.node())
            .await
        {
            Ok(true) => {
                let (shared, job) = (shared.clone(), job.clone());
                shared
                    .tracker
                    .clone()
                    .spawn(async move { run_triggered(shared, job, trigger, slot).await });
            }
            Ok(false) => {}
            Err(e) => events::store_unavailable(
                store.outages(),
                "claim_trigger",
                Some(&trigger.job),
                &e.to_string(),
                None,
            ),
        }
    }
}

/// Runs a trigger this daemon claimed: a manual run under a new token, or
/// the refusal when the job holds its lease somewhere. The run holds `_slot`
/// of the node's capacity until it ends.
async fn run_triggered(shared: Shared, job: Arc<Job>, trigger: TriggerInfo, _slot: Slot) {
    let store = shared.supervisor.store().clone();
    let name = job.name.as_str();
    let resource = job.resource.to_string();
    let Some(_running) = shared.running.enter(&resource, false) else {
        let detail = format!(
            "{name} is being acquired or run on {} already",
            shared.supervisor.node()
        );
        settle(&store, &trigger, TriggerState::Refused, None, &detail).await;
        events::trigger_refused(name, &trigger.id, &detail);
        return;
    };
    let sent = Instant::now();
    let acquired = acquire_manual(&store, &shared, &job, name).await;
    match acquired {
        Ok(AcquireOutcome::Acquired(lease)) => {
            let retries = job.retry.retries;
            let mut token = lease.token;
            settle(
                &store,
                &trigger,
                TriggerState::Started,
                Some(token),
                &attempt_of(0, retries),
            )
            .await;
            events::trigger_started(name, &trigger.id, &trigger.requested_by, token);
            let mut failed = run_under_lease(&shared, &job, lease, sent, None).await;
            let mut attempt = 0;
            while let Some(f) = &failed {
                if attempt >= retries || !f.retryable() {
                    break;
                }
                attempt += 1;
                match retry_manual(&shared, &job, &trigger, attempt).await {
                    Some((t, result)) => (token, failed) = (t, result),
                    None => break,
                }
            }
            settle_ended(&store, &trigger, token).await;
            if let Some(failed) = failed {
                on_failure(&shared, &job, failed);
            }
        }
        Ok(other) => {
            let detail = refusal(&other);
            settle(&store, &trigger, TriggerState::Refused, None, &detail).await;
            events::trigger_refused(name, &trigger.id, &detail);
        }
        Err(e) => {
            let detail = format!("the store failed to grant the lease: {e}");
            settle(&store, &trigger, TriggerState::Refused, None, &detail).await;
            events::trigger_refused(name, &trigger.id, &detail);
        }
    }
}

/// Says the trigger `ended` with the last attempt's `token`, trying again
/// after 1, 2, 4 and 8 s while the store fails: `trigger --wait` waits for
/// this word while the run's node is live, so a store blip must not leave
/// it waiting. A store down for longer leaves the trigger `started` (and
/// `store_unavailable` logged each time).
async fn settle_ended(store: &Arc<dyn store::Store>, trigger: &TriggerInfo, token: store::Token) {
    let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(8));
    for attempt in 0..5 {
        if attempt > 0 {
            tokio::time::sleep(backoff.wait()).await;
        }
        match store
            .settle_trigger(&trigger.id, TriggerState::Ended, Some(token), None)
            .await
        {
            Ok(()) => return,
            Err(e) => events::store_unavailable(
                store.outages(),
                "settle_trigger",
                Some(&trigger.job),
                &e.to_string(),
                None,
            ),
        }
    }
}

/// The trigger's detail while attempt `attempt` (0: the first run) runs.
fn attempt_of(attempt: u32, retries: u32) -> String {
    format!("attempt {} of {}", attempt + 1, retries + 1)
}

/// Retry number `attempt` of a failed manual run, as a scheduled run's
/// retry: after the job's back-off (`retry_scheduled`), a fresh acquire
/// recorded as `manual` like the run it retries (so, like it, not held back
/// by a pause; there is no next instant to yield to), the trigger's token
/// moved to it before it runs. `None` when it did not run
/// (`retry_abandoned` says why: the lease is held, the store failed; a
/// stopping node starts no new run). Else its token and how it failed.
async fn retry_manual(
    shared: &Shared,
    job: &Arc<Job>,
    trigger: &TriggerInfo,
    attempt: u32,
) -> Option<(store::Token, Option<super::occurrence::Failed>)> {
    let name = job.name.as_str();
    let store = shared.supervisor.store().clone();
    let delay = job.retry.delay(attempt);
    events::retry_scheduled(name, "", attempt, delay);
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shared.draining.cancelled() => return None,
    }
    let sent = Instant::now();
    let acquired = acquire_manual(&store, shared, job, name).await;
    let (reason, detail) = match acquired {
        Ok(AcquireOutcome::Acquired(lease)) => {
            let token = lease.token;
            let detail = attempt_of(attempt, job.retry.retries);
            settle(&store, trigger, TriggerState::Started, Some(token), &detail).await;
            let failed = run_under_lease(shared, job, lease, sent, None).await;
            return Some((token, failed));
        }
        Ok(other) => (AbandonReason::Held, refusal(&other)),
        Err(e) => (AbandonReason::StoreUnavailable, e.to_string()),
    };
    events::retry_abandoned(name, "", attempt, reason, &detail);
    None
}

/// Why a manual run's acquire lost, for the trigger and its requester.
fn refusal(outcome: &AcquireOutcome) -> String {
    match outcome {
        AcquireOutcome::Held {
            owner_id,
            node,
            token,
            expires_at,
        } => format!(
            "the job is running: its lease is held by {owner_id} on {node} with token {token} until {expires_at}"
        ),
        AcquireOutcome::LostRace => {
            "the job's lease was just taken by another acquirer".to_string()
        }
        other => format!("the lease was not granted ({other:?})"),
    }
}

/// Records how a claimed trigger went; a store that cannot take it leaves
/// the trigger `claimed`, which the waiting `fencecron trigger` reports.
async fn settle(
    store: &Arc<dyn store::Store>,
    trigger: &TriggerInfo,
    state: TriggerState,
    token: Option<store::Token>,
    detail: &str,
) {
    let detail = (!detail.is_empty()).then_some(detail);
    if let Err(e) = store
        .settle_trigger(&trigger.id, state, token, detail)
        .await
    {
        events::store_unavailable(
            store.outages(),
            "settle_trigger",
            Some(&trigger.job),
            &e.to_string(),
            None,
        );
    }
}

/// Applies the run history's retention (and drops old triggers and ended
/// pauses): three statements an hour per daemon, whatever the number of
/// jobs. Every job of the store is pruned, also one that left the config
/// (its history ages out).
pub(super) async fn prune(shared: Shared) {
    let store = shared.supervisor.store().clone();
    if ensure_ready(&shared.ready, store.as_ref()).await.is_err() {
        return;
    }
    let now = match store.now().await {
        Ok(now) => now,
        Err(e) => {
            events::store_unavailable(store.outages(), "prune", None, &e.to_string(), None);
            return;
        }
    };
    let history = shared.history;
    let before = StoreTime(now.0 - millis(history.max_age));
    let removed = match store.prune_runs(history.keep, before).await {
        Ok(n) => n,
        Err(e) => {
            events::store_unavailable(store.outages(), "prune", None, &e.to_string(), None);
            return;
        }
    };
    let old = StoreTime(now.0 - millis(TRIGGER_RETENTION));
    let other = match store.prune_fleet(old).await {
        Ok(n) => n,
        Err(e) => {
            events::store_unavailable(store.outages(), "prune", None, &e.to_string(), None);
            return;
        }
    };
    // Stale records and values only: a lease row (and its fence) is never
    // deleted, and neither are the proxy's fences (see `Store::admit`).
    let stale = match store
        .prune_stale(StoreTime(now.0 - millis(history.stale)))
        .await
    {
        Ok(n) => n,
        Err(e) => {
            events::store_unavailable(store.outages(), "prune", None, &e.to_string(), None);
            return;
        }
    };
    match store
        .prune_values(StoreTime(now.0 - millis(history.values)))
        .await
    {
        Ok(values) => events::history_pruned(removed, other, stale, values),
        Err(e) => events::store_unavailable(store.outages(), "prune", None, &e.to_string(), None),
    }
}

/// One attempt of a manual run: an acquire under a fresh owner id, for no
/// scheduled instant, that records the run as `manual` (the first attempt
/// and every retry alike).
async fn acquire_manual(
    store: &Arc<dyn store::Store>,
    shared: &Shared,
    job: &Job,
    name: &str,
) -> Result<AcquireOutcome, store::StoreError> {
    store
        .acquire(&AcquireRequest {
            resource: &job.resource,
            lease: job.timing.lease,
            node: shared.supervisor.node(),
            owner_id: store::OwnerId::fresh(),
            occurrence: None,
            next_occurrence: None,
            run: Some(RunStart {
                job: name,
                started_by: StartedBy::Manual,
                scheduled_at: None,
            }),
        })
        .await
}

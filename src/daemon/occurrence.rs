//! One scheduled occurrence on this node: compete for its lease, run the job
//! if this node wins, and make sure a win nobody uses goes back.
//!
//! Every occurrence enters through its instant's batch claim
//! ([`super::claim`]), which skips it at once when this node already
//! acquires or runs the job, picks one owner id for every attempt at it
//! (so that a retry *adopts* a win of an earlier attempt whose answer never
//! came back), and decides it ([`Decision`]). The rest of the policy, step
//! by step ([`Occurrence::run_entered`]):
//!
//! * a claim's win runs, its loss ends the occurrence; what it left
//!   undecided ([`Undecided`]) waits for a place in the node's capacity and
//!   competes with the single acquire, the claim's failure counting as its
//!   first failed attempt;
//! * retry a failing store with backoff until the occurrence is no longer
//!   worth starting (the job's next instant, or a lease length after the
//!   instant); an attempt still hanging then is abandoned, and should it
//!   win after all, the lease is given back with its occurrence
//!   ([`give_back_late`]);
//! * a store whose clock is behind this host's (`NotYetDue`) is waited for,
//!   up to [`MAX_CLOCK_AHEAD`]; a store already past the job's next instant
//!   (`Superseded`) means this host's clock runs behind: skip;
//! * if any attempt went unanswered and the job did not run here, sweep for
//!   a win of this owner id later ([`Occurrence::sweep`]);
//! * once the daemon drains, send no attempt and stop waiting (for a place,
//!   a retry, the store's clock, a retry of a failed run): the other nodes
//!   take the instant. An attempt already sent is answered as usual, and a
//!   win runs: the other nodes have lost the instant by then, so a win
//!   given back would run nowhere.
//!
//! *Invariant:* an occurrence never starts after the job's next instant is
//! due. Wall time comes from the [`Clock`] seam, waiting from tokio's
//! clock, so the whole policy runs in tests on tokio's paused clock.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::{ensure_ready, hook, Shared};
use crate::config::{Job, Overlap};
use crate::domain::RunOutcome;
use crate::events::{self, AbandonReason, SkipReason};
use crate::fence;
use crate::store::{
    rfc3339, AcquireOutcome, AcquireRequest, Lease, OwnerId, RunStart, StartedBy, Store,
    StoreError, StoreTime,
};
use crate::supervise::{RunSpec, SuperviseError, Unused};

/// How far ahead of the store's clock this host's clock may run before an
/// occurrence is skipped instead of waited for.
pub(super) const MAX_CLOCK_AHEAD: Duration = Duration::from_secs(60);

/// How an occurrence ended on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// This node won the lease: the job ran, could not be started, or the
    /// answer came too late to run it safely and the lease went back
    /// (`acquired_too_late`).
    Won,
    /// Skipped, with the reason `occurrence_skipped` logs: `held`,
    /// `store_unavailable`, `clock_ahead`, `clock_behind`, `missed`.
    Skipped(SkipReason),
    /// Another node took it (`occurrence_taken`).
    Taken,
    /// Another node's chunk of the instant: this node did not ask the
    /// store about it (`occurrences_assigned`, [`super::assign`]).
    Assigned,
    /// The daemon is stopping.
    Stopped,
}

/// What the instant's batch claim decided for one occurrence
/// ([`super::claim`]); [`Occurrence::run_entered`] follows it.
pub(super) enum Decision {
    /// The claim won the lease (sent at `sent`, holding `slot`): the job
    /// runs as if its single acquire had won.
    Won {
        lease: Lease,
        sent: Instant,
        slot: Slot,
    },
    /// Another owner holds the lease or took the occurrence (as a losing
    /// acquire reports it).
    Lost(AcquireOutcome),
    /// The claim did not decide: the single acquire does, with its
    /// retries, under the same owner id.
    Undecided(Undecided),
}

/// Why the claim left an occurrence to the single acquire.
#[derive(Debug)]
pub(super) enum Undecided {
    /// The store asked for it (paused, a clock ahead or behind, a new row
    /// another caller created while the claim ran).
    Asked,
    /// `overlap = "replace"`: not claimed, since only the single acquire
    /// ends an earlier run's lease.
    Replace,
    /// The node had no free place: nothing was claimed.
    AtCapacity,
    /// The claim sent at `sent` failed: the occurrence's first failed
    /// attempt (it may have committed: the retry adopts, the sweep gives
    /// back).
    Failed {
        error: Arc<StoreError>,
        sent: Instant,
    },
}

/// One scheduled occurrence on this node: compete, and run if we win.
pub(super) struct Occurrence {
    pub(super) shared: Shared,
    pub(super) job: Arc<Job>,
    /// The scheduled instant, which names the occurrence fleet-wide.
    pub(super) at: DateTime<Utc>,
}

/// The resources with an occurrence (or a manual run) being acquired or
/// run on this node, and how many: more than one only under
/// `overlap = "replace"`, while the replaced run is being terminated.
#[derive(Clone, Default)]
pub(super) struct Running {
    resources: Arc<Mutex<HashMap<String, usize>>>,
    /// Woken whenever a run leaves (a drain waits for the last).
    left: Arc<Notify>,
}

impl Running {
    /// Enters `resource`; `None` when it is in progress here already and
    /// `overlap` does not allow a second one.
    pub(super) fn enter(&self, resource: &str, overlap: bool) -> Option<RunningGuard> {
        let mut r = self.resources.lock().unwrap_or_else(|p| p.into_inner());
        let n = r.entry(resource.to_string()).or_insert(0);
        if *n > 0 && !overlap {
            return None;
        }
        *n += 1;
        Some(RunningGuard {
            running: self.clone(),
            resource: resource.to_string(),
        })
    }

    /// How many resources are in progress.
    pub(super) fn len(&self) -> usize {
        self.resources.lock().map(|r| r.len()).unwrap_or(0)
    }

    /// Completes when a run leaves after this call (it is registered at
    /// once, before it is first polled): read [`Running::len`] after
    /// calling it, then wait.
    pub(super) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.left.notified()
    }
}

/// `node.max_running`: how many runs this node holds at once. A run holds
/// a [`Slot`] from before it competes until its lease is released (its
/// retries included), so a node at capacity does not claim.
#[derive(Clone, Default)]
pub(super) struct Capacity(Option<(Arc<Semaphore>, usize)>);

/// A place in the node's capacity (holding nothing without a limit).
#[derive(Default)]
pub(super) struct Slot {
    _permit: Option<OwnedSemaphorePermit>,
}

impl Capacity {
    pub(super) fn new(max_running: Option<u32>) -> Capacity {
        Capacity(max_running.map(|n| (Arc::new(Semaphore::new(n as usize)), n as usize)))
    }

    /// The limit, if there is one.
    pub(super) fn limit(&self) -> Option<usize> {
        self.0.as_ref().map(|(_, n)| *n)
    }

    /// A slot if one is free now (always without a limit).
    pub(super) fn try_take(&self) -> Option<Slot> {
        match &self.0 {
            None => Some(Slot::default()),
            Some((s, _)) => s
                .clone()
                .try_acquire_owned()
                .ok()
                .map(|p| Slot { _permit: Some(p) }),
        }
    }

    /// Waits for a free slot (first come, first served).
    pub(super) async fn take(&self) -> Slot {
        match &self.0 {
            None => Slot::default(),
            // The semaphore is never closed.
            Some((s, _)) => Slot {
                _permit: s.clone().acquire_owned().await.ok(),
            },
        }
    }
}

/// Leaves a resource of the node's running set when its run ends.
pub(super) struct RunningGuard {
    running: Running,
    resource: String,
}

impl Drop for RunningGuard {
    fn drop(&mut self) {
        {
            let mut r = self
                .running
                .resources
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(n) = r.get_mut(&self.resource) {
                *n -= 1;
                if *n == 0 {
                    r.remove(&self.resource);
                }
            }
        }
        self.running.left.notify_waiters();
    }
}

impl Occurrence {
    /// Enters the job in the node's running set, or logs the skip (`held`)
    /// when an earlier occurrence of it is in progress here (unless
    /// `overlap = "replace"`: the new instant competes anyway, and the store
    /// ends the earlier run's lease, wherever it runs).
    pub(super) fn enter(&self) -> Option<RunningGuard> {
        let job = &self.job;
        let replace = job.overlap == Overlap::Replace;
        let guard = self.shared.running.enter(job.resource.as_str(), replace);
        if guard.is_none() {
            // Known locally; no need to ask the store.
            events::occurrence_skipped(
                job.name.as_str(),
                &rfc3339(self.at),
                SkipReason::Held,
                "an earlier occurrence of this job is still being acquired or run on this node",
            );
        }
        guard
    }

    /// The occurrence once the job is in the running set, as its claim
    /// decided (`owner_id`: the claim's): a win runs, a loss ends it;
    /// undecided, it waits for a place in the capacity and competes under
    /// `owner_id`. Returns how it ended here. Background work it leaves (an
    /// abandoned attempt, a sweep) runs on the daemon's task tracker.
    pub(super) async fn run_entered(
        self,
        _guard: RunningGuard,
        owner_id: OwnerId,
        decision: Decision,
    ) -> Ending {
        let why = match decision {
            Decision::Won { lease, sent, slot } => {
                let _slot = slot;
                return self.run_won(lease, sent).await;
            }
            Decision::Lost(lost) => return self.lost(lost),
            Decision::Undecided(why) => why,
        };
        let _slot = match self.slot().await {
            Ok(slot) => slot,
            Err(ending) => return ending,
        };
        let mut unanswered = false;
        let ending = self.compete(owner_id, why, &mut unanswered).await;
        if ending != Ending::Won && unanswered {
            self.sweep(owner_id);
        }
        ending
    }

    pub(super) fn name(&self) -> &str {
        self.job.name.as_str()
    }

    fn store(&self) -> &Arc<dyn Store> {
        self.shared.supervisor.store()
    }

    fn node(&self) -> &str {
        self.shared.supervisor.node()
    }

    /// Competes for the occurrence with the single acquire until it runs
    /// here, is decided elsewhere or is given up; after a failed claim
    /// (`why`), that failure is the first attempt. `unanswered` is set when
    /// an attempt ended without an answer, so its statement may still win
    /// in the store.
    async fn compete(&self, owner_id: OwnerId, why: Undecided, unanswered: &mut bool) -> Ending {
        let job = &self.job;
        let name = self.name();
        let at = rfc3339(self.at);
        let next = job.schedule.next_after(self.at);
        // Retry a failing store until the occurrence is no longer worth
        // starting.
        let (mut give_up, deadline) = self.give_up();
        let mut failed_claim = match why {
            Undecided::Failed { error, sent } => Some((error, sent)),
            Undecided::Asked | Undecided::Replace | Undecided::AtCapacity => None,
        };
        if let Some(deadline) = deadline.filter(|_| failed_claim.is_none()) {
            if self.shared.clock.now() >= deadline {
                return self.past_deadline(deadline);
            }
        }
        let mut delay = Duration::from_millis(100);
        loop {
            // Every attempt, including one that hangs on a stalled store or
            // a starved pool, is given up at `give_up`: an occurrence that
            // started that late would hold up the next one, which this node
            // then skips locally.
            let sent_wall = self.shared.clock.now();
            let give_up_in = (give_up - sent_wall).to_std().unwrap_or(Duration::ZERO);
            let (outcome, sent) = if let Some((error, sent)) = failed_claim.take() {
                // The batch claim failed before the give-up time.
                (Err(error), sent)
            } else {
                if self.shared.draining.is_cancelled() {
                    // Not even a claim: the other nodes take the instant
                    // without waiting for anything of ours.
                    return Ending::Stopped;
                }
                let sent = Instant::now();
                let mut attempt = Box::pin(acquire_attempt(
                    self.store().clone(),
                    self.shared.ready.clone(),
                    job.clone(),
                    self.node().to_string(),
                    owner_id,
                    (self.at, next),
                ));
                let outcome = tokio::select! {
                    r = &mut attempt => r,
                    _ = tokio::time::sleep_until(sent + give_up_in) => {
                        // Should the store time this call out, its statement may
                        // still commit later, out of `give_back_if_won`'s sight.
                        *unanswered = true;
                        self.give_back_if_won(attempt);
                        return self.unanswered(give_up, deadline);
                    }
                    _ = self.shared.shutdown.cancelled() => {
                        self.give_back_if_won(attempt);
                        events::occurrence_abandoned(name, &at);
                        return Ending::Stopped;
                    }
                };
                (outcome.map_err(Arc::new), sent)
            };
            if outcome.is_ok() {
                // The store answered for this job: its outage, if any, ends.
                events::store_answered(self.store().outages(), name);
            }
            let wait = match outcome {
                Ok(AcquireOutcome::Acquired(lease)) => return self.run_won(lease, sent).await,
                Ok(AcquireOutcome::NotYetDue { store_now }) => {
                    // This host's clock runs ahead of the store's: wait until
                    // the store reaches the instant, then compete as usual.
                    let ahead = match self.not_yet_due(store_now) {
                        Ok(ahead) => ahead,
                        Err(ending) => return ending,
                    };
                    // The occurrence's deadline moves with the store's
                    // clock, or a host running ahead would never run a job
                    // whose interval is shorter than its offset.
                    give_up += chrono::Duration::from_std(ahead).unwrap_or_default();
                    ahead + Duration::from_millis(1)
                }
                Ok(AcquireOutcome::Superseded { store_now }) => {
                    return self.superseded(store_now, next, sent_wall, sent)
                }
                Ok(lost) => return self.lost(lost),
                Err(e) => {
                    *unanswered = true;
                    let now = self.shared.clock.now();
                    if now + chrono::Duration::from_std(delay).unwrap_or_default() >= give_up {
                        events::store_unavailable(
                            self.store().outages(),
                            "acquire",
                            Some(name),
                            &e.to_string(),
                            None,
                        );
                        if deadline == Some(give_up) {
                            return self.past_deadline(give_up);
                        }
                        events::occurrence_skipped(
                            name,
                            &at,
                            SkipReason::StoreUnavailable,
                            &e.to_string(),
                        );
                        return Ending::Skipped(SkipReason::StoreUnavailable);
                    }
                    events::store_unavailable(
                        self.store().outages(),
                        "acquire",
                        Some(name),
                        &e.to_string(),
                        Some(delay),
                    );
                    let wait = delay;
                    delay = (delay * 2).min(Duration::from_secs(5));
                    wait
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.shared.draining.cancelled() => return Ending::Stopped,
            }
        }
    }

    /// The store has not answered by `give_up`, when the occurrence is no
    /// longer worth starting (`deadline`: its `starting_deadline`, if that
    /// is what `give_up` is): how it ends.
    pub(super) fn unanswered(
        &self,
        give_up: DateTime<Utc>,
        deadline: Option<DateTime<Utc>>,
    ) -> Ending {
        if deadline == Some(give_up) {
            return self.past_deadline(give_up);
        }
        let (name, at) = (self.name(), rfc3339(self.at));
        let detail = format!(
            "the store did not answer before {}, when the occurrence was no longer worth starting",
            rfc3339(give_up)
        );
        events::store_unavailable(self.store().outages(), "acquire", Some(name), &detail, None);
        events::occurrence_skipped(name, &at, SkipReason::StoreUnavailable, &detail);
        Ending::Skipped(SkipReason::StoreUnavailable)
    }

    /// When the occurrence is no longer worth starting (the job's next
    /// instant is due or a lease length has passed, or its
    /// `starting_deadline` if that comes first), and that deadline.
    pub(super) fn give_up(&self) -> (DateTime<Utc>, Option<DateTime<Utc>>) {
        let job = &self.job;
        let mut give_up =
            self.at + chrono::Duration::from_std(job.timing.lease).unwrap_or_default();
        if let Some(next) = job.schedule.next_after(self.at) {
            give_up = give_up.min(next);
        }
        // `starting_deadline`: not started by then, not at all.
        let deadline = job
            .starting_deadline
            .map(|d| self.at + chrono::Duration::from_std(d).unwrap_or_default())
            .filter(|d| *d < give_up);
        (deadline.unwrap_or(give_up), deadline)
    }

    /// A place in the node's capacity (`node.max_running`), waited for
    /// until the occurrence is no longer worth starting: a node at capacity
    /// does not compete, and an occurrence it cannot take in time is left to
    /// the other nodes.
    async fn slot(&self) -> Result<Slot, Ending> {
        if let Some(slot) = self.shared.capacity.try_take() {
            return Ok(slot);
        }
        let (name, at) = (self.name(), rfc3339(self.at));
        let max = self.shared.capacity.limit().unwrap_or_default();
        events::occurrence_waiting(name, &at, max);
        let (give_up, deadline) = self.give_up();
        let wait = (give_up - self.shared.clock.now())
            .to_std()
            .unwrap_or(Duration::ZERO);
        tokio::select! {
            slot = self.shared.capacity.take() => Ok(slot),
            _ = tokio::time::sleep(wait) => {
                if deadline.is_some() {
                    return Err(self.past_deadline(give_up));
                }
                events::occurrence_skipped(
                    name,
                    &at,
                    SkipReason::Capacity,
                    &format!(
                        "this node held node.max_running = {max} runs until {}, when the occurrence was no longer worth starting",
                        rfc3339(give_up)
                    ),
                );
                Err(Ending::Skipped(SkipReason::Capacity))
            }
            _ = self.shared.draining.cancelled() => Err(Ending::Stopped),
        }
    }

    /// The occurrence fired after its `starting_deadline` (this daemon was
    /// paused, say): skipped without asking the store.
    pub(super) fn past_deadline_now(&self) -> Option<Ending> {
        let (_, deadline) = self.give_up();
        let deadline = deadline.filter(|d| self.shared.clock.now() >= *d)?;
        Some(self.past_deadline(deadline))
    }

    /// The occurrence was not started by its `starting_deadline`.
    fn past_deadline(&self, deadline: DateTime<Utc>) -> Ending {
        events::occurrence_skipped(
            self.name(),
            &rfc3339(self.at),
            SkipReason::Deadline,
            &format!(
                "not started by its starting_deadline ({}); the job runs again at its next instant",
                rfc3339(deadline)
            ),
        );
        Ending::Skipped(SkipReason::Deadline)
    }

    /// This node won: runs the job under the lease, retries it as its
    /// policy says, and runs its `on_failure` hook if the last run failed.
    async fn run_won(&self, lease: Lease, sent: Instant) -> Ending {
        let mut failed = run_under_lease(&self.shared, &self.job, lease, sent, Some(self.at)).await;
        let mut attempt = 0;
        while let Some(f) = &failed {
            if attempt >= self.job.retry.retries || !f.hook.outcome_retryable() {
                break;
            }
            attempt += 1;
            match self.retry(attempt).await {
                Retry::Ran(result) => failed = result,
                Retry::Abandoned => break,
            }
        }
        if let Some(f) = failed {
            on_failure(&self.shared, &self.job, f);
        }
        Ending::Won
    }

    /// Retry number `attempt` of a failed run: after its back-off, a new run
    /// under a fresh acquire (a new token, recorded as `retry`), unless it
    /// would start after the job's next instant is due (the store refuses
    /// that too), the job is paused or held, or the store fails
    /// (`retry_abandoned` says why).
    async fn retry(&self, attempt: u32) -> Retry {
        let (name, at) = (self.name(), rfc3339(self.at));
        let delay = self.job.retry.delay(attempt);
        let next = self.job.schedule.next_after(self.at);
        let start = self.shared.clock.now() + chrono::Duration::from_std(delay).unwrap_or_default();
        if next.is_some_and(|n| start >= n) {
            events::retry_abandoned(
                name,
                &at,
                attempt,
                AbandonReason::NextInstant,
                "it would start after the job's next instant is due",
            );
            return Retry::Abandoned;
        }
        events::retry_scheduled(name, &at, attempt, delay);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            // A stopping node starts no new run; the failure stands (and
            // its `on_failure` hook runs).
            _ = self.shared.draining.cancelled() => return Retry::Abandoned,
        }
        let sent = Instant::now();
        let store = self.store();
        let acquired = store
            .acquire(&AcquireRequest {
                resource: &self.job.resource,
                lease: self.job.timing.lease,
                node: self.node(),
                owner_id: OwnerId::fresh(),
                occurrence: None,
                next_occurrence: next.map(StoreTime::from_utc),
                run: Some(RunStart {
                    job: name,
                    started_by: StartedBy::Retry,
                    scheduled_at: Some(StoreTime::from_utc(self.at)),
                }),
            })
            .await;
        let (reason, detail) = match acquired {
            Ok(AcquireOutcome::Acquired(lease)) => {
                return Retry::Ran(
                    run_under_lease(&self.shared, &self.job, lease, sent, Some(self.at)).await,
                )
            }
            Ok(AcquireOutcome::Paused { .. }) => {
                (AbandonReason::Paused, "the job was paused".to_string())
            }
            Ok(AcquireOutcome::Superseded { .. }) => (
                AbandonReason::NextInstant,
                "the job's next instant is due by the store's clock".to_string(),
            ),
            Ok(other) => (
                AbandonReason::Held,
                format!("the lease was not granted: {other:?}"),
            ),
            Err(e) => (AbandonReason::StoreUnavailable, e.to_string()),
        };
        events::retry_abandoned(name, &at, attempt, reason, &detail);
        Retry::Abandoned
    }

    /// Another owner holds the lease or took the occurrence, or the job is
    /// paused.
    pub(super) fn lost(&self, outcome: AcquireOutcome) -> Ending {
        let (name, at) = (self.name(), rfc3339(self.at));
        match outcome {
            AcquireOutcome::Paused { note, until, first } => {
                events::occurrence_paused(name, &at, note.as_deref(), until, first);
                Ending::Skipped(SkipReason::Paused)
            }
            AcquireOutcome::Held {
                owner_id: owner,
                node,
                token,
                ..
            } => {
                let detail = format!("lease held by {owner} on {node} with token {token}");
                events::occurrence_skipped(name, &at, SkipReason::Held, &detail);
                Ending::Skipped(SkipReason::Held)
            }
            // LostRace: another node's acquire won while ours
            // waited for the row (the store could only see the row as it
            // was before the winner committed): in a fleet that is this
            // very occurrence, taken elsewhere.
            _ => {
                events::occurrence_taken(name, &at);
                Ending::Taken
            }
        }
    }

    /// The store's clock has not reached the instant yet: how long to wait
    /// for it, or the skip when this host's clock runs too far ahead.
    fn not_yet_due(&self, store_now: StoreTime) -> Result<Duration, Ending> {
        let (name, at) = (self.name(), rfc3339(self.at));
        let ahead_ms = StoreTime::from_utc(self.at).0 - store_now.0;
        let ahead = Duration::from_millis(u64::try_from(ahead_ms).unwrap_or(0));
        if ahead > MAX_CLOCK_AHEAD {
            events::occurrence_skipped_clock(
                name,
                &at,
                SkipReason::ClockAhead,
                ahead_ms,
                &format!("this host's clock is at least {ahead_ms} ms ahead of the store's; fix its time synchronisation"),
            );
            return Err(Ending::Skipped(SkipReason::ClockAhead));
        }
        events::occurrence_early(name, &at, ahead_ms);
        Ok(ahead)
    }

    /// The job's next instant is already due by the store's clock, not yet
    /// by ours: this host's clock runs behind. The store wrote nothing; the
    /// fleet runs the current instant. The offset is this host's clock
    /// minus the store's, the local time taken halfway through the call.
    fn superseded(
        &self,
        store_now: StoreTime,
        next: Option<DateTime<Utc>>,
        sent_wall: DateTime<Utc>,
        sent: Instant,
    ) -> Ending {
        let (name, at) = (self.name(), rfc3339(self.at));
        let answered = self.shared.clock.now();
        if next.is_some_and(|n| answered >= n) {
            // By our clock too: the answer came too late, not from a clock
            // that runs behind.
            events::occurrence_skipped(
                name,
                &at,
                SkipReason::Missed,
                "the store answered only after the job's next instant was due",
            );
            return Ending::Skipped(SkipReason::Missed);
        }
        let local = sent_wall + chrono::Duration::from_std(sent.elapsed() / 2).unwrap_or_default();
        let offset_ms = StoreTime::from_utc(local).0 - store_now.0;
        events::occurrence_skipped_clock(
            name,
            &at,
            SkipReason::ClockBehind,
            offset_ms,
            &format!(
                "the store's clock ({store_now}) is past this occurrence's successor; this host's clock is about {} ms behind the store's; fix its time synchronisation",
                -offset_ms
            ),
        );
        Ending::Skipped(SkipReason::ClockBehind)
    }

    /// Lets an acquire this occurrence no longer waits for (given up, or the
    /// daemon is stopping) finish in the background, bounded by the store's
    /// own time limit; should it still win, the win goes back with its
    /// occurrence ([`give_back_late`]).
    fn give_back_if_won(
        &self,
        attempt: impl Future<Output = Result<AcquireOutcome, StoreError>> + Send + 'static,
    ) {
        let (shared, job, at) = (self.shared.clone(), self.job.clone(), self.at);
        self.shared.tracker.spawn(async move {
            if let Ok(AcquireOutcome::Acquired(lease)) = attempt.await {
                give_back_late(&shared, &job, lease, at);
            }
        });
    }

    /// After an occurrence that did not run here while an attempt went
    /// unanswered: should that attempt's statement have committed after all
    /// (a ghost owner: the lease held with nothing under it, the instant
    /// counted as taken), gives the win back with its occurrence, so the
    /// lease is free and another node still trying the instant can run it.
    /// Tried 1 s and a store call's time limit after the occurrence ended
    /// (statements in flight by then have mostly landed or failed), and
    /// once more shortly before the job's next instant when a ghost's lease
    /// could still block it (the store refuses this occurrence after that
    /// instant, [`AcquireOutcome::Superseded`]). At shutdown, tried at once.
    fn sweep(&self, owner_id: OwnerId) {
        let shared = &self.shared;
        let times = super::sweep::times(shared, &self.job, self.at);
        shared
            .sweeper
            .add(shared, self.job.clone(), owner_id, self.at, times);
    }
}

/// One acquisition of `job`'s lease for the occurrence at `at`, migrations
/// first if they have not been applied yet. Owns what it uses, so that an
/// attempt given up by its occurrence can finish on its own.
async fn acquire_attempt(
    store: Arc<dyn Store>,
    ready: Arc<tokio::sync::OnceCell<()>>,
    job: Arc<Job>,
    node: String,
    owner_id: OwnerId,
    (at, next): (DateTime<Utc>, Option<DateTime<Utc>>),
) -> Result<AcquireOutcome, StoreError> {
    ensure_ready(&ready, store.as_ref()).await?;
    let occurrence = StoreTime::from_utc(at);
    let req = AcquireRequest {
        resource: &job.resource,
        lease: job.timing.lease,
        node: &node,
        owner_id,
        occurrence: Some(occurrence),
        next_occurrence: next.map(StoreTime::from_utc),
        run: Some(RunStart {
            job: job.name.as_str(),
            started_by: StartedBy::Schedule,
            scheduled_at: Some(occurrence),
        }),
    };
    let outcome = store.acquire(&req).await?;
    if job.overlap != Overlap::Replace {
        return Ok(outcome);
    }
    // `overlap = "replace"`: a run of an earlier instant (or a manual run)
    // holds the lease. End its generation and take the lease over with a
    // new token; the old owner's next renewal is refused, which terminates
    // it through the lease-loss path on whichever node it runs. Once per
    // attempt: whatever the second acquire answers stands.
    let AcquireOutcome::Held {
        owner_id: held_by,
        node: held_on,
        token,
        ..
    } = &outcome
    else {
        return Ok(outcome);
    };
    if store.preempt(&job.resource, *token, occurrence).await? {
        events::run_replaced(
            job.name.as_str(),
            &rfc3339(at),
            &node,
            *held_by,
            Some(held_on),
            *token,
        );
    }
    store.acquire(&req).await
}

/// A win whose answer came after its occurrence stopped waiting for it
/// (it gave up, or the daemon stopped): given back with its occurrence in
/// the background ([`Supervisor::give_back_unused`], the one way a win
/// nobody runs goes back), so that no lease is held with nothing running
/// under it.
///
/// [`Supervisor::give_back_unused`]: crate::supervise::Supervisor::give_back_unused
pub(super) fn give_back_late(shared: &Shared, job: &Arc<Job>, lease: Lease, at: DateTime<Utc>) {
    let (supervisor, job) = (shared.supervisor.clone(), job.clone());
    shared.tracker.spawn(async move {
        let name = (job.name.as_str(), &job.resource);
        supervisor
            .give_back_unused(name, &lease, Some(at), Unused::Late)
            .await;
    });
}

/// How a retry of a failed run went ([`Occurrence::retry`]).
enum Retry {
    /// It ran under a new lease: how it failed, if it did.
    Ran(Option<Failed>),
    /// It did not run (`retry_abandoned` says why).
    Abandoned,
}

/// A run that did not succeed: what its `on_failure` hook is told.
pub(super) struct Failed {
    hook: hook::Failure,
}

impl Failed {
    /// Whether `retries` may run the job again after this failure.
    pub(super) fn retryable(&self) -> bool {
        self.hook.outcome_retryable()
    }
}

/// Runs `job` under `lease` (won by a call sent at `sent`) for the
/// scheduled instant `at` (`None`: a manual run); how it failed, if it did.
/// Shared by scheduled, retried and triggered runs.
pub(super) async fn run_under_lease(
    shared: &Shared,
    job: &Arc<Job>,
    lease: Lease,
    sent: Instant,
    at: Option<DateTime<Utc>>,
) -> Option<Failed> {
    let name = job.name.as_str();
    let (store, node) = (shared.supervisor.store(), shared.supervisor.node());
    events::lease_acquired(Some(name), &lease, node);
    fence::taken_over(store, Some(name), &lease, node);
    let spec = spec_for(job, at, shared.history.output);
    let shutdown = shared.shutdown.clone();
    let (token, run_id) = (lease.token, spec.run_id(&lease));
    let failed = match shared.supervisor.run(&spec, lease, sent, shutdown).await {
        Ok(result) => match result.outcome() {
            RunOutcome::Succeeded | RunOutcome::Shutdown => None,
            outcome => Some((outcome, result.exit_code, result.signal)),
        },
        Err(SuperviseError::AcquiredTooLate) => {
            events::occurrence_skipped(
                name,
                &at.map(rfc3339).unwrap_or_default(),
                SkipReason::AcquiredTooLate,
                "the store answered too late to run the job safely within the lease",
            );
            None
        }
        // Already logged as job_spawn_failed.
        Err(SuperviseError::Spawn { .. } | SuperviseError::Workdir { .. }) => {
            Some((RunOutcome::SpawnFailed, None, None))
        }
    };
    let (outcome, exit_code, signal) = failed?;
    Some(Failed {
        hook: hook::Failure {
            job: name.to_string(),
            resource: job.resource.to_string(),
            node: node.to_string(),
            token,
            outcome,
            exit_code,
            signal,
            scheduled_at: at.map(rfc3339).unwrap_or_default(),
            run_id,
        },
    })
}

/// Runs the job's `on_failure` hook, if it has one, for a run that failed
/// (after its retries).
pub(super) fn on_failure(shared: &Shared, job: &Job, failed: Failed) {
    if let Some(argv) = &job.on_failure {
        shared.tracker.spawn(hook::on_failure(
            argv.clone(),
            shared.hook_env.clone(),
            job.env.clone(),
            failed.hook,
        ));
    }
}

/// The supervisor's view of a job run (`at`: its scheduled instant, `None`
/// for a manual one), keeping `output` bytes of its output for the history.
fn spec_for(job: &Job, at: Option<DateTime<Utc>>, output: usize) -> RunSpec {
    RunSpec {
        job: job.name.to_string(),
        resource: job.resource.clone(),
        command: job.command.clone(),
        env: job.env.clone(),
        workdir: job.workdir.clone(),
        timing: job.timing,
        timeout: job.timeout,
        stale_exit_code: job.stale_exit_code,
        scheduled_at: at,
        inherit_stdio: false,
        history: Some(output),
    }
}

//! Sweeps for wins nobody saw. An acquire or a claim that went unanswered
//! may still have committed: a ghost owner, its lease held with nothing
//! under it and its instant counted as taken. Each such (occurrence, owner
//! id) is looked for a few times; every look due at about the same time
//! goes to the store as one [`Store::give_back_unseen`](crate::store::Leases::give_back_unseen), so a node that
//! missed a whole instant's answers sweeps them in one statement per try,
//! not one per occurrence (on an overloaded store, per-occurrence sweeps
//! queued ahead of the next instant's claim and made it late in turn).
//!
//! The sweeper has no task while it has nothing to do: the first sweep
//! starts one on the daemon's tracker, which ends when the last is done.
//! At shutdown every pending look is made at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Shared, CALL_TIMEOUT};
use crate::config::Job;
use crate::events;
use crate::store::{rfc3339, OwnerId, StoreTime, Unseen};

/// Looks due within this much of the earliest go with it.
const COALESCE: Duration = Duration::from_millis(200);

/// One possible ghost and when to look for it.
struct Look {
    job: Arc<Job>,
    owner_id: OwnerId,
    at: DateTime<Utc>,
    /// The times left to look, earliest first.
    times: Vec<Instant>,
}

#[derive(Default)]
struct State {
    looks: Vec<Look>,
    /// Whether a task is sweeping.
    running: bool,
}

/// The node's pending sweeps (cheap to clone).
#[derive(Clone, Default)]
pub(super) struct Sweeper {
    state: Arc<Mutex<State>>,
    /// Wakes the task when a look is added.
    added: Arc<Notify>,
}

/// When to look for a ghost of `job`'s occurrence at `at` whose attempt
/// just ended: soon (statements in flight by then have mostly landed or
/// failed), once a store call's time limit later, and shortly before the
/// job's next instant if the lease a ghost took could still be held then
/// (the store refuses the occurrence after that instant).
pub(super) fn times(shared: &Shared, job: &Job, at: DateTime<Utc>) -> Vec<Instant> {
    let now = Instant::now();
    let mut times = vec![now + Duration::from_secs(1), now + CALL_TIMEOUT];
    if let Some(next) = job.schedule.next_after(at) {
        let before_next = (next - shared.clock.now() - chrono::Duration::seconds(1)).to_std();
        if let Ok(d) = before_next {
            if d > Duration::from_secs(1) && d < job.timing.lease {
                times.push(now + d);
            }
        }
    }
    times
}

impl Sweeper {
    /// Looks for a win of `owner_id` for `job`'s occurrence at `at` at each
    /// of `times`, until one is found and given back.
    pub(super) fn add(
        &self,
        shared: &Shared,
        job: Arc<Job>,
        owner_id: OwnerId,
        at: DateTime<Utc>,
        mut times: Vec<Instant>,
    ) {
        times.sort();
        let start = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.looks.push(Look {
                job,
                owner_id,
                at,
                times,
            });
            !std::mem::replace(&mut state.running, true)
        };
        if start {
            shared.tracker.spawn(self.clone().sweep(shared.clone()));
        } else {
            self.added.notify_one();
        }
    }

    /// The task: waits for the earliest look (or the stop), makes every
    /// look due by then in one store call, until no look is left.
    async fn sweep(self, shared: Shared) {
        let node = shared.supervisor.node().to_string();
        loop {
            let earliest = {
                let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                match state.looks.iter().filter_map(|l| l.times.first()).min() {
                    Some(t) => *t,
                    None => {
                        state.looks.clear();
                        state.running = false;
                        return;
                    }
                }
            };
            if !shared.shutdown.is_cancelled() {
                tokio::select! {
                    _ = tokio::time::sleep_until(earliest) => {}
                    _ = self.added.notified() => continue,
                    _ = shared.shutdown.cancelled() => {}
                }
            }
            let due = self.take_due(shared.shutdown.is_cancelled());
            if due.is_empty() {
                continue;
            }
            let items: Vec<Unseen<'_>> = due
                .iter()
                .map(|l| Unseen {
                    resource: &l.job.resource,
                    owner_id: l.owner_id,
                    occurrence: StoreTime::from_utc(l.at),
                })
                .collect();
            let given = shared.supervisor.give_back_unseen(&items).await;
            drop(items);
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            for (look, given) in due.into_iter().zip(given) {
                if given {
                    events::occurrence_given_back(
                        look.job.name.as_str(),
                        &rfc3339(look.at),
                        look.owner_id,
                        &node,
                    );
                } else if !look.times.is_empty() && !shared.shutdown.is_cancelled() {
                    state.looks.push(look);
                }
            }
        }
    }

    /// The looks due now (all of them when stopping), each with its time
    /// taken off.
    fn take_due(&self, all: bool) -> Vec<Look> {
        let horizon = Instant::now() + COALESCE;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (mut due, rest): (Vec<Look>, Vec<Look>) = std::mem::take(&mut state.looks)
            .into_iter()
            .partition(|l| all || l.times.first().is_some_and(|t| *t <= horizon));
        state.looks = rest;
        for look in &mut due {
            // Every time already passed counts as this one look.
            look.times.retain(|t| *t > horizon);
        }
        due
    }
}

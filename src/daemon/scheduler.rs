//! The timer: fires each job's occurrences at their instants.
//!
//! One task owns a min-heap of (next instant, rank, generation, job) and
//! sleeps until the earliest instant (at most [`MAX_SLEEP`], so a stepped
//! wall clock shifts firings by at most that much). Each due occurrence
//! becomes its own task ([`Occurrence`]). A reload replaces the job list
//! without touching runs in progress. Once the daemon drains, the loop
//! fires nothing and polls no triggers (the other nodes take the instants
//! at once); it only goes on turning for systemd's watchdog until the stop.
//!
//! *Invariant:* the job list is held once, here: a few hundred bytes a job,
//! so every copy of 10,000 jobs costs megabytes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;

use super::occurrence::Occurrence;
use super::Shared;
use super::{claim, fleet};
use crate::config::{Catchup, Job, Overlap, CATCHUP_TOLERANCE};
use crate::events::{self, SkipReason};
use crate::store::rfc3339;

/// The longest the scheduler sleeps before re-reading the wall clock, so a
/// stepped clock (NTP, manual change) shifts firings by at most this much.
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// One job as the scheduler knows it.
struct Entry {
    job: Arc<Job>,
    generation: u64,
}

/// A heap entry: instant, rank, generation, job name.
type Due = (DateTime<Utc>, u64, u64, String);

/// The timer: fires each job's occurrences at their instants.
pub(super) struct Scheduler {
    shared: Shared,
    jobs: HashMap<String, Entry>,
    /// Next instant per job, then the job's node-specific rank (see
    /// [`rank`]); entries of replaced or removed jobs are recognised by
    /// their generation and dropped when they surface.
    heap: BinaryHeap<Reverse<Due>>,
    generation: u64,
}

impl Scheduler {
    pub(super) fn new(shared: Shared) -> Scheduler {
        Scheduler {
            shared,
            jobs: HashMap::new(),
            heap: BinaryHeap::new(),
            generation: 0,
        }
    }

    /// Fires occurrences of `jobs` until shutdown; a job list received on
    /// `reloads` replaces the current one.
    pub(super) async fn run(
        mut self,
        jobs: Vec<Arc<Job>>,
        mut reloads: mpsc::Receiver<Vec<Arc<Job>>>,
    ) {
        self.apply(jobs, false);
        let start = tokio::time::Instant::now();
        let mut next_ping = start;
        let mut next_poll = start + crate::store::TRIGGER_POLL;
        let mut next_prune = start + fleet::FIRST_PRUNE;
        // One trigger poll and one prune at a time: a slow store delays
        // them instead of piling them up.
        let polling = Arc::new(AtomicBool::new(false));
        let pruning = Arc::new(AtomicBool::new(false));
        loop {
            crate::metrics::loop_turned();
            let now = self.shared.clock.now();
            let mut sleep_for = self
                .heap
                .peek()
                .map(|Reverse((at, _, _, _))| (*at - now).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(MAX_SLEEP)
                .min(MAX_SLEEP);
            if let Some(every) = self.shared.watchdog {
                // Pinged from this loop: if it stops turning, systemd's
                // watchdog restarts the daemon.
                let t = tokio::time::Instant::now();
                if t >= next_ping {
                    super::ping_watchdog();
                    next_ping = t + every;
                }
                sleep_for = sleep_for.min(next_ping - t);
            }
            let t = tokio::time::Instant::now();
            if t >= next_poll {
                next_poll = t + crate::store::TRIGGER_POLL;
                if self.polls_triggers() {
                    self.spawn_once(&polling, |shared, jobs| {
                        fleet::poll_triggers(shared, jobs.into_iter().collect())
                    });
                }
            }
            if t >= next_prune {
                next_prune = t + fleet::PRUNE_EVERY;
                self.spawn_once(&pruning, |shared, _| fleet::prune(shared));
            }
            sleep_for = sleep_for.min(next_poll.min(next_prune) - t);
            tokio::select! {
                biased;
                _ = self.shared.shutdown.cancelled() => return,
                _ = self.shared.draining.cancelled() => return self.drain(next_ping).await,
                Some(jobs) = reloads.recv() => self.apply(jobs, true),
                _ = tokio::time::sleep(sleep_for) => self.fire_due(),
            }
        }
    }

    /// While the daemon drains: nothing is fired or polled; the loop only
    /// turns for systemd's watchdog (and `/livez`) until the stop, so a
    /// drain longer than `WatchdogSec=` is not mistaken for a hang.
    async fn drain(self, mut next_ping: tokio::time::Instant) {
        loop {
            crate::metrics::loop_turned();
            let mut wait = MAX_SLEEP;
            if let Some(every) = self.shared.watchdog {
                let t = tokio::time::Instant::now();
                if t >= next_ping {
                    super::ping_watchdog();
                    next_ping = t + every;
                }
                wait = wait.min(next_ping - t);
            }
            tokio::select! {
                _ = self.shared.shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Whether this node reads the pending triggers in this poll period:
    /// always, unless its view of the live nodes is trusted; then only
    /// when it is one of the period's pollers (`assign::pollers`).
    fn polls_triggers(&self) -> bool {
        let period = i64::try_from(crate::store::TRIGGER_POLL.as_millis()).unwrap_or(2_000);
        let slot = self
            .shared
            .clock
            .now()
            .timestamp_millis()
            .div_euclid(period);
        self.shared
            .views
            .current()
            .is_none_or(|v| v.polls_triggers(slot))
    }

    /// Spawns `task` on the current jobs unless the previous one of its
    /// kind (`busy`) still runs.
    fn spawn_once<F, T>(&self, busy: &Arc<AtomicBool>, task: T)
    where
        T: FnOnce(Shared, Vec<(String, Arc<Job>)>) -> F,
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        if busy.swap(true, Ordering::AcqRel) {
            return;
        }
        let jobs = self
            .jobs
            .iter()
            .map(|(name, e)| (name.clone(), e.job.clone()))
            .collect();
        let work = task(self.shared.clone(), jobs);
        let busy = busy.clone();
        self.shared.tracker.spawn(async move {
            work.await;
            busy.store(false, Ordering::Release);
        });
    }

    /// Installs a job list: unchanged jobs keep their timers, changed and
    /// new ones start from now, removed ones stop firing. Runs in progress
    /// are not touched.
    fn apply(&mut self, jobs: Vec<Arc<Job>>, is_reload: bool) {
        let now = self.shared.clock.now();
        let names: HashSet<String> = jobs.iter().map(|j| j.name.to_string()).collect();
        let before = self.jobs.len();
        let gone: Vec<String> = self
            .jobs
            .keys()
            .filter(|name| !names.contains(*name))
            .cloned()
            .collect();
        self.jobs.retain(|name, _| names.contains(name));
        let removed = before - self.jobs.len();
        let (mut added, mut changed) = (0, 0);
        for job in jobs {
            let name = job.name.to_string();
            match self.jobs.get(&name) {
                Some(e) if Arc::ptr_eq(&e.job, &job) || *e.job == *job => continue,
                Some(_) => changed += 1,
                None => added += 1,
            }
            self.generation += 1;
            let rank = rank(self.shared.supervisor.node(), &name);
            if let Some(next) = job.schedule.next_after(now) {
                if self.shared.metrics {
                    crate::metrics::next_run(&name, next);
                }
                self.heap
                    .push(Reverse((next, rank, self.generation, name.clone())));
            }
            self.jobs.insert(
                name,
                Entry {
                    job,
                    generation: self.generation,
                },
            );
        }
        // Every job's series from the start, before any run (zero counters),
        // where `/metrics` is served.
        if self.shared.metrics {
            let configured: Vec<&str> = self.jobs.keys().map(String::as_str).collect();
            let gone: Vec<&str> = gone.iter().map(String::as_str).collect();
            crate::metrics::jobs_configured(&configured, &gone);
        }
        if is_reload {
            events::config_reloaded(added, removed, changed, self.jobs.len());
        }
        // The replaced jobs and what installing the new ones needed for a
        // moment (their digests, the old list) go back to the system.
        crate::config::release_freed_memory();
    }

    /// Fires every occurrence that is due: the occurrences of each instant
    /// together, through their batch claim ([`super::claim`]).
    fn fire_due(&mut self) {
        let now = self.shared.clock.now();
        let mut due: Vec<Occurrence> = Vec::new();
        // How many claimable occurrences each instant has, attempted here
        // or not: what every node with these jobs counts alike, for the
        // instant's assignment (`super::assign`).
        let mut fired: HashMap<DateTime<Utc>, usize> = HashMap::new();
        while let Some(Reverse((at, rank, generation, name))) = self.heap.peek().cloned() {
            if at > now {
                break;
            }
            self.heap.pop();
            let Some(entry) = self.jobs.get(&name) else {
                continue;
            };
            if entry.generation != generation {
                continue;
            }
            let job = entry.job.clone();
            if job.overlap != Overlap::Replace {
                *fired.entry(at).or_default() += 1;
            }
            let next = job.schedule.next_after(at);
            if let Some(n) = next {
                if self.shared.metrics {
                    crate::metrics::next_run(&name, n);
                }
                self.heap.push(Reverse((n, rank, generation, name.clone())));
            }
            if next.is_some_and(|n| n <= now) {
                // A later instant is already due (this host was paused or
                // overloaded): only the newest due occurrence is attempted.
                events::occurrence_skipped(
                    &name,
                    &rfc3339(at),
                    SkipReason::Missed,
                    "a later occurrence is already due on this node",
                );
                continue;
            }
            let late = (now - at).to_std().unwrap_or_default();
            if job.catchup == Catchup::None && late > CATCHUP_TOLERANCE {
                // Fell due while this daemon could not fire it.
                events::occurrence_skipped(
                    &name,
                    &rfc3339(at),
                    SkipReason::Missed,
                    &format!(
                        "fired {} ms late (this daemon was paused or starved) and catchup = \"none\"",
                        late.as_millis()
                    ),
                );
                continue;
            }
            due.push(Occurrence {
                shared: self.shared.clone(),
                job,
                at,
            });
        }
        // In heap order: by instant, then by this node's rank.
        while !due.is_empty() {
            let at = due[0].at;
            let split = due.iter().position(|o| o.at != at).unwrap_or(due.len());
            let rest = due.split_off(split);
            let count = fired.get(&at).copied().unwrap_or(0);
            self.shared
                .tracker
                .spawn(claim::claim_instant(self.shared.clone(), due, count));
            due = rest;
        }
    }
}

/// The order in which this node tries jobs due at the same instant: a hash
/// of node and job, so that each node starts with different jobs. In the
/// same order on every node, all nodes would queue on the first job's row
/// lock, then on the second's; spread out, most nodes find a job already
/// taken and lose at once without waiting for the winner's commit.
fn rank(node: &str, job: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (node, job).hash(&mut h);
    h.finish()
}

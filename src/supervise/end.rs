//! How a lease this node won goes back to the store, with one retry policy
//! ([`TRIES`] calls, back-off from [`FIRST_BACKOFF`], doubling): a run's end
//! ([`Supervisor::end`]: its history row and the release, together where
//! the store can) and a win that will not run
//! ([`Supervisor::give_back_unused`]: given back with its occurrence). The
//! daemon's late wins (answered after their occurrence gave up, or while
//! the daemon stopped) and the supervisor's too-late one all go back
//! through the latter; the wins nobody saw, which the daemon's sweeper
//! looks for, through [`Supervisor::give_back_unseen`].

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{RunSpec, Supervisor};
use crate::events;
use crate::fence;
use crate::names::Name;
use crate::store::{Lease, ReleaseOutcome, RunEnd, StoreError, StoreTime, Unseen};

/// How many times each call that ends a lease is tried.
const TRIES: u32 = 3;

/// The wait before its second try; each later wait doubles.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// What a run's end writes ([`Supervisor::end`]).
pub(super) enum End<'a> {
    /// The run ended (or could not start) under a lease still held: its end
    /// goes into its history row and the lease is released.
    Release(&'a RunEnd<'a>),
    /// The lease was lost during the run: only its end is written.
    Lost(&'a RunEnd<'a>),
}

/// Why a won lease will not run: nothing ran under it, so it goes back
/// with its occurrence ([`Supervisor::give_back_unused`]). Kept, it would
/// block the job's next instants on every node until it expired, and the
/// instant would count as taken although it ran nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unused {
    /// The answer came after the occurrence stopped waiting for it (it gave
    /// up, or the daemon stopped); nobody logged the win yet.
    Late,
    /// The answer came too late to run the job within the lease
    /// ([`super::SuperviseError::AcquiredTooLate`]); the win was logged.
    TooLate,
}

/// Which call a run's end makes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// `finish_and_release`: both in one call.
    Both,
    /// `finish_run` alone (after `Both` failed, or with the lease lost).
    Finish,
    /// `release` alone.
    Release,
}

impl Supervisor {
    /// Ends a run's lease: its history row gets the run's end (for a
    /// daemon's run, `spec.history`) and, unless it was lost, the lease is
    /// released, in one store call where the store can. Should that call
    /// fail, each is made on its own right away (the call changed both or
    /// neither, and both are safe to repeat); each call is tried
    /// [`TRIES`] times. A history row the store cannot take reads
    /// `unknown` once the lease is gone; a lease it cannot take back
    /// expires by the store's clock.
    pub(super) async fn end(&self, spec: &RunSpec, lease: &Lease, end: End<'_>) {
        let (run_end, release) = match end {
            End::Release(e) => (e, true),
            End::Lost(e) => (e, false),
        };
        let finish = spec.history.is_some();
        let mut steps: Vec<Step> = match (finish, release) {
            (true, true) => vec![Step::Both],
            (true, false) => vec![Step::Finish],
            (false, true) => vec![Step::Release],
            (false, false) => return,
        };
        let mut tries = Tries::default();
        while let Some(&step) = steps.first() {
            let result = match step {
                Step::Both => self
                    .store
                    .finish_and_release(&spec.resource, lease.owner_id, run_end)
                    .await
                    .map(|(_, released)| Some(released)),
                Step::Finish => self.store.finish_run(run_end).await.map(|_| None),
                Step::Release => self
                    .store
                    .release(&spec.resource, lease.owner_id, lease.token)
                    .await
                    .map(Some),
            };
            match result {
                Ok(released) => {
                    events::store_answered(self.store.outages(), &spec.job);
                    if let Some(r) = released {
                        self.released(spec, lease, r);
                    }
                    steps.remove(0);
                    tries = Tries::default();
                }
                Err(e) if step == Step::Both => {
                    // The fall-back: each on its own, at once.
                    events::store_unavailable(
                        self.store.outages(),
                        "release",
                        Some(&spec.job),
                        &e.to_string(),
                        Some(Duration::ZERO),
                    );
                    steps = vec![Step::Finish, Step::Release];
                }
                Err(e) => {
                    let op = if step == Step::Finish {
                        "finish_run"
                    } else {
                        "release"
                    };
                    if !tries.failed(self, &spec.job, op, &e).await {
                        // Given up on this one; the next still goes.
                        steps.remove(0);
                        tries = Tries::default();
                    }
                }
            }
        }
    }

    /// A win of `job`'s lease on `resource` that will not run (see
    /// [`Unused`]): logged as won and recorded if it took the lease over
    /// (unless that was done), then given back with its scheduled
    /// occurrence `at`, so another node still trying the instant can run it
    /// (`at` `None`, `exec`'s run: only released). A refusal means the
    /// lease is not ours any more (it expired meanwhile): a late win's is
    /// not worth a word; a too-late one, logged as won, is logged and
    /// recorded as lost, as any refused release.
    pub(crate) async fn give_back_unused(
        &self,
        (job, resource): (&str, &Name),
        lease: &Lease,
        at: Option<DateTime<Utc>>,
        why: Unused,
    ) {
        if why == Unused::Late {
            events::lease_acquired(Some(job), lease, &self.node);
            fence::taken_over(&self.store, Some(job), lease, &self.node);
        }
        let (owner_id, token) = (lease.owner_id, lease.token);
        let mut tries = Tries::default();
        loop {
            let given = match at {
                Some(at) => {
                    let at = StoreTime::from_utc(at);
                    self.store
                        .give_back(resource, owner_id, Some(token), at)
                        .await
                }
                None => self.store.release(resource, owner_id, token).await,
            };
            match given {
                Ok(outcome) => {
                    events::store_answered(self.store.outages(), job);
                    match outcome {
                        ReleaseOutcome::Released => events::lease_released(Some(job), lease),
                        // Logged as won by the run's caller: lost, as a
                        // refused release is.
                        ReleaseOutcome::Refused(r) if why == Unused::TooLate => {
                            self.release_refused(job, lease, &r)
                        }
                        // Not ours any more (it expired meanwhile): nothing
                        // to give back.
                        ReleaseOutcome::Refused(_) => {}
                    }
                    return;
                }
                Err(e) => {
                    if !tries.failed(self, job, "release", &e).await {
                        return;
                    }
                }
            }
        }
    }

    /// Wins nobody saw (an acquire or a claim that went unanswered may have
    /// committed): given back by owner id and occurrence, all in one store
    /// call ([`crate::store::Store::give_back_unseen`](crate::store::Leases::give_back_unseen)); whether each was.
    /// Tried once: the daemon's sweeper looks again later.
    pub(crate) async fn give_back_unseen(&self, items: &[Unseen<'_>]) -> Vec<bool> {
        match self.store.give_back_unseen(items).await {
            Ok(given) => given,
            Err(e) => {
                let outages = self.store.outages();
                events::store_unavailable(outages, "give_back", None, &e.to_string(), None);
                vec![false; items.len()]
            }
        }
    }

    /// What a release answered: logged, a refusal as the lost lease it is.
    fn released(&self, spec: &RunSpec, lease: &Lease, outcome: ReleaseOutcome) {
        match outcome {
            ReleaseOutcome::Released => events::lease_released(Some(&spec.job), lease),
            ReleaseOutcome::Refused(r) => self.release_refused(&spec.job, lease, &r),
        }
    }
}

/// The tries of one call ([`TRIES`], back-off from [`FIRST_BACKOFF`]).
struct Tries {
    failures: u32,
    backoff: Duration,
}

impl Default for Tries {
    fn default() -> Self {
        Tries {
            failures: 0,
            backoff: FIRST_BACKOFF,
        }
    }
}

impl Tries {
    /// The call failed: logged (`store_unavailable`), then waits out the
    /// back-off; false when that was its last try.
    async fn failed(&mut self, sup: &Supervisor, job: &str, op: &str, e: &StoreError) -> bool {
        self.failures += 1;
        let retry = (self.failures < TRIES).then_some(self.backoff);
        events::store_unavailable(sup.store.outages(), op, Some(job), &e.to_string(), retry);
        self.backoff *= 2;
        match retry {
            Some(d) => {
                tokio::time::sleep(d).await;
                true
            }
            None => false,
        }
    }
}

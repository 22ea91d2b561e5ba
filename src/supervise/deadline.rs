//! The supervisor's deadline state machine: one loop that renews the lease,
//! moves the deadlines with each confirmed renewal, and terminates the job
//! (SIGTERM, then SIGKILL after the grace) on a refused renewal, at the
//! local deadline, at its timeout or at shutdown, until the job has exited.
//!
//! It knows the job only through [`JobProcess`] (signal, wait, confirm
//! deadlines to the watchdog), so tests drive it with a fake job on tokio's
//! paused clock; the store is the [`Store`] trait.
//!
//! *Invariant:* the SIGKILL deadline is `confirmed send + lease − margin`
//! on the monotonic clock, raced in the same `select!` as any renewal in
//! flight, so a renewal that hangs never delays it.

use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::{sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::events::{self, LossReason};
use crate::store::{Lease, RenewOutcome, StoreError};

use super::{CancelReason, JobProcess, RunSpec, Supervisor};

/// A termination in progress.
#[derive(Debug, Clone, Copy)]
struct Cancel {
    reason: CancelReason,
    /// When SIGKILL goes out unless the job is gone.
    kill_at: Instant,
}

/// The state of one supervised run: the renewal loop and the deadlines.
pub(super) struct Watch<'a> {
    sup: &'a Supervisor,
    spec: &'a RunSpec,
    lease: &'a Lease,
    /// Send time of the last successful acquire/renew.
    confirmed: Instant,
    next_renew: Instant,
    timeout_at: Option<Instant>,
    cancel: Option<Cancel>,
    lost: bool,
    killed: bool,
}

type RenewCall = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = (Instant, Result<RenewOutcome, StoreError>)>
            + Send
            + 'static,
    >,
>;

impl<'a> Watch<'a> {
    pub(super) fn new(
        sup: &'a Supervisor,
        spec: &'a RunSpec,
        lease: &'a Lease,
        sent_at: Instant,
        started: Instant,
    ) -> Self {
        let w = Watch {
            sup,
            spec,
            lease,
            confirmed: sent_at,
            next_renew: sent_at + spec.timing.renew_every,
            timeout_at: spec.timeout.map(|t| started + t),
            cancel: None,
            lost: false,
            killed: false,
        };
        w.log_deadline();
        w
    }

    /// Whether the lease was lost (refused or unconfirmed) during the run.
    pub(super) fn lost(&self) -> bool {
        self.lost
    }

    /// Why the job was terminated, if it was.
    pub(super) fn cancel_reason(&self) -> Option<CancelReason> {
        self.cancel.map(|c| c.reason)
    }

    /// Hands the current deadlines to the watchdog, which enforces them even
    /// if this process stops or dies, each [`super::LeaseTiming::watchdog_lag`]
    /// later than this loop does.
    fn confirm_to_watchdog(&self, job: &mut dyn JobProcess) {
        let lag = self.spec.timing.watchdog_lag();
        job.confirm(self.term_deadline() + lag, self.kill_deadline() + lag);
    }

    /// SIGKILL deadline: the job must be dead by then.
    fn kill_deadline(&self) -> Instant {
        self.confirmed + self.spec.timing.kill_by()
    }

    /// SIGTERM deadline when no renewal is confirmed.
    fn term_deadline(&self) -> Instant {
        self.kill_deadline() - self.spec.timing.kill_grace
    }

    fn log_deadline(&self) {
        let now = Instant::now();
        events::lease_deadline(
            Some(&self.spec.job),
            self.lease,
            self.kill_deadline().saturating_duration_since(now),
            self.term_deadline().saturating_duration_since(now),
        );
    }

    fn renew_call(&self) -> RenewCall {
        let store = self.sup.store.clone();
        let resource = self.spec.resource.clone();
        let owner = self.lease.owner_id;
        let token = self.lease.token;
        let lease = self.spec.timing.lease;
        // Abandon a call that outlives one renewal interval and try again.
        let limit = self.spec.timing.renew_every;
        Box::pin(async move {
            let sent = Instant::now();
            let r = match tokio::time::timeout(limit, store.renew(&resource, owner, token, lease))
                .await
            {
                Ok(r) => r,
                Err(_) => Err(StoreError::Timeout {
                    url: store.url().to_string(),
                    limit,
                }),
            };
            (sent, r)
        })
    }

    /// Sends SIGTERM (or SIGKILL when already past the kill deadline) to the
    /// job's process group.
    fn start_cancel(&mut self, reason: CancelReason, job: &mut dyn JobProcess) {
        if self.cancel.is_some() {
            return;
        }
        let now = Instant::now();
        let kill_at = (now + self.spec.timing.kill_grace).min(self.kill_deadline());
        self.cancel = Some(Cancel { reason, kill_at });
        if now >= kill_at {
            self.cancelled(reason, "SIGKILL");
            job.signal(Signal::SIGKILL);
            self.killed = true;
        } else {
            self.cancelled(reason, "SIGTERM");
            job.signal(Signal::SIGTERM);
        }
    }

    /// Logs `job_cancelled`, except for a shutdown: a run stopped by a
    /// shutdown is not a failure and reports itself once, at its end
    /// (`job_stopped`, with the last signal it was sent).
    fn cancelled(&self, reason: CancelReason, signal: &str) {
        if reason != CancelReason::Shutdown {
            events::job_cancelled(&self.spec.job, self.lease.token, reason.as_str(), signal);
        }
    }

    /// The last signal this loop sent the job, if it sent one.
    pub(super) fn sent_signal(&self) -> Option<&'static str> {
        match (self.killed, self.cancel) {
            (true, _) => Some("SIGKILL"),
            (false, Some(_)) => Some("SIGTERM"),
            (false, None) => None,
        }
    }

    fn mark_lost(&mut self, reason: LossReason, detail: &str) {
        if self.lost {
            return;
        }
        self.lost = true;
        events::lease_lost(
            Some(&self.spec.job),
            self.lease,
            &self.sup.node,
            reason,
            detail,
        );
        self.sup.record_lost(&self.spec.job, self.lease, reason);
    }

    /// Waits for the child while renewing and enforcing every deadline.
    pub(super) async fn supervise(
        &mut self,
        job: &mut dyn JobProcess,
        shutdown: &CancellationToken,
    ) -> std::io::Result<std::process::ExitStatus> {
        let mut renewal: Option<RenewCall> = None;
        let far = || Instant::now() + Duration::from_secs(86_400 * 365);
        loop {
            let kill_at = match self.cancel {
                Some(c) if !self.killed => c.kill_at.min(self.kill_deadline()),
                None if !self.killed => self.kill_deadline(),
                _ => far(),
            };
            let term_at = if self.cancel.is_none() {
                self.term_deadline()
            } else {
                far()
            };
            let renew_at = if renewal.is_none() && !self.lost {
                self.next_renew
            } else {
                far()
            };
            let timeout_at = match (self.timeout_at, self.cancel) {
                (Some(t), None) => t,
                _ => far(),
            };
            tokio::select! {
                biased;
                status = job.wait() => {
                    if self.cancel.is_none() && Instant::now() >= self.term_deadline() {
                        // The watchdog acted on the deadline before this
                        // process did (it was busy or stopped): report it
                        // the same way.
                        self.mark_lost(LossReason::DeadlinePassed, "no renewal confirmed before the local deadline (store unreachable or this process was paused); the run's watchdog terminated the job");
                        self.cancel = Some(Cancel { reason: CancelReason::LeaseUnconfirmed, kill_at: Instant::now() });
                        events::job_cancelled(&self.spec.job, self.lease.token, CancelReason::LeaseUnconfirmed.as_str(), "SIGTERM");
                    }
                    return status;
                }
                _ = sleep_until(kill_at) => {
                    // Past the point where the lease may have expired, or the
                    // grace is over: nothing of the job may keep running.
                    if self.cancel.is_none() {
                        self.mark_lost(LossReason::DeadlinePassed, "no renewal confirmed before the local deadline (store unreachable or this process was paused)");
                        self.cancel = Some(Cancel { reason: CancelReason::LeaseUnconfirmed, kill_at: Instant::now() });
                    }
                    let reason = self.cancel.map_or(CancelReason::LeaseUnconfirmed, |c| c.reason);
                    self.cancelled(reason, "SIGKILL");
                    job.signal(Signal::SIGKILL);
                    self.killed = true;
                }
                _ = sleep_until(term_at) => {
                    self.mark_lost(LossReason::DeadlinePassed, "no renewal confirmed before the local deadline (store unreachable or this process was paused)");
                    self.start_cancel(CancelReason::LeaseUnconfirmed, job);
                }
                _ = sleep_until(timeout_at) => {
                    self.start_cancel(CancelReason::Timeout, job);
                }
                _ = shutdown.cancelled(), if self.cancel.is_none() => {
                    self.start_cancel(CancelReason::Shutdown, job);
                }
                (sent, result) = async { renewal.as_mut().expect("guarded").await }, if renewal.is_some() => {
                    renewal = None;
                    if result.is_ok() {
                        events::store_answered(self.sup.store.outages(), &self.spec.job);
                    }
                    match result {
                        Ok(RenewOutcome::Renewed { expires_at }) => {
                            if !self.lost {
                                self.confirmed = sent;
                                self.next_renew = sent + self.spec.timing.renew_every;
                                events::lease_renewed(Some(&self.spec.job), self.lease, expires_at);
                                // After the log line: the watchdog never holds
                                // a later deadline than the log shows.
                                self.confirm_to_watchdog(job);
                                self.log_deadline();
                            }
                        }
                        Ok(RenewOutcome::Refused(refusal)) => {
                            self.mark_lost(LossReason::RenewRefused, &refusal.to_string());
                            self.start_cancel(CancelReason::LeaseLost, job);
                        }
                        Err(e) => {
                            let retry = (self.spec.timing.renew_every / 4).max(Duration::from_millis(250));
                            events::store_unavailable(self.sup.store.outages(), "renew", Some(&self.spec.job), &e.to_string(), Some(retry));
                            self.next_renew = Instant::now() + retry;
                        }
                    }
                }
                _ = sleep_until(renew_at) => {
                    renewal = Some(self.renew_call());
                }
            }
        }
    }
}

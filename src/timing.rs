//! The timing of a lease: how long it lasts, how often it is renewed, how
//! long a job gets between SIGTERM and SIGKILL, and the deadlines derived
//! from them. Validated once, when the config or the command line is read.

use std::time::Duration;

use crate::store::{MAX_LEASE, MIN_LEASE};

/// Default lease when neither the config nor a flag gives one.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The timing of a lease: how long it lasts, how often it is renewed, and how
/// long a job gets between SIGTERM and SIGKILL. Only [`LeaseTiming::new`]
/// builds one, so every value in use fits together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    pub lease: Duration,
    pub renew_every: Duration,
    pub kill_grace: Duration,
}

impl LeaseTiming {
    /// Validates a lease and derives what is not given: `renew_every`
    /// defaults to a third of the lease, `kill_grace` to a fifth.
    ///
    /// The constraints: the lease is 5 s..=300 s; `renew_every` is at most
    /// half the lease (so one failed renewal still leaves a retry); and
    /// `renew_every + kill_grace + safety margin` is below the lease, so that
    /// after the last confirmed renewal there is time for one more attempt
    /// before the job must receive SIGTERM.
    pub fn new(
        lease: Duration,
        renew_every: Option<Duration>,
        kill_grace: Option<Duration>,
    ) -> Result<LeaseTiming, TimingError> {
        if lease < MIN_LEASE || lease > MAX_LEASE {
            return Err(TimingError::Lease(format!(
                "lease {} is outside 5s..=300s; choose a lease between 5s and 300s",
                humantime::format_duration(lease)
            )));
        }
        let renew_every = renew_every.unwrap_or(lease / 3);
        let kill_grace = kill_grace.unwrap_or(lease / 5);
        if renew_every.is_zero() || renew_every > lease / 2 {
            return Err(TimingError::RenewEvery(format!(
                "renew_every {} is not well below the lease {}; use at most half the lease (default: a third)",
                humantime::format_duration(renew_every),
                humantime::format_duration(lease)
            )));
        }
        let timing = LeaseTiming {
            lease,
            renew_every,
            kill_grace,
        };
        if renew_every + kill_grace + timing.safety_margin() >= lease {
            return Err(TimingError::KillGrace(format!(
                "kill_grace {} does not fit in the lease {}: renew_every ({}) + kill_grace + safety margin ({}) must stay below the lease; shorten kill_grace or lengthen the lease",
                humantime::format_duration(kill_grace),
                humantime::format_duration(lease),
                humantime::format_duration(renew_every),
                humantime::format_duration(timing.safety_margin()),
            )));
        }
        Ok(timing)
    }

    /// How much earlier than the lease's end, measured on this host's
    /// monotonic clock from the moment the last successful acquire or renew
    /// was *sent*, the job must already be dead: covers clock-rate drift
    /// between this host and the store (2% of the lease) plus the time a
    /// SIGKILL takes to land (at least 200 ms in all).
    pub fn safety_margin(&self) -> Duration {
        (self.lease / 50).max(Duration::from_millis(200))
    }

    /// The time after a confirmed send at which the job must be dead.
    pub fn kill_by(&self) -> Duration {
        self.lease - self.safety_margin()
    }

    /// How much later than the daemon the run's watchdog acts on the same
    /// deadlines: a quarter of the safety margin (at least 50 ms). The
    /// daemon, when healthy, terminates the job itself and logs why; the
    /// watchdog is the backstop for a daemon that is stopped or gone, and
    /// its SIGKILL still lands three quarters of the margin before the
    /// lease can expire.
    pub fn watchdog_lag(&self) -> Duration {
        self.safety_margin() / 4
    }
}

/// Which timing value is wrong; the config module maps it to its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error("{0}")]
    Lease(String),
    #[error("{0}")]
    RenewEvery(String),
    #[error("{0}")]
    KillGrace(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derives_defaults() {
        let t = LeaseTiming::new(Duration::from_secs(30), None, None).unwrap();
        assert_eq!(t.renew_every, Duration::from_secs(10));
        assert_eq!(t.kill_grace, Duration::from_secs(6));
        assert_eq!(t.safety_margin(), Duration::from_millis(600));
        let t = LeaseTiming::new(Duration::from_secs(5), None, None).unwrap();
        assert_eq!(t.safety_margin(), Duration::from_millis(200));
        // The watchdog's SIGKILL still comes before the lease ends.
        assert_eq!(t.watchdog_lag(), Duration::from_millis(50));
        assert!(t.kill_by() + t.watchdog_lag() < t.lease);
    }

    #[test]
    fn rejects_bad_values() {
        let s = Duration::from_secs;
        assert!(matches!(
            LeaseTiming::new(s(4), None, None),
            Err(TimingError::Lease(_))
        ));
        assert!(matches!(
            LeaseTiming::new(s(301), None, None),
            Err(TimingError::Lease(_))
        ));
        assert!(matches!(
            LeaseTiming::new(s(30), Some(s(20)), None),
            Err(TimingError::RenewEvery(_))
        ));
        assert!(matches!(
            LeaseTiming::new(s(30), Some(s(10)), Some(s(20))),
            Err(TimingError::KillGrace(_))
        ));
        assert!(LeaseTiming::new(s(30), Some(s(10)), Some(s(10))).is_ok());
    }
}

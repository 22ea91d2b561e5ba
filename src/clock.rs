//! Wall time as the daemon reads it: a seam for tests.
//!
//! The scheduler and the occurrence policy decide *which* instant and
//! *when to give up* by the wall clock (instants are wall-clock seconds),
//! and how long to wait by tokio's monotonic clock. In production
//! [`Clock::now`] is `Utc::now()`. A test clock derives wall time from
//! tokio's `Instant` instead, so that a test on tokio's paused clock
//! (`#[tokio::test(start_paused = true)]`) moves both together and a minute
//! of schedule passes in microseconds.

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// Where wall time comes from.
#[derive(Debug, Clone, Copy, Default)]
pub struct Clock {
    /// `None`: the system clock. `Some((i, w))`: `w` at tokio instant `i`,
    /// advancing with tokio's clock.
    anchor: Option<(Instant, DateTime<Utc>)>,
}

impl Clock {
    /// The system's wall clock.
    pub fn system() -> Clock {
        Clock { anchor: None }
    }

    /// A wall clock that reads `wall` now and then advances with tokio's
    /// clock (paused or not).
    #[cfg(test)]
    pub fn following_tokio(wall: DateTime<Utc>) -> Clock {
        Clock {
            anchor: Some((Instant::now(), wall)),
        }
    }

    /// The current wall time.
    pub fn now(&self) -> DateTime<Utc> {
        match self.anchor {
            None => Utc::now(),
            Some((at, wall)) => {
                wall + chrono::Duration::from_std(Instant::now().saturating_duration_since(at))
                    .unwrap_or_default()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_test_clock_follows_tokio_time() {
        let start = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let clock = Clock::following_tokio(start);
        assert_eq!(clock.now(), start);
        tokio::time::sleep(Duration::from_secs(90)).await;
        assert_eq!(clock.now(), start + chrono::Duration::seconds(90));
    }
}

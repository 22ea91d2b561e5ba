//! Exponential backoff: the one way fencecron spaces out the retries of a
//! failing store call (and a job's own `retries`).
//!
//! Waits start at `initial` and grow by `factor` (2 unless set) up to `max`.
//! With a deadline ([`Backoff::until`], on tokio's clock, so paused test
//! time drives it), the iterator gives no wait that would end after it.
//! There is no jitter: fencecron's retries are per node and per job, and
//! nodes already compete in a per-node order.

use std::time::Duration;

use tokio::time::Instant;

/// Waits between attempts: `initial`, `initial * factor`, … at most `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    factor: u32,
    max: Duration,
    deadline: Option<Instant>,
    /// Waits handed out so far.
    given: u32,
}

impl Backoff {
    /// Waits from `initial`, doubling up to `max`, with no deadline.
    pub const fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            factor: 2,
            max,
            deadline: None,
            given: 0,
        }
    }

    /// Grows the waits by `factor` instead of 2.
    #[cfg(test)]
    pub const fn factor(mut self, factor: u32) -> Backoff {
        self.factor = factor;
        self
    }

    /// No wait that ends after `deadline`: the iterator ends there.
    pub fn until(mut self, deadline: Instant) -> Backoff {
        self.deadline = Some(deadline);
        self
    }

    /// The wait before retry `n` (1-based; 0 counts as 1):
    /// `initial * factor^(n-1)`, at most `max`, saturating.
    pub fn nth_wait(&self, n: u32) -> Duration {
        let scale = self.factor.saturating_pow(n.saturating_sub(1));
        self.initial.saturating_mul(scale).min(self.max)
    }

    /// The next wait, ignoring any deadline.
    pub fn wait(&mut self) -> Duration {
        self.given = self.given.saturating_add(1);
        self.nth_wait(self.given)
    }
}

/// The waits, ending when the next one would end after the deadline (the
/// caller then gives up; nothing is consumed). Without a deadline, endless.
impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.nth_wait(self.given.saturating_add(1));
        if self
            .deadline
            .is_some_and(|deadline| Instant::now() + wait > deadline)
        {
            return None;
        }
        self.given = self.given.saturating_add(1);
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn waits_grow_by_the_factor_up_to_the_max() {
        let mut b = Backoff::new(ms(100), ms(500));
        let waits: Vec<_> = (0..5).map(|_| b.wait()).collect();
        assert_eq!(waits, [ms(100), ms(200), ms(400), ms(500), ms(500)]);
        let mut b = Backoff::new(ms(1), ms(1000)).factor(10);
        let waits: Vec<_> = (0..4).map(|_| b.wait()).collect();
        assert_eq!(waits, [ms(1), ms(10), ms(100), ms(1000)]);
    }

    #[test]
    fn nth_saturates_instead_of_overflowing() {
        let b = Backoff::new(Duration::from_secs(10), Duration::MAX);
        assert_eq!(b.nth_wait(0), Duration::from_secs(10));
        assert_eq!(b.nth_wait(1), Duration::from_secs(10));
        assert_eq!(b.nth_wait(3), Duration::from_secs(40));
        assert_eq!(b.nth_wait(u32::MAX), Duration::from_secs(10) * u32::MAX);
        let b = Backoff::new(Duration::MAX, Duration::from_secs(600));
        assert_eq!(b.nth_wait(64), Duration::from_secs(600));
    }

    #[tokio::test(start_paused = true)]
    async fn no_wait_ends_after_the_deadline() {
        let start = Instant::now();
        let mut b = Backoff::new(ms(100), ms(1000)).until(start + ms(700));
        let mut waited = Vec::new();
        for wait in b.by_ref() {
            waited.push(wait);
            tokio::time::sleep(wait).await;
        }
        // 100 + 200 + 400 = 700 ends at the deadline; the next (800) would not.
        assert_eq!(waited, [ms(100), ms(200), ms(400)]);
        assert_eq!(Instant::now() - start, ms(700));
        assert_eq!(b.next(), None);
    }
}

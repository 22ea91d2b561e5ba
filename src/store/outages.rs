//! The store outages one store handle's users are in: which failure
//! begins an outage (logged at WARN by the caller) and which continue one
//! (DEBUG), and which outages a successful call ends. State only: the
//! caller logs what this answers (`events::store_unavailable`,
//! `events::store_answered`).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The store outages in progress, as one store handle's users see them
/// (each daemon, `exec` and the proxy open their own): one per job, and
/// one per operation for calls made for no job. The first failure of an
/// outage begins it ([`Outages::failed`] says so), the rest are counted;
/// the outage ends when the store answers a call for that job
/// ([`Outages::answered`]: an acquire, claim, renewal, finish or release)
/// or any call that proves it reachable for all
/// ([`Outages::answered_all`]: the node heartbeat, every 5 s, the trigger
/// poll and the proxy's `admit`). Metrics are not affected: the store's
/// failure counters count every call.
#[derive(Debug, Default)]
pub struct Outages(Mutex<HashMap<OutageKey, Outage>>);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum OutageKey {
    Job(String),
    Operation(String),
}

#[derive(Debug)]
struct Outage {
    failures: u64,
    since: tokio::time::Instant,
}

/// An outage that ended: for the job, or for the operation of calls made
/// for no job; how many calls failed and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ended {
    pub(crate) job: Option<String>,
    pub(crate) operation: Option<String>,
    pub(crate) failures: u64,
    pub(crate) took: Duration,
}

impl Outages {
    fn lock(&self) -> MutexGuard<'_, HashMap<OutageKey, Outage>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a failure of `operation` (for `job`); true if it begins an
    /// outage.
    pub(crate) fn failed(&self, operation: &str, job: Option<&str>) -> bool {
        let key = match job {
            Some(job) => OutageKey::Job(job.to_string()),
            None => OutageKey::Operation(operation.to_string()),
        };
        let mut open = self.lock();
        let outage = open.entry(key).or_insert(Outage {
            failures: 0,
            since: tokio::time::Instant::now(),
        });
        outage.failures += 1;
        outage.failures == 1
    }

    /// The store answered a call for `job`: its outage, if any, is over.
    #[must_use = "an ended outage is logged (events::store_answered)"]
    pub(crate) fn answered(&self, job: &str) -> Option<Ended> {
        let ended = self.lock().remove(&OutageKey::Job(job.to_string()));
        ended.map(|o| Ended {
            job: Some(job.to_string()),
            operation: None,
            failures: o.failures,
            took: o.since.elapsed(),
        })
    }

    /// The store answered a call that shows it reachable: every outage is
    /// over.
    #[must_use = "ended outages are logged (events::store_answered_all)"]
    pub(crate) fn answered_all(&self) -> Vec<Ended> {
        let ended: Vec<_> = self.lock().drain().collect();
        ended
            .into_iter()
            .map(|(key, o)| {
                let (job, operation) = match key {
                    OutageKey::Job(job) => (Some(job), None),
                    OutageKey::Operation(op) => (None, Some(op)),
                };
                Ended {
                    job,
                    operation,
                    failures: o.failures,
                    took: o.since.elapsed(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the first failure of a job's (or a job-less operation's) outage
    /// begins one; an answer for the job ends its outage alone, with the
    /// count and duration the caller logs; an answer for all ends the rest.
    #[tokio::test(start_paused = true)]
    async fn the_first_failure_begins_an_outage_and_an_answer_ends_it() {
        let outages = Outages::default();
        assert!(outages.failed("acquire", Some("a")));
        assert!(!outages.failed("renew", Some("a")));
        assert!(outages.failed("acquire", Some("b")));
        assert!(outages.failed("beat", None));
        assert!(!outages.failed("beat", None));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(
            outages.answered("a"),
            Some(Ended {
                job: Some("a".into()),
                operation: None,
                failures: 2,
                took: Duration::from_secs(3),
            })
        );
        assert_eq!(outages.answered("a"), None);
        let mut rest = outages.answered_all();
        rest.sort_by_key(|e| (e.job.clone(), e.operation.clone()));
        assert_eq!(
            rest.iter()
                .map(|e| (e.job.as_deref(), e.operation.as_deref(), e.failures))
                .collect::<Vec<_>>(),
            [(None, Some("beat"), 2), (Some("b"), None, 1)]
        );
        assert!(outages.answered_all().is_empty());
        assert!(outages.failed("acquire", Some("a")), "a new outage");
    }
}

//! What the fleet's nodes say about themselves, and what follows from it:
//! each job's published definition and its digest, the config drift
//! between live nodes, and whether a job is overdue. Pure functions over
//! what the store answers; the daemon (`daemon::heartbeat`) and the
//! commands (`nodes`, `status`) both use them, so they agree.
//!
//! A job's digest is the SHA-256 of its canonical definition ([`JobDef`]):
//! serde_json of a struct whose fields come in a fixed order, the
//! environment sorted by name, absent options left out (a field added by a
//! later release changes no digest of a job that does not use it). The same
//! definition has the same digest on every host and every release.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::{Catchup, Job, Overlap};
use crate::schedule::Schedule;
use crate::store::{millis, NodeInfo, PublishedJob, StoreTime};

/// How old an instant must be before a missing run makes its job overdue.
pub const OVERDUE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Everything in a job's definition that changes what runs and when, in
/// canonical form. Durations in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobDef {
    pub name: String,
    pub resource: String,
    pub schedule: String,
    pub timezone: String,
    /// The fixed shift `jitter` chose, in seconds.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub jitter_s: u64,
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i64>,
    pub lease_ms: i64,
    pub renew_every_ms: i64,
    pub kill_grace_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub retries: u32,
    pub retry_backoff_ms: i64,
    pub retry_backoff_max_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_deadline_ms: Option<i64>,
    pub catchup: String,
    pub overlap: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<Vec<String>>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

impl JobDef {
    /// The canonical definition of a validated job.
    pub fn of(job: &Job) -> JobDef {
        JobDef {
            name: job.name.to_string(),
            resource: job.resource.to_string(),
            schedule: job.schedule.expr().to_string(),
            timezone: job.schedule.tz().name().to_string(),
            jitter_s: job.schedule.jitter_offset().as_secs(),
            command: job.command.clone(),
            env: job.env.clone(),
            workdir: job.workdir.as_ref().map(|w| w.display().to_string()),
            timeout_ms: job.timeout.map(millis),
            lease_ms: millis(job.timing.lease),
            renew_every_ms: millis(job.timing.renew_every),
            kill_grace_ms: millis(job.timing.kill_grace),
            stale_exit_code: job.stale_exit_code,
            retries: job.retry.retries,
            retry_backoff_ms: millis(job.retry.backoff),
            retry_backoff_max_ms: millis(job.retry.backoff_max),
            starting_deadline_ms: job.starting_deadline.map(millis),
            catchup: match job.catchup {
                Catchup::Latest => "latest",
                Catchup::None => "none",
            }
            .to_string(),
            overlap: match job.overlap {
                Overlap::Skip => "skip",
                Overlap::Replace => "replace",
            }
            .to_string(),
            on_failure: job.on_failure.clone(),
        }
    }

    /// The canonical JSON.
    pub fn canonical(&self) -> String {
        serde_json::to_string(self).expect("a JobDef always serializes")
    }

    /// The schedule, rebuilt from the published text (for `status` with
    /// only `--store`).
    pub fn parsed_schedule(&self) -> Result<Schedule, String> {
        let tz = Schedule::parse_tz(&self.timezone)?;
        Ok(Schedule::parse(&self.schedule, tz)?
            .with_offset(std::time::Duration::from_secs(self.jitter_s)))
    }
}

/// The digest of a canonical JSON definition: its SHA-256, in hex.
pub fn digest_of(canonical: &str) -> String {
    hex(&Sha256::digest(canonical.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a node publishes for its jobs: (name, digest, canonical JSON), by
/// name.
pub fn published(jobs: &[Job]) -> Vec<(String, String, String)> {
    let mut out: Vec<_> = jobs
        .iter()
        .map(|j| {
            let def = JobDef::of(j);
            let json = def.canonical();
            (def.name, digest_of(&json), json)
        })
        .collect();
    out.sort();
    out
}

/// The digest of a whole job set: SHA-256 over each job's name and digest,
/// by name. Equal on two nodes exactly when they define the same jobs the
/// same way. The pairs come by name.
pub fn config_digest<'a>(jobs: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let mut h = Sha256::new();
    for (name, digest) in jobs {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(digest.as_bytes());
        h.update([b'\n']);
    }
    hex(&h.finalize())
}

/// A digest as shown: its first 12 hex digits.
pub fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

/// One job the live nodes disagree about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Drift {
    pub job: String,
    /// The nodes that have the job, by the digest of their definition.
    pub nodes_with: BTreeMap<String, Vec<String>>,
    /// The live nodes that lack it.
    pub nodes_without: Vec<String>,
}

impl Drift {
    /// `digest: node,node; digest: node` (digests shortened).
    pub fn with_text(&self) -> String {
        self.nodes_with
            .iter()
            .map(|(d, nodes)| format!("{}: {}", short(d), nodes.join(",")))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The nodes that take part in the drift check: the live ones that
/// published a job set (a node of an older release publishes none).
pub fn drift_nodes(nodes: &[NodeInfo], now: StoreTime) -> Vec<&NodeInfo> {
    nodes
        .iter()
        .filter(|n| n.live(now) && !n.config_digest.is_empty())
        .collect()
}

/// Whether the drift check must read per-job digests: the live nodes'
/// whole-set digests differ.
pub fn may_drift(nodes: &[&NodeInfo]) -> bool {
    let digests: BTreeSet<&str> = nodes.iter().map(|n| n.config_digest.as_str()).collect();
    digests.len() > 1
}

/// The jobs `nodes` disagree about, from the per-job digests they
/// published (`jobs`, any order), by job name.
pub fn drift(nodes: &[&str], jobs: &[PublishedJob]) -> BTreeMap<String, Drift> {
    let mut by_job: BTreeMap<&str, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for j in jobs.iter().filter(|j| nodes.contains(&j.node.as_str())) {
        by_job
            .entry(j.job.as_str())
            .or_default()
            .entry(j.digest.clone())
            .or_default()
            .push(j.node.clone());
    }
    let mut out = BTreeMap::new();
    for (job, mut with) in by_job {
        let has: BTreeSet<&str> = with.values().flatten().map(String::as_str).collect();
        let mut without: Vec<String> = nodes
            .iter()
            .filter(|n| !has.contains(**n))
            .map(|n| n.to_string())
            .collect();
        if with.len() > 1 || !without.is_empty() {
            with.values_mut().for_each(|v| v.sort());
            without.sort();
            out.insert(
                job.to_string(),
                Drift {
                    job: job.to_string(),
                    nodes_with: with,
                    nodes_without: without,
                },
            );
        }
    }
    out
}

/// The newest instant of `schedule` at or before `t`, if there is one after
/// `since`. Searches windows of growing length back from `t` (a minute, an
/// hour, a day, a month, a year), so a job that fires every second costs
/// about 60 steps and a yearly one a few.
pub fn last_instant(
    schedule: &Schedule,
    t: DateTime<Utc>,
    since: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    const WINDOWS: [i64; 5] = [60, 3600, 86_400, 32 * 86_400, 400 * 86_400];
    for w in WINDOWS {
        let start = (t - chrono::Duration::seconds(w)).max(since);
        let mut last = None;
        let mut at = start - chrono::Duration::seconds(1);
        while let Some(next) = schedule.next_after(at) {
            if next > t {
                break;
            }
            last = Some(next);
            at = next;
        }
        if last.is_some() || start <= since {
            return last;
        }
    }
    None
}

/// What `status` knows about one job, to say whether it is overdue.
#[derive(Debug, Clone, Default)]
pub struct JobFacts {
    /// When the earliest live node that has the job started (store time);
    /// `None`: no live node has it.
    pub live_since: Option<DateTime<Utc>>,
    pub paused: bool,
    /// A run holds the job's lease now.
    pub running: bool,
    /// The newest runs: (scheduled instant, start).
    pub runs: Vec<(Option<DateTime<Utc>>, DateTime<Utc>)>,
}

/// Why a job is overdue at `now`, or `None`: no live node has it, or the
/// newest instant older than [`OVERDUE_AFTER`] (and not before the earliest
/// live node with the job started) has no run: none scheduled for it or
/// later, none started at or after it. A paused job, and one whose run
/// still holds the lease (its instant was skipped as `held`), is not
/// overdue.
pub fn overdue(schedule: &Schedule, now: DateTime<Utc>, facts: &JobFacts) -> Option<String> {
    let Some(since) = facts.live_since else {
        return Some("no live node has the job".to_string());
    };
    if facts.paused || facts.running {
        return None;
    }
    let due = now - chrono::Duration::from_std(OVERDUE_AFTER).unwrap_or_default();
    let instant = last_instant(schedule, due, since)?;
    let ran = facts
        .runs
        .iter()
        .any(|(scheduled, started)| scheduled.is_some_and(|s| s >= instant) || *started >= instant);
    (!ran).then(|| format!("the instant {} has no run", crate::store::rfc3339(instant)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::NodeState;

    fn job_def() -> JobDef {
        JobDef {
            name: "a".into(),
            resource: "a".into(),
            schedule: "*/5 * * * * *".into(),
            timezone: "UTC".into(),
            jitter_s: 0,
            command: vec!["true".into()],
            env: BTreeMap::from([("B".into(), "2".into()), ("A".into(), "1".into())]),
            workdir: None,
            timeout_ms: None,
            lease_ms: 30_000,
            renew_every_ms: 10_000,
            kill_grace_ms: 6_000,
            stale_exit_code: None,
            retries: 0,
            retry_backoff_ms: 10_000,
            retry_backoff_max_ms: 600_000,
            starting_deadline_ms: None,
            catchup: "latest".into(),
            overlap: "skip".into(),
            on_failure: None,
        }
    }

    #[test]
    fn the_digest_is_of_a_canonical_form_that_does_not_change() {
        let def = job_def();
        // Fixed: a change here changes every published digest, and every
        // node of an older release would report drift against this one.
        assert_eq!(
            def.canonical(),
            r#"{"name":"a","resource":"a","schedule":"*/5 * * * * *","timezone":"UTC","command":["true"],"env":{"A":"1","B":"2"},"lease_ms":30000,"renew_every_ms":10000,"kill_grace_ms":6000,"retry_backoff_ms":10000,"retry_backoff_max_ms":600000,"catchup":"latest","overlap":"skip"}"#
        );
        assert_eq!(digest_of(&def.canonical()).len(), 64);
        let mut other = def.clone();
        other.command.push("x".into());
        assert_ne!(digest_of(&def.canonical()), digest_of(&other.canonical()));
        let back: JobDef = serde_json::from_str(&def.canonical()).unwrap();
        assert_eq!(back, def);
    }

    fn node(name: &str, digest: &str, seen: i64, state: NodeState) -> NodeInfo {
        NodeInfo {
            node: name.into(),
            hostname: "h".into(),
            pid: 1,
            version: "v".into(),
            config_digest: digest.into(),
            started_at: StoreTime(0),
            last_seen: StoreTime(seen),
            state,
            running: 0,
        }
    }

    fn pj(node: &str, job: &str, digest: &str) -> PublishedJob {
        PublishedJob {
            node: node.into(),
            job: job.into(),
            digest: digest.into(),
            definition: None,
        }
    }

    #[test]
    fn drift_names_the_nodes_on_each_side() {
        let jobs = [
            pj("n1", "same", "d1"),
            pj("n2", "same", "d1"),
            pj("n1", "changed", "d1"),
            pj("n2", "changed", "d2"),
            pj("n1", "only", "d3"),
            pj("gone", "ghost", "d4"),
        ];
        let d = drift(&["n1", "n2"], &jobs);
        assert_eq!(d.keys().collect::<Vec<_>>(), ["changed", "only"]);
        assert_eq!(d["changed"].nodes_with["d1"], ["n1"]);
        assert_eq!(d["changed"].nodes_with["d2"], ["n2"]);
        assert!(d["changed"].nodes_without.is_empty());
        assert_eq!(d["only"].nodes_without, ["n2"]);
        assert!(drift(&["n1"], &jobs).is_empty());
    }

    #[test]
    fn only_live_nodes_with_a_job_set_take_part() {
        let now = StoreTime(100_000);
        let nodes = [
            node("a", "x", 99_000, NodeState::Running),
            node("b", "y", 99_000, NodeState::Draining),
            node("old", "", 99_000, NodeState::Running),
            node(
                "dead",
                "z",
                100_000 - millis(crate::store::NODE_LIVE),
                NodeState::Running,
            ),
            node("stopped", "z", 99_000, NodeState::Stopped),
        ];
        let live = drift_nodes(&nodes, now);
        assert_eq!(
            live.iter().map(|n| n.node.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(may_drift(&live));
        assert!(!may_drift(&live[..1]));
        assert_eq!(nodes[3].shown_state(now), NodeState::GONE);
        assert_eq!(nodes[4].shown_state(now), NodeState::GONE);
        assert_eq!(nodes[1].shown_state(now), NodeState::Draining.as_str());
    }

    #[test]
    fn a_job_is_overdue_without_a_live_node_or_a_run_of_an_old_instant() {
        let at = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let now = at("2026-12-07T10:05:30Z");
        let minutely = Schedule::parse("0 * * * * *", chrono_tz::UTC).unwrap();
        let live = JobFacts {
            live_since: Some(at("2026-12-07T09:00:00Z")),
            ..JobFacts::default()
        };
        // 10:04:00 is the newest instant more than 60 s old.
        assert_eq!(
            overdue(&minutely, now, &live).as_deref(),
            Some("the instant 2026-12-07T10:04:00.000Z has no run")
        );
        let ran = |scheduled: &str, started: &str| JobFacts {
            runs: vec![(Some(at(scheduled)), at(started))],
            ..live.clone()
        };
        assert_eq!(
            overdue(
                &minutely,
                now,
                &ran("2026-12-07T10:04:00Z", "2026-12-07T10:04:00Z")
            ),
            None
        );
        assert_eq!(
            overdue(
                &minutely,
                now,
                &ran("2026-12-07T10:05:00Z", "2026-12-07T10:05:00Z")
            ),
            None
        );
        assert!(overdue(
            &minutely,
            now,
            &ran("2026-12-07T10:03:00Z", "2026-12-07T10:03:00Z")
        )
        .is_some());
        // A manual run after the instant covers it.
        let manual = JobFacts {
            runs: vec![(None, at("2026-12-07T10:04:10Z"))],
            ..live.clone()
        };
        assert_eq!(overdue(&minutely, now, &manual), None);
        assert_eq!(
            overdue(
                &minutely,
                now,
                &JobFacts {
                    paused: true,
                    ..live.clone()
                }
            ),
            None
        );
        assert_eq!(
            overdue(
                &minutely,
                now,
                &JobFacts {
                    running: true,
                    ..live.clone()
                }
            ),
            None
        );
        // Instants before the first live node started do not count.
        let fresh = JobFacts {
            live_since: Some(at("2026-12-07T10:04:30Z")),
            ..JobFacts::default()
        };
        assert_eq!(overdue(&minutely, now, &fresh), None);
        assert_eq!(
            overdue(&minutely, now, &JobFacts::default()).as_deref(),
            Some("no live node has the job")
        );
        // Paused or not, a job no live node has is overdue.
        assert!(overdue(
            &minutely,
            now,
            &JobFacts {
                paused: true,
                ..JobFacts::default()
            }
        )
        .is_some());
    }

    #[test]
    fn the_last_instant_is_found_for_fast_and_slow_schedules() {
        let t = DateTime::parse_from_rfc3339("2026-12-07T10:00:07Z")
            .unwrap()
            .with_timezone(&Utc);
        let long_ago = t - chrono::Duration::days(3000);
        let every5 = Schedule::parse("*/5 * * * * *", chrono_tz::UTC).unwrap();
        assert_eq!(
            last_instant(&every5, t, long_ago).unwrap().to_rfc3339(),
            "2026-12-07T10:00:05+00:00"
        );
        let daily = Schedule::parse("0 30 2 * * *", chrono_tz::UTC).unwrap();
        assert_eq!(
            last_instant(&daily, t, long_ago).unwrap().to_rfc3339(),
            "2026-12-07T02:30:00+00:00"
        );
        let yearly = Schedule::parse("0 0 0 1 1 *", chrono_tz::UTC).unwrap();
        assert_eq!(
            last_instant(&yearly, t, long_ago).unwrap().to_rfc3339(),
            "2026-01-01T00:00:00+00:00"
        );
        // Nothing after `since`.
        assert_eq!(
            last_instant(&daily, t, t - chrono::Duration::hours(1)),
            None
        );
        // An instant exactly at `t` counts.
        assert_eq!(
            last_instant(&every5, t - chrono::Duration::seconds(2), long_ago)
                .unwrap()
                .to_rfc3339(),
            "2026-12-07T10:00:05+00:00"
        );
    }
}

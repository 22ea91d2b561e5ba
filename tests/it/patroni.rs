//! A fleet on a real highly available PostgreSQL: three nodes managed by
//! Patroni with one etcd ([`common::patroni`]), two daemons (the real
//! binary) on the cluster's multi-host URL with
//! `target_session_attrs=read-write`, three jobs (one every second, one
//! every two seconds, one every ten seconds that runs seven). Then a
//! `patronictl switchover`, and a crash of the leader (Patroni and its
//! postgres SIGKILLed). For each event the test prints, and puts in its
//! assertion messages: the longest time a job had no run (seconds without
//! an owner), the runs killed (`job_cancelled`), the instants missed, the
//! duplicates (one job and instant run twice), the reissued tokens (a
//! token after the event not above every token before, or one token used
//! twice) and the overlapping runs (a run of a job that started before an
//! earlier run of the same job had ended, by the runs' own start and end
//! records). Duplicates, reissued tokens and overlaps must be 0, and every
//! job must run again on the new leader within a bound derived from
//! Patroni's `ttl` + `loop_wait` and the lease. With `synchronous_mode` off
//! and on.
//!
//! Needs root, Patroni, etcd and PostgreSQL's server binaries; without
//! them a loud `*** SKIPPED … ***`, under `CI=true` a failure.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};

use common::daemon::{ev, is, job_toml, token_of, wait_until, write_config, Daemon, DaemonOpts};
use common::harness::{describe, fencecron, run};
use common::patroni::{skip_unless_available, Cluster, LOOP_WAIT, RETRY_TIMEOUT, TTL};

/// The jobs' lease (seconds).
const LEASE: u64 = 5;

/// The jobs: name, schedule, period in seconds, how long a run sleeps.
const JOBS: [(&str, &str, i64, &str); 3] = [
    ("every1", "* * * * * *", 1, "0"),
    ("every2", "*/2 * * * * *", 2, "0"),
    ("long", "*/10 * * * * *", 10, "7"),
];

/// The jobs whose every instant should run when the store is up (the long
/// one skips the instants that fall while it runs).
const SHORT: [&str; 2] = ["every1", "every2"];

/// How long after an event every job must have run on the new leader: the
/// leader key's `ttl`, Patroni's loop and retry, a lease for the runs in
/// flight, and as much again for busy cores.
fn bound() -> Duration {
    Duration::from_secs(2 * (TTL + LOOP_WAIT + RETRY_TIMEOUT + LEASE) + 10)
}

/// One run, as its job recorded it at its start.
#[derive(Debug, Clone)]
struct Run {
    job: String,
    scheduled_at: DateTime<Utc>,
    token: i64,
    node: String,
    /// Wall clock at the job's start, nanoseconds since the epoch.
    started_ns: i64,
}

/// A job that appends `SCHEDULED_AT TOKEN NODE NOW_NS` to `dir/runs.JOB`,
/// sleeps `sleep` seconds, then appends the same with the time it ended to
/// `dir/ends.JOB`, also when SIGTERM stops it (a run SIGKILLed before that,
/// or while `date` reads the time, has no end line: its end is its
/// daemon's `job_finished`, see [`run_ends`]).
fn recording(dir: &Path, sleep: &str) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        r#"dir=$1
end() { t=$(date +%s%N) && [ -n "$t" ] && echo "$FENCECRON_SCHEDULED_AT $FENCECRON_TOKEN $FENCECRON_NODE $t" >> "$dir/ends.$FENCECRON_JOB"; }
trap 'end; exit 143' TERM
echo "$FENCECRON_SCHEDULED_AT $FENCECRON_TOKEN $FENCECRON_NODE $(date +%s%N)" >> "$dir/runs.$FENCECRON_JOB"
sleep "$2"
end"#
            .into(),
        "sh".into(),
        dir.display().to_string(),
        sleep.into(),
    ]
}

fn read_runs(dir: &Path) -> Vec<Run> {
    let mut runs = Vec::new();
    for (job, ..) in JOBS {
        let text = std::fs::read_to_string(dir.join(format!("runs.{job}"))).unwrap_or_default();
        // Only whole lines: a run may be appending its own right now.
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        for line in whole.lines().filter(|l| !l.trim().is_empty()) {
            let f: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(f.len(), 4, "malformed run line {line:?} of {job}");
            runs.push(Run {
                job: job.to_string(),
                scheduled_at: DateTime::parse_from_rfc3339(f[0])
                    .unwrap_or_else(|e| panic!("scheduled_at {:?}: {e}", f[0]))
                    .with_timezone(&Utc),
                token: f[1]
                    .parse()
                    .unwrap_or_else(|e| panic!("token {:?}: {e}", f[1])),
                node: f[2].to_string(),
                started_ns: f[3]
                    .parse()
                    .unwrap_or_else(|e| panic!("start {:?}: {e}", f[3])),
            });
        }
    }
    runs
}

/// When each run (job, token) ended: the job's own end line, else (a run
/// killed before it could write one) the `job_finished` its daemon logged
/// once the run's whole process tree was gone, a later instant than the
/// run's last. A run with neither is still running.
fn run_ends(dir: &Path, daemons: &[Daemon]) -> BTreeMap<(String, i64), i64> {
    let mut ends = BTreeMap::new();
    for d in daemons {
        for e in d.events("job_finished") {
            let (Some(job), Some(at)) = (
                e.get("job").and_then(|v| v.as_str()),
                e.get("timestamp").and_then(|v| v.as_str()),
            ) else {
                continue;
            };
            let at = DateTime::parse_from_rfc3339(at)
                .unwrap_or_else(|err| panic!("job_finished timestamp {at:?}: {err}"));
            let ns = at
                .timestamp_nanos_opt()
                .expect("a timestamp within i64 nanoseconds");
            ends.insert((job.to_string(), token_of(&e)), ns);
        }
    }
    ends.extend(own_ends(dir));
    ends
}

/// The runs' own end lines: (job, token) -> when the run ended.
fn own_ends(dir: &Path) -> BTreeMap<(String, i64), i64> {
    let mut ends = BTreeMap::new();
    for (job, ..) in JOBS {
        let text = std::fs::read_to_string(dir.join(format!("ends.{job}"))).unwrap_or_default();
        let whole = text.rfind('\n').map_or("", |end| &text[..end]);
        for line in whole.lines().filter(|l| !l.trim().is_empty()) {
            let f: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(f.len(), 4, "malformed end line {line:?} of {job}");
            let token: i64 = f[1]
                .parse()
                .unwrap_or_else(|e| panic!("token {:?}: {e}", f[1]));
            let ns: i64 = f[3]
                .parse()
                .unwrap_or_else(|e| panic!("end {:?}: {e}", f[3]));
            ends.insert((job.to_string(), token), ns);
        }
    }
    ends
}

/// Runs their daemon saw succeed that wrote no end line: the end lines the
/// overlap check relies on are missing (none, if the job records them).
fn succeeded_without_end_line(dir: &Path, daemons: &[Daemon]) -> Vec<(String, i64)> {
    let own = own_ends(dir);
    daemons
        .iter()
        .flat_map(|d| d.events("job_finished"))
        .filter(|e| e.get("outcome").and_then(|v| v.as_str()) == Some("succeeded"))
        .filter_map(|e| {
            let key = (e.get("job")?.as_str()?.to_string(), token_of(&e));
            (!own.contains_key(&key)).then_some(key)
        })
        .collect()
}

/// Every pair of runs of one job where the later one started before the
/// earlier one had ended (by [`run_ends`]; a run with no end is still
/// running at `now_ns`), described; only pairs whose later run started
/// after `since_ns`.
fn overlaps(
    runs: &[Run],
    ends: &BTreeMap<(String, i64), i64>,
    now_ns: i64,
    since_ns: i64,
) -> Vec<String> {
    let mut found = Vec::new();
    let jobs: BTreeSet<&str> = runs.iter().map(|r| r.job.as_str()).collect();
    for job in jobs {
        let mut mine: Vec<&Run> = runs.iter().filter(|r| r.job == job).collect();
        mine.sort_by_key(|r| r.started_ns);
        // The run among the earlier ones that ends last, and its end.
        let mut latest: Option<(&Run, i64)> = None;
        for r in mine {
            if let Some((prev, end)) = latest {
                if r.started_ns < end && r.started_ns > since_ns {
                    found.push(format!(
                        "{job}: the run of {} (token {}, {}) started {:.3} s before the run of {} \
                         (token {}, {}) ended{}",
                        r.scheduled_at,
                        r.token,
                        r.node,
                        (end - r.started_ns) as f64 / 1e9,
                        prev.scheduled_at,
                        prev.token,
                        prev.node,
                        if ends.contains_key(&(job.to_string(), prev.token)) {
                            ""
                        } else {
                            " (it has not ended)"
                        }
                    ));
                }
            }
            let end = ends
                .get(&(job.to_string(), r.token))
                .copied()
                .unwrap_or(now_ns);
            if latest.is_none_or(|(_, e)| end > e) {
                latest = Some((r, end));
            }
        }
    }
    found
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos() as i64
}

/// The token's epoch (a new timeline raises it).
fn epoch(token: i64) -> i64 {
    token >> 32
}

/// The highest token of `job` among `runs`.
fn max_token(runs: &[Run], job: &str) -> i64 {
    runs.iter()
        .filter(|r| r.job == job)
        .map(|r| r.token)
        .max()
        .unwrap_or(0)
}

/// What one event did to the fleet.
#[derive(Debug)]
struct Report {
    event: String,
    /// Seconds from the event to the first run of every short job on the
    /// new leader.
    recovered_s: f64,
    /// The longest time between two consecutive runs of one short job
    /// across the event (seconds without an owner; 1 or 2 when nothing
    /// happened).
    longest_gap_s: f64,
    runs_killed: usize,
    instants_missed: usize,
    duplicates: usize,
    reissued_tokens: usize,
    /// Pairs of runs of one job at once, the later one started after the
    /// event (see [`overlaps`]).
    overlapping_runs: Vec<String>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: jobs ran again on the new leader after {:.1} s; longest gap between runs \
             {:.1} s; runs killed {}; instants missed {}; duplicates {}; reissued tokens {}; \
             overlapping runs {}{}",
            self.event,
            self.recovered_s,
            self.longest_gap_s,
            self.runs_killed,
            self.instants_missed,
            self.duplicates,
            self.reissued_tokens,
            self.overlapping_runs.len(),
            self.overlapping_runs
                .iter()
                .map(|o| format!("\n    {o}"))
                .collect::<String>()
        )
    }
}

/// Runs `event` on the cluster and measures it on the fleet.
fn measure(
    name: &str,
    cluster: &mut Cluster,
    daemons: &[Daemon],
    dir: &Path,
    event: impl FnOnce(&mut Cluster),
) -> Report {
    // The event strikes while a run of the long job is in flight, so
    // that what it does to running jobs shows.
    let since = now_ns();
    wait_until(
        Duration::from_secs(60),
        || {
            read_runs(dir)
                .iter()
                .any(|r| r.job == "long" && r.started_ns > since)
        },
        || format!("{name}: no run of the long job\n{}", summaries(daemons)),
    );
    let before = read_runs(dir);
    let t0 = now_ns();
    let marks: Vec<usize> = daemons.iter().map(Daemon::len).collect();
    event(cluster);
    // Recovered: every job has a run that started after the event with a
    // token of a higher epoch than any before (the new leader's timeline).
    let recovered = |runs: &[Run]| {
        JOBS.iter().all(|(job, ..)| {
            let floor = epoch(max_token(&before, job));
            runs.iter()
                .any(|r| r.job == *job && r.started_ns > t0 && epoch(r.token) > floor)
        })
    };
    wait_until(
        bound(),
        || recovered(&read_runs(dir)),
        || {
            format!(
                "{name}: not every job ran on the new leader within {:?} (ttl {TTL} s + \
                 loop_wait {LOOP_WAIT} s + retry_timeout {RETRY_TIMEOUT} s + lease {LEASE} s, \
                 twice, + 10 s); runs after the event: {:?}\n{}\n{}",
                bound(),
                read_runs(dir)
                    .iter()
                    .filter(|r| r.started_ns > t0)
                    .map(|r| (&r.job, r.token, &r.node))
                    .collect::<Vec<_>>(),
                summaries(daemons),
                cluster.logs()
            )
        },
    );
    let t_rec = now_ns();
    // Two more runs of each short job on the new leader, so that the
    // gap and the missed instants are closed on both sides.
    wait_until(
        bound(),
        || {
            let runs = read_runs(dir);
            SHORT.iter().all(|j| {
                runs.iter()
                    .filter(|r| r.job == *j && r.started_ns > t_rec)
                    .count()
                    >= 2
            })
        },
        || {
            format!(
                "{name}: the short jobs stopped running\n{}",
                summaries(daemons)
            )
        },
    );
    let all = read_runs(dir);
    // Recovery: the first run of each short job on the new leader.
    let recovered_ns = SHORT
        .iter()
        .map(|job| {
            let floor = epoch(max_token(&before, job));
            all.iter()
                .filter(|r| r.job == *job && r.started_ns > t0 && epoch(r.token) > floor)
                .map(|r| r.started_ns - t0)
                .min()
                .expect("checked by recovered")
        })
        .max()
        .expect("short jobs");

    let mut longest_gap_ns = 0;
    let mut instants_missed = 0;
    for job in SHORT {
        let period = JOBS.iter().find(|j| j.0 == job).expect("a job").2;
        let mut starts: Vec<i64> = all
            .iter()
            .filter(|r| r.job == job)
            .map(|r| r.started_ns)
            .collect();
        starts.sort_unstable();
        for w in starts.windows(2) {
            if w[1] > t0 && w[0] < t_rec {
                longest_gap_ns = longest_gap_ns.max(w[1] - w[0]);
            }
        }
        // Instants from the last run before the event to the first after
        // recovery that were not run.
        let instants: BTreeSet<i64> = all
            .iter()
            .filter(|r| r.job == job)
            .map(|r| r.scheduled_at.timestamp())
            .collect();
        let last_before = before
            .iter()
            .filter(|r| r.job == job)
            .map(|r| r.scheduled_at.timestamp())
            .max()
            .expect("runs before the event");
        let first_after = all
            .iter()
            .filter(|r| r.job == job && r.started_ns > t_rec)
            .map(|r| r.scheduled_at.timestamp())
            .min()
            .expect("runs after recovery");
        instants_missed += (last_before..=first_after)
            .step_by(period as usize)
            .filter(|at| !instants.contains(at))
            .count();
    }
    let runs_killed = daemons
        .iter()
        .zip(&marks)
        .map(|(d, mark)| {
            d.all()[*mark..]
                .iter()
                .filter(|e| is(e, "job_cancelled"))
                .count()
        })
        .sum();
    let after: Vec<&Run> = all.iter().filter(|r| r.started_ns > t0).collect();
    let reissued_tokens = after
        .iter()
        .filter(|r| r.token <= max_token(&before, &r.job))
        .count()
        + twice(&all, |r| (r.job.clone(), r.token));
    let report = Report {
        event: name.to_string(),
        recovered_s: recovered_ns as f64 / 1e9,
        longest_gap_s: longest_gap_ns as f64 / 1e9,
        runs_killed,
        instants_missed,
        duplicates: twice(&all, |r| (r.job.clone(), r.scheduled_at.timestamp_millis())),
        reissued_tokens,
        overlapping_runs: overlaps(&all, &run_ends(dir, daemons), now_ns(), t0),
    };
    eprintln!("patroni: {report}");
    report
}

/// How many runs share their key with an earlier one.
fn twice<K: Ord>(runs: &[Run], key: impl Fn(&Run) -> K) -> usize {
    let mut seen: BTreeMap<K, usize> = BTreeMap::new();
    for r in runs {
        *seen.entry(key(r)).or_default() += 1;
    }
    seen.values().map(|n| n - 1).sum()
}

fn summaries(daemons: &[Daemon]) -> String {
    daemons
        .iter()
        .map(|d| format!("[{}] {}", d.node, d.summary()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn fleet_survives_a_switchover_and_a_crash(test: &str, synchronous_mode: bool) {
    if skip_unless_available(test) {
        return;
    }
    let mut cluster = Cluster::start(synchronous_mode);
    let whole = cluster.started;
    let admin = cluster.url(
        "postgres",
        "target_session_attrs=read-write&connect_timeout=2",
    );
    let psql: PathBuf = common::pg::pg_bindir().expect("checked").join("psql");
    let out = run(
        std::process::Command::new(psql).args([&admin, "-c", "CREATE DATABASE fencecron"]),
        None,
    );
    assert!(out.status.success(), "create database: {}", describe(&out));
    cluster.wait_database("fencecron", Duration::from_secs(60));
    let store = cluster.url(
        "fencecron",
        "target_session_attrs=read-write&connect_timeout=2",
    );
    let work = tempfile::tempdir().expect("temp dir");
    let out = run(
        fencecron(work.path()).args(["--store", &store, "lease", "list"]),
        None,
    );
    assert!(out.status.success(), "migrate: {}", describe(&out));

    let dir = work.path();
    let jobs: Vec<String> = JOBS
        .iter()
        .map(|(name, schedule, _, sleep)| job_toml(name, schedule, &recording(dir, sleep), ""))
        .collect();
    let config = write_config(dir, &format!("lease = \"{LEASE}s\""), &jobs);
    let daemons: Vec<Daemon> = ["pa", "pb"]
        .iter()
        .map(|node| Daemon::spawn(DaemonOpts::new(node, &config, &store)))
        .collect();
    for d in &daemons {
        d.expect(
            "daemon_started",
            ev("daemon_started"),
            Duration::from_secs(60),
        );
    }
    // Warm: every job has run, the short ones twice.
    wait_until(
        Duration::from_secs(60),
        || {
            let runs = read_runs(dir);
            JOBS.iter().all(|(job, ..)| {
                runs.iter().filter(|r| r.job == *job).count() >= if *job == "long" { 1 } else { 2 }
            })
        },
        || format!("the jobs did not start\n{}", summaries(&daemons)),
    );

    let switchover = measure("switchover", &mut cluster, &daemons, dir, |c| {
        let (from, to) = c.switchover();
        eprintln!("{test}: switchover from {from} to {to}");
    });
    // The old leader back as a streaming replica before the crash.
    cluster.wait_healthy(
        3,
        Duration::from_secs(90),
        "three members again after the switchover",
    );
    let crash = measure("crash of the leader", &mut cluster, &daemons, dir, |c| {
        let crashed = c.crash_leader();
        eprintln!("{test}: crashed {crashed}");
    });
    let new_leader = cluster.leader(Duration::from_secs(30));

    let context = format!(
        "{test} (synchronous_mode {synchronous_mode}):\n  {switchover}\n  {crash}\n  \
         new leader {new_leader}; whole test {:.1} s",
        whole.elapsed().as_secs_f64()
    );
    eprintln!("{context}");
    for r in [&switchover, &crash] {
        assert_eq!(r.duplicates, 0, "duplicates: {context}");
        assert_eq!(r.reissued_tokens, 0, "reissued tokens: {context}");
        assert!(r.overlapping_runs.is_empty(), "overlapping runs: {context}");
    }
    // The whole run, too: one job and instant never ran twice, no token
    // was used twice, and each job's tokens rise with its instants.
    let all = read_runs(dir);
    assert_eq!(
        twice(&all, |r| (r.job.clone(), r.scheduled_at.timestamp_millis())),
        0,
        "{context}"
    );
    assert_eq!(twice(&all, |r| (r.job.clone(), r.token)), 0, "{context}");
    for (job, ..) in JOBS {
        let mut runs: Vec<&Run> = all.iter().filter(|r| r.job == job).collect();
        runs.sort_by_key(|r| r.scheduled_at);
        for w in runs.windows(2) {
            assert!(
                w[0].token < w[1].token,
                "{job}: the run of {} has token {} after {} (the run of {}): {context}",
                w[1].scheduled_at,
                w[1].token,
                w[0].token,
                w[0].scheduled_at
            );
        }
    }
    // No two runs of one job at once over the whole test, by the runs'
    // own start and end records (which every run that succeeded wrote).
    let unrecorded = succeeded_without_end_line(dir, &daemons);
    assert!(
        unrecorded.is_empty(),
        "runs that succeeded wrote no end line (the overlap check would rest on \
         job_finished alone): {unrecorded:?}"
    );
    let all_overlaps = overlaps(&all, &run_ends(dir, &daemons), now_ns(), 0);
    assert!(
        all_overlaps.is_empty(),
        "runs of one job overlapped: {all_overlaps:#?}\n{context}"
    );
    // Both daemons took part and neither stopped.
    for d in &daemons {
        assert!(!d.log_ended(), "[{}] stopped: {}", d.node, d.summary());
    }
    let nodes: BTreeSet<&str> = all.iter().map(|r| r.node.as_str()).collect();
    eprintln!("{test}: runs by {nodes:?}");
    drop(daemons);
    drop(cluster);
}

#[test]
fn a_fleet_survives_a_switchover_and_a_crash_with_synchronous_mode_off() {
    fleet_survives_a_switchover_and_a_crash(
        "patroni::a_fleet_survives_a_switchover_and_a_crash_with_synchronous_mode_off",
        false,
    );
}

#[test]
fn a_fleet_survives_a_switchover_and_a_crash_with_synchronous_mode_on() {
    fleet_survives_a_switchover_and_a_crash(
        "patroni::a_fleet_survives_a_switchover_and_a_crash_with_synchronous_mode_on",
        true,
    );
}

/// The overlap check itself, on made-up runs: it finds a run that started
/// before an earlier one ended (also one that ended long after a third
/// started), one still running, and nothing in back-to-back runs.
#[test]
fn the_overlap_check_finds_two_runs_of_one_job_at_once() {
    let at = |s: i64| DateTime::from_timestamp(1_796_000_000 + s, 0).expect("a time");
    let run = |job: &str, s: i64, token: i64| Run {
        job: job.to_string(),
        scheduled_at: at(s),
        token,
        node: "n".into(),
        started_ns: s * 1_000_000_000,
    };
    let ends = |list: &[(&str, i64, i64)]| -> BTreeMap<(String, i64), i64> {
        list.iter()
            .map(|(job, token, s)| ((job.to_string(), *token), s * 1_000_000_000))
            .collect()
    };
    let now = 100 * 1_000_000_000;
    // Back to back (one ends as the next starts), and another job alongside.
    let runs = [run("a", 0, 1), run("a", 10, 2), run("b", 5, 1)];
    let e = ends(&[("a", 1, 10), ("a", 2, 15), ("b", 1, 20)]);
    assert!(overlaps(&runs, &e, now, 0).is_empty());
    // The second run starts before the first ended.
    let e = ends(&[("a", 1, 11), ("a", 2, 15), ("b", 1, 20)]);
    let found = overlaps(&runs, &e, now, 0);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("token 2") && found[0].contains("token 1"),
        "{found:?}"
    );
    // Only pairs whose later run started after `since`.
    assert!(overlaps(&runs, &e, now, 10 * 1_000_000_000).is_empty());
    // A long first run overlaps a third run too, not only the second.
    let runs3 = [run("a", 0, 1), run("a", 10, 2), run("a", 20, 3)];
    let e = ends(&[("a", 1, 25), ("a", 2, 15), ("a", 3, 30)]);
    assert_eq!(overlaps(&runs3, &e, now, 0).len(), 2);
    // A run that never ended (no end line, no job_finished) is running.
    let e = ends(&[("a", 2, 15), ("a", 3, 30)]);
    let found = overlaps(&runs3, &e, now, 0);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].contains("has not ended"), "{found:?}");
}

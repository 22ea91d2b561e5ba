//! The instant's assignment with several whole daemons in-process on one
//! store (tokio's paused clock, `MemoryStore`): who asks the store for
//! which occurrence, once the live nodes are steady, and the fall-backs to
//! full competition (a node that just started, a node that joins, config
//! drift); a primary that is dead but still listed costs no occurrence.
//! The store notes every claim with the node that made it
//! (`MemoryStore::claims`).

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::daemon::assign::{Assignment, BATCH};
use crate::daemon::heartbeat::JobSet;
use crate::store::{NodeBeat, RunQuery};
use crate::testing::store::ClaimSeen;

/// When a backup claims, in ms after the instant.
const SECOND_ROUND_AFTER_MS: u64 = crate::daemon::claim::SECOND_ROUND_AFTER.as_millis() as u64;

/// `n` jobs named `j0`… firing every second; each run takes 100 ms.
fn every_second(rig: &Rig, n: usize) -> Vec<Job> {
    (0..n)
        .map(|i| job_on(rig, &format!("j{i:02}"), "* * * * * *"))
        .collect()
}

/// The rig with jobs that run for 100 ms.
fn quick_rig() -> Rig {
    Rig::with(
        Script {
            runs_for: Some(ms(100)),
            ..Script::default()
        },
        |s| s,
    )
}

/// A whole daemon `node` with `jobs` on the rig's store and launcher.
fn start_node(
    rig: &Rig,
    node: &str,
    jobs: Vec<Job>,
) -> (
    tokio::sync::mpsc::Sender<crate::daemon::Control>,
    tokio::task::JoinHandle<()>,
) {
    let settings = crate::daemon::Settings {
        node: crate::domain::NodeId::parse(node).unwrap(),
        max_running: None,
        jobs: jobs.into_iter().map(Arc::new).collect(),
        store: Arc::new(rig.store.clone()),
        child_env: Default::default(),
        records: None,
        store_display: "memory".into(),
        store_scope: "fleet",
        config_display: "none".into(),
        watchdog: None,
        history: Default::default(),
        shutdown_grace: Duration::ZERO,
        metrics: false,
    };
    let supervisor = Supervisor::with_launcher(
        Arc::new(rig.store.clone()),
        node.to_string(),
        rig.launcher.clone(),
    );
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let daemon = tokio::spawn(crate::daemon::serve(
        settings,
        rx,
        supervisor,
        rig.shared.clock,
    ));
    (tx, daemon)
}

/// Stops every daemon and waits for each.
async fn stop_all(
    rig: &Rig,
    nodes: Vec<(
        tokio::sync::mpsc::Sender<crate::daemon::Control>,
        tokio::task::JoinHandle<()>,
    )>,
) {
    for (tx, _) in &nodes {
        tx.send(crate::daemon::Control::Stop("test")).await.unwrap();
    }
    for (_, daemon) in nodes {
        stopped(rig, daemon).await;
    }
}

/// A node that beats like a daemon with `jobs` (same digest, same
/// version) but never claims anything: a primary that hangs, or died
/// within the last seconds, as the other nodes' beats show it.
fn dead_but_listed(rig: &Rig, node: &'static str, jobs: &[Job]) -> tokio::task::JoinHandle<()> {
    let store = rig.store.clone();
    let digest = JobSet::of(jobs).digest.clone();
    tokio::spawn(async move {
        // On the daemons' phase: at once, then 2.5 s past every 5 s.
        let mut wait = ms(2_500);
        loop {
            let beat = NodeBeat {
                node,
                hostname: "h",
                pid: 1,
                version: env!("CARGO_PKG_VERSION"),
                config_digest: &digest,
                started_at: None,
                state: crate::domain::NodeState::Running,
                running: 0,
            };
            store.beat(&beat).await.unwrap();
            tokio::time::sleep(wait).await;
            wait = ms(5_000);
        }
    })
}

/// The claims of the whole second `s` after the rig's start (the instant
/// `s`: its first claims at +0, the second round or the backups' at
/// +200 ms).
fn claims_of(rig: &Rig, s: u64) -> Vec<ClaimSeen> {
    rig.store
        .claims()
        .into_iter()
        .filter(|c| (c.at - rig.t0).as_secs() == s)
        .collect()
}

/// Runs per (job, scheduled second after the start), from the store's run
/// history.
async fn runs_per_instant(rig: &Rig) -> BTreeMap<(String, i64), usize> {
    let runs = rig
        .store
        .runs(&RunQuery {
            limit: 1_000_000,
            ..Default::default()
        })
        .await
        .unwrap();
    let t0 = at().0;
    let mut out = BTreeMap::new();
    for r in runs {
        let s = (r.scheduled_at.expect("scheduled").0 - t0) / 1_000;
        *out.entry((r.job, s)).or_default() += 1;
    }
    out
}

/// Every job of `jobs` ran exactly once at each instant of `seconds`.
async fn each_ran_once(rig: &Rig, jobs: &[Job], seconds: std::ops::RangeInclusive<i64>) {
    let runs = runs_per_instant(rig).await;
    for s in seconds {
        for j in jobs {
            let n = runs.get(&(j.name.to_string(), s)).copied().unwrap_or(0);
            assert_eq!(n, 1, "{} at {s} s ran {n} times", j.name);
        }
    }
}

/// What the assignment of second `s` expects: per (node, offset in ms),
/// the resources it claims; nodes sorted as the daemons sort them.
fn expected(nodes: &[&str], jobs: &[Job], s: u64) -> BTreeMap<(String, u64), BTreeSet<String>> {
    let instant = at().0 / 1_000 + s as i64;
    let a = Assignment::of(nodes.len(), instant, jobs.len());
    let mut out: BTreeMap<(String, u64), BTreeSet<String>> = BTreeMap::new();
    for j in jobs {
        let (p, b) = a.of_job(j.name.as_str());
        out.entry((nodes[p].to_string(), 0))
            .or_default()
            .insert(j.resource.to_string());
        if let Some(b) = b {
            out.entry((nodes[b].to_string(), SECOND_ROUND_AFTER_MS))
                .or_default()
                .insert(j.resource.to_string());
        }
    }
    out
}

/// What second `s`'s claims were: per (node, offset in ms), the resources;
/// and whether any was bounded by the node's share (full competition).
fn seen(rig: &Rig, s: u64) -> (BTreeMap<(String, u64), BTreeSet<String>>, bool) {
    let claims = claims_of(rig, s);
    let share = claims.iter().any(|c| c.share);
    let mut out: BTreeMap<(String, u64), BTreeSet<String>> = BTreeMap::new();
    for c in claims {
        let offset = (c.at - rig.t0).as_millis() as u64 % 1_000;
        let set = out.entry((c.node, offset)).or_default();
        for r in c.resources {
            assert!(set.insert(r), "a resource asked twice in one claim");
        }
    }
    (out, share)
}

/// Five daemons, twenty jobs every second: once the live nodes are
/// steady, each instant's occurrences are claimed by exactly the claimers
/// the assignment names (ceil(20 / 16) = 2 chunks: two primary claims at
/// the instant and two backup claims 200 ms later, four statements for
/// twenty occurrences), each asking for its chunk only; a node that is
/// neither primary nor backup of an occurrence never asks about it (this
/// test fails if it does: the claims must equal the assignment). Before
/// that, while the nodes have not yet seen each other for three beats,
/// every node claims everything (full competition). Every occurrence runs
/// exactly once throughout.
#[tokio::test(start_paused = true)]
async fn only_the_assigned_claimers_ask_once_the_nodes_are_steady() {
    let rig = quick_rig();
    let jobs = every_second(&rig, 20);
    assert_eq!(jobs.len().div_ceil(BATCH), 2);
    let names = ["node-a", "node-b", "node-c", "node-d", "node-e"];
    let nodes: Vec<_> = names
        .iter()
        .map(|n| start_node(&rig, n, jobs.clone()))
        .collect();
    tokio::time::sleep(ms(40_500)).await;
    // Fresh nodes: every node claims everything, bounded by its share.
    for s in 1..=7 {
        let claims = claims_of(&rig, s);
        let first: BTreeSet<_> = claims
            .iter()
            .filter(|c| c.share)
            .map(|c| c.node.as_str())
            .collect();
        assert_eq!(first.len(), names.len(), "second {s}: {claims:?}");
        assert!(claims
            .iter()
            .filter(|c| c.share)
            .all(|c| c.resources.len() == 20));
    }
    // Steady (three beats: 0, 2.5 and 7.5 s; every node's view holds from
    // its 12.5 s beat at the latest).
    for s in 13..=40 {
        let (got, share) = seen(&rig, s);
        assert!(!share, "second {s}: no full competition");
        assert_eq!(got, expected(&names, &jobs, s), "second {s}");
    }
    stop_all(&rig, nodes).await;
    each_ran_once(&rig, &jobs, 1..=40).await;
}

/// A primary that is live in every node's list but claims nothing (hung,
/// or died since the last beat): its chunk of each instant is won by the
/// chunk's backup 200 ms after the instant; no occurrence is missed, and
/// nobody else asks.
#[tokio::test(start_paused = true)]
async fn a_dead_primarys_chunk_is_run_by_its_backup() {
    let rig = quick_rig();
    let jobs = every_second(&rig, 20);
    let names = ["node-a", "node-b", "node-c", "node-d", "node-x"];
    let dead = dead_but_listed(&rig, "node-x", &jobs);
    let nodes: Vec<_> = names[..4]
        .iter()
        .map(|n| start_node(&rig, n, jobs.clone()))
        .collect();
    tokio::time::sleep(ms(40_500)).await;
    let mut late = 0;
    for s in 13..=40 {
        let (got, share) = seen(&rig, s);
        assert!(!share, "second {s}");
        let mut want = expected(&names, &jobs, s);
        want.retain(|(node, _), _| node != "node-x");
        assert_eq!(got, want, "second {s}");
        if expected(&names, &jobs, s).contains_key(&("node-x".to_string(), 0)) {
            late += 1;
        }
    }
    assert!(late >= 5, "node-x was a primary at {late} instants");
    let backups: usize = rig
        .launcher
        .started()
        .iter()
        .filter(|j| {
            let t = j.started() - rig.t0;
            t >= ms(13_000) && t.as_millis() % 1_000 == u128::from(SECOND_ROUND_AFTER_MS)
        })
        .count();
    assert!(backups >= late, "{backups} runs started by a backup");
    stop_all(&rig, nodes).await;
    dead.abort();
    each_ran_once(&rig, &jobs, 1..=40).await;
}

/// A node that joins a steady fleet: from the beat at which each node
/// sees it, each competes for everything (its list changed), until three
/// beats in a row agree; then the assignment, now over four nodes. The
/// joining node itself competes until it has seen three equal beats. No
/// occurrence is missed on the way.
#[tokio::test(start_paused = true)]
async fn a_joining_node_makes_every_node_compete_until_the_beats_agree() {
    let rig = quick_rig();
    let jobs = every_second(&rig, 20);
    let mut nodes: Vec<_> = ["node-a", "node-b", "node-c", "node-d", "node-e"]
        .iter()
        .map(|n| start_node(&rig, n, jobs.clone()))
        .collect();
    tokio::time::sleep(ms(20_100)).await;
    for s in 13..=20 {
        assert!(!seen(&rig, s).1, "second {s}: steady");
    }
    nodes.push(start_node(&rig, "node-f", jobs.clone()));
    tokio::time::sleep(ms(40_000)).await;
    // node-f's first beat at 20.1 s sees the five others: it competes
    // until its beats of 22.5 and 27.5 s agree with it. The others see it
    // at their 22.5 s beat and compete from the instant 23 s until their
    // new list has held for three beats (22.5, 27.5, 32.5 s).
    for s in 21..=32 {
        let claims = claims_of(&rig, s);
        let competing: BTreeSet<_> = claims
            .iter()
            .filter(|c| c.share)
            .map(|c| c.node.as_str())
            .collect();
        let five = ["node-a", "node-b", "node-c", "node-d", "node-e"];
        let want: Vec<&str> = match s {
            21..=22 => vec!["node-f"],
            23..=27 => five.into_iter().chain(["node-f"]).collect(),
            _ => five.to_vec(),
        };
        assert_eq!(
            competing,
            want.iter().copied().collect(),
            "second {s}: {claims:?}"
        );
    }
    let names = ["node-a", "node-b", "node-c", "node-d", "node-e", "node-f"];
    for s in 38..=59 {
        let (got, share) = seen(&rig, s);
        assert!(!share, "second {s}");
        assert_eq!(got, expected(&names, &jobs, s), "second {s}");
    }
    stop_all(&rig, nodes).await;
    each_ran_once(&rig, &jobs, 1..=59).await;
}

/// Config drift: one node has a job the others lack. Its digest differs,
/// so no node trusts the assignment (the chunks depend on the jobs): every
/// node claims everything it has, all the time, and every job, the extra
/// one included, runs once per instant.
#[tokio::test(start_paused = true)]
async fn config_drift_keeps_every_node_competing() {
    let rig = quick_rig();
    let jobs = every_second(&rig, 20);
    let mut more = jobs.clone();
    more.push(job_on(&rig, "extra", "* * * * * *"));
    let mut nodes: Vec<_> = ["node-a", "node-b", "node-c", "node-d"]
        .iter()
        .map(|n| start_node(&rig, n, jobs.clone()))
        .collect();
    nodes.push(start_node(&rig, "node-e", more.clone()));
    tokio::time::sleep(ms(30_500)).await;
    for s in 1..=30 {
        let claims = claims_of(&rig, s);
        let first: BTreeSet<_> = claims
            .iter()
            .filter(|c| c.share)
            .map(|c| c.node.as_str())
            .collect();
        assert_eq!(first.len(), 5, "second {s}: {claims:?}");
    }
    stop_all(&rig, nodes).await;
    each_ran_once(&rig, &more, 1..=30).await;
}

/// A reload on one node of a steady fleet: it competes for everything at
/// once (the others may still split the instants by the old jobs), the
/// others from the beat at which they see its new digest (drift), and the
/// new job runs from its first instant.
#[tokio::test(start_paused = true)]
async fn a_reload_competes_at_once() {
    let rig = quick_rig();
    let jobs = every_second(&rig, 20);
    let nodes: Vec<_> = ["node-a", "node-b", "node-c", "node-d", "node-e"]
        .iter()
        .map(|n| start_node(&rig, n, jobs.clone()))
        .collect();
    tokio::time::sleep(ms(20_100)).await;
    for s in 13..=20 {
        assert!(!seen(&rig, s).1, "second {s}: steady");
    }
    let mut more = jobs.clone();
    more.push(job_on(&rig, "extra", "* * * * * *"));
    nodes[0]
        .0
        .send(crate::daemon::Control::Reload(Ok(more
            .iter()
            .cloned()
            .map(Arc::new)
            .collect())))
        .await
        .unwrap();
    tokio::time::sleep(ms(5_000)).await;
    for s in 21..=25 {
        let claims = claims_of(&rig, s);
        assert!(
            claims.iter().any(|c| c.node == "node-a" && c.share),
            "second {s}: {claims:?}"
        );
    }
    // The reloaded set, as the scheduler installed it, is what node-a
    // publishes and beats with.
    let published = rig.store.published_jobs("node-a", false).await.unwrap();
    assert_eq!(published.len(), 21);
    assert!(published.iter().any(|p| p.job == "extra"));
    let row = rig.store.nodes().await.unwrap();
    let a = row.iter().find(|n| n.node == "node-a").unwrap();
    assert_eq!(a.config_digest, JobSet::of(&more).digest);
    stop_all(&rig, nodes).await;
    each_ran_once(&rig, &jobs, 1..=25).await;
    each_ran_once(&rig, &more[20..], 21..=25).await;
}

/// Trigger polls follow the same view: while the nodes are steady only two
/// of them read the pending triggers every 2 s (instead of all five), and
/// a trigger is still claimed once and run within a poll period; before
/// the nodes are steady, every node polls.
#[tokio::test(start_paused = true)]
async fn only_two_nodes_poll_the_triggers_once_the_nodes_are_steady() {
    let rig = quick_rig();
    let mut jobs = every_second(&rig, 20);
    jobs.push(job_on(&rig, "rare", "0 0 0 1 1 *"));
    let nodes: Vec<_> = ["node-a", "node-b", "node-c", "node-d", "node-e"]
        .iter()
        .map(|n| start_node(&rig, n, jobs.clone()))
        .collect();
    tokio::time::sleep(ms(30_100)).await;
    let polls = |from: u64, to: u64| {
        rig.store
            .entries(Op::Fleet)
            .iter()
            .filter(|e| e.what == "pending_triggers")
            .filter(|e| (ms(from)..ms(to)).contains(&(e.at - rig.t0)))
            .count()
    };
    // Polls at 2, 4, 6, 8 s: not steady yet, all five nodes poll.
    assert_eq!(polls(1_000, 9_000), 4 * 5);
    // Polls at 14, 16, …, 30 s: steady, two per period.
    assert_eq!(polls(13_000, 30_100), 9 * 2);
    rig.store
        .request_trigger(&TriggerInfo {
            id: "t1".into(),
            job: "rare".into(),
            requested_at: at(),
            requested_by: "ops@host".into(),
            state: TriggerState::Pending,
            node: None,
            token: None,
            detail: None,
        })
        .await
        .unwrap();
    tokio::time::sleep(ms(2_000)).await;
    let t = rig.store.trigger("t1").await.unwrap().unwrap();
    assert!(
        matches!(t.state, TriggerState::Started | TriggerState::Ended),
        "{t:?}"
    );
    assert_eq!(t.token, Some(Token::new(1)), "{t:?}");
    stop_all(&rig, nodes).await;
    let manual = rig
        .store
        .runs(&RunQuery {
            limit: 1_000_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.trigger == "manual")
        .count();
    assert_eq!(manual, 1);
}

/// A fleet too small for the split to pay (three nodes, twenty jobs: two
/// chunks would cost four claims, every node claiming costs three) keeps
/// full competition once steady too.
#[tokio::test(start_paused = true)]
async fn a_small_fleet_keeps_competing_where_the_split_would_cost_more() {
    let rig = quick_rig();
    let jobs = every_second(&rig, 20);
    let nodes: Vec<_> = ["node-a", "node-b", "node-c"]
        .iter()
        .map(|n| start_node(&rig, n, jobs.clone()))
        .collect();
    tokio::time::sleep(ms(30_500)).await;
    for s in 13..=30 {
        let claims = claims_of(&rig, s);
        let first: BTreeSet<_> = claims
            .iter()
            .filter(|c| c.share)
            .map(|c| c.node.as_str())
            .collect();
        assert_eq!(first.len(), 3, "second {s}: {claims:?}");
    }
    stop_all(&rig, nodes).await;
    each_ran_once(&rig, &jobs, 1..=30).await;
}

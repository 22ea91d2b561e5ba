//! The node's row in the store's registry (`fencecron_nodes`): registered
//! when the store first answers, refreshed every [`HEARTBEAT`] with the
//! store's clock, marked `draining` as soon as a stop starts and `stopped`
//! once every run of this process ended, so `fencecron nodes` shows a node
//! killed with -9 as `gone` after at most [`NODE_LIVE`] and one that exited
//! cleanly at once.
//!
//! The job definitions are published (`fencecron_node_jobs`) when the job
//! set changes (start, reload), not on every beat; the row carries a
//! digest of the whole set, so each beat's drift check reads only the live
//! node rows, which the beat itself answers (one statement per beat on
//! PostgreSQL and MySQL), and reads a node's per-job digests only while the
//! live nodes' set digests differ, and only again when that node's set
//! digest changed.
//! A drift is logged (`config_drift`) when it appears or changes, and
//! `config_drift_resolved` when it ends.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::assign::{Me, Stability, Views};
use super::occurrence::Running;
use crate::clock::Clock;
use crate::domain::NodeState;
use crate::events;
use crate::fleet::{self, Drift};
use crate::store::{
    millis, BeatAnswer, NodeBeat, NodeInfo, PublishedJob, Store, StoreTime, HEARTBEAT,
};

/// How long the exit waits for the beat that marks the node stopped.
const LAST_BEAT: Duration = Duration::from_secs(2);

/// How often node rows older than `history.nodes` are deleted.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Every how many beats the gone nodes are counted again from every node
/// row (one more statement then): every 30 s.
const ALL_ROWS_EVERY: u32 = 6;

/// A job set as published: each job's name and digest, by name, and the
/// set's digest; and each job's canonical definition, kept only until this
/// node has published them (or found them published): at 10,000 jobs the
/// definitions are about 3 MB a daemon would otherwise hold for nothing.
#[derive(Debug, Default)]
pub(super) struct JobSet {
    pub jobs: Vec<(String, String)>,
    pub digest: String,
    /// The canonical JSON of each of `jobs`, end to end in one buffer (so
    /// that, once dropped, its memory goes back to the system whole), with
    /// where each ends; empty once published.
    definitions: std::sync::Mutex<(String, Vec<usize>)>,
}

impl JobSet {
    pub(super) fn of<J: std::borrow::Borrow<crate::config::Job>>(jobs: &[J]) -> Arc<JobSet> {
        let mut by_name: Vec<&crate::config::Job> = jobs.iter().map(|j| j.borrow()).collect();
        by_name.sort_by(|a, b| a.name.as_str().cmp(b.name.as_str()));
        let mut text = String::new();
        let mut ends = Vec::with_capacity(jobs.len());
        let mut set = Vec::with_capacity(jobs.len());
        for job in by_name {
            let def = fleet::JobDef::of(job);
            let json = def.canonical();
            set.push((def.name, fleet::digest_of(&json)));
            text.push_str(&json);
            ends.push(text.len());
        }
        let digest = fleet::config_digest(set.iter().map(|(n, d)| (n.as_str(), d.as_str())));
        Arc::new(JobSet {
            jobs: set,
            digest,
            definitions: std::sync::Mutex::new((text, ends)),
        })
    }

    /// The definitions' buffer and ends, taken out of the set (empty when
    /// taken already).
    fn take_definitions(&self) -> (String, Vec<usize>) {
        std::mem::take(&mut *self.definitions.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Puts back definitions a failed publish took.
    fn restore_definitions(&self, taken: (String, Vec<usize>)) {
        *self.definitions.lock().unwrap_or_else(|e| e.into_inner()) = taken;
    }

    /// Whether the set still holds its definitions.
    #[cfg(test)]
    fn holds_definitions(&self) -> bool {
        !self.definitions.lock().unwrap().1.is_empty()
    }

    /// Drops the definitions: this node's row holds them.
    fn published(&self) {
        *self.definitions.lock().unwrap_or_else(|e| e.into_inner()) = Default::default();
        crate::config::release_freed_memory();
    }
}

/// What the heartbeat needs.
pub(super) struct Heartbeat {
    pub store: Arc<dyn Store>,
    pub node: String,
    pub jobs: watch::Receiver<Arc<JobSet>>,
    pub running: Running,
    /// Set once migrations are applied: no beat before.
    pub ready: Arc<tokio::sync::OnceCell<()>>,
    /// Cancelled when a stop starts: the node says `draining`.
    pub draining: CancellationToken,
    /// Cancelled once every task of the daemon ended: the last beat says
    /// `stopped`.
    pub stopped: CancellationToken,
    /// `history.nodes`: node rows not seen for this long are deleted.
    pub retention: Duration,
    /// Wall time, for the beats' phase ([`until_next_beat`]).
    pub clock: Clock,
    /// Whether `/metrics` is served (`[http]`): only then does each beat
    /// also read the pauses (`fencecron_job_paused`), and every
    /// [`ALL_ROWS_EVERY`]th beat every node row (`fencecron_nodes`).
    pub metrics: bool,
    /// Where each beat leaves the live nodes for the claims
    /// ([`super::assign`]).
    pub views: Views,
}

/// Where in each [`HEARTBEAT`] period of the wall clock a beat falls: 2.5 s
/// past every multiple of 5 s, half-way between the whole seconds where
/// instants fall and as far as can be from the 5- and 10-second marks most
/// schedules use. A beat is one small call; at the instant itself it would
/// take one of the node's connections (`store.max_connections`) from the
/// claim, and on a store that hangs it would hold that connection for the
/// call's whole time limit.
const BEAT_PHASE_MS: i64 = 2_500;

/// How long from `now` until the next beat's point of the wall clock.
fn until_next_beat(now: chrono::DateTime<chrono::Utc>) -> std::time::Duration {
    let period = i64::try_from(HEARTBEAT.as_millis()).unwrap_or(5_000);
    let into = now.timestamp_millis().rem_euclid(period);
    let wait = (BEAT_PHASE_MS - into).rem_euclid(period);
    let wait = if wait == 0 { period } else { wait };
    std::time::Duration::from_millis(u64::try_from(wait).unwrap_or(0))
}

/// The beat's own state between beats.
#[derive(Default)]
struct Beats {
    started_at: Option<StoreTime>,
    /// The set digest whose definitions are in the store.
    published: Option<String>,
    /// Per-job digests read from other nodes, with the set digest they
    /// belong to.
    seen: HashMap<String, (String, Vec<PublishedJob>)>,
    /// The drift logged last.
    drift: DriftLog,
    last_prune: Option<tokio::time::Instant>,
    /// Beats since every node row was last read, and how many of those
    /// rows were gone then (`fencecron_nodes{state="gone"}`).
    beats_since_rows: u32,
    gone: usize,
    /// The live nodes of the last beats, for the claims' assignment.
    stability: Stability,
}

impl Heartbeat {
    /// Beats until `stopped`, then marks the node stopped.
    pub(super) async fn run(mut self) {
        let mut b = Beats::default();
        // The first beat at once (the node registers), then on the phase.
        let mut next = tokio::time::Instant::now();
        let mut draining_seen = false;
        loop {
            tokio::select! {
                _ = self.stopped.cancelled() => break,
                _ = tokio::time::sleep_until(next) => {}
                _ = self.draining.cancelled(), if !draining_seen => draining_seen = true,
                changed = self.jobs.changed() => {
                    if changed.is_err() {
                        // The sender went with the daemon: wait for the stop.
                        self.stopped.cancelled().await;
                        break;
                    }
                }
            }
            // A beat waiting on a store that does not answer must not hold
            // up the daemon's exit; but one that is merely in flight when
            // the daemon stops (the `draining` beat of a drain that ended at
            // once) lands first, within LAST_BEAT: dropped, its statement
            // could still commit after the last beat's `stopped` (SQLite's
            // calls run on a worker thread) and overwrite it.
            let stopping = {
                let beat = self.beat(&mut b);
                tokio::pin!(beat);
                tokio::select! {
                    _ = &mut beat => false,
                    _ = self.stopped.cancelled() => {
                        let _ = tokio::time::timeout(LAST_BEAT, &mut beat).await;
                        true
                    }
                }
            };
            if stopping {
                break;
            }
            next = tokio::time::Instant::now() + until_next_beat(self.clock.now());
        }
        if b.started_at.is_some() {
            let set = self.jobs.borrow().clone();
            let row = self.row(&b, &set, NodeState::Stopped);
            match tokio::time::timeout(LAST_BEAT, self.store.beat(&row)).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => events::store_unavailable(
                    self.store.outages(),
                    "beat",
                    None,
                    &e.to_string(),
                    None,
                ),
                // Unmarked, the node shows `gone` once NODE_LIVE passed.
                Err(_) => {
                    events::store_unavailable(self.store.outages(), "beat", None, "timed out", None)
                }
            }
        }
    }

    fn row<'a>(&'a self, b: &Beats, set: &'a JobSet, state: NodeState) -> NodeBeat<'a> {
        NodeBeat {
            node: &self.node,
            hostname: hostname(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION"),
            config_digest: &set.digest,
            started_at: b.started_at,
            state,
            running: u32::try_from(self.running.len()).unwrap_or(u32::MAX),
        }
    }

    /// Publishes the job set if it changed, beats, looks for drift and
    /// prunes now and then. A failing store is logged and tried again at
    /// the next beat.
    async fn beat(&self, b: &mut Beats) {
        if super::ensure_ready(&self.ready, self.store.as_ref())
            .await
            .is_err()
        {
            // `await_store` logs it and retries.
            b.stability.failed(&self.views);
            return;
        }
        let set = self.jobs.borrow().clone();
        if let Err(e) = self.publish(b, &set).await {
            b.stability.failed(&self.views);
            events::store_unavailable(
                self.store.outages(),
                "publish_jobs",
                None,
                &e.to_string(),
                None,
            );
            return;
        }
        let state = if self.draining.is_cancelled() {
            NodeState::Draining
        } else {
            NodeState::Running
        };
        let answer = match self.store.beat(&self.row(b, &set, state)).await {
            Ok(answer) => {
                // The store answers: every outage this daemon is in ends.
                events::store_answered_all(self.store.outages());
                answer
            }
            Err(e) => {
                b.stability.failed(&self.views);
                events::store_unavailable(self.store.outages(), "beat", None, &e.to_string(), None);
                return;
            }
        };
        let me = Me {
            node: &self.node,
            digest: &set.digest,
            version: env!("CARGO_PKG_VERSION"),
        };
        b.stability.beat(&self.views, &me, &answer);
        let now = answer.now;
        b.started_at.get_or_insert(now);
        if let Err(e) = self.check_drift(b, &answer).await {
            events::store_unavailable(self.store.outages(), "nodes", None, &e.to_string(), None);
        }
        // `fencecron_job_paused`: the pauses in force, whoever set or
        // ended them (the CLI, another node's web view).
        if self.metrics {
            match self.store.pauses(now).await {
                Ok(pauses) => {
                    for (job, _) in &set.jobs {
                        crate::metrics::paused(job, pauses.iter().any(|p| p.job == *job));
                    }
                }
                Err(e) => events::store_unavailable(
                    self.store.outages(),
                    "pauses",
                    None,
                    &e.to_string(),
                    None,
                ),
            }
        }
        if b.last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
            b.last_prune = Some(tokio::time::Instant::now());
            let before = StoreTime(now.0 - millis(self.retention));
            if let Err(e) = self.store.prune_nodes(before).await {
                events::store_unavailable(
                    self.store.outages(),
                    "prune_nodes",
                    None,
                    &e.to_string(),
                    None,
                );
            }
        }
    }

    /// Writes the definitions when the set differs from what this node
    /// published last (at start: from what its row in the store says, so a
    /// restart with the same config writes nothing).
    async fn publish(&self, b: &mut Beats, set: &JobSet) -> Result<(), crate::store::StoreError> {
        if b.published.as_deref() == Some(set.digest.as_str()) {
            return Ok(());
        }
        if b.published.is_none() {
            let stored = self.store.nodes().await?;
            if stored
                .iter()
                .any(|n| n.node == self.node && n.config_digest == set.digest)
            {
                b.published = Some(set.digest.clone());
                set.published();
                return Ok(());
            }
        }
        // Each set is published once: a reload makes a new set, with its
        // definitions.
        let (text, ends) = set.take_definitions();
        if ends.len() != set.jobs.len() {
            return Ok(());
        }
        let starts = std::iter::once(0).chain(ends.iter().copied());
        let defs: Vec<crate::store::Definition<'_>> = set
            .jobs
            .iter()
            .zip(starts.zip(ends.iter().copied()))
            .map(|((name, digest), (from, to))| (name.as_str(), digest.as_str(), &text[from..to]))
            .collect();
        let written = self.store.publish_jobs(&self.node, &defs).await;
        drop(defs);
        if let Err(e) = written {
            set.restore_definitions((text, ends));
            return Err(e);
        }
        drop((text, ends));
        set.published();
        b.published = Some(set.digest.clone());
        Ok(())
    }

    /// The drift among the live nodes the beat answered: no statement
    /// unless their set digests differ.
    async fn check_drift(
        &self,
        b: &mut Beats,
        beat: &BeatAnswer,
    ) -> Result<(), crate::store::StoreError> {
        if self.metrics && b.beats_since_rows % ALL_ROWS_EVERY == 0 {
            // The gone nodes are not in the beat's answer (it holds the
            // live ones): every node row, now and then.
            let now = beat.now;
            let nodes = self.store.nodes().await?;
            b.gone = nodes.iter().filter(|n| !n.live(now)).count();
        }
        b.beats_since_rows = b.beats_since_rows.wrapping_add(1);
        if self.metrics {
            crate::metrics::nodes(
                beat.live
                    .iter()
                    .map(|n| n.shown_state(beat.now))
                    .chain(std::iter::repeat_n(NodeState::GONE, b.gone)),
            );
        }
        let drift = current_drift(self.store.as_ref(), &beat.live, beat.now, &mut b.seen).await?;
        let count = drift.len();
        crate::web::drift_seen(&drift);
        let (changed, resolved) = b.drift.update(drift);
        for d in &changed {
            events::config_drift(d, count);
        }
        for job in &resolved {
            events::config_drift_resolved(job, count);
        }
        Ok(())
    }
}

/// The drift last logged, by job: a drift is logged when it appears or
/// changes (other digests, other nodes on a side), not on every beat.
#[derive(Debug, Default)]
pub(super) struct DriftLog(BTreeMap<String, Drift>);

impl DriftLog {
    /// Remembers `now`; answers the drifts that are new or changed since
    /// the last call, and the jobs whose drift ended.
    pub(super) fn update(&mut self, now: BTreeMap<String, Drift>) -> (Vec<Drift>, Vec<String>) {
        let changed = now
            .iter()
            .filter(|(job, d)| self.0.get(*job) != Some(*d))
            .map(|(_, d)| d.clone())
            .collect();
        let resolved = self
            .0
            .keys()
            .filter(|j| !now.contains_key(*j))
            .cloned()
            .collect();
        self.0 = now;
        (changed, resolved)
    }
}

/// The drift among the live nodes of `nodes`, reading the per-job digests
/// of a node only when the live nodes' set digests differ and `cache` does
/// not hold that node's current set.
pub async fn current_drift(
    store: &dyn Store,
    nodes: &[NodeInfo],
    now: StoreTime,
    cache: &mut HashMap<String, (String, Vec<PublishedJob>)>,
) -> Result<BTreeMap<String, Drift>, crate::store::StoreError> {
    let live = fleet::drift_nodes(nodes, now);
    if !fleet::may_drift(&live) {
        return Ok(BTreeMap::new());
    }
    let mut jobs = Vec::new();
    for n in &live {
        let fresh = cache
            .get(&n.node)
            .is_some_and(|(digest, _)| *digest == n.config_digest);
        if !fresh {
            let published = store.published_jobs(&n.node, false).await?;
            cache.insert(n.node.clone(), (n.config_digest.clone(), published));
        }
        jobs.extend(cache[&n.node].1.iter().cloned());
    }
    cache.retain(|node, _| live.iter().any(|n| n.node == *node));
    let names: Vec<&str> = live.iter().map(|n| n.node.as_str()).collect();
    Ok(fleet::drift(&names, &jobs))
}

/// This host's name, once.
fn hostname() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(crate::commands::hostname)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::Clock;
    use crate::domain::NodeState;
    use crate::store::prelude::*;

    #[test]
    fn beats_fall_half_way_between_the_five_second_marks() {
        use chrono::TimeZone;
        let at = |ms: i64| chrono::Utc.timestamp_millis_opt(ms).unwrap();
        assert_eq!(until_next_beat(at(1_800_000_000_000)), ms(2_500));
        assert_eq!(until_next_beat(at(1_800_000_002_499)), ms(1));
        assert_eq!(until_next_beat(at(1_800_000_002_500)), ms(5_000));
        assert_eq!(until_next_beat(at(1_800_000_004_999)), ms(2_501));
    }

    /// A wall clock on a beat's point, so beats fall every 5 s from the
    /// start, as the assertions count them.
    fn on_phase() -> Clock {
        use chrono::TimeZone;
        Clock::following_tokio(chrono::Utc.timestamp_millis_opt(1_800_000_002_500).unwrap())
    }
    use crate::testing::store::{Fault, MemoryStore, Op};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn job(name: &str) -> crate::config::Job {
        use crate::names::Name;
        crate::config::Job {
            name: Name::parse("job", name).unwrap(),
            schedule: crate::schedule::Schedule::parse("0 * * * * *", chrono_tz::UTC).unwrap(),
            command: vec!["true".into()],
            resource: Name::parse("resource", name).unwrap(),
            timeout: None,
            env: Default::default(),
            workdir: None,
            timing: crate::timing::LeaseTiming::new(ms(10_000), None, None).unwrap(),
            stale_exit_code: None,
            starting_deadline: None,
            retry: Default::default(),
            catchup: Default::default(),
            overlap: Default::default(),
            on_failure: None,
            place: Default::default(),
        }
    }

    fn drift(job: &str, without: &[&str]) -> (String, Drift) {
        (
            job.to_string(),
            Drift {
                job: job.to_string(),
                nodes_with: BTreeMap::from([("d".to_string(), vec!["a".to_string()])]),
                nodes_without: without.iter().map(|s| s.to_string()).collect(),
            },
        )
    }

    /// The heartbeat of node `node-a` on `store`, its beats on the phase.
    fn node_a(
        store: &MemoryStore,
        jobs: watch::Receiver<Arc<JobSet>>,
        draining: CancellationToken,
        stopped: CancellationToken,
        retention: Duration,
    ) -> Heartbeat {
        Heartbeat {
            store: Arc::new(store.clone()),
            node: "node-a".into(),
            jobs,
            running: Running::default(),
            ready: Default::default(),
            draining,
            stopped,
            clock: on_phase(),
            retention,
            metrics: true,
            views: Default::default(),
        }
    }

    async fn row(s: &MemoryStore, node: &str) -> NodeInfo {
        let nodes = s.nodes().await.unwrap();
        nodes.into_iter().find(|n| n.node == node).unwrap()
    }

    #[test]
    fn a_drift_is_logged_once_per_change() {
        let mut log = DriftLog::default();
        let (c, r) = log.update(BTreeMap::from([drift("x", &["b"])]));
        assert_eq!((c.len(), r.len()), (1, 0));
        // The same drift at the next beats: nothing to log.
        for _ in 0..3 {
            let (c, r) = log.update(BTreeMap::from([drift("x", &["b"])]));
            assert!(c.is_empty() && r.is_empty());
        }
        // Another node joins a side: logged again.
        let (c, _) = log.update(BTreeMap::from([drift("x", &["b", "c"])]));
        assert_eq!(c[0].nodes_without, ["b", "c"]);
        let (c, r) = log.update(BTreeMap::new());
        assert!(c.is_empty());
        assert_eq!(r, ["x"]);
    }

    /// A set's definitions are held until published, and only then: a
    /// publish that fails keeps them for the next beat, one that succeeds
    /// drops them, and so does finding them published at start.
    #[tokio::test(start_paused = true)]
    async fn definitions_are_held_until_published() {
        let store = MemoryStore::new(on_phase());
        let set = JobSet::of(&[job("alpha"), job("beta")]);
        let (_tx, rx) = watch::channel(set.clone());
        let hb = node_a(
            &store,
            rx,
            CancellationToken::new(),
            CancellationToken::new(),
            crate::store::NODE_RETENTION,
        );
        // A beat publishes the set and writes the node's row.
        hb.beat(&mut Beats::default()).await;
        assert!(!set.holds_definitions());
        let published = store.published_jobs("node-a", true).await.unwrap();
        let expected = fleet::published(&[job("alpha"), job("beta")]);
        assert_eq!(published.len(), 2);
        for (p, (name, digest, json)) in published.iter().zip(&expected) {
            assert_eq!((&p.job, &p.digest), (name, digest));
            assert_eq!(p.definition.as_deref(), Some(json.as_str()));
        }
        // A restart with the same set finds it in the node's row: nothing
        // written, nothing held.
        let again = JobSet::of(&[job("alpha"), job("beta")]);
        let mut b = Beats::default();
        hb.publish(&mut b, &again).await.unwrap();
        assert!(!again.holds_definitions());
        assert_eq!(b.published.as_deref(), Some(again.digest.as_str()));
        // Another set: a failed write keeps its definitions for the next
        // beat, which writes them.
        let other = JobSet::of(&[job("gamma")]);
        store.fault(Op::Nodes, Fault::Fail, 1);
        assert!(hb.publish(&mut b, &other).await.is_err());
        assert!(other.holds_definitions(), "kept for the next beat");
        hb.publish(&mut b, &other).await.unwrap();
        assert!(!other.holds_definitions());
        assert_eq!(b.published.as_deref(), Some(other.digest.as_str()));
        let published = store.published_jobs("node-a", true).await.unwrap();
        assert_eq!(published.len(), 1);
        assert_eq!(published[0].job, "gamma");
    }

    /// The node's row, on a paused clock: registered at once with the
    /// store's time, refreshed every 5 s, `draining` as soon as a stop
    /// starts, `stopped` (shown gone) at the end; its definitions published
    /// once, and again only when the job set changes.
    #[tokio::test(start_paused = true)]
    async fn the_node_registers_beats_drains_and_stops_in_the_store() {
        let clock = on_phase();
        let store = MemoryStore::new(clock);
        store.set_offset_ms(-7_000);
        let alpha = job("alpha");
        let (tx, rx) = watch::channel(JobSet::of(std::slice::from_ref(&alpha)));
        let (draining, stopped) = (CancellationToken::new(), CancellationToken::new());
        let beats = tokio::spawn(
            node_a(
                &store,
                rx,
                draining.clone(),
                stopped.clone(),
                crate::store::NODE_RETENTION,
            )
            .run(),
        );
        tokio::time::sleep(ms(1)).await;
        let first = row(&store, "node-a").await;
        let t0 = store.now().await.unwrap();
        assert_eq!(first.state, NodeState::Running);
        assert_eq!(first.pid, i64::from(std::process::id()));
        assert_eq!(first.started_at, first.last_seen);
        assert!(t0.0 - first.last_seen.0 <= 1, "the store's clock");
        assert_eq!(first.config_digest, tx.borrow().digest);
        assert_eq!(
            store.published_jobs("node-a", false).await.unwrap().len(),
            1
        );
        assert!(first.live(t0));

        tokio::time::sleep(ms(5_000)).await;
        let second = row(&store, "node-a").await;
        assert_eq!(second.last_seen.0 - first.last_seen.0, 5_000);
        assert_eq!(second.started_at, first.started_at);

        // A reload with another job set publishes it with the beat.
        tx.send_replace(JobSet::of(&[alpha.clone(), job("beta")]));
        tokio::time::sleep(ms(1)).await;
        assert_eq!(
            store.published_jobs("node-a", false).await.unwrap().len(),
            2
        );
        assert_eq!(
            row(&store, "node-a").await.config_digest,
            tx.borrow().digest
        );

        draining.cancel();
        tokio::time::sleep(ms(1)).await;
        assert_eq!(row(&store, "node-a").await.state, NodeState::Draining);

        stopped.cancel();
        beats.await.unwrap();
        let last = row(&store, "node-a").await;
        assert_eq!(last.state, NodeState::Stopped);
        let now = store.now().await.unwrap();
        assert!(!last.live(now));
        assert_eq!(last.shown_state(now), NodeState::GONE);
    }

    /// The pauses are read with each beat only for `fencecron_job_paused`,
    /// i.e. only when `/metrics` is served: a fleet without `[http]` pays
    /// one statement per beat, not two.
    #[tokio::test(start_paused = true)]
    async fn beats_read_the_pauses_only_for_the_metrics() {
        for metrics in [false, true] {
            let store = MemoryStore::new(on_phase());
            let (_tx, rx) = watch::channel(JobSet::of(&[job("alpha")]));
            let (draining, stopped) = (CancellationToken::new(), CancellationToken::new());
            let mut hb = node_a(
                &store,
                rx,
                draining,
                stopped.clone(),
                crate::store::NODE_RETENTION,
            );
            hb.metrics = metrics;
            let beats = tokio::spawn(hb.run());
            tokio::time::sleep(ms(10_001)).await;
            stopped.cancel();
            beats.await.unwrap();
            let reads = store.history(crate::testing::store::Op::Fleet).len();
            assert_eq!(reads > 0, metrics, "metrics {metrics}: {reads} fleet reads");
        }
    }

    /// A stop does not wait for a store that does not answer: a beat in
    /// progress is given LAST_BEAT to land, then dropped, and the last beat
    /// is given at most LAST_BEAT too.
    #[tokio::test(start_paused = true)]
    async fn a_hanging_store_does_not_hold_up_the_exit() {
        use crate::testing::store::{Commit, Gate};
        let store = MemoryStore::new(on_phase());
        let (_tx, rx) = watch::channel(JobSet::of(&[job("alpha")]));
        let stopped = CancellationToken::new();
        let beats = tokio::spawn(
            node_a(
                &store,
                rx,
                CancellationToken::new(),
                stopped.clone(),
                crate::store::NODE_RETENTION,
            )
            .run(),
        );
        tokio::time::sleep(ms(1)).await;
        assert_eq!(row(&store, "node-a").await.state, NodeState::Running);
        store.fault(Op::Nodes, Fault::Hang(Gate::new(), Commit::After), 10);
        tokio::time::sleep(ms(6_000)).await;
        let t0 = tokio::time::Instant::now();
        stopped.cancel();
        beats.await.unwrap();
        assert_eq!(tokio::time::Instant::now() - t0, LAST_BEAT * 2);
    }

    /// A node that stops beating (killed) is live for less than NODE_LIVE
    /// after its last beat, and gone from then on.
    #[tokio::test(start_paused = true)]
    async fn a_node_that_stops_beating_is_gone_within_the_bound() {
        let store = MemoryStore::new(on_phase());
        let beat = NodeBeat {
            node: "n",
            hostname: "h",
            pid: 1,
            version: "v",
            config_digest: "d",
            started_at: None,
            state: NodeState::Running,
            running: 0,
        };
        let seen = store.beat(&beat).await.unwrap().now;
        let row = store.nodes().await.unwrap().remove(0);
        tokio::time::sleep(crate::store::NODE_LIVE - ms(1)).await;
        assert!(row.live(store.now().await.unwrap()));
        tokio::time::sleep(ms(1)).await;
        let now = store.now().await.unwrap();
        assert_eq!(now.0 - seen.0, millis(crate::store::NODE_LIVE));
        assert_eq!(row.shown_state(now), NodeState::GONE);
        // Forgotten after the retention.
        assert_eq!(store.prune_nodes(StoreTime(seen.0)).await.unwrap(), 0);
        assert_eq!(store.prune_nodes(StoreTime(seen.0 + 1)).await.unwrap(), 1);
        assert!(store.nodes().await.unwrap().is_empty());
    }

    /// `history.nodes`: the heartbeat's hourly prune deletes the rows of
    /// nodes not seen for that long, and keeps the others.
    #[tokio::test(start_paused = true)]
    async fn node_rows_go_after_history_nodes() {
        let store = MemoryStore::new(Clock::following_tokio(chrono::Utc::now()));
        store
            .beat(&NodeBeat {
                node: "old",
                hostname: "h",
                pid: 1,
                version: "v",
                config_digest: "d",
                started_at: None,
                state: NodeState::Running,
                running: 0,
            })
            .await
            .unwrap();
        let (_tx, rx) = watch::channel(JobSet::of(&[job("alpha")]));
        let stopped = CancellationToken::new();
        let beats = tokio::spawn(
            node_a(
                &store,
                rx,
                CancellationToken::new(),
                stopped.clone(),
                Duration::from_secs(3_600),
            )
            .run(),
        );
        let nodes = || async {
            let mut n: Vec<_> = store
                .nodes()
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.node)
                .collect();
            n.sort();
            n
        };
        tokio::time::sleep(ms(1_000)).await;
        assert_eq!(nodes().await, ["node-a", "old"], "kept within the hour");
        // The prune an hour after the first deletes what was last seen
        // before the hour before it.
        tokio::time::sleep(PRUNE_EVERY * 2).await;
        assert_eq!(nodes().await, ["node-a"], "not seen for an hour: gone");
        stopped.cancel();
        beats.await.unwrap();
    }
}

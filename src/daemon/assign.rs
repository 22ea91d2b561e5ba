//! Who asks the store for which occurrence: the instant's occurrences are
//! split among a few *claimers*, computed by every node alike from the
//! live nodes its heartbeat last saw, so that the fleet makes about
//! `2 × ceil(J / BATCH)` claims per instant of `J` occurrences instead of
//! one per node. The store still decides every win (fence, occurrence
//! identity); this only decides who asks. A wrong assignment can cost an
//! instant (nobody asked), never a second owner, so every doubt falls back
//! to full competition (every node claims everything, [`super::claim`]).
//!
//! The assignment of an instant ([`Assignment::of`]), from the sorted ids
//! of the live nodes in state `running`:
//!
//! * the list is rotated by a hash of the instant (the load moves from
//!   node to node over time); its first `m = clamp(ceil(J / BATCH), 1, N)`
//!   nodes are the instant's claimers;
//! * an occurrence's *primary* is claimer `hash(job, instant) mod m`: it
//!   claims its chunk at the instant;
//! * its *backup* is the next claimer (the next node of the rotation when
//!   `m = 1`; none when `N = 1`): it claims the same chunk
//!   [`SECOND_ROUND_AFTER`](super::claim::SECOND_ROUND_AFTER) later, which
//!   costs one statement, answers `Lost` for what the primary won, and
//!   wins what a dead, slow or full primary left;
//! * every other node does not ask about it.
//!
//! The split is used only where it makes fewer claims than every node
//! claiming everything, i.e. `2 m < N` ([`Assignment::pays`]): from three
//! nodes on for an instant of up to 16 occurrences, from five for up to
//! 32, from nine for up to 64. Smaller fleets keep full competition,
//! which costs them about as few claims (3 nodes, 33 due: about 5 claims
//! per instant against the split's 6).
//!
//! The hash is FNV-1a with a fixed mixer, so that nodes built apart
//! compute the same; `J` is the number of the node's jobs due at that
//! instant (claimable ones: not `overlap = "replace"`), the same on every
//! node with the same config.
//!
//! A node uses the assignment only while its view is trustworthy
//! ([`assess`], [`Views::current`]); otherwise it competes for everything.
//! Two views can disagree (and leave an occurrence to nobody) when the
//! nodes' lists, jobs or rules differ, so it falls back when:
//!
//! * its last [`STABLE_BEATS`] beats did not all answer the same live nodes
//!   (id, state, config digest, version), one after another without a
//!   failed beat: a node started, stopped, drained or reloaded within the
//!   last beats, or this node just started (it is not yet in the list);
//! * a live node publishes another config digest (drift: its jobs, hence
//!   `J` and the chunks, may differ) or runs another version (its rules may
//!   differ), or one older than this release never published one;
//! * a live node's last beat is older than [`FRESH`]: it is missing beats
//!   (dying or cut off), and the others may soon disagree on whether it is
//!   live;
//! * this node's last beat answered more than [`VIEW_FOR`] ago (its beats
//!   fail or hang);
//! * this node reloaded its jobs, or one of its claims stopped at its
//!   capacity (`node.max_running`) with occurrences left, within the last
//!   [`HOLD_OFF`] ([`Views::hold_off`]).
//!
//! What is left to chance: the primary and the backup of a chunk failing
//! within the same few seconds (two nodes dying at once, or both draining),
//! before the others' beats show it (at most [`FRESH`] plus a beat); then
//! those instants' occurrences of that chunk are missed. A single failure
//! costs nothing.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::NodeState;
use crate::store::{millis, BeatAnswer, HEARTBEAT};

/// How many occurrences of an instant one claimer claims, about: an
/// instant of `J` occurrences has `ceil(J / BATCH)` claimers (at most the
/// live nodes).
pub(super) const BATCH: usize = 16;

/// How many nodes read the pending triggers in each
/// [`TRIGGER_POLL`](crate::store::TRIGGER_POLL) period while the view is
/// trusted ([`pollers`]); every node reads them otherwise.
pub(super) const POLLERS: usize = 2;

/// How many beats in a row must answer the same live nodes before the
/// assignment is trusted.
pub(super) const STABLE_BEATS: usize = 3;

/// A live node whose last beat is older than this (by the store's clock, at
/// this node's beat) is missing beats: no assignment.
pub(super) const FRESH: Duration = Duration::from_millis(7_500);

/// How long a view holds after the beat that answered it: a beat and a
/// half.
pub(super) const VIEW_FOR: Duration = Duration::from_millis(7_500);

/// How long a reload, or a claim that stopped at the node's capacity,
/// makes the node compete for everything: the beats a view needs to be
/// stable again.
pub(super) const HOLD_OFF: Duration = Duration::from_secs(5 * STABLE_BEATS as u64);

/// What this node does for one occurrence under an [`Assignment`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Claims it at the instant.
    Primary,
    /// Claims it after the primary.
    Backup,
    /// Does not ask the store about it.
    Neither,
}

/// FNV-1a (64 bits) of `bytes`, then `seed`, through a splitmix64
/// finalizer: the same on every build and platform.
fn hash(bytes: &[u8], seed: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes.iter().chain(&seed.to_le_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// The claimers of one instant (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Assignment {
    /// The rotated list's indices into the node list, first `m` claimers.
    order: Vec<usize>,
    /// How many claimers.
    m: usize,
    /// Seconds since the epoch of the instant.
    instant: i64,
}

impl Assignment {
    /// The assignment of the instant `instant` (seconds since the epoch)
    /// with `due` claimable occurrences, among `nodes` (at least one).
    pub(super) fn of(nodes: usize, instant: i64, due: usize) -> Assignment {
        let n = nodes.max(1);
        let m = due.div_ceil(BATCH).clamp(1, n);
        let seed = instant as u64;
        let start = (hash(b"rotation", seed) % n as u64) as usize;
        let order = (0..n).map(|i| (start + i) % n).collect();
        Assignment { order, m, instant }
    }

    /// How many nodes claim at this instant.
    pub(super) fn claimers(&self) -> usize {
        self.m
    }

    /// Whether the split makes fewer claims than full competition: its
    /// `2 m` (a primary and a backup claim per chunk) against at least one
    /// claim per node. In a small fleet (3 nodes, 33 due: 6 against 3 plus
    /// a few second rounds) every node claims everything instead.
    pub(super) fn pays(&self) -> bool {
        2 * self.m < self.order.len()
    }

    /// The node indices (into the sorted list) of `job`'s primary and
    /// backup; no backup with one node.
    pub(super) fn of_job(&self, job: &str) -> (usize, Option<usize>) {
        let k = (hash(job.as_bytes(), self.instant as u64) % self.m as u64) as usize;
        let primary = self.order[k];
        let backup = if self.m >= 2 {
            Some(self.order[(k + 1) % self.m])
        } else if self.order.len() >= 2 {
            Some(self.order[1])
        } else {
            None
        };
        (primary, backup)
    }
}

/// The nodes (indices into the sorted list of `nodes`) that read the
/// pending triggers in the poll period `slot` (the wall clock's
/// milliseconds divided by the poll period): [`POLLERS`] of them, rotated
/// by the period. A trigger they leave (at capacity, dead) stays pending
/// for the next period's pollers: a request waits longer, it is never lost.
pub(super) fn pollers(nodes: usize, slot: i64) -> Vec<usize> {
    let n = nodes.max(1);
    let start = (hash(b"triggers", slot as u64) % n as u64) as usize;
    (0..POLLERS.min(n)).map(|i| (start + i) % n).collect()
}

/// The live nodes as this node's last beats saw them, trusted.
#[derive(Debug, Clone)]
pub(super) struct View {
    /// The live nodes in state `running`, sorted; this node among them.
    nodes: Vec<String>,
    /// This node's place in `nodes`.
    me: usize,
    /// When the beat that answered it ended (tokio's clock).
    beat_at: Instant,
}

impl View {
    /// How many nodes the view holds.
    pub(super) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether this node reads the pending triggers in the poll period
    /// `slot` ([`pollers`]).
    pub(super) fn polls_triggers(&self, slot: i64) -> bool {
        pollers(self.nodes.len(), slot).contains(&self.me)
    }

    /// This node's role for `job`'s occurrence under `assignment`.
    pub(super) fn role(&self, assignment: &Assignment, job: &str) -> Role {
        match assignment.of_job(job) {
            (p, _) if p == self.me => Role::Primary,
            (_, Some(b)) if b == self.me => Role::Backup,
            _ => Role::Neither,
        }
    }
}

/// The view this node's heartbeat keeps for its claims: shared by the
/// heartbeat (which writes it after every beat) and the claims (which read
/// it at every instant).
#[derive(Clone, Default)]
pub(super) struct Views(Arc<Mutex<ViewState>>);

#[derive(Default)]
struct ViewState {
    view: Option<Arc<View>>,
    /// No assignment before this (a reload, a claim stopped at capacity).
    hold_until: Option<Instant>,
}

impl Views {
    fn lock(&self) -> std::sync::MutexGuard<'_, ViewState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The view to assign by now, if it can be trusted (see the module).
    pub(super) fn current(&self) -> Option<Arc<View>> {
        let s = self.lock();
        let now = Instant::now();
        if s.hold_until.is_some_and(|t| now < t) {
            return None;
        }
        s.view
            .clone()
            .filter(|v| now.saturating_duration_since(v.beat_at) <= VIEW_FOR)
    }

    /// Competes for everything for [`HOLD_OFF`] from now.
    pub(super) fn hold_off(&self) {
        let until = Instant::now() + HOLD_OFF;
        let mut s = self.lock();
        s.hold_until = Some(s.hold_until.map_or(until, |t| t.max(until)));
    }

    fn set(&self, view: Option<View>) {
        self.lock().view = view.map(Arc::new);
    }
}

/// One live node as the stability check compares them.
type Member = (String, String, String, String);

/// The heartbeat's side: the live nodes of its last beats, and the mode
/// last logged.
#[derive(Default)]
pub(super) struct Stability {
    recent: VecDeque<Vec<Member>>,
    /// `Ok(claimers)` or `Err(reason)` as last logged.
    logged: Option<Result<usize, &'static str>>,
}

/// This node, as the stability check needs it.
pub(super) struct Me<'a> {
    pub node: &'a str,
    pub digest: &'a str,
    pub version: &'a str,
}

impl Stability {
    /// A beat failed: the beats in a row start again.
    pub(super) fn failed(&mut self, views: &Views) {
        self.recent.clear();
        views.set(None);
        self.log(Err("the last beat failed"));
    }

    /// A beat answered: the view the claims use until the next one.
    pub(super) fn beat(&mut self, views: &Views, me: &Me<'_>, answer: &BeatAnswer) {
        let mut members: Vec<Member> = answer
            .live
            .iter()
            .map(|n| {
                (
                    n.node.clone(),
                    n.state.as_str().to_string(),
                    n.config_digest.clone(),
                    n.version.clone(),
                )
            })
            .collect();
        members.sort();
        self.recent.push_back(members);
        while self.recent.len() > STABLE_BEATS {
            self.recent.pop_front();
        }
        let verdict = assess(me, answer, &self.recent);
        let logged = verdict.as_ref().map(|v| v.len()).map_err(|e| *e);
        views.set(verdict.ok().map(|nodes| {
            let me = nodes.iter().position(|n| n == me.node).unwrap_or(0);
            View {
                nodes,
                me,
                beat_at: Instant::now(),
            }
        }));
        self.log(logged);
    }

    fn log(&mut self, now: Result<usize, &'static str>) {
        if self.logged != Some(now) {
            self.logged = Some(now);
            match now {
                Ok(nodes) => crate::events::claims_assigned(nodes),
                Err(reason) => crate::events::claims_competed(reason),
            }
        }
    }
}

/// The claimers' list if this node's last beats can be trusted: the live
/// `running` nodes, sorted; or why not.
pub(super) fn assess(
    me: &Me<'_>,
    answer: &BeatAnswer,
    recent: &VecDeque<Vec<Member>>,
) -> Result<Vec<String>, &'static str> {
    let live = &answer.live;
    if !live
        .iter()
        .any(|n| n.node == me.node && n.state == NodeState::Running)
    {
        return Err("this node is not among the live running nodes (starting or draining)");
    }
    if live.iter().any(|n| n.config_digest != me.digest) {
        return Err("the live nodes' jobs differ (config drift)");
    }
    if live.iter().any(|n| n.version != me.version) {
        return Err("the live nodes run different versions");
    }
    if live
        .iter()
        .any(|n| n.last_seen.0 <= answer.now.0 - millis(FRESH))
    {
        return Err("a live node is missing beats");
    }
    let steady = recent.len() >= STABLE_BEATS && recent.iter().all(|m| Some(m) == recent.back());
    if !steady {
        return Err("the live nodes changed within the last beats");
    }
    let mut nodes: Vec<String> = live
        .iter()
        .filter(|n| n.state == NodeState::Running)
        .map(|n| n.node.clone())
        .collect();
    nodes.sort();
    nodes.dedup();
    Ok(nodes)
}

/// The beat period the constants above assume.
const _: () = assert!(HEARTBEAT.as_millis() == 5_000);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{NodeInfo, StoreTime};

    /// Every node computes the same: a pure function of the node count,
    /// the instant, the due count and the job name, with a fixed hash (the
    /// values are pinned, so that a change of the hash, which would make
    /// two releases disagree, fails here).
    #[test]
    fn the_assignment_is_the_same_everywhere_and_pinned() {
        assert_eq!(hash(b"job-1", 1_800_000_000), hash(b"job-1", 1_800_000_000));
        assert_ne!(hash(b"job-1", 1_800_000_000), hash(b"job-1", 1_800_000_001));
        let a = Assignment::of(5, 1_800_000_000, 40);
        assert_eq!(a, Assignment::of(5, 1_800_000_000, 40));
        assert_eq!(a.claimers(), 3);
        let pinned: Vec<_> = (0..6).map(|i| a.of_job(&format!("job-{i}"))).collect();
        assert_eq!(pinned, PINNED);
    }

    const PINNED: [(usize, Option<usize>); 6] = [
        (4, Some(2)),
        (2, Some(3)),
        (2, Some(3)),
        (3, Some(4)),
        (3, Some(4)),
        (3, Some(4)),
    ];

    /// The split is used only where it makes fewer claims than every
    /// node claiming: `2 m < N`.
    #[test]
    fn the_split_is_used_only_where_it_makes_fewer_claims() {
        assert!(Assignment::of(100, 0, 50).pays());
        assert!(Assignment::of(20, 0, 50).pays());
        assert!(Assignment::of(5, 0, 20).pays());
        assert!(!Assignment::of(4, 0, 20).pays());
        assert!(!Assignment::of(3, 0, 33).pays());
        assert!(
            Assignment::of(3, 0, 1).pays(),
            "one chunk: 2 claims against 3"
        );
        assert!(!Assignment::of(2, 0, 1).pays());
        assert!(!Assignment::of(1, 0, 1).pays());
    }

    /// `m = clamp(ceil(J / BATCH), 1, N)`.
    #[test]
    fn the_claimers_are_ceil_j_over_batch_at_most_the_nodes() {
        assert_eq!(Assignment::of(100, 0, 50).claimers(), 4);
        assert_eq!(Assignment::of(100, 0, 0).claimers(), 1);
        assert_eq!(Assignment::of(100, 0, 16).claimers(), 1);
        assert_eq!(Assignment::of(100, 0, 17).claimers(), 2);
        assert_eq!(Assignment::of(3, 0, 33).claimers(), 3);
        assert_eq!(Assignment::of(3, 0, 10_000).claimers(), 3);
        assert_eq!(Assignment::of(1, 0, 50).claimers(), 1);
    }

    /// Every occurrence has a primary among the instant's claimers and,
    /// with two nodes or more, a backup that is another node (among the
    /// claimers when there are two or more); alone, a node is the primary
    /// of everything and nobody's backup.
    #[test]
    fn every_occurrence_has_a_primary_and_another_backup() {
        for nodes in 1..=12 {
            for due in [1, 5, 16, 17, 50, 200] {
                for instant in 1_800_000_000..1_800_000_040 {
                    let a = Assignment::of(nodes, instant, due);
                    let claimers: Vec<usize> = a.order[..a.m].to_vec();
                    for j in 0..due {
                        let (p, b) = a.of_job(&format!("job-{j}"));
                        assert!(claimers.contains(&p));
                        match b {
                            None => assert_eq!(nodes, 1),
                            Some(b) => {
                                assert_ne!(p, b, "{nodes} nodes, {due} due");
                                assert!(b < nodes);
                                if a.m >= 2 {
                                    assert!(claimers.contains(&b));
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The chunks are about even (each claimer's share within half of the
    /// mean, over many instants), and the claimers rotate: over 100
    /// instants every node of 20 is a claimer, none far more often than
    /// the mean.
    #[test]
    fn chunks_are_about_even_and_the_claimers_rotate() {
        let (nodes, due) = (20, 50);
        let mut per_claimer = vec![0usize; 4];
        let mut per_node = vec![0usize; nodes];
        for instant in 1_800_000_000..1_800_000_100 {
            let a = Assignment::of(nodes, instant, due);
            assert_eq!(a.m, 4);
            for j in 0..due {
                let (p, _) = a.of_job(&format!("job-{j}"));
                let k = a.order.iter().position(|&x| x == p).unwrap();
                per_claimer[k] += 1;
                per_node[p] += 1;
            }
        }
        let mean = 100 * due / 4;
        for c in &per_claimer {
            assert!(c.abs_diff(mean) < mean / 10, "{per_claimer:?}");
        }
        let mean = 100 * due / nodes;
        assert!(per_node.iter().all(|&c| c > 0), "{per_node:?}");
        assert!(per_node.iter().all(|&c| c < mean * 3), "{per_node:?}");
    }

    /// Two different pollers per period with two nodes or more (one
    /// alone), rotating so that every node polls now and then.
    #[test]
    fn two_pollers_per_period_rotate() {
        assert_eq!(pollers(1, 7), [0]);
        let mut polled = [0usize; 10];
        for slot in 900_000_000..900_000_200 {
            let p = pollers(10, slot);
            assert_eq!(p.len(), 2);
            assert_ne!(p[0], p[1]);
            assert_eq!(p, pollers(10, slot));
            for i in p {
                polled[i] += 1;
            }
        }
        assert!(polled.iter().all(|&c| c > 10), "{polled:?}");
    }

    fn node(id: &str, seen: i64, state: NodeState, digest: &str) -> NodeInfo {
        NodeInfo {
            node: id.into(),
            hostname: String::new(),
            pid: 1,
            version: "v1".into(),
            config_digest: digest.into(),
            started_at: StoreTime(0),
            last_seen: StoreTime(seen),
            state,
            running: 0,
        }
    }

    const ME: Me<'static> = Me {
        node: "b",
        digest: "d",
        version: "v1",
    };

    /// Beats `answers` in order into a fresh stability check; the last
    /// verdict.
    fn beats(answers: &[Vec<NodeInfo>]) -> Result<Vec<String>, &'static str> {
        let views = Views::default();
        let mut s = Stability::default();
        let mut verdict = Err("no beat");
        for (i, live) in answers.iter().enumerate() {
            let answer = BeatAnswer {
                now: StoreTime(10_000 + 5_000 * i as i64),
                live: live.clone(),
            };
            s.beat(&views, &ME, &answer);
            let recent = s.recent.clone();
            verdict = assess(&ME, &answer, &recent);
            assert_eq!(verdict.is_ok(), views.current().is_some());
        }
        verdict
    }

    /// Three beats in a row with the same live nodes, all running the same
    /// jobs and version and beating: trusted, the running ones sorted (a
    /// draining node is no claimer but part of what must be stable).
    #[test]
    fn three_equal_beats_are_trusted() {
        let at = |i: i64| {
            let t = 10_000 + 5_000 * i;
            vec![
                node("c", t - 10, NodeState::Running, "d"),
                node("b", t, NodeState::Running, "d"),
                node("a", t - 4_000, NodeState::Running, "d"),
                node("z", t - 20, NodeState::Draining, "d"),
            ]
        };
        assert_eq!(
            beats(&[at(0), at(1), at(2)]),
            Ok(vec!["a".into(), "b".into(), "c".into()])
        );
        assert!(beats(&[at(1), at(2)]).is_err(), "two beats are not enough");
    }

    /// Each way two nodes' views could disagree falls back.
    #[test]
    fn each_doubt_falls_back_to_competing() {
        let base = |i: i64| {
            let t = 10_000 + 5_000 * i;
            vec![
                node("a", t - 10, NodeState::Running, "d"),
                node("b", t, NodeState::Running, "d"),
            ]
        };
        let t = |i: i64| 10_000 + 5_000 * i;
        // Not yet in the list (just started, or its own row not written).
        let without_me = |i| vec![node("a", t(i), NodeState::Running, "d")];
        assert_eq!(
            beats(&[base(0), base(1), without_me(2)]),
            Err("this node is not among the live running nodes (starting or draining)")
        );
        // A node joined at the last beat.
        let mut joined = base(2);
        joined.push(node("c", t(2), NodeState::Running, "d"));
        assert_eq!(
            beats(&[base(0), base(1), joined.clone()]),
            Err("the live nodes changed within the last beats")
        );
        // ... and two beats later still.
        let mut joined3 = base(3);
        joined3.push(node("c", t(3), NodeState::Running, "d"));
        assert!(beats(&[base(0), base(1), joined, joined3]).is_err());
        // A node began to drain.
        let mut draining = base(2);
        draining[0].state = NodeState::Draining;
        assert!(beats(&[base(0), base(1), draining]).is_err());
        // Config drift, or a node of an older release without a digest.
        for digest in ["other", ""] {
            let mut drift = base(2);
            drift[0].config_digest = digest.into();
            let mut drift_all = vec![base(0), base(1), drift.clone()];
            for a in &mut drift_all {
                a[0].config_digest = digest.into();
            }
            assert_eq!(
                beats(&drift_all),
                Err("the live nodes' jobs differ (config drift)")
            );
        }
        // Another version.
        let mut all = vec![base(0), base(1), base(2)];
        for a in &mut all {
            a[0].version = "v2".into();
        }
        assert_eq!(beats(&all), Err("the live nodes run different versions"));
        // A node missing beats (still live: seen within 15 s).
        let mut all = vec![base(0), base(1), base(2)];
        all[2][0].last_seen = StoreTime(t(2) - 8_000);
        assert_eq!(beats(&all), Err("a live node is missing beats"));
        // This node's own state is draining.
        let mut all = vec![base(0), base(1), base(2)];
        for a in &mut all {
            a[1].state = NodeState::Draining;
        }
        assert!(beats(&all).is_err());
    }

    /// A failed beat starts the count again; a view is trusted for
    /// VIEW_FOR after its beat, and not while held off.
    #[tokio::test(start_paused = true)]
    async fn a_view_expires_fails_and_is_held_off() {
        let views = Views::default();
        let mut s = Stability::default();
        let answer = |i: i64| BeatAnswer {
            now: StoreTime(10_000 + 5_000 * i),
            live: vec![node("b", 10_000 + 5_000 * i, NodeState::Running, "d")],
        };
        for i in 0..3 {
            s.beat(&views, &ME, &answer(i));
        }
        assert!(views.current().is_some());
        tokio::time::sleep(VIEW_FOR).await;
        assert!(views.current().is_some());
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(views.current().is_none(), "too old");
        s.beat(&views, &ME, &answer(3));
        assert!(views.current().is_some());
        views.hold_off();
        assert!(views.current().is_none(), "held off");
        tokio::time::sleep(HOLD_OFF - Duration::from_millis(1)).await;
        s.beat(&views, &ME, &answer(4));
        assert!(views.current().is_none(), "still held off");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(views.current().is_some(), "no longer held off");
        s.failed(&views);
        assert!(views.current().is_none());
        s.beat(&views, &ME, &answer(5));
        s.beat(&views, &ME, &answer(6));
        assert!(views.current().is_none(), "two beats since the failure");
        s.beat(&views, &ME, &answer(7));
        assert!(views.current().is_some());
    }
}

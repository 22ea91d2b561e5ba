//! Batch claims, the daemon's first attempt at every scheduled occurrence:
//! the occurrences this node fires at one instant, claimed in one store
//! operation ([`Leases::claim`](crate::store::Leases::claim), every store)
//! instead of one acquire each. [`claim_instant`] is the one entry of an
//! occurrence: it turns the claim's answer into one [`Decision`] per
//! occurrence, which [`Occurrence::run_entered`] follows.
//!
//! Who asks: while the node's view of the live nodes is trusted
//! ([`assign`]), the instant's occurrences are split into chunks among a
//! few claimers; this node claims its primary chunk at the instant and its
//! backup chunk [`SECOND_ROUND_AFTER`] later, each in one claim bounded
//! only by its free places, and does not ask about the rest
//! ([`Ending::Assigned`]). A chunk claim that stops at the node's places
//! with occurrences left leaves those to wait for a place alone, and makes
//! the node compete for everything for a while. Otherwise, *full
//! competition*: the node claims every occurrence, as follows.
//!
//! The flow of full competition, for the occurrences of one instant:
//!
//! * each enters the node's running set (or skips `held`, as alone), and
//!   one past its `starting_deadline` is skipped without asking the store;
//!   `overlap = "replace"` jobs are not claimed (they may have to end an
//!   earlier run first, which only the single acquire does):
//!   [`Undecided::Replace`];
//! * the node takes up to that many places of its capacity; with none free
//!   it claims nothing, and every occurrence waits for a place on its own
//!   ([`Undecided::AtCapacity`]);
//! * one claim of all of them, in the node's order, winning at most the
//!   places it holds and at most its share of the live nodes, and skipping
//!   rows another node is claiming;
//! * a win runs as if its single acquire had won (same owner id, same
//!   `sent`: [`Decision::Won`]), a never-leased resource's included (the
//!   claim creates its row as the acquire's first acquisition would); a
//!   loss ends the occurrence as a losing acquire would
//!   ([`Decision::Lost`]): another node won it or holds the lease, and
//!   this node does not compete for it again (no single acquire, not in a
//!   second round); what the claim leaves to the single acquire (paused, a
//!   clock ahead or behind, a new row another caller created while the
//!   claim ran) is [`Undecided::Asked`];
//! * a skipped row means another claimer took or is taking it, unless this
//!   claim stopped at its share with rows still free: then, after
//!   [`SECOND_ROUND_AFTER`] (when the other nodes have claimed theirs), one
//!   more claim without the share takes what nobody took;
//! * a claim that fails is each occurrence's first failed attempt
//!   ([`Undecided::Failed`]: `store_unavailable` for `acquire`, with the
//!   retry): every occurrence then competes on its own under the same owner
//!   id, so a claim that committed unseen is adopted by the retry or given
//!   back by its sweep, as for an unanswered single acquire. Each
//!   occurrence waits for the answer until its own give-up time (then ends
//!   as an unanswered acquire); the claim itself is never dropped: a late
//!   answer's wins go back ([`Supervisor::give_back_unused`]). A drain lets
//!   a claim in flight answer and runs its wins (the other nodes lost those
//!   instants), but makes no second round. At a stop a claim still in
//!   flight finishes in the background and gives back what it won.
//!
//! [`Supervisor::give_back_unused`]: crate::supervise::Supervisor::give_back_unused

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::assign::{self, Role};
use super::occurrence::{
    give_back_late, Decision, Ending, Occurrence, RunningGuard, Slot, Undecided,
};
use super::{ensure_ready, sweep, Shared};
use crate::config::Overlap;
use crate::events;
use crate::store::{
    ClaimItem, ClaimOutcome, ClaimRequest, Claimed, OwnerId, StoreError, StoreTime,
};

/// How long a claim that stopped at its share waits before it takes what
/// the other nodes left.
pub(super) const SECOND_ROUND_AFTER: Duration = Duration::from_millis(200);

/// What a claim sends for one occurrence: the job, its owner id, the instant.
type ClaimJob = (
    Arc<crate::config::Job>,
    OwnerId,
    chrono::DateTime<chrono::Utc>,
);

/// One occurrence in a claim: in the running set, its owner id chosen;
/// `index` is its place among the instant's occurrences.
struct Entered {
    index: usize,
    occurrence: Occurrence,
    guard: RunningGuard,
    owner_id: OwnerId,
}

/// How the occurrences of one instant ended, in the order they were due:
/// those that ended in the claim's own task, and the tasks of those that
/// went on.
struct Endings {
    ended: Vec<Option<Ending>>,
    going: Vec<(usize, JoinHandle<Ending>)>,
}

impl Endings {
    fn new(n: usize) -> Endings {
        Endings {
            ended: vec![None; n],
            going: Vec::new(),
        }
    }

    /// The occurrence at `index` ended here.
    fn ended(&mut self, index: usize, ending: Ending) {
        self.ended[index] = Some(ending);
    }

    /// The occurrence goes on, as its claim decided, in a task of its own.
    fn decided(&mut self, shared: &Shared, e: Entered, decision: Decision) {
        let task = e.occurrence.run_entered(e.guard, e.owner_id, decision);
        self.going.push((e.index, shared.tracker.spawn(task)));
    }

    /// Takes over what `other` (over the same occurrences) ended and
    /// started.
    fn merge(&mut self, other: Endings) {
        for (mine, theirs) in self.ended.iter_mut().zip(other.ended) {
            if theirs.is_some() {
                *mine = theirs;
            }
        }
        self.going.extend(other.going);
    }

    /// Every occurrence's ending, once each has ended.
    async fn all(mut self) -> Vec<Ending> {
        for (index, task) in std::mem::take(&mut self.going) {
            // A task that panicked ended nothing worth reporting here.
            if let Ok(ending) = task.await {
                self.ended[index] = Some(ending);
            }
        }
        self.ended.into_iter().flatten().collect()
    }
}

/// Claims and runs the occurrences of one instant (see the module docs),
/// the instant's claimable count taken from `due` itself; returns how each
/// ended, in order, once every one has.
#[cfg(test)]
pub(super) async fn claim(shared: Shared, due: Vec<Occurrence>) -> Vec<Ending> {
    let fired = due
        .iter()
        .filter(|o| o.job.overlap != Overlap::Replace)
        .count();
    claim_instant(shared, due, fired).await
}

/// Claims and runs the occurrences of one instant (see the module docs):
/// those of its chunks when the node's view of the fleet is trusted
/// ([`assign`]), every one otherwise. `fired` is how many claimable
/// occurrences the node's jobs have at this instant, whether or not this
/// node attempts them (the same on every node with the same jobs); returns
/// how each of `due` ended, in order, once every one has.
pub(super) async fn claim_instant(
    shared: Shared,
    due: Vec<Occurrence>,
    fired: usize,
) -> Vec<Ending> {
    let mut out = Endings::new(due.len());
    if shared.draining.is_cancelled() {
        // Fired just before the drain began: competed for by nobody here.
        for index in 0..due.len() {
            out.ended(index, Ending::Stopped);
        }
        return out.all().await;
    }
    let split = shared.views.current().and_then(|view| {
        let at = due.first()?.at;
        let assignment = assign::Assignment::of(view.len(), at.timestamp(), fired);
        assignment.pays().then_some((view, at, assignment))
    });
    let Some((view, at, assignment)) = split else {
        let entered = enter(&shared, &mut out, due.into_iter().enumerate());
        return compete(&shared, out, entered).await;
    };
    let (mut primary, mut backup, mut others) = (Vec::new(), Vec::new(), 0);
    for (index, occurrence) in due.into_iter().enumerate() {
        if occurrence.job.overlap == Overlap::Replace {
            // Every node competes for it on its own, as without the
            // assignment.
            primary.push((index, occurrence));
            continue;
        }
        match view.role(&assignment, occurrence.job.name.as_str()) {
            Role::Primary => primary.push((index, occurrence)),
            Role::Backup => backup.push((index, occurrence)),
            Role::Neither => {
                // Another claimer's chunk: not asked about here (one debug
                // line per instant below, not one per occurrence).
                others += 1;
                out.ended(index, Ending::Assigned);
            }
        }
    }
    events::occurrences_assigned(
        &crate::store::rfc3339(at),
        fired,
        assignment.claimers(),
        view.len(),
        primary.len(),
        backup.len(),
        others,
    );
    let primary = async {
        let mut out = Endings::new(out.ended.len());
        let entered = enter(&shared, &mut out, primary.into_iter());
        chunk(&shared, &mut out, entered, 1).await;
        out
    };
    let backup = async {
        let mut out = Endings::new(out.ended.len());
        if backup.is_empty() {
            return out;
        }
        tokio::select! {
            _ = tokio::time::sleep(SECOND_ROUND_AFTER) => {}
            // Draining: what the primary left is for the others (a node
            // that drains competes for nothing new).
            _ = shared.draining.cancelled() => {
                for (index, _) in backup {
                    out.ended(index, Ending::Stopped);
                }
                return out;
            }
        }
        let entered = enter(&shared, &mut out, backup.into_iter());
        chunk(&shared, &mut out, entered, 2).await;
        out
    };
    let (primary, backup) = tokio::join!(primary, backup);
    out.merge(primary);
    out.merge(backup);
    out.all().await
}

/// Enters each occurrence into the node's running set (a held one is
/// skipped, one past its `starting_deadline` ends there) and gives it its
/// owner id; `overlap = "replace"` ones are decided at once
/// ([`Undecided::Replace`]). Returns those to claim.
fn enter(
    shared: &Shared,
    out: &mut Endings,
    due: impl Iterator<Item = (usize, Occurrence)>,
) -> Vec<Entered> {
    let mut entered = Vec::new();
    for (index, occurrence) in due {
        let Some(guard) = occurrence.enter() else {
            out.ended(index, Ending::Skipped(crate::events::SkipReason::Held));
            continue;
        };
        if let Some(ending) = occurrence.past_deadline_now() {
            out.ended(index, ending);
            continue;
        }
        let e = Entered {
            index,
            occurrence,
            guard,
            // One owner id for every attempt at this occurrence on this
            // node: an attempt that timed out here may still have won in
            // the store, and the next attempt then adopts that win instead
            // of finding its own occurrence taken (see
            // `AcquireRequest::owner_id`).
            owner_id: OwnerId::fresh(),
        };
        if e.occurrence.job.overlap == Overlap::Replace {
            out.decided(shared, e, Decision::Undecided(Undecided::Replace));
            continue;
        }
        entered.push(e);
    }
    entered
}

/// Full competition: one claim of every occurrence, winning at most the
/// node's share, then a second round for what nobody took.
async fn compete(shared: &Shared, mut out: Endings, entered: Vec<Entered>) -> Vec<Ending> {
    let slots = take_slots(shared, entered.len());
    if slots.is_empty() {
        // At capacity: no claim; each waits for a place and competes alone.
        for e in entered {
            out.decided(shared, e, Decision::Undecided(Undecided::AtCapacity));
        }
        return out.all().await;
    }
    let left = round(shared, &mut out, entered, slots, Round::Share).await;
    if left.is_empty() {
        return out.all().await;
    }
    tokio::select! {
        _ = tokio::time::sleep(SECOND_ROUND_AFTER) => {}
        // Draining: what the other nodes left is theirs to take.
        _ = shared.draining.cancelled() => {
            for e in left {
                out.ended(e.index, Ending::Stopped);
            }
            return out.all().await;
        }
    }
    let slots = take_slots(shared, left.len());
    if slots.is_empty() {
        for e in left {
            out.decided(shared, e, Decision::Undecided(Undecided::AtCapacity));
        }
        return out.all().await;
    }
    let skipped = round(shared, &mut out, left, slots, Round::Rest).await;
    for e in skipped {
        out.ended(e.index, taken(&e));
    }
    out.all().await
}

/// One claim of this node's chunk (`round` 1 as the primary, 2 as the
/// backup), winning as many as the node's free places allow. With no free
/// place, or when the claim stopped at its places with occurrences still
/// free, those wait for a place and compete alone, and the node competes
/// for everything for a while ([`Views::hold_off`]): its chunks need a
/// node with room.
///
/// [`Views::hold_off`]: assign::Views::hold_off
async fn chunk(shared: &Shared, out: &mut Endings, entered: Vec<Entered>, round_no: u32) {
    if entered.is_empty() {
        return;
    }
    let slots = take_slots(shared, entered.len());
    if slots.is_empty() {
        shared.views.hold_off();
        for e in entered {
            out.decided(shared, e, Decision::Undecided(Undecided::AtCapacity));
        }
        return;
    }
    let full = round(shared, out, entered, slots, Round::Chunk(round_no)).await;
    if !full.is_empty() {
        shared.views.hold_off();
        for e in full {
            out.decided(shared, e, Decision::Undecided(Undecided::AtCapacity));
        }
    }
}

/// Up to `n` free places of the node's capacity (`n` without a limit).
fn take_slots(shared: &Shared, n: usize) -> Vec<Slot> {
    std::iter::from_fn(|| shared.capacity.try_take())
        .take(n)
        .collect()
}

/// Another node took the occurrence, or is taking it.
fn taken(e: &Entered) -> Ending {
    events::occurrence_taken(
        e.occurrence.job.name.as_str(),
        &crate::store::rfc3339(e.occurrence.at),
    );
    Ending::Taken
}

/// Which claim [`round`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// Full competition's first claim: at most the node's share.
    Share,
    /// Full competition's second claim: what the others left.
    Rest,
    /// The node's chunk of an instant's assignment (1 as the primary, 2 as
    /// the backup).
    Chunk(u32),
}

/// One claim of `entered`, winning at most `slots.len()`; decides each
/// occurrence (into `out`). Returns the occurrences it skipped: with
/// [`Round::Share`], only when the claim stopped at its share with rows
/// still free (for a second round); with [`Round::Rest`], every one; with
/// [`Round::Chunk`], only when the claim stopped at its free places with
/// rows still free (they wait for a place). A skipped row otherwise means
/// another claimer took or is taking it: ended as taken.
async fn round(
    shared: &Shared,
    out: &mut Endings,
    entered: Vec<Entered>,
    mut slots: Vec<Slot>,
    kind: Round,
) -> Vec<Entered> {
    let share = kind == Round::Share;
    let store = shared.supervisor.store().clone();
    let node = shared.supervisor.node().to_string();
    let items: Vec<ClaimJob> = entered
        .iter()
        .map(|e| (e.occurrence.job.clone(), e.owner_id, e.occurrence.at))
        .collect();
    let at = entered
        .first()
        .map(|e| crate::store::rfc3339(e.occurrence.at))
        .unwrap_or_default();
    let (count, limit) = (entered.len(), slots.len());
    let sent = Instant::now();
    let mut call = Box::pin(claim_call(
        store.clone(),
        shared.ready.clone(),
        node.clone(),
        items.clone(),
        limit,
        share,
    ));
    // `None` once the occurrence gave up waiting.
    let mut waiting: Vec<Option<Entered>> = entered.into_iter().map(Some).collect();
    let answer = loop {
        let Some(give_up) = waiting
            .iter()
            .flatten()
            .map(|e| e.occurrence.give_up().0)
            .min()
        else {
            settle_late(shared, call, items);
            return Vec::new();
        };
        let wait = (give_up - shared.clock.now())
            .to_std()
            .unwrap_or(Duration::ZERO);
        tokio::select! {
            r = &mut call => break r,
            _ = tokio::time::sleep(wait) => {
                let now = shared.clock.now();
                for w in &mut waiting {
                    if let Some(e) = w.take_if(|e| e.occurrence.give_up().0 <= now) {
                        let (give_up, deadline) = e.occurrence.give_up();
                        out.ended(e.index, e.occurrence.unanswered(give_up, deadline));
                    }
                }
            }
            _ = shared.shutdown.cancelled() => {
                for e in waiting.into_iter().flatten() {
                    events::occurrence_abandoned(
                        e.occurrence.name(),
                        &crate::store::rfc3339(e.occurrence.at),
                    );
                    out.ended(e.index, Ending::Stopped);
                }
                settle_late(shared, call, items);
                return Vec::new();
            }
        }
    };
    let outcome = match answer {
        Ok(outcome) => {
            for (job, _, _) in &items {
                events::store_answered(store.outages(), job.name.as_str());
            }
            outcome
        }
        Err(e) => {
            let gave_up = waiting.iter().zip(&items).filter(|(w, _)| w.is_none());
            sweep(shared, gave_up.map(|(_, item)| item));
            let error = Arc::new(e);
            for e in waiting.into_iter().flatten() {
                let why = Undecided::Failed {
                    error: error.clone(),
                    sent,
                };
                out.decided(shared, e, Decision::Undecided(why));
            }
            return Vec::new();
        }
    };
    let won = outcome
        .items
        .iter()
        .filter(|c| matches!(c, Claimed::Won(_)))
        .count();
    let round_no = match kind {
        Round::Share => 1,
        Round::Rest => 2,
        Round::Chunk(n) => n,
    };
    events::occurrences_claimed(&at, round_no, count, won, outcome.limit);
    let again = match kind {
        Round::Share | Round::Chunk(_) => outcome.left_some(),
        Round::Rest => true,
    };
    let mut left = Vec::new();
    for ((w, claimed), (job, _, at)) in waiting.into_iter().zip(outcome.items).zip(&items) {
        let Some(e) = w else {
            // Gave up before the answer came: a win goes back.
            if let Claimed::Won(lease) = claimed {
                give_back_late(shared, job, lease, *at);
            }
            continue;
        };
        let decision = match claimed {
            Claimed::Won(lease) => Decision::Won {
                lease,
                sent,
                slot: slots.pop().unwrap_or_default(),
            },
            Claimed::Lost(lost) => Decision::Lost(lost),
            Claimed::Skipped if again => {
                left.push(e);
                continue;
            }
            Claimed::Skipped => {
                out.ended(e.index, taken(&e));
                continue;
            }
            Claimed::Ask => Decision::Undecided(Undecided::Asked),
        };
        out.decided(shared, e, decision);
    }
    left
}

/// A claim that failed may have committed: the owner ids of the
/// occurrences that no longer wait for it are swept (the others are
/// retried under theirs, which adopts or sweeps).
fn sweep<'a>(shared: &Shared, gave_up: impl Iterator<Item = &'a ClaimJob>) {
    for (job, owner_id, at) in gave_up {
        let times = sweep::times(shared, job, *at);
        shared
            .sweeper
            .add(shared, job.clone(), *owner_id, *at, times);
    }
}

/// The claim itself, migrations first; owns what it uses, so that a claim
/// the daemon stopped waiting for can finish on its own.
async fn claim_call(
    store: Arc<dyn crate::store::Store>,
    ready: Arc<tokio::sync::OnceCell<()>>,
    node: String,
    items: Vec<ClaimJob>,
    limit: usize,
    share: bool,
) -> Result<ClaimOutcome, StoreError> {
    ensure_ready(&ready, store.as_ref()).await?;
    let items: Vec<ClaimItem<'_>> = items
        .iter()
        .map(|(job, owner_id, at)| ClaimItem {
            resource: &job.resource,
            job: job.name.as_str(),
            owner_id: *owner_id,
            lease: job.timing.lease,
            occurrence: StoreTime::from_utc(*at),
            next_occurrence: job.schedule.next_after(*at).map(StoreTime::from_utc),
        })
        .collect();
    store
        .claim(&ClaimRequest {
            node: &node,
            items: &items,
            limit,
            share,
        })
        .await
}

/// Nobody waits for the claim any more (every occurrence gave up, or the
/// daemon is stopping): let it finish in the background and give back
/// whatever it won, lease and occurrence, so that no lease is held with
/// nothing running under it; should it fail, sweep its owner ids.
fn settle_late(
    shared: &Shared,
    call: impl std::future::Future<Output = Result<ClaimOutcome, StoreError>> + Send + 'static,
    items: Vec<ClaimJob>,
) {
    let shared = shared.clone();
    shared.tracker.clone().spawn(async move {
        match call.await {
            Ok(outcome) => {
                for ((job, _, at), claimed) in items.iter().zip(outcome.items) {
                    if let Claimed::Won(lease) = claimed {
                        give_back_late(&shared, job, lease, *at);
                    }
                }
            }
            Err(_) => sweep(&shared, items.iter()),
        }
    });
}

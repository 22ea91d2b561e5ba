//! Batch claims: the scheduled occurrences this node fires at one instant,
//! claimed in one store operation where the store can ([`Store::claims`],
//! every backend but the in-process test store), instead of one acquire each.
//!
//! The flow, for the occurrences of one instant ([`claim`]):
//!
//! * each enters the node's running set (or skips `held`, as alone);
//!   `overlap = "replace"` jobs go their own way (they may have to end an
//!   earlier run first);
//! * the node takes up to that many places of its capacity; with none free
//!   it claims nothing, and every occurrence waits for a place on its own
//!   ([`Occurrence::run_entered`]);
//! * one [`Store::claim`] of all of them, in the node's order, winning at
//!   most the places it holds and at most its share of the live nodes, and
//!   skipping rows another node is claiming;
//! * a win runs as if its single acquire had won (same owner id, same
//!   `sent`); a loss ends the occurrence as a losing acquire would; what
//!   the claim leaves to the single acquire (no row yet, paused, a clock
//!   ahead or behind) goes through [`Occurrence::run_entered`];
//! * a skipped row means another claimer took or is taking it, unless this
//!   claim stopped at its share with rows still free: then, after
//!   [`SECOND_ROUND_AFTER`] (when the other nodes have claimed theirs), one
//!   more claim without the share takes what nobody took;
//! * a claim that fails or has not answered by the earliest give-up time
//!   counts as each occurrence's first failed attempt (`store_unavailable`
//!   for `acquire`, with the retry): every occurrence then competes on its
//!   own under the same owner id, so a claim that committed unseen is
//!   adopted by the retry or given back by its sweep, as for an unanswered
//!   single acquire. A drain lets a claim in flight answer and runs its
//!   wins (the other nodes lost those instants), but makes no second round.
//!   At a stop a claim still in flight finishes in the background and gives
//!   back what it won.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::occurrence::{give_back_unused, Ending, Occurrence, RunningGuard, Slot};
use super::{ensure_ready, sweep, Shared};
use crate::config::Overlap;
use crate::events;
use crate::fence;
use crate::store::{
    AcquireOutcome, ClaimItem, ClaimOutcome, ClaimRequest, Claimed, OwnerId, StoreError, StoreTime,
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

/// One occurrence in a claim: in the running set, its owner id chosen.
struct Entered {
    occurrence: Occurrence,
    guard: RunningGuard,
    owner_id: OwnerId,
}

/// Claims and runs the occurrences of one instant (see the module docs).
pub(super) async fn claim(shared: Shared, due: Vec<Occurrence>) {
    if shared.draining.is_cancelled() {
        // Fired just before the drain began: competed for by nobody here.
        return;
    }
    let mut entered = Vec::with_capacity(due.len());
    for occurrence in due {
        if occurrence.job.overlap == Overlap::Replace {
            shared.tracker.spawn(occurrence.run());
            continue;
        }
        if let Some(guard) = occurrence.enter() {
            entered.push(Entered {
                occurrence,
                guard,
                owner_id: OwnerId::fresh(),
            });
        }
    }
    let slots = take_slots(&shared, entered.len());
    if slots.is_empty() {
        // At capacity: no claim; each waits for a place and competes alone.
        alone(&shared, entered, None);
        return;
    }
    let left = round(&shared, entered, slots, true).await;
    if left.is_empty() {
        return;
    }
    tokio::select! {
        _ = tokio::time::sleep(SECOND_ROUND_AFTER) => {}
        // Draining: what the other nodes left is theirs to take.
        _ = shared.draining.cancelled() => return,
    }
    let slots = take_slots(&shared, left.len());
    if slots.is_empty() {
        alone(&shared, left, None);
        return;
    }
    let skipped = round(&shared, left, slots, false).await;
    for e in skipped {
        taken(&e);
    }
}

/// Up to `n` free places of the node's capacity (`n` without a limit).
fn take_slots(shared: &Shared, n: usize) -> Vec<Slot> {
    std::iter::from_fn(|| shared.capacity.try_take())
        .take(n)
        .collect()
}

/// Each occurrence competes on its own, under its owner id; after a claim
/// that failed or went unanswered (`failed`: why, and when it was sent), as
/// after a single acquire that did: retried with back-off, a late win
/// adopted or swept.
fn alone(shared: &Shared, entered: Vec<Entered>, failed: Option<(String, Instant)>) {
    for e in entered {
        let first = failed.clone().map(|(why, sent)| (Err(why), sent));
        shared
            .tracker
            .spawn(e.occurrence.run_entered(e.guard, None, e.owner_id, first));
    }
}

/// Another node took the occurrence, or is taking it.
fn taken(e: &Entered) {
    events::occurrence_taken(
        e.occurrence.job.name.as_str(),
        &crate::store::rfc3339(e.occurrence.at),
    );
}

/// One claim of `entered`, winning at most `slots.len()`; starts what it
/// won and settles what it lost. Returns the occurrences it skipped while
/// stopping at its share (`share`) with rows still free, for a second
/// round; without `share` every skipped occurrence is returned.
///
/// Each occurrence waits for the answer until its own give-up time, then
/// ends as an unanswered acquire would; the claim itself is never dropped
/// half-way (that would cost the connection): an answer that comes after
/// some gave up is used for the others, and what it won for those goes
/// back. Only a claim that fails leaves wins unseen, to be swept.
async fn round(
    shared: &Shared,
    entered: Vec<Entered>,
    mut slots: Vec<Slot>,
    share: bool,
) -> Vec<Entered> {
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
                        let _: Ending = e.occurrence.unanswered(give_up, deadline);
                    }
                }
            }
            _ = shared.shutdown.cancelled() => {
                settle_late(shared, call, items);
                return Vec::new();
            }
        }
    };
    let outcome = match answer {
        Ok(Some(outcome)) => {
            for (job, _, _) in &items {
                events::store_answered(store.outages(), job.name.as_str());
            }
            outcome
        }
        Ok(None) => {
            alone(shared, waiting.into_iter().flatten().collect(), None);
            return Vec::new();
        }
        Err(e) => {
            let gave_up = waiting.iter().zip(&items).filter(|(w, _)| w.is_none());
            sweep(shared, gave_up.map(|(_, item)| item));
            let waiting = waiting.into_iter().flatten().collect();
            alone(shared, waiting, Some((e.to_string(), sent)));
            return Vec::new();
        }
    };
    let won = outcome
        .items
        .iter()
        .filter(|c| matches!(c, Claimed::Won(_)))
        .count();
    let round_no = if share { 1 } else { 2 };
    events::occurrences_claimed(&at, round_no, count, won, outcome.limit);
    let again = share && outcome.left_some();
    let mut left = Vec::new();
    for ((w, claimed), (job, _, at)) in waiting.into_iter().zip(outcome.items).zip(&items) {
        let Some(e) = w else {
            // Gave up before the answer came: a win goes back.
            if let Claimed::Won(lease) = claimed {
                settle_won(&store, job, &lease, *at, &node).await;
            }
            continue;
        };
        match claimed {
            Claimed::Won(lease) => {
                let slot = slots.pop().unwrap_or_default();
                let first = Some((Ok(AcquireOutcome::Acquired(lease)), sent));
                shared.tracker.spawn(e.occurrence.run_entered(
                    e.guard,
                    Some(slot),
                    e.owner_id,
                    first,
                ));
            }
            Claimed::Lost(lost) => {
                let _: Ending = e.occurrence.lost(lost);
            }
            Claimed::Skipped if again || !share => left.push(e),
            Claimed::Skipped => taken(&e),
            Claimed::Ask => {
                shared
                    .tracker
                    .spawn(e.occurrence.run_entered(e.guard, None, e.owner_id, None));
            }
        }
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
) -> Result<Option<ClaimOutcome>, StoreError> {
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
    call: impl std::future::Future<Output = Result<Option<ClaimOutcome>, StoreError>> + Send + 'static,
    items: Vec<ClaimJob>,
) {
    let (store, node) = (
        shared.supervisor.store().clone(),
        shared.supervisor.node().to_string(),
    );
    let shared = shared.clone();
    shared.tracker.clone().spawn(async move {
        match call.await {
            Ok(Some(outcome)) => {
                for ((job, _, at), claimed) in items.iter().zip(outcome.items) {
                    if let Claimed::Won(lease) = claimed {
                        settle_won(&store, job, &lease, *at, &node).await;
                    }
                }
            }
            Ok(None) => {}
            Err(_) => sweep(&shared, items.iter()),
        }
    });
}

/// A win nobody runs: logged as won, then given back with its occurrence.
async fn settle_won(
    store: &Arc<dyn crate::store::Store>,
    job: &Arc<crate::config::Job>,
    lease: &crate::store::Lease,
    at: chrono::DateTime<chrono::Utc>,
    node: &str,
) {
    events::lease_acquired(Some(job.name.as_str()), lease, node);
    fence::taken_over(store, Some(job.name.as_str()), lease, node);
    give_back_unused(store.as_ref(), job, lease, at).await;
}

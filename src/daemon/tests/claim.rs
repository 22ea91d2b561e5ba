//! Batch claims: what a claim wins, loses, skips or leaves undecided, and
//! how each occurrence follows that decision; claims that fail or answer
//! late; share and capacity.

use super::*;

/// `n` jobs like the rig's, named `c0`…, each with a lease row already
/// (acquired and released once, ad hoc), and their occurrences at the
/// instant, in this order.
async fn claimable(rig: &Rig, n: usize) -> Vec<Occurrence> {
    let mut out = Vec::new();
    for i in 0..n {
        let job = Arc::new(Job {
            name: Name::parse("job", &format!("c{i}")).unwrap(),
            resource: Name::parse("resource", &format!("c{i}")).unwrap(),
            ..(*rig.job).clone()
        });
        let AcquireOutcome::Acquired(l) = rig
            .store
            .acquire(&AcquireRequest {
                resource: &job.resource,
                lease: job.timing.lease,
                node: "setup",
                owner_id: OwnerId::fresh(),
                occurrence: None,
                next_occurrence: None,
                run: None,
            })
            .await
            .unwrap()
        else {
            panic!("setup acquire");
        };
        rig.store
            .release(&job.resource, l.owner_id, l.token)
            .await
            .unwrap();
        out.push(Occurrence {
            shared: rig.shared.clone(),
            job,
            at: epoch_wall(),
        });
    }
    out
}

/// Claims `due` and waits for everything it started.
async fn claim_all(rig: &Rig, due: Vec<Occurrence>) {
    tokio::time::timeout(LIMIT, crate::daemon::claim::claim(rig.shared.clone(), due))
        .await
        .expect("the claim ends");
    rig.settle().await;
}

/// One claim for the instant's three jobs: the two free ones run at once
/// under the tokens the claim won, the one held elsewhere is skipped as
/// `held`; no single acquire is made.
#[tokio::test(start_paused = true)]
async fn a_claim_runs_what_it_wins_and_settles_the_rest() {
    let rig = Rig::new();
    let due = claimable(&rig, 3).await;
    let held = rig
        .store
        .acquire(&AcquireRequest {
            resource: &due[1].job.resource,
            lease: ms(60_000),
            node: "node-b",
            owner_id: OwnerId::fresh(),
            occurrence: None,
            next_occurrence: None,
            run: None,
        })
        .await
        .unwrap();
    assert!(matches!(held, AcquireOutcome::Acquired(_)));
    claim_all(&rig, due).await;
    assert_eq!(
        rig.log(Op::Claim),
        log(&[(0, "limit 3: won 2, lost, won 2")])
    );
    assert_eq!(
        rig.log(Op::Acquire).len(),
        4,
        "only the setup's and node-b's acquires"
    );
    assert_eq!(
        started(&rig),
        [(ms(0), "c0".into(), 2), (ms(0), "c2".into(), 2)]
    );
    assert_eq!(
        rig.log(Op::Release).len(),
        3 + 2,
        "setup's three, then both runs'"
    );
}

/// Each occurrence follows what the claim decided for it, and only that:
/// a win runs under the claim's token with no single acquire (not ended as
/// a loss), a never-leased job's row is created and won by the claim alike,
/// a loss ends as `held` without running, and what the claim left
/// undecided (a paused job) is decided by the single acquire, which notes
/// the skip.
#[tokio::test(start_paused = true)]
async fn each_occurrence_follows_its_claims_decision() {
    let rig = Rig::new();
    let mut due = claimable(&rig, 2).await;
    let held = rig
        .store
        .acquire(&AcquireRequest {
            resource: &due[1].job.resource,
            lease: ms(60_000),
            node: "node-b",
            owner_id: OwnerId::fresh(),
            occurrence: None,
            next_occurrence: None,
            run: None,
        })
        .await
        .unwrap();
    assert!(matches!(held, AcquireOutcome::Acquired(_)));
    for name in ["fresh", "paused"] {
        due.push(Occurrence {
            shared: rig.shared.clone(),
            job: Arc::new(job_on(&rig, name, "0 * * * * *")),
            at: epoch_wall(),
        });
    }
    pause(&rig, "paused").await;
    let acquires_before = rig.log(Op::Acquire).len();
    let endings = tokio::time::timeout(LIMIT, claim(rig.shared.clone(), due))
        .await
        .expect("the claim ends");
    rig.settle().await;
    assert_eq!(
        endings,
        [
            Ending::Won,
            Ending::Skipped(SkipReason::Held),
            Ending::Won,
            Ending::Skipped(SkipReason::Paused)
        ],
        "won, lost, created and won, undecided then skipped by the single acquire"
    );
    assert_eq!(
        rig.log(Op::Claim),
        log(&[(0, "limit 4: won 2, lost, won 1, ask")])
    );
    assert_eq!(
        rig.log(Op::Acquire)
            .into_iter()
            .skip(acquires_before)
            .collect::<Vec<_>>(),
        log(&[(0, "paused first")]),
        "one single acquire: the undecided one's"
    );
    assert_eq!(
        started(&rig),
        [(ms(0), "c0".into(), 2), (ms(0), "fresh".into(), 1)]
    );
}

/// Pauses `job` indefinitely.
async fn pause(rig: &Rig, job: &str) {
    let pause = PauseInfo {
        job: job.into(),
        note: None,
        since: at(),
        until: None,
        paused_by: "ops@host".into(),
    };
    rig.store.pause(&pause, false).await.unwrap();
}

/// A claim that answers `Lost` (another node won this very instant, or
/// holds the lease) ends the occurrence there: no single acquire, and no
/// second claim of it, although the claim stopped at its share and its
/// second round claims what is left (a node that competed again for what
/// another node won would show as an acquire or in that second claim).
#[tokio::test(start_paused = true)]
async fn an_occurrence_the_claim_says_another_node_won_is_not_competed_for_again() {
    let rig = Rig::new();
    let due = claimable(&rig, 6).await;
    // node-b won c0's instant; node-b is live, so the claim takes its share
    // (6 items, 2 nodes: 4) and leaves the sixth for a second round.
    let AcquireOutcome::Acquired(_) = rig
        .store
        .acquire(&AcquireRequest {
            resource: &due[0].job.resource,
            lease: ms(60_000),
            node: "node-b",
            owner_id: OwnerId::fresh(),
            occurrence: Some(at()),
            next_occurrence: None,
            run: None,
        })
        .await
        .unwrap()
    else {
        panic!("node-b wins c0");
    };
    rig.store.node_seen("node-b");
    let acquires_before = rig.log(Op::Acquire).len();
    let endings = tokio::time::timeout(LIMIT, claim(rig.shared.clone(), due))
        .await
        .expect("the claim ends");
    rig.settle().await;
    assert_eq!(endings[0], Ending::Taken, "{endings:?}");
    assert!(
        endings[1..].iter().all(|e| *e == Ending::Won),
        "{endings:?}"
    );
    assert_eq!(
        rig.log(Op::Claim),
        log(&[
            (0, "limit 4: lost, won 2, won 2, won 2, won 2, skipped"),
            (200, "limit 1: won 2"),
        ]),
        "the second round claims only the skipped one"
    );
    assert_eq!(
        rig.log(Op::Acquire).len(),
        acquires_before,
        "no single acquire after the claim's answer"
    );
    assert!(
        started(&rig).iter().all(|(_, r, _)| r != "c0"),
        "c0 runs on node-b only"
    );
}

/// A job whose resource was never leased: its first occurrence is decided
/// by the claim alone, which creates the row and wins it (the first token),
/// and runs it; no single acquire is made.
#[tokio::test(start_paused = true)]
async fn a_never_leased_jobs_first_occurrence_is_decided_by_the_claim_alone() {
    let rig = Rig::new();
    assert!(rig.store.row("job").is_none(), "never leased");
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    assert_eq!(rig.log(Op::Claim), log(&[(0, "limit 1: won 1")]));
    assert!(rig.log(Op::Acquire).is_empty(), "no single acquire");
    assert_eq!(rig.runs(), [(ms(0), 1)]);
    let row = rig.store.row("job").unwrap();
    assert_eq!(row.last_occurrence, Some(at().0));
    assert!(row.released, "the run ended and released it");
    assert_eq!(rig.log(Op::Release), log(&[(2_000, "released 1")]));
}

/// A claim that fails: every occurrence acquires on its own, under the
/// owner id the claim used, after the first back-off, and runs.
#[tokio::test(start_paused = true)]
async fn a_failed_claim_falls_back_to_single_acquires() {
    let rig = Rig::new();
    let due = claimable(&rig, 2).await;
    rig.store.fault(Op::Claim, Fault::Fail, 1);
    claim_all(&rig, due).await;
    assert_eq!(rig.log(Op::Claim), log(&[(0, "failed")]));
    let singles: Vec<_> = rig.log(Op::Acquire).into_iter().skip(2).collect();
    // The claim counts as each occurrence's first failed attempt: the
    // retry follows after the first back-off.
    assert_eq!(singles, log(&[(100, "acquired 2"), (100, "acquired 2")]));
    assert_eq!(
        started(&rig),
        [(ms(100), "c0".into(), 2), (ms(100), "c1".into(), 2)]
    );
}

/// A claim whose statement committed but whose answer never came: the
/// store's 5 s limit ends the wait, and each occurrence's own acquire
/// (after the first back-off), under the same owner id, adopts the win
/// (same token) and runs it. No token is lost and nothing is given back.
#[tokio::test(start_paused = true)]
async fn a_claim_answered_too_late_is_adopted_by_the_single_acquire() {
    let rig = Rig::new();
    let due = claimable(&rig, 2).await;
    let gate = Gate::new();
    rig.store
        .fault(Op::Claim, Fault::Hang(gate.clone(), Commit::Before), 1);
    claim_all(&rig, due).await;
    let singles: Vec<_> = rig.log(Op::Acquire).into_iter().skip(2).collect();
    assert_eq!(singles, log(&[(5_100, "adopted 2"), (5_100, "adopted 2")]));
    assert_eq!(
        started(&rig),
        [(ms(5_100), "c0".into(), 2), (ms(5_100), "c1".into(), 2)]
    );
    assert!(rig.log(Op::GiveBack).is_empty());
    drop(gate);
}

/// A claim the store holds past the occurrences' give-up time (10 s) and
/// answers at 20 s, having won both: each occurrence ends at 10 s as an
/// unanswered acquire would; the claim is not dropped, its answer comes,
/// and exactly what it won goes back (with the tokens it won). Nothing is
/// swept and nothing is acquired alone: a late answer costs the store one
/// give-back per win, not a sweep and a retry per occurrence.
#[tokio::test(start_paused = true)]
async fn a_claim_answered_after_the_give_up_gives_back_what_it_won() {
    let rig = Rig::with_store(|s| s.with_call_timeout(None));
    let due = claimable(&rig, 2).await;
    let gate = Gate::new();
    rig.store
        .fault(Op::Claim, Fault::Hang(gate.clone(), Commit::Before), 1);
    tokio::spawn(async move {
        tokio::time::sleep(ms(20_000)).await;
        gate.open();
    });
    claim_all(&rig, due).await;
    assert!(rig.launcher.started().is_empty(), "nothing ran");
    assert_eq!(rig.log(Op::Acquire).len(), 2, "only the setup's acquires");
    assert_eq!(
        rig.log(Op::GiveBack),
        log(&[(20_000, "given_back 2"), (20_000, "given_back 2")])
    );
    assert!(
        rig.log(Op::Sweep).is_empty(),
        "an answered claim is not swept"
    );
    for i in 0..2 {
        let row = rig.store.row(&format!("c{i}")).unwrap();
        assert!(row.released);
        assert_eq!(
            row.last_occurrence,
            Some(at().0 - 1),
            "the instant is free again"
        );
    }
}

/// A claim that times out (15 s) after its occurrences gave up (10 s), and
/// whose statement commits later (18 s): nobody sees the wins, so both
/// owner ids are swept, together, in one store call per look: at 16 s
/// (nothing yet) and at 20 s (both given back).
#[tokio::test(start_paused = true)]
async fn a_failed_claim_nobody_waits_for_is_swept_in_one_call_per_look() {
    let rig = Rig::with_store(|s| s.with_call_timeout(Some(ms(15_000))));
    let due = claimable(&rig, 2).await;
    let gate = Gate::new();
    rig.store
        .fault(Op::Claim, Fault::Hang(gate.clone(), Commit::After), 1);
    tokio::spawn(async move {
        tokio::time::sleep(ms(18_000)).await;
        gate.open();
    });
    claim_all(&rig, due).await;
    assert!(rig.launcher.started().is_empty(), "nothing ran");
    assert_eq!(rig.log(Op::Sweep), log(&[(16_000, "2"), (20_000, "2")]));
    assert_eq!(
        rig.log(Op::GiveBack),
        log(&[
            (16_000, "refused"),
            (16_000, "refused"),
            (20_000, "given_back"),
            (20_000, "given_back")
        ])
    );
    for i in 0..2 {
        assert!(rig.store.row(&format!("c{i}")).unwrap().released);
    }
}

/// With another node live, a claim takes its share (4 jobs, 2 nodes: 3),
/// and since nobody took the fourth, a second round 200 ms later does.
#[tokio::test(start_paused = true)]
async fn a_claim_takes_its_share_then_what_the_others_left() {
    let rig = Rig::new();
    let due = claimable(&rig, 4).await;
    rig.store.node_seen("node-b");
    claim_all(&rig, due).await;
    assert_eq!(
        rig.log(Op::Claim),
        log(&[
            (0, "limit 3: won 2, won 2, won 2, skipped"),
            (200, "limit 1: won 2"),
        ])
    );
    assert_eq!(
        started(&rig),
        [
            (ms(0), "c0".into(), 2),
            (ms(0), "c1".into(), 2),
            (ms(0), "c2".into(), 2),
            (ms(200), "c3".into(), 2)
        ]
    );
}

/// `max_running = 2` and four jobs due: the claim wins two; the second
/// round finds the node full, so the other two wait for places and run
/// when the first two end (2 s).
#[tokio::test(start_paused = true)]
async fn a_claim_wins_no_more_than_the_free_capacity() {
    let mut rig = Rig::new();
    rig.shared.capacity = Capacity::new(Some(2));
    let due = claimable(&rig, 4).await;
    claim_all(&rig, due).await;
    assert_eq!(
        rig.log(Op::Claim),
        log(&[(0, "limit 2: won 2, won 2, skipped, skipped")])
    );
    assert_eq!(
        started(&rig),
        [
            (ms(0), "c0".into(), 2),
            (ms(0), "c1".into(), 2),
            (ms(2_000), "c2".into(), 2),
            (ms(2_000), "c3".into(), 2)
        ]
    );
}

//! The single acquire, on its own: what a claim leaves undecided (here,
//! mostly, a claim that answers `Ask`: [`Rig::asks`]). Retries with back-off, adoption of an
//! unanswered win, late wins given back, sweeps, clocks ahead and behind,
//! a lease held or taken, `overlap = "replace"`.

use super::*;

#[tokio::test(start_paused = true)]
async fn an_acquire_that_fails_then_succeeds_runs_the_job() {
    let rig = Rig::new();
    rig.asks();
    rig.store.fault(Op::Acquire, Fault::Fail, 2);
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    // Backoff 100 ms, then 200 ms.
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[(0, "failed"), (100, "failed"), (300, "acquired 1")])
    );
    assert_eq!(rig.runs(), [(ms(300), 1)]);
    assert_eq!(rig.log(Op::Release), log(&[(2_300, "released 1")]));
    assert!(rig.log(Op::GiveBack).is_empty(), "nothing to sweep");
}

#[tokio::test(start_paused = true)]
async fn a_failing_store_is_retried_with_backoff_until_the_give_up_time() {
    let rig = Rig::new();
    rig.asks();
    rig.store.fault(Op::Acquire, Fault::Fail, 100);
    assert_eq!(
        rig.run().await,
        Ending::Skipped(SkipReason::StoreUnavailable)
    );
    let times: Vec<_> = rig.log(Op::Acquire).into_iter().map(|(t, _)| t).collect();
    // 100, 200, 400, 800, 1600, 3200 ms; the next wait (5 s) would end
    // past the give-up time (10 s), so the occurrence is skipped at once.
    assert_eq!(
        times,
        [0, 100, 300, 700, 1_500, 3_100, 6_300].map(ms),
        "attempts"
    );
    assert!(rig.runs().is_empty());
    rig.settle().await;
}

/// `starting_deadline`: an occurrence fired after it (this daemon was
/// paused) is skipped without asking the store; one whose store fails past
/// it is skipped with `deadline` there instead of at the next instant.
#[tokio::test(start_paused = true)]
async fn a_starting_deadline_bounds_when_an_occurrence_may_start() {
    let mut rig = Rig::new();
    Arc::make_mut(&mut rig.job).starting_deadline = Some(ms(1_000));
    tokio::time::sleep(ms(1_500)).await;
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Deadline));
    assert!(rig.log(Op::Acquire).is_empty(), "no store call");

    let mut rig = Rig::new();
    rig.asks();
    Arc::make_mut(&mut rig.job).starting_deadline = Some(ms(1_000));
    rig.store.fault(Op::Acquire, Fault::Fail, 100);
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Deadline));
    let times: Vec<_> = rig.log(Op::Acquire).into_iter().map(|(t, _)| t).collect();
    // 100, 200, 400 ms; the next wait (800 ms) would end past the deadline.
    assert_eq!(times, [0, 100, 300, 700].map(ms), "attempts");
    assert!(rig.runs().is_empty());
    rig.settle().await;
}

/// The first attempt commits in the store, but its answer is lost: the
/// caller times out after 5 s. The retry, with the same owner id, adopts
/// that win instead of finding its own occurrence taken.
#[tokio::test(start_paused = true)]
async fn a_timed_out_acquire_that_committed_is_adopted_by_the_retry() {
    let rig = Rig::new();
    rig.asks();
    rig.store
        .fault(Op::Acquire, Fault::Hang(Gate::new(), Commit::Before), 1);
    assert_eq!(rig.run().await, Ending::Won);
    rig.settle().await;
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[
            (0, "acquired 1"),
            (0, "hung"),
            (5_000, "timed_out"),
            (5_100, "adopted 1"),
        ])
    );
    assert_eq!(rig.runs(), [(ms(5_100), 1)]);
    let job = &rig.launcher.started()[0];
    assert_eq!(
        job.owner_id,
        rig.store.row("job").unwrap().owner_id,
        "the job runs as the owner the store recorded"
    );
    assert_eq!(rig.log(Op::Release), log(&[(7_100, "released 1")]));
}

/// The store holds the statement past the give-up time (10 s) and then
/// commits it (at 20 s, still before the next instant), answering the
/// abandoned attempt: the win goes back with its occurrence, which another
/// node can then still take.
#[tokio::test(start_paused = true)]
async fn a_win_after_the_occurrence_was_abandoned_is_given_back_with_it() {
    let rig = Rig::with_store(|s| s.with_call_timeout(None));
    rig.asks();
    let gate = Gate::new();
    rig.store
        .fault(Op::Acquire, Fault::Hang(gate.clone(), Commit::After), 1);
    tokio::spawn(async move {
        tokio::time::sleep(ms(20_000)).await;
        gate.open();
    });
    assert_eq!(
        rig.run().await,
        Ending::Skipped(SkipReason::StoreUnavailable)
    );
    assert_eq!(Instant::now() - rig.t0, ms(10_000), "given up at 10 s");
    rig.settle().await;
    assert!(rig.runs().is_empty(), "the job never ran");
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[(0, "hung"), (20_000, "acquired 1")])
    );
    // The sweep (1 s and 5 s after giving up) found nothing yet; the
    // abandoned attempt's own answer gives the win back.
    assert_eq!(
        rig.log(Op::GiveBack),
        log(&[
            (11_000, "refused"),
            (15_000, "refused"),
            (20_000, "given_back 1")
        ])
    );
    let row = rig.store.row("job").unwrap();
    assert!(row.released);
    assert_eq!(row.last_occurrence, Some(at().0 - 1));
    assert!(matches!(
        rig.acquire_elsewhere(Some(at())).await,
        AcquireOutcome::Acquired(l) if l.token == Token::new(2)
    ));
}

/// Every attempt hangs and times out unanswered (5 s each), and both
/// statements commit later (at 10.5 s, the second adopting the first's
/// win). Nobody saw those answers: the sweep, 1 s after the occurrence
/// ended, finds the win by its owner id and gives it back.
#[tokio::test(start_paused = true)]
async fn a_win_nobody_saw_is_swept_back() {
    let rig = Rig::new();
    rig.asks();
    let gate = Gate::new();
    rig.store
        .fault(Op::Acquire, Fault::Hang(gate.clone(), Commit::After), 2);
    tokio::spawn(async move {
        tokio::time::sleep(ms(10_500)).await;
        gate.open();
    });
    assert_eq!(
        rig.run().await,
        Ending::Skipped(SkipReason::StoreUnavailable)
    );
    rig.settle().await;
    assert!(rig.runs().is_empty());
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[
            (0, "hung"),
            (5_000, "timed_out"),
            (5_100, "hung"),
            (10_100, "timed_out"),
            (10_500, "acquired 1"),
            (10_500, "adopted 1"),
        ])
    );
    assert_eq!(rig.log(Op::GiveBack), log(&[(11_000, "given_back")]));
    let row = rig.store.row("job").unwrap();
    assert!(row.released);
    assert_eq!(row.last_occurrence, Some(at().0 - 1));
}

/// SIGTERM while an acquire hangs: the occurrence stops at once, and the
/// win that arrives later goes back, without the job ever starting.
#[tokio::test(start_paused = true)]
async fn shutdown_mid_acquire_gives_a_late_win_back() {
    let rig = Rig::new();
    rig.asks();
    let gate = Gate::new();
    rig.store
        .fault(Op::Acquire, Fault::Hang(gate.clone(), Commit::After), 1);
    let shutdown = rig.shared.shutdown.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(1_000)).await;
        shutdown.cancel();
        tokio::time::sleep(ms(1_000)).await;
        gate.open();
    });
    assert_eq!(rig.run().await, Ending::Stopped);
    assert_eq!(Instant::now() - rig.t0, ms(1_000));
    rig.settle().await;
    assert!(rig.runs().is_empty());
    assert_eq!(rig.log(Op::GiveBack), log(&[(2_000, "given_back 1")]));
    assert!(rig.store.row("job").unwrap().released);
}

/// This host's clock runs 10 s ahead of the store's: the store refuses the
/// instant as not yet due, and the occurrence waits for the store's clock
/// to reach it, then runs.
#[tokio::test(start_paused = true)]
async fn a_clock_ahead_of_the_store_waits_for_it() {
    let rig = Rig::new();
    rig.store.set_offset_ms(-10_000);
    assert_eq!(rig.run().await, Ending::Won);
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[(0, "not_yet_due"), (10_001, "acquired 1")])
    );
    assert_eq!(rig.runs(), [(ms(10_001), 1)]);
    rig.settle().await;
}

#[tokio::test(start_paused = true)]
async fn a_clock_more_than_a_minute_ahead_skips() {
    let rig = Rig::new();
    rig.store.set_offset_ms(-61_000);
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::ClockAhead));
    rig.settle().await;
    assert_eq!(rig.log(Op::Acquire), log(&[(0, "not_yet_due")]));
    assert!(rig.runs().is_empty());
    assert!(rig.log(Op::GiveBack).is_empty(), "nothing to sweep");
}

/// This host's clock runs behind: by the store's clock the job's next
/// instant is already due, so this one is over for the fleet.
#[tokio::test(start_paused = true)]
async fn a_clock_behind_the_store_skips_a_superseded_instant() {
    let rig = Rig::new();
    rig.store.set_offset_ms(61_000);
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::ClockBehind));
    assert_eq!(rig.log(Op::Acquire), log(&[(0, "superseded")]));
    assert!(rig.store.row("job").is_none(), "nothing written");
    assert!(rig.runs().is_empty());
}

/// A statement the store holds until after the job's next instant is due
/// (by the store's clock) wins nothing: the store refuses it as superseded.
#[tokio::test(start_paused = true)]
async fn a_statement_delivered_after_the_next_instant_wins_nothing() {
    let rig = Rig::with_store(|s| s.with_call_timeout(None));
    rig.asks();
    let gate = Gate::new();
    rig.store
        .fault(Op::Acquire, Fault::Hang(gate.clone(), Commit::After), 1);
    // The statement waits past the next instant (60 s) but the occurrence
    // waits for it only until 10 s: skipped as store_unavailable.
    tokio::spawn(async move {
        tokio::time::sleep(ms(61_000)).await;
        gate.open();
    });
    assert_eq!(
        rig.run().await,
        Ending::Skipped(SkipReason::StoreUnavailable)
    );
    rig.settle().await;
    assert_eq!(
        rig.log(Op::Acquire),
        log(&[(0, "hung"), (61_000, "superseded")]),
        "a statement delivered after the next instant wins nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_in_progress_on_this_node_skips_without_asking_the_store() {
    let rig = Rig::new();
    let _running = rig.shared.running.enter("job", false).unwrap();
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Held));
    assert!(rig.log(Op::Acquire).is_empty());
}

/// `overlap = "replace"`: a lease held for an earlier instant is ended and
/// taken over with the next token, and its owner's renewal is refused from
/// then on; with the default `skip` the same lease makes the instant skip.
#[tokio::test(start_paused = true)]
async fn replace_takes_over_a_lease_held_for_an_earlier_instant() {
    for overlap in [Overlap::Skip, Overlap::Replace] {
        let mut rig = Rig::new();
        Arc::get_mut(&mut rig.job).unwrap().overlap = overlap;
        let earlier = StoreTime(at().0 - 60_000);
        let AcquireOutcome::Acquired(old) = rig.acquire_elsewhere(Some(earlier)).await else {
            panic!("acquire elsewhere");
        };
        let ending = rig.run().await;
        let renewed = rig
            .store
            .renew(
                &rig.job.resource,
                old.owner_id,
                old.token,
                rig.job.timing.lease,
            )
            .await
            .unwrap();
        if overlap == Overlap::Skip {
            assert_eq!(ending, Ending::Skipped(SkipReason::Held));
            assert!(rig.log(Op::Preempt).is_empty());
            assert!(
                matches!(renewed, RenewOutcome::Renewed { .. }),
                "{renewed:?}"
            );
            continue;
        }
        assert_eq!(ending, Ending::Won);
        assert_eq!(
            rig.log(Op::Preempt),
            log(&[(0, &format!("preempted {}", old.token))])
        );
        assert_eq!(
            rig.runs(),
            [(ms(0), old.token.next().get())],
            "the next token"
        );
        assert!(
            matches!(renewed, RenewOutcome::Refused(Refusal::NotOwner { current_token, .. }) if current_token == old.token.next()),
            "the replaced owner is refused: {renewed:?}"
        );
    }
}

/// `overlap = "replace"` never takes an instant from the node that won it:
/// a lease held for this very instant is the instant taken.
#[tokio::test(start_paused = true)]
async fn replace_leaves_a_lease_held_for_the_same_instant() {
    let mut rig = Rig::new();
    Arc::get_mut(&mut rig.job).unwrap().overlap = Overlap::Replace;
    let AcquireOutcome::Acquired(_) = rig.acquire_elsewhere(Some(at())).await else {
        panic!("acquire elsewhere");
    };
    assert_eq!(rig.run().await, Ending::Taken);
    assert!(rig.log(Op::Preempt).is_empty());
    assert!(rig.runs().is_empty());
}

/// On the node of the run it replaces, a `replace` instant does not skip
/// locally: it competes (and the store ends the earlier run's lease).
#[tokio::test(start_paused = true)]
async fn replace_competes_while_this_node_runs_the_job() {
    let mut rig = Rig::new();
    Arc::get_mut(&mut rig.job).unwrap().overlap = Overlap::Replace;
    let running = rig.shared.running.enter("job", false).unwrap();
    assert_eq!(rig.run().await, Ending::Won);
    assert_eq!(rig.log(Op::Acquire), log(&[(0, "acquired 1")]));
    drop(running);
    assert_eq!(rig.shared.running.len(), 0, "both left the running set");
}

#[tokio::test(start_paused = true)]
async fn a_lease_held_elsewhere_skips_and_a_taken_instant_is_taken() {
    let rig = Rig::new();
    let AcquireOutcome::Acquired(other) = rig.acquire_elsewhere(None).await else {
        panic!("acquire elsewhere");
    };
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Held));
    rig.store
        .release(&rig.job.resource, other.owner_id, other.token)
        .await
        .unwrap();

    let rig = Rig::new();
    let AcquireOutcome::Acquired(other) = rig.acquire_elsewhere(Some(at())).await else {
        panic!("acquire elsewhere");
    };
    rig.store
        .release(&rig.job.resource, other.owner_id, other.token)
        .await
        .unwrap();
    assert_eq!(rig.run().await, Ending::Taken);
    assert!(rig.runs().is_empty());
}

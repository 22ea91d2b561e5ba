//! `node.max_running`: a node at capacity waits for a place, and claims
//! nothing.

use super::*;

/// `node.max_running`: an occurrence on a node at capacity does not
/// compete; it waits for a run to end (first come, first served) and then
/// competes as usual, holding its place until its lease is released.
#[tokio::test(start_paused = true)]
async fn a_node_at_capacity_waits_for_a_run_to_end_then_competes() {
    let mut rig = Rig::new();
    rig.shared.capacity = Capacity::new(Some(1));
    let busy = rig.shared.capacity.try_take().expect("a free slot");
    let capacity = rig.shared.capacity.clone();
    tokio::spawn(async move {
        tokio::time::sleep(ms(3_000)).await;
        drop(busy);
    });
    // While the run holds the only slot, nothing else gets one.
    let probe = tokio::spawn(async move {
        tokio::time::sleep(ms(4_000)).await;
        let during = capacity.try_take().is_none();
        tokio::time::sleep(ms(2_000)).await;
        (during, capacity.try_take().is_some())
    });
    assert_eq!(rig.run().await, Ending::Won);
    assert_eq!(rig.log(Op::Acquire), log(&[(3_000, "acquired 1")]));
    assert_eq!(rig.runs(), [(ms(3_000), 1)]);
    assert_eq!(rig.log(Op::Release), log(&[(5_000, "released 1")]));
    assert_eq!(
        probe.await.unwrap(),
        (true, true),
        "held during the run (3 s to 5 s), free after it"
    );
}

/// A node that stays at capacity until the occurrence is no longer worth
/// starting (a lease length after the instant) skips it with reason
/// `capacity`, without a single statement: the other nodes take it.
#[tokio::test(start_paused = true)]
async fn a_node_at_capacity_until_the_give_up_time_skips_without_claiming() {
    let mut rig = Rig::new();
    rig.shared.capacity = Capacity::new(Some(2));
    let _busy = (
        rig.shared.capacity.try_take().unwrap(),
        rig.shared.capacity.try_take().unwrap(),
    );
    let t0 = Instant::now();
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Capacity));
    assert_eq!(t0.elapsed(), ms(10_000));
    assert!(
        rig.log(Op::Acquire).is_empty(),
        "a node at capacity does not claim"
    );
    assert!(rig.runs().is_empty());

    // With a `starting_deadline` before that, the skip is the deadline's.
    let mut rig = Rig::new();
    Arc::get_mut(&mut rig.job).unwrap().starting_deadline = Some(ms(4_000));
    rig.shared.capacity = Capacity::new(Some(1));
    let _busy = rig.shared.capacity.try_take().unwrap();
    assert_eq!(rig.run().await, Ending::Skipped(SkipReason::Deadline));
    assert!(rig.log(Op::Acquire).is_empty());
}

/// Two jobs due at the same instant on a node with `max_running = 1`: one
/// runs, the other waits for it to end and then runs; a trigger polled
/// meanwhile is not claimed (it stays pending for another daemon).
#[tokio::test(start_paused = true)]
async fn max_running_one_runs_same_instant_jobs_one_after_the_other() {
    let mut rig = Rig::new();
    rig.shared.capacity = Capacity::new(Some(1));
    let other = Arc::new(Job {
        name: Name::parse("job", "other").unwrap(),
        resource: Name::parse("resource", "other").unwrap(),
        ..(*rig.job).clone()
    });
    let occurrence = |job: &Arc<Job>| Occurrence {
        shared: rig.shared.clone(),
        job: job.clone(),
        at: epoch_wall(),
    };
    let first = tokio::spawn(claim(rig.shared.clone(), vec![occurrence(&rig.job)]));
    tokio::task::yield_now().await;
    let second = tokio::spawn(claim(rig.shared.clone(), vec![occurrence(&other)]));
    let trigger = TriggerInfo {
        id: "t1".into(),
        job: "job".into(),
        requested_at: at(),
        requested_by: "ops@host".into(),
        state: TriggerState::Pending,
        node: None,
        token: None,
        detail: None,
    };
    rig.store.request_trigger(&trigger).await.unwrap();
    tokio::time::sleep(ms(1_000)).await;
    let jobs: HashMap<String, Arc<Job>> = [("job".to_string(), rig.job.clone())].into();
    crate::daemon::fleet::poll_triggers(rig.shared.clone(), jobs).await;
    let t = rig.store.trigger("t1").await.unwrap().unwrap();
    assert_eq!(
        t.state,
        crate::domain::TriggerState::Pending,
        "not claimed at capacity"
    );
    assert_eq!(first.await.unwrap(), [Ending::Won]);
    assert_eq!(second.await.unwrap(), [Ending::Won]);
    assert_eq!(rig.runs(), [(ms(0), 1), (ms(2_000), 1)]);
    let starts: Vec<_> = rig
        .launcher
        .started()
        .iter()
        .map(|j| j.resource.clone())
        .collect();
    assert_eq!(starts, ["job", "other"]);
}

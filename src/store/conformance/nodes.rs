//! The registry of nodes: beats, published definitions, live nodes for a
//! claim's share, pruning.

use std::time::Duration;

use super::kit::*;
use super::Subject;
use crate::store::*;

/// The registry of nodes: a beat writes the whole row with the store's
/// clock (started_at kept once given), definitions are replaced as a whole
/// and read with or without their text, a stopped node does not count for
/// a claim's share (the one "live"), a row a claim made has the columns'
/// defaults, and pruning forgets rows and their definitions.
async fn case_nodes_register_publish_and_are_forgotten(subject: Subject) {
    let s = subject.store.as_ref();
    let before = s.now().await.unwrap();
    let beat = |state: NodeState, started_at: Option<StoreTime>, running: u32| NodeBeat {
        node: "node-x",
        hostname: "host-x",
        pid: 4242,
        version: "9.9.9",
        config_digest: "abc",
        started_at,
        state,
        running,
    };
    let t1 = s
        .beat(&beat(NodeState::Running, None, 0))
        .await
        .unwrap()
        .now;
    assert!(t1 >= before, "the store's clock");
    let row = |nodes: Vec<NodeInfo>, node: &str| nodes.into_iter().find(|n| n.node == node);
    let x = row(s.nodes().await.unwrap(), "node-x").expect("registered");
    assert_eq!(
        (
            x.hostname.as_str(),
            x.pid,
            x.version.as_str(),
            x.config_digest.as_str()
        ),
        ("host-x", 4242, "9.9.9", "abc")
    );
    assert_eq!(
        (x.started_at, x.last_seen, x.state.as_str(), x.running),
        (t1, t1, "running", 0)
    );
    assert!(x.live(t1));
    let t2 = s
        .beat(&beat(NodeState::Draining, Some(t1), 2))
        .await
        .unwrap()
        .now;
    let x = row(s.nodes().await.unwrap(), "node-x").unwrap();
    assert_eq!(
        (x.started_at, x.last_seen, x.state.as_str(), x.running),
        (t1, t2, "draining", 2)
    );

    // Definitions as the daemon passes them: borrowed.
    let def = |job: &'static str, d: &'static str| {
        let json: &'static str = match job {
            "a" => "{\"name\":\"a\"}",
            _ => "{\"name\":\"b\"}",
        };
        (job, d, json)
    };
    s.publish_jobs("node-x", &[def("a", "d1"), def("b", "d2")])
        .await
        .unwrap();
    let digests = s.published_jobs("node-x", false).await.unwrap();
    assert_eq!(
        digests
            .iter()
            .map(|p| (p.job.as_str(), p.digest.as_str(), p.definition.is_none()))
            .collect::<Vec<_>>(),
        [("a", "d1", true), ("b", "d2", true)]
    );
    let full = s.published_jobs("node-x", true).await.unwrap();
    assert_eq!(full[1].definition.as_deref(), Some("{\"name\":\"b\"}"));
    s.publish_jobs("node-x", &[def("a", "d3")]).await.unwrap();
    let digests = s.published_jobs("node-x", false).await.unwrap();
    assert_eq!(digests.len(), 1);
    assert_eq!(
        (
            digests[0].job.as_str(),
            digests[0].digest.as_str(),
            digests[0].node.as_str()
        ),
        ("a", "d3", "node-x")
    );
    assert!(s.published_jobs("node-y", false).await.unwrap().is_empty());

    if subject.kind.keeps_nodes() {
        // The claim share counts the same live nodes: stopped, node-x does
        // not count; running, it does.
        s.beat(&beat(NodeState::Stopped, Some(t1), 0))
            .await
            .unwrap();
        let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
        let rs = released_rows(s, "nodes-share", 8).await;
        let out = claim(s, "claimer", &claim_items(&rs[..4], t), 100, true).await;
        assert_eq!(out.limit, 5, "alone: a stopped node does not count");
        s.beat(&beat(NodeState::Running, Some(t1), 0))
            .await
            .unwrap();
        let out = claim(s, "claimer", &claim_items(&rs[4..], t), 100, true).await;
        assert_eq!(out.limit, 3, "node-x is live again: 4 / 2 + 1");
        // A row only a claim wrote (as a daemon of the previous release
        // does) reads with the columns' defaults.
        let c = row(s.nodes().await.unwrap(), "claimer").expect("the claim marked its node");
        assert_eq!(
            (
                c.hostname.as_str(),
                c.pid,
                c.config_digest.as_str(),
                c.state.as_str()
            ),
            ("", 0, "", "running")
        );
    }

    // A node publishes before its first beat writes its row: a prune in
    // between keeps its definitions.
    s.publish_jobs("node-new", &[def("a", "d1")]).await.unwrap();
    let last = s.now().await.unwrap();
    assert_eq!(
        s.prune_nodes(StoreTime(t1.0)).await.unwrap(),
        0,
        "seen since"
    );
    assert!(s.prune_nodes(StoreTime(last.0 + 1)).await.unwrap() >= 1);
    assert!(row(s.nodes().await.unwrap(), "node-x").is_none());
    assert!(
        s.published_jobs("node-x", true).await.unwrap().is_empty(),
        "its definitions went too"
    );
    assert_eq!(s.published_jobs("node-new", false).await.unwrap().len(), 1);
}

/// A beat answers, with the store's time it wrote, exactly the rows
/// [`NodeInfo::live`] at that time (what the drift check reads, in the
/// same statement on PostgreSQL and MySQL): its own row as written, the
/// other live nodes by node id, not a node that said `stopped` (the beating
/// node's own `stopped` beat included), and no longer a node once it is
/// [`NODE_LIVE`] past its last beat.
async fn case_a_beat_answers_its_time_and_the_live_nodes(subject: Subject) {
    let s = subject.store.as_ref();
    let beat = |node: &'static str, state: NodeState, started_at: Option<StoreTime>| NodeBeat {
        node,
        hostname: "host",
        pid: 7,
        version: "9.9.9",
        config_digest: "digest",
        started_at,
        state,
        running: 1,
    };
    // What `nodes` holds live at `now`: the answer must be the same rows.
    let live_at = |nodes: Vec<NodeInfo>, now: StoreTime| -> Vec<NodeInfo> {
        nodes.into_iter().filter(|n| n.live(now)).collect()
    };
    let before = s.now().await.unwrap();
    let b = s
        .beat(&beat("node-b", NodeState::Running, None))
        .await
        .unwrap();
    assert!(b.now >= before, "the store's clock");
    assert_eq!(b.live.len(), 1, "{:?}", b.live);
    let own = &b.live[0];
    assert_eq!(
        (
            own.node.as_str(),
            own.started_at,
            own.last_seen,
            own.state.as_str()
        ),
        ("node-b", b.now, b.now, "running"),
        "its own row as written, the first beat's time as its start"
    );
    assert_eq!(b.live, live_at(s.nodes().await.unwrap(), b.now));

    let a = s
        .beat(&beat("node-a", NodeState::Draining, Some(before)))
        .await
        .unwrap();
    assert!(a.now >= b.now);
    assert_eq!(
        a.live.iter().map(|n| n.node.as_str()).collect::<Vec<_>>(),
        ["node-a", "node-b"],
        "by node id"
    );
    assert_eq!(
        (
            a.live[0].started_at,
            a.live[0].last_seen,
            a.live[0].state.as_str()
        ),
        (before, a.now, "draining")
    );
    assert_eq!(a.live[1].last_seen, b.now, "another node as it last beat");
    assert_eq!(a.live, live_at(s.nodes().await.unwrap(), a.now));

    // A node that says it stopped is not live, in its own answer either;
    // with nobody live the answer still has the time.
    let c = s
        .beat(&beat("node-c", NodeState::Stopped, Some(before)))
        .await
        .unwrap();
    assert_eq!(
        c.live.iter().map(|n| n.node.as_str()).collect::<Vec<_>>(),
        ["node-a", "node-b"]
    );
    assert_eq!(c.live, live_at(s.nodes().await.unwrap(), c.now));
    s.beat(&beat("node-a", NodeState::Stopped, Some(before)))
        .await
        .unwrap();
    s.beat(&beat("node-b", NodeState::Stopped, Some(b.now)))
        .await
        .unwrap();
    let none = s
        .beat(&beat("node-c", NodeState::Stopped, Some(before)))
        .await
        .unwrap();
    assert!(none.live.is_empty(), "{:?}", none.live);
    assert!(none.now >= c.now);

    // node-b beats again, node-a no more: node-a is answered until
    // NODE_LIVE past its last beat, and not from then on (a wait on that
    // condition, with a deadline well past NODE_LIVE).
    let last_a = s
        .beat(&beat("node-a", NodeState::Running, Some(before)))
        .await
        .unwrap()
        .now;
    let deadline = tokio::time::Instant::now() + NODE_LIVE * 4;
    loop {
        let b = s
            .beat(&beat("node-b", NodeState::Running, Some(b.now)))
            .await
            .unwrap();
        let has_a = b.live.iter().any(|n| n.node == "node-a");
        assert!(b.live.iter().any(|n| n.node == "node-b"));
        let within = b.now.0 - last_a.0 < millis(NODE_LIVE);
        assert_eq!(
            has_a,
            within,
            "node-a at {} ms after its beat",
            b.now.0 - last_a.0
        );
        if !has_a {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node-a still answered live {} ms after its last beat",
            b.now.0 - last_a.0
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A node with thousands of jobs publishes them all (in several
/// statements on the SQL stores: at most `PUBLISH_ROWS` rows and about
/// `PUBLISH_BYTES` a statement), each row its own, in one transaction that
/// replaces what the node published before and no other node's rows.
async fn case_thousands_of_definitions_are_published_whole(subject: Subject) {
    let s = subject.store.as_ref();
    let (node, other) = ("node-many".to_string(), "node-many-other".to_string());
    // 1,234 jobs: two full statements of 500 rows and a short one; three
    // definitions of 400 KB make their statements end early by size.
    let jobs: Vec<(String, String, String)> = (0..1234)
        .map(|i| {
            let body = if i % 500 == 7 {
                "x".repeat(400 * 1024)
            } else {
                format!("command {i}")
            };
            (
                format!("job-{i:05}"),
                format!("{i:064x}"),
                format!("{{\"name\":\"job-{i:05}\",\"body\":\"{body}\"}}"),
            )
        })
        .collect();
    let jobs: Vec<crate::store::Definition<'_>> = jobs
        .iter()
        .map(|(j, d, def)| (j.as_str(), d.as_str(), def.as_str()))
        .collect();
    s.publish_jobs(&other, &jobs[..1]).await.unwrap();
    s.publish_jobs(&node, &jobs[..3]).await.unwrap();
    s.publish_jobs(&node, &jobs).await.unwrap();
    let got = s.published_jobs(&node, true).await.unwrap();
    assert_eq!(
        got.len(),
        jobs.len(),
        "every row, and the earlier three once"
    );
    for (p, (job, digest, definition)) in got.iter().zip(&jobs) {
        assert_eq!(
            (p.node.as_str(), p.job.as_str(), p.digest.as_str()),
            (node.as_str(), *job, *digest)
        );
        assert_eq!(p.definition.as_deref(), Some(*definition), "{job}");
    }
    s.publish_jobs(&node, &jobs[1230..]).await.unwrap();
    let got = s.published_jobs(&node, false).await.unwrap();
    assert_eq!(
        got.iter().map(|p| p.job.as_str()).collect::<Vec<_>>(),
        ["job-01230", "job-01231", "job-01232", "job-01233"]
    );
    let kept = s.published_jobs(&other, false).await.unwrap();
    assert_eq!(kept.len(), 1, "another node's definitions stay");
    s.publish_jobs(&node, &[]).await.unwrap();
    assert!(s.published_jobs(&node, false).await.unwrap().is_empty());
}

conformance!(
    [case_thousands_of_definitions_are_published_whole],
    isolated: [
        case_nodes_register_publish_and_are_forgotten,
        case_a_beat_answers_its_time_and_the_live_nodes,
    ]
);

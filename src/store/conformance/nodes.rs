//! The registry of nodes: beats, published definitions, live nodes for a
//! claim's share, pruning.

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
    let t1 = s.beat(&beat(NodeState::Running, None, 0)).await.unwrap();
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
        .unwrap();
    let x = row(s.nodes().await.unwrap(), "node-x").unwrap();
    assert_eq!(
        (x.started_at, x.last_seen, x.state.as_str(), x.running),
        (t1, t2, "draining", 2)
    );

    let def = |job: &str, d: &str| {
        (
            job.to_string(),
            d.to_string(),
            format!("{{\"name\":\"{job}\"}}"),
        )
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

conformance!(
    [],
    isolated: [
        case_nodes_register_publish_and_are_forgotten,
    ]
);

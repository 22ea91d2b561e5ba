//! Stale records: a rejection and a lost lease are recorded with every field,
//! stamped by the store's clock, listed oldest first.

use std::time::Duration;

use uuid::Uuid;

use super::kit::*;
use super::Subject;
use crate::store::*;

/// A stale rejection is recorded with every field, returned in the put
/// outcome and by `stale(None)` and `stale(Some(since))`, oldest first, and
/// by `latest_stale`, newest first and bounded.
async fn case_stale_rejection_recorded(subject: Subject) {
    let s = subject.store.as_ref();
    let (r, ls) = generations(s, "stale-rec", 2).await;
    let k = name("key", "report.csv");
    let new_owner = ls[1].owner_id.to_string();
    assert_accepted(
        &Put::new(&r, &k, b"new", Token::new(2), &new_owner)
            .send(s)
            .await,
        "owner 2",
    );
    let old_owner = ls[0].owner_id.to_string();
    let op = Uuid::new_v4();
    let since = s.now().await.unwrap();
    let mut put = Put::new(&r, &k, b"old", Token::new(1), &old_owner);
    put.job = Some("nightly-report");
    put.stage = "upload";
    put.operation_id = op;
    let rec = rejection(put.send(s).await, "old owner");
    let until = s.now().await.unwrap();
    let expected = StaleRecord {
        at: rec.at,
        kind: StaleKind::WriteRejected,
        reason: RejectReason::Stale.into(),
        resource: r.to_string(),
        key: Some("report.csv".to_string()),
        owner_id: Some(oid(&old_owner)),
        token: Token::new(1),
        accepted_token: Some(Token::new(2)),
        node: NODE.to_string(),
        job: Some("nightly-report".to_string()),
        stage: Stage::Label("upload".to_string()),
        operation_id: op.to_string(),
    };
    assert_eq!(rec, expected);
    assert!(
        since <= rec.at && rec.at <= until,
        "stamped by the store's clock: {since:?} <= {:?} <= {until:?}",
        rec.at
    );
    assert_eq!(
        value_of(s, &r, &k).await,
        Some((b"new".to_vec(), Token::new(2)))
    );

    // A second rejection, later: listing is oldest first.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let rec2 = rejection(
        Put::new(&r, &k, b"older", Token::new(1), &old_owner)
            .send(s)
            .await,
        "again",
    );
    assert!(rec2.at >= rec.at);
    assert_eq!(stale_of(s, None, &r).await, vec![rec.clone(), rec2.clone()]);
    assert_eq!(
        stale_of(s, Some(since), &r).await,
        vec![rec.clone(), rec2.clone()]
    );
    assert_eq!(
        stale_of(s, Some(rec.at), &r).await,
        vec![rec.clone(), rec2.clone()]
    );
    assert_eq!(stale_of(s, Some(rec2.at), &r).await.last(), Some(&rec2));
    let later = StoreTime(rec2.at.0 + 1);
    assert!(
        stale_of(s, Some(later), &r).await.is_empty(),
        "since excludes older"
    );

    // The latest, newest first and bounded (other tests may add records
    // of their own to a shared store meanwhile: only ours are compared).
    let latest: Vec<StaleRecord> = s
        .latest_stale(since, 10_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|x| x.resource == r.as_str())
        .collect();
    assert_eq!(latest, vec![rec2.clone(), rec.clone()]);
    let one = s.latest_stale(since, 1).await.unwrap();
    assert_eq!(one.len(), 1, "bounded: {one:?}");
    assert!(one[0].at >= rec2.at, "the newest: {one:?}");
    assert!(s.latest_stale(later, 0).await.unwrap().is_empty());
}

/// `record_stale` of a lost lease round-trips through `stale`.
async fn case_record_stale_lease_lost(subject: Subject) {
    let s = subject.store.as_ref();
    let r = resource("lost");
    let l = must_acquire(s, &r).await;
    let owner = l.owner_id.to_string();
    let op = Uuid::new_v4().to_string();
    let since = s.now().await.unwrap();
    let rec = s
        .record_stale(&NewStaleRecord {
            kind: StaleKind::LeaseLost,
            reason: LossReason::RenewRefused.into(),
            resource: r.as_str(),
            key: None,
            owner_id: Some(oid(&owner)),
            token: l.token,
            accepted_token: Some(l.token.next()),
            node: "node-b",
            job: Some("job-x"),
            stage: Stage::Renew,
            operation_id: &op,
        })
        .await
        .expect("record_stale reaches the store");
    let expected = StaleRecord {
        at: rec.at,
        kind: StaleKind::LeaseLost,
        reason: LossReason::RenewRefused.into(),
        resource: r.to_string(),
        key: None,
        owner_id: Some(oid(&owner)),
        token: l.token,
        accepted_token: Some(l.token.next()),
        node: "node-b".to_string(),
        job: Some("job-x".to_string()),
        stage: Stage::Renew,
        operation_id: op,
    };
    assert_eq!(rec, expected);
    assert!(rec.at >= since);
    assert_eq!(stale_of(s, None, &r).await, vec![expected.clone()]);
    assert_eq!(stale_of(s, Some(since), &r).await, vec![expected]);
}

conformance!([case_stale_rejection_recorded, case_record_stale_lease_lost]);

//! The fencing proxy's admission: only issued tokens, never below the highest
//! admitted, one linearisable step.

use std::sync::Arc;

use tokio::sync::Barrier;
use uuid::Uuid;

use super::kit::*;
use super::Subject;
use crate::names::Name;
use crate::store::*;

async fn admit(store: &dyn Store, r: &Name, token: Token) -> AdmitOutcome {
    store
        .admit(&AdmitRequest {
            resource: r,
            token,
            node: NODE,
            operation_id: Uuid::new_v4(),
        })
        .await
        .expect("admit reaches the store")
}

/// The refusal `out` must be: reason and the token that beat it.
fn refused(out: AdmitOutcome, what: &str) -> (String, Option<Token>) {
    match out {
        AdmitOutcome::Refused(rec) => {
            assert_eq!(
                (rec.kind, rec.stage.as_str(), rec.key.as_deref()),
                (StaleKind::WriteRejected, "proxy", None),
                "{what}: {rec:?}"
            );
            (rec.reason.to_string(), rec.accepted_token)
        }
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

/// The proxy admits only tokens the store issued for the resource, and
/// never one below the highest it admitted; every refusal is recorded.
async fn case_proxy_admits_issued_tokens_never_older_ones(subject: Subject) {
    let s = subject.store.as_ref();
    let (r, gens) = generations(s, "proxy-admit", 2).await;
    let (old, new) = (gens[0].token, gens[1].token);
    let never = resource("proxy-never-leased");
    assert_eq!(
        refused(admit(s, &never, Token::new(1)).await, "never leased"),
        ("forged".into(), None)
    );
    assert_eq!(
        refused(admit(s, &r, new.next()).await, "above the fence"),
        ("forged".into(), Some(new))
    );
    assert_eq!(
        refused(admit(s, &r, Token::new(0)).await, "not positive"),
        ("forged".into(), Some(new))
    );
    // Both were issued; the older passes until the newer was admitted.
    assert_eq!(admit(s, &r, old).await, AdmitOutcome::Admitted);
    assert_eq!(admit(s, &r, old).await, AdmitOutcome::Admitted);
    assert_eq!(admit(s, &r, new).await, AdmitOutcome::Admitted);
    assert_eq!(admit(s, &r, new).await, AdmitOutcome::Admitted);
    assert_eq!(
        refused(admit(s, &r, old).await, "older than the admitted"),
        ("stale".into(), Some(new))
    );
    // Another resource's higher token counts nothing here.
    let (other, other_gens) = generations(s, "proxy-other", 3).await;
    assert_eq!(
        refused(admit(s, &other, other_gens[2].token.next()).await, "forged"),
        ("forged".into(), Some(other_gens[2].token))
    );
    assert_eq!(
        admit(s, &other, other_gens[0].token).await,
        AdmitOutcome::Admitted
    );
    assert_eq!(admit(s, &r, new).await, AdmitOutcome::Admitted);
    let recs = stale_of(s, None, &r).await;
    let got: Vec<_> = recs
        .iter()
        .map(|x| {
            (
                x.reason.as_str(),
                x.token,
                x.accepted_token,
                x.stage.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("forged", new.next(), Some(new), "proxy"),
            ("forged", Token::new(0), Some(new), "proxy"),
            ("stale", old, Some(new), "proxy"),
        ]
    );
    assert!(recs.iter().all(|x| x.node == NODE && x.owner_id.is_none()));
    assert_eq!(stale_of(s, None, &never).await.len(), 1);
}

/// Many admissions of an old token race one of a newer token: once the
/// newer one was admitted, no admission of the old one that starts later
/// passes (the check and the raise are one linearisable step).
async fn case_proxy_concurrent_admissions(subject: Subject) {
    const CHECKERS: usize = 6;
    let s = subject.store.as_ref();
    let (r, gens) = generations(s, "proxy-race", 2).await;
    let (old, new) = (gens[0].token, gens[1].token);
    assert_eq!(admit(s, &r, old).await, AdmitOutcome::Admitted);
    let newer_admitted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let old_admitted = Arc::new(tokio::sync::watch::Sender::new(0usize));
    let barrier = Arc::new(Barrier::new(CHECKERS + 1));
    let mut tasks = Vec::new();
    for c in 0..CHECKERS {
        let (store, r, flag, count, barrier) = (
            subject.store.clone(),
            r.clone(),
            newer_admitted.clone(),
            old_admitted.clone(),
            barrier.clone(),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut admitted = 0u32;
            loop {
                let after = flag.load(std::sync::atomic::Ordering::SeqCst);
                match admit(store.as_ref(), &r, old).await {
                    AdmitOutcome::Admitted => {
                        assert!(
                            !after,
                            "checker {c}: old token admitted after the newer one"
                        );
                        admitted += 1;
                        count.send_modify(|n| *n += 1);
                        // An in-memory store answers without yielding: let
                        // the other tasks run between two admissions, as a
                        // round trip to a server does.
                        tokio::task::yield_now().await;
                    }
                    AdmitOutcome::Refused(rec) => {
                        assert_eq!(
                            (rec.reason.as_str(), rec.accepted_token),
                            ("stale", Some(new))
                        );
                        return admitted;
                    }
                }
            }
        }));
    }
    barrier.wait().await;
    // The newer token arrives while the checkers are busy admitting.
    old_admitted
        .subscribe()
        .wait_for(|n| *n >= CHECKERS * 2)
        .await
        .expect("the checkers count");
    assert_eq!(admit(s, &r, new).await, AdmitOutcome::Admitted);
    newer_admitted.store(true, std::sync::atomic::Ordering::SeqCst);
    for task in tasks {
        task.await.expect("checker task");
    }
    assert_eq!(admit(s, &r, new).await, AdmitOutcome::Admitted);
}

conformance!([
    case_proxy_admits_issued_tokens_never_older_ones,
    case_proxy_concurrent_admissions,
]);

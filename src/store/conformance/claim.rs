//! Batch claims: a claim wins exactly as the single acquire would, once under
//! concurrency, skipping locked rows, within its share of the live nodes.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Barrier;

use super::kit::*;
use super::{Kind, Subject};
use crate::names::Name;
use crate::store::*;

/// A batch claim wins each item exactly as the single acquire would: the
/// next token, the run recorded with the claim's owner id (so that a later
/// single acquire of the same owner adopts it), a takeover reported; it
/// loses to a holder or an instant already taken and writes nothing then;
/// creates and wins a resource never leased (the epoch's first token, as
/// the acquire's first acquisition); and leaves to the single acquire what
/// it does not decide (paused, not yet due, superseded). A limit stops it
/// after that many wins, the rest `Skipped`.
async fn case_claim_wins_like_the_acquire(subject: Subject) {
    let s = subject.store.as_ref();
    let now = s.now().await.unwrap();
    let t = StoreTime(now.0 / 1000 * 1000 - 60_000);
    let free = released_rows(s, "claim-free", 3).await;
    // Expired without a release: the claim takes it over.
    let expired = resource("claim-expired");
    let gone = acquired(
        acquire_at(s, &expired, Duration::from_millis(1), None).await,
        "expiring",
    );
    while row(s, &expired).await.held {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held = resource("claim-held");
    let holder = must_acquire(s, &held).await;
    let taken = resource("claim-taken");
    let t_taken = acquired(acquire_as(s, &taken, "node-z", Some(t)).await, "taken");
    must_release(s, &t_taken).await;
    let (absent, paused) = (
        resource("claim-absent"),
        released_rows(s, "claim-paused", 1).await,
    );
    s.pause(
        &PauseInfo {
            job: paused[0].to_string(),
            note: None,
            since: now,
            until: None,
            paused_by: "ops@host".into(),
        },
        false,
    )
    .await
    .unwrap();
    let (early, late) = (
        released_rows(s, "claim-early", 1).await,
        released_rows(s, "claim-late", 1).await,
    );

    let mut rs: Vec<Name> = free.clone();
    rs.extend([expired.clone(), held.clone(), taken.clone(), absent.clone()]);
    rs.extend(paused.iter().cloned());
    let mut items = claim_items(&rs, t);
    let mut more = claim_items(&early, StoreTime(now.0 + 3_600_000));
    more.extend(claim_items(&late, t).into_iter().map(|mut i| {
        i.next_occurrence = Some(StoreTime(t.0 + 1_000));
        i
    }));
    items.extend(more);
    let before: Vec<Token> = {
        let mut v = Vec::new();
        for r in &rs {
            v.push(if *r == absent {
                Token::default()
            } else {
                row(s, r).await.token
            });
        }
        v
    };
    let out = claim(s, "node-c", &items, 100, false).await;
    for (i, r) in free.iter().enumerate() {
        let Claimed::Won(l) = &out.items[i] else {
            panic!("{r}: {:?}", out.items[i]);
        };
        assert_eq!(l.token, before[i].next(), "the next token");
        assert_eq!(l.owner_id, items[i].owner_id);
        assert_eq!(l.taken_over, None, "released before: no takeover");
        let runs = runs_of(s, r.as_str()).await;
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!(
            (
                runs[0].token,
                runs[0].scheduled_at,
                runs[0].trigger.as_str(),
                runs[0].node.as_str()
            ),
            (l.token, Some(t), "schedule", "node-c")
        );
        let info = row(s, r).await;
        assert_eq!((info.held, info.last_occurrence), (true, Some(t)));
    }
    let Claimed::Won(over) = &out.items[3] else {
        panic!("expired: {:?}", out.items[3]);
    };
    let prev = over
        .taken_over
        .as_ref()
        .expect("an expired lease is taken over");
    assert_eq!(
        (prev.owner_id.as_str(), prev.token),
        (gone.owner_id.as_str(), gone.token)
    );
    assert!(
        matches!(&out.items[4], Claimed::Lost(AcquireOutcome::Held { owner_id: o, token, .. })
            if *o == holder.owner_id && *token == holder.token),
        "held: {:?}",
        out.items[4]
    );
    assert!(
        matches!(
            out.items[5],
            Claimed::Lost(AcquireOutcome::OccurrenceTaken { .. })
        ),
        "taken: {:?}",
        out.items[5]
    );
    let Claimed::Won(created) = &out.items[6] else {
        panic!("absent: {:?}", out.items[6]);
    };
    let first = s.epoch().await.unwrap().lowest_token;
    assert_eq!(
        (created.token, created.taken_over.as_ref()),
        (first, None),
        "a new row starts at the epoch's first token"
    );
    assert_eq!(
        runs_of(s, absent.as_str())
            .await
            .iter()
            .map(|r| (r.token, r.scheduled_at, r.owner_id))
            .collect::<Vec<_>>(),
        [(first, Some(t), items[6].owner_id)]
    );
    for (i, what) in [(7, "paused"), (8, "not yet due"), (9, "superseded")] {
        assert_eq!(out.items[i], Claimed::Ask, "{what}");
    }
    // Nothing written for what it did not win.
    assert_eq!(row(s, &held).await.token, holder.token);
    assert_eq!(row(s, &taken).await.token, t_taken.token);
    assert!(runs_of(s, paused[0].as_str()).await.is_empty());

    // A single acquire of the same owner and instant adopts the win.
    let Claimed::Won(w0) = &out.items[0] else {
        unreachable!()
    };
    let again = acquired(
        acquire_run(
            s,
            &free[0],
            free[0].as_str(),
            items[0].owner_id,
            Some(t),
            StartedBy::Schedule,
        )
        .await,
        "adopt",
    );
    assert_eq!(again.token, w0.token, "adopted, not a new token");
    assert_eq!(runs_of(s, free[0].as_str()).await.len(), 1);

    // The same instant again: all taken, nothing changes.
    let again = claim_items(&free, t);
    let out2 = claim(s, "node-d", &again, 100, false).await;
    assert!(
        out2.items.iter().all(|c| matches!(c, Claimed::Lost(_))),
        "{:?}",
        out2.items
    );

    // The limit: two of three, the third skipped and left.
    let fresh = released_rows(s, "claim-limit", 3).await;
    let items = claim_items(&fresh, t);
    let out = claim(s, "node-e", &items, 2, false).await;
    assert!(matches!(out.items[0], Claimed::Won(_)) && matches!(out.items[1], Claimed::Won(_)));
    assert_eq!(out.items[2], Claimed::Skipped);
    assert!(out.left_some(), "the claim stopped at its limit");
    assert!(!row(s, &fresh[2]).await.held, "the third is untouched");
    let rest = claim_items(&fresh[2..], t);
    let out = claim(s, "node-f", &rest, 1, false).await;
    assert!(matches!(out.items[0], Claimed::Won(_)));
    assert!(!out.left_some());
}

/// Concurrent claims of the same instant from eight nodes: every item is
/// won exactly once, with one run recorded; a row another transaction has
/// locked is skipped at once instead of waited for.
async fn case_claim_once_under_concurrency_and_skips_locked_rows(subject: Subject) {
    let s = subject.store.as_ref();
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let rs = released_rows(s, "claim-race", 12).await;
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = Vec::new();
    for n in 0..8 {
        let (store, rs, barrier) = (subject.store.clone(), rs.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            // Each node in its own order.
            let mut mine = rs.clone();
            mine.rotate_left(n * 3 % rs.len());
            let items = claim_items(&mine, t);
            barrier.wait().await;
            let out = claim(store.as_ref(), &format!("race-{n}"), &items, 100, false).await;
            mine.iter()
                .zip(out.items)
                .filter_map(|(r, c)| match c {
                    Claimed::Won(l) => Some((r.to_string(), l.token)),
                    Claimed::Lost(_) | Claimed::Skipped => None,
                    Claimed::Ask => panic!("{r}: nothing to ask about"),
                })
                .collect::<Vec<_>>()
        }));
    }
    let mut wins = Vec::new();
    for t in tasks {
        wins.extend(t.await.unwrap());
    }
    wins.sort();
    let names: Vec<String> = wins.iter().map(|(r, _)| r.clone()).collect();
    let mut expected: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
    expected.sort();
    assert_eq!(names, expected, "every item won exactly once");
    for r in &rs {
        assert_eq!(runs_of(s, r.as_str()).await.len(), 1, "{r}: one run");
    }

    // A row locked by another transaction is skipped, not waited for
    // (SQLite locks the whole database for a writer, MemoryStore runs each
    // call whole: nothing to skip).
    if !subject.kind.locks_rows() {
        return;
    }
    let locked = released_rows(s, "claim-locked", 2).await;
    let items = claim_items(&locked, t);
    let url = s.url().expose();
    let out = if subject.kind == Kind::MySql {
        claim_while_locked::<sqlx::MySql>(s, url, "?", &locked[0], &items).await
    } else {
        claim_while_locked::<sqlx::Postgres>(s, url, "$1", &locked[0], &items).await
    };
    assert_eq!(out.items[0], Claimed::Skipped, "locked elsewhere");
    assert!(matches!(out.items[1], Claimed::Won(_)));
    assert!(
        !row(s, &locked[0]).await.held,
        "the locked row is untouched"
    );
}

/// Claims `items` (as `node-l`) while a transaction of its own, on a raw
/// connection to `url`, holds the row lock of `locked`'s lease (`param`:
/// the backend's first placeholder).
async fn claim_while_locked<DB>(
    s: &dyn Store,
    url: &str,
    param: &str,
    locked: &Name,
    items: &[ClaimItem<'_>],
) -> ClaimOutcome
where
    DB: sqlx::Database,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let pool = sqlx::pool::PoolOptions::<DB>::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("a raw connection");
    let mut tx = pool.begin().await.unwrap();
    let lock = format!("SELECT 1 FROM fencecron_leases WHERE resource = {param} FOR UPDATE");
    sqlx::query(&lock)
        .bind(locked.as_str())
        .execute(&mut *tx)
        .await
        .unwrap();
    let out = claim(s, "node-l", items, 100, false).await;
    tx.rollback().await.unwrap();
    out
}

/// The share: a claim bounded by its share takes at most `ceil(items /
/// live nodes) + 1`, the live nodes being those that claimed lately (on a
/// database of its own, so other cases' nodes do not count); the
/// request's own limit (free capacity) still applies below that.
async fn case_claim_takes_its_share_of_the_live_nodes(subject: Subject) {
    let s = subject.store.as_ref();
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let rs = released_rows(s, "claim-share", 12).await;
    let items = claim_items(&rs[..4], t);
    let out = claim(s, "share-a", &items, 100, true).await;
    if !subject.kind.keeps_nodes() {
        // One host: no live nodes kept, no share; the limit alone bounds.
        assert_eq!(out.limit, 100);
        assert!(out.items.iter().all(|c| matches!(c, Claimed::Won(_))));
        return;
    }
    assert_eq!(out.limit, 5, "alone: everything (4 / 1 + 1)");
    assert!(out.items.iter().all(|c| matches!(c, Claimed::Won(_))));
    let items = claim_items(&rs[4..8], t);
    let out = claim(s, "share-b", &items, 100, true).await;
    assert_eq!(out.limit, 3, "two live nodes: 4 / 2 + 1");
    assert_eq!(
        out.items
            .iter()
            .filter(|c| matches!(c, Claimed::Won(_)))
            .count(),
        3
    );
    assert_eq!(out.items[3], Claimed::Skipped);
    assert!(out.left_some());
    // Without the share (a second round), the rest; capacity still bounds.
    let items = claim_items(&rs[7..12], t);
    let out = claim(s, "share-b", &items, 2, false).await;
    assert_eq!(out.limit, 2);
    assert!(matches!(out.items[0], Claimed::Won(_)) && matches!(out.items[1], Claimed::Won(_)));
    assert_eq!(out.items[2], Claimed::Skipped);
}

/// A claim creates and wins the rows of resources never leased, as the
/// single acquire's first acquisition would: in the node's order among the
/// existing rows and within the limit, each at the epoch's first token (so
/// above every token before an epoch advance), the instant its last one,
/// the run recorded with the claim's owner id (a single acquire of the same
/// owner adopts it); a new row past the limit is `Skipped` and left
/// uncreated for another look; a paused job's never-leased resource is not
/// won but left to the single acquire (`Ask`), which notes its skip as the
/// first. Runs on a database of its own (it advances the epoch).
async fn case_claim_creates_never_leased_rows(subject: Subject) {
    let s = subject.store.as_ref();
    let now = s.now().await.unwrap();
    let t = StoreTime(now.0 / 1000 * 1000 - 60_000);
    let start = s.epoch().await.unwrap();
    let old = released_rows(s, "claim-new-old", 1).await;
    let highest = row(s, &old[0]).await.token;
    let adv = s.advance_epoch().await.unwrap();
    assert!(adv.lowest_token > highest, "{start:?} -> {adv:?}");
    // Never leased: new, old (a free row), new, new, then a paused job's.
    let (n0, n1, n2) = (
        resource("claim-new"),
        resource("claim-new"),
        resource("claim-new"),
    );
    let paused = resource("claim-new-paused");
    s.pause(
        &PauseInfo {
            job: paused.to_string(),
            note: None,
            since: now,
            until: None,
            paused_by: "ops@host".into(),
        },
        false,
    )
    .await
    .unwrap();
    let rs = vec![
        n0.clone(),
        old[0].clone(),
        n1.clone(),
        n2.clone(),
        paused.clone(),
    ];
    let items = claim_items(&rs, t);
    let out = claim(s, "node-n", &items, 3, false).await;
    let won: Vec<&Lease> = out.items[..3]
        .iter()
        .map(|c| match c {
            Claimed::Won(l) => l,
            other => panic!("within the limit: {other:?}"),
        })
        .collect();
    assert_eq!(
        won.iter().map(|l| l.token).collect::<Vec<_>>(),
        [adv.lowest_token, adv.lowest_token, adv.lowest_token],
        "new rows and the old one's next generation: the new epoch's first token"
    );
    for (i, r) in [(0, &n0), (2, &n1)] {
        assert_eq!(won[i].owner_id, items[i].owner_id);
        assert_eq!(won[i].taken_over, None, "nothing to take over");
        let info = row(s, r).await;
        assert_eq!(
            (
                info.held,
                info.token,
                info.last_occurrence,
                info.node.as_str()
            ),
            (true, adv.lowest_token, Some(t), "node-n"),
            "{r}"
        );
        let runs = runs_of(s, r.as_str()).await;
        assert_eq!(
            runs.iter()
                .map(|r| (
                    r.token,
                    r.scheduled_at,
                    r.trigger.as_str(),
                    r.node.as_str(),
                    r.owner_id
                ))
                .collect::<Vec<_>>(),
            [(
                won[i].token,
                Some(t),
                "schedule",
                "node-n",
                items[i].owner_id
            )],
            "{r}: the run recorded like any claim win"
        );
    }
    assert_eq!(out.items[3], Claimed::Skipped, "a new row past the limit");
    assert!(out.left_some(), "the claim stopped at its limit");
    assert_eq!(out.items[4], Claimed::Ask, "a paused job's new row");
    let listed: Vec<String> = s
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.resource)
        .collect();
    for r in [&n2, &paused] {
        assert!(!listed.contains(&r.to_string()), "{r}: not created");
    }
    assert!(runs_of(s, paused.as_str()).await.is_empty());

    // The single acquire of the claim's owner adopts the new row's win.
    let again = acquired(
        acquire_run(
            s,
            &n0,
            n0.as_str(),
            items[0].owner_id,
            Some(t),
            StartedBy::Schedule,
        )
        .await,
        "adopt",
    );
    assert_eq!(again.token, won[0].token, "adopted, not a new token");
    assert_eq!(runs_of(s, n0.as_str()).await.len(), 1);
    // The paused one's skip is the single acquire's to note, as before.
    let skipped = acquire_run(
        s,
        &paused,
        paused.as_str(),
        items[4].owner_id,
        Some(t),
        StartedBy::Schedule,
    )
    .await;
    assert!(
        matches!(skipped, AcquireOutcome::Paused { first: true, .. }),
        "{skipped:?}"
    );
    // What was skipped for the limit, a second round creates.
    let rest = claim_items(&rs[3..4], t);
    let out = claim(s, "node-n", &rest, 1, false).await;
    assert!(
        matches!(&out.items[0], Claimed::Won(l) if l.token == adv.lowest_token),
        "{:?}",
        out.items[0]
    );
}

/// Concurrent claims of the same instant's never-leased resources from
/// eight nodes, each in its own order (so their creations overlap in
/// opposite orders): each row is created once, by one winner with one run;
/// every other claimer answers `Lost` or `Ask` (never a second win), and no
/// claim fails (no deadlock between creators).
async fn case_claim_creates_a_new_row_once_under_concurrency(subject: Subject) {
    let s = subject.store.as_ref();
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let rs: Vec<Name> = (0..12).map(|_| resource("claim-new-race")).collect();
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = Vec::new();
    for n in 0..8 {
        let (store, rs, barrier) = (subject.store.clone(), rs.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let mut mine = rs.clone();
            if n % 2 == 1 {
                mine.reverse();
            }
            mine.rotate_left(n * 3 % rs.len());
            let items = claim_items(&mine, t);
            barrier.wait().await;
            let out = claim(store.as_ref(), &format!("new-race-{n}"), &items, 100, false).await;
            mine.iter()
                .zip(out.items)
                .filter_map(|(r, c)| match c {
                    Claimed::Won(l) => Some((r.to_string(), l.token)),
                    Claimed::Lost(_) | Claimed::Ask => None,
                    Claimed::Skipped => panic!("{r}: nothing held it, no limit reached"),
                })
                .collect::<Vec<_>>()
        }));
    }
    let mut wins = Vec::new();
    for t in tasks {
        wins.extend(t.await.unwrap());
    }
    wins.sort();
    let names: Vec<String> = wins.iter().map(|(r, _)| r.clone()).collect();
    let mut expected: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
    expected.sort();
    assert_eq!(names, expected, "every new row won exactly once");
    for (r, token) in &wins {
        let runs = runs_of(s, r).await;
        assert_eq!(runs.len(), 1, "{r}: one run");
        assert_eq!(runs[0].token, *token);
    }
}

conformance!(
    [
        case_claim_wins_like_the_acquire,
        case_claim_once_under_concurrency_and_skips_locked_rows,
        case_claim_creates_a_new_row_once_under_concurrency,
    ],
    isolated: [
        case_claim_takes_its_share_of_the_live_nodes,
        case_claim_creates_never_leased_rows,
    ]
);

//! The run history: a winning acquire records its run, `finish_run` and
//! `finish_and_release` end it once, retention keeps the newest.

use super::kit::*;
use super::Subject;
use crate::store::*;

/// `finish_and_release`: a run's end and its lease's release in one
/// operation. The owner's own lease: the row finished once and the lease
/// released (free for the next instant, token kept); a wrong owner or a
/// lease taken over since: refused, naming the new holder, and the row
/// still finished by its own token.
async fn case_finish_and_release_ends_the_run_and_frees_the_lease(subject: Subject) {
    let s = subject.store.as_ref();
    let (r, job) = (resource("finish-release"), unique("job"));
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let a = acquired(
        acquire_run(s, &r, &job, OwnerId::fresh(), Some(t), StartedBy::Schedule).await,
        "a",
    );
    assert!(
        matches!(
            s.finish_and_release(&r, OwnerId::fresh(), &end(&a, "failed", "x"))
                .await
                .unwrap(),
            (true, ReleaseOutcome::Refused(Refusal::NotOwner { .. }))
        ),
        "another owner: the row is finished by its token, the lease stays"
    );
    assert!(row(s, &r).await.held, "still held");
    assert_eq!(
        s.finish_and_release(&r, a.owner_id, &end(&a, "succeeded", "out"))
            .await
            .unwrap(),
        (false, ReleaseOutcome::Released),
        "the row ends once; the lease goes back"
    );
    let listed = row(s, &r).await;
    assert_eq!((listed.held, listed.token), (false, a.token));
    let run = &runs_of(s, &job).await[0];
    assert_eq!(
        (run.outcome.as_str(), run.exit_code, run.output.as_deref()),
        ("failed", Some(3), Some("x"))
    );

    // Taken over after the expiry: refused, and the new holder's lease stays.
    let t2 = StoreTime(t.0 + 1_000);
    let b = acquired(
        acquire_run(s, &r, &job, OwnerId::fresh(), Some(t2), StartedBy::Schedule).await,
        "b",
    );
    assert!(matches!(
        s.finish_and_release(&r, a.owner_id, &end(&a, "succeeded", ""))
            .await
            .unwrap(),
        (false, ReleaseOutcome::Refused(_))
    ));
    assert_eq!(row(s, &r).await.token, b.token);
    assert!(row(s, &r).await.held);
    assert_eq!(
        s.finish_and_release(&r, b.owner_id, &end(&b, "succeeded", ""))
            .await
            .unwrap(),
        (true, ReleaseOutcome::Released)
    );
}

/// The run history: a winning acquire records the run in the same
/// operation (a loser, and a retry adopting its own win, add nothing); the
/// run reads `running` while its lease is held, `unknown` once the lease is
/// gone without an end, and its end once `finish_run` wrote it (once).
/// A win given back unused leaves no run; manual runs have no instant.
async fn case_run_history_records_winners_only(subject: Subject) {
    let s = subject.store.as_ref();
    let (r, job) = (resource("history"), unique("job"));
    let t = StoreTime(s.now().await.unwrap().0 / 1000 * 1000 - 60_000);
    let owner = OwnerId::fresh();
    let a = acquired(
        acquire_run(s, &r, &job, owner, Some(t), StartedBy::Schedule).await,
        "a",
    );
    let lost = acquire_run(s, &r, &job, OwnerId::fresh(), Some(t), StartedBy::Schedule).await;
    assert!(!matches!(lost, AcquireOutcome::Acquired(_)), "{lost:?}");
    let adopted = acquired(
        acquire_run(s, &r, &job, owner, Some(t), StartedBy::Schedule).await,
        "retry",
    );
    assert_eq!(adopted.token, a.token);
    let runs = runs_of(s, &job).await;
    assert_eq!(runs.len(), 1, "one row per run: {runs:?}");
    let run = &runs[0];
    assert_eq!(
        (
            run.resource.as_str(),
            run.scheduled_at,
            run.trigger.as_str(),
            run.node.as_str(),
            run.owner_id.as_str(),
            run.token,
            run.outcome.as_str(),
            run.finished_at,
        ),
        (
            r.as_str(),
            Some(t),
            "schedule",
            NODE,
            owner.to_string().as_str(),
            a.token,
            "running",
            None
        )
    );
    let started = run.started_at;
    assert!(s
        .finish_run(&end(&a, "failed", "last\nlines\n"))
        .await
        .unwrap());
    assert!(
        !s.finish_run(&end(&a, "succeeded", "")).await.unwrap(),
        "a run ends once"
    );
    must_release(s, &a).await;
    let run = &runs_of(s, &job).await[0];
    assert_eq!(
        (
            run.outcome.as_str(),
            run.exit_code,
            run.signal.as_deref(),
            run.duration_ms,
            run.finished_at,
            run.output.as_deref()
        ),
        (
            "failed",
            Some(3),
            None,
            Some(1_500),
            Some(StoreTime(started.0 + 1_600)),
            Some("last\nlines\n")
        )
    );

    // Released without an end (its node died and a successor gave the lease
    // back): unknown, not running forever. Manual: no instant.
    let m = acquired(
        acquire_run(s, &r, &job, OwnerId::fresh(), None, StartedBy::Manual).await,
        "manual",
    );
    assert_eq!(runs_of(s, &job).await[0].outcome.as_str(), "running");
    must_release(s, &m).await;
    let newest = &runs_of(s, &job).await[0];
    assert_eq!(
        (
            newest.token,
            newest.trigger.as_str(),
            newest.scheduled_at,
            newest.outcome.as_str()
        ),
        (m.token, "manual", None, "unknown")
    );

    // Given back unused: no run.
    let t2 = StoreTime(t.0 + 1_000);
    let g = acquired(
        acquire_run(s, &r, &job, OwnerId::fresh(), Some(t2), StartedBy::Schedule).await,
        "given back",
    );
    let out = s
        .give_back(&r, g.owner_id, Some(g.token), t2)
        .await
        .unwrap();
    assert_eq!(out, ReleaseOutcome::Released);
    let tokens: Vec<Token> = runs_of(s, &job).await.iter().map(|r| r.token).collect();
    assert_eq!(
        tokens,
        [m.token, a.token],
        "newest first, no given-back run"
    );

    // Filters: outcome, limit, since.
    let failed = s
        .runs(&RunQuery {
            job: Some(&job),
            outcome: Some(RunOutcome::Failed),
            limit: 10,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(
        failed.iter().map(|r| r.token).collect::<Vec<_>>(),
        [a.token]
    );
    let one = s
        .runs(&RunQuery {
            job: Some(&job),
            limit: 1,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    let later = s
        .runs(&RunQuery {
            job: Some(&job),
            since: Some(StoreTime(s.now().await.unwrap().0 + 60_000)),
            limit: 10,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert!(later.is_empty(), "{later:?}");

    // A retry: an ad-hoc acquire recording the instant it retries.
    let rt = acquired(
        s.acquire(&AcquireRequest {
            resource: &r,
            lease: LEASE,
            node: NODE,
            owner_id: OwnerId::fresh(),
            occurrence: None,
            next_occurrence: None,
            run: Some(RunStart {
                job: &job,
                started_by: StartedBy::Retry,
                scheduled_at: Some(t),
            }),
        })
        .await
        .unwrap(),
        "retry",
    );
    let newest = &runs_of(s, &job).await[0];
    assert_eq!(
        (newest.token, newest.trigger.as_str(), newest.scheduled_at),
        (rt.token, "retry", Some(t))
    );
    must_release(s, &rt).await;
}

/// Retention, in one statement for every job: the newest `keep` runs of
/// each job stay, older ones go, and all runs past the age limit. (On a
/// database of its own: it prunes every job.)
async fn case_run_history_prune_keeps_the_newest(subject: Subject) {
    let s = subject.store.as_ref();
    let (r, job, other) = (resource("prune"), unique("job"), unique("other"));
    let mut tokens = Vec::new();
    for _ in 0..5 {
        let l = acquired(
            acquire_run(s, &r, &job, OwnerId::fresh(), None, StartedBy::Manual).await,
            "run",
        );
        s.finish_run(&end(&l, "succeeded", "")).await.unwrap();
        must_release(s, &l).await;
        tokens.push(l.token);
    }
    let o = acquired(
        acquire_run(
            s,
            &resource("prune-other"),
            &other,
            OwnerId::fresh(),
            None,
            StartedBy::Manual,
        )
        .await,
        "other",
    );
    let long_ago = StoreTime(0);
    assert_eq!(s.prune_runs(2, long_ago).await.unwrap(), 3);
    let kept: Vec<Token> = runs_of(s, &job).await.iter().map(|r| r.token).collect();
    assert_eq!(kept, [tokens[4], tokens[3]]);
    assert_eq!(
        runs_of(s, &other).await.len(),
        1,
        "another job's newest stays"
    );
    assert_eq!(s.prune_runs(2, long_ago).await.unwrap(), 0);
    let future = StoreTime(s.now().await.unwrap().0 + 60_000);
    assert_eq!(s.prune_runs(2, future).await.unwrap(), 3, "age");
    assert!(runs_of(s, &job).await.is_empty());
    assert!(runs_of(s, &other).await.is_empty());
    must_release(s, &o).await;
}

conformance!(
    [
        case_finish_and_release_ends_the_run_and_frees_the_lease,
        case_run_history_records_winners_only,
    ],
    isolated: [
        case_run_history_prune_keeps_the_newest,
    ]
);

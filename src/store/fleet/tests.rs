use super::publish::{publish, PUBLISH_BYTES};
use super::*;

#[test]
fn placeholders_follow_the_backend() {
    let text = "a = $1 AND b = $2 OR c = $10";
    assert_eq!(placeholders(Backend::Postgres, text), text);
    assert_eq!(
        placeholders(Backend::Sqlite, text),
        "a = ?1 AND b = ?2 OR c = ?10"
    );
    assert_eq!(
        placeholders(Backend::MySql, text),
        "a = ? AND b = ? OR c = ?"
    );
    // Every statement binds its parameters once each, in order, so that
    // MySQL's positional `?` means the same.
    for sql in [
        FINISH_RUN,
        FORGET_UNRUN,
        RUNS,
        PRUNE_RUNS,
        PAUSE,
        PAUSE_MYSQL,
        PAUSE_OF,
        RESUME,
        PAUSES,
        REQUEST_TRIGGER,
        TRIGGER,
        PENDING_TRIGGERS,
        CLAIM_TRIGGER,
        SETTLE_TRIGGER,
        CANCEL_TRIGGER,
        PRUNE_TRIGGERS,
        PRUNE_PAUSES,
        BEAT,
        BEAT_MYSQL,
        NODES,
        LIVE_NODES,
        UNPUBLISH,
        publish(3).as_str(),
        PUBLISHED_DIGESTS,
        PUBLISHED_DEFINITIONS,
        PRUNE_NODES,
        PRUNE_NODE_JOBS,
        PRUNE_STALE,
        PRUNE_VALUES,
        FORGET,
        LEASE_EXISTS,
    ] {
        let mut expected = 1;
        let mut rest = sql;
        while let Some(i) = rest.find('$') {
            let digits: String = rest[i + 1..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            assert_eq!(digits, expected.to_string(), "{sql}");
            expected += 1;
            rest = &rest[i + 1 + digits.len()..];
        }
    }
}

/// Definitions go [`PUBLISH_ROWS`] to a statement, fewer where
/// [`PUBLISH_BYTES`] is reached first, and a row larger than that alone;
/// every row once, in order.
#[test]
fn definitions_are_published_in_bounded_statements() {
    let row = |i: usize, len: usize| (format!("j{i}"), "d".repeat(64), "x".repeat(len));
    let sizes = |owned: &[(String, String, String)]| {
        let jobs: Vec<crate::store::Definition<'_>> = owned
            .iter()
            .map(|(j, d, def)| (j.as_str(), d.as_str(), def.as_str()))
            .collect();
        let chunks: Vec<_> = publish_chunks(&jobs).collect();
        let flat: Vec<_> = chunks.iter().flat_map(|c| c.iter()).collect();
        assert_eq!(flat, jobs.iter().collect::<Vec<_>>());
        chunks.iter().map(|c| c.len()).collect::<Vec<_>>()
    };
    let small: Vec<_> = (0..1234).map(|i| row(i, 300)).collect();
    assert_eq!(sizes(&small), [500, 500, 234]);
    assert!(sizes(&[]).is_empty());
    let mut big = small[..10].to_vec();
    big[3] = row(3, PUBLISH_BYTES / 2);
    big[4] = row(4, PUBLISH_BYTES / 2);
    big[7] = row(7, 2 * PUBLISH_BYTES);
    assert_eq!(sizes(&big), [4, 3, 1, 2]);
    assert_eq!(
        publish(2),
        "INSERT INTO fencecron_node_jobs (node, job, digest, definition) VALUES ($1, $2, $3, $4), ($5, $6, $7, $8)"
    );
    // SQLite's parameters unnumbered (sqlx would look each name up).
    assert_eq!(
        publish_in(Backend::Sqlite, 1),
        "INSERT INTO fencecron_node_jobs (node, job, digest, definition) VALUES (?, ?, ?, ?)"
    );
}

#[test]
fn an_unfinished_run_is_running_only_under_its_own_held_lease() {
    let (me, other) = (OwnerId::fresh(), OwnerId::fresh());
    let state = |lease| run_state(None, Token::new(7), me, lease, 1000);
    assert_eq!(state(Some((Token::new(7), me, 2000))), RunState::Running);
    assert_eq!(state(Some((Token::new(7), me, 1000))), RunState::Unknown);
    assert_eq!(state(Some((Token::new(7), other, 2000))), RunState::Unknown);
    assert_eq!(state(Some((Token::new(8), other, 2000))), RunState::Unknown);
    assert_eq!(state(None), RunState::Unknown);
    assert_eq!(
        run_state(
            Some("failed".into()),
            Token::new(7),
            me,
            Some((Token::new(7), me, 2000)),
            1000
        ),
        RunState::Ended(RunOutcome::Failed)
    );
}

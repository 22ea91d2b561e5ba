//! Publishing a node's job definitions: a few multi-row statements
//! instead of one per job.

use super::super::sql::placeholders;
use super::super::Backend;

/// A node's definitions, [`PUBLISH_ROWS`] rows a statement at most: the
/// statement for `rows` rows, `($1, $2, $3, $4), ($5, ...)` (four
/// parameters a row, each used once and in order).
pub(super) fn publish(rows: usize) -> String {
    let mut text =
        String::from("INSERT INTO fencecron_node_jobs (node, job, digest, definition) VALUES ");
    for row in 0..rows {
        let n = row * 4;
        if row > 0 {
            text.push_str(", ");
        }
        text.push_str(&format!("(${}, ${}, ${}, ${})", n + 1, n + 2, n + 3, n + 4));
    }
    text
}

/// [`publish`] in `backend`'s placeholders; on SQLite the anonymous `?`
/// (each parameter is used once and in order): sqlx looks up the name of
/// every numbered parameter (`?1`, `?2`, …), which SQLite finds by a scan
/// of all of the statement's names, so 2,000 numbered parameters cost 2
/// million steps a statement (a third of a daemon's start with 10,000
/// jobs), and anonymous ones none.
pub(super) fn publish_in(backend: Backend, rows: usize) -> String {
    let positional = match backend {
        Backend::Sqlite => Backend::MySql,
        other => other,
    };
    placeholders(positional, &publish(rows))
}

/// The most rows one publishing statement inserts: 2,000 parameters, far
/// below each server's limit on a statement's parameters (PostgreSQL and
/// MySQL 65,535, SQLite 32,766), so 10,000 jobs are 20 statements rather
/// than 10,000.
pub(in crate::store) const PUBLISH_ROWS: usize = 500;

// Four parameters a row, under the smallest of the three limits (SQLite's).
const _: () = assert!(PUBLISH_ROWS * 4 <= 32_766);

/// The most bytes of definitions one publishing statement carries, so
/// that jobs with long commands or environments stay far below MySQL's
/// `max_allowed_packet` (16 MiB by default on MariaDB, 64 MiB on MySQL 8)
/// however many fit in [`PUBLISH_ROWS`].
pub(in crate::store) const PUBLISH_BYTES: usize = 1024 * 1024;

/// How `jobs` are split into publishing statements: consecutive runs of at
/// most [`PUBLISH_ROWS`] rows and, unless a single row is larger,
/// [`PUBLISH_BYTES`] of text.
pub(in crate::store) fn publish_chunks<'a, 'b>(
    jobs: &'a [crate::store::Definition<'b>],
) -> impl Iterator<Item = &'a [crate::store::Definition<'b>]> {
    let mut rest = jobs;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let mut n = 0;
        for (job, digest, definition) in rest.iter().take(PUBLISH_ROWS) {
            bytes += job.len() + digest.len() + definition.len();
            if n > 0 && bytes > PUBLISH_BYTES {
                break;
            }
            n += 1;
        }
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        Some(chunk)
    })
}

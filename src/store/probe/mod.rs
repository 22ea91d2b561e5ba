//! `fencecron check --connect`: what a store says about itself, read
//! without changing it. [`probe`] connects once (under one time limit for
//! the whole look), and reports whether fencecron's migrations are applied
//! or can be, which privileges the daemon needs that the user lacks, and
//! how far the store's clock is from this host's. Nothing is created,
//! migrated or written; on SQLite a database file that does not exist yet
//! is not created.

use std::time::{Duration, Instant};

use sqlx::migrate::{MigrateError, Migrator};
use sqlx::{Connection, MySql, Postgres, Row};

use super::diagnose::{first_connection, host_port, migrate_message, sqlite_path};
use super::migrator::{self, Plan};
use super::mysql::MySqlStore;
use super::postgres::{first_connection as pg_first_connection, Hosts, PostgresStore};
use super::{migrate_error, timed, unavailable, Backend, OpenOptions, StoreError, StoreUrl};

/// What the store said.
#[derive(Debug)]
pub(crate) struct Probe {
    pub(crate) backend: Backend,
    /// What answered, as a phrase: the server and its version, where, the
    /// database and the user (SQLite: the file).
    pub(crate) answered: String,
    /// The user connected as (SQLite: this process's user).
    pub(crate) user: String,
    /// The time the first connection took (none for a SQLite database not
    /// created yet).
    pub(crate) connect_time: Option<Duration>,
    pub(crate) migrations: Migrations,
    /// What the daemon needs and does not have, each a phrase such as
    /// `UPDATE on fencecron_leases`; empty when it has everything.
    pub(crate) missing: Vec<String>,
    /// What was checked, as a phrase, for the line that says it is there.
    pub(crate) checked: String,
    pub(crate) clock: Clock,
    /// PostgreSQL: why the session cannot write (a standby, read-only),
    /// when it cannot.
    pub(crate) read_only: Option<String>,
}

/// The migrations: applied, pending, and whether they can be applied.
#[derive(Debug)]
pub(crate) struct Migrations {
    /// Every migration this fencecron embeds.
    pub(crate) known: Vec<i64>,
    /// Those still to apply (the daemon applies them at its start).
    pub(crate) pending: Vec<i64>,
    /// Why the pending ones cannot be applied by this user, each a phrase
    /// (a missing privilege); empty when they can.
    pub(crate) cannot_apply: Vec<String>,
    /// The migrator's refusal (a newer fencecron migrated the store, a
    /// changed or half-applied migration), as its one-sentence message.
    pub(crate) refused: Option<String>,
    /// The user may not read `fencecron_migrations` (the missing privilege
    /// is among [`Probe::missing`]): which are applied is unknown.
    pub(crate) unreadable: bool,
}

/// The store's clock against this host's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Clock {
    /// The store's clock minus this host's, read at the middle of the
    /// shortest of a few round trips, and that round trip.
    Measured { offset: i64, round_trip: Duration },
    /// SQLite: the store's clock is this host's kernel clock.
    Kernel,
}

/// How many times the clock is read; the shortest round trip is kept.
const CLOCK_SAMPLES: usize = 5;

/// Looks at the store at `url`, all within `limit` (connecting included):
/// a store that does not answer in time is [`StoreError::Timeout`]; one
/// that cannot be reached or refuses the login is the same error any
/// command would give, with its cause and advice.
pub(crate) async fn probe(url: &StoreUrl, limit: Duration) -> Result<Probe, StoreError> {
    // The pool's own wait for a connection outlasts the limit, so that a
    // store that does not answer is named by the limit, not as a pool
    // whose connections did not come free.
    let opts = OpenOptions {
        max_connections: 1,
        call_timeout: limit * 2,
        hook: None,
    };
    match url.backend() {
        Backend::Postgres => {
            let store = PostgresStore::open(url.clone(), &opts)?;
            let hosts = store.dialect.hosts.as_deref();
            let result = timed(url, limit, postgres(&store.db.pool, hosts, url)).await;
            if result.is_ok() {
                store.db.pool.close().await;
            }
            result
        }
        Backend::MySql => {
            let store = MySqlStore::open(url.clone(), &opts)?;
            let result = timed(url, limit, mysql(&store.db.pool, url)).await;
            if result.is_ok() {
                store.db.pool.close().await;
            }
            result
        }
        Backend::Sqlite => timed(url, limit, sqlite(url)).await,
    }
}

/// The plan, or the refusal's message; an error reaching the store stays
/// an error.
fn migrations(
    backend: Backend,
    url: &StoreUrl,
    migrator: &Migrator,
    status: Result<Plan, MigrateError>,
) -> Result<Migrations, StoreError> {
    let known: Vec<i64> = migrator
        .migrations
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .map(|m| m.version)
        .collect();
    let (pending, refused) = match status {
        Ok(plan) => (plan.apply, None),
        Err(e) if denied(&e) => {
            return Ok(Migrations {
                known,
                pending: Vec::new(),
                cannot_apply: Vec::new(),
                refused: None,
                unreadable: true,
            })
        }
        Err(e) => match migrate_error(backend, url, e) {
            StoreError::Migrate { source, .. } => (
                Vec::new(),
                Some(migrate_message(backend, &url.to_string(), &source)),
            ),
            other => return Err(other),
        },
    };
    Ok(Migrations {
        known,
        pending,
        cannot_apply: Vec::new(),
        refused,
        unreadable: false,
    })
}

/// The time in microseconds since the epoch on this host.
fn host_micros() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// The offset of the store's clock (`$sql` answers microseconds since
/// the epoch) from this host's, at the middle of the shortest of
/// [`CLOCK_SAMPLES`] round trips on `$conn`.
macro_rules! measure {
    ($conn:expr, $sql:expr) => {{
        let mut best: Option<(Duration, i64)> = None;
        let mut failed = None;
        for _ in 0..CLOCK_SAMPLES {
            let (before, start) = (host_micros(), Instant::now());
            let store: i64 = match sqlx::query_scalar($sql).fetch_one(&mut *$conn).await {
                Ok(t) => t,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            let (after, round_trip) = (host_micros(), start.elapsed());
            let offset = offset_at_midpoint(store, before, after);
            if best.is_none_or(|(r, _)| round_trip < r) {
                best = Some((round_trip, offset));
            }
        }
        match failed {
            Some(e) => Err(e),
            None => {
                let (round_trip, offset) = best.unwrap_or_default();
                Ok(Clock::Measured { offset, round_trip })
            }
        }
    }};
}

/// The store's time minus this host's at the middle of the round trip, in
/// milliseconds (all times in microseconds).
fn offset_at_midpoint(store: i64, before: i64, after: i64) -> i64 {
    let middle = before + (after - before) / 2;
    (store - middle) / 1000
}

/// The privileges a user lacks, from `(privilege, object, held)` rows, as
/// `PRIVILEGE/PRIVILEGE on OBJECT` phrases, one per object, in the rows'
/// order.
fn lacking(rows: &[(String, String, bool)]) -> Vec<String> {
    let mut by_object: Vec<(&str, Vec<&str>)> = Vec::new();
    for (privilege, object, held) in rows {
        if *held {
            continue;
        }
        match by_object.iter_mut().find(|(o, _)| o == object) {
            Some((_, privileges)) => privileges.push(privilege),
            None => by_object.push((object, vec![privilege])),
        }
    }
    by_object
        .into_iter()
        .map(|(o, p)| format!("{} on {o}", p.join("/")))
        .collect()
}

/// Whether reading the migrations failed because the user may not read
/// the table (PostgreSQL 42501, MySQL 1142): the missing privilege is
/// reported with the others.
fn denied(e: &MigrateError) -> bool {
    let MigrateError::Execute(sqlx::Error::Database(db)) = e else {
        return false;
    };
    db.code().as_deref() == Some("42501")
        || db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|m| m.number() == 1142)
}

/// The tables fencecron's migrations create, and the procedures that exist
/// once all of them ran (one a migration drops is gone unless it is
/// created again), read from the embedded migrations' SQL.
fn objects(migrator: &Migrator) -> (Vec<String>, Vec<String>) {
    let (mut tables, mut procedures) = (Vec::<String>::new(), Vec::<String>::new());
    for m in migrator.migrations.iter() {
        let words: Vec<&str> = m
            .sql
            .split(|c: char| c.is_whitespace() || c == '(' || c == ';' || c == '`')
            .filter(|w| !w.is_empty())
            .collect();
        let is = |i: usize, word: &str| words.get(i).is_some_and(|w| w.eq_ignore_ascii_case(word));
        for i in 0..words.len() {
            // The name after `CREATE TABLE`, `DROP PROCEDURE IF EXISTS`, …
            let mut at = i + 2;
            if is(at, "IF") {
                at += if is(at + 1, "NOT") { 3 } else { 2 };
            }
            let Some(name) = words
                .get(at)
                .map(|w| w.to_ascii_lowercase())
                .filter(|n| n.starts_with("fencecron_"))
            else {
                continue;
            };
            if is(i, "CREATE") && is(i + 1, "TABLE") && !tables.contains(&name) {
                tables.push(name);
            } else if is(i, "CREATE") && is(i + 1, "PROCEDURE") && !procedures.contains(&name) {
                procedures.push(name);
            } else if is(i, "DROP") && is(i + 1, "PROCEDURE") {
                procedures.retain(|p| *p != name);
            }
        }
    }
    (tables, procedures)
}

/// Every migration to apply, for a database that does not exist yet.
fn fresh_plan(migrator: &Migrator) -> Plan {
    Plan {
        apply: migrator
            .migrations
            .iter()
            .filter(|m| !m.migration_type.is_down_migration())
            .map(|m| m.version)
            .collect(),
        ..Plan::default()
    }
}

mod mysql;
mod postgres;
mod sqlite;

use mysql::mysql;
use postgres::postgres;
use sqlite::sqlite;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_objects_are_those_the_migrations_leave() {
        let (tables, procedures) = objects(&sqlx::migrate!("migrations/mysql"));
        assert!(
            tables.contains(&"fencecron_leases".to_string()),
            "{tables:?}"
        );
        assert!(tables.contains(&"fencecron_runs".to_string()), "{tables:?}");
        // Every version of the acquire stays (older binaries of a rolling
        // upgrade call theirs), with the claim and the heartbeat.
        assert!(
            [
                "fencecron_acquire",
                "fencecron_acquire_v2",
                "fencecron_acquire_v3",
                "fencecron_claim_v1",
                "fencecron_beat_v1"
            ]
            .iter()
            .all(|p| procedures.contains(&p.to_string())),
            "{procedures:?}"
        );
    }

    #[test]
    fn the_offset_is_taken_at_the_middle_of_the_round_trip() {
        // Sent at 1.000 s, answered at 1.010 s, the store read 1.105 s.
        assert_eq!(offset_at_midpoint(1_105_000, 1_000_000, 1_010_000), 100);
        assert_eq!(offset_at_midpoint(900_000, 1_000_000, 1_010_000), -105);
    }
}

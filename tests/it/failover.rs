//! Principle 9 across a real PostgreSQL failover: no token is issued twice
//! for a resource, also when the store fails over to an asynchronously
//! replicated standby that missed the primary's last commits.
//!
//! The test starts its own primary and streaming standby on free loopback
//! ports (initdb and pg_basebackup as the `postgres` OS user, in a temporary
//! directory that user owns). The standby replicates through the test TCP
//! proxy, so the test can stall replication the way a network partition
//! would:
//!
//! 1. tokens are issued on the primary and the standby replays them;
//! 2. replication is black-holed; more tokens are issued on the primary,
//!    through the real binary and the library, and a value is written with
//!    the newest one; the standby provably has none of it;
//! 3. the primary is stopped with `-m immediate` and the standby promoted;
//! 4. every token the new primary issues — for resources it knows, and for
//!    one only the lost commits had created — is greater than (so never
//!    equal to) every token issued before, and `put` refuses an old token
//!    (exit 3) once the new generation wrote.
//!
//! It also checks that the acquire, which reads the timeline with
//! `pg_walfile_name(pg_current_wal_lsn())`, works for a role that has only
//! table privileges.
//!
//! Needs root (to run the servers as `postgres`) and PostgreSQL's server
//! binaries (`FENCECRON_TEST_PG_BINDIR`, else `/usr/lib/postgresql/*/bin`).
//! Without them it prints a loud `*** SKIPPED … ***`; under `CI=true` it
//! fails instead.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencecron::names::Name;
use fencecron::store::{
    open, AcquireOutcome, AcquireRequest, Lease, OpenOptions, ReleaseOutcome, Store, StoreUrl,
    Token,
};
use serde_json::Value;
use sqlx::{Executor, PgPool};

use common::harness::{code, describe, fencecron};
use common::pg::{as_postgres, postgres_dir, skip_unless_available, Instance};
use common::proxy::Proxy;

const TEST: &str = "failover::async_standby_never_reissues_a_token";
const LEASE: Duration = Duration::from_secs(5);
const WAIT: Duration = Duration::from_secs(20);

// ------------------------------------------------------------- instances

/// A primary and its standby; both are stopped when this is dropped, also
/// when the test panics (and their logs are printed then).
struct Cluster {
    primary: Instance,
    standby: Instance,
    /// Replication runs through it.
    proxy: Proxy,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// initdb, start the primary, pg_basebackup a standby that streams
    /// through the proxy, start it.
    fn start() -> Cluster {
        let dir = postgres_dir();
        let primary = Instance::new(dir.path(), "primary");
        let standby = Instance::new(dir.path(), "standby");
        primary.initdb();
        primary.start();
        let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], primary.port)));
        let cluster = Cluster {
            primary,
            standby,
            proxy,
            _dir: dir,
        };
        // -R writes standby.signal and a primary_conninfo naming the
        // address it copied from: the proxy.
        as_postgres(
            &cluster.standby.bindir,
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &cluster.proxy.addr.port().to_string(),
                "-U",
                "postgres",
                "-D",
                &cluster.standby.data.display().to_string(),
                "-R",
                "-X",
                "stream",
                "--checkpoint=fast",
                "--no-sync",
            ],
        );
        cluster.standby.start();
        cluster
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for pg in [&self.primary, &self.standby] {
            let _ = pg.crash();
            if std::thread::panicking() {
                eprintln!("--- {} log (tail) ---\n{}", pg.name, pg.log_tail());
            }
        }
    }
}

// ------------------------------------------------------------- helpers

async fn store_at(url: &str, migrate: bool) -> Arc<dyn Store> {
    let store = open(
        &StoreUrl::parse(url).expect("URL"),
        &OpenOptions {
            max_connections: 2,
            call_timeout: Duration::from_secs(10),
            ..OpenOptions::default()
        },
    )
    .expect("store opens");
    if migrate {
        store.migrate().await.expect("migrations apply");
    }
    store
}

fn name(s: &str) -> Name {
    Name::parse("resource", s).expect("resource name")
}

/// One generation through the library: acquire (must win), release.
async fn generation(store: &dyn Store, r: &str) -> Lease {
    let r = name(r);
    let lease = match store
        .acquire(&AcquireRequest {
            resource: &r,
            lease: LEASE,
            node: "failover-test",
            occurrence: None,
            next_occurrence: None,
            owner_id: fencecron::store::OwnerId::fresh(),
            run: None,
        })
        .await
        .expect("acquire reaches the store")
    {
        AcquireOutcome::Acquired(l) => l,
        other => panic!("acquire {r}: {other:?}"),
    };
    assert_eq!(
        store
            .release(&r, lease.owner_id, lease.token)
            .await
            .expect("release reaches the store"),
        ReleaseOutcome::Released
    );
    lease
}

/// Runs the real binary against `url`; checks the exit code.
fn cli(url: &str, args: &[&str], want: i32) -> Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = fencecron(dir.path())
        .args(["--store", url])
        .args(args)
        .output()
        .expect("run fencecron");
    assert_eq!(code(&out), want, "fencecron {args:?}: {}", describe(&out));
    out
}

/// One generation through the binary: `lease acquire --json`, release.
/// Returns its token and owner id.
fn cli_generation(url: &str, r: &str) -> (Token, String) {
    let out = cli(url, &["lease", "acquire", r, "--lease", "5s", "--json"], 0);
    let v: Value = serde_json::from_slice(&out.stdout).expect("acquire --json");
    let token = Token::new(v["token"].as_i64().expect("token"));
    let t = token.to_string();
    let owner = v["owner_id"].as_str().expect("owner_id");
    cli(
        url,
        &["lease", "release", r, "--owner-id", owner, "--token", &t],
        0,
    );
    (token, owner.to_string())
}

async fn lsn(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(pool)
        .await
        .expect("primary LSN")
}

/// Waits until the standby replayed the primary's WAL up to `target`.
async fn wait_replayed(standby: &PgPool, target: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let done: bool =
            sqlx::query_scalar("SELECT COALESCE(pg_last_wal_replay_lsn() >= $1::pg_lsn, FALSE)")
                .bind(target)
                .fetch_one(standby)
                .await
                .expect("standby replay LSN");
        if done {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the standby did not replay {target} within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn fence_on(pool: &PgPool, r: &str) -> Option<Token> {
    sqlx::query_scalar("SELECT fence FROM fencecron_leases WHERE resource = $1")
        .bind(r)
        .fetch_optional(pool)
        .await
        .expect("read fence")
}

// ------------------------------------------------------------------ test

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_standby_never_reissues_a_token() {
    if skip_unless_available(TEST) {
        return;
    }
    let started = Instant::now();
    let cluster = Cluster::start();
    let admin = PgPool::connect(&cluster.primary.url("postgres"))
        .await
        .expect("connect to the primary");
    admin
        .execute("CREATE DATABASE fencecron")
        .await
        .expect("create database");
    let primary_url = cluster.primary.url("fencecron");
    let primary_pool = PgPool::connect(&primary_url).await.expect("connect");
    let primary = store_at(&primary_url, true).await;

    // 1. Tokens the standby will have.
    let mut before: Vec<(&str, Token)> = Vec::new();
    // Who each token of job-a was issued to: `put` names the owner too.
    let mut owners: HashMap<Token, String> = HashMap::new();
    for _ in 0..3 {
        let l = generation(primary.as_ref(), "job-a").await;
        owners.insert(l.token, l.owner_id.to_string());
        before.push(("job-a", l.token));
    }
    before.push(("job-b", cli_generation(&primary_url, "job-b").0));
    let replicated = lsn(&primary_pool).await;
    let standby_pool = {
        let deadline = Instant::now() + WAIT;
        loop {
            // The database exists on the standby once it replayed its creation.
            match PgPool::connect(&cluster.standby.url("fencecron")).await {
                Ok(p) => break p,
                Err(e) => {
                    assert!(Instant::now() < deadline, "standby: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    };
    wait_replayed(&standby_pool, &replicated).await;
    assert_eq!(fence_on(&standby_pool, "job-a").await, Some(Token::new(3)));

    // 2. Replication stalls; the primary goes on issuing tokens.
    cluster.proxy.blackhole();
    for _ in 0..3 {
        let (token, owner) = cli_generation(&primary_url, "job-a");
        owners.insert(token, owner);
        before.push(("job-a", token));
    }
    for _ in 0..2 {
        let l = generation(primary.as_ref(), "job-a").await;
        owners.insert(l.token, l.owner_id.to_string());
        before.push(("job-a", l.token));
    }
    // A resource that only the lost commits know.
    for _ in 0..2 {
        before.push(("job-new", cli_generation(&primary_url, "job-new").0));
    }
    let newest_lost = before
        .iter()
        .filter(|(r, _)| *r == "job-a")
        .map(|(_, t)| *t)
        .max()
        .unwrap();
    let t = newest_lost.to_string();
    cli(
        &primary_url,
        &[
            "put",
            "result",
            "--resource",
            "job-a",
            "--token",
            &t,
            "--owner-id",
            &owners[&newest_lost],
            "--value",
            "lost",
        ],
        0,
    );
    assert_eq!(
        newest_lost,
        Token::new(8),
        "tokens 4..=8 issued while stalled: {before:?}"
    );
    // The standby really missed them.
    let primary_at = lsn(&primary_pool).await;
    let behind: bool = sqlx::query_scalar("SELECT pg_last_wal_replay_lsn() < $1::pg_lsn")
        .bind(&primary_at)
        .fetch_one(&standby_pool)
        .await
        .expect("replay LSN");
    assert!(behind, "the standby should lag behind {primary_at}");
    assert_eq!(fence_on(&standby_pool, "job-a").await, Some(Token::new(3)));
    assert_eq!(fence_on(&standby_pool, "job-new").await, None);
    primary_pool.close().await;
    admin.close().await;
    drop(primary);

    // 3. Failover.
    let crashed = cluster.primary.crash().expect("pg_ctl stop");
    assert!(crashed.status.success(), "{}", describe(&crashed));
    standby_pool.close().await;
    as_postgres(
        &cluster.standby.bindir,
        "pg_ctl",
        &[
            "-D",
            &cluster.standby.data.display().to_string(),
            "-w",
            "-t",
            "30",
            "promote",
        ],
    );

    // 4. Every token from now on is above every earlier one.
    let new_url = cluster.standby.url("fencecron");
    let new_primary = store_at(&new_url, true).await;
    let epoch: Value =
        serde_json::from_slice(&cli(&new_url, &["epoch", "--json"], 0).stdout).expect("json");
    assert_eq!(
        epoch["timeline"], 2,
        "promotion moved to timeline 2: {epoch}"
    );
    let mut after: Vec<(&str, Token)> = Vec::new();
    after.push((
        "job-a",
        generation(new_primary.as_ref(), "job-a").await.token,
    ));
    after.push(("job-a", cli_generation(&new_url, "job-a").0));
    after.push((
        "job-b",
        generation(new_primary.as_ref(), "job-b").await.token,
    ));
    after.push(("job-new", cli_generation(&new_url, "job-new").0));
    after.push((
        "job-new",
        generation(new_primary.as_ref(), "job-new").await.token,
    ));

    // A role with table privileges only: the acquire's timeline read
    // (pg_walfile_name, pg_current_wal_lsn) needs no further grant.
    let owner_pool = PgPool::connect(&new_url).await.expect("connect");
    for stmt in [
        "CREATE ROLE fencecron_app LOGIN",
        "GRANT USAGE ON SCHEMA public TO fencecron_app",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO fencecron_app",
        "GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO fencecron_app",
    ] {
        owner_pool.execute(stmt).await.expect(stmt);
    }
    let app_url = format!(
        "postgres://fencecron_app@127.0.0.1:{}/fencecron",
        cluster.standby.port
    );
    let app = store_at(&app_url, false).await;
    after.push(("job-b", generation(app.as_ref(), "job-b").await.token));
    let is_superuser: bool =
        sqlx::query_scalar("SELECT rolsuper FROM pg_roles WHERE rolname = 'fencecron_app'")
            .fetch_one(&owner_pool)
            .await
            .expect("role");
    assert!(!is_superuser);

    let highest_before = before.iter().map(|(_, t)| *t).max().unwrap();
    for (r, t) in &after {
        assert!(
            *t > highest_before,
            "{r}: token {t} after the failover is not above every earlier token ({highest_before}); before: {before:?}, after: {after:?}"
        );
        assert!(
            !before.iter().any(|(_, b)| b == t),
            "{r}: token {t} was issued twice"
        );
    }

    // The new generation writes; the old tokens are refused (exit 3): the
    // one whose write the failover lost, and one from before the stall.
    let out = cli(&new_url, &["lease", "acquire", "job-a", "--json"], 0);
    let v: Value = serde_json::from_slice(&out.stdout).expect("acquire --json");
    let newest = Token::new(v["token"].as_i64().expect("token"));
    let newest_owner = v["owner_id"].as_str().expect("owner_id");
    assert!(newest > highest_before);
    let latest = newest.to_string();
    cli(
        &new_url,
        &[
            "put",
            "result",
            "--resource",
            "job-a",
            "--token",
            &latest,
            "--owner-id",
            newest_owner,
            "--value",
            "new",
        ],
        0,
    );
    for old in [newest_lost, Token::new(3)] {
        let t = old.to_string();
        cli(
            &new_url,
            &[
                "put",
                "result",
                "--resource",
                "job-a",
                "--token",
                &t,
                "--owner-id",
                &owners[&old],
                "--value",
                "stale",
            ],
            3,
        );
    }
    owner_pool.close().await;
    eprintln!(
        "{TEST}: before {before:?}, after {after:?} ({:?})",
        started.elapsed()
    );
    drop(cluster);
}

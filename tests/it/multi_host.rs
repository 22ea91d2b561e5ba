//! Multi-host PostgreSQL URLs against real servers: a primary and a
//! streaming standby of the test's own (initdb and pg_basebackup as the
//! `postgres` OS user on free loopback ports, as in `failover.rs`).
//!
//! - each `target_session_attrs` value picks the host libpq would (the
//!   standby listed first is skipped for `read-write`/`primary`, taken
//!   for `any`), also from `PGTARGETSESSIONATTRS`, past a host that is
//!   down; the errors name every host and keep the password out;
//! - a daemon on a multi-host URL follows a failover without a restart
//!   (the tokens after are above every token before: the promotion's
//!   timeline), and leaves the old primary when it comes back as a
//!   standby listed first;
//! - a daemon leaves a primary that turns read-only while it still
//!   answers (its writes fail with 25006, the pooled connections are
//!   dropped, new ones go to the next host);
//! - a daemon leaves a host whose address accepts and then closes every
//!   connection (a proxy in front of a dead server), without waiting for
//!   that server to come back.
//!
//! Needs root and PostgreSQL's server binaries; without them a loud
//! `*** SKIPPED … ***`, under `CI=true` a failure.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use fencecron::names::Name;
use fencecron::store::{open, AcquireOutcome, AcquireRequest, OpenOptions, OwnerId, StoreUrl};
use nix::sys::signal::Signal;
use sqlx::{Executor, PgPool};

use common::daemon::{
    ev, job_toml, read_runs, record_cmd, secs, wait_until, write_config, Daemon, DaemonOpts,
};
use common::harness::{code, describe, fencecron, run};
use common::pg::{as_postgres, postgres_dir, skip_unless_available, Instance};
use common::proxy::Proxy;

const WAIT: Duration = Duration::from_secs(60);

/// A primary with a database `fencecron` (migrated) and a standby of it;
/// both are stopped when this is dropped (their logs printed if the test
/// panics).
struct Pair {
    primary: Instance,
    standby: Instance,
    _dir: tempfile::TempDir,
}

impl Pair {
    async fn start() -> Pair {
        let dir = postgres_dir();
        let pair = Pair {
            primary: Instance::new(dir.path(), "primary"),
            standby: Instance::new(dir.path(), "standby"),
            _dir: dir,
        };
        pair.primary.initdb();
        pair.primary.start();
        let admin = PgPool::connect(&pair.primary.url("postgres"))
            .await
            .expect("connect to the primary");
        admin
            .execute("CREATE DATABASE fencecron")
            .await
            .expect("create database");
        admin.close().await;
        // Migrated before the copy: the standby has the tables at once.
        cli(&pair.primary.url("fencecron"), &["lease", "list"], &[], 0);
        pair.standby_of(&pair.standby, pair.primary.port);
        pair.standby.start();
        pair
    }

    /// `instance`'s data made a fresh standby of the server at `port`.
    fn standby_of(&self, instance: &Instance, port: u16) {
        let _ = std::fs::remove_dir_all(&instance.data);
        as_postgres(
            &instance.bindir,
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-U",
                "postgres",
                "-D",
                &instance.data.display().to_string(),
                "-R",
                "-X",
                "stream",
                "--checkpoint=fast",
                "--no-sync",
            ],
        );
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for pg in [&self.primary, &self.standby] {
            let _ = pg.crash();
            if std::thread::panicking() {
                eprintln!("--- {} log (tail) ---\n{}", pg.name, pg.log_tail());
            }
        }
    }
}

fn promote(pg: &Instance) {
    as_postgres(
        &pg.bindir,
        "pg_ctl",
        &[
            "-D",
            &pg.data.display().to_string(),
            "-w",
            "-t",
            "30",
            "promote",
        ],
    );
}

/// `postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/fencecron?QUERY`.
fn url(ports: &[u16], query: &str) -> String {
    let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut u = format!("postgres://postgres@{}/fencecron", hosts.join(","));
    if !query.is_empty() {
        u.push('?');
        u.push_str(query);
    }
    u
}

/// Runs the real binary with `--store URL` and the extra environment;
/// checks the exit code.
fn cli(store: &str, args: &[&str], env: &[(&str, &str)], want: i32) -> Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = fencecron(dir.path());
    cmd.env_remove("PGTARGETSESSIONATTRS")
        .env_remove("PGCONNECT_TIMEOUT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(["--store", store]).args(args);
    let out = run(cmd, None);
    assert_eq!(code(&out), want, "fencecron {args:?}: {}", describe(&out));
    out
}

/// The port `check --connect` says answered, and its output.
fn answering_port(store: &str, env: &[(&str, &str)]) -> (u16, Output) {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("jobs.toml");
    std::fs::write(
        &config,
        "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\n",
    )
    .expect("write jobs.toml");
    let mut cmd = fencecron(dir.path());
    cmd.env_remove("PGTARGETSESSIONATTRS")
        .env_remove("PGCONNECT_TIMEOUT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(["--store", store, "check", "--connect", "--config"])
        .arg(&config);
    let out = run(cmd, None);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let port = text
        .lines()
        .find_map(|l| l.strip_prefix("store: answers: PostgreSQL "))
        .and_then(|l| l.split(" at 127.0.0.1:").nth(1))
        .and_then(|l| l.split(',').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no answering host in: {}", describe(&out)));
    (port, out)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Acquires a fresh resource through the library; the outcome or error.
async fn acquire_through(store_url: &str) -> Result<AcquireOutcome, String> {
    let store = open(
        &StoreUrl::parse(store_url).expect("URL"),
        &OpenOptions {
            max_connections: 1,
            call_timeout: Duration::from_secs(10),
            ..OpenOptions::default()
        },
    )
    .expect("store opens");
    let r = Name::parse("resource", &common::unique("mh")).expect("name");
    store
        .acquire(&AcquireRequest {
            resource: &r,
            lease: Duration::from_secs(5),
            node: "multi-host-test",
            occurrence: None,
            next_occurrence: None,
            owner_id: OwnerId::fresh(),
            run: None,
        })
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_target_session_attrs_value_picks_the_host_libpq_would() {
    const TEST: &str = "multi_host::each_target_session_attrs_value_picks_the_host_libpq_would";
    if skip_unless_available(TEST) {
        return;
    }
    let pair = Pair::start().await;
    let (p, s) = (pair.primary.port, pair.standby.port);
    let dead = common::free_port();
    for (ports, attrs, want) in [
        (vec![s, p], "any", s),
        (vec![p, s], "any", p),
        (vec![s, p], "read-write", p),
        (vec![s, p], "primary", p),
        (vec![dead, s, p], "read-write", p),
        (vec![p, s], "read-only", s),
        (vec![p, s], "standby", s),
        (vec![p, s], "prefer-standby", s),
        (vec![dead, p], "prefer-standby", p),
    ] {
        let store = url(
            &ports,
            &format!("target_session_attrs={attrs}&connect_timeout=2"),
        );
        let (port, out) = answering_port(&store, &[]);
        assert_eq!(port, want, "{attrs} on {ports:?}: {}", describe(&out));
        // Where the daemon could not write, check --connect says so.
        if want == s {
            assert_eq!(code(&out), 1, "{}", describe(&out));
            assert!(stderr(&out).contains("is a standby"), "{}", describe(&out));
        } else {
            assert_eq!(code(&out), 0, "{attrs}: {}", describe(&out));
        }
    }
    // A host that takes the TCP connection and never answers (powered
    // off behind a load balancer, black-holed) costs its connect_timeout,
    // not the command's whole limit.
    let silent = Proxy::start(SocketAddr::from(([127, 0, 0, 1], p)));
    silent.blackhole();
    let started = Instant::now();
    let (port, out) = answering_port(
        &url(
            &[silent.addr.port(), p],
            "target_session_attrs=read-write&connect_timeout=2",
        ),
        &[],
    );
    assert_eq!(port, p, "{}", describe(&out));
    assert_eq!(code(&out), 0, "{}", describe(&out));
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "the silent host had its connect_timeout: {:?}",
        started.elapsed()
    );
    drop(silent);

    // A first host that refuses at once with words of its own (here the
    // shared test server, which has no database `fencecron`, as a replica
    // that has not replayed its creation yet) is walked past, as libpq does.
    let shared = std::env::var("FENCECRON_TEST_POSTGRES_URL")
        .ok()
        .and_then(|u| url::Url::parse(&u).ok())
        .filter(|u| u.host_str() == Some("127.0.0.1"))
        .and_then(|u| u.port_or_known_default());
    if let Some(other) = shared {
        let out = cli(&url(&[other, p], ""), &["lease", "list"], &[], 0);
        let (port, _) = answering_port(&url(&[other, p], ""), &[]);
        assert_eq!(port, p, "{}", describe(&out));
    }

    // From the environment when the URL does not say; the URL wins.
    let (port, _) = answering_port(&url(&[s, p], ""), &[("PGTARGETSESSIONATTRS", "read-write")]);
    assert_eq!(port, p);
    let (port, _) = answering_port(
        &url(&[s, p], "target_session_attrs=any"),
        &[("PGTARGETSESSIONATTRS", "read-write")],
    );
    assert_eq!(port, s);

    // The store's own pool: the standby listed first is skipped for a
    // write with read-write, and written to (and refused) with any.
    let rw = acquire_through(&url(&[s, p], "target_session_attrs=read-write")).await;
    assert!(matches!(rw, Ok(AcquireOutcome::Acquired(_))), "{rw:?}");
    let any = acquire_through(&url(&[s, p], "")).await;
    let e = any.expect_err("a write on the standby fails");
    assert!(
        e.contains("read-only transaction")
            && e.contains("takes no writes")
            && e.contains("target_session_attrs=read-write"),
        "{e}"
    );

    // Errors: every host named with its reason, the password never shown.
    let dead2 = common::free_port();
    let secret = format!(
        "postgres://postgres:hunter2@127.0.0.1:{dead},127.0.0.1:{dead2}/fencecron?connect_timeout=2"
    );
    let out = cli(&secret, &["lease", "list"], &[], 1);
    let err = stderr(&out);
    for port in [dead, dead2] {
        assert!(
            err.contains(&format!("127.0.0.1:{port} refused the connection")),
            "{err}"
        );
    }
    assert!(
        !err.contains("hunter2") && err.contains("postgres:***@"),
        "{err}"
    );
    let out = cli(
        &url(&[s], "target_session_attrs=read-write&password=hunter2"),
        &["lease", "list"],
        &[],
        1,
    );
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "127.0.0.1:{s} is a standby (in recovery), not read-write"
        )),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    let out = cli(
        &url(&[p, s], "target_session_attrs=master"),
        &["lease", "list"],
        &[],
        2,
    );
    let err = stderr(&out);
    assert!(
        err.contains("any, read-write, read-only, primary, standby, prefer-standby"),
        "{err}"
    );
    drop(pair);
}

/// The tokens of the runs recorded in `file`.
fn tokens(file: &Path) -> Vec<i64> {
    read_runs(file).into_iter().map(|r| r.token).collect()
}

/// Waits until `file` holds `n` runs with a token above `above`.
fn wait_runs_above(file: &Path, above: i64, n: usize, daemon: &Daemon) {
    wait_until(
        WAIT,
        || tokens(file).iter().filter(|t| **t > above).count() >= n,
        || {
            format!(
                "no {n} runs with a token above {above}: {:?}\n{}",
                tokens(file),
                daemon.summary()
            )
        },
    );
}

/// A daemon running a job every second that records its token.
fn daemon(dir: &Path, store: &str) -> Daemon {
    let config = write_config(
        dir,
        "lease = \"5s\"",
        &[job_toml(
            "tick",
            "* * * * * *",
            &record_cmd(&dir.join("runs")),
            "",
        )],
    );
    let d = Daemon::spawn(DaemonOpts::new("mh", &config, store));
    d.expect("daemon_started", ev("daemon_started"), WAIT);
    d
}

/// Ends every session fencecron has on the server at `url`: the daemon's
/// next calls open new connections (and so walk the hosts again).
async fn end_fencecron_sessions(url: &str) {
    let pool = PgPool::connect(url).await.expect("connect");
    pool.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'fencecron'",
    )
    .await
    .expect("terminate");
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_follows_a_failover_and_skips_the_old_primary_back_as_a_standby() {
    const TEST: &str =
        "multi_host::a_daemon_follows_a_failover_and_skips_the_old_primary_back_as_a_standby";
    if skip_unless_available(TEST) {
        return;
    }
    let pair = Pair::start().await;
    let (p, s) = (pair.primary.port, pair.standby.port);
    let dir = tempfile::tempdir().expect("temp dir");
    let runs = dir.path().join("runs");
    let mut d = daemon(
        dir.path(),
        &url(&[p, s], "target_session_attrs=read-write&connect_timeout=2"),
    );
    let pid = d.pid();
    wait_runs_above(&runs, 0, 2, &d);
    let before = *tokens(&runs).iter().max().unwrap();
    assert!(before < 1 << 32, "tokens of timeline 1: {before}");

    // Failover: the primary stops, the standby is promoted.
    pair.primary.stop();
    promote(&pair.standby);
    wait_runs_above(&runs, before, 2, &d);
    let all = tokens(&runs);
    let after: Vec<i64> = all.iter().copied().filter(|t| *t > before).collect();
    assert!(
        after.iter().all(|t| *t > 1 << 32),
        "tokens after the failover come from the new timeline's epoch: {all:?}"
    );
    let mut sorted = all.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), all.len(), "no token twice: {all:?}");

    // The old primary comes back as a standby of the new one, first in
    // the URL: the running daemon's new connections (its sessions ended)
    // skip it, and so does a new command's.
    pair.standby_of(&pair.primary, s);
    pair.primary.start();
    end_fencecron_sessions(&pair.standby.url("fencecron")).await;
    let newest = *tokens(&runs).iter().max().unwrap();
    wait_runs_above(&runs, newest, 2, &d);
    assert!(d.is_running(), "{}", d.summary());
    assert_eq!(d.pid(), pid, "the same daemon, never restarted");
    let (port, out) = answering_port(
        &url(&[p, s], "target_session_attrs=read-write&connect_timeout=2"),
        &[],
    );
    assert_eq!(port, s, "{}", describe(&out));
    d.signal(Signal::SIGTERM);
    assert!(d.wait_exit(secs(20)).is_some(), "{}", d.summary());
    drop(pair);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_leaves_a_primary_that_turns_read_only() {
    const TEST: &str = "multi_host::a_daemon_leaves_a_primary_that_turns_read_only";
    if skip_unless_available(TEST) {
        return;
    }
    let pair = Pair::start().await;
    let (p, s) = (pair.primary.port, pair.standby.port);
    // Two servers that accept writes; the promoted one on timeline 2.
    promote(&pair.standby);
    let dir = tempfile::tempdir().expect("temp dir");
    let runs = dir.path().join("runs");
    let mut d = daemon(
        dir.path(),
        &url(&[p, s], "target_session_attrs=read-write&connect_timeout=2"),
    );
    wait_runs_above(&runs, 0, 2, &d);
    let before = *tokens(&runs).iter().max().unwrap();
    assert!(before < 1 << 32, "runs on the first host: {before}");

    // The first host still answers, but no longer accepts writes.
    let admin = PgPool::connect(&pair.primary.url("postgres"))
        .await
        .expect("connect");
    admin
        .execute("ALTER SYSTEM SET default_transaction_read_only = on")
        .await
        .expect("alter system");
    admin
        .execute("SELECT pg_reload_conf()")
        .await
        .expect("reload");
    admin.close().await;
    let started = Instant::now();
    wait_runs_above(&runs, before, 2, &d);
    let after: Vec<i64> = tokens(&runs).into_iter().filter(|t| *t > before).collect();
    assert!(
        after.iter().all(|t| *t > 1 << 32),
        "the runs moved to the second host: {after:?}"
    );
    assert!(d.is_running(), "{}", d.summary());
    eprintln!("{TEST}: moved in {:?}", started.elapsed());
    d.signal(Signal::SIGTERM);
    assert!(d.wait_exit(secs(20)).is_some(), "{}", d.summary());
    drop(pair);
}

/// A host whose address still accepts connections but closes each at once
/// (a proxy, load balancer or pooler in front of a dead server) fails
/// every call at once, before the walk beside a slow call would start: the
/// daemon walks the hosts after such a failure and follows the failover
/// to the next host, without a restart and while the dead server stays
/// dead (before, it stayed on that host until it answered again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_leaves_a_host_that_closes_its_connections_at_once() {
    const TEST: &str = "multi_host::a_daemon_leaves_a_host_that_closes_its_connections_at_once";
    if skip_unless_available(TEST) {
        return;
    }
    let pair = Pair::start().await;
    let s = pair.standby.port;
    // The primary behind a proxy: once the primary is gone, the proxy
    // still accepts and closes each connection (its upstream refuses).
    let front = Proxy::start(SocketAddr::from(([127, 0, 0, 1], pair.primary.port)));
    let dir = tempfile::tempdir().expect("temp dir");
    let runs = dir.path().join("runs");
    let mut d = daemon(
        dir.path(),
        &url(
            &[front.addr.port(), s],
            "target_session_attrs=read-write&connect_timeout=2",
        ),
    );
    let pid = d.pid();
    wait_runs_above(&runs, 0, 2, &d);
    let before = *tokens(&runs).iter().max().unwrap();

    pair.primary.stop();
    promote(&pair.standby);
    wait_runs_above(&runs, before, 2, &d);
    let after: Vec<i64> = tokens(&runs).into_iter().filter(|t| *t > before).collect();
    assert!(
        after.iter().all(|t| *t > 1 << 32),
        "tokens after the failover come from the new timeline's epoch: {after:?}"
    );
    assert_eq!(d.pid(), pid, "the same daemon, never restarted");
    d.signal(Signal::SIGTERM);
    assert!(d.wait_exit(secs(20)).is_some(), "{}", d.summary());
    drop(front);
    drop(pair);
}

//! The daemon (`fencecron run`) and `fencecron exec` against real stores,
//! through the real binary.
//!
//! Every assertion compares facts — scheduled instants, tokens, the store's
//! clock, whether a pid exists — never how fast something happened. Time
//! limits only bound how long a test waits before it fails.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use nix::sys::signal::Signal;
use serde_json::Value;

use common::daemon::{
    ev, i64_field, is, job_toml, lease_list, long_cmd, pid_alive, pid_of, read_pid_file, read_runs,
    record_cmd, rfc3339, secs, str_field, token_of, wait_pid_gone, wait_until, write_config,
    Daemon, DaemonOpts, Run,
};
use common::harness::run;
use common::proxy::Proxy;
use common::{unique, Backend, TestStore};

/// The first event matching `pred` on any of `daemons`: (daemon index, event).
fn first_on_any(
    daemons: &[&Daemon],
    what: &str,
    pred: impl Fn(&Value) -> bool,
    timeout: Duration,
) -> (usize, Value) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        for (i, d) in daemons.iter().enumerate() {
            if let Some(e) = d.wait_for(&pred, Duration::ZERO) {
                return (i, e);
            }
        }
        if std::time::Instant::now() >= deadline {
            let summaries: Vec<String> = daemons
                .iter()
                .map(|d| format!("[{}] {}", d.node, d.summary()))
                .collect();
            panic!("no {what} on any daemon within {timeout:?}: {summaries:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the job recording into `runs_file` has run an instant at
/// least `window` after `t0` (a slow machine gets a full window rather than
/// fewer instants), up to a minute longer; returns the time then, the end
/// of the window [`check_runs`] looks at.
fn run_through(
    runs_file: &Path,
    t0: DateTime<Utc>,
    window: Duration,
    daemons: &[&Daemon],
) -> DateTime<Utc> {
    let end = t0 + chrono::Duration::from_std(window).expect("window");
    wait_until(
        window + secs(60),
        || read_runs(runs_file).iter().any(|r| r.scheduled_at >= end),
        || {
            let summaries: Vec<String> = daemons
                .iter()
                .map(|d| format!("[{}] {}", d.node, d.summary()))
                .collect();
            format!("no run of an instant at or after {end}: {summaries:?}")
        },
    );
    Utc::now()
}

fn job_is(job: &str) -> impl Fn(&Value) -> bool + '_ {
    move |e| str_field(e, "job") == Some(job)
}

// ---------------------------------------------------------------------------
// 1. Fleet dedup

/// Starts `nodes` daemons on one store (the last one under `faketime
/// -f +2s`), lets a job fire every 2 s for `run_for`, stops them, and checks
/// the runs: each instant at most once, none missed in the middle, tokens
/// strictly increasing with the instant.
fn fleet_dedup(backend: Backend, test: &str, nodes: usize, run_for: Duration) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let runs_file = dir.path().join("runs");
    let job = unique("dedup");
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &[job_toml(&job, "*/2 * * * * *", &record_cmd(&runs_file), "")],
    );
    let mut daemons: Vec<Daemon> = (0..nodes)
        .map(|i| {
            let node = format!("{}-n{i}", &job[..12]);
            let mut opts = DaemonOpts::new(&node, &config, &store.url).debug();
            if i == nodes - 1 {
                opts = opts.faketime("+2s");
            }
            if i == 1 {
                opts = opts.flags_before_subcommand();
            }
            Daemon::spawn(opts)
        })
        .collect();
    // Each says once, at start, which daemons its store fences.
    let scope = if backend == Backend::Sqlite {
        "host"
    } else {
        "fleet"
    };
    for d in &daemons {
        let e = d.expect("daemon_started", ev("daemon_started"), secs(60));
        assert_eq!(str_field(&e, "scope"), Some(scope), "{e}");
    }
    let t0 = Utc::now();
    let t1 = run_through(&runs_file, t0, run_for, &daemons.iter().collect::<Vec<_>>());
    for d in &daemons {
        d.signal(Signal::SIGTERM);
    }
    for d in &mut daemons {
        let st = d.wait_exit(secs(20));
        assert!(
            st.is_some_and(|s| s.success()),
            "[{}] did not exit 0 after SIGTERM: {st:?}",
            d.node
        );
    }
    let runs = read_runs(&runs_file);
    let refs: Vec<&Daemon> = daemons.iter().collect();
    check_runs(&runs, &refs, &job, 2, t0, t1);
    // Every backend claims in batches: the instants went through claims.
    for d in &daemons {
        assert!(
            !d.events("occurrences_claimed").is_empty(),
            "[{}] no batch claim: {}",
            d.node,
            d.summary()
        );
    }
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for r in &runs {
        *per_node.entry(r.node.as_str()).or_default() += 1;
    }
    eprintln!("{test}: {} runs, per node {per_node:?}", runs.len());
}

/// The fleet-wide facts about the runs of a job scheduled every `period`
/// seconds, observed while all daemons were up from `t0` to `t1`.
fn check_runs(
    runs: &[Run],
    daemons: &[&Daemon],
    job: &str,
    period: i64,
    t0: DateTime<Utc>,
    t1: DateTime<Utc>,
) {
    assert!(!runs.is_empty(), "the job never ran");
    // FENCECRON_SCHEDULED_AT is the exact scheduled instant.
    for r in runs {
        assert_eq!(
            r.raw_scheduled_at,
            rfc3339(r.scheduled_at),
            "FENCECRON_SCHEDULED_AT is not RFC 3339 UTC with milliseconds: {r:?}"
        );
        assert!(
            r.scheduled_at.timestamp_subsec_nanos() == 0
                && r.scheduled_at.timestamp() % period == 0,
            "FENCECRON_SCHEDULED_AT {} is not an instant of the schedule (every {period} s): {r:?}",
            r.raw_scheduled_at
        );
    }
    // At most once across the fleet.
    let mut by_instant: BTreeMap<DateTime<Utc>, Vec<&Run>> = BTreeMap::new();
    for r in runs {
        by_instant.entry(r.scheduled_at).or_default().push(r);
    }
    let dups: Vec<_> = by_instant.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(
        dups.is_empty(),
        "scheduled instants that ran more than once: {dups:?}"
    );
    // Tokens strictly increase with the scheduled instant.
    let ordered: Vec<&Run> = by_instant.values().map(|v| v[0]).collect();
    for w in ordered.windows(2) {
        assert!(
            w[0].token < w[1].token,
            "tokens do not increase with the scheduled instant: {:?} then {:?}",
            w[0],
            w[1]
        );
    }
    // None missed in the middle: every instant of the schedule in (t0, t1]
    // ran, except the first and last two.
    let first = t0.timestamp() / period * period + period;
    let expected: Vec<i64> = (first..=t1.timestamp()).step_by(period as usize).collect();
    assert!(expected.len() > 4, "window too short: {t0} .. {t1}");
    let seen: BTreeSet<i64> = runs.iter().map(|r| r.scheduled_at.timestamp()).collect();
    // An instant whose acquire the store itself did not answer in time (a
    // stall of the machine: an fsync behind a build, a starved process) is
    // logged as skipped with `store_unavailable` by the node that tried it;
    // that is the store's failure, not the fleet's, and is excused, twice at most.
    // Anything else missing is a bug.
    let unanswered: BTreeSet<i64> = daemons
        .iter()
        .flat_map(|d| d.events("occurrence_skipped"))
        .filter(|e| str_field(e, "reason") == Some("store_unavailable"))
        .filter_map(|e| str_field(&e, "scheduled_at").map(str::to_string))
        .filter_map(|t| t.parse::<DateTime<Utc>>().ok())
        .map(|t| t.timestamp())
        .collect();
    let (excused, missing): (Vec<i64>, Vec<i64>) = expected[2..expected.len() - 2]
        .iter()
        .filter(|s| !seen.contains(s))
        .partition(|s| unanswered.contains(s));
    let missing: Vec<String> = missing
        .iter()
        .map(|s| rfc3339(DateTime::from_timestamp(*s, 0).unwrap()))
        .collect();
    assert!(
        excused.len() <= 2,
        "the store left {} instants unanswered ({excused:?}): too slow a machine to judge",
        excused.len()
    );
    assert!(
        missing.is_empty(),
        "scheduled instants that never ran while all daemons were up ({t0} .. {t1}): {missing:?}; ran: {:?}",
        ordered.iter().map(|r| &r.raw_scheduled_at).collect::<Vec<_>>()
    );
    // The daemons' logs agree with what the job saw: every run the job
    // recorded was logged as started, and every run that succeeded recorded
    // itself. (A run the final SIGTERM stopped, `shutdown`, may have been
    // terminated before its `echo`.)
    let mut started: BTreeSet<(String, i64)> = BTreeSet::new();
    let mut succeeded: BTreeSet<i64> = BTreeSet::new();
    for d in daemons {
        for e in d.all() {
            if str_field(&e, "job") != Some(job) {
                continue;
            }
            if is(&e, "job_started") {
                started.insert((
                    str_field(&e, "scheduled_at").unwrap_or("").to_string(),
                    token_of(&e),
                ));
            } else if is(&e, "job_finished") && str_field(&e, "outcome") == Some("succeeded") {
                succeeded.insert(token_of(&e));
            }
        }
    }
    let recorded: BTreeSet<(String, i64)> = runs
        .iter()
        .map(|r| (r.raw_scheduled_at.clone(), r.token))
        .collect();
    let unlogged: Vec<_> = recorded.difference(&started).collect();
    assert!(
        unlogged.is_empty(),
        "runs the job recorded without a job_started event: {unlogged:?}; started: {started:?}"
    );
    let unrecorded: Vec<_> = started
        .iter()
        .filter(|(_, token)| succeeded.contains(token))
        .filter(|run| !recorded.contains(*run))
        .collect();
    assert!(
        unrecorded.is_empty(),
        "runs that succeeded without recording themselves: {unrecorded:?}; recorded: {recorded:?}"
    );
}

#[test]
fn fleet_dedup_postgres() {
    fleet_dedup(Backend::Postgres, "fleet_dedup_postgres", 3, secs(20));
}

#[test]
fn fleet_dedup_mysql() {
    fleet_dedup(Backend::MySql, "fleet_dedup_mysql", 3, secs(12));
}

#[test]
fn fleet_dedup_sqlite() {
    fleet_dedup(Backend::Sqlite, "fleet_dedup_sqlite", 2, secs(12));
}

/// A node whose clock runs 30 s behind beside a correct one. The lagging
/// node starts first and alone, so that without a store-side check it
/// would take its (30 s old) instants and then hold the lease when the
/// correct node fires the current one. With the check the store refuses
/// every such instant as superseded: the lagging node never acquires,
/// logs `occurrence_skipped` reason `clock_behind` at WARN with its offset,
/// and every instant in the middle runs exactly once, on the correct node.
fn clock_behind(backend: Backend, test: &str) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let runs_file = dir.path().join("runs");
    let job = unique("behind");
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &[job_toml(&job, "*/2 * * * * *", &record_cmd(&runs_file), "")],
    );
    let mut lagging = Daemon::spawn(
        DaemonOpts::new(&format!("{}-lag", &job[..12]), &config, &store.url).faketime("-30s"),
    );
    let (_, behind) = lagging.expect_from(
        0,
        "occurrence_skipped clock_behind on the lagging node",
        |e| is(e, "occurrence_skipped") && str_field(e, "reason") == Some("clock_behind"),
        secs(30),
    );
    assert_eq!(str_field(&behind, "level"), Some("WARN"), "{behind}");
    let offset = i64_field(&behind, "offset_ms").expect("offset_ms");
    assert!(
        (-32_000..=-28_000).contains(&offset),
        "offset_ms {offset} is not about -30 s: {behind}"
    );
    let mut correct = Daemon::spawn(DaemonOpts::new(
        &format!("{}-ok", &job[..12]),
        &config,
        &store.url,
    ));
    correct.expect("daemon_started", ev("daemon_started"), secs(60));
    let t0 = Utc::now();
    let t1 = run_through(&runs_file, t0, secs(20), &[&lagging, &correct]);
    for d in [&lagging, &correct] {
        d.signal(Signal::SIGTERM);
    }
    for d in [&mut lagging, &mut correct] {
        let st = d.wait_exit(secs(20));
        assert!(st.is_some_and(|s| s.success()), "[{}] exit: {st:?}", d.node);
    }
    assert!(
        lagging.events("lease_acquired").is_empty() && lagging.events("job_started").is_empty(),
        "the lagging node took a lease: {}",
        lagging.summary()
    );
    let runs = read_runs(&runs_file);
    check_runs(&runs, &[&lagging, &correct], &job, 2, t0, t1);
    let skipped = lagging
        .events("occurrence_skipped")
        .iter()
        .filter(|e| str_field(e, "reason") == Some("clock_behind"))
        .count();
    assert!(skipped >= 10, "clock_behind logged {skipped} times in 20 s");
}

#[test]
fn clock_behind_sqlite() {
    clock_behind(Backend::Sqlite, "clock_behind_sqlite");
}

#[test]
fn clock_behind_postgres() {
    clock_behind(Backend::Postgres, "clock_behind_postgres");
}

/// A `fencecron put` rejected inside a job reaches the daemon's log as a
/// top-level `stale_write_rejected` event of that job, not only as text in
/// a `job_output` line.
#[test]
fn a_stale_put_inside_a_job_is_a_daemon_event_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "job_put").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("putter");
    // One token above its own: never issued, so `forged`.
    let script = r#""$FENCECRON_BIN" put k --value v --token $((FENCECRON_TOKEN + 1)); echo "put exited $?""#;
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "* * * * * *",
            &["sh".to_string(), "-c".to_string(), script.to_string()],
            "",
        )],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("putter", &config, &store.url));
    let rejected = d.expect(
        "stale_write_rejected from the job",
        |e: &Value| is(e, "stale_write_rejected") && str_field(e, "job") == Some(job.as_str()),
        secs(30),
    );
    let exited = d.expect(
        "the put's exit status",
        |e: &Value| {
            is(e, "job_output")
                && token_of(e) == i64_field(&rejected, "token").unwrap_or(-1) - 1
                && str_field(e, "line") == Some("put exited 3")
        },
        secs(10),
    );
    d.stop(secs(30));
    assert_eq!(str_field(&rejected, "level"), Some("WARN"), "{rejected}");
    assert_eq!(str_field(&rejected, "reason"), Some("forged"), "{rejected}");
    assert_eq!(
        str_field(&rejected, "resource"),
        Some(job.as_str()),
        "{rejected}"
    );
    assert_eq!(str_field(&rejected, "key"), Some("k"), "{rejected}");
    assert_eq!(
        i64_field(&rejected, "token"),
        Some(token_of(&exited) + 1),
        "{rejected}"
    );
    assert!(
        d.events("job_output").iter().all(|e| !str_field(e, "line")
            .unwrap_or("")
            .starts_with("FENCECRON_STALE_WRITE")),
        "the report line was also logged as output: {}",
        d.summary()
    );
}

/// Adds `[http] listen = "127.0.0.1:PORT"` to the config file.
fn serve_http(config: &Path, port: u16) {
    let text = std::fs::read_to_string(config).unwrap();
    std::fs::write(
        config,
        format!("[http]\nlisten = \"127.0.0.1:{port}\"\n{text}"),
    )
    .unwrap();
}

/// One HTTP/1.1 GET on 127.0.0.1:`port`: (status, body).
fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: fencecron\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The value of the sample `name{labels}` (labels exactly as rendered).
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// `[http] listen`: `/metrics` counts runs by outcome as the events say,
/// with durations, last success, skips and store calls; `/livez` stays 200;
/// `/readyz` turns 503 while the store is black-holed and 200 once it is
/// back. Scraping makes no store call.
#[test]
fn metrics_and_health_endpoints_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "metrics_postgres") else {
        return;
    };
    let (proxy, proxied) = Proxy::for_url(&store.url, 5432);
    let dir = tempfile::tempdir().expect("temp dir");
    let port = common::free_port();
    let good = unique("mgood");
    let bad = unique("mbad");
    let forger = unique("mforger");
    let sh = |script: &str| -> Vec<String> { vec!["sh".into(), "-c".into(), script.into()] };
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &[
            job_toml(&good, "* * * * * *", &sh("true"), ""),
            job_toml(&bad, "* * * * * *", &sh("exit 3"), ""),
            job_toml(
                &forger,
                "* * * * * *",
                &sh(r#""$FENCECRON_BIN" put k --value v --token $((FENCECRON_TOKEN + 1)) || true"#),
                "",
            ),
        ],
    );
    serve_http(&config, port);
    let mut d = Daemon::spawn(DaemonOpts::new("metrics", &config, &proxied));
    let finished = |job: &str| {
        let job = job.to_string();
        move |e: &Value| is(e, "job_finished") && str_field(e, "job") == Some(job.as_str())
    };
    d.expect("a good run", finished(&good), secs(30));
    d.expect("a bad run", finished(&bad), secs(30));
    d.expect(
        "a forged put",
        |e: &Value| is(e, "stale_write_rejected") && str_field(e, "job") == Some(forger.as_str()),
        secs(30),
    );

    let count = |job: &str| {
        d.events("job_finished")
            .iter()
            .filter(|e| finished(job)(e))
            .count() as f64
    };
    let before = (count(&good), count(&bad));
    let (status, body) = http_get(port, "/metrics");
    assert_eq!(status, 200, "{body}");
    let ok_runs = sample(
        &body,
        &format!("fencecron_job_runs_total{{job=\"{good}\",outcome=\"succeeded\"}}"),
    )
    .unwrap_or_else(|| panic!("no succeeded runs of {good}:\n{body}"));
    let bad_runs = sample(
        &body,
        &format!("fencecron_job_runs_total{{job=\"{bad}\",outcome=\"failed\"}}"),
    )
    .unwrap_or_else(|| panic!("no failed runs of {bad}:\n{body}"));
    let after = eventually(
        || (count(&good), count(&bad)),
        |c| c.0 >= ok_runs && c.1 >= bad_runs,
        secs(10),
    );
    assert!(
        (before.0..=after.0).contains(&ok_runs),
        "{ok_runs} vs {before:?}..{after:?}"
    );
    assert!(
        (before.1..=after.1).contains(&bad_runs),
        "{bad_runs} vs {before:?}..{after:?}"
    );
    let durations = sample(
        &body,
        &format!("fencecron_job_duration_seconds_count{{job=\"{good}\"}}"),
    );
    assert!(durations.is_some_and(|n| n >= ok_runs), "{body}");
    let last = sample(
        &body,
        &format!("fencecron_job_last_success_timestamp_seconds{{job=\"{good}\"}}"),
    )
    .unwrap_or_else(|| panic!("no last success:\n{body}"));
    assert!(
        (last - Utc::now().timestamp() as f64).abs() < 120.0,
        "{last}"
    );
    assert!(sample(
        &body,
        &format!("fencecron_job_last_success_timestamp_seconds{{job=\"{bad}\"}}")
    )
    .is_none());
    assert!(
        body.contains("fencecron_build_info{version=") && body.contains(",commit=\""),
        "{body}"
    );
    let stale = sample(
        &body,
        &format!("fencecron_stale_writes_rejected_total{{job=\"{forger}\"}}"),
    );
    assert!(stale.is_some_and(|n| n >= 1.0), "{body}");
    assert!(
        sample(
            &body,
            // Every first attempt is a claim (it creates a new row too).
            "fencecron_store_latency_seconds_count{operation=\"claim\"}"
        )
        .is_some_and(|n| n >= 1.0),
        "{body}"
    );
    assert!(
        body.contains("fencecron_fire_lateness_seconds_count"),
        "{body}"
    );
    assert_eq!(http_get(port, "/livez").0, 200);
    assert_eq!(http_get(port, "/readyz").0, 200);

    proxy.blackhole();
    let deadline = std::time::Instant::now() + secs(30);
    while http_get(port, "/readyz").0 != 503 {
        assert!(
            std::time::Instant::now() < deadline,
            "/readyz still 200 with the store black-holed"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        http_get(port, "/livez").0,
        200,
        "/livez follows the loop, not the store"
    );
    let (_, body) = http_get(port, "/metrics");
    assert!(
        body.contains("fencecron_store_errors_total{operation="),
        "{body}"
    );
    assert!(
        body.contains("fencecron_occurrences_skipped_total{job="),
        "{body}"
    );
    proxy.restore();
    let deadline = std::time::Instant::now() + secs(60);
    while http_get(port, "/readyz").0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "/readyz still 503 after the store came back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(http_get(port, "/nope").0, 404);
    d.stop(secs(30));
}

/// `probe()` once `done` holds for it, or its last value after `timeout`.
fn eventually<T>(probe: impl Fn() -> T, done: impl Fn(&T) -> bool, timeout: Duration) -> T {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let v = probe();
        if done(&v) || std::time::Instant::now() >= deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Three daemons on one PostgreSQL, each serving `/metrics`: runs that
/// succeed and fail, occurrences skipped because another host holds the
/// lease, and a lease lost on the daemon whose store connection goes dark
/// move each daemon's counters exactly as that daemon's events say.
#[test]
fn metrics_across_three_daemons_follow_their_events_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "metrics_fleet_postgres") else {
        return;
    };
    let (proxy, proxied) = Proxy::for_url(&store.url, 5432);
    let dir = tempfile::tempdir().expect("temp dir");
    let good = unique("fgood");
    let bad = unique("fbad");
    let long = unique("flong");
    let sh = |script: &str| -> Vec<String> { vec!["sh".into(), "-c".into(), script.into()] };
    let jobs = [
        job_toml(&good, "* * * * * *", &sh("true"), ""),
        job_toml(&bad, "* * * * * *", &sh("exit 3"), ""),
        job_toml(&long, "*/2 * * * * *", &sh("exec sleep 60"), ""),
    ];
    let ports = [
        common::free_port(),
        common::free_port(),
        common::free_port(),
    ];
    let spawn = |i: usize, url: &str| {
        let sub = dir.path().join(format!("n{i}"));
        std::fs::create_dir(&sub).unwrap();
        let config = write_config(&sub, "lease = \"5s\"", &jobs);
        serve_http(&config, ports[i]);
        Daemon::spawn(DaemonOpts::new(&format!("fleet{i}"), &config, url))
    };
    let of = |event: &'static str, job: &str| {
        let job = job.to_string();
        move |e: &Value| is(e, event) && str_field(e, "job") == Some(job.as_str())
    };
    // A (through the proxy) takes the long job first.
    let mut a = spawn(0, &proxied);
    a.expect("A runs the long job", of("job_started", &long), secs(30));
    let mut b = spawn(1, &store.url);
    let mut c = spawn(2, &store.url);
    for d in [&b, &c] {
        d.expect("daemon_started", ev("daemon_started"), secs(30));
    }
    // B and C see it held; then A's store goes dark and A loses it.
    first_on_any(
        &[&b, &c],
        "a held skip of the long job",
        |e| of("occurrence_skipped", &long)(e) && str_field(e, "reason") == Some("held"),
        secs(30),
    );
    proxy.blackhole();
    a.expect(
        "A loses the long job's lease",
        of("lease_lost", &long),
        secs(30),
    );
    first_on_any(
        &[&b, &c],
        "a good run on B or C",
        of("job_finished", &good),
        secs(30),
    );
    first_on_any(
        &[&b, &c],
        "a bad run on B or C",
        of("job_finished", &bad),
        secs(30),
    );

    let daemons = [&a, &b, &c];
    for (i, d) in daemons.iter().enumerate() {
        let count =
            |pred: &dyn Fn(&Value) -> bool| d.all().iter().filter(|e| pred(e)).count() as f64;
        let finished_with = |job: &str, outcome: &'static str| {
            let of = of("job_finished", job);
            move |e: &Value| of(e) && str_field(e, "outcome") == Some(outcome)
        };
        let good_ok = finished_with(&good, "succeeded");
        let bad_failed = finished_with(&bad, "failed");
        let lost = of("lease_lost", &long);
        let held = |e: &Value| {
            of("occurrence_skipped", &long)(e) && str_field(e, "reason") == Some("held")
        };
        let counts = || {
            [
                count(&good_ok),
                count(&bad_failed),
                count(&lost),
                count(&held),
            ]
        };
        let before = counts();
        let (status, body) = http_get(ports[i], "/metrics");
        assert_eq!(status, 200, "[{}] {body}", d.node);
        let got = [
            format!("fencecron_job_runs_total{{job=\"{good}\",outcome=\"succeeded\"}}"),
            format!("fencecron_job_runs_total{{job=\"{bad}\",outcome=\"failed\"}}"),
            format!("fencecron_lease_lost_total{{job=\"{long}\",reason=\"deadline_passed\"}}"),
            format!("fencecron_occurrences_skipped_total{{job=\"{long}\",reason=\"held\"}}"),
        ]
        .map(|series| sample(&body, &series).unwrap_or(0.0));
        // A metric moves just before its event's line is logged: every
        // event logged before the scrape is counted, and every count is an
        // event that shows up in the log.
        let after = eventually(counts, |c| (0..4).all(|k| c[k] >= got[k]), secs(10));
        for k in 0..4 {
            assert!(
                (before[k]..=after[k]).contains(&got[k]),
                "[{}] metric {k}: {} not within the events' {}..={}\n{body}",
                d.node,
                got[k],
                before[k],
                after[k]
            );
        }
        let durations = sample(
            &body,
            &format!("fencecron_job_duration_seconds_count{{job=\"{good}\"}}"),
        );
        assert!(durations.unwrap_or(0.0) >= got[0], "[{}] {body}", d.node);
    }
    // The loss happened on A, the held skips on B or C.
    assert!(a.all().iter().any(of("lease_lost", &long)));
    let (_, a_body) = http_get(ports[0], "/metrics");
    assert!(
        sample(
            &a_body,
            &format!("fencecron_lease_lost_total{{job=\"{long}\",reason=\"deadline_passed\"}}")
        )
        .is_some_and(|n| n >= 1.0),
        "{a_body}"
    );
    proxy.restore();
    for d in [&mut a, &mut b, &mut c] {
        d.stop(secs(60));
    }
}

/// `starting_deadline`: a daemon paused across an instant (SIGSTOP) skips
/// that instant with reason `deadline` when it resumes too late, and runs
/// the next one on time.
#[test]
fn starting_deadline_skips_an_instant_a_paused_daemon_resumes_too_late_for_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "starting_deadline").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("deadline");
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "*/5 * * * * *",
            &["true".to_string()],
            "starting_deadline = \"1s\"",
        )],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("deadline", &config, &store.url));
    // Paused only once the run is over and its lease released.
    let first = d.expect("a first run", ev("lease_released"), secs(30));
    let first = d.expect(
        "its start",
        |e: &Value| is(e, "job_started") && token_of(e) == token_of(&first),
        secs(5),
    );
    let t: DateTime<Utc> = str_field(&first, "scheduled_at").unwrap().parse().unwrap();
    // Paused shortly before the next instant, past it by more than the
    // deadline. Not right after the release: the run's task may not have
    // left the node's running set yet, and resumed, it would race the next
    // instant (which would then skip as `held`).
    let stop_at = t + chrono::Duration::milliseconds(4_500);
    while Utc::now() < stop_at {
        std::thread::sleep(Duration::from_millis(20));
    }
    d.signal(Signal::SIGSTOP);
    let resume_at = t + chrono::Duration::seconds(7);
    while Utc::now() < resume_at {
        std::thread::sleep(Duration::from_millis(50));
    }
    d.signal(Signal::SIGCONT);
    let next = rfc3339(t + chrono::Duration::seconds(5));
    let skipped = d.expect(
        "the late instant skipped with deadline",
        |e: &Value| {
            is(e, "occurrence_skipped") && str_field(e, "scheduled_at") == Some(next.as_str())
        },
        secs(15),
    );
    assert_eq!(str_field(&skipped, "reason"), Some("deadline"), "{skipped}");
    let after = rfc3339(t + chrono::Duration::seconds(10));
    d.expect(
        "the instant after it runs",
        |e: &Value| is(e, "job_started") && str_field(e, "scheduled_at") == Some(after.as_str()),
        secs(15),
    );
    assert!(
        !d.events("job_started")
            .iter()
            .any(|e| str_field(e, "scheduled_at") == Some(next.as_str())),
        "the late instant ran: {}",
        d.summary()
    );
    d.stop(secs(30));
}

/// `catchup`: after a pause across an instant, a `latest` job runs that
/// instant late once; a `none` job skips it (`missed`) and runs the next
/// one on time.
#[test]
fn catchup_latest_runs_the_missed_instant_and_none_skips_it_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "catchup").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let latest = unique("latest");
    let none = unique("none");
    let config = write_config(
        dir.path(),
        "",
        &[
            job_toml(&latest, "*/5 * * * * *", &["true".to_string()], ""),
            job_toml(
                &none,
                "*/5 * * * * *",
                &["true".to_string()],
                "catchup = \"none\"",
            ),
        ],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("catchup", &config, &store.url));
    let released = |job: &str| {
        let job = job.to_string();
        move |e: &Value| is(e, "lease_released") && str_field(e, "job") == Some(job.as_str())
    };
    // Both ran an instant t and released it; then a pause past t + 5 s.
    let first = d.expect("latest's first run", released(&latest), secs(30));
    let started_at = |job: &str, token: i64| {
        let job = job.to_string();
        move |e: &Value| {
            is(e, "job_started")
                && token_of(e) == token
                && str_field(e, "job") == Some(job.as_str())
        }
    };
    let started = d.expect("its start", started_at(&latest, token_of(&first)), secs(5));
    let t: DateTime<Utc> = str_field(&started, "scheduled_at")
        .unwrap()
        .parse()
        .unwrap();
    let at_t = rfc3339(t);
    let none_at_t = d.expect(
        "none's run of t",
        |e: &Value| {
            is(e, "job_started")
                && str_field(e, "job") == Some(none.as_str())
                && str_field(e, "scheduled_at") == Some(at_t.as_str())
        },
        secs(10),
    );
    let none_token = token_of(&none_at_t);
    d.expect(
        "none's lease of t released",
        |e: &Value| released(&none)(e) && token_of(e) == none_token,
        secs(10),
    );
    d.signal(Signal::SIGSTOP);
    let resume_at = t + chrono::Duration::seconds(7);
    while Utc::now() < resume_at {
        std::thread::sleep(Duration::from_millis(50));
    }
    d.signal(Signal::SIGCONT);
    let late = rfc3339(t + chrono::Duration::seconds(5));
    let next = rfc3339(t + chrono::Duration::seconds(10));
    let of = |event: &'static str, job: &str, at: &str| {
        let (job, at) = (job.to_string(), at.to_string());
        move |e: &Value| {
            is(e, event)
                && str_field(e, "job") == Some(job.as_str())
                && str_field(e, "scheduled_at") == Some(at.as_str())
        }
    };
    d.expect(
        "latest runs the late instant",
        of("job_started", &latest, &late),
        secs(15),
    );
    let skipped = d.expect(
        "none skips it",
        of("occurrence_skipped", &none, &late),
        secs(15),
    );
    assert_eq!(str_field(&skipped, "reason"), Some("missed"), "{skipped}");
    d.expect(
        "none runs the next instant",
        of("job_started", &none, &next),
        secs(15),
    );
    assert!(
        !d.all().iter().any(of("job_started", &none, &late)),
        "none ran the late instant: {}",
        d.summary()
    );
    d.stop(secs(30));
}

/// `on_failure` runs once after a run that did not succeed, with the
/// run's facts in its environment; not after a good run; a failing hook is
/// logged and not retried.
#[test]
fn on_failure_runs_after_a_failed_run_with_its_facts_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "on_failure").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = unique("hookbad");
    let good = unique("hookgood");
    let broken = unique("hookbroken");
    let out = dir.path().join("hook");
    let hook = format!(
        r#"on_failure = ["sh", "-c", "echo \"$FENCECRON_JOB $FENCECRON_OUTCOME $FENCECRON_EXIT_CODE $FENCECRON_TOKEN $FENCECRON_SCHEDULED_AT $FENCECRON_RUN_ID\" >> {}"]"#,
        out.display()
    );
    let config = write_config(
        dir.path(),
        "",
        &[
            job_toml(
                &bad,
                "* * * * * *",
                &["sh".into(), "-c".into(), "exit 4".into()],
                &hook,
            ),
            job_toml(&good, "* * * * * *", &["true".to_string()], &hook),
            job_toml(
                &broken,
                "* * * * * *",
                &["false".to_string()],
                r#"on_failure = ["sh", "-c", "echo no webhook today >&2; exit 7"]"#,
            ),
        ],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("hooks", &config, &store.url));
    let failed = d.expect(
        "a broken hook",
        |e: &Value| is(e, "on_failure_failed") && str_field(e, "job") == Some(broken.as_str()),
        secs(30),
    );
    assert_eq!(str_field(&failed, "level"), Some("WARN"), "{failed}");
    assert!(
        str_field(&failed, "error").is_some_and(|e| e.contains("no webhook today")),
        "{failed}"
    );
    d.expect(
        "the bad job's hook",
        |e: &Value| is(e, "on_failure_finished") && str_field(e, "job") == Some(bad.as_str()),
        secs(30),
    );
    d.expect(
        "a good run",
        |e: &Value| is(e, "job_finished") && str_field(e, "job") == Some(good.as_str()),
        secs(30),
    );
    d.stop(secs(30));

    let lines = std::fs::read_to_string(&out).expect("the hook wrote its file");
    let first = lines.lines().next().expect("one line");
    let fields: Vec<&str> = first.split(' ').collect();
    assert_eq!(fields[0], bad, "{lines}");
    assert_eq!(fields[1], "failed", "{lines}");
    assert_eq!(fields[2], "4", "{lines}");
    let token: i64 = fields[3].parse().expect("token");
    let run = d
        .events("job_finished")
        .into_iter()
        .find(|e| str_field(e, "job") == Some(bad.as_str()) && token_of(e) == token)
        .unwrap_or_else(|| panic!("no run of {bad} with token {token}"));
    assert_eq!(str_field(&run, "scheduled_at"), Some(fields[4]));
    assert_eq!(fields[5], format!("{bad}@{}", fields[4]));
    assert!(
        lines.lines().all(|l| !l.starts_with(&good)),
        "the hook ran after a good run: {lines}"
    );
    let hooks_of_broken = d
        .all()
        .iter()
        .filter(|e| is(e, "on_failure_failed") && str_field(e, "job") == Some(broken.as_str()))
        .count();
    let runs_of_broken = d
        .events("job_finished")
        .iter()
        .filter(|e| str_field(e, "job") == Some(broken.as_str()))
        .count();
    assert!(
        hooks_of_broken <= runs_of_broken,
        "a hook was retried: {hooks_of_broken} > {runs_of_broken}"
    );
}

/// FNV-1a 64, as docs/configuration.md specifies for `jitter`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `jitter` shifts every instant by the same offset on every host: three
/// daemons run each shifted instant exactly once, and `check` names the
/// offset.
#[test]
fn jitter_is_the_same_on_every_daemon_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "jitter").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    // A name whose offset in a 4 s window is not 0, so the shift shows.
    let job = std::iter::repeat_with(|| unique("jit"))
        .find(|n| fnv1a(n.as_bytes()) % 4 != 0)
        .expect("a name");
    let offset = (fnv1a(job.as_bytes()) % 4) as i64;
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "*/4 * * * * *",
            &["true".to_string()],
            "jitter = \"4s\"",
        )],
    );
    let check = common::harness::run(
        common::harness::fencecron(dir.path())
            .args(["check", "--config"])
            .arg(&config),
        None,
    );
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert!(
        stdout.contains(&format!("jitter: every instant +{offset}s")),
        "{stdout}"
    );
    let mut daemons: Vec<Daemon> = (0..3)
        .map(|i| Daemon::spawn(DaemonOpts::new(&format!("jit{i}"), &config, &store.url)))
        .collect();
    let started_at = |d: &Daemon| -> Vec<DateTime<Utc>> {
        d.events("job_started")
            .iter()
            .filter_map(|e| str_field(e, "scheduled_at").map(|t| t.parse().expect("instant")))
            .collect()
    };
    wait_until(
        secs(60),
        || daemons.iter().map(|d| started_at(d).len()).sum::<usize>() >= 4,
        || {
            format!(
                "fewer than 4 runs in 60 s: {:?}",
                daemons.iter().map(Daemon::summary).collect::<Vec<_>>()
            )
        },
    );
    for d in &mut daemons {
        d.stop(secs(30));
    }
    let mut all: Vec<DateTime<Utc>> = daemons.iter().flat_map(started_at).collect();
    all.sort();
    let n = all.len();
    all.dedup();
    assert_eq!(all.len(), n, "an instant ran twice: {all:?}");
    for at in &all {
        assert_eq!(
            (at.timestamp() - offset).rem_euclid(4),
            0,
            "{at} is not a */4 instant shifted by {offset}s: {all:?}"
        );
    }
}

// ---------------------------------------------------------------------------
// 2. Paused owner

#[test]
fn paused_owner_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "paused_owner_postgres") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("paused");
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "*/2 * * * * *",
            &long_cmd(dir.path()),
            "lease = \"5s\"",
        )],
    );
    let a = Daemon::spawn(DaemonOpts::new("paused-a", &config, &store.url).debug());
    let b = Daemon::spawn(DaemonOpts::new("paused-b", &config, &store.url).debug());
    let (owner_i, started) = first_on_any(&[&a, &b], "job_started", ev("job_started"), secs(60));
    let (owner, other) = if owner_i == 0 { (&a, &b) } else { (&b, &a) };
    let t1 = token_of(&started);
    let p1 = pid_of(&started);
    assert_eq!(
        read_pid_file(&dir.path().join(format!("pid.{t1}")), secs(10)),
        p1,
        "job_started.pid is not the job's pid"
    );

    owner.signal(Signal::SIGSTOP);
    eprintln!("SIGSTOPped {} running token {t1} (pid {p1})", owner.node);
    // After the lease expires by the store's clock, the other daemon takes a
    // later occurrence with a higher token.
    let later = other.expect(
        "job_started with a higher token on the other daemon",
        |e| is(e, "job_started") && token_of(e) > t1,
        secs(30),
    );
    let t2 = token_of(&later);
    let p2 = pid_of(&later);
    let acquired = other.expect(
        "lease_acquired for the new token",
        |e| is(e, "lease_acquired") && token_of(e) == t2,
        secs(5),
    );
    assert_eq!(
        str_field(&acquired, "node"),
        Some(other.node.as_str()),
        "{acquired}"
    );
    // The paused daemon could not kill its job, but the job's watchdog did,
    // on its own clock, before the lease expired: by the time another node
    // runs the job, the old run is gone.
    assert!(
        !pid_alive(p1),
        "the paused owner's job (pid {p1}, token {t1}) still runs beside token {t2}"
    );

    let resumed_at = owner.len();
    owner.signal(Signal::SIGCONT);
    eprintln!("SIGCONTed {}", owner.node);
    let (_, lost) = owner.expect_from(
        0,
        "lease_lost for the paused run",
        |e| is(e, "lease_lost") && token_of(e) == t1,
        secs(15),
    );
    assert_eq!(str_field(&lost, "job"), Some(job.as_str()), "{lost}");
    assert_eq!(
        str_field(&lost, "node"),
        Some(owner.node.as_str()),
        "{lost}"
    );
    let (_, cancelled) = owner.expect_from(
        0,
        "job_cancelled for the paused run",
        |e| is(e, "job_cancelled") && token_of(e) == t1,
        secs(15),
    );
    assert!(
        matches!(
            str_field(&cancelled, "reason"),
            Some("lease_lost" | "lease_unconfirmed")
        ),
        "job_cancelled reason: {cancelled}"
    );
    assert!(
        wait_pid_gone(p1, secs(15)),
        "the paused owner's job (pid {p1}, token {t1}) is still running after SIGCONT"
    );
    // The new owner's run is undisturbed.
    assert!(
        pid_alive(p2),
        "the new owner's job (pid {p2}, token {t2}) died"
    );
    assert!(
        other.events("job_cancelled").is_empty(),
        "the new owner cancelled a job: {:?}",
        other.events("job_cancelled")
    );
    // The resumed daemon never renews the old token again.
    let renewed_after = owner
        .all()
        .iter()
        .skip(resumed_at)
        .filter(|e| is(e, "lease_renewed") && token_of(e) == t1)
        .count();
    assert_eq!(
        renewed_after, 0,
        "the stale owner renewed token {t1} after SIGCONT"
    );
    // lease_lost is also stored, for `fencecron stale` on every host. The
    // record is written in the background after the event is logged: wait
    // for it rather than read once.
    let deadline = std::time::Instant::now() + secs(20);
    loop {
        let out = run(
            common::harness::fencecron(dir.path())
                .args(["stale", "--json", "--since", "10m", "--store", &store.url]),
            None,
        );
        assert!(out.status.success(), "fencecron stale failed");
        let stale: Vec<Value> = serde_json::from_slice(&out.stdout).expect("stale --json is JSON");
        if stale.iter().any(|r| {
            str_field(r, "kind") == Some("lease_lost")
                && str_field(r, "resource") == Some(job.as_str())
                && i64_field(r, "token") == Some(t1)
        }) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no stored lease_lost record for {job} token {t1}: {stale:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

// ---------------------------------------------------------------------------
// 3. Store unreachable mid-run

/// A direct connection to PostgreSQL (not through the proxy).
struct Pg {
    rt: tokio::runtime::Runtime,
    conn: sqlx::PgConnection,
}

impl Pg {
    fn connect(url: &str) -> Pg {
        use sqlx::Connection;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let conn = rt
            .block_on(sqlx::PgConnection::connect(url))
            .expect("direct PostgreSQL connection");
        Pg { rt, conn }
    }

    /// (fence, expires_at_ms, the server's clock now in ms) for a resource.
    fn lease(&mut self, resource: &str) -> (i64, i64, i64) {
        self.rt
            .block_on(
                sqlx::query_as::<_, (i64, i64, i64)>(
                    "SELECT fence, expires_at_ms, \
                     (floor(extract(epoch FROM clock_timestamp()) * 1000))::bigint \
                     FROM fencecron_leases WHERE resource = $1",
                )
                .bind(resource)
                .fetch_one(&mut self.conn),
            )
            .expect("read the lease row")
    }
}

#[test]
fn store_unreachable_mid_run_postgres() {
    let Some(store) = TestStore::new(Backend::Postgres, "store_unreachable_mid_run_postgres")
    else {
        return;
    };
    let (proxy, proxied) = Proxy::for_url(&store.url, 5432);
    let mut pg = Pg::connect(&store.url);
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("unreach");
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "*/2 * * * * *",
            &long_cmd(dir.path()),
            "lease = \"6s\"",
        )],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("unreach", &config, &proxied).debug());
    let started = d.expect("job_started", ev("job_started"), secs(60));
    let t1 = token_of(&started);
    let p1 = pid_of(&started);
    // Mid-run: at least one renewal went through.
    d.expect(
        "lease_renewed for the running job",
        |e| is(e, "lease_renewed") && token_of(e) == t1,
        secs(15),
    );

    proxy.blackhole();
    let cut = d.len();
    assert!(
        wait_pid_gone(p1, secs(20)),
        "the job (pid {p1}) is still running 20 s after the store became unreachable"
    );
    // Read right after the death was seen: the server's clock now is later
    // than the death; no renewal can have moved the expiry meanwhile.
    let (fence, expires_at_ms, db_now_ms) = pg.lease(&job);
    eprintln!(
        "job pid {p1} seen dead at store time {db_now_ms}; stored expiry {expires_at_ms} (fence {fence})"
    );
    assert_eq!(fence, t1, "someone else took the lease meanwhile");
    assert!(
        db_now_ms < expires_at_ms,
        "the job's death was first seen at store time {db_now_ms}, {} ms after the stored expiry {}: \
         it outlived its lease",
        db_now_ms - expires_at_ms,
        rfc3339(DateTime::from_timestamp_millis(expires_at_ms).unwrap())
    );
    let (_, cancelled) = d.expect_from(
        cut,
        "job_cancelled with reason lease_unconfirmed",
        |e| is(e, "job_cancelled") && token_of(e) == t1,
        secs(10),
    );
    assert_eq!(
        str_field(&cancelled, "reason"),
        Some("lease_unconfirmed"),
        "{cancelled}"
    );
    assert!(
        matches!(str_field(&cancelled, "signal"), Some("SIGTERM" | "SIGKILL")),
        "{cancelled}"
    );
    d.expect_from(cut, "store_unavailable", ev("store_unavailable"), secs(20));
    // Still unreachable past the stored expiry: the daemon keeps running and
    // starts nothing.
    loop {
        let (_, exp, now) = pg.lease(&job);
        if now > exp + 2000 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Occurrences due meanwhile are skipped and say why.
    let (_, skipped) = d.expect_from(
        cut,
        "occurrence_skipped with reason store_unavailable while black-holed",
        |e| is(e, "occurrence_skipped") && str_field(e, "reason") == Some("store_unavailable"),
        secs(20),
    );
    eprintln!("skipped while unreachable: {skipped}");
    assert!(
        d.is_running(),
        "the daemon exited while the store was unreachable"
    );
    assert_eq!(
        d.all()
            .iter()
            .skip(cut)
            .filter(|e| is(e, "job_started"))
            .count(),
        0,
        "a job started while the store was unreachable"
    );

    proxy.restore();
    let again = d.expect(
        "job_started after the store came back",
        |e| is(e, "job_started") && token_of(e) > t1,
        secs(40),
    );
    assert!(d.is_running());
    eprintln!(
        "ran again with token {} for {}",
        token_of(&again),
        str_field(&again, "scheduled_at").unwrap_or("?")
    );
}

// ---------------------------------------------------------------------------
// 4. Signals

/// SIGTERM with `shutdown_grace = "0s"`: no drain, the job is stopped at
/// once.
#[test]
fn sigterm_with_no_shutdown_grace_stops_job_releases_lease_exits_0_sqlite() {
    shutdown_on(Signal::SIGTERM);
}

/// SIGINT stops at once, whatever `shutdown_grace` says (here an hour).
#[test]
fn sigint_stops_job_releases_lease_exits_0_sqlite() {
    shutdown_on(Signal::SIGINT);
}

/// `sig` while a job runs: the job's whole process group is terminated
/// (SIGTERM, then SIGKILL after the grace), the lease released, exit 0;
/// the run is not a failure (`job_stopped`, no `job_failed`, no
/// `job_cancelled`).
fn shutdown_on(sig: Signal) {
    let store = TestStore::new(Backend::Sqlite, "shutdown").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique(&format!("{sig}").to_lowercase());
    // Ignores SIGTERM (and so does its `sleep`): only the SIGKILL after the
    // grace period ends the process group.
    let argv: Vec<String> = vec![
        "sh".into(),
        "-c".into(),
        r#"trap '' TERM; echo $$ > "$1/pid"; while :; do sleep 1; done"#.into(),
        "sh".into(),
        dir.path().display().to_string(),
    ];
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(&job, "*/2 * * * * *", &argv, "lease = \"5s\"")],
    );
    // SIGTERM: no drain at all; SIGINT: stops at once however long the
    // drain would be.
    let grace = if sig == Signal::SIGTERM { "0s" } else { "1h" };
    let text = std::fs::read_to_string(&config).expect("jobs.toml");
    std::fs::write(
        &config,
        format!("[node]\nshutdown_grace = \"{grace}\"\n{text}"),
    )
    .expect("jobs.toml");
    let mut d = Daemon::spawn(DaemonOpts::new(
        &format!("{sig}").to_lowercase(),
        &config,
        &store.url,
    ));
    let started = d.expect("job_started", ev("job_started"), secs(60));
    let token = token_of(&started);
    let pgid = pid_of(&started);
    assert_eq!(read_pid_file(&dir.path().join("pid"), secs(10)), pgid);

    d.signal(sig);
    let status = d
        .wait_exit(secs(30))
        .unwrap_or_else(|| panic!("the daemon did not exit after {sig}"));
    assert_eq!(
        status.code(),
        Some(0),
        "exit status after {sig}: {status:?}"
    );
    assert!(
        !common::daemon::group_alive(pgid),
        "the job's process group {pgid} survived the daemon's shutdown"
    );
    let all = d.all();
    let pos = |pred: &dyn Fn(&Value) -> bool, what: &str| -> usize {
        all.iter()
            .position(pred)
            .unwrap_or_else(|| panic!("no {what}: {}", d.summary()))
    };
    let stopping = pos(&|e| is(e, "daemon_stopping"), "daemon_stopping");
    assert_eq!(
        i64_field(&all[stopping], "drain_ms"),
        Some(0),
        "{}",
        all[stopping]
    );
    let finished = pos(
        &|e| is(e, "job_finished") && token_of(e) == token,
        "job_finished",
    );
    let fin = &all[finished];
    assert_eq!(str_field(fin, "outcome"), Some("shutdown"), "{fin}");
    assert_eq!(str_field(fin, "signal"), Some("SIGKILL"), "{fin}");
    assert_eq!(str_field(fin, "node"), Some(d.node.as_str()), "{fin}");
    assert_eq!(str_field(fin, "resource"), Some(job.as_str()), "{fin}");
    assert_eq!(
        str_field(fin, "scheduled_at"),
        str_field(&started, "scheduled_at"),
        "{fin}"
    );
    let stopped_run = pos(
        &|e| is(e, "job_stopped") && token_of(e) == token,
        "job_stopped",
    );
    let st = &all[stopped_run];
    assert_eq!(str_field(st, "level"), Some("INFO"), "{st}");
    assert_eq!(str_field(st, "reason"), Some("shutdown"), "{st}");
    assert_eq!(str_field(st, "signal"), Some("SIGKILL"), "{st}");
    assert!(finished < stopped_run, "job_stopped after job_finished");
    for event in ["job_failed", "job_cancelled"] {
        assert!(
            d.events(event).is_empty(),
            "a run ended by a shutdown is not a failure: {}",
            d.summary()
        );
    }
    let released = pos(
        &|e| is(e, "lease_released") && token_of(e) == token,
        "lease_released",
    );
    let stopped = pos(&|e| is(e, "daemon_stopped"), "daemon_stopped");
    assert!(
        stopping < finished && finished < released && released < stopped,
        "shutdown order: daemon_stopping@{stopping} job_finished@{finished} \
         lease_released@{released} daemon_stopped@{stopped}"
    );
    assert_eq!(str_field(&all[released], "job"), Some(job.as_str()));
    let leases = lease_list(&store.url);
    let row = leases
        .iter()
        .find(|l| str_field(l, "resource") == Some(job.as_str()))
        .unwrap_or_else(|| panic!("{job} not in lease list: {leases:?}"));
    assert_eq!(row.get("held"), Some(&Value::Bool(false)), "{row}");
    assert_eq!(i64_field(row, "token"), Some(token), "{row}");
}

/// `job_finished` names the run (node, resource, scheduled instant,
/// outcome); a run that did not succeed also logs `job_failed` at WARN, and
/// one that did does not.
#[test]
fn job_finished_names_the_run_and_failures_warn_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "job_finished").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let good = unique("good");
    let bad = unique("bad");
    let sh = |script: &str| -> Vec<String> { vec!["sh".into(), "-c".into(), script.into()] };
    let config = write_config(
        dir.path(),
        "",
        &[
            job_toml(
                &good,
                "* * * * * *",
                &sh("echo \"run_id=$FENCECRON_RUN_ID\""),
                "",
            ),
            job_toml(&bad, "* * * * * *", &sh("kill -USR1 $$"), ""),
        ],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("finished", &config, &store.url));
    let finished_of = |job: &str| {
        let job = job.to_string();
        move |e: &Value| is(e, "job_finished") && str_field(e, "job") == Some(job.as_str())
    };
    let good_end = d.expect("good job_finished", finished_of(&good), secs(30));
    let bad_end = d.expect("bad job_finished", finished_of(&bad), secs(30));
    let failed = d.expect(
        "job_failed",
        |e: &Value| is(e, "job_failed") && token_of(e) == token_of(&bad_end),
        secs(10),
    );
    d.stop(secs(30));

    for (end, job) in [(&good_end, &good), (&bad_end, &bad)] {
        assert_eq!(str_field(end, "node"), Some(d.node.as_str()), "{end}");
        assert_eq!(str_field(end, "resource"), Some(job.as_str()), "{end}");
        let at = str_field(end, "scheduled_at").unwrap_or_else(|| panic!("{end}"));
        assert!(at.parse::<DateTime<Utc>>().is_ok(), "{end}");
        assert_eq!(str_field(end, "level"), Some("INFO"), "{end}");
    }
    assert_eq!(
        str_field(&good_end, "outcome"),
        Some("succeeded"),
        "{good_end}"
    );
    assert_eq!(i64_field(&good_end, "exit_code"), Some(0), "{good_end}");
    // FENCECRON_RUN_ID names the occurrence: job and scheduled instant.
    let run_id = d
        .events("job_output")
        .into_iter()
        .find(|e| token_of(e) == token_of(&good_end) && str_field(e, "job") == Some(good.as_str()))
        .unwrap_or_else(|| panic!("no output of the good job: {}", d.summary()));
    assert_eq!(
        str_field(&run_id, "line").map(str::to_string),
        Some(format!(
            "run_id={good}@{}",
            str_field(&good_end, "scheduled_at").expect("scheduled_at")
        )),
        "{run_id}"
    );
    assert_eq!(str_field(&bad_end, "outcome"), Some("failed"), "{bad_end}");
    assert_eq!(str_field(&bad_end, "signal"), Some("SIGUSR1"), "{bad_end}");
    assert_eq!(str_field(&failed, "level"), Some("WARN"), "{failed}");
    assert_eq!(str_field(&failed, "outcome"), Some("failed"), "{failed}");
    assert_eq!(str_field(&failed, "signal"), Some("SIGUSR1"), "{failed}");
    assert_eq!(
        str_field(&failed, "scheduled_at"),
        str_field(&bad_end, "scheduled_at")
    );
    assert!(
        d.events("job_failed")
            .iter()
            .all(|e| str_field(e, "job") == Some(bad.as_str())),
        "only the failing job logs job_failed: {}",
        d.summary()
    );
}

#[test]
fn sighup_adds_a_job_and_leaves_running_ones_alone_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "sighup_add").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let long_job = unique("long");
    let new_job = unique("added");
    let long = job_toml(
        &long_job,
        "*/2 * * * * *",
        &long_cmd(dir.path()),
        "lease = \"5s\"",
    );
    let config = write_config(dir.path(), "", std::slice::from_ref(&long));
    let mut d = Daemon::spawn(DaemonOpts::new("sighup-add", &config, &store.url));
    let started = d.expect("job_started", ev("job_started"), secs(60));
    let p1 = pid_of(&started);

    let added_runs = dir.path().join("added-runs");
    write_config(
        dir.path(),
        "",
        &[
            long,
            job_toml(
                &new_job,
                "* * * * * *",
                &record_cmd(&added_runs),
                "lease = \"5s\"",
            ),
        ],
    );
    let cut = d.len();
    d.signal(Signal::SIGHUP);
    let (_, reloaded) = d.expect_from(cut, "config_reloaded", ev("config_reloaded"), secs(15));
    assert_eq!(i64_field(&reloaded, "added"), Some(1), "{reloaded}");
    assert_eq!(i64_field(&reloaded, "removed"), Some(0), "{reloaded}");
    assert_eq!(i64_field(&reloaded, "jobs"), Some(2), "{reloaded}");
    d.expect_from(
        cut,
        "job_started for the added job",
        |e| is(e, "job_started") && job_is(&new_job)(e),
        secs(15),
    );
    let deadline = std::time::Instant::now() + secs(10);
    while read_runs(&added_runs).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !read_runs(&added_runs).is_empty(),
        "the added job never wrote its run"
    );
    assert!(
        pid_alive(p1),
        "the running job (pid {p1}) did not survive the reload"
    );
    assert!(
        d.events("job_cancelled").is_empty(),
        "a job was cancelled by the reload: {:?}",
        d.events("job_cancelled")
    );
    assert!(d.is_running());
}

#[test]
fn sighup_with_an_invalid_file_keeps_the_old_jobs_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "sighup_invalid").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("kept");
    let runs_file = dir.path().join("runs");
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "* * * * * *",
            &record_cmd(&runs_file),
            "lease = \"5s\"",
        )],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("sighup-bad", &config, &store.url));
    d.expect("job_started", ev("job_started"), secs(60));

    std::fs::write(&config, "[[job]]\nname = \"broken\"\nschedule = \n").expect("write");
    let cut = d.len();
    d.signal(Signal::SIGHUP);
    let (at, invalid) = d.expect_from(cut, "config_invalid", ev("config_invalid"), secs(15));
    let error = str_field(&invalid, "error").unwrap_or("");
    assert!(
        error.contains(&config.display().to_string()),
        "config_invalid does not name the file: {invalid}"
    );
    assert!(
        d.all().iter().skip(cut).all(|e| !is(e, "config_reloaded")),
        "an invalid file was reported as reloaded"
    );
    // The old job keeps firing: two more distinct occurrences.
    let (i1, first) = d.expect_from(
        at + 1,
        "job_started after config_invalid",
        |e| is(e, "job_started") && job_is(&job)(e),
        secs(15),
    );
    let (_, second) = d.expect_from(
        i1 + 1,
        "a second job_started after config_invalid",
        |e| is(e, "job_started") && job_is(&job)(e),
        secs(15),
    );
    assert_ne!(
        str_field(&first, "scheduled_at"),
        str_field(&second, "scheduled_at")
    );
    assert!(d.is_running());
}

// ---------------------------------------------------------------------------
// 6. exec

fn exec(store: &str, cwd: &Path, resource: &str, argv: &[&str]) -> std::process::Output {
    let mut cmd = common::harness::fencecron(cwd);
    cmd.args(["--store", store, "exec", resource, "--lease", "5s", "--"])
        .args(argv);
    run(&mut cmd, None)
}

#[test]
fn exec_prints_the_token_and_exits_0() {
    let store = TestStore::new(Backend::Sqlite, "exec_token").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let res = unique("exec");
    let out = exec(
        &store.url,
        dir.path(),
        &res,
        &["sh", "-c", "echo $FENCECRON_TOKEN"],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let token: i64 = stdout
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("stdout {stdout:?} is not just the token: {e}"));
    assert!(token >= 1);
    let leases = lease_list(&store.url);
    let row = leases
        .iter()
        .find(|l| str_field(l, "resource") == Some(res.as_str()))
        .unwrap_or_else(|| panic!("{res} not in lease list: {leases:?}"));
    assert_eq!(i64_field(row, "token"), Some(token), "{row}");
    assert_eq!(
        row.get("held"),
        Some(&Value::Bool(false)),
        "not released: {row}"
    );
    // A second run is a new generation.
    let out = exec(
        &store.url,
        dir.path(),
        &res,
        &["sh", "-c", "echo $FENCECRON_TOKEN"],
    );
    let second: i64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("token");
    assert!(
        second > token,
        "second exec token {second} not above {token}"
    );
}

#[test]
fn exec_exit_codes() {
    let store = TestStore::new(Backend::Sqlite, "exec_codes").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");

    let out = exec(
        &store.url,
        dir.path(),
        &unique("code"),
        &["sh", "-c", "exit 7"],
    );
    assert_eq!(out.status.code(), Some(7), "the child's exit code: {out:?}");

    let out = exec(
        &store.url,
        dir.path(),
        &unique("term"),
        &["sh", "-c", "kill -TERM $$"],
    );
    assert_eq!(
        out.status.code(),
        Some(128 + 15),
        "killed by SIGTERM: {out:?}"
    );

    let held = unique("held");
    let acq = run(
        common::harness::fencecron(dir.path()).args([
            "--store", &store.url, "lease", "acquire", &held, "--lease", "60s", "--json",
        ]),
        None,
    );
    assert_eq!(acq.status.code(), Some(0), "lease acquire: {acq:?}");
    let marker = dir.path().join("ran");
    let marker_s = marker.display().to_string();
    let out = exec(
        &store.url,
        dir.path(),
        &held,
        &["sh", "-c", "touch \"$1\"", "sh", &marker_s],
    );
    assert_eq!(
        out.status.code(),
        Some(75),
        "lease held by someone else: {out:?}"
    );
    assert!(
        !marker.exists(),
        "the command ran although the lease was held"
    );
    assert!(
        !out.stderr.is_empty(),
        "no message on stderr for a held lease"
    );
}

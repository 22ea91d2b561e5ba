//! The fleet is visible and must agree (issue 26), through the real binary
//! and real daemons: `fencecron nodes` lists every daemon and shows one
//! killed with -9 as `gone`; two daemons that disagree about jobs log
//! `config_drift` once per change; `status` exits 3 for a job no live node
//! has; `status`, `runs`, `trigger`, `pause` and `resume` work with only
//! `--store` from a directory with no config. The store operations are in
//! the conformance suite, the heartbeat's state machine in
//! `src/daemon/heartbeat.rs`.

use std::path::Path;
use std::process::{Command, Output};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::common::daemon::{
    is, job_toml, secs, sh, str_field, wait_until, write_config, Daemon, DaemonOpts,
};
use crate::common::fresh::with_fresh_database;
use crate::common::harness::{code, describe, fencecron, run};
use crate::common::{unique, Backend, TestStore};

/// `fencecron --store URL [--config CONFIG] ARGS…` in `dir`.
fn cli(dir: &Path, store: &str, config: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd: Command = fencecron(dir);
    cmd.args(["--store", store]);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    cmd.args(args);
    run(cmd, None)
}

/// `nodes --json`, the rows of `names` only (other tests share the store).
/// With the test's config: a host's `/etc/fencecron/jobs.toml` would be
/// read otherwise.
fn nodes_of(dir: &Path, store: &str, config: &Path, names: &[&str]) -> Vec<Value> {
    let out = cli(dir, store, Some(config), &["nodes", "--json"]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let all: Vec<Value> =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
    all.into_iter()
        .filter(|n| names.contains(&str_field(n, "node").unwrap_or("")))
        .collect()
}

fn state_of(rows: &[Value], node: &str) -> Option<String> {
    rows.iter()
        .find(|n| str_field(n, "node") == Some(node))
        .and_then(|n| str_field(n, "state"))
        .map(str::to_string)
}

/// Three daemons on one store (on SQLite: three daemons of one host on one
/// file) are listed with every key; one killed with -9 shows `gone` within
/// the bound while the others stay `running`; one stopped cleanly shows
/// `gone` as soon as it exited.
fn nodes_lists_daemons_and_a_killed_one_goes(backend: Backend, test: &str) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("yearly");
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(&job, "0 0 1 1 *", &sh("true"), "")],
    );
    let names: Vec<String> = (1..=3).map(|i| unique(&format!("node{i}-"))).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut daemons: Vec<Daemon> = names
        .iter()
        .map(|n| Daemon::spawn(DaemonOpts::new(n, &config, &store.url)))
        .collect();
    let summary = |ds: &[Daemon]| {
        ds.iter()
            .map(Daemon::summary)
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut rows = Vec::new();
    wait_until(
        secs(60),
        || {
            rows = nodes_of(dir.path(), &store.url, &config, &names);
            rows.len() == 3
                && rows
                    .iter()
                    .all(|r| str_field(r, "state") == Some("running"))
        },
        || format!("three running nodes\n{}", summary(&daemons)),
    );
    let digest = str_field(&rows[0], "config_digest").unwrap().to_string();
    assert_eq!(digest.len(), 64, "{digest}");
    for (r, d) in rows.iter().zip(&daemons) {
        let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
        for key in [
            "node",
            "hostname",
            "pid",
            "version",
            "config_digest",
            "started_at",
            "last_seen",
            "state",
            "running",
        ] {
            assert!(keys.contains(&key), "{key} missing in {r}");
        }
        assert_eq!(str_field(r, "node"), Some(d.node.as_str()));
        assert_eq!(r["pid"].as_i64(), Some(i64::from(d.pid().as_raw())), "{r}");
        assert_eq!(str_field(r, "version"), Some(env!("CARGO_PKG_VERSION")));
        assert!(!str_field(r, "hostname").unwrap().is_empty());
        assert_eq!(
            str_field(r, "config_digest"),
            Some(digest.as_str()),
            "same config"
        );
        assert_eq!(r["running"].as_i64(), Some(0));
        for t in ["started_at", "last_seen"] {
            let text = str_field(r, t).unwrap();
            assert!(text.ends_with('Z'), "{t} {text}");
            chrono::DateTime::parse_from_rfc3339(text).unwrap();
        }
    }
    // The human table: a header and one line per node.
    let out = cli(dir.path(), &store.url, Some(&config), &["nodes"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("NODE"), "{text}");
    for n in &names {
        assert!(
            text.lines()
                .any(|l| l.starts_with(n) && l.contains("running")),
            "{text}"
        );
    }

    daemons[1].signal(Signal::SIGKILL);
    wait_until(
        secs(60),
        || {
            rows = nodes_of(dir.path(), &store.url, &config, &names);
            state_of(&rows, names[1]).as_deref() == Some("gone")
        },
        || format!("{} gone\n{}", names[1], summary(&daemons)),
    );
    assert_eq!(state_of(&rows, names[0]).as_deref(), Some("running"));
    assert_eq!(state_of(&rows, names[2]).as_deref(), Some("running"));

    // A clean exit marks the node at once.
    daemons[2].signal(Signal::SIGTERM);
    assert!(daemons[2].wait_exit(secs(30)).is_some_and(|s| s.success()));
    let rows = nodes_of(dir.path(), &store.url, &config, &names);
    assert_eq!(
        state_of(&rows, names[2]).as_deref(),
        Some("gone"),
        "{rows:?}"
    );
    assert_eq!(state_of(&rows, names[0]).as_deref(), Some("running"));
    daemons[0].stop(secs(30));
}

#[test]
fn nodes_lists_daemons_and_a_killed_one_goes_sqlite() {
    nodes_lists_daemons_and_a_killed_one_goes(Backend::Sqlite, "nodes_gone_sqlite");
}

#[test]
fn nodes_lists_daemons_and_a_killed_one_goes_postgres() {
    nodes_lists_daemons_and_a_killed_one_goes(Backend::Postgres, "nodes_gone_postgres");
}

#[test]
fn nodes_lists_daemons_and_a_killed_one_goes_mysql() {
    nodes_lists_daemons_and_a_killed_one_goes(Backend::MySql, "nodes_gone_mysql");
}

fn drift_of(job: &str) -> impl Fn(&Value) -> bool + '_ {
    move |e| is(e, "config_drift") && str_field(e, "job") == Some(job)
}

/// Two daemons: one job the same, one defined differently, one only the
/// first has. Each drifting job is logged once (naming the nodes on each
/// side), not at every beat; `status` and `nodes` show it; when the second
/// daemon stops, the drift ends (`config_drift_resolved`).
fn drift_is_logged_once_per_change(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    // A database of its own: every live node of a store takes part in the
    // drift, also other tests' daemons.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(with_fresh_database(&ts, |url| async move {
        if let Err(e) = tokio::task::spawn_blocking(move || drift_on(backend, &url)).await {
            std::panic::resume_unwind(e.into_panic());
        }
    }));
}

fn drift_on(backend: Backend, url: &str) {
    let store = TestStore::at(backend, url.to_string());
    let dir = tempfile::tempdir().expect("temp dir");
    let [same, changed, only] = ["same", "changed", "only"].map(unique);
    let (da, db) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&da).unwrap();
    std::fs::create_dir_all(&db).unwrap();
    let yearly = "0 0 1 1 *";
    let config_a = write_config(
        &da,
        "",
        &[
            job_toml(&same, yearly, &sh("true"), ""),
            job_toml(&changed, yearly, &sh("echo one"), ""),
            job_toml(&only, yearly, &sh("true"), ""),
        ],
    );
    let config_b = write_config(
        &db,
        "",
        &[
            job_toml(&same, yearly, &sh("true"), ""),
            job_toml(&changed, yearly, &sh("echo two"), ""),
        ],
    );
    let (na, nb) = (unique("drift-a-"), unique("drift-b-"));
    let a = Daemon::spawn(DaemonOpts::new(&na, &config_a, &store.url));
    let mut b = Daemon::spawn(DaemonOpts::new(&nb, &config_b, &store.url));

    let e = a.expect("changed drifts", drift_of(&changed), secs(60));
    let with = str_field(&e, "nodes_with").unwrap();
    assert!(with.contains(&na) && with.contains(&nb), "{e}");
    assert_eq!(e["definitions"].as_i64(), Some(2), "{e}");
    assert_eq!(str_field(&e, "nodes_without"), Some(""), "{e}");
    let e = a.expect("only drifts", drift_of(&only), secs(60));
    assert_eq!(str_field(&e, "nodes_without"), Some(nb.as_str()), "{e}");
    assert!(str_field(&e, "nodes_with").unwrap().contains(&na), "{e}");
    assert_eq!(str_field(&e, "level"), Some("WARN"));
    assert!(a
        .events("config_drift")
        .iter()
        .all(|e| str_field(e, "job") != Some(same.as_str())));
    // B sees the same drift.
    b.expect("B sees it", drift_of(&only), secs(60));

    // Four more beats of A: the drift is still logged once per job.
    let seen = |rows: &[Value]| -> i64 {
        let r = rows
            .iter()
            .find(|r| str_field(r, "node") == Some(na.as_str()));
        r.and_then(|r| str_field(r, "last_seen"))
            .map(|t| {
                chrono::DateTime::parse_from_rfc3339(t)
                    .unwrap()
                    .timestamp_millis()
            })
            .unwrap_or(0)
    };
    let start = seen(&nodes_of(dir.path(), &store.url, &config_a, &[&na]));
    wait_until(
        secs(60),
        || seen(&nodes_of(dir.path(), &store.url, &config_a, &[&na])) >= start + 20_000,
        || format!("A beats on\n{}", a.summary()),
    );
    assert_eq!(
        a.events("config_drift")
            .iter()
            .filter(|e| drift_of(&changed)(e))
            .count(),
        1
    );
    assert_eq!(
        a.events("config_drift")
            .iter()
            .filter(|e| drift_of(&only)(e))
            .count(),
        1
    );

    // `status` (with A's config) and `nodes` show it.
    let out = cli(&da, &store.url, Some(&config_a), &["status", "--json"]);
    let all: Vec<Value> =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
    let of = |job: &str| {
        all.iter()
            .find(|s| str_field(s, "job") == Some(job))
            .unwrap()
            .clone()
    };
    assert!(
        of(&changed)["config_drift"]["nodes_with"]
            .as_object()
            .unwrap()
            .len()
            == 2
    );
    assert_eq!(
        of(&only)["config_drift"]["nodes_without"][0].as_str(),
        Some(nb.as_str())
    );
    assert!(of(&same)["config_drift"].is_null());
    let out = cli(&da, &store.url, Some(&config_a), &["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("config drift: {changed}: ")),
        "{text}"
    );
    let out = cli(dir.path(), &store.url, Some(&config_a), &["nodes"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("config drift: {only}: "))
            && text.contains(&format!("missing on {nb}")),
        "{text}"
    );

    // B leaves cleanly: no drift among the live nodes any more.
    b.stop(secs(30));
    for job in [&changed, &only] {
        a.expect(
            "drift resolved",
            |e| is(e, "config_drift_resolved") && str_field(e, "job") == Some(job.as_str()),
            secs(60),
        );
    }
    drop(a);
}

#[test]
fn drift_is_logged_once_per_change_sqlite() {
    drift_is_logged_once_per_change(Backend::Sqlite, "nodes_drift_sqlite");
}

#[test]
fn drift_is_logged_once_per_change_postgres() {
    drift_is_logged_once_per_change(Backend::Postgres, "nodes_drift_postgres");
}

/// `status` exits 0 while a live daemon has every job and 3 when a job of
/// the config has no live node; with only `--store`, from a directory with
/// no config anywhere, `status`, `runs`, `pause`, `resume` and `trigger`
/// take the jobs from the definitions the daemon published. With neither a
/// config nor a store, `status` still refuses (no database is created).
#[test]
fn status_exits_3_when_overdue_and_works_with_only_the_store() {
    let Some(store) = TestStore::new(Backend::Sqlite, "nodes_status_sqlite") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let (job, missing) = (unique("kept"), unique("missing"));
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(&job, "0 0 1 1 *", &sh("echo hi"), "")],
    );
    let node = unique("status-");
    let d = Daemon::spawn(DaemonOpts::new(&node, &config, &store.url));
    let last = std::cell::RefCell::new(None);
    wait_until(
        secs(60),
        || {
            let out = cli(dir.path(), &store.url, Some(&config), &["status"]);
            let ok = code(&out) == 0;
            *last.borrow_mut() = Some(out);
            ok
        },
        || {
            format!(
                "status exits 0\n{}\n{}",
                last.borrow().as_ref().map(describe).unwrap_or_default(),
                d.summary()
            )
        },
    );

    // A config with a job no daemon runs: overdue, exit 3.
    let other = tempfile::tempdir().expect("temp dir");
    let config2 = write_config(
        other.path(),
        "",
        &[
            job_toml(&job, "0 0 1 1 *", &sh("echo hi"), ""),
            job_toml(&missing, "0 0 1 1 *", &sh("true"), ""),
        ],
    );
    let out = cli(
        other.path(),
        &store.url,
        Some(&config2),
        &["status", "--json"],
    );
    assert_eq!(code(&out), 3, "{}", describe(&out));
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let of = |j: &str| {
        all.iter()
            .find(|s| str_field(s, "job") == Some(j))
            .unwrap()
            .clone()
    };
    assert_eq!(of(&missing)["overdue"], Value::Bool(true));
    assert_eq!(
        str_field(&of(&missing), "overdue_reason"),
        Some("no live node has the job")
    );
    assert_eq!(of(&job)["overdue"], Value::Bool(false));
    assert_eq!(of(&job)["live_nodes"][0].as_str(), Some(node.as_str()));
    let out = cli(other.path(), &store.url, Some(&config2), &["status"]);
    assert_eq!(code(&out), 3);
    assert!(String::from_utf8_lossy(&out.stdout).contains("overdue: no live node has the job"));

    // Only --store, from an empty directory (the harness scrubs
    // FENCECRON_CONFIG and friends); only where the host has no
    // /etc/fencecron/jobs.toml (with one, the commands rightly use it).
    if Path::new("/etc/fencecron/jobs.toml").exists() {
        skipped!(
            "\n*** SKIPPED the --store-only part of status_exits_3_when_overdue_and_works_with_only_the_store: \
             /etc/fencecron/jobs.toml exists on this host. ***\n"
        );
        return;
    }
    let empty = tempfile::tempdir().expect("temp dir");
    let out = cli(empty.path(), &store.url, None, &["status", "--json"]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(str_field(&all[0], "job"), Some(job.as_str()));
    assert_eq!(str_field(&all[0], "schedule"), Some("0 0 1 1 *"));
    let out = cli(empty.path(), &store.url, None, &["pause", &job]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let out = cli(empty.path(), &store.url, None, &["resume", &job]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("resumed"));
    let out = cli(empty.path(), &store.url, None, &["pause", &missing]);
    assert_eq!(code(&out), 2, "an unknown job: {}", describe(&out));
    let out = cli(empty.path(), &store.url, None, &["trigger", &job, "--wait"]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("started on {node}")));
    let out = cli(empty.path(), &store.url, None, &["runs", "--json"]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let runs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        runs.iter()
            .any(|r| str_field(r, "job") == Some(job.as_str())),
        "{runs:?}"
    );
    assert!(
        std::fs::read_dir(empty.path()).unwrap().next().is_none(),
        "no database created here"
    );

    // Neither a config nor a store: refused, nothing created.
    let out = run(fencecron(empty.path()).arg("status"), None);
    assert_eq!(code(&out), 2, "{}", describe(&out));
    assert!(std::fs::read_dir(empty.path()).unwrap().next().is_none());
    drop(d);
}

/// A job whose instants all go unrun (its lease is held by hand, so every
/// instant is skipped as held) becomes overdue once an instant after the
/// daemon started is more than 60 s old: `status` exits 0 before, 3 after,
/// naming the instant.
#[test]
fn status_exits_3_once_an_instant_older_than_60s_has_no_run() {
    let Some(store) = TestStore::new(Backend::Sqlite, "nodes_overdue_sqlite") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("blocked");
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(&job, "* * * * * *", &sh("true"), "")],
    );
    let out = cli(
        dir.path(),
        &store.url,
        Some(&config),
        &["lease", "acquire", &job, "--lease", "300s"],
    );
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let d = Daemon::spawn(DaemonOpts::new(&unique("overdue-"), &config, &store.url));
    d.expect(
        "held skips",
        |e| is(e, "occurrence_skipped") && str_field(e, "job") == Some(job.as_str()),
        secs(30),
    );
    let status = || cli(dir.path(), &store.url, Some(&config), &["status", "--json"]);
    let first = status();
    assert_eq!(code(&first), 0, "young instants: {}", describe(&first));
    let last = std::cell::RefCell::new(None);
    wait_until(
        secs(150),
        || {
            let out = status();
            let overdue = code(&out) == 3;
            *last.borrow_mut() = Some(out);
            overdue
        },
        || {
            format!(
                "overdue\n{}\n{}",
                last.borrow().as_ref().map(describe).unwrap_or_default(),
                d.summary()
            )
        },
    );
    let out = last.borrow_mut().take().unwrap();
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let reason = str_field(&all[0], "overdue_reason")
        .unwrap_or_default()
        .to_string();
    assert!(
        reason.starts_with("the instant ") && reason.ends_with(" has no run"),
        "{reason}"
    );
    drop(d);
}

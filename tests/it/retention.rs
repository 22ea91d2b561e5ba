//! `[history]` retention of stale-owner records and stored values, through
//! the real binary: a daemon's hourly pass (the first a minute after start)
//! prunes what is older than the retention and keeps the rest, a held
//! lease's values whatever their age, and every lease row with its fence.

use crate::common;

use std::path::Path;

use serde_json::Value;

use common::daemon::{i64_field, is, job_toml, secs, write_config, Daemon, DaemonOpts};
use common::harness::{describe, fencecron, run};
use common::{unique, Backend, TestStore};

const DAY_MS: i64 = 86_400_000;

/// `fencecron <args> --store <store>`, which must exit 0; its stdout.
fn cli(dir: &Path, store: &str, args: &[&str]) -> String {
    let out = run(fencecron(dir).args(["--store", store]).args(args), None);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {}", describe(&out));
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Acquires `r` for `lease` and writes `result` under its token; returns
/// the token and owner.
fn acquire_and_put(dir: &Path, store: &str, r: &str, lease: &str) -> (i64, String) {
    let v: Value = serde_json::from_str(&cli(
        dir,
        store,
        &["lease", "acquire", r, "--lease", lease, "--json"],
    ))
    .expect("acquire --json");
    let token = v["token"].as_i64().expect("token");
    let owner = v["owner_id"].as_str().expect("owner_id").to_string();
    cli(
        dir,
        store,
        &[
            "put",
            "result",
            "--resource",
            r,
            "--token",
            &token.to_string(),
            "--owner-id",
            &owner,
            "--value",
            r,
        ],
    );
    (token, owner)
}

/// Runs `statements` on the SQLite store at `url`, each with its binds;
/// then the resources of `fencecron_values`.
fn sql(url: &str, statements: &[(&str, Vec<String>)]) -> Vec<String> {
    use sqlx::{Connection, Row};
    use std::str::FromStr;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url)
            .expect("sqlite URL")
            .busy_timeout(secs(30));
        let mut c = sqlx::SqliteConnection::connect_with(&opts)
            .await
            .expect("direct SQLite connection");
        for (statement, binds) in statements {
            let mut q = sqlx::query(statement);
            for b in binds {
                q = q.bind(b.clone());
            }
            q.execute(&mut c).await.expect("statement");
        }
        let rows = sqlx::query("SELECT resource FROM fencecron_values ORDER BY resource")
            .fetch_all(&mut c)
            .await
            .expect("values");
        rows.iter()
            .map(|r| r.get::<String, _>("resource"))
            .collect()
    })
}

#[test]
fn retention_prunes_old_stale_records_and_unused_values_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "retention").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let (url, d) = (&store.url, dir.path());
    // Held for the whole test, its value written 100 days ago: kept.
    let held = unique("ret-held");
    acquire_and_put(d, url, &held, "300s");
    // Released, value and lease 100 days old: pruned.
    let unused = unique("ret-unused");
    let (unused_token, unused_owner) = acquire_and_put(d, url, &unused, "300s");
    cli(
        d,
        url,
        &[
            "lease",
            "release",
            &unused,
            "--token",
            &unused_token.to_string(),
            "--owner-id",
            &unused_owner,
        ],
    );
    // Released, written a day ago: kept.
    let recent = unique("ret-recent");
    let (t, o) = acquire_and_put(d, url, &recent, "300s");
    cli(
        d,
        url,
        &[
            "lease",
            "release",
            &recent,
            "--token",
            &t.to_string(),
            "--owner-id",
            &o,
        ],
    );
    let ago = |days: i64| (days * DAY_MS).to_string();
    let stale = |resource: &str, days: i64| {
        (
            "INSERT INTO fencecron_stale (at_ms, kind, reason, resource, key, owner_id, token,
               accepted_token, node, job, stage, operation_id)
             VALUES (CAST(strftime('%s','now') AS INTEGER) * 1000 - CAST(?1 AS INTEGER),
               'write_rejected', 'stale', ?2, 'result', NULL, 1, 2, 'n', NULL, 'test',
               'op')",
            vec![ago(days), resource.to_string()],
        )
    };
    let values = sql(
        url,
        &[
            (
                "UPDATE fencecron_values SET written_at_ms = written_at_ms - CAST(?1 AS INTEGER)
                  WHERE resource IN (?2, ?3)",
                vec![ago(100), held.clone(), unused.clone()],
            ),
            (
                "UPDATE fencecron_values SET written_at_ms = written_at_ms - CAST(?1 AS INTEGER)
                  WHERE resource = ?2",
                vec![ago(1), recent.clone()],
            ),
            (
                "UPDATE fencecron_leases SET expires_at_ms = expires_at_ms - CAST(?1 AS INTEGER),
                   acquired_at_ms = acquired_at_ms - CAST(?1 AS INTEGER)
                  WHERE resource = ?2",
                vec![ago(100), unused.clone()],
            ),
            stale("ret-stale-old", 40),
            stale("ret-stale-new", 1),
        ],
    );
    assert_eq!(values.len(), 3, "{values:?}");

    let config = write_config(
        d,
        "",
        &[job_toml(
            &unique("ret-job"),
            "0 0 0 1 1 *",
            &["true".to_string()],
            "",
        )],
    );
    let mut daemon = Daemon::spawn(DaemonOpts::new("retention", &config, url).debug());
    let pruned = daemon.expect("history_pruned", |e| is(e, "history_pruned"), secs(180));
    daemon.stop(secs(30));
    assert_eq!(i64_field(&pruned, "stale"), Some(1), "{pruned}");
    assert_eq!(i64_field(&pruned, "values"), Some(1), "{pruned}");

    let mut kept = vec![held.clone(), recent.clone()];
    kept.sort();
    assert_eq!(
        sql(url, &[]),
        kept,
        "the unused value went, the others stay"
    );
    let records: Vec<Value> =
        serde_json::from_str(&cli(d, url, &["stale", "--json", "--limit", "0"])).expect("json");
    let resources: Vec<_> = records.iter().map(|r| r["resource"].clone()).collect();
    assert_eq!(resources, ["ret-stale-new"], "{records:?}");

    // The pruned value's lease row and fence stay: the next token is
    // greater than every earlier one.
    let v: Value = serde_json::from_str(&cli(
        d,
        url,
        &["lease", "acquire", &unused, "--lease", "5s", "--json"],
    ))
    .expect("acquire --json");
    assert_eq!(v["token"].as_i64(), Some(unused_token + 1), "{v}");
}

/// `lease forget`: refused while held (75) and for an unknown resource
/// (4); a released lease disappears from `lease list` until its resource is
/// acquired again, with a token greater than every earlier one.
#[test]
fn lease_forget_hides_a_removed_jobs_lease_and_tokens_keep_growing_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "forget").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let (url, d) = (&store.url, dir.path());
    let r = unique("forget");
    let code = |args: &[&str]| {
        run(fencecron(d).args(["--store", url]).args(args), None)
            .status
            .code()
    };
    let listed = || {
        let all: Vec<Value> =
            serde_json::from_str(&cli(d, url, &["lease", "list", "--json"])).expect("json");
        all.iter().any(|l| l["resource"] == r.as_str())
    };
    let (token, owner) = acquire_and_put(d, url, &r, "300s");
    assert_eq!(code(&["lease", "forget", &r]), Some(75), "held");
    assert!(listed());
    cli(
        d,
        url,
        &[
            "lease",
            "release",
            &r,
            "--token",
            &token.to_string(),
            "--owner-id",
            &owner,
        ],
    );
    assert_eq!(code(&["lease", "forget", &unique("never")]), Some(4));
    cli(d, url, &["lease", "forget", &r]);
    assert!(!listed(), "forgotten");
    let v: Value = serde_json::from_str(&cli(
        d,
        url,
        &["lease", "acquire", &r, "--lease", "5s", "--json"],
    ))
    .expect("acquire --json");
    assert!(v["token"].as_i64().expect("token") > token, "{v}");
    assert!(listed(), "acquired again: listed");
}

/// `stale --limit N`: the newest N records, still oldest first; 100 by
/// default, 0 for all.
#[test]
fn stale_limit_lists_the_newest_records_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "stale-limit").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let (url, d) = (&store.url, dir.path());
    cli(d, url, &["lease", "list"]);
    let insert = |resource: &str, ms: i64| {
        (
            "INSERT INTO fencecron_stale (at_ms, kind, reason, resource, key, owner_id, token,
               accepted_token, node, job, stage, operation_id)
             VALUES (CAST(?1 AS INTEGER), 'write_rejected', 'stale', ?2, 'k', NULL, 1, 2, 'n',
               NULL, 'test', 'op')",
            vec![ms.to_string(), resource.to_string()],
        )
    };
    let mut statements: Vec<_> = (0..102)
        .map(|i| insert(&format!("r{i:03}"), 1_700_000_000_000 + i))
        .collect();
    statements.reverse();
    sql(url, &statements);
    let listed = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["stale", "--json"];
        all.extend_from_slice(args);
        let records: Vec<Value> = serde_json::from_str(&cli(d, url, &all)).expect("json");
        records
            .iter()
            .map(|r| r["resource"].as_str().expect("resource").to_string())
            .collect()
    };
    assert_eq!(listed(&["--limit", "2"]), ["r100", "r101"]);
    let default = listed(&[]);
    assert_eq!(default.len(), 100);
    assert_eq!(
        (default[0].as_str(), default[99].as_str()),
        ("r002", "r101")
    );
    assert_eq!(listed(&["--limit", "0"]).len(), 102);
}

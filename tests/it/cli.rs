//! The `lease`, `put`, `get` and `stale` commands of the real binary, their
//! output shapes and exit codes, run against every backend by the
//! `cli_tests!` macro at the bottom (`--store URL` on every call).
//!
//! PostgreSQL and MySQL cases need `FENCECRON_TEST_POSTGRES_URL` and
//! `FENCECRON_TEST_MYSQL_URL` (see `tests/common/mod.rs`).

use crate::common;

use std::collections::HashMap;
use std::process::{Command, Output};

use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde_json::Value;

use common::fresh::with_fresh_database;
use common::harness::{clean, code, describe, fencecron, run};
use common::{unique, Backend, TestStore};

const EXIT_RUNTIME: i32 = 1;
const EXIT_USAGE: i32 = 2;
const EXIT_STALE: i32 = 3;
const EXIT_MISSING: i32 = 4;
const EXIT_HELD: i32 = 75;

// ---------------------------------------------------------------- fixture

/// One case's store and scratch directory (the binary's working directory).
struct Fx {
    backend: Backend,
    ts: TestStore,
    dir: tempfile::TempDir,
}

/// A lease as `lease acquire --json` printed it.
struct Acquired {
    resource: String,
    owner_id: String,
    token: i64,
    expires_at: DateTime<Utc>,
}

impl Fx {
    fn url(&self) -> &str {
        &self.ts.url
    }

    /// `fencecron ARGS --store URL`.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = fencecron(self.dir.path());
        cmd.args(args).arg("--store").arg(self.url());
        cmd
    }

    /// Runs `fencecron ARGS --store URL` and checks the exit code.
    fn expect(&self, args: &[&str], want: i32) -> Output {
        expect_code(run(self.cmd(args), None), want, args)
    }

    fn acquire(&self, resource: &str, lease: &str) -> Acquired {
        let out = self.expect(
            &["lease", "acquire", resource, "--lease", lease, "--json"],
            0,
        );
        let v = json_line(&out);
        let obj = v.as_object().expect("acquire --json prints an object");
        for field in ["resource", "owner_id", "token", "expires_at"] {
            assert!(obj.contains_key(field), "acquire --json lacks {field}: {v}");
        }
        Acquired {
            resource: v["resource"]
                .as_str()
                .expect("resource is a string")
                .to_string(),
            owner_id: v["owner_id"]
                .as_str()
                .expect("owner_id is a string")
                .to_string(),
            token: v["token"].as_i64().expect("token is a JSON integer"),
            expires_at: rfc3339_utc(&v["expires_at"]),
        }
    }

    fn release(&self, l: &Acquired) {
        let token = l.token.to_string();
        self.expect(
            &[
                "lease",
                "release",
                &l.resource,
                "--owner-id",
                &l.owner_id,
                "--token",
                &token,
            ],
            0,
        );
    }

    /// The `lease list --json` entry of one resource.
    fn listed(&self, resource: &str) -> Option<Value> {
        let out = self.expect(&["lease", "list", "--json"], 0);
        let all = json_line(&out);
        let rows = all.as_array().expect("lease list --json prints an array");
        let mine: Vec<&Value> = rows.iter().filter(|r| r["resource"] == resource).collect();
        assert!(mine.len() <= 1, "one row per resource: {mine:?}");
        mine.first().map(|v| (*v).clone())
    }

    /// The `stale --json [--since D]` records of one resource.
    fn stale(&self, resource: &str, since: Option<&str>) -> Vec<Value> {
        let mut args = vec!["stale", "--json"];
        if let Some(s) = since {
            args.extend(["--since", s]);
        }
        let out = self.expect(&args, 0);
        json_line(&out)
            .as_array()
            .expect("stale --json prints an array")
            .iter()
            .filter(|r| r["resource"] == resource)
            .cloned()
            .collect()
    }

    fn get_json(&self, resource: &str, key: &str) -> Value {
        json_line(&self.expect(&["get", key, "--resource", resource, "--json"], 0))
    }
}

fn expect_code(out: Output, want: i32, what: &[&str]) -> Output {
    assert_eq!(code(&out), want, "fencecron {what:?}: {}", describe(&out));
    out
}

/// Stdout as exactly one line of JSON.
fn json_line(out: &Output) -> Value {
    let text = String::from_utf8(out.stdout.clone()).expect("JSON output is UTF-8");
    assert_eq!(text.trim_end().lines().count(), 1, "one JSON line: {text}");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A JSON string holding an RFC 3339 UTC time.
fn rfc3339_utc(v: &Value) -> DateTime<Utc> {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("time is not a string: {v}"));
    assert!(s.ends_with('Z'), "time {s} is not UTC (`Z`)");
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("time {s} is not RFC 3339: {e}"))
        .with_timezone(&Utc)
}

/// Stderr is exactly one non-empty line, the error sentence; returns it.
fn one_sentence(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "stderr should be one line: {}",
        describe(out)
    );
    assert!(lines[0].starts_with("fencecron: "), "{}", lines[0]);
    lines[0].to_string()
}

/// The last stderr line, which must be the `fencecron: …` error sentence.
fn last_sentence(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    assert!(last.starts_with("fencecron: "), "{}", describe(out));
    last.to_string()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `key=value` lines of the text output.
fn text_fields(out: &Output) -> HashMap<String, String> {
    stdout(out)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), shell_unquote(v)))
        .collect()
}

/// A value printed for `eval` (`'…'`, with `'` as `'\''`), unquoted.
fn shell_unquote(v: &str) -> String {
    let inner = v
        .strip_prefix('\'')
        .and_then(|v| v.strip_suffix('\''))
        .unwrap_or_else(|| panic!("{v:?} is not single-quoted for eval"));
    inner.replace("'\\''", "'")
}

/// A store URL of the backend's kind that cannot be opened: any command
/// that touches the store with it fails with exit 1, not 2.
fn poisoned_url(fx: &Fx) -> String {
    match fx.backend {
        Backend::Sqlite => format!(
            "sqlite://{}",
            fx.dir
                .path()
                .join("no-such-dir")
                .join("fencecron.db")
                .display()
        ),
        Backend::Postgres => "postgres://postgres@127.0.0.1:1/test".to_string(),
        Backend::MySql => "mysql://root@127.0.0.1:1/test".to_string(),
    }
}

// ------------------------------------------------------------------ lease

/// `lease acquire` text and JSON shapes, then exit 75 with a one-sentence
/// stderr while it is held.
fn case_lease_acquire_shapes(fx: &Fx) {
    let r = unique("cli-acquire");
    let out = fx.expect(&["lease", "acquire", &r, "--lease", "5s"], 0);
    let f = text_fields(&out);
    assert_eq!(f.get("resource"), Some(&r), "{}", describe(&out));
    let owner = f.get("owner_id").expect("owner_id line");
    uuid::Uuid::parse_str(owner).expect("owner_id is a UUID");
    assert_eq!(f.get("token").map(String::as_str), Some("1"));
    rfc3339_utc(&Value::String(
        f.get("expires_at").expect("expires_at line").clone(),
    ));
    let token = f["token"].clone();
    fx.expect(
        &[
            "lease",
            "release",
            &r,
            "--owner-id",
            owner,
            "--token",
            &token,
        ],
        0,
    );

    let before = Utc::now();
    let l = fx.acquire(&r, "30s");
    assert_eq!(l.resource, r);
    assert_eq!(l.token, 2, "the token survives release");
    assert_ne!(&l.owner_id, owner, "a fresh owner id per acquisition");
    uuid::Uuid::parse_str(&l.owner_id).expect("owner_id is a UUID");
    let ahead = l.expires_at - before;
    assert!(
        ahead > chrono::Duration::seconds(20) && ahead <= chrono::Duration::seconds(40),
        "a 30s lease expires about 30s from now, not {ahead}"
    );

    let out = fx.expect(&["lease", "acquire", &r], EXIT_HELD);
    assert!(stdout(&out).is_empty(), "nothing on stdout when held");
    let msg = one_sentence(&out);
    assert!(msg.contains(&r) && msg.contains("held"), "{msg}");
    assert!(msg.contains(&l.owner_id), "names the holder: {msg}");
    let out = fx.expect(&["lease", "acquire", &r, "--json"], EXIT_HELD);
    assert!(stdout(&out).is_empty(), "nothing on stdout when held");
}

/// `lease renew` 0 (same token, later expiry) / 3 for a wrong owner or
/// token; `lease release` 0 / 3; `lease list --json` keeps released leases
/// with `held: false`.
fn case_lease_renew_release_list(fx: &Fx) {
    let r = unique("cli-renew");
    let l = fx.acquire(&r, "5s");
    let token = l.token.to_string();
    let stranger = uuid::Uuid::new_v4().to_string();
    let wrong_token = (l.token + 1).to_string();

    let out = fx.expect(
        &[
            "lease",
            "renew",
            &r,
            "--owner-id",
            &l.owner_id,
            "--token",
            &token,
            "--lease",
            "60s",
            "--json",
        ],
        0,
    );
    let v = json_line(&out);
    assert_eq!(
        v["token"].as_i64(),
        Some(l.token),
        "renew keeps the token: {v}"
    );
    assert_eq!(v["owner_id"], l.owner_id.as_str());
    let renewed = rfc3339_utc(&v["expires_at"]);
    assert!(
        renewed > l.expires_at,
        "renew extends: {renewed} > {}",
        l.expires_at
    );
    let out = fx.expect(
        &[
            "lease",
            "renew",
            &r,
            "--owner-id",
            &l.owner_id,
            "--token",
            &token,
        ],
        0,
    );
    rfc3339_utc(&Value::String(
        text_fields(&out)
            .get("expires_at")
            .expect("expires_at=")
            .clone(),
    ));

    for (owner, tok) in [(&stranger, &token), (&l.owner_id, &wrong_token)] {
        let out = fx.expect(
            &["lease", "renew", &r, "--owner-id", owner, "--token", tok],
            EXIT_STALE,
        );
        assert!(one_sentence(&out).contains(&r));
        let out = fx.expect(
            &["lease", "release", &r, "--owner-id", owner, "--token", tok],
            EXIT_STALE,
        );
        assert!(one_sentence(&out).contains(&r));
    }
    let held = fx.listed(&r).expect("listed");
    assert_eq!(
        held["held"], true,
        "refused calls leave the lease held: {held}"
    );
    assert_eq!(held["owner_id"], l.owner_id.as_str());

    let out = fx.expect(
        &[
            "lease",
            "release",
            &r,
            "--owner-id",
            &l.owner_id,
            "--token",
            &token,
        ],
        0,
    );
    assert!(out.stderr.is_empty(), "{}", describe(&out));
    // Renewing a released lease is refused.
    fx.expect(
        &[
            "lease",
            "renew",
            &r,
            "--owner-id",
            &l.owner_id,
            "--token",
            &token,
        ],
        EXIT_STALE,
    );
    // A resource never leased cannot be renewed or released.
    let never = unique("cli-never");
    fx.expect(
        &[
            "lease",
            "renew",
            &never,
            "--owner-id",
            &stranger,
            "--token",
            "1",
        ],
        EXIT_STALE,
    );
    fx.expect(
        &[
            "lease",
            "release",
            &never,
            "--owner-id",
            &stranger,
            "--token",
            "1",
        ],
        EXIT_STALE,
    );

    let other = unique("cli-list-held");
    let o = fx.acquire(&other, "30s");
    let released = fx.listed(&r).expect("a released lease stays listed");
    for field in [
        "resource",
        "owner_id",
        "node",
        "token",
        "expires_at",
        "held",
    ] {
        assert!(
            released.get(field).is_some(),
            "lease list lacks {field}: {released}"
        );
    }
    assert_eq!(released["held"], false, "{released}");
    assert_eq!(released["token"].as_i64(), Some(l.token), "{released}");
    assert_eq!(released["owner_id"], l.owner_id.as_str());
    assert!(released["node"].as_str().is_some_and(|n| !n.is_empty()));
    rfc3339_utc(&released["expires_at"]);
    let held = fx.listed(&other).expect("listed");
    assert_eq!(held["held"], true, "{held}");
    assert_eq!(held["token"].as_i64(), Some(o.token));
    assert!(fx.listed(&never).is_none(), "refused calls create no lease");
}

/// Bad lease lengths and names exit 2 before the store is touched: with a
/// store URL that cannot be opened they still exit 2, not 1.
fn case_usage_errors_do_not_touch_store(fx: &Fx) {
    let poisoned = poisoned_url(fx);
    let owner = uuid::Uuid::new_v4().to_string();
    let long = "r".repeat(201);
    let ok = unique("cli-usage");
    let bad: Vec<Vec<&str>> = vec![
        vec!["lease", "acquire", &ok, "--lease", "4s"],
        vec!["lease", "acquire", &ok, "--lease", "301s"],
        vec!["lease", "acquire", &ok, "--lease", "4s", "--json"],
        vec![
            "lease",
            "renew",
            &ok,
            "--owner-id",
            &owner,
            "--token",
            "1",
            "--lease",
            "301s",
        ],
        vec!["lease", "acquire", &long],
        vec!["lease", "acquire", "bad\u{1}name"],
        vec!["lease", "acquire", "bad\nname"],
        vec!["lease", "acquire", ""],
        vec![
            "lease",
            "release",
            &long,
            "--owner-id",
            &owner,
            "--token",
            "1",
        ],
        vec![
            "put",
            &long,
            "--resource",
            &ok,
            "--token",
            "1",
            "--owner-id",
            &owner,
            "--value",
            "v",
        ],
        vec![
            "put",
            "k",
            "--resource",
            "tab\there",
            "--token",
            "1",
            "--owner-id",
            &owner,
            "--value",
            "v",
        ],
        // no token at all
        vec![
            "put",
            "k",
            "--resource",
            &ok,
            "--owner-id",
            &owner,
            "--value",
            "v",
        ],
        vec![
            "put",
            "k",
            "--resource",
            &ok,
            "--token",
            "0",
            "--owner-id",
            &owner,
            "--value",
            "v",
        ],
        // no resource at all
        vec![
            "put",
            "k",
            "--token",
            "1",
            "--owner-id",
            &owner,
            "--value",
            "v",
        ],
        // no owner id at all
        vec![
            "put",
            "k",
            "--resource",
            &ok,
            "--token",
            "1",
            "--value",
            "v",
        ],
        vec![
            "put",
            "k",
            "--resource",
            &ok,
            "--token",
            "1",
            "--owner-id",
            "host-a",
            "--value",
            "v",
        ],
        // an owner id that no lease can have: refused before the store
        // (exit 2), not sent there to be refused as "not the owner" (3)
        vec![
            "lease",
            "renew",
            &ok,
            "--owner-id",
            "host-a",
            "--token",
            "1",
        ],
        vec![
            "lease",
            "release",
            &ok,
            "--owner-id",
            "host-a",
            "--token",
            "1",
        ],
        vec!["get", "bad\u{7f}key", "--resource", &ok],
        // argument errors clap finds: one `fencecron:` sentence too
        vec!["lease", "renew", &ok],
        vec!["lease", "acquire", &ok, "--bogus"],
        vec!["exec", &ok, "--lease", "2", "--", "true"],
    ];
    for args in &bad {
        let mut cmd = fencecron(fx.dir.path());
        cmd.args(args).arg("--store").arg(&poisoned);
        let out = expect_code(run(cmd, None), EXIT_USAGE, args);
        let msg = one_sentence(&out);
        assert!(!msg.contains("store"), "rejected before the store: {msg}");
        if args.contains(&"put") && !args.contains(&"--owner-id") {
            assert!(
                msg.contains("--owner-id") && msg.contains("$FENCECRON_OWNER_ID"),
                "names the flag and the variable: {msg}"
            );
        }
        if args.contains(&"host-a") {
            assert!(msg.contains("UUID"), "{msg}");
        }
    }
    let mut cmd = fencecron(fx.dir.path());
    cmd.args(["lease", "acquire", &ok, "--lease", "4s"])
        .arg("--store")
        .arg(&poisoned);
    let msg = one_sentence(&run(cmd, None));
    assert!(
        msg.contains("4s") && msg.contains("5s") && msg.contains("300s"),
        "{msg}"
    );

    if fx.backend == Backend::Sqlite {
        // The poisoned URL is noticed by a command that does touch it.
        let mut cmd = fencecron(fx.dir.path());
        cmd.args(["lease", "list"]).arg("--store").arg(&poisoned);
        expect_code(run(cmd, None), EXIT_RUNTIME, &["lease", "list"]);
    }
    // With the real store, the refused names left no lease behind.
    assert!(fx.listed(&ok).is_none());
}

/// Expiry is decided by the store's clock: a process whose clock is an hour
/// ahead still sees a 30 s lease as held, on every backend.
fn case_store_clock_decides_expiry(fx: &Fx) {
    let faketime = std::path::Path::new("/usr/bin/faketime");
    let faketime = if faketime.exists() {
        faketime.to_path_buf()
    } else {
        match which("faketime") {
            Some(p) => p,
            None => {
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("faketime is not installed; .ci/run must install it (apt-get install faketime)");
                }
                skipped!(
                    "\n*** SKIPPED store-clock test on {:?}: faketime is not installed \
                     (apt-get install faketime). ***\n",
                    fx.backend
                );
                return;
            }
        }
    };
    // First prove faketime really moves this process's clock.
    let mut date = clean(Command::new(&faketime), fx.dir.path());
    date.args(["-f", "+1h", "date", "+%s"]);
    let out = run(date, None);
    assert_eq!(code(&out), 0, "faketime date: {}", describe(&out));
    let faked: i64 = stdout(&out)
        .trim()
        .parse()
        .expect("date +%s prints seconds");
    let skew = faked - Utc::now().timestamp();
    assert!(
        (3500..=3700).contains(&skew),
        "faketime moved the clock by {skew}s"
    );

    let r = unique("cli-clock");
    let l = fx.acquire(&r, "30s");
    let mut cmd = clean(Command::new(&faketime), fx.dir.path());
    cmd.args(["-f", "+1h"])
        .arg(common::bin())
        .args(["lease", "acquire", &r, "--store", fx.url()]);
    let out = expect_code(
        run(cmd, None),
        EXIT_HELD,
        &["faketime", "-f", "+1h", "lease", "acquire"],
    );
    assert!(one_sentence(&out).contains(&l.owner_id));
    let row = fx.listed(&r).expect("listed");
    assert_eq!(
        row["token"].as_i64(),
        Some(l.token),
        "the fence did not move"
    );
    assert_eq!(row["owner_id"], l.owner_id.as_str());
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

// ------------------------------------------------------------ put and get

/// `put` takes resource, token and owner from the job's environment with
/// no flags; `--value`, `--file` and stdin all work; `get` prints the raw
/// bytes, or JSON with `value` / `value_base64`.
fn case_put_sources_and_get(fx: &Fx) {
    let r = unique("cli-put");
    let l = fx.acquire(&r, "30s");
    let token = l.token.to_string();

    let mut cmd = fencecron(fx.dir.path());
    cmd.args(["put", "result", "--value", "from env", "--store", fx.url()])
        .env("FENCECRON_RESOURCE", &r)
        .env("FENCECRON_TOKEN", &token)
        .env("FENCECRON_OWNER_ID", &l.owner_id);
    let out = expect_code(run(cmd, None), 0, &["put", "result", "(env)"]);
    assert!(stdout(&out).contains("accepted"), "{}", describe(&out));
    let v = fx.get_json(&r, "result");
    assert_eq!(v["value"], "from env", "{v}");
    assert_eq!(v["resource"], r.as_str());
    assert_eq!(v["key"], "result");
    assert_eq!(v["token"].as_i64(), Some(l.token), "{v}");
    assert_eq!(
        v["owner_id"],
        l.owner_id.as_str(),
        "owner from the env: {v}"
    );
    rfc3339_utc(&v["written_at"]);
    assert!(v.get("value_base64").is_none(), "{v}");

    // `get` reads the resource from the environment too, and prints raw.
    let mut cmd = fencecron(fx.dir.path());
    cmd.args(["get", "result", "--store", fx.url()])
        .env("FENCECRON_RESOURCE", &r);
    let out = expect_code(run(cmd, None), 0, &["get", "result", "(env)"]);
    assert_eq!(out.stdout, b"from env");

    // --file with bytes that are not UTF-8.
    let bytes: Vec<u8> = vec![0xff, 0xfe, 0x00, b'a', 0x80, b'\n'];
    let file = fx.dir.path().join("value.bin");
    std::fs::write(&file, &bytes).unwrap();
    let file_s = file.to_str().unwrap();
    fx.expect(
        &[
            "put",
            "bin",
            "--resource",
            &r,
            "--token",
            &token,
            "--owner-id",
            &l.owner_id,
            "--file",
            file_s,
        ],
        0,
    );
    let v = fx.get_json(&r, "bin");
    assert!(v.get("value").is_none(), "no `value` for non-UTF-8: {v}");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(v["value_base64"].as_str().expect("value_base64"))
        .expect("valid base64");
    assert_eq!(decoded, bytes);
    assert_eq!(
        v["owner_id"],
        l.owner_id.as_str(),
        "owner from the flag: {v}"
    );
    let out = fx.expect(&["get", "bin", "--resource", &r], 0);
    assert_eq!(out.stdout, bytes, "get prints the exact bytes");

    // stdin, larger than a pipe buffer.
    let big: Vec<u8> = (0..200_000u32)
        .map(|i| b"fencecron\n"[i as usize % 10])
        .collect();
    let out = run(
        fx.cmd(&[
            "put",
            "stdin",
            "--resource",
            &r,
            "--token",
            &token,
            "--owner-id",
            &l.owner_id,
        ]),
        Some(&big),
    );
    expect_code(out, 0, &["put", "stdin"]);
    let out = fx.expect(&["get", "stdin", "--resource", &r], 0);
    assert!(out.stdout == big, "stdin value round-trips");

    // A missing key: exit 4 (not 1, a store that cannot be read), one
    // sentence, nothing on stdout.
    for json in [false, true] {
        let mut args = vec!["get", "nothing-here", "--resource", &r];
        if json {
            args.push("--json");
        }
        let out = fx.expect(&args, EXIT_MISSING);
        assert!(out.stdout.is_empty());
        assert!(one_sentence(&out).contains("nothing-here"));
    }
}

/// Stale and forged writes exit 3 with a one-sentence error and a
/// `stale_write_rejected` event; `--once` with an equal token exits 0
/// "already applied" and changes nothing; `stale --json` lists the
/// rejections with every documented field, and `--since` filters them.
fn case_put_stale_forged_once_and_stale_list(fx: &Fx) {
    let r = unique("cli-stale");
    let first = fx.acquire(&r, "5s");
    fx.release(&first);
    let second = fx.acquire(&r, "30s");
    let (t1, t2) = (first.token.to_string(), second.token.to_string());
    fx.expect(
        &[
            "put",
            "k",
            "--resource",
            &r,
            "--token",
            &t2,
            "--owner-id",
            &second.owner_id,
            "--value",
            "new",
        ],
        0,
    );

    // The old owner writes from inside its (stale) job.
    let mut cmd = fencecron(fx.dir.path());
    cmd.args(["put", "k", "--value", "old", "--stage", "upload"])
        .args(["--log-format", "json", "--store", fx.url()])
        .env("FENCECRON_RESOURCE", &r)
        .env("FENCECRON_TOKEN", &t1)
        .env("FENCECRON_OWNER_ID", &first.owner_id)
        .env("FENCECRON_NODE", "node-old")
        .env("FENCECRON_JOB", "job-old");
    let out = expect_code(run(cmd, None), EXIT_STALE, &["put", "(stale)"]);
    let msg = last_sentence(&out);
    assert!(msg.contains("stale") && msg.contains(&r), "{msg}");
    let events: Vec<Value> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "stale_write_rejected")
        .collect();
    assert_eq!(
        events.len(),
        1,
        "one stale_write_rejected event: {}",
        describe(&out)
    );
    assert_eq!(events[0]["resource"], r.as_str());
    assert_eq!(events[0]["token"].as_i64(), Some(first.token));
    assert_eq!(events[0]["accepted_token"].as_i64(), Some(second.token));

    let out = fx.expect(
        &[
            "put",
            "k",
            "--resource",
            &r,
            "--token",
            "99",
            "--owner-id",
            &second.owner_id,
            "--value",
            "forged",
        ],
        EXIT_STALE,
    );
    let msg = last_sentence(&out);
    assert!(msg.contains("forged"), "{msg}");
    assert_eq!(
        fx.get_json(&r, "k")["value"],
        "new",
        "rejections change nothing"
    );

    let out = fx.expect(
        &[
            "put",
            "k",
            "--resource",
            &r,
            "--token",
            &t2,
            "--owner-id",
            &second.owner_id,
            "--once",
            "--value",
            "again",
        ],
        0,
    );
    assert!(
        stdout(&out).contains("already applied"),
        "{}",
        describe(&out)
    );
    let v = fx.get_json(&r, "k");
    assert_eq!(
        (v["value"].as_str(), v["token"].as_i64()),
        (Some("new"), Some(second.token))
    );
    fx.expect(
        &[
            "put",
            "k",
            "--resource",
            &r,
            "--token",
            &t1,
            "--owner-id",
            &first.owner_id,
            "--once",
            "--value",
            "x",
        ],
        EXIT_STALE,
    );

    let recs = fx.stale(&r, None);
    assert_eq!(recs.len(), 3, "stale, forged, stale(--once): {recs:?}");
    for rec in &recs {
        for field in [
            "at",
            "kind",
            "resource",
            "key",
            "owner_id",
            "token",
            "accepted_token",
            "node",
            "job",
            "stage",
            "operation_id",
        ] {
            assert!(
                rec.get(field).is_some(),
                "stale --json lacks {field}: {rec}"
            );
        }
        rfc3339_utc(&rec["at"]);
        assert_eq!(rec["kind"], "write_rejected");
        assert_eq!(rec["key"], "k");
        assert!(
            rec["token"].is_i64() && rec["accepted_token"].is_i64(),
            "{rec}"
        );
        assert!(rec["operation_id"].as_str().is_some_and(|o| !o.is_empty()));
    }
    let old = &recs[0];
    assert_eq!(old["owner_id"], first.owner_id.as_str());
    assert_eq!(old["token"].as_i64(), Some(first.token));
    assert_eq!(old["accepted_token"].as_i64(), Some(second.token));
    assert_eq!(old["node"], "node-old");
    assert_eq!(old["job"], "job-old");
    assert_eq!(old["stage"], "upload");
    assert_eq!(recs[1]["token"].as_i64(), Some(99));
    assert_eq!(recs[1]["reason"], "forged");
    assert_eq!(recs[1]["owner_id"], second.owner_id.as_str());
    assert!(recs[1]["job"].is_null());
    assert_eq!(recs[1]["stage"], "put", "the default stage");

    // --since: a wide window has them all; a window that began after they
    // were recorded has none. The wait is for the wall clock to pass 1.3 s
    // after the newest record's stored time (an observed value): the window
    // `--since 1s` then begins after it, by the command's own definition.
    assert_eq!(fx.stale(&r, Some("1h")).len(), 3);
    let newest = rfc3339_utc(&recs[2]["at"]);
    let wait = (newest + chrono::Duration::milliseconds(1_300)) - Utc::now();
    if let Ok(wait) = wait.to_std() {
        std::thread::sleep(wait);
    }
    assert!(fx.stale(&r, Some("1s")).is_empty(), "--since 1s after 1.3s");
    let out = fx.expect(&["stale"], 0);
    assert!(stdout(&out).contains(&r), "text listing names the resource");
}

/// A token is bound to its owner and its resource. A job run by
/// `fencecron exec` writes with a foreign `--owner-id`, and with its own
/// owner id and token to two other resources (tokens count per resource,
/// so the numbers overlap): one whose fence has the same number
/// (`wrong_owner`) and one whose fence is past it (`stale`). Each is
/// refused with exit 3, a sentence naming the cause and a
/// `stale_write_rejected` event, and `stale --json` lists it with the
/// caller's owner id and token; the job's own write goes through.
fn case_put_binds_owner_and_resource(fx: &Fx) {
    let job_r = unique("cli-bind-job");
    let same = unique("cli-bind-same");
    let ahead = unique("cli-bind-ahead");
    let same_lease = fx.acquire(&same, "30s");
    let first = fx.acquire(&ahead, "5s");
    fx.release(&first);
    let ahead_lease = fx.acquire(&ahead, "30s");
    let foreign = "00000000-0000-4000-8000-000000000001";
    let report = fx.dir.path().join("bind-report");
    let errors = fx.dir.path().join("bind-errors");
    let script = r#"
        p() {
            name=$1; shift
            "$FENCECRON_BIN" put k --stage "$name" --value "$name" "$@" 2>>"$ERRORS"
            echo "$name $?" >>"$REPORT"
        }
        p foreign --owner-id "$FOREIGN"
        p same --resource "$SAME"
        p ahead --resource "$AHEAD"
        p own
        echo "owner $FENCECRON_OWNER_ID" >>"$REPORT"
        echo "token $FENCECRON_TOKEN" >>"$REPORT"
    "#;
    let mut cmd = fx.cmd(&["exec", &job_r, "--lease", "30s"]);
    cmd.args(["--", "sh", "-c", script, "sh"])
        .env("FENCECRON_LOG_FORMAT", "json")
        .env("REPORT", &report)
        .env("ERRORS", &errors)
        .env("FOREIGN", foreign)
        .env("SAME", &same)
        .env("AHEAD", &ahead);
    let out = expect_code(run(cmd, None), 0, &["exec", &job_r]);
    let text = std::fs::read_to_string(&report)
        .unwrap_or_else(|e| panic!("the job's report ({e}): {}", describe(&out)));
    let errs = std::fs::read_to_string(&errors).unwrap_or_default();
    let lines: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once(' ')).collect();
    let codes = ["foreign", "same", "ahead", "own"].map(|s| lines.get(s).copied());
    assert_eq!(
        codes,
        [Some("3"), Some("3"), Some("3"), Some("0")],
        "exit codes of the job's puts: {text}\n{errs}"
    );
    let owner = lines["owner"];
    let token: i64 = lines["token"].parse().expect("token");
    assert_eq!(token, same_lease.token, "fresh resources share the numbers");
    assert!(ahead_lease.token > token);

    // One sentence per refusal, naming the cause.
    let sentences: Vec<&str> = errs
        .lines()
        .filter(|l| l.starts_with("fencecron: "))
        .collect();
    assert_eq!(sentences.len(), 3, "{errs}");
    assert!(
        sentences[0].contains("wrong owner") && sentences[0].contains(foreign),
        "{errs}"
    );
    assert!(
        sentences[1].contains("wrong owner") && sentences[1].contains(&same),
        "{errs}"
    );
    assert!(
        sentences[2].contains("stale") && sentences[2].contains(&ahead),
        "{errs}"
    );
    let events: Vec<Value> = errs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["event"] == "stale_write_rejected")
        .collect();
    let reasons: Vec<&str> = events.iter().filter_map(|e| e["reason"].as_str()).collect();
    assert_eq!(reasons, ["wrong_owner", "wrong_owner", "stale"], "{errs}");

    let check = |resource: &str, reason: &str, owner_id: &str, accepted: i64, stage: &str| {
        let recs = fx.stale(resource, None);
        assert_eq!(recs.len(), 1, "{resource}: {recs:?}");
        let rec = &recs[0];
        assert_eq!(rec["kind"], "write_rejected", "{rec}");
        assert_eq!(rec["reason"], reason, "{rec}");
        assert_eq!(rec["key"], "k", "{rec}");
        assert_eq!(rec["owner_id"], owner_id, "{rec}");
        assert_eq!(rec["token"].as_i64(), Some(token), "{rec}");
        assert_eq!(rec["accepted_token"].as_i64(), Some(accepted), "{rec}");
        assert_eq!(rec["stage"], stage, "{rec}");
    };
    check(&job_r, "wrong_owner", foreign, token, "foreign");
    check(&same, "wrong_owner", owner, same_lease.token, "same");
    check(&ahead, "stale", owner, ahead_lease.token, "ahead");

    let v = fx.get_json(&job_r, "k");
    assert_eq!(
        (v["value"].as_str(), v["owner_id"].as_str()),
        (Some("own"), Some(owner))
    );
    for r in [&same, &ahead] {
        fx.expect(&["get", "k", "--resource", r], EXIT_MISSING);
    }
}

// ------------------------------------------------- store URLs and failures

/// An unreachable store with a password in its URL: exit 1, and the
/// password never reaches stderr.
fn unreachable_store_hides_password(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let r = unique("cli-unreachable");
    let mut cmd = fencecron(dir.path());
    cmd.args(["lease", "acquire", &r, "--store", url]);
    let out = expect_code(run(cmd, None), EXIT_RUNTIME, &["lease", "acquire", url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("sekret"), "password leaked: {err}");
    assert!(!stdout(&out).contains("sekret"));
    let msg = one_sentence(&out);
    assert!(msg.contains("127.0.0.1:1"), "names the store: {msg}");
    assert!(
        msg.contains("unreachable") && msg.contains("running"),
        "says the store is unreachable and what to check: {msg}"
    );

    // The same through $FENCECRON_STORE, with a URL that does not parse.
    let broken = url.replace(":1/", ":99999/");
    let mut cmd = fencecron(dir.path());
    cmd.args(["lease", "list"]).env("FENCECRON_STORE", &broken);
    let out = expect_code(run(cmd, None), EXIT_USAGE, &["lease", "list", &broken]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("sekret"), "password leaked: {err}");
    one_sentence(&out);
}

#[test]
fn postgres_unreachable_store_hides_password() {
    unreachable_store_hides_password("postgres://postgres:sekret@127.0.0.1:1/test");
}

#[test]
fn mysql_unreachable_store_hides_password() {
    unreachable_store_hides_password("mysql://root:sekret@127.0.0.1:1/test");
}

/// A MySQL user of one test, dropped again when the test ends, also when it
/// fails: users are server-wide, not part of the test's database.
struct MySqlUser {
    admin_url: String,
    /// `'name'@'127.0.0.1'`.
    account: String,
}

impl Drop for MySqlUser {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let account = self.account.clone();
        // On a thread of its own: the drop may run inside a runtime.
        let dropped = std::thread::spawn(move || {
            use sqlx::{Connection, Executor};
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let mut root = sqlx::MySqlConnection::connect(&admin_url).await?;
                root.execute(format!("DROP USER IF EXISTS {account}").as_str())
                    .await?;
                root.close().await
            })
        })
        .join()
        .expect("the thread dropping the MySQL user");
        if let Err(e) = dropped {
            if std::thread::panicking() {
                eprintln!("could not drop the MySQL user {}: {e}", self.account);
            } else {
                panic!("could not drop the MySQL user {}: {e}", self.account);
            }
        }
    }
}

/// A database at its connection limit is named as such, with what to change,
/// rather than reported as down. MariaDB/MySQL answer a user over its
/// `MAX_USER_CONNECTIONS` at once (PostgreSQL's 53300 is retried by the pool
/// until its timeout, which the pool-timeout message covers).
#[test]
fn mysql_connection_limit_is_named() {
    let Some(ts) = TestStore::new(Backend::MySql, "mysql_connection_limit_is_named") else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    // A user of this run alone (at most 32 characters), so parallel runs on
    // one server never share it.
    let user = unique("fc_limited").replace('-', "_")[..26].to_string();
    let mut limited = url::Url::parse(&ts.url).expect("test URL parses");
    limited.set_username(&user).unwrap();
    limited.set_password(Some("sekret3")).unwrap();
    // The test URL's database, whatever it is called.
    let database = limited.path().trim_start_matches('/').replace('`', "");
    let limited = limited.to_string();
    let account = format!("'{user}'@'127.0.0.1'");
    // Holds the user's only connection while the binary tries to connect.
    let (_user, _held) = rt.block_on(async {
        use sqlx::{Connection, Executor};
        let mut root = sqlx::MySqlConnection::connect(&ts.url).await.unwrap();
        root.execute(
            format!("CREATE USER {account} IDENTIFIED BY 'sekret3' WITH MAX_USER_CONNECTIONS 1")
                .as_str(),
        )
        .await
        .unwrap();
        let user = MySqlUser {
            admin_url: ts.url.clone(),
            account: account.clone(),
        };
        root.execute(format!("GRANT ALL ON `{database}`.* TO {account}").as_str())
            .await
            .unwrap();
        let held = sqlx::MySqlConnection::connect(&limited)
            .await
            .expect("the limited user connects once");
        (user, held)
    });
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = fencecron(dir.path());
    cmd.args(["lease", "list", "--store", &limited]);
    let out = expect_code(run(cmd, None), EXIT_RUNTIME, &["lease", "list", "limited"]);
    let msg = one_sentence(&out);
    assert!(!msg.contains("sekret3"), "password leaked: {msg}");
    assert!(
        msg.contains("connection limit") && msg.contains("max_connections"),
        "names the connection limit and what to change: {msg}"
    );
}

#[test]
fn unsupported_scheme_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "redis://user:sekret@127.0.0.1/0",
        "fencecron.db",
        "http://h/x",
    ] {
        let mut cmd = fencecron(dir.path());
        cmd.args(["lease", "list", "--store", url]);
        let out = expect_code(run(cmd, None), EXIT_USAGE, &["--store", url]);
        let msg = one_sentence(&out);
        assert!(msg.contains("unsupported"), "{msg}");
        assert!(!msg.contains("sekret"), "password leaked: {msg}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "no default SQLite file was created"
    );
}

// ----------------------------------- no store: refuse, create nothing

/// Every command that touches the store, as run by an operator who forgot
/// to say which store: none of them needs anything but a store.
fn store_commands() -> Vec<Vec<&'static str>> {
    let owner = "00000000-0000-4000-8000-000000000000";
    vec![
        vec!["lease", "acquire", "r"],
        vec!["lease", "list"],
        vec!["lease", "renew", "r", "--owner-id", owner, "--token", "1"],
        vec!["lease", "release", "r", "--owner-id", owner, "--token", "1"],
        vec![
            "put",
            "k",
            "--resource",
            "r",
            "--token",
            "1",
            "--owner-id",
            owner,
            "--value",
            "v",
        ],
        vec!["get", "k", "--resource", "r"],
        vec!["exec", "r", "--", "true"],
        vec!["stale"],
        vec!["bench", "--duration", "1s"],
    ]
}

/// Runs each store command with no store URL and `config` as the config
/// situation, in an empty directory and with `$STATE_DIRECTORY` pointing at
/// another one; each must exit 2 with one sentence containing every part of
/// `must_say`, and neither directory may gain a file.
fn refuses_without_store(config: Option<&std::path::Path>, must_say: &[&str]) {
    let cwd = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    for args in store_commands() {
        let mut cmd = fencecron(cwd.path());
        cmd.args(&args).env("STATE_DIRECTORY", state.path());
        if let Some(path) = config {
            cmd.env("FENCECRON_CONFIG", path);
        }
        let out = expect_code(run(cmd, None), EXIT_USAGE, &args);
        let msg = one_sentence(&out);
        for part in must_say
            .iter()
            .chain(&["--config FILE", "--store URL", "$FENCECRON_STORE"])
        {
            assert!(msg.contains(part), "{args:?}: says {part:?}: {msg}");
        }
        for dir in [cwd.path(), state.path()] {
            let created: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert!(created.is_empty(), "{args:?} created {created:?}");
        }
    }
}

/// `$FENCECRON_CONFIG` names a file that does not exist: the message names
/// it.
#[test]
fn store_commands_refuse_when_the_config_file_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("jobs.toml");
    refuses_without_store(
        Some(&missing),
        &[&missing.display().to_string(), "does not exist"],
    );
    assert!(!missing.exists());
}

/// Neither `$FENCECRON_CONFIG` nor the default file: the message says both.
/// Only where `/etc/fencecron/jobs.toml` does not exist (on a host that has
/// one, the commands rightly use it).
#[test]
fn store_commands_refuse_without_any_config() {
    if std::path::Path::new("/etc/fencecron/jobs.toml").exists() {
        skipped!(
            "\n*** SKIPPED store_commands_refuse_without_any_config: \
             /etc/fencecron/jobs.toml exists on this host. ***\n"
        );
        return;
    }
    refuses_without_store(
        None,
        &[
            "$FENCECRON_CONFIG is unset",
            "/etc/fencecron/jobs.toml does not exist",
        ],
    );
}

// ------------------------------------------------ private SQLite files

/// The mode bits of a file.
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Every `fencecron.db*` file in `dir` (database, `-wal`, `-shm`, lock) is
/// readable and writable by its owner only; returns their names.
fn private_db_files(dir: &std::path::Path) -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("fencecron.db") {
            assert_eq!(mode(&entry.path()), 0o600, "{name} is not 0600");
            names.push(name);
        }
    }
    names.sort();
    names
}

/// An explicit `--store sqlite://…` (relative, against the working
/// directory) still works with no config, and the files it creates are
/// private.
#[test]
fn explicit_sqlite_store_works_and_its_files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let r = unique("cli-private");
    let mut cmd = fencecron(dir.path());
    cmd.args([
        "lease",
        "acquire",
        &r,
        "--json",
        "--store",
        "sqlite://fencecron.db",
    ]);
    let out = expect_code(run(cmd, None), 0, &["lease", "acquire", "--store"]);
    let acquired = json_line(&out);
    let token = acquired["token"].as_i64().unwrap().to_string();
    let owner = acquired["owner_id"].as_str().unwrap().to_string();
    let mut cmd = fencecron(dir.path());
    cmd.args([
        "put",
        "k",
        "--resource",
        &r,
        "--token",
        &token,
        "--owner-id",
        &owner,
        "--value",
        "v",
    ])
    .env("FENCECRON_STORE", "sqlite://fencecron.db");
    expect_code(run(cmd, None), 0, &["put", "$FENCECRON_STORE"]);
    let names = private_db_files(dir.path());
    for want in ["fencecron.db", "fencecron.db.migrate-lock"] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }

    // SQLite gives -wal and -shm the database's mode: look while a
    // connection holds them open.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use sqlx::{Connection, Executor};
        let url = format!("sqlite://{}", dir.path().join("fencecron.db").display());
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        conn.execute("PRAGMA journal_mode = WAL").await.unwrap();
        // A write, so the WAL file certainly exists.
        conn.execute("CREATE TABLE wal_probe (x INTEGER)")
            .await
            .unwrap();
        let names = private_db_files(dir.path());
        for want in ["fencecron.db-shm", "fencecron.db-wal"] {
            assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
        }
        conn.close().await.unwrap();
    });
}

/// A config file without `[store]` keeps the documented default:
/// `fencecron.db` in `$STATE_DIRECTORY`, private.
#[test]
fn config_without_store_uses_the_default_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let config = dir.path().join("jobs.toml");
    std::fs::write(&config, "[defaults]\nlease = \"30s\"\n").unwrap();
    let mut cmd = fencecron(dir.path());
    cmd.args(["lease", "acquire", &unique("cli-default")])
        .env("FENCECRON_CONFIG", &config)
        .env("STATE_DIRECTORY", state.path());
    expect_code(
        run(cmd, None),
        0,
        &["lease", "acquire", "(config, no [store])"],
    );
    let names = private_db_files(state.path());
    assert!(names.iter().any(|n| n == "fencecron.db"), "{names:?}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "only jobs.toml"
    );
}

// ------------------------------------------------ $FENCECRON_STORE_FILE

/// `$FENCECRON_STORE_FILE` (how a job finds a store whose URL has a
/// password) that names a missing file is a usage error naming it, and the
/// file's URL is used when it exists.
#[test]
fn store_file_is_read_and_a_missing_one_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("gone").join("store-url");
    let mut cmd = fencecron(dir.path());
    cmd.args(["lease", "list"])
        .env("FENCECRON_STORE_FILE", &missing);
    let out = expect_code(
        run(cmd, None),
        EXIT_USAGE,
        &["lease", "list", "(missing file)"],
    );
    let msg = one_sentence(&out);
    assert!(
        msg.contains("FENCECRON_STORE_FILE") && msg.contains(&missing.display().to_string()),
        "{msg}"
    );

    let file = dir.path().join("store-url");
    let db = dir.path().join("from-file.db");
    std::fs::write(&file, format!("sqlite://{}\n", db.display())).unwrap();
    let mut cmd = fencecron(dir.path());
    cmd.args(["lease", "acquire", &unique("cli-file")])
        .env("FENCECRON_STORE_FILE", &file);
    expect_code(run(cmd, None), 0, &["lease", "acquire", "(store file)"]);
    assert!(db.exists(), "the URL in the file was used");

    // An environment file's line (systemd's EnvironmentFile=) works too.
    let env_db = dir.path().join("from-env-file.db");
    std::fs::write(
        &file,
        format!(
            "# the store\nFENCECRON_DATABASE_URL=\"sqlite://{}\"\n",
            env_db.display()
        ),
    )
    .unwrap();
    let mut cmd = fencecron(dir.path());
    cmd.args(["lease", "acquire", &unique("cli-file")])
        .env("FENCECRON_STORE_FILE", &file);
    expect_code(run(cmd, None), 0, &["lease", "acquire", "(NAME=URL)"]);
    assert!(env_db.exists(), "the URL after NAME= was used");
}

// ------------------------------------------------- epochs and takeovers

/// The JSON log events of one run, by `event` name.
fn events_named(out: &Output, event: &str) -> Vec<Value> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["event"] == event)
        .collect()
}

/// Waits (by the store's own verdict, `lease list`) until a lease is no
/// longer held.
fn wait_not_held(fx: &Fx, resource: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while fx.listed(resource).expect("listed")["held"] == true {
        assert!(
            std::time::Instant::now() < deadline,
            "{resource} still held after 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `fencecron epoch` shows the epoch; `epoch advance` (the failover hook)
/// raises it, prints the new epoch and the lowest token it can issue, logs
/// `epoch_advanced`, and every token issued afterwards — for a resource
/// leased before and for one never leased — is greater than every earlier
/// one; a write with an old token is refused once a newer one wrote. Runs
/// on a database of its own: the epoch is store-wide.
fn case_epoch_advance_via_cli(fx: &Fx) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let backend = fx.backend;
    let dir = fx.dir.path().to_path_buf();
    runtime.block_on(with_fresh_database(&fx.ts, move |url| async move {
        let fx = Fx {
            backend,
            ts: TestStore::at(backend, url),
            dir: tempfile::tempdir_in(&dir).expect("temp dir"),
        };
        let shown = fx.expect(&["epoch"], 0);
        let before = text_fields(&shown);
        assert_eq!(before.get("stored_epoch").map(String::as_str), Some("0"));
        assert_eq!(
            before.contains_key("timeline"),
            backend == Backend::Postgres,
            "{before:?}"
        );
        let mut earlier = Vec::new();
        let mut owners = Vec::new();
        let r = unique("cli-epoch");
        for _ in 0..3 {
            let l = fx.acquire(&r, "5s");
            earlier.push(l.token);
            owners.push(l.owner_id.clone());
            fx.release(&l);
        }
        let held = fx.acquire(&unique("cli-epoch-held"), "30s");
        earlier.push(held.token);
        let t_old = earlier[2].to_string();
        let o_old = owners[2].clone();
        fx.expect(
            &[
                "put",
                "k",
                "--resource",
                &r,
                "--token",
                &t_old,
                "--owner-id",
                &o_old,
                "--value",
                "old",
            ],
            0,
        );

        let out = fx.expect(&["epoch", "advance", "--log-format", "json"], 0);
        let adv = text_fields(&out);
        let epoch: i64 = adv["epoch"].parse().expect("epoch");
        let lowest: i64 = adv["lowest_token"].parse().expect("lowest_token");
        assert_eq!(
            epoch,
            before["epoch"].parse::<i64>().unwrap() + 1,
            "{adv:?}"
        );
        assert_eq!(lowest, (epoch << 32) + 1, "{adv:?}");
        let logged = events_named(&out, "epoch_advanced");
        assert_eq!(logged.len(), 1, "{}", describe(&out));
        assert_eq!(logged[0]["lowest_token"], lowest);

        let next = fx.acquire(&r, "5s");
        let never = fx.acquire(&unique("cli-epoch-never"), "5s");
        for t in &earlier {
            assert!(
                next.token > *t && never.token > *t,
                "{} {} > {t}",
                next.token,
                never.token
            );
        }
        assert_eq!((next.token, never.token), (lowest, lowest));
        let t_new = next.token.to_string();
        fx.expect(
            &[
                "put",
                "k",
                "--resource",
                &r,
                "--token",
                &t_new,
                "--owner-id",
                &next.owner_id,
                "--value",
                "new",
            ],
            0,
        );
        fx.expect(
            &[
                "put",
                "k",
                "--resource",
                &r,
                "--token",
                &t_old,
                "--owner-id",
                &o_old,
                "--value",
                "stale",
            ],
            EXIT_STALE,
        );

        // JSON, and show agrees with what advance printed.
        let again = json_line(&fx.expect(&["epoch", "advance", "--json"], 0));
        assert_eq!(again["effective"], epoch + 1, "{again}");
        assert_eq!(again["lowest_token"], ((epoch + 1) << 32) + 1, "{again}");
        assert_eq!(
            again["highest_token"],
            next.token.max(never.token),
            "{again}"
        );
        let show = json_line(&fx.expect(&["epoch", "show", "--json"], 0));
        assert_eq!(show, again);
        fx.release(&next);
        let third = fx.acquire(&r, "5s");
        assert!(third.token > next.token);
    }));
}

/// A lease whose owner vanished (expired, never released) is taken over:
/// the winner's `lease acquire` prints the previous owner, logs
/// `lease_taken_over` (WARN) with both generations, and `fencecron stale`
/// lists a `lease_taken_over` record naming the vanished owner.
fn case_takeover_logged_and_listed(fx: &Fx) {
    let r = unique("cli-takeover");
    let mut cmd = fx.cmd(&["lease", "acquire", &r, "--lease", "5s", "--json"]);
    cmd.env("FENCECRON_NODE", "node-gone");
    let old = json_line(&expect_code(run(cmd, None), 0, &["lease", "acquire"]));
    wait_not_held(fx, &r);

    let mut cmd = fx.cmd(&[
        "lease",
        "acquire",
        &r,
        "--lease",
        "5s",
        "--log-format",
        "json",
    ]);
    cmd.env("FENCECRON_NODE", "node-new");
    let out = expect_code(run(cmd, None), 0, &["lease", "acquire", "(takeover)"]);
    let fields = text_fields(&out);
    assert_eq!(
        fields["previous_owner_id"],
        old["owner_id"].as_str().unwrap()
    );
    assert_eq!(fields["previous_node"], "node-gone");
    assert_eq!(fields["previous_token"], old["token"].to_string());
    assert_eq!(
        fields["previous_expired_at"],
        old["expires_at"].as_str().unwrap()
    );
    let new_token: i64 = fields["token"].parse().expect("token");

    let ev = events_named(&out, "lease_taken_over");
    assert_eq!(ev.len(), 1, "{}", describe(&out));
    let ev = &ev[0];
    assert_eq!(ev["level"], "WARN");
    assert_eq!(ev["resource"], r.as_str());
    assert_eq!(ev["owner_id"], fields["owner_id"].as_str());
    assert_eq!(ev["token"], new_token);
    assert_eq!(ev["previous_owner_id"], old["owner_id"]);
    assert_eq!(ev["previous_node"], "node-gone");
    assert_eq!(ev["previous_token"], old["token"]);
    assert_eq!(ev["expired_at"], old["expires_at"]);
    assert_eq!(ev["node"], "node-new");

    let recs = fx.stale(&r, None);
    assert_eq!(recs.len(), 1, "{recs:?}");
    let rec = &recs[0];
    assert_eq!(rec["kind"], "lease_taken_over");
    assert_eq!(rec["reason"], "expired_unreleased");
    assert_eq!(rec["owner_id"], old["owner_id"]);
    assert_eq!(rec["token"], old["token"]);
    assert_eq!(rec["accepted_token"], new_token);
    assert_eq!(rec["node"], "node-gone");
    assert_eq!(rec["stage"], "acquire");
    let text = stdout(&fx.expect(&["stale"], 0));
    assert!(
        text.lines()
            .any(|l| l.contains(r.as_str()) && l.contains("lease_taken_over")),
        "{text}"
    );
}

// --------------------------------------------------------------- the macro

fn run_case(backend: Backend, test: &str, case: fn(&Fx)) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let fx = Fx {
        backend,
        ts,
        dir: tempfile::tempdir().expect("temp dir"),
    };
    case(&fx);
}

macro_rules! backend_tests {
    ($module:ident, $backend:expr, [$($case:ident),* $(,)?]) => {
        mod $module {
            use super::*;
            $(
                #[test]
                fn $case() {
                    run_case(
                        $backend,
                        concat!(stringify!($module), "::", stringify!($case)),
                        super::$case,
                    );
                }
            )*
        }
    };
}

macro_rules! cli_tests {
    ($($case:ident),* $(,)?) => {
        backend_tests!(sqlite, Backend::Sqlite, [$($case),*]);
        backend_tests!(postgres, Backend::Postgres, [$($case),*]);
        backend_tests!(mysql, Backend::MySql, [$($case),*]);
    };
}

cli_tests!(
    case_lease_acquire_shapes,
    case_lease_renew_release_list,
    case_usage_errors_do_not_touch_store,
    case_store_clock_decides_expiry,
    case_put_sources_and_get,
    case_put_stale_forged_once_and_stale_list,
    case_put_binds_owner_and_resource,
    case_epoch_advance_via_cli,
    case_takeover_logged_and_listed,
);

/// `lease list` keeps its columns straight whatever the names' lengths, and
/// says how far off each expiry is.
#[test]
fn tables_fit_names_of_any_length() {
    let ts = TestStore::new(Backend::Sqlite, "tables_fit").expect("sqlite");
    let dir = tempfile::tempdir().unwrap();
    let long = format!("{}-{}", unique("table"), "x".repeat(60));
    for r in [long.as_str(), "s"] {
        let mut cmd = fencecron(dir.path());
        cmd.args(["lease", "acquire", r, "--store", &ts.url]);
        expect_code(run(cmd, None), 0, &["lease", "acquire", r]);
    }
    let mut cmd = fencecron(dir.path());
    cmd.args(["lease", "list", "--store", &ts.url]);
    let text = stdout(&expect_code(run(cmd, None), 0, &["lease", "list"]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    // TOKEN is right-aligned: every row's token ends where the header does.
    let end = lines[0].find("TOKEN").expect("TOKEN column") + "TOKEN".len();
    for row in &lines[1..] {
        assert_eq!(&row[end - 1..end], "1", "{text}");
        assert_eq!(&row[end..end + 2], "  ", "{text}");
        assert!(row.contains(" in 2") || row.contains(" in 3"), "{text}");
    }
    assert!(lines[1].starts_with(&long) || lines[2].starts_with(&long));
}

/// `exec` of a program that cannot be started exits 127, as a shell and
/// `trigger --wait` do, and gives its lease back; `exec --quiet` writes the
/// job's output and nothing of fencecron's INFO events.
#[test]
fn exec_cannot_start_is_127_and_quiet_is_quiet() {
    let ts = TestStore::new(Backend::Sqlite, "exec_cannot_start").expect("sqlite");
    let dir = tempfile::tempdir().unwrap();
    let r = unique("exec-codes");
    let mut cmd = fencecron(dir.path());
    cmd.args(["exec", &r, "--store", &ts.url, "--", "/nonexistent/program"]);
    let out = expect_code(run(cmd, None), 127, &["exec", "/nonexistent/program"]);
    assert!(
        last_sentence(&out).contains("/nonexistent/program"),
        "{}",
        describe(&out)
    );

    let mut cmd = fencecron(dir.path());
    cmd.args(["exec", "--quiet", &r, "--store", &ts.url, "--"])
        .args(["sh", "-c", "echo out; echo err >&2"]);
    let out = expect_code(run(cmd, None), 0, &["exec", "--quiet"]);
    assert_eq!(stdout(&out).trim(), "out");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "err",
        "only the job's own stderr: {}",
        describe(&out)
    );
    // Without --quiet the run's INFO events are there.
    let mut cmd = fencecron(dir.path());
    cmd.args(["exec", &r, "--store", &ts.url, "--", "true"]);
    let out = expect_code(run(cmd, None), 0, &["exec", "true"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lease_acquired"),
        "{}",
        describe(&out)
    );
}

/// Shell completions and man pages come from the clap definitions: the bash
/// script parses and knows the subcommands; `man DIR` writes one page per
/// command, each a roff page naming it.
#[test]
fn completions_and_man_pages_are_generated_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let gen = |args: &[&std::ffi::OsStr]| {
        let mut cmd = fencecron(dir.path());
        cmd.args(args);
        run(cmd, None)
    };
    let out = gen(&["completions".as_ref(), "bash".as_ref()]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let script = String::from_utf8_lossy(&out.stdout).to_string();
    for sub in ["run", "check", "lease", "put", "stale", "epoch"] {
        assert!(script.contains(sub), "bash completions lack {sub}");
    }
    let path = dir.path().join("fencecron.bash");
    std::fs::write(&path, &script).unwrap();
    let syntax = Command::new("bash").arg("-n").arg(&path).output().unwrap();
    assert!(syntax.status.success(), "{}", describe(&syntax));

    let pages = dir.path().join("man");
    let out = gen(&["man".as_ref(), dir.path().join("missing").as_os_str()]);
    assert_eq!(code(&out), 2, "{}", describe(&out));
    std::fs::create_dir(&pages).unwrap();
    let out = gen(&["man".as_ref(), pages.as_os_str()]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    for page in [
        "fencecron",
        "fencecron-run",
        "fencecron-lease-acquire",
        "fencecron-put",
    ] {
        let text = std::fs::read_to_string(pages.join(format!("{page}.1")))
            .unwrap_or_else(|e| panic!("{page}.1: {e}"));
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page}.1 is not roff"
        );
        assert!(text.contains(page), "{page}.1 does not name {page}");
    }
}

/// Whether `tool` runs here; without it a test skips loudly, and fails
/// under CI=true (.ci/run installs it).
fn have_tool(tool: &str, test: &str) -> bool {
    if Command::new(tool).arg("--version").output().is_ok() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: {tool} is not installed under CI=true; .ci/run must install it"
    );
    skipped!("\n*** SKIPPED {test}: {tool} is not installed ***\n");
    false
}

/// The man pages say more than `--help`: every section-1 page has EXIT
/// STATUS (the command's own codes), EXAMPLES and SEE ALSO, the pages of
/// commands that read the config also ENVIRONMENT and FILES; `jobs.toml.5`
/// is written beside them with every key of the configuration reference;
/// no page names the hidden completion helper; groff reads every page
/// without a warning.
#[test]
fn man_pages_have_exit_status_environment_files_examples_and_jobs_toml() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = fencecron(dir.path());
    cmd.arg("man").arg(dir.path());
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let page = |name: &str| {
        std::fs::read_to_string(dir.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let get = page("fencecron-get.1");
    for section in [
        ".SH \"EXIT STATUS\"",
        ".SH ENVIRONMENT",
        ".SH FILES",
        ".SH EXAMPLES",
        ".SH \"SEE ALSO\"",
    ] {
        assert!(
            get.contains(section),
            "fencecron-get.1 lacks {section}:\n{get}"
        );
    }
    // get's own codes, as docs/commands.md's table gives them; put's
    // variables; a job-less command has no FILES.
    for code in ["\\fB0\\fR", "\\fB1\\fR", "\\fB4\\fR"] {
        assert!(get.contains(code), "fencecron-get.1 lacks exit code {code}");
    }
    assert!(!get.contains("\\fB75\\fR"), "get has no exit 75");
    let put = page("fencecron-put.1");
    for var in [
        "FENCECRON_TOKEN",
        "FENCECRON_OWNER_ID",
        "FENCECRON_STORE_FILE",
    ] {
        assert!(
            put.contains(&format!("\\fB{var}\\fR")),
            "fencecron-put.1 lacks {var}"
        );
    }
    assert!(page("fencecron-run.1").contains("/run/fencecron/"));
    assert!(!page("fencecron-guard-ddl.1").contains(".SH FILES"));
    assert!(page("fencecron.1").contains("\\fBjobs.toml\\fR(5)"));
    let jobs = page("jobs.toml.5");
    assert!(jobs.contains(".TH JOBS.TOML 5"), "{jobs}");
    for key in [
        "store.url_env",
        "history.max_age",
        "retry_backoff_max",
        "on_failure",
    ] {
        assert!(
            jobs.contains(&format!(".TP\n\\fB{key}\\fR\n")),
            "jobs.toml.5 lacks {key}"
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for name in &names {
        assert!(
            !page(name).contains("__complete"),
            "{name} names the hidden helper"
        );
    }
    if !have_tool("groff", "man page rendering test") {
        return;
    }
    for name in &names {
        // -k: UTF-8 input, as man(1) reads it; -ww: every warning.
        let check = Command::new("groff")
            .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
            .arg(dir.path().join(name))
            .output()
            .unwrap();
        assert!(
            check.status.success() && check.stderr.is_empty(),
            "{name}: {}",
            describe(&check)
        );
    }
}

/// bash completion offers the job names of the config the command line
/// would use, for JOB arguments only: `trigger ` completes to both jobs of
/// $FENCECRON_CONFIG, `--config OTHER pause b` to the matching job of the
/// other file; `status` (no JOB) and a second argument get none; a config
/// that does not load gives no names and no message.
#[test]
fn bash_completion_offers_the_configs_job_names() {
    let dir = tempfile::tempdir().unwrap();
    let job = |name: &str| {
        format!("[[job]]\nname = \"{name}\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n")
    };
    let config = dir.path().join("jobs.toml");
    std::fs::write(&config, format!("{}{}", job("alpha"), job("beta"))).unwrap();
    let other = dir.path().join("other.toml");
    std::fs::write(&other, format!("{}{}", job("backup"), job("archive"))).unwrap();
    let broken = dir.path().join("broken.toml");
    std::fs::write(&broken, format!("{}schedule = \"61 * * * *\"\n", job("x"))).unwrap();

    let mut cmd = fencecron(dir.path());
    cmd.args(["completions", "bash"]);
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let script = dir.path().join("fencecron.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .unwrap();
    assert!(syntax.status.success(), "{}", describe(&syntax));

    let bin = common::bin();
    // Completes the last word of `words` as bash would: the script's
    // function for fencecron, called with (command, word, previous word).
    let complete = |words: &[&str]| -> Vec<String> {
        let mut all = vec![bin.to_str().unwrap()];
        all.extend_from_slice(words);
        let quoted: Vec<String> = all.iter().map(|w| format!("'{w}'")).collect();
        let driver = format!(
            "source '{}'\n\
             COMP_WORDS=({})\n\
             COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n\
             COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}\n\
             spec=$(complete -p fencecron); spec=${{spec#*-F }}; fn=${{spec%% *}}\n\
             \"$fn\" \"${{COMP_WORDS[0]}}\" \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
             printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
            script.display(),
            quoted.join(" ")
        );
        let mut bash = clean(Command::new("bash"), dir.path());
        bash.arg("-c").arg(driver).env("FENCECRON_CONFIG", &config);
        let out = run(bash, None);
        assert!(out.status.success(), "{}", describe(&out));
        assert!(out.stderr.is_empty(), "{}", describe(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut trigger = complete(&["trigger", ""]);
    trigger.sort();
    assert_eq!(trigger, ["alpha", "beta"]);
    assert_eq!(
        complete(&["--config", other.to_str().unwrap(), "pause", "b"]),
        ["backup"]
    );
    assert_eq!(
        complete(&["resume", "--config", other.to_str().unwrap(), "a"]),
        ["archive"]
    );
    assert_eq!(complete(&["runs", "--since", "1h", "al"]), ["alpha"]);
    for words in [
        &["status", ""][..],
        &["trigger", "alpha", ""],
        &["trigger", "--timeout", ""],
    ] {
        let offered = complete(words);
        assert!(
            !offered.iter().any(|w| w == "alpha" || w == "beta"),
            "{words:?} offered job names: {offered:?}"
        );
    }
    assert!(
        complete(&["--config", broken.to_str().unwrap(), "trigger", ""])
            .iter()
            .all(|w| w != "x")
    );
    // The helper itself: names only, nothing on stderr, exit 0, also for a
    // config that does not load.
    for (file, names) in [
        (&config, "alpha\nbeta\n"),
        (&broken, ""),
        (&dir.path().join("missing.toml"), ""),
    ] {
        let mut cmd = fencecron(dir.path());
        cmd.args([
            "__complete",
            "jobs",
            "--",
            "fencecron",
            "trigger",
            "--config",
        ])
        .arg(file);
        let out = run(cmd, None);
        assert_eq!(code(&out), 0, "{}", describe(&out));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            names,
            "{}",
            describe(&out)
        );
        assert!(out.stderr.is_empty(), "{}", describe(&out));
    }
}

/// The zsh and fish scripts, with their job-name additions, are valid for
/// their shells (`zsh -n`, `fish --no-execute`); fish, which completes a
/// command line without a terminal (`complete -C`), offers the config's
/// job names for `trigger ` and none for `status `; zsh's job-name function
/// offers them for `pause `.
#[test]
fn zsh_and_fish_completions_are_valid_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let job = |name: &str| {
        format!("[[job]]\nname = \"{name}\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n")
    };
    let config = dir.path().join("jobs.toml");
    std::fs::write(&config, format!("{}{}", job("alpha"), job("beta"))).unwrap();
    for (shell, check) in [("zsh", &["-n"][..]), ("fish", &["--no-execute"][..])] {
        let mut cmd = fencecron(dir.path());
        cmd.args(["completions", shell]);
        let out = run(cmd, None);
        assert_eq!(code(&out), 0, "{}", describe(&out));
        let script = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            script.contains("__complete jobs --"),
            "{shell}: no job names"
        );
        if !have_tool(shell, &format!("{shell} completion syntax test")) {
            continue;
        }
        let path = dir.path().join(format!("fencecron.{shell}"));
        std::fs::write(&path, &script).unwrap();
        let syntax = Command::new(shell).args(check).arg(&path).output().unwrap();
        assert!(
            syntax.status.success() && syntax.stderr.is_empty(),
            "{shell}: {}",
            describe(&syntax)
        );
        let path_var = format!(
            "{}:{}",
            common::bin().parent().unwrap().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        if shell == "zsh" {
            // The script's job-name function, with zsh's completion system
            // stubbed to print what it would offer (that `_arguments`
            // calls it for JOB is checked on the script in the crate).
            let mut zsh = clean(Command::new("zsh"), dir.path());
            zsh.arg("-f")
                .arg("-c")
                .arg(format!(
                    "compdef() {{ }}; _wanted() {{ shift 3; \"$@\" }}; \
                     compadd() {{ print -l -- \"${{(@P)${{@[-1]}}}}\" }}; \
                     source '{}'; LBUFFER='fencecron pause '; _fencecron_jobs",
                    path.display()
                ))
                .env("PATH", &path_var)
                .env("FENCECRON_CONFIG", &config);
            let out = run(zsh, None);
            assert!(
                out.status.success() && out.stderr.is_empty(),
                "{}",
                describe(&out)
            );
            assert_eq!(String::from_utf8_lossy(&out.stdout), "alpha\nbeta\n");
            continue;
        }
        let complete = |line: &str| -> Vec<String> {
            let mut fish = clean(Command::new("fish"), dir.path());
            fish.arg("-c")
                .arg(format!("source '{}'; complete -C '{line}'", path.display()))
                .env("PATH", &path_var)
                .env("FENCECRON_CONFIG", &config);
            let out = run(fish, None);
            assert!(out.status.success(), "{}", describe(&out));
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| l.split('\t').next().unwrap_or("").to_string())
                .collect()
        };
        assert_eq!(complete("fencecron trigger "), ["alpha", "beta"]);
        let status = complete("fencecron status ");
        assert!(!status.iter().any(|w| w == "alpha"), "{status:?}");
    }
}

/// `--version` names the version and the commit the binary was built from.
#[test]
fn version_names_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = fencecron(dir.path());
    cmd.arg("--version");
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    // The commit this build was made from (build.rs gives it to the tests
    // too): 12 hex digits in a git checkout, `unknown` outside one.
    let commit = env!("FENCECRON_COMMIT");
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{commit}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("fencecron {} ({commit})", env!("CARGO_PKG_VERSION"))
    );
}

//! Operating the fleet from the store (issue 10), through the real binary
//! and real daemons: the run history of every outcome, `status`, `trigger`
//! across three daemons, `pause`/`resume` across three daemons.
//! The store operations themselves are in the conformance suite, on every
//! backend.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::common::daemon::{
    ev, i64_field, is, job_toml, secs, sh, str_field, token_of, wait_until, write_config, Daemon,
    DaemonOpts,
};
use crate::common::harness::{code, describe, fencecron, run};
use crate::common::{unique, Backend, TestStore};

/// `fencecron --store URL --config CONFIG ARGS…` in `dir`.
fn cli(dir: &Path, store: &str, config: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd: Command = fencecron(dir);
    cmd.args(["--store", store, "--config"])
        .arg(config)
        .args(args);
    run(cmd, None)
}

/// The JSON a successful command printed.
fn json_of(out: &std::process::Output) -> Value {
    assert_eq!(code(out), 0, "{}", describe(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(out)))
}

/// Every run of the history.
fn runs(dir: &Path, store: &str, config: &Path) -> Vec<Value> {
    match json_of(&cli(
        dir,
        store,
        config,
        &["runs", "--json", "--limit", "1000"],
    )) {
        Value::Array(a) => a,
        other => panic!("runs --json is not an array: {other}"),
    }
}

fn of_job<'a>(name: &'static str, job: &'a str) -> impl Fn(&Value) -> bool + 'a {
    move |e| is(e, name) && str_field(e, "job") == Some(job)
}

/// One daemon; jobs that succeed, fail, time out, lose their lease (taken
/// by hand mid-run) and are stopped by the daemon's shutdown: each run is in
/// `runs --json` with every field, matching its events.
fn history_records_every_outcome(backend: Backend, test: &str) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let [ok, fail, slow, lost, down] = ["ok", "fail", "slow", "lost", "down"].map(unique);
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &[
            job_toml(&ok, "* * * * * *", &sh("echo out-ok"), ""),
            job_toml(&fail, "* * * * * *", &sh("echo oops >&2; exit 4"), ""),
            job_toml(
                &slow,
                "* * * * * *",
                &sh("exec sleep 30"),
                "timeout = \"1s\"",
            ),
            job_toml(&lost, "* * * * * *", &sh("exec sleep 60"), ""),
            job_toml(&down, "0 0 1 1 *", &sh("exec sleep 60"), ""),
        ],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("history", &config, &store.url));
    let ok_end = d.expect("ok ends", of_job("job_finished", &ok), secs(30));
    let fail_end = d.expect("fail ends", of_job("job_finished", &fail), secs(30));
    let slow_end = d.expect("slow times out", of_job("job_finished", &slow), secs(30));

    // Lease loss: the lease is released and taken by hand under the run.
    let won = d.expect("lost starts", of_job("lease_acquired", &lost), secs(30));
    d.expect(
        "lost runs",
        |e| of_job("job_started", &lost)(e) && token_of(e) == token_of(&won),
        secs(30),
    );
    let owner = str_field(&won, "owner_id").expect("owner_id").to_string();
    let token = token_of(&won).to_string();
    let out = cli(
        dir.path(),
        &store.url,
        &config,
        &[
            "lease",
            "release",
            &lost,
            "--owner-id",
            &owner,
            "--token",
            &token,
        ],
    );
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let out = cli(
        dir.path(),
        &store.url,
        &config,
        &["lease", "acquire", &lost, "--lease", "60s"],
    );
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let lost_end = d.expect(
        "lost ends",
        |e| of_job("job_finished", &lost)(e) && token_of(e) == token_of(&won),
        secs(30),
    );

    // Shutdown: a manual run of `down` is in progress when the daemon stops;
    // meanwhile `status` shows it running.
    let out = cli(dir.path(), &store.url, &config, &["trigger", &down]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let down_start = d.expect("down starts", of_job("job_started", &down), secs(30));
    let status = json_of(&cli(dir.path(), &store.url, &config, &["status", "--json"]));
    let down_status = status
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|s| str_field(s, "job") == Some(down.as_str()))
        })
        .unwrap_or_else(|| panic!("{status}"))
        .clone();
    assert_eq!(
        i64_field(&down_status["running"], "token"),
        Some(token_of(&down_start)),
        "{down_status}"
    );
    assert_eq!(
        str_field(&down_status["running"], "node"),
        Some(d.node.as_str())
    );
    let ok_status = status
        .as_array()
        .and_then(|a| a.iter().find(|s| str_field(s, "job") == Some(ok.as_str())))
        .unwrap_or_else(|| panic!("{status}"));
    assert_eq!(
        str_field(&ok_status["last_success"], "outcome"),
        Some("succeeded"),
        "{ok_status}"
    );
    assert!(ok_status["paused"].is_null(), "{ok_status}");
    assert!(d.stop(secs(30)).is_some_and(|s| s.success()));
    let down_end = d
        .events("job_finished")
        .into_iter()
        .find(|e| token_of(e) == token_of(&down_start) && str_field(e, "job") == Some(&down))
        .unwrap_or_else(|| panic!("no end of the stopped run: {}", d.summary()));

    let history = runs(dir.path(), &store.url, &config);
    let row_of = |end: &Value| -> Value {
        let job = str_field(end, "job").unwrap();
        history
            .iter()
            .find(|r| str_field(r, "job") == Some(job) && token_of(r) == token_of(end))
            .unwrap_or_else(|| panic!("no run of {end} in {history:?}"))
            .clone()
    };
    let acquired = d.events("lease_acquired");
    for (end, outcome, exit_code, signal, output, trigger) in [
        (
            &ok_end,
            "succeeded",
            Some(0),
            None,
            Some("out-ok\n"),
            "schedule",
        ),
        (
            &fail_end,
            "failed",
            Some(4),
            None,
            Some("oops\n"),
            "schedule",
        ),
        (
            &slow_end,
            "timed_out",
            None,
            Some("SIGTERM"),
            None,
            "schedule",
        ),
        (
            &lost_end,
            "lease_lost",
            None,
            Some("SIGTERM"),
            None,
            "schedule",
        ),
        (&down_end, "shutdown", None, Some("SIGTERM"), None, "manual"),
    ] {
        let row = row_of(end);
        assert_eq!(str_field(&row, "outcome"), Some(outcome), "{row}");
        assert_eq!(str_field(end, "outcome"), Some(outcome), "{end}");
        assert_eq!(i64_field(&row, "exit_code"), exit_code, "{row}");
        assert_eq!(str_field(&row, "signal"), signal, "{row}");
        assert_eq!(str_field(&row, "trigger"), Some(trigger), "{row}");
        assert_eq!(str_field(&row, "node"), Some(d.node.as_str()), "{row}");
        assert_eq!(str_field(&row, "resource"), str_field(end, "job"), "{row}");
        assert_eq!(
            str_field(&row, "scheduled_at"),
            str_field(end, "scheduled_at"),
            "{row} / {end}"
        );
        let owner = acquired
            .iter()
            .find(|a| str_field(a, "job") == str_field(end, "job") && token_of(a) == token_of(end))
            .and_then(|a| str_field(a, "owner_id"));
        assert_eq!(str_field(&row, "owner_id"), owner, "{row}");
        let (started, finished) = (
            str_field(&row, "started_at").expect("started_at"),
            str_field(&row, "finished_at").expect("finished_at"),
        );
        assert!(started <= finished, "{row}");
        assert!(i64_field(&row, "duration_ms").is_some(), "{row}");
        if let Some(output) = output {
            assert_eq!(str_field(&row, "output"), Some(output), "{row}");
        }
    }

    // One run with its output; the filters; what is not there.
    let failed = row_of(&fail_end);
    let run = str_field(&failed, "owner_id").unwrap().to_string();
    let out = cli(dir.path(), &store.url, &config, &["runs", "show", &run]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains("outcome:      failed") && text.contains("  oops"),
        "{text}"
    );
    let shown = json_of(&cli(
        dir.path(),
        &store.url,
        &config,
        &["runs", "show", &run, "--json"],
    ));
    assert_eq!(shown, failed);
    let only_failed = json_of(&cli(
        dir.path(),
        &store.url,
        &config,
        &["runs", "--outcome", "failed", "--json", "--limit", "1000"],
    ));
    let only_failed = only_failed.as_array().expect("array");
    assert!(only_failed.iter().any(|r| r == &failed), "{only_failed:?}");
    assert!(
        only_failed
            .iter()
            .all(|r| str_field(r, "outcome") == Some("failed")),
        "{only_failed:?}"
    );
    let mine = json_of(&cli(
        dir.path(),
        &store.url,
        &config,
        &["runs", &ok, "--node", &d.node, "--json"],
    ));
    assert!(!mine.as_array().expect("array").is_empty(), "{mine}");
    let elsewhere = json_of(&cli(
        dir.path(),
        &store.url,
        &config,
        &["runs", &ok, "--node", "no-such-node", "--json"],
    ));
    assert_eq!(elsewhere, serde_json::json!([]));
    let missing = uuid::Uuid::new_v4().to_string();
    let out = cli(dir.path(), &store.url, &config, &["runs", "show", &missing]);
    assert_eq!(code(&out), 4, "{}", describe(&out));
    let out = cli(
        dir.path(),
        &store.url,
        &config,
        &["runs", &unique("no-such-job")],
    );
    assert_eq!(code(&out), 2, "{}", describe(&out));
}

#[test]
fn history_records_every_outcome_sqlite() {
    history_records_every_outcome(Backend::Sqlite, "history_records_every_outcome_sqlite");
}

#[test]
fn history_records_every_outcome_postgres() {
    history_records_every_outcome(Backend::Postgres, "history_records_every_outcome_postgres");
}

/// Three daemons: `trigger --wait` runs the job exactly once and exits with
/// its code; while it runs, another `trigger` is refused (75); with no
/// daemon, the request is withdrawn after `--timeout` (1).
fn trigger_runs_once_across_three_daemons(backend: Backend, test: &str) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("manual");
    let log = dir.path().join("ran");
    let hold = dir.path().join("hold");
    let script = format!(
        "echo \"$FENCECRON_TOKEN $FENCECRON_NODE\" >> '{}'; if [ -e '{}' ]; then exec sleep 60; fi; exit 7",
        log.display(),
        hold.display()
    );
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &[job_toml(&job, "0 0 1 1 *", &sh(&script), "")],
    );
    let nodes: Vec<Daemon> = (0..3)
        .map(|i| Daemon::spawn(DaemonOpts::new(&format!("trig-{i}"), &config, &store.url)))
        .collect();
    for d in &nodes {
        d.expect("daemon_started", ev("daemon_started"), secs(60));
    }
    let out = cli(
        dir.path(),
        &store.url,
        &config,
        &["trigger", &job, "--wait"],
    );
    assert_eq!(code(&out), 7, "the job's exit code: {}", describe(&out));
    let lines = std::fs::read_to_string(&log).expect("the job ran");
    assert_eq!(lines.lines().count(), 1, "exactly once: {lines}");
    let started: Vec<Value> = nodes
        .iter()
        .flat_map(|d| d.events("trigger_started"))
        .collect();
    assert_eq!(started.len(), 1, "one daemon took it: {started:?}");
    let history = runs(dir.path(), &store.url, &config);
    let manual: Vec<&Value> = history
        .iter()
        .filter(|r| str_field(r, "job") == Some(job.as_str()))
        .collect();
    assert_eq!(manual.len(), 1, "{history:?}");
    assert_eq!(str_field(manual[0], "trigger"), Some("manual"));
    assert!(manual[0]["scheduled_at"].is_null(), "{}", manual[0]);
    assert_eq!(i64_field(manual[0], "exit_code"), Some(7));

    // Running: another trigger is refused, naming the holder.
    std::fs::write(&hold, "").unwrap();
    let out = cli(dir.path(), &store.url, &config, &["trigger", &job]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let running_token = token_of(&started[0]) + 1;
    let out = cli(dir.path(), &store.url, &config, &["trigger", &job]);
    assert_eq!(code(&out), 75, "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("token {running_token}")), "{err}");
    for mut d in nodes {
        assert!(
            d.stop(secs(30)).is_some_and(|s| s.success()),
            "{}",
            d.summary()
        );
    }

    // No daemon: withdrawn after the timeout.
    let out = cli(
        dir.path(),
        &store.url,
        &config,
        &["trigger", &job, "--timeout", "2s"],
    );
    assert_eq!(code(&out), 1, "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no live daemon"),
        "{}",
        describe(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap().lines().count(),
        2,
        "the withdrawn request never ran"
    );
}

#[test]
fn trigger_runs_once_across_three_daemons_sqlite() {
    trigger_runs_once_across_three_daemons(Backend::Sqlite, "trigger_once_sqlite");
}

#[test]
fn trigger_runs_once_across_three_daemons_postgres() {
    trigger_runs_once_across_three_daemons(Backend::Postgres, "trigger_once_postgres");
}

/// The instant of a run or a skip.
fn instant(e: &Value) -> String {
    str_field(e, "scheduled_at")
        .unwrap_or_else(|| panic!("no scheduled_at: {e}"))
        .to_string()
}

/// Three daemons: a paused job runs on none of them, and each paused instant
/// is logged once at INFO fleet-wide; `resume` brings it back; a pause
/// `--for` ends by itself. `status` shows the pause and its note.
fn pause_stops_every_daemon(backend: Backend, test: &str) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("pausing");
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &[job_toml(&job, "* * * * * *", &sh("true"), "")],
    );
    let nodes: Vec<Daemon> = (0..3)
        .map(|i| Daemon::spawn(DaemonOpts::new(&format!("pause-{i}"), &config, &store.url)))
        .collect();
    let any = |what: &str, pred: &dyn Fn(&Value) -> bool| -> Value {
        let deadline = std::time::Instant::now() + secs(30);
        loop {
            if let Some(e) = nodes.iter().flat_map(|d| d.all()).find(|e| pred(e)) {
                return e;
            }
            assert!(std::time::Instant::now() < deadline, "no {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    any("first run", &of_job("job_started", &job));

    let out = cli(
        dir.path(),
        &store.url,
        &config,
        &["pause", &job, "--note", "db migration"],
    );
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let paused = |e: &Value| {
        of_job("occurrence_skipped", &job)(e) && str_field(e, "reason") == Some("paused")
    };
    let first = instant(&any("a paused instant", &paused));
    // Three more paused instants after the first.
    let later = |n: i64| {
        let first = first.clone();
        move |e: &Value| {
            paused(e) && instant(e) > first && {
                let t = chrono::DateTime::parse_from_rfc3339(&instant(e)).unwrap();
                let f = chrono::DateTime::parse_from_rfc3339(&first).unwrap();
                (t - f).num_seconds() >= n
            }
        }
    };
    let third = instant(&any("three paused instants", &later(3)));
    let status = json_of(&cli(dir.path(), &store.url, &config, &["status", "--json"]));
    assert_eq!(
        str_field(&status[0]["paused"], "note"),
        Some("db migration"),
        "{status}"
    );
    let out = cli(dir.path(), &store.url, &config, &["resume", &job]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let resumed = any("a run after resume", &|e| {
        of_job("job_started", &job)(e) && instant(e) > first
    });
    let resumed_at = instant(&resumed);

    // Every instant after the first paused one, up to one logged paused at
    // least three seconds later (all of them before the resume): skipped,
    // and logged once at INFO across the fleet. (The first paused instant
    // may also have run on a daemon whose acquire came before the pause;
    // every later one saw it.) The first run after the resume is no bound:
    // an instant one daemon logged paused just before the resume may still
    // run on another whose acquire came just after it, within its
    // starting deadline, so the skips before that run could be fewer.
    let all: Vec<Value> = nodes.iter().flat_map(|d| d.all()).collect();
    let in_pause = |e: &Value| {
        let t = instant(e);
        t > first && t <= third
    };
    let mut skips: Vec<String> = all
        .iter()
        .filter(|e| paused(e) && in_pause(e))
        .map(instant)
        .collect();
    let count = skips.len();
    skips.sort();
    skips.dedup();
    assert_eq!(
        count,
        skips.len(),
        "an instant logged twice at INFO: {skips:?}"
    );
    assert!(skips.len() >= 3, "{skips:?}");
    for s in &skips {
        let e = all.iter().find(|e| paused(e) && &instant(e) == s).unwrap();
        assert_eq!(str_field(e, "note"), Some("db migration"), "{e}");
    }

    // `--for`: resumes by itself.
    let out = cli(
        dir.path(),
        &store.url,
        &config,
        &["pause", &job, "--for", "3s"],
    );
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let second = instant(&any("paused again", &|e| {
        paused(e) && instant(e) > resumed_at
    }));
    any("a run after the pause ran out", &|e| {
        of_job("job_started", &job)(e) && instant(e) > second
    });
    for mut d in nodes {
        assert!(
            d.stop(secs(30)).is_some_and(|s| s.success()),
            "{}",
            d.summary()
        );
    }
}

#[test]
fn pause_stops_every_daemon_sqlite() {
    pause_stops_every_daemon(Backend::Sqlite, "pause_sqlite");
}

#[test]
fn pause_stops_every_daemon_postgres() {
    pause_stops_every_daemon(Backend::Postgres, "pause_postgres");
}

/// A second `pause` of a paused job is refused (exit 75) naming the pause
/// in force, which stays; `--replace` replaces it, note and until; a pause
/// that ran out is no pause.
fn pause_twice_is_refused_unless_replaced(backend: Backend, test: &str) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("twice");
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &[job_toml(&job, "0 0 1 1 *", &sh("true"), "")],
    );
    let pause = |args: &[&str]| {
        let mut all = vec!["pause", job.as_str()];
        all.extend_from_slice(args);
        cli(dir.path(), &store.url, &config, &all)
    };
    // `status` exits 3 here (no live node has the job); its JSON is whole.
    let paused = || {
        let out = cli(dir.path(), &store.url, &config, &["status", "--json"]);
        let status: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
        status[0]["paused"].clone()
    };
    let out = pause(&["--note", "disk swap", "--for", "2h"]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let first = paused();
    assert_eq!(str_field(&first, "note"), Some("disk swap"), "{first}");
    let out = pause(&["--note", "other"]);
    assert_eq!(code(&out), 75, "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    for part in [
        format!("{job} is already paused by"),
        "until 20".to_string(),
        "(note: disk swap)".to_string(),
        "pass --replace".to_string(),
    ] {
        assert!(err.contains(&part), "{part}: {err}");
    }
    assert_eq!(paused(), first, "the pause in force is unchanged");
    let out = pause(&["--replace", "--note", "other"]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let second = paused();
    assert_eq!(str_field(&second, "note"), Some("other"), "{second}");
    assert!(second["until"].is_null(), "indefinite now: {second}");
    let out = pause(&["--for", "1s"]);
    assert_eq!(code(&out), 75, "an indefinite pause: {}", describe(&out));

    // A timed pause that ran out is replaced without --replace.
    let out = pause(&["--replace", "--for", "1s"]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    wait_until(
        secs(30),
        || paused().is_null(),
        || "the 1s pause to end".to_string(),
    );
    let out = pause(&["--note", "after"]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    assert_eq!(str_field(&paused(), "note"), Some("after"));
}

#[test]
fn pause_twice_is_refused_unless_replaced_sqlite() {
    pause_twice_is_refused_unless_replaced(Backend::Sqlite, "pause_twice_sqlite");
}

#[test]
fn pause_twice_is_refused_unless_replaced_mysql() {
    pause_twice_is_refused_unless_replaced(Backend::MySql, "pause_twice_mysql");
}

/// A manual run follows `retries`: a job whose first attempt fails (a
/// file marks it) and whose retry succeeds; `trigger --wait` waits for the
/// retry, prints its output tail and exits 0; both attempts are in the
/// history as `manual`.
fn trigger_wait_follows_retries(backend: Backend, test: &str) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("flaky");
    let marker = dir.path().join("first-attempt");
    let script = format!(
        "if [ -e '{m}' ]; then echo \"second attempt $FENCECRON_TOKEN\"; exit 0; fi; touch '{m}'; echo 'first attempt'; exit 4",
        m = marker.display()
    );
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &[job_toml(
            &job,
            "0 0 1 1 *",
            &sh(&script),
            "retries = 1\nretry_backoff = \"1s\"",
        )],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("trig-retry", &config, &store.url));
    d.expect("daemon_started", ev("daemon_started"), secs(60));
    let out = cli(
        dir.path(),
        &store.url,
        &config,
        &["trigger", &job, "--wait"],
    );
    assert_eq!(code(&out), 0, "the retry succeeded: {}", describe(&out));
    assert!(marker.exists(), "the first attempt ran");
    let history = runs(dir.path(), &store.url, &config);
    let mut rows: Vec<&Value> = history
        .iter()
        .filter(|r| str_field(r, "job") == Some(job.as_str()))
        .collect();
    rows.sort_by_key(|r| token_of(r));
    assert_eq!(rows.len(), 2, "{history:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("second attempt {}\n", token_of(rows[1]))),
        "the last attempt's output: {stdout}"
    );
    assert!(!stdout.contains("first attempt"), "{stdout}");
    for (r, exit) in rows.iter().zip([4, 0]) {
        assert_eq!(str_field(r, "trigger"), Some("manual"), "{r}");
        assert_eq!(i64_field(r, "exit_code"), Some(exit), "{r}");
    }
    assert_eq!(d.events("retry_scheduled").len(), 1, "{}", d.summary());
    assert!(
        d.stop(secs(30)).is_some_and(|s| s.success()),
        "{}",
        d.summary()
    );
}

#[test]
fn trigger_wait_follows_retries_sqlite() {
    trigger_wait_follows_retries(Backend::Sqlite, "trigger_retries_sqlite");
}

#[test]
fn trigger_wait_follows_retries_postgres() {
    trigger_wait_follows_retries(Backend::Postgres, "trigger_retries_postgres");
}

/// `retries`: a job that always fails runs three times for one instant
/// (the run and two retries), each under a higher token, all with the same
/// `FENCECRON_RUN_ID`, recorded as `schedule`, `retry`, `retry`; its
/// `on_failure` hook runs once, after the last.
#[test]
fn a_failing_job_is_retried_and_its_hook_runs_once_sqlite() {
    let store = TestStore::new(Backend::Sqlite, "retries").expect("sqlite");
    let dir = tempfile::tempdir().expect("temp dir");
    let job = unique("retried");
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &[job_toml(
            &job,
            "*/30 * * * * *",
            &sh("echo \"id=$FENCECRON_RUN_ID\"; exit 3"),
            "retries = 2\nretry_backoff = \"1s\"\non_failure = [\"true\"]",
        )],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("retries", &config, &store.url));
    let first = d.expect("a run", of_job("job_finished", &job), secs(60));
    let at = instant(&first);
    d.expect("the hook", ev("on_failure_finished"), secs(30));
    let ends: Vec<Value> = d
        .events("job_finished")
        .into_iter()
        .filter(|e| str_field(e, "job") == Some(job.as_str()) && instant(e) == at)
        .collect();
    d.stop(secs(30));
    assert_eq!(ends.len(), 3, "the run and two retries: {}", d.summary());
    let tokens: Vec<i64> = ends.iter().map(token_of).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    let all = d.all();
    let position = |pred: &dyn Fn(&Value) -> bool| all.iter().position(pred).unwrap();
    assert!(
        position(&|e| is(e, "on_failure_finished"))
            > position(&|e| is(e, "job_finished") && token_of(e) == tokens[2]),
        "the hook runs after the last retry: {}",
        d.summary()
    );
    assert_eq!(d.events("on_failure_finished").len(), 1, "{}", d.summary());
    assert_eq!(d.events("retry_scheduled").len(), 2, "{}", d.summary());

    let history = runs(dir.path(), &store.url, &config);
    let mut rows: Vec<&Value> = history
        .iter()
        .filter(|r| str_field(r, "job") == Some(job.as_str()))
        .collect();
    rows.sort_by_key(|r| token_of(r));
    let triggers: Vec<&str> = rows
        .iter()
        .filter_map(|r| str_field(r, "trigger"))
        .collect();
    assert_eq!(triggers, ["schedule", "retry", "retry"], "{rows:?}");
    for r in &rows {
        assert_eq!(str_field(r, "scheduled_at"), Some(at.as_str()), "{r}");
        assert_eq!(
            str_field(r, "output"),
            Some(format!("id={job}@{at}\n").as_str()),
            "the same run id every time: {r}"
        );
        assert_eq!(i64_field(r, "exit_code"), Some(3), "{r}");
    }
}

/// `fencecron bench` runs every operation on every backend: its raw
/// statements bind what the store's own bind.
fn bench_runs(backend: Backend, test: &str) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = fencecron(dir.path());
    cmd.args(["--store", &store.url, "bench", "--duration", "200ms"])
        .args(["--clients", "1", "--resources", "2"]);
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for op in ["acquire (free)", "acquire (held)", "renew", "release"] {
        assert!(text.contains(op), "{op}: {text}");
    }
}

#[test]
fn bench_runs_sqlite() {
    bench_runs(Backend::Sqlite, "bench_runs_sqlite");
}

#[test]
fn bench_runs_postgres() {
    bench_runs(Backend::Postgres, "bench_runs_postgres");
}

#[test]
fn bench_runs_mysql() {
    bench_runs(Backend::MySql, "bench_runs_mysql");
}

/// `overlap = "replace"` (issue 11): a run that outlives its interval is
/// replaced by the next instant, on whichever daemon it runs. Daemon A
/// (the default `skip`) runs an instant whose job never ends; daemon B
/// (`replace`) takes the lease for a later instant with the next token and
/// logs `run_replaced`; A's next renewal is refused (`lease_lost`,
/// `renew_refused`) and its run ends `lease_lost`. Once A is gone, B's next
/// instant replaces B's own run the same way. The history shows each
/// replaced run as `lease_lost` on its node.
fn overlap_replace_ends_the_old_run(backend: Backend, test: &str) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("temp dir"),
        tempfile::tempdir().expect("temp dir"),
    );
    let job = unique("replaced");
    let config = |dir: &Path, extra: &str| {
        write_config(
            dir,
            "lease = \"5s\"",
            &[job_toml(
                &job,
                "*/10 * * * * *",
                &sh("exec sleep 600"),
                extra,
            )],
        )
    };
    let config_a = config(dir_a.path(), "");
    let config_b = config(dir_b.path(), "overlap = \"replace\"");
    let mut a = Daemon::spawn(DaemonOpts::new("replace-a", &config_a, &store.url));
    let first = a.expect("A runs an instant", of_job("job_started", &job), secs(30));
    let old = token_of(&first);
    let mut b = Daemon::spawn(DaemonOpts::new("replace-b", &config_b, &store.url));

    let replaced = b.expect("B replaces A's run", of_job("run_replaced", &job), secs(40));
    assert_eq!(str_field(&replaced, "previous_node"), Some("replace-a"));
    assert_eq!(i64_field(&replaced, "previous_token"), Some(old));
    let at = instant(&replaced);
    let started = b.expect(
        "B runs the replacing instant",
        |e| of_job("job_started", &job)(e) && instant(e) == at,
        secs(10),
    );
    assert_eq!(token_of(&started), old + 1, "the next token");
    let lost = a.expect(
        "A's renewal is refused",
        |e| of_job("lease_lost", &job)(e) && token_of(e) == old,
        secs(20),
    );
    assert_eq!(str_field(&lost, "reason"), Some("renew_refused"), "{lost}");
    let ended = a.expect(
        "A's run ends",
        |e| of_job("job_finished", &job)(e) && token_of(e) == old,
        secs(20),
    );
    assert_eq!(str_field(&ended, "outcome"), Some("lease_lost"), "{ended}");
    assert!(
        a.stop(secs(30)).is_some_and(|s| s.success()),
        "{}",
        a.summary()
    );

    // The same node: B's next instant replaces B's own run.
    let again = b.expect(
        "B replaces its own run",
        |e| of_job("run_replaced", &job)(e) && i64_field(e, "previous_token") == Some(old + 1),
        secs(30),
    );
    assert_eq!(str_field(&again, "previous_node"), Some("replace-b"));
    let lost = b.expect(
        "B's earlier run is refused",
        |e| of_job("lease_lost", &job)(e) && token_of(e) == old + 1,
        secs(20),
    );
    assert_eq!(str_field(&lost, "reason"), Some("renew_refused"), "{lost}");
    b.expect(
        "B's earlier run ends",
        |e| {
            of_job("job_finished", &job)(e)
                && token_of(e) == old + 1
                && str_field(e, "outcome") == Some("lease_lost")
        },
        secs(20),
    );
    b.expect(
        "B runs the instant that replaced it",
        |e| of_job("job_started", &job)(e) && token_of(e) == old + 2,
        secs(10),
    );
    assert!(
        b.stop(secs(30)).is_some_and(|s| s.success()),
        "{}",
        b.summary()
    );

    let history = runs(dir_b.path(), &store.url, &config_b);
    let row = |token: i64| {
        history
            .iter()
            .find(|r| str_field(r, "job") == Some(job.as_str()) && token_of(r) == token)
            .unwrap_or_else(|| panic!("no run with token {token}: {history:?}"))
    };
    for (token, node) in [(old, "replace-a"), (old + 1, "replace-b")] {
        let r = row(token);
        assert_eq!(str_field(r, "outcome"), Some("lease_lost"), "{r}");
        assert_eq!(str_field(r, "node"), Some(node), "{r}");
    }
}

#[test]
fn overlap_replace_ends_the_old_run_sqlite() {
    overlap_replace_ends_the_old_run(Backend::Sqlite, "replace_sqlite");
}

#[test]
fn overlap_replace_ends_the_old_run_postgres() {
    overlap_replace_ends_the_old_run(Backend::Postgres, "replace_postgres");
}

/// `node.max_running = 1` through the real binary. Two jobs fall due at the
/// same instant. A daemon alone runs one, and the other waits for it to end
/// (`occurrence_waiting`) and runs late under the same instant; it never
/// runs two at once. With a second daemon of the same capacity, each instant
/// is spread: one job on each node, and still never two at once on a node.
#[test]
fn max_running_spreads_an_instant_over_the_nodes_sqlite() {
    let Some(store) = TestStore::new(Backend::Sqlite, "max_running_sqlite") else {
        return;
    };
    let (dir_a, dir_b) = (
        tempfile::tempdir().expect("temp dir"),
        tempfile::tempdir().expect("temp dir"),
    );
    let (j1, j2) = (unique("cap-one"), unique("cap-two"));
    let config = |dir: &Path| {
        let mut text = "[node]\nmax_running = 1\n\n[defaults]\nlease = \"5s\"\n\n".to_string();
        for j in [&j1, &j2] {
            text.push_str(&job_toml(j, "*/10 * * * * *", &sh("sleep 3"), ""));
        }
        let path = dir.join("jobs.toml");
        std::fs::write(&path, text).expect("write jobs.toml");
        path
    };
    let ours = |e: &Value| [&j1, &j2].iter().any(|j| str_field(e, "job") == Some(j));
    let (config_a, config_b) = (config(dir_a.path()), config(dir_b.path()));
    let mut a = Daemon::spawn(DaemonOpts::new("cap-a", &config_a, &store.url).debug());

    // Alone: one job at the instant, the other once it ended, same instant.
    let first = a.expect(
        "A runs one job",
        |e| is(e, "job_started") && ours(e),
        secs(30),
    );
    let at = instant(&first);
    let other = if str_field(&first, "job") == Some(&j1) {
        &j2
    } else {
        &j1
    };
    a.expect(
        "the other waits for capacity",
        |e| is(e, "occurrence_waiting") && str_field(e, "job") == Some(other) && instant(e) == at,
        secs(5),
    );
    a.expect(
        "the other runs under the same instant",
        |e| is(e, "job_started") && str_field(e, "job") == Some(other) && instant(e) == at,
        secs(10),
    );

    // Two nodes: an instant after B is up runs one job on each.
    let mut b = Daemon::spawn(DaemonOpts::new("cap-b", &config_b, &store.url));
    b.expect("B is up", ev("daemon_started"), secs(20));
    let spread = |d: &Daemon| {
        d.events("job_started")
            .into_iter()
            .filter(|e| ours(e))
            .map(|e| (instant(&e), str_field(&e, "job").unwrap_or("").to_string()))
            .collect::<Vec<_>>()
    };
    let shared_instant = || {
        let (on_a, on_b) = (spread(&a), spread(&b));
        on_b.iter()
            .find(|(t, _)| on_a.iter().any(|(u, _)| u == t))
            .map(|(t, _)| t.clone())
    };
    let deadline = std::time::Instant::now() + secs(40);
    let t = loop {
        if let Some(t) = shared_instant() {
            break t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no instant ran on both nodes\nA: {}\nB: {}",
            a.summary(),
            b.summary()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let jobs_at = |d: &Daemon| {
        spread(d)
            .into_iter()
            .filter(|(u, _)| *u == t)
            .map(|(_, j)| j)
            .collect::<Vec<_>>()
    };
    let (on_a, on_b) = (jobs_at(&a), jobs_at(&b));
    assert_eq!((on_a.len(), on_b.len()), (1, 1), "A {on_a:?}, B {on_b:?}");
    assert_ne!(on_a, on_b, "one job on each node");
    for d in [&mut a, &mut b] {
        assert!(
            d.stop(secs(30)).is_some_and(|s| s.success()),
            "{}",
            d.summary()
        );
        // Never two runs at once on one node: starts and ends alternate.
        let mut running = 0;
        for e in d.all().iter().filter(|e| ours(e)) {
            if is(e, "job_started") {
                running += 1;
                assert!(running <= 1, "two runs at once: {}", d.summary());
            } else if is(e, "job_finished") {
                running -= 1;
            }
        }
    }
}

/// Batch claims through the real binary on PostgreSQL and MySQL: three
/// daemons, six jobs due every second. Every instant of every job runs at
/// most once; once the daemons know of each other, a first-round claim is
/// bounded by its share (below the six items), and the runs spread over the
/// nodes.
#[test]
fn claims_spread_a_burst_over_the_nodes_postgres() {
    claims_spread(Backend::Postgres, "claims_spread_postgres");
}

#[test]
fn claims_spread_a_burst_over_the_nodes_mysql() {
    claims_spread(Backend::MySql, "claims_spread_mysql");
}

fn claims_spread(backend: Backend, test: &str) {
    let Some(store) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let prefix = unique("spread");
    let jobs: Vec<String> = (0..6).map(|i| format!("{prefix}-{i}")).collect();
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &jobs
            .iter()
            .map(|j| job_toml(j, "* * * * * *", &["true".to_string()], ""))
            .collect::<Vec<_>>(),
    );
    let mut daemons: Vec<Daemon> = (0..3)
        .map(|i| {
            Daemon::spawn(DaemonOpts::new(&format!("spread-{i}"), &config, &store.url).debug())
        })
        .collect();
    // The predicate sees one event at a time (it runs under the log's lock).
    let shared_limit = |e: &Value| {
        is(e, "occurrences_claimed")
            && i64_field(e, "round") == Some(1)
            && i64_field(e, "limit").is_some_and(|l| l < 6)
    };
    for d in &daemons {
        d.expect(
            "a first-round claim bounded by its share",
            shared_limit,
            secs(40),
        );
    }
    // The first instants may run where the nodes did not know of each
    // other yet; wait for one instant whose runs were spread.
    let nodes_of = |t: &str| {
        daemons
            .iter()
            .filter(|d| d.events("job_started").iter().any(|e| instant(e) == t))
            .count()
    };
    wait_until(
        secs(40),
        || {
            daemons
                .iter()
                .flat_map(|d| d.events("job_started"))
                .any(|e| nodes_of(&instant(&e)) >= 2)
        },
        || {
            format!(
                "no instant's runs spread over two nodes: {:?}",
                daemons.iter().map(Daemon::summary).collect::<Vec<_>>()
            )
        },
    );
    for d in &mut daemons {
        assert!(
            d.stop(secs(30)).is_some_and(|s| s.success()),
            "{}",
            d.summary()
        );
    }
    let mut seen = std::collections::BTreeMap::new();
    for d in &daemons {
        for e in d.events("job_started") {
            let key = (str_field(&e, "job").unwrap_or("").to_string(), instant(&e));
            if let Some(other) = seen.insert(key.clone(), d.node.clone()) {
                panic!("{key:?} ran on {other} and {}", d.node);
            }
        }
    }
}

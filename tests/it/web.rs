//! The web view and the metrics after a restart (issue 28), through the
//! real binary: the pages of a running fleet (jobs, nodes, last outcomes,
//! stale records), every hostile value escaped, the actions refused
//! without a token and done once with one, the series of every job before
//! any run and the last success restored after a restart, and the page in
//! a real headless browser (Debian's `chromium`).

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::daemon::{
    ev, is, job_toml, secs, sh, str_field, wait_until, write_config, Daemon, DaemonOpts,
};
use crate::common::harness::{code, describe, fencecron, run};
use crate::common::{free_port, unique, Backend, TestStore};

/// A token of the test token files (at least 16 characters).
const ALICE: &str = "alice-0123456789abcdef";

/// One HTTP/1.1 answer.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// One request to 127.0.0.1:`port` (`Connection: close`); waits up to a
/// minute for a daemon that has just started to listen.
fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer {
    let deadline = Instant::now() + secs(60);
    let mut s = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("cannot connect to 127.0.0.1:{port}: {e}"),
        }
    };
    s.set_read_timeout(Some(secs(30))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    if !body.is_empty() {
        req.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the answer");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {text}"));
    Answer {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

fn get(port: u16, path: &str) -> Answer {
    http(port, "GET", path, &[], "")
}

/// The value of the sample `series` (labels exactly as rendered).
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

/// `/metrics` once `done` holds for it, for up to `timeout`.
fn metrics_when(port: u16, timeout: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let a = get(port, "/metrics");
        if a.status == 200 && done(&a.body) {
            return a.body;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics never got there:\n{}",
            a.body
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `text` as one percent-encoded path segment (as the pages link it).
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `text` escaped as the pages escape values.
fn escaped(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// A config of `jobs` with `[http]` on `port` (and `token_file`).
fn config_with_http(
    dir: &Path,
    file: &str,
    port: u16,
    token_file: Option<&Path>,
    jobs: &[String],
) -> std::path::PathBuf {
    let path = write_config(dir, "lease = \"5s\"", jobs);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut http = format!("[http]\nlisten = \"127.0.0.1:{port}\"\n");
    if let Some(t) = token_file {
        http.push_str(&format!("token_file = \"{}\"\n", t.display()));
    }
    let target = dir.join(file);
    std::fs::write(&target, format!("{http}{text}")).unwrap();
    target
}

/// A token file of `alice` with mode `mode`.
fn token_file(dir: &Path, mode: u32) -> std::path::PathBuf {
    let path = dir.join("web-tokens");
    std::fs::write(&path, format!("# who may act\nalice {ALICE}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

fn cli(dir: &Path, store: &str, config: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd: Command = fencecron(dir);
    cmd.args(["--store", store, "--config"])
        .arg(config)
        .args(args);
    run(cmd, None)
}

/// Every configured job has its series before any run (zero counters,
/// next run, paused, the node gauge), and after a restart the last
/// success is back, read from the run history, before any new run.
#[test]
fn metrics_series_exist_before_any_run_and_the_last_success_survives_a_restart() {
    let store = TestStore::new(Backend::Sqlite, "web_metrics_restart").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ok = unique("wok");
    let idle = unique("widle");
    let yearly = "0 0 0 1 1 *";
    let port = free_port();
    let config = config_with_http(
        dir.path(),
        "jobs.toml",
        port,
        None,
        &[
            job_toml(&ok, "* * * * * *", &sh("true"), ""),
            job_toml(&idle, yearly, &sh("true"), ""),
        ],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("wm1", &config, &store.url));
    let idle_series =
        |body: &str, series: &str| sample(body, &format!("fencecron_{series}{{job=\"{idle}\"}}"));
    let body = metrics_when(port, secs(60), |b| {
        sample(b, "fencecron_nodes{state=\"running\"}").is_some_and(|n| n >= 1.0)
    });
    for series in ["job_running", "job_paused", "stale_writes_rejected_total"] {
        assert_eq!(idle_series(&body, series), Some(0.0), "{series}:\n{body}");
    }
    for outcome in ["succeeded", "failed"] {
        let s = format!("fencecron_job_runs_total{{job=\"{idle}\",outcome=\"{outcome}\"}}");
        assert_eq!(sample(&body, &s), Some(0.0), "{s}:\n{body}");
    }
    let next = idle_series(&body, "job_next_run_timestamp_seconds")
        .unwrap_or_else(|| panic!("no next run of {idle}:\n{body}"));
    let next_year = chrono::NaiveDate::from_ymd_opt(chrono::Utc::now().year_ce().1 as i32 + 1, 1, 1)
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc()
        .timestamp() as f64;
    assert_eq!(next, next_year, "{body}");
    assert!(idle_series(&body, "job_last_success_timestamp_seconds").is_none());
    assert!(
        body.contains("fencecron_config_drift_jobs "),
        "the drift gauge:\n{body}"
    );

    d.expect(
        "a success",
        |e: &Value| {
            is(e, "job_finished")
                && str_field(e, "job") == Some(ok.as_str())
                && str_field(e, "outcome") == Some("succeeded")
        },
        secs(60),
    );
    assert!(
        d.stop(secs(60)).is_some_and(|s| s.success()),
        "{}",
        d.summary()
    );
    // The history's last success of `ok`, as the store has it.
    let out = cli(
        dir.path(),
        &store.url,
        &config,
        &[
            "runs",
            &ok,
            "--outcome",
            "succeeded",
            "--json",
            "--limit",
            "1",
        ],
    );
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    let finished = runs[0]["finished_at"]
        .as_str()
        .unwrap_or_else(|| panic!("no finished run: {runs}"));
    let finished = chrono::DateTime::parse_from_rfc3339(finished)
        .unwrap()
        .timestamp_millis() as f64
        / 1000.0;

    // Restarted with `ok` scheduled once a year: no run ends before the
    // scrape, so the gauge can only come from the history.
    let port = free_port();
    let config = config_with_http(
        dir.path(),
        "jobs2.toml",
        port,
        None,
        &[
            job_toml(&ok, yearly, &sh("true"), ""),
            job_toml(&idle, yearly, &sh("true"), ""),
        ],
    );
    let mut d = Daemon::spawn(DaemonOpts::new("wm1", &config, &store.url));
    let series = format!("fencecron_job_last_success_timestamp_seconds{{job=\"{ok}\"}}");
    let body = metrics_when(port, secs(60), |b| sample(b, &series).is_some());
    let restored = sample(&body, &series).unwrap();
    assert!(
        (restored - finished).abs() < 0.01,
        "restored {restored}, the history says {finished}:\n{body}"
    );
    let last_run = sample(
        &body,
        &format!("fencecron_job_last_run_timestamp_seconds{{job=\"{ok}\"}}"),
    );
    assert!(last_run.is_some_and(|t| t >= restored), "{body}");
    assert!(d.events("job_started").is_empty(), "{}", d.summary());
    d.stop(secs(60));
}

use chrono::Datelike as _;

/// The fleet's page from two real daemons: every job with its schedule,
/// state and last outcome, the live nodes, a stale-owner record; hostile
/// job names, notes and output escaped everywhere; without a token file
/// every action is refused (403).
#[test]
fn the_page_shows_the_fleet_with_every_value_escaped_and_no_action_without_a_token_file() {
    let store = TestStore::new(Backend::Sqlite, "web_page").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tag = unique("w");
    let hostile = format!("<script>alert(\"x\")</script> 'q' ☃ {tag}");
    let bad = format!("bad-{tag}");
    let idle = format!("idle-{tag}");
    let jobs = [
        job_toml(
            &hostile,
            "* * * * * *",
            &sh(
                r#"echo "<img src=x onerror=alert(1)> ünïcødé"; "$FENCECRON_BIN" put k --value v --token $((FENCECRON_TOKEN + 1)) || true"#,
            ),
            "",
        ),
        job_toml(&bad, "* * * * * *", &sh("exit 3"), ""),
        job_toml(
            &idle,
            "0 0 0 1 1 *",
            &sh("true"),
            "timezone = \"Europe/Paris\"",
        ),
    ];
    let port = free_port();
    let config = config_with_http(dir.path(), "a.toml", port, None, &jobs);
    // The second node serves nothing: one port less to collide.
    let other = write_config(dir.path(), "lease = \"5s\"", &jobs);
    let a = Daemon::spawn(DaemonOpts::new("web-a", &config, &store.url));
    let b = Daemon::spawn(DaemonOpts::new("web-b<&>", &other, &store.url));
    let note = "<script>alert('note')</script> \"quoted\" — ünïcødé";
    let out = cli(
        dir.path(),
        &store.url,
        &config,
        &["pause", &idle, "--note", note],
    );
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let finished = |job: String, outcome: &'static str| {
        move |e: &Value| {
            is(e, "job_finished")
                && str_field(e, "job") == Some(job.as_str())
                && str_field(e, "outcome") == Some(outcome)
        }
    };
    let both = |what: &str, pred: &dyn Fn(&Value) -> bool| {
        wait_until(
            secs(60),
            || {
                a.wait_for(pred, Duration::ZERO).is_some()
                    || b.wait_for(pred, Duration::ZERO).is_some()
            },
            || format!("{what}:\n{}\n{}", a.summary(), b.summary()),
        )
    };
    both("a success", &finished(hostile.clone(), "succeeded"));
    both("a failure", &finished(bad.clone(), "failed"));
    both("a stale write", &|e: &Value| {
        is(e, "stale_write_rejected") && str_field(e, "job") == Some(hostile.as_str())
    });

    // Both nodes live on the page, the outcomes and the stale record.
    let deadline = Instant::now() + secs(60);
    let page = loop {
        let p = get(port, "/");
        assert_eq!(p.status, 200, "{}", p.body);
        // An event is logged before its row is written: the page catches up.
        if p.body.contains("<td>web-a</td>")
            && p.body.contains("<td>web-b&lt;&amp;&gt;</td>")
            && p.body.contains(">succeeded</a>")
            && p.body.contains(">failed</a>")
            && p.body.contains("<td>forged</td>")
        {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "the page never showed both nodes, both outcomes and the stale record:\n{}",
            p.body
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(
        page.head.contains("text/html; charset=utf-8"),
        "{}",
        page.head
    );
    let body = &page.body;
    assert!(body.contains("<meta http-equiv=\"refresh\""), "{body}");
    assert!(!body.contains("<script"), "unescaped markup:\n{body}");
    assert!(!body.contains("src=x"), "unescaped markup:\n{body}");
    assert!(body.contains(&escaped(&hostile)), "{body}");
    assert!(
        body.contains(&format!("href=\"/jobs/{}\"", segment(&hostile))),
        "{body}"
    );
    assert!(body.contains(&escaped(note)), "the pause note:\n{body}");
    assert!(body.contains("paused</span> by"), "{body}");
    assert!(body.contains(">succeeded</a>"), "{body}");
    assert!(body.contains(">failed</a>"), "{body}");
    assert!(body.contains("Europe/Paris"), "{body}");
    assert!(
        body.contains(" CET</td>"),
        "the next instant in the job's zone:\n{body}"
    );
    assert!(
        body.contains("<td>forged</td>"),
        "the stale record:\n{body}"
    );
    assert!(body.contains("<td>write_rejected</td>"), "{body}");
    assert!(
        !body.contains("http://") && !body.contains("https://"),
        "no external asset:\n{body}"
    );

    // The job's page and one run's output tail, escaped.
    let job = get(port, &format!("/jobs/{}", segment(&hostile)));
    assert_eq!(job.status, 200, "{}", job.body);
    assert!(!job.body.contains("<script"), "{}", job.body);
    assert!(
        !job.body.contains("<form"),
        "no action without a token file"
    );
    // A run that ended (the newest may still run, without output yet).
    let run_link = job
        .body
        .split("href=\"/runs/")
        .skip(1)
        .find_map(|s| s.split_once("\">succeeded</a>"))
        .map(|(id, _)| id.to_string())
        .unwrap_or_else(|| panic!("no succeeded run's link:\n{}", job.body));
    let run_page = get(port, &format!("/runs/{run_link}"));
    assert_eq!(run_page.status, 200, "{}", run_page.body);
    assert!(
        run_page
            .body
            .contains("&lt;img src=x onerror=alert(1)&gt; ünïcødé"),
        "{}",
        run_page.body
    );
    assert!(!run_page.body.contains("<img"), "{}", run_page.body);
    assert_eq!(get(port, "/runs/not-a-uuid").status, 404);
    assert_eq!(
        get(port, &format!("/runs/{}", uuid::Uuid::new_v4())).status,
        404
    );
    assert_eq!(get(port, "/jobs/no-such-job").status, 404);
    // On loopback, a page answers a loopback Host only (DNS rebinding).
    let rebound = http(port, "GET", "/", &[("Host", "evil.example:80")], "");
    assert_eq!(rebound.status, 421, "{}", rebound.body);
    assert!(
        !rebound.body.contains(&escaped(&hostile)),
        "{}",
        rebound.body
    );
    assert_eq!(
        http(
            port,
            "GET",
            "/",
            &[("Host", &format!("localhost:{port}"))],
            ""
        )
        .status,
        200
    );

    // Read-only: every action is refused, even with a token.
    for action in ["trigger", "pause", "resume"] {
        let a = http(
            port,
            "POST",
            &format!("/jobs/{}/{action}", segment(&idle)),
            &[("Authorization", &format!("Bearer {ALICE}"))],
            "",
        );
        assert_eq!(a.status, 403, "{action}: {}", a.body);
    }
    assert!(b.events("trigger_started").is_empty() && a.events("trigger_started").is_empty());
    assert_eq!(get(port, "/metrics").status, 200);
}

/// The actions: refused without a token, with a wrong one, from another
/// origin or a form without the page's CSRF value; with a token, a trigger
/// runs the job once (recorded as asked by `web:alice`), a pause (with a
/// hostile note) is shown and refused a second time, and resume ends it.
#[test]
fn actions_are_refused_without_the_token_and_work_once_with_it() {
    let store = TestStore::new(Backend::Sqlite, "web_actions").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let job = unique("wact");
    let port = free_port();
    let tokens = token_file(dir.path(), 0o600);
    let config = config_with_http(
        dir.path(),
        "jobs.toml",
        port,
        Some(&tokens),
        &[job_toml(&job, "0 0 0 1 1 *", &sh("echo triggered"), "")],
    );
    let d = Daemon::spawn(DaemonOpts::new("web-act", &config, &store.url));
    let path = |action: &str| format!("/jobs/{}/{action}", segment(&job));
    let bearer = format!("Bearer {ALICE}");
    // The page's forms and their CSRF value, once the store answers.
    let deadline = Instant::now() + secs(60);
    let page = loop {
        let p = get(port, &format!("/jobs/{}", segment(&job)));
        if p.status == 200 {
            break p.body;
        }
        assert!(Instant::now() < deadline, "{}", p.body);
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(page.contains("<form method=\"post\""), "{page}");
    assert!(!page.contains(ALICE), "the page never shows a token");
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_string();

    let refused = [
        http(port, "POST", &path("trigger"), &[], ""),
        http(
            port,
            "POST",
            &path("trigger"),
            &[("Authorization", "Bearer wrong-token-0123456789")],
            "",
        ),
        http(
            port,
            "POST",
            &path("trigger"),
            &[],
            &format!("token={ALICE}"),
        ),
        http(
            port,
            "POST",
            &path("trigger"),
            &[("Origin", "http://evil.example")],
            &format!("token={ALICE}&csrf={csrf}"),
        ),
        http(
            port,
            "POST",
            &path("trigger"),
            &[("Sec-Fetch-Site", "cross-site"), ("Authorization", &bearer)],
            "",
        ),
    ];
    let statuses: Vec<u16> = refused.iter().map(|a| a.status).collect();
    assert_eq!(
        statuses,
        [401, 401, 403, 403, 403],
        "{:?}",
        refused.iter().map(|a| &a.body).collect::<Vec<_>>()
    );
    assert_eq!(http(port, "GET", &path("trigger"), &[], "").status, 404);

    // A trigger with the token: one run, asked by web:alice.
    let t = http(
        port,
        "POST",
        &path("trigger"),
        &[("Authorization", &bearer)],
        "",
    );
    assert_eq!(t.status, 303, "{}", t.body);
    assert!(
        t.head
            .to_ascii_lowercase()
            .contains(&format!("location: /jobs/{}", segment(&job)).to_ascii_lowercase()),
        "{}",
        t.head
    );
    let started = d.expect("the triggered run", ev("trigger_started"), secs(60));
    assert_eq!(
        str_field(&started, "requested_by"),
        Some("web:alice"),
        "{started}"
    );
    d.expect(
        "its end",
        |e: &Value| is(e, "job_finished") && str_field(e, "job") == Some(job.as_str()),
        secs(60),
    );
    let out = cli(dir.path(), &store.url, &config, &["runs", &job, "--json"]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(runs.as_array().map(Vec::len), Some(1), "{runs}");
    assert_eq!(runs[0]["trigger"], "manual", "{runs}");
    assert_eq!(d.events("trigger_requested").len(), 1, "{}", d.summary());
    assert_eq!(d.events("trigger_started").len(), 1, "{}", d.summary());

    // A pause from the form (token, CSRF value, same origin), once.
    let note = "<b>\"deploy\"</b> & 'ünïcødé'";
    let form = format!("token={ALICE}&csrf={csrf}&note={}&for=1h", url_encode(note));
    let origin = format!("http://127.0.0.1:{port}");
    let same = [
        ("Origin", origin.as_str()),
        ("Sec-Fetch-Site", "same-origin"),
    ];
    let p = http(port, "POST", &path("pause"), &same, &form);
    assert_eq!(p.status, 303, "{}", p.body);
    let again = http(port, "POST", &path("pause"), &same, &form);
    assert_eq!(again.status, 409, "{}", again.body);
    let paused = d.expect("the pause", ev("job_paused"), secs(10));
    assert_eq!(str_field(&paused, "paused_by"), Some("web:alice"));
    assert_eq!(str_field(&paused, "note"), Some(note));
    let page = get(port, &format!("/jobs/{}", segment(&job))).body;
    assert!(page.contains(&escaped(note)), "{page}");
    assert!(page.contains("by web:alice until"), "{page}");
    // The gauge: set by the action, and by every heartbeat (a beat that
    // read the pauses just before may set it back until the next one).
    let series = format!("fencecron_job_paused{{job=\"{job}\"}}");
    let paused_is = |v: f64| {
        metrics_when(port, secs(30), |b| sample(b, &series) == Some(v));
    };
    paused_is(1.0);
    let out = cli(dir.path(), &store.url, &config, &["status", "--json"]);
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status[0]["paused"]["paused_by"], "web:alice", "{status}");

    let r = http(
        port,
        "POST",
        &path("resume"),
        &[("Authorization", &bearer)],
        "",
    );
    assert_eq!(r.status, 303, "{}", r.body);
    paused_is(0.0);
    let page = get(port, &format!("/jobs/{}", segment(&job))).body;
    assert!(!page.contains("paused</span>"), "{page}");
    // A pause from the CLI reaches the gauge through the heartbeat.
    let out = cli(dir.path(), &store.url, &config, &["pause", &job]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    paused_is(1.0);
    let out = cli(dir.path(), &store.url, &config, &["resume", &job]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
    paused_is(0.0);
    assert_eq!(d.events("trigger_started").len(), 1, "still one run");
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `check` (and `run`) refuse a token file others may read, at the key's
/// place in jobs.toml, in one sentence that says how to fix it.
#[test]
fn check_refuses_a_token_file_others_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = token_file(dir.path(), 0o644);
    let config = config_with_http(
        dir.path(),
        "jobs.toml",
        free_port(),
        Some(&tokens),
        &[job_toml("a", "0 0 0 1 1 *", &sh("true"), "")],
    );
    let mut cmd = fencecron(dir.path());
    cmd.arg("check").arg("--config").arg(&config);
    let out = run(cmd, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(code(&out), 0, "{}", describe(&out));
    assert!(err.contains("jobs.toml:3:"), "{err}");
    assert!(err.contains("http.token_file"), "{err}");
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut cmd = fencecron(dir.path());
    cmd.arg("check").arg("--config").arg(&config);
    let out = run(cmd, None);
    assert_eq!(code(&out), 0, "{}", describe(&out));
}

/// The chromium binary, or `None` (skipped loudly; a failure under
/// `CI=true`, where `.ci/run` installs it).
fn chromium() -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("chromium"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("chromium is not installed under CI=true; .ci/run installs it");
        }
        skipped!("\n*** SKIPPED the headless browser test: chromium is not installed ***\n");
    }
    found
}

/// Debian's chromium, headless (as root it needs `--no-sandbox`), with a
/// profile of its own.
fn browser(chromium: &Path, profile: &Path, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(chromium);
    cmd.args([
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .args(args);
    run(cmd, None)
}

/// The page of a running fleet in a real browser: the DOM chromium built
/// shows the jobs, their outcomes, the pause and its note, the nodes and a
/// stale record, with no script; the screenshot is a PNG of the page.
/// `FENCECRON_UPDATE_SCREENSHOT=1` copies it to docs/web-view.png (the
/// README's picture).
#[test]
fn the_page_in_a_headless_browser() {
    let Some(chromium) = chromium() else {
        return;
    };
    let store = TestStore::new(Backend::Sqlite, "web_browser").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let jobs = [
        job_toml(
            "backup-db",
            "*/2 * * * * *",
            &sh("echo dumped 42 tables"),
            "",
        ),
        job_toml(
            "sync-invoices",
            "*/3 * * * * *",
            &sh("echo 'upstream said 502' >&2; exit 3"),
            "",
        ),
        job_toml(
            "ledger-export",
            "* * * * * *",
            &sh(
                r#""$FENCECRON_BIN" put last-export --value now --token $((FENCECRON_TOKEN + 1)) || true"#,
            ),
            "",
        ),
        job_toml(
            "nightly-vacuum",
            "0 30 3 * * *",
            &sh("true"),
            "timezone = \"Europe/Paris\"",
        ),
    ];
    let config = config_with_http(dir.path(), "a.toml", port, None, &jobs);
    // The second node serves nothing: one port less to collide.
    let other = write_config(dir.path(), "lease = \"5s\"", &jobs);
    let a = Daemon::spawn(DaemonOpts::new("node-a", &config, &store.url));
    let b = Daemon::spawn(DaemonOpts::new("node-b", &other, &store.url));
    let note = "db migration <ops@example.com>";
    let out = cli(
        dir.path(),
        &store.url,
        &config,
        &["pause", "nightly-vacuum", "--note", note, "--for", "2h"],
    );
    assert_eq!(code(&out), 0, "{}", describe(&out));
    // Everything the page should show, read from the plain page first.
    let url = format!("http://127.0.0.1:{port}/");
    let deadline = Instant::now() + secs(90);
    loop {
        let p = get(port, "/");
        let body = &p.body;
        if p.status == 200
            && body.contains("<td>node-a</td>")
            && body.contains("<td>node-b</td>")
            && body.contains(">succeeded</a>")
            && body.contains(">failed</a>")
            && body.contains("<td>forged</td>")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the page never showed the fleet:\n{body}\n{}\n{}",
            a.summary(),
            b.summary()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    let profile = tempfile::tempdir().unwrap();
    let out = browser(&chromium, profile.path(), &["--dump-dom", &url]);
    assert!(out.status.success(), "{}", describe(&out));
    let dom = String::from_utf8_lossy(&out.stdout);
    for shown in [
        "fencecron",
        "backup-db",
        "sync-invoices",
        "ledger-export",
        "nightly-vacuum",
        "Europe/Paris",
        ">succeeded</a>",
        ">failed</a>",
        "by ",
        "db migration &lt;ops@example.com&gt;",
        "<td>node-a</td>",
        "<td>node-b</td>",
        "<td>forged</td>",
        "Live nodes",
        "Stale-owner records",
    ] {
        assert!(
            dom.contains(shown),
            "the browser's DOM lacks {shown:?}:\n{dom}"
        );
    }
    assert!(!dom.contains("<script"), "{dom}");

    let shot = profile.path().join("web-view.png");
    let out = browser(
        &chromium,
        profile.path(),
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1200,900",
            &url,
        ],
    );
    assert!(out.status.success(), "{}", describe(&out));
    let png =
        std::fs::read(&shot).unwrap_or_else(|e| panic!("no screenshot ({e}): {}", describe(&out)));
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(
        png.len() > 10_000,
        "a blank screenshot? {} bytes",
        png.len()
    );
    if std::env::var_os("FENCECRON_UPDATE_SCREENSHOT").is_some() {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/web-view.png");
        std::fs::copy(&shot, &docs).unwrap();
    }
}

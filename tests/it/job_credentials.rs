//! docs/principles.md, principle 11: the store's password never reaches a job's
//! environment or argv, for jobs started by the daemon and by `fencecron
//! exec`, whichever way the URL was given (`--store`, `$FENCECRON_STORE`,
//! `store.url_env`) — and yet `fencecron put` inside the job, with no flags,
//! reaches the same store.
//!
//! PostgreSQL only: its test server trusts every local connection, so a URL
//! with a made-up password still connects (MySQL's root would refuse it).
//! Needs `FENCECRON_TEST_POSTGRES_URL` (see `tests/common/mod.rs`).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::daemon::{job_toml, toml_str, write_config, Daemon, DaemonOpts};
use common::harness::{clean, fencecron, run};
use common::{bin, unique, Backend, TestStore};

/// The test server's URL with a made-up password that occurs nowhere else.
fn url_with_password(ts: &TestStore) -> (String, String) {
    let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
    let mut url = url::Url::parse(&ts.url).expect("test URL parses");
    url.set_password(Some(&password))
        .expect("URL takes a password");
    (url.to_string(), password)
}

/// Variables the daemon (or exec) is given besides the store: a copy of
/// the URL under another name and the driver's own password variable, both
/// of which must stay out of the job too.
fn leaky_env(url: &str, password: &str) -> Vec<(String, String)> {
    vec![
        ("SOME_APP_DATABASE_URL".to_string(), url.to_string()),
        ("PGPASSWORD".to_string(), password.to_string()),
    ]
}

/// The job: copies its own `/proc/PID/environ` and `cmdline` into `dir`,
/// then runs `fencecron put result` with no flags and records the outcome.
/// Only its first run does anything.
fn job_argv(dir: &Path) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        r#"mkdir "$1/ran" 2>/dev/null || exit 0
cat /proc/$$/environ > "$1/environ"
cat /proc/$$/cmdline > "$1/cmdline"
"$FENCECRON_BIN" put result --value "written by $FENCECRON_TOKEN" > "$1/put.out" 2>&1
echo $? > "$1/put.rc.tmp" && mv "$1/put.rc.tmp" "$1/put.rc""#
            .into(),
        "sh".into(),
        dir.display().to_string(),
    ]
}

/// Waits until `path` exists.
fn wait_for_file(path: &Path, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {timeout:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the job recorded, checked: no password anywhere in its environment
/// or argv, none of the variables that carried it, the store reached
/// through `FENCECRON_STORE_FILE`, and its `put` accepted. Returns the
/// private file's path and the job's resource and token.
fn check_job_record(dir: &Path, password: &str, url_env: Option<&str>) -> (PathBuf, String, i64) {
    wait_for_file(&dir.join("put.rc"), Duration::from_secs(60));
    let environ = std::fs::read(dir.join("environ")).expect("environ copied");
    let cmdline = std::fs::read(dir.join("cmdline")).expect("cmdline copied");
    let put = std::fs::read_to_string(dir.join("put.out")).unwrap_or_default();
    let rc = std::fs::read_to_string(dir.join("put.rc")).unwrap();
    let contains = |hay: &[u8]| {
        hay.windows(password.len())
            .any(|w| w == password.as_bytes())
    };
    assert!(!contains(&cmdline), "the password is in the job's argv");
    let vars: Vec<(String, String)> = environ
        .split(|b| *b == 0)
        .filter(|v| !v.is_empty())
        .map(|v| {
            let v = String::from_utf8_lossy(v);
            let (k, val) = v.split_once('=').unwrap_or((&v, ""));
            (k.to_string(), val.to_string())
        })
        .collect();
    let names: Vec<&str> = vars.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        !contains(&environ),
        "the password is in the job's environment, in {:?}",
        vars.iter()
            .filter(|(_, v)| v.contains(password))
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
    );
    for gone in ["FENCECRON_STORE", "PGPASSWORD", "SOME_APP_DATABASE_URL"]
        .into_iter()
        .chain(url_env)
    {
        assert!(!names.contains(&gone), "{gone} reached the job: {names:?}");
    }
    let get = |k: &str| {
        vars.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("the job has no {k}: {names:?}"))
    };
    let file = PathBuf::from(get("FENCECRON_STORE_FILE"));
    assert_eq!(rc.trim(), "0", "the job's fencecron put failed: {put}");
    assert!(put.contains("accepted:"), "{put}");
    assert!(!put.contains(password), "{put}");
    let token: i64 = get("FENCECRON_TOKEN").parse().expect("token");
    (file, get("FENCECRON_RESOURCE"), token)
}

/// The value the job wrote, read back with the full URL: the job reached
/// the same store.
fn check_written(url: &str, cwd: &Path, resource: &str, token: i64) {
    let mut cmd = fencecron(cwd);
    cmd.args([
        "get",
        "result",
        "--resource",
        resource,
        "--json",
        "--store",
        url,
    ]);
    let out = run(&mut cmd, None);
    assert_eq!(out.status.code(), Some(0), "get: {out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("get --json");
    assert_eq!(v["value"], format!("written by {token}"));
    assert_eq!(v["token"].as_i64(), Some(token));
}

/// How the daemon is told the store.
#[derive(Debug, Clone, Copy)]
enum Given {
    Flag,
    Env,
    UrlEnv,
    /// No password in the URL, `$PGPASSWORD` set.
    PgPassword,
}

fn daemon_keeps_password_from_jobs(given: Given, test: &str) {
    let Some(ts) = TestStore::new(Backend::Postgres, test) else {
        return;
    };
    let (url, password) = url_with_password(&ts);
    let dir = tempfile::tempdir().expect("temp dir");
    let record = dir.path().join("record");
    std::fs::create_dir(&record).unwrap();
    let job = job_toml(
        &unique("creds"),
        "* * * * * *",
        &job_argv(&record),
        "lease = \"10s\"",
    );
    let url_env = "FENCECRON_TEST_DB_URL";
    let config = match given {
        Given::UrlEnv => {
            let path = dir.path().join("jobs.toml");
            std::fs::write(
                &path,
                format!("[store]\nurl_env = {}\n\n{job}", toml_str(url_env)),
            )
            .unwrap();
            path
        }
        _ => write_config(dir.path(), "", &[job]),
    };
    let mut opts = DaemonOpts::new(&unique("node"), &config, "");
    opts.env = leaky_env(&url, &password);
    match given {
        Given::Flag => opts.store = url.clone(),
        Given::Env => opts.env.push(("FENCECRON_STORE".into(), url.clone())),
        Given::UrlEnv => opts.env.push((url_env.into(), url.clone())),
        Given::PgPassword => unreachable!("covered by exec"),
    }
    let mut d = Daemon::spawn(opts);
    let (file, resource, token) = check_job_record(
        &record,
        &password,
        matches!(given, Given::UrlEnv).then_some(url_env),
    );
    d.stop(Duration::from_secs(30)).expect("daemon stops");
    assert!(
        !file.exists() && !file.parent().unwrap().exists(),
        "the private URL file {} outlived the daemon",
        file.display()
    );
    check_written(&url, dir.path(), &resource, token);
    let log = format!("{:?}{:?}", d.all(), d.other_lines());
    assert!(
        !log.contains(&password),
        "the password is in the daemon's log"
    );
}

#[test]
fn daemon_job_gets_no_password_store_from_flag() {
    daemon_keeps_password_from_jobs(Given::Flag, "daemon_job_gets_no_password_store_from_flag");
}

#[test]
fn daemon_job_gets_no_password_store_from_env() {
    daemon_keeps_password_from_jobs(Given::Env, "daemon_job_gets_no_password_store_from_env");
}

#[test]
fn daemon_job_gets_no_password_store_from_url_env() {
    daemon_keeps_password_from_jobs(
        Given::UrlEnv,
        "daemon_job_gets_no_password_store_from_url_env",
    );
}

fn exec_keeps_password_from_job(given: Given, test: &str) {
    let Some(ts) = TestStore::new(Backend::Postgres, test) else {
        return;
    };
    let (url, password) = url_with_password(&ts);
    let dir = tempfile::tempdir().expect("temp dir");
    let resource = unique("creds-exec");
    let mut cmd = clean(Command::new(bin()), dir.path());
    cmd.args(["exec", &resource, "--lease", "10s"]);
    match given {
        Given::Flag => {
            cmd.args(["--store", &url]);
        }
        Given::Env => {
            cmd.env("FENCECRON_STORE", &url);
        }
        // A URL without a password: the driver authenticates with
        // $PGPASSWORD (from `leaky_env`), which the job does not inherit.
        Given::PgPassword => {
            cmd.args(["--store", &ts.url]);
        }
        Given::UrlEnv => unreachable!("exec has no config here"),
    }
    cmd.arg("--").args(job_argv(dir.path()));
    cmd.envs(leaky_env(&url, &password));
    let out = run(&mut cmd, None);
    assert_eq!(out.status.code(), Some(0), "exec: {out:?}");
    let (file, job_resource, token) = check_job_record(dir.path(), &password, None);
    assert_eq!(job_resource, resource);
    assert!(
        !file.exists() && !file.parent().unwrap().exists(),
        "the private URL file {} outlived exec",
        file.display()
    );
    check_written(&url, dir.path(), &resource, token);
}

#[test]
fn exec_job_gets_no_password_store_from_flag() {
    exec_keeps_password_from_job(Given::Flag, "exec_job_gets_no_password_store_from_flag");
}

#[test]
fn exec_job_gets_no_password_store_from_env() {
    exec_keeps_password_from_job(Given::Env, "exec_job_gets_no_password_store_from_env");
}

#[test]
fn exec_job_gets_no_pgpassword() {
    exec_keeps_password_from_job(Given::PgPassword, "exec_job_gets_no_pgpassword");
}

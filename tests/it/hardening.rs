//! Hostile input and a hostile environment, through the real binary:
//! shell-quoted `eval` output, stdout that cannot be written, oversized and
//! NUL-carrying config files, passwords in URL query strings, SQLite files
//! that another user could rewrite, values too large for the store, and the
//! systemd unit's sandbox.

use crate::common;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::harness::{clean, code, describe, fencecron, run};
use common::{unique, Backend, TestStore};

const EXIT_RUNTIME: i32 = 1;
const EXIT_USAGE: i32 = 2;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A scratch directory and a SQLite store inside it.
fn scratch() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("fencecron.db").display());
    (dir, url)
}

/// Files in `dir` whose name starts with `pwned`: what an injected command
/// would have created.
fn pwned(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("read scratch dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pwned"))
        .collect()
}

// ------------------------------------------------------- item 4: eval

/// Runs `eval "$(fencecron … ARGS)"` in a real `sh` in `dir` and returns
/// the named variables as the shell holds them afterwards, NUL-separated so
/// that nothing (spaces, quotes, trailing blanks) is lost.
fn eval_vars(dir: &Path, store: &str, args: &[&str], vars: &[&str]) -> (Output, Vec<String>) {
    let print: String = vars.iter().map(|v| format!(" \"${v}\"")).collect();
    let script = format!(
        "store=$1; shift; eval \"$(\"$0\" --store \"$store\" \"$@\")\" && printf '%s\\0'{print}"
    );
    let mut cmd = clean(Command::new("sh"), dir);
    cmd.arg("-c")
        .arg(script)
        .arg(common::bin())
        .arg(store)
        .args(args);
    let out = run(cmd, None);
    let values = out
        .stdout
        .split(|b| *b == 0)
        .map(|v| String::from_utf8(v.to_vec()).expect("UTF-8 value"))
        .collect::<Vec<_>>();
    (out, values)
}

/// `eval "$(fencecron lease acquire NAME)"` runs nothing that is in NAME,
/// and `$resource` comes out exactly equal to NAME, for every character a
/// resource name may hold (names cannot hold control characters, so no
/// newline). `lease renew`'s `expires_at=` line is quoted the same way.
#[test]
fn eval_of_lease_output_runs_nothing_from_a_hostile_name() {
    let (dir, store) = scratch();
    let hostile = [
        "x$(touch pwned)",
        "x`touch pwned-bq`",
        "a; touch pwned-semi; b",
        "it's $(touch pwned-q)'",
        "'",
        "''",
        "\"$(touch pwned-dq)\"",
        "back\\slash\\",
        "spaces  and trailing ",
        " leading",
        "$HOME ${PATH} $1 $@ *",
        "| touch pwned-pipe &",
        "é ü 名前 🙂",
        "#comment",
        "a=b c=d",
    ];
    for name in hostile {
        let (out, vars) = eval_vars(
            dir.path(),
            &store,
            &["lease", "acquire", name],
            &["resource", "owner_id", "token", "expires_at"],
        );
        assert_eq!(code(&out), 0, "{name:?}: {}", describe(&out));
        assert_eq!(vars[0], name, "$resource for {name:?}: {}", describe(&out));
        uuid::Uuid::parse_str(&vars[1]).expect("$owner_id is a UUID");
        assert_eq!(vars[2], "1", "$token for {name:?}");
        chrono::DateTime::parse_from_rfc3339(&vars[3]).expect("$expires_at is RFC 3339");
        assert!(pwned(dir.path()).is_empty(), "{name:?} ran a command");

        let (out, renewed) = eval_vars(
            dir.path(),
            &store,
            &[
                "lease",
                "renew",
                name,
                "--owner-id",
                &vars[1],
                "--token",
                &vars[2],
            ],
            &["expires_at"],
        );
        assert_eq!(code(&out), 0, "renew {name:?}: {}", describe(&out));
        chrono::DateTime::parse_from_rfc3339(&renewed[0]).expect("renewed $expires_at");
    }
    assert!(pwned(dir.path()).is_empty());

    // Newlines cannot be smuggled in: a name with a control character is
    // refused before anything is printed.
    let out = run(
        {
            let mut c = fencecron(dir.path());
            c.args(["--store", &store, "lease", "acquire", "x\ntouch pwned-nl"]);
            c
        },
        None,
    );
    assert_eq!(code(&out), EXIT_USAGE, "{}", describe(&out));
    assert!(stdout(&out).is_empty());
}

// ------------------------------------------------ item 6: stdout errors

/// `fencecron ARGS --store STORE` with stdout connected as given.
fn with_stdout(dir: &Path, store: &str, args: &[&str], out: Stdio) -> Output {
    let mut cmd = fencecron(dir);
    cmd.arg("--store").arg(store).args(args).stdout(out);
    cmd.stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn fencecron");
    child.wait_with_output().expect("wait for fencecron")
}

/// A pipe whose reading end is already closed: the first write gets EPIPE,
/// as when `head` has exited.
fn closed_pipe() -> Stdio {
    let (read, write) = nix::unistd::pipe().expect("pipe");
    drop(read);
    Stdio::from(write)
}

/// Every command that prints: a closed pipe ends it quietly with exit 0,
/// a full disk (`/dev/full`) with one sentence and exit 1; never a panic
/// (exit 101). `lease acquire` whose output is lost gives the lease back.
#[test]
fn unwritable_stdout_is_a_clean_exit_not_a_panic() {
    let (dir, store) = scratch();
    let seed = with_stdout(
        dir.path(),
        &store,
        &["lease", "acquire", "seed", "--json"],
        Stdio::piped(),
    );
    assert_eq!(code(&seed), 0, "{}", describe(&seed));
    let seed: serde_json::Value = serde_json::from_slice(&seed.stdout).expect("JSON");
    let owner = seed["owner_id"].as_str().unwrap().to_string();
    let token = seed["token"].to_string();
    let put = [
        "put",
        "k",
        "--resource",
        "seed",
        "--owner-id",
        &owner,
        "--token",
        &token,
        "--value",
        "v",
    ];
    let ok = with_stdout(dir.path(), &store, &put, Stdio::null());
    assert_eq!(code(&ok), 0, "{}", describe(&ok));
    let config = dir.path().join("jobs.toml");
    std::fs::write(
        &config,
        "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let config = config.to_string_lossy().into_owned();
    let commands: Vec<Vec<&str>> = vec![
        vec!["lease", "list"],
        vec!["lease", "list", "--json"],
        vec!["stale"],
        vec!["stale", "--json"],
        vec!["lease", "acquire", "printed"],
        vec!["lease", "acquire", "printed-json", "--json"],
        vec!["check", "--config", &config],
        vec!["get", "k", "--resource", "seed"],
        vec!["get", "k", "--resource", "seed", "--json"],
        put.to_vec(),
    ];
    for args in &commands {
        let out = with_stdout(dir.path(), &store, args, closed_pipe());
        assert_eq!(
            code(&out),
            0,
            "{args:?} into a closed pipe: {}",
            describe(&out)
        );
        assert!(
            stderr(&out).is_empty(),
            "{args:?} into a closed pipe is quiet: {}",
            describe(&out)
        );

        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let out = with_stdout(dir.path(), &store, args, Stdio::from(full));
        assert_eq!(
            code(&out),
            EXIT_RUNTIME,
            "{args:?} > /dev/full: {}",
            describe(&out)
        );
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{args:?}: one sentence: {err}");
        assert!(
            err.contains("cannot write the output to stdout") && err.contains("No space left"),
            "{args:?}: {err}"
        );
    }
    // Stderr a closed pipe: a logged event (a forged write's
    // `stale_write_rejected`) and the error sentence are dropped, and the
    // exit code is still the documented one.
    let mut forged = fencecron(dir.path());
    forged
        .args(["--store", &store, "put", "k", "--resource", "seed"])
        .args(["--owner-id", &owner, "--token", "99", "--value", "v"])
        .stdout(Stdio::null())
        .stderr(closed_pipe());
    let status = forged.status().expect("run fencecron");
    assert_eq!(
        status.code(),
        Some(3),
        "forged put with stderr closed: {status:?}"
    );

    // The leases whose owner id and token nobody could read were given back.
    let out = with_stdout(
        dir.path(),
        &store,
        &["lease", "list", "--json"],
        Stdio::piped(),
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for row in rows.as_array().unwrap() {
        let held = row["held"].as_bool().unwrap();
        assert_eq!(held, row["resource"] == "seed", "{row}");
    }
}

// ----------------------------------------------- item 6: config limits

/// A valid config padded with comment lines to exactly `len` bytes.
fn padded_config(len: usize) -> String {
    let mut text =
        String::from("[[job]]\nname = \"a\"\nschedule = \"0 0 1 1 *\"\ncommand = [\"true\"]\n");
    let line = format!("# {}\n", "x".repeat(97));
    while text.len() + line.len() <= len {
        text.push_str(&line);
    }
    text.push_str(&"#".repeat(len - text.len() - 1));
    text.push('\n');
    assert_eq!(text.len(), len);
    text
}

/// A config file above the limit (8 MiB) is refused by name, by `check`, by
/// the other commands that load it and by `run`; one exactly at it is fine. The
/// file is never read whole (a FIFO or `/dev/zero` would never end).
#[test]
fn config_larger_than_the_limit_is_refused_everywhere_it_is_loaded() {
    let (dir, store) = scratch();
    let limit = fencecron::config::MAX_CONFIG_BYTES as usize;
    let at_limit = dir.path().join("at-limit.toml");
    std::fs::write(&at_limit, padded_config(limit)).unwrap();
    let over = dir.path().join("over.toml");
    std::fs::write(&over, padded_config(limit + 1)).unwrap();

    let mut check = fencecron(dir.path());
    check.args(["check", "--config"]).arg(&at_limit);
    let out = run(check, None);
    assert_eq!(code(&out), 0, "{}", describe(&out));

    let over_s = over.display().to_string();
    for args in [
        vec!["check"],
        vec!["lease", "list"],
        vec!["stale", "--store", &store],
        vec!["run"],
    ] {
        let mut cmd = fencecron(dir.path());
        cmd.args(&args).arg("--config").arg(&over);
        let out = run(cmd, None);
        assert_eq!(code(&out), EXIT_USAGE, "{args:?}: {}", describe(&out));
        let err = stderr(&out);
        assert!(
            err.starts_with(&format!("fencecron: {over_s}: "))
                && err.contains(&format!("{limit} bytes")),
            "{args:?}: the error names the file and the limit: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}

/// SIGHUP with a config grown past the limit: `config_invalid` names the
/// file and the limit, and the daemon goes on with its old jobs.
#[test]
fn reload_of_an_oversized_config_keeps_the_old_one() {
    use common::daemon::{ev, secs, str_field, Daemon, DaemonOpts};
    let (dir, store) = scratch();
    let config = dir.path().join("jobs.toml");
    std::fs::write(&config, padded_config(200)).unwrap();
    let mut d = Daemon::spawn(DaemonOpts::new("hup", &config, &store));
    d.expect("daemon_started", ev("daemon_started"), secs(30));
    std::fs::write(
        &config,
        padded_config(fencecron::config::MAX_CONFIG_BYTES as usize + 1),
    )
    .unwrap();
    let cut = d.len();
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let (_, invalid) = d.expect_from(cut, "config_invalid", ev("config_invalid"), secs(30));
    let error = str_field(&invalid, "error").unwrap_or("");
    assert!(
        error.contains(&config.display().to_string())
            && error.contains(&format!("{} bytes", fencecron::config::MAX_CONFIG_BYTES)),
        "{invalid}"
    );
    assert!(d.is_running());
    d.stop(secs(30));
}

/// A NUL byte (`\u0000` in TOML) in anything that reaches the OS as a
/// C string is refused by `check` with the file, line and key.
#[test]
fn nul_bytes_in_paths_args_env_and_urls_are_refused_with_file_line_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let job = "[[job]]\nname = \"a\"\nschedule = \"0 0 1 1 *\"\n";
    let cases = [
        (
            format!("{job}command = [\"true\"]\nworkdir = \"/tmp\\u0000x\"\n"),
            5,
            "job `a`.workdir",
        ),
        (
            format!("{job}command = [\"true\", \"a\\u0000b\"]\n"),
            4,
            "job `a`.command",
        ),
        (
            format!("{job}command = [\"true\"]\nenv = {{ \"K\\u0000\" = \"v\" }}\n"),
            5,
            "job `a`.env.\"K\\0\"",
        ),
        (
            format!("{job}command = [\"true\"]\nenv = {{ K = \"v\\u0000\" }}\n"),
            5,
            "job `a`.env.K",
        ),
        (
            format!("{job}command = [\"true\"]\nenv = {{ \"K=V\" = \"v\" }}\n"),
            5,
            "job `a`.env.K=V",
        ),
        (
            format!("[store]\nurl = \"sqlite:///tmp/x\\u0000.db\"\n{job}command = [\"true\"]\n"),
            2,
            "store.url",
        ),
        (
            format!("[store]\nurl_env = \"A\\u0000B\"\n{job}command = [\"true\"]\n"),
            2,
            "store.url_env",
        ),
        (
            format!("[store]\nurl_env = \"A=B\"\n{job}command = [\"true\"]\n"),
            2,
            "store.url_env",
        ),
    ];
    for (text, line, key) in cases {
        let config = dir.path().join("jobs.toml");
        std::fs::write(&config, &text).unwrap();
        let mut cmd = fencecron(dir.path());
        cmd.args(["check", "--config"]).arg(&config);
        let out = run(cmd, None);
        assert_eq!(code(&out), EXIT_USAGE, "{text}: {}", describe(&out));
        let err = stderr(&out);
        let want = format!("fencecron: {}:{line}:", config.display());
        assert!(
            err.starts_with(&want) && err.contains(&format!(": {key}: ")),
            "{text:?}: want {want}…{key}: {err}"
        );
    }
}

// --------------------------------------------- item 6: URL redaction

/// A password in a URL's query string, in any case or spelling, never
/// reaches stdout or stderr: not in `check`'s summary, not in the error of
/// an unreachable store. PostgreSQL, whose driver reads only `password=`,
/// refuses the other spellings instead of ignoring them.
#[test]
fn query_string_passwords_are_redacted_in_every_spelling() {
    let dir = tempfile::tempdir().expect("temp dir");
    for key in [
        "PASSWORD",
        "Password",
        "password",
        "pwd",
        "pass",
        "sslpassword",
    ] {
        // An ssl-mode the driver rejects: the command fails at once, with
        // the URL in its message.
        let url = format!("mysql://root@127.0.0.1:1/test?{key}=hunter2&ssl-mode=bogus");
        let config = dir.path().join("jobs.toml");
        std::fs::write(
            &config,
            format!(
                "[store]\nurl = \"{url}\"\n[[job]]\nname = \"a\"\nschedule = \"0 0 1 1 *\"\ncommand = [\"true\"]\n"
            ),
        )
        .unwrap();
        let mut check = fencecron(dir.path());
        check.args(["check", "--config"]).arg(&config);
        let out = run(check, None);
        assert_eq!(code(&out), 0, "{}", describe(&out));
        assert!(
            !describe(&out).contains("hunter2") && stdout(&out).contains(&format!("{key}=***")),
            "{}",
            describe(&out)
        );

        let mut list = fencecron(dir.path());
        list.args(["lease", "list", "--store", &url]);
        let out = run(list, None);
        assert_eq!(code(&out), EXIT_RUNTIME, "{}", describe(&out));
        assert!(
            !describe(&out).contains("hunter2") && stderr(&out).contains(&format!("{key}=***")),
            "{}",
            describe(&out)
        );

        let pg = format!("postgres://postgres@127.0.0.1:1/test?{key}=hunter2&sslmode=bogus");
        let mut list = fencecron(dir.path());
        list.args(["lease", "list", "--store", &pg]);
        let out = run(list, None);
        assert!(!describe(&out).contains("hunter2"), "{}", describe(&out));
        if key == "password" {
            assert_eq!(code(&out), EXIT_RUNTIME, "{}", describe(&out));
        } else {
            assert_eq!(code(&out), EXIT_USAGE, "{}", describe(&out));
            assert!(
                stderr(&out).contains(&format!("`{key}`")),
                "{}",
                describe(&out)
            );
        }
    }
}

// ------------------------------------------- item 6: value size limits

const MAX_VALUE: usize = fencecron::fence::MAX_VALUE_BYTES;

/// `put` refuses a value above 8 MiB from a file or stdin before touching
/// the store (exit 2, naming the source and the limit), and a value of
/// exactly 8 MiB is stored and read back on every backend.
#[test]
fn put_refuses_values_above_the_limit_and_takes_one_at_it_everywhere() {
    for backend in [Backend::Sqlite, Backend::Postgres, Backend::MySql] {
        let Some(ts) = TestStore::new(backend, "put_value_limit") else {
            continue;
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let resource = unique("value-limit");
        let lease = with_stdout(
            dir.path(),
            &ts.url,
            &["lease", "acquire", &resource, "--json"],
            Stdio::piped(),
        );
        assert_eq!(code(&lease), 0, "{}", describe(&lease));
        let lease: serde_json::Value = serde_json::from_slice(&lease.stdout).expect("JSON");
        let owner = lease["owner_id"].as_str().unwrap().to_string();
        let token = lease["token"].to_string();
        let put = |source: &[&str], stdin: Option<&[u8]>| {
            let mut cmd = fencecron(dir.path());
            cmd.args(["--store", &ts.url, "put", "k", "--resource", &resource])
                .args(["--owner-id", &owner, "--token", &token])
                .args(source);
            run(cmd, stdin)
        };

        let over = dir.path().join("over.bin");
        std::fs::write(&over, vec![7u8; MAX_VALUE + 1]).unwrap();
        let out = put(&["--file", over.to_str().unwrap()], None);
        assert_eq!(code(&out), EXIT_USAGE, "{backend:?}: {}", describe(&out));
        let err = stderr(&out);
        assert!(
            err.contains("8388608 bytes") && err.contains(over.to_str().unwrap()),
            "{err}"
        );
        let out = put(&[], Some(&vec![7u8; MAX_VALUE + 1]));
        assert_eq!(code(&out), EXIT_USAGE, "{backend:?}: {}", describe(&out));
        assert!(stderr(&out).contains("from stdin"), "{}", describe(&out));

        let at = dir.path().join("at.bin");
        let value: Vec<u8> = (0..MAX_VALUE).map(|i| (i % 251) as u8).collect();
        std::fs::write(&at, &value).unwrap();
        let out = put(&["--file", at.to_str().unwrap()], None);
        assert_eq!(code(&out), 0, "{backend:?}: {}", describe(&out));
        let mut get = fencecron(dir.path());
        get.args(["--store", &ts.url, "get", "k", "--resource", &resource]);
        let out = run(get, None);
        assert_eq!(code(&out), 0, "{backend:?}: {}", describe(&out));
        assert!(
            out.stdout == value,
            "{backend:?}: the 8 MiB value round-trips"
        );
    }
}

/// A value too large for the MySQL server's `max_allowed_packet` is named
/// as such, with the size and the server's setting, both when the server
/// answers error 1153 (just over) and when it drops the connection while the
/// value is still being sent (far over); and the store keeps working.
#[tokio::test]
async fn mysql_value_over_max_allowed_packet_names_the_setting() {
    use fencecron::names::Name;
    use fencecron::store::{AcquireOutcome, AcquireRequest, PutRequest, StoreError};
    let Some(ts) = TestStore::new(Backend::MySql, "mysql_max_allowed_packet") else {
        return;
    };
    let store = common::harness::open_store(&ts, 2).await;
    let max: u64 = {
        use sqlx::Connection;
        let mut c = sqlx::MySqlConnection::connect(&ts.url).await.unwrap();
        let max: i64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS SIGNED)")
            .fetch_one(&mut c)
            .await
            .unwrap();
        max as u64
    };
    if max > 256 << 20 {
        skipped!("\n*** SKIPPED mysql_value_over_max_allowed_packet_names_the_setting: max_allowed_packet is {max} bytes, too large to exceed in a test ***\n");
        return;
    }
    let resource = Name::parse("resource", &unique("packet")).unwrap();
    let key = Name::parse("key", "k").unwrap();
    let AcquireOutcome::Acquired(lease) = store
        .acquire(&AcquireRequest {
            resource: &resource,
            lease: std::time::Duration::from_secs(30),
            node: "test",
            occurrence: None,
            next_occurrence: None,
            owner_id: fencecron::store::OwnerId::fresh(),
            run: None,
        })
        .await
        .unwrap()
    else {
        panic!("acquire");
    };
    let owner = lease.owner_id;
    for size in [max as usize + 1024, 3 * max as usize] {
        let value = vec![1u8; size];
        let err = store
            .put(&PutRequest {
                resource: &resource,
                key: &key,
                value: &value,
                token: lease.token,
                owner_id: owner,
                once: false,
                node: "test",
                job: None,
                stage: fencecron::domain::Stage::Label("test".into()),
                operation_id: uuid::Uuid::new_v4(),
            })
            .await
            .expect_err("a value over max_allowed_packet is refused");
        assert!(
            matches!(&err, StoreError::PacketTooLarge { size: s, max: Some(m), .. } if *s == size && *m == max),
            "{size} bytes: {err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("max_allowed_packet") && msg.contains(&size.to_string()),
            "{msg}"
        );
    }
    let ok = store
        .put(&PutRequest {
            resource: &resource,
            key: &key,
            value: b"small",
            token: lease.token,
            owner_id: owner,
            once: false,
            node: "test",
            job: None,
            stage: fencecron::domain::Stage::Label("test".into()),
            operation_id: uuid::Uuid::new_v4(),
        })
        .await;
    assert!(ok.is_ok(), "the store works after the refusal: {ok:?}");
}

// ------------------------------------- item 6: SQLite files of others

/// `fencecron ARGS --store sqlite://DB` in `dir`, with a time limit.
fn sqlite_cmd(dir: &Path, db: &Path, args: &[&str]) -> Output {
    let mut cmd = fencecron(dir);
    cmd.args(args)
        .arg("--store")
        .arg(format!("sqlite://{}", db.display()));
    common::harness::run(&mut cmd, None)
}

/// The bytes and modification time of a file, to show it was not touched.
fn snapshot(p: &Path) -> (Vec<u8>, std::time::SystemTime) {
    (
        std::fs::read(p).unwrap(),
        std::fs::metadata(p).unwrap().modified().unwrap(),
    )
}

/// A SQLite store that another user could rewrite is refused, before
/// anything is written to it: a database, `-wal` or migration lock file
/// owned by another user (made with chown, so this part needs root and says
/// SKIPPED otherwise), one writable by group or others, and a database in a
/// world-writable directory (the issue's case: pre-created there by
/// `nobody`). The daemon refuses at start. A private store still works.
#[test]
fn sqlite_files_another_user_could_rewrite_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let root = nix::unistd::geteuid().is_root();
    let nobody = nix::unistd::User::from_name("nobody").ok().flatten();

    let refused = |dir: &Path, db: &Path, culprit: &Path, why: &str| {
        let files: Vec<&Path> = [db, culprit].into_iter().filter(|p| p.is_file()).collect();
        let before: Vec<_> = files.iter().map(|p| snapshot(p)).collect();
        for args in [&["lease", "list"][..], &["lease", "acquire", "r"]] {
            let out = sqlite_cmd(dir, db, args);
            assert_eq!(code(&out), EXIT_RUNTIME, "{args:?}: {}", describe(&out));
            let err = stderr(&out);
            assert!(
                err.contains(&culprit.display().to_string()) && err.contains(why),
                "{args:?}: the error names {} and why ({why}): {err}",
                culprit.display()
            );
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        let after: Vec<_> = files.iter().map(|p| snapshot(p)).collect();
        assert!(before == after, "{files:?} untouched");
    };
    // A store made by fencecron itself, then tampered with.
    let fresh = || {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("fencecron.db");
        let out = sqlite_cmd(dir.path(), &db, &["lease", "acquire", "r"]);
        assert_eq!(code(&out), 0, "{}", describe(&out));
        (dir, db)
    };
    let with_suffix = |db: &Path, s: &str| {
        let mut p = db.as_os_str().to_os_string();
        p.push(s);
        std::path::PathBuf::from(p)
    };

    // Group- or world-writable files.
    for (suffix, mode) in [("", 0o666), ("", 0o620), ("-wal", 0o666), ("-shm", 0o606)] {
        let (dir, db) = fresh();
        let f = with_suffix(&db, suffix);
        if !f.exists() {
            std::fs::write(&f, b"").unwrap();
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        refused(dir.path(), &db, &f, "writable by other users");
    }

    // A world-writable (sticky) directory: refused even for a database
    // this user made, since others can plant its -wal there.
    let (dir, db) = fresh();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    refused(dir.path(), &db, dir.path(), "writable by other users");

    match (root, &nobody) {
        (true, Some(nobody)) => {
            let theirs = |p: &Path| {
                std::os::unix::fs::chown(p, Some(nobody.uid.as_raw()), Some(nobody.gid.as_raw()))
                    .unwrap()
            };
            for suffix in ["", "-wal", ".migrate-lock"] {
                let (dir, db) = fresh();
                let f = with_suffix(&db, suffix);
                if !f.exists() {
                    std::fs::write(&f, b"").unwrap();
                }
                theirs(&f);
                refused(dir.path(), &db, &f, "is owned by nobody");
            }

            // The issue's case: `nobody` pre-created the database, mode
            // 0600, in a world-writable directory; and the daemon.
            let dir = tempfile::tempdir().expect("temp dir");
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
                .unwrap();
            let db = dir.path().join("fencecron.db");
            std::fs::write(&db, b"").unwrap();
            theirs(&db);
            refused(dir.path(), &db, dir.path(), "writable by other users");
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
            refused(dir.path(), &db, &db, "is owned by nobody");
            let config = dir.path().join("jobs.toml");
            std::fs::write(&config, padded_config(100)).unwrap();
            let config = config.display().to_string();
            let out = sqlite_cmd(dir.path(), &db, &["run", "--config", &config]);
            assert_eq!(code(&out), EXIT_RUNTIME, "{}", describe(&out));
            assert!(stderr(&out).contains("is owned by nobody"), "{}", describe(&out));
        }
        _ => skipped!(
            "\n*** SKIPPED the other-owner part of sqlite_files_another_user_could_rewrite_are_refused: \
             it needs root (to chown a file to `nobody`) and a `nobody` user ***\n"
        ),
    }

    // A private store works.
    let (dir, db) = fresh();
    let out = sqlite_cmd(dir.path(), &db, &["lease", "list"]);
    assert_eq!(code(&out), 0, "{}", describe(&out));
}

// ------------------------------------------------ item 7: the unit

/// The unit file of the repository.
fn unit_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/fencecron.service")
}

/// Whether a tool is on PATH; prints a visible SKIPPED line when not.
fn have(tool: &str, test: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        skipped!("\n*** SKIPPED {test}: `{tool}` is not installed ***\n");
    }
    found
}

/// `systemd-analyze security` rates the unit at most 2.0 and `systemd-analyze
/// verify` finds nothing to say about it (with ExecStart= pointed at the
/// binary under test, since the unit names its installed path).
#[test]
fn systemd_unit_exposure_is_at_most_2_0_and_verify_is_clean() {
    let test = "systemd_unit_exposure_is_at_most_2_0_and_verify_is_clean";
    if !have("systemd-analyze", test) {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let unit = dir.path().join("fencecron.service");
    let text = std::fs::read_to_string(unit_path()).expect("read the unit");
    std::fs::write(
        &unit,
        text.replace(
            "/usr/local/bin/fencecron",
            &common::bin().display().to_string(),
        ),
    )
    .unwrap();

    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("systemd-analyze verify");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "systemd-analyze verify: {}",
        describe(&out)
    );

    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&unit)
        .output()
        .expect("systemd-analyze security");
    let text = stdout(&out);
    let exposure: f64 = text
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for fencecron.service: "))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in: {}", describe(&out)));
    eprintln!("systemd-analyze security: fencecron.service exposure {exposure}");
    assert!(
        exposure <= 2.0,
        "the unit's exposure is {exposure}, above 2.0:\n{text}"
    );
}

/// The system calls the unit's `SystemCallFilter=` lines allow, expanded
/// with `systemd-analyze syscall-filter`: the first line is the allow list,
/// later `~` lines take calls out of it, later plain lines add some back.
fn unit_allowed_syscalls(unit: &str) -> std::collections::BTreeSet<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let listing = Command::new("systemd-analyze")
        .arg("syscall-filter")
        .output()
        .expect("systemd-analyze syscall-filter");
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = None;
    for line in stdout(&listing).lines() {
        let t = line.trim();
        if line.starts_with('@') {
            current = Some(t.to_string());
            groups.insert(t.to_string(), Vec::new());
        } else if let Some(g) = &current {
            if !t.is_empty() && !t.starts_with('#') {
                groups.get_mut(g).unwrap().push(t.to_string());
            }
        }
    }
    fn expand(name: &str, groups: &BTreeMap<String, Vec<String>>, out: &mut BTreeSet<String>) {
        match groups.get(name) {
            Some(members) => {
                for m in members {
                    expand(m, groups, out);
                }
            }
            None if !name.starts_with('@') => {
                out.insert(name.to_string());
            }
            None => panic!("unknown syscall group {name}"),
        }
    }
    let mut allowed = BTreeSet::new();
    let mut first = true;
    for line in unit.lines() {
        let Some(value) = line.trim().strip_prefix("SystemCallFilter=") else {
            continue;
        };
        let (deny, names) = match value.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, value),
        };
        assert!(
            !(first && deny),
            "the unit's first SystemCallFilter= is an allow list"
        );
        first = false;
        let mut set = BTreeSet::new();
        for n in names.split_whitespace() {
            expand(n, &groups, &mut set);
        }
        if deny {
            allowed.retain(|s| !set.contains(s));
        } else {
            allowed.extend(set);
        }
    }
    assert!(!allowed.is_empty(), "the unit has a SystemCallFilter=");
    allowed
}

/// The daemon running `jobs.example.toml` (schedules sped up) makes, with
/// all its jobs and their `fencecron put`, only system calls the unit's
/// `SystemCallFilter=` allows: traced with `strace -f`, as an unprivileged
/// user like the unit's (as root, SQLite would also fchown its -wal to the
/// database's owner, which the unit's user never does). All three example
/// jobs must finish with exit 0.
#[test]
fn unit_syscall_filter_allows_the_daemon_and_the_example_jobs() {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let test = "unit_syscall_filter_allows_the_daemon_and_the_example_jobs";
    if !have("systemd-analyze", test) || !have("strace", test) {
        return;
    }
    let allowed = unit_allowed_syscalls(&std::fs::read_to_string(unit_path()).unwrap());
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let example =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("jobs.example.toml"))
            .unwrap();
    let config = example
        .replace("\"*/10 * * * * *\"", "\"*/2 * * * * *\"")
        .replace("schedule = \"0 * * * * *\"", "schedule = \"*/2 * * * * *\"")
        .replace(
            "schedule = \"0 */5 * * * *\"",
            "schedule = \"*/2 * * * * *\"",
        )
        .replace(
            "workdir = \"/tmp\"",
            &format!("workdir = \"{}\"", d.display()),
        )
        .replace(
            "/tmp/fencecron-reports",
            &d.join("reports").display().to_string(),
        );
    assert_eq!(config.matches("*/2 * * * * *").count(), 3, "{config}");
    std::fs::write(d.join("jobs.toml"), config).unwrap();

    // The daemon runs as `nobody` when the test runs as root, so its binary
    // must be reachable by that user wherever the checkout is (a checkout
    // in a private `mktemp -d` is not): a copy in the test's own directory,
    // with the run watchdog beside it as installed.
    let bin = d.join("bin");
    std::fs::create_dir(&bin).unwrap();
    for name in ["fencecron", "fencecron-shim"] {
        std::fs::copy(common::bin().with_file_name(name), bin.join(name)).unwrap();
    }
    let trace = d.join("trace.txt");
    let mut cmd = clean(Command::new("strace"), d);
    cmd.args(["-f", "-qq", "-o"])
        .arg(&trace)
        .arg(bin.join("fencecron"))
        .args(["run", "--config", "jobs.toml", "--log-format", "json"])
        .env("STATE_DIRECTORY", d)
        .env("RUNTIME_DIRECTORY", d)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    if nix::unistd::geteuid().is_root() {
        let Some(nobody) = nix::unistd::User::from_name("nobody").ok().flatten() else {
            skipped!("\n*** SKIPPED {test}: running as root and there is no `nobody` user ***\n");
            return;
        };
        for entry in walk(d) {
            std::os::unix::fs::chown(&entry, Some(nobody.uid.as_raw()), Some(nobody.gid.as_raw()))
                .unwrap();
        }
        cmd.uid(nobody.uid.as_raw()).gid(nobody.gid.as_raw());
    }
    let mut child = cmd.spawn().expect("spawn strace");
    let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
    let log = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut finished = std::collections::BTreeMap::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let mut lines = Vec::new();
    for line in log.lines() {
        let line = line.unwrap_or_default();
        lines.push(line.clone());
        if let Ok(e) = serde_json::from_str::<serde_json::Value>(&line) {
            if e["event"] == "job_finished" {
                finished.insert(e["job"].as_str().unwrap_or("").to_string(), e.clone());
            }
        }
        if finished.len() == 3 || std::time::Instant::now() > deadline {
            break;
        }
    }
    let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGTERM);
    let _ = child.wait();
    assert_eq!(
        finished.keys().collect::<Vec<_>>(),
        ["counter", "heartbeat", "report"],
        "every example job ran under strace:\n{}",
        lines.join("\n")
    );
    for (job, e) in &finished {
        assert_eq!(e["exit_code"], 0, "{job}: {e}");
    }
    let trace = std::fs::read_to_string(&trace).expect("strace output");
    let mut used = std::collections::BTreeSet::new();
    for line in trace.lines() {
        // "PID name(args) = r", "PID <... name resumed>…"
        let rest = line.split_once(' ').map_or("", |(_, r)| r.trim_start());
        let rest = rest.strip_prefix("<... ").unwrap_or(rest);
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && rest[name.len()..].starts_with(['(', ' ']) {
            used.insert(name);
        }
    }
    let denied: Vec<&String> = used.iter().filter(|s| !allowed.contains(*s)).collect();
    eprintln!("{} system calls used: {used:?}", used.len());
    assert!(
        denied.is_empty(),
        "the unit's SystemCallFilter= would refuse {denied:?}, which the daemon or an example job uses"
    );
}

/// `dir` and everything below it.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                all.extend(walk(&p));
            } else {
                all.push(p);
            }
        }
    }
    all
}

/// journald's native socket, where `tracing-journald` sends entries.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// With stderr connected to the journal (`JOURNAL_STREAM` names it) and no
/// log format asked for, the daemon sends native journal entries: every
/// event field a journal field, WARN as priority 4, INFO as 5. The test
/// plays journald on its socket; where a real journald owns it (or the
/// socket cannot be made), it says SKIPPED.
#[test]
fn journald_gets_native_entries_with_fields_and_priorities_sqlite() {
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixDatagram;

    let path = Path::new(JOURNAL_SOCKET);
    let stale = UnixDatagram::unbound()
        .and_then(|s| s.connect(path))
        .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
    if stale {
        // Left by an earlier run of this test that was killed: nobody reads it.
        let _ = std::fs::remove_file(path);
    }
    if path.exists() {
        skipped!(
            "\n*** SKIPPED journald test: {JOURNAL_SOCKET} exists (a real journald owns it) ***\n"
        );
        return;
    }
    let made_dir = !path.parent().unwrap().exists();
    let sock = match std::fs::create_dir_all(path.parent().unwrap())
        .and_then(|()| UnixDatagram::bind(path))
    {
        Ok(s) => s,
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "cannot play journald at {JOURNAL_SOCKET}: {e} (run as root)"
            );
            skipped!("\n*** SKIPPED journald test: cannot bind {JOURNAL_SOCKET}: {e} ***\n");
            return;
        }
    };
    struct Cleanup(bool);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(JOURNAL_SOCKET);
            if self.0 {
                let _ = std::fs::remove_dir(Path::new(JOURNAL_SOCKET).parent().unwrap());
            }
        }
    }
    let _cleanup = Cleanup(made_dir);
    sock.set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();

    let store = TestStore::new(Backend::Sqlite, "journald").expect("sqlite");
    let dir = tempfile::tempdir().unwrap();
    let ok = unique("jok");
    let bad = unique("jbad");
    let config = dir.path().join("jobs.toml");
    std::fs::write(
        &config,
        format!(
            "[[job]]\nname = \"{ok}\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n\
             [[job]]\nname = \"{bad}\"\nschedule = \"* * * * * *\"\ncommand = [\"false\"]\n"
        ),
    )
    .unwrap();
    // stderr is a pipe the test made, so it knows its device and inode.
    let (_read, write) = nix::unistd::pipe().unwrap();
    let st = nix::sys::stat::fstat(write.as_raw_fd()).unwrap();
    /// Kills the daemon should the test fail half-way.
    struct Killed(std::process::Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = clean(Command::new(common::bin()), dir.path())
        .args(["run", "--node-id", "journal", "--config"])
        .arg(&config)
        .arg("--store")
        .arg(&store.url)
        .env("JOURNAL_STREAM", format!("{}:{}", st.st_dev, st.st_ino))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(write))
        .spawn()
        .map(Killed)
        .unwrap();

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut entries: Vec<String> = Vec::new();
    let mut buf = vec![0u8; 65536];
    let has = |entries: &[String], event: &str, job: &str| {
        entries.iter().any(|e| {
            e.lines().any(|l| l == format!("F_EVENT={event}"))
                && e.lines().any(|l| l == format!("F_JOB={job}"))
        })
    };
    // journald's native protocol: `KEY=value\n`, or `KEY\n`, a 64-bit
    // little-endian length, the value and `\n`; read as `KEY=value` lines.
    let fields = |mut d: &[u8]| -> String {
        let mut out = String::new();
        while let Some(nl) = d.iter().position(|b| *b == b'\n') {
            let line = &d[..nl];
            if let Some(eq) = line.iter().position(|b| *b == b'=') {
                out += &format!(
                    "{}={}\n",
                    String::from_utf8_lossy(&line[..eq]),
                    String::from_utf8_lossy(&line[eq + 1..])
                );
                d = &d[nl + 1..];
            } else {
                let rest = &d[nl + 1..];
                let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
                out += &format!(
                    "{}={}\n",
                    String::from_utf8_lossy(line),
                    String::from_utf8_lossy(&rest[8..8 + len])
                );
                d = &rest[8 + len + 1..];
            }
        }
        out
    };
    while !(has(&entries, "job_finished", &ok) && has(&entries, "job_failed", &bad)) {
        assert!(
            std::time::Instant::now() < deadline,
            "no job_finished/job_failed entries in 60 s: {entries:?}"
        );
        if let Ok(n) = sock.recv(&mut buf) {
            entries.push(fields(&buf[..n]));
        }
    }
    // Stop it, reading on: a journal that stops reading blocks its writers.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    while child.0.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline + std::time::Duration::from_secs(30),
            "the daemon did not stop after SIGTERM"
        );
        if let Ok(n) = sock.recv(&mut buf) {
            entries.push(fields(&buf[..n]));
        }
    }

    let entry = |event: &str, job: &str| -> &String {
        entries
            .iter()
            .find(|e| {
                e.lines().any(|l| l == format!("F_EVENT={event}"))
                    && e.lines().any(|l| l == format!("F_JOB={job}"))
            })
            .unwrap()
    };
    let finished = entry("job_finished", &ok);
    assert!(finished.lines().any(|l| l == "PRIORITY=5"), "{finished}");
    assert!(
        finished.lines().any(|l| l == "F_OUTCOME=succeeded"),
        "{finished}"
    );
    assert!(
        finished.lines().any(|l| l == "SYSLOG_IDENTIFIER=fencecron"),
        "{finished}"
    );
    let failed = entry("job_failed", &bad);
    assert!(failed.lines().any(|l| l == "PRIORITY=4"), "{failed}");
    assert!(failed.lines().any(|l| l == "F_EXIT_CODE=1"), "{failed}");
}

/// The Prometheus alerting rules shipped in `deploy/prometheus` are valid
/// and fire as their unit tests say (`promtool check rules`, `promtool test
/// rules`), and every metric they use is one the daemon exports. Says
/// SKIPPED without promtool (CI installs it).
#[test]
fn prometheus_rules_check_and_their_unit_tests_pass() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus");
    let Ok(check) = Command::new("promtool")
        .args(["check", "rules", "fencecron.rules.yml"])
        .current_dir(&dir)
        .output()
    else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool is not installed (.ci/run installs the prometheus package)"
        );
        skipped!("\n*** SKIPPED prometheus rules test: promtool is not installed ***\n");
        return;
    };
    assert!(check.status.success(), "{}", describe(&check));
    let test = Command::new("promtool")
        .args(["test", "rules", "fencecron.rules.test.yml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(test.status.success(), "{}", describe(&test));

    let rules = std::fs::read_to_string(dir.join("fencecron.rules.yml")).unwrap();
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/metrics.md"))
            .unwrap();
    for metric in rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("fencecron_"))
    {
        let base = ["_total", "_count", "_sum", "_bucket"]
            .iter()
            .fold(metric, |m, s| m.strip_suffix(s).unwrap_or(m));
        assert!(
            readme.contains(&format!("`{base}")),
            "the rules use {metric}, which the metrics table of docs/metrics.md does not list"
        );
    }
}

/// Every PromQL query of `expr` keys anywhere under `v`.
fn dashboard_queries(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => dashboard_queries(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| dashboard_queries(v, out)),
        _ => {}
    }
}

/// The Grafana dashboard `deploy/grafana/fencecron.json` is JSON whose
/// every query parses as PromQL (each, with Grafana's variables filled in,
/// checked by `promtool check rules` as a recording rule) and names only
/// metrics the daemon exports (the table of docs/metrics.md). Says SKIPPED
/// without promtool (CI installs it).
#[test]
fn grafana_dashboard_queries_parse_and_name_exported_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("deploy/grafana/fencecron.json")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut queries = Vec::new();
    dashboard_queries(&dashboard, &mut queries);
    assert!(queries.len() >= 10, "{queries:?}");

    let readme = std::fs::read_to_string(root.join("docs/metrics.md")).unwrap();
    let mut named = 0;
    for metric in text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("fencecron_"))
    {
        let base = ["_total", "_count", "_sum", "_bucket"]
            .iter()
            .fold(metric, |m, s| m.strip_suffix(s).unwrap_or(m));
        assert!(
            readme.contains(&format!("`{base}")),
            "the dashboard uses {metric}, which the metrics table of docs/metrics.md does not list"
        );
        named += 1;
    }
    assert!(named >= queries.len(), "every query names a metric");

    let dir = tempfile::tempdir().unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in queries.iter().enumerate() {
        let q = q
            .replace("$__rate_interval", "5m")
            .replace("$__interval", "1m")
            .replace("$job", ".*");
        assert!(
            !q.contains('$'),
            "a Grafana variable the test does not fill in: {q}"
        );
        rules.push_str(&format!(
            "      - record: fencecron:dashboard_{i}\n        expr: {}\n",
            serde_json::Value::String(q)
        ));
    }
    let file = dir.path().join("dashboard.rules.yml");
    std::fs::write(&file, &rules).unwrap();
    let Ok(check) = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
    else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool is not installed (.ci/run installs the prometheus package)"
        );
        skipped!("\n*** SKIPPED grafana dashboard test: promtool is not installed ***\n");
        return;
    };
    assert!(check.status.success(), "{rules}\n{}", describe(&check));
}

/// `packaging/build-deb.sh` builds a .deb (here from the binaries under
/// test) that holds the binaries, the unit pointing at /usr/bin, the example
/// config as a conffile, completions, man pages (jobs.toml(5) in section 5)
/// and docs, and a postinst that
/// creates the `fencecron` user; the packaged binary checks the packaged
/// config; its binaries are stripped, with their debug information in the
/// dbgsym package under their build ids.
/// Says SKIPPED without dpkg-deb.
#[test]
fn deb_package_holds_what_a_host_needs() {
    if Command::new("dpkg-deb").arg("--version").output().is_err() {
        skipped!("\n*** SKIPPED deb test: dpkg-deb is not installed ***\n");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    let built = Command::new(root.join("packaging/build-deb.sh"))
        .arg(common::bin().parent().unwrap())
        .arg(out.path())
        // Unoptimised binaries are large; gzip -1 packs them in seconds.
        .env("DEB_COMPRESS", "gzip:1")
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", describe(&built));
    let deb = String::from_utf8_lossy(&built.stdout).trim().to_string();

    let contents = Command::new("dpkg-deb")
        .arg("--contents")
        .arg(&deb)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&contents.stdout).to_string();
    for path in [
        "./usr/bin/fencecron",
        "./usr/bin/fencecron-shim",
        "./lib/systemd/system/fencecron.service",
        "./etc/fencecron/jobs.toml",
        "./usr/share/bash-completion/completions/fencecron",
        "./usr/share/zsh/vendor-completions/_fencecron",
        "./usr/share/man/man1/fencecron.1.gz",
        "./usr/share/man/man1/fencecron-run.1.gz",
        "./usr/share/man/man5/jobs.toml.5.gz",
        "./usr/share/fish/vendor_completions.d/fencecron.fish",
        "./usr/share/doc/fencecron/README.md",
        "./usr/share/doc/fencecron/docs/RECIPES.md",
        "./usr/share/doc/fencecron/docs/configuration.md",
        "./usr/share/doc/fencecron/docs/commands.md",
    ] {
        assert!(
            listing.contains(path),
            "{path} not in the package:\n{listing}"
        );
    }
    let info = |field: &str| {
        let o = Command::new("dpkg-deb")
            .args(["--field", &deb, field])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(info("Package"), "fencecron");
    assert_eq!(info("Version"), env!("CARGO_PKG_VERSION"));
    let dbgsym = out.path().join(format!(
        "fencecron-dbgsym_{}_{}.deb",
        env!("CARGO_PKG_VERSION"),
        deb.rsplit('_').next().unwrap().trim_end_matches(".deb")
    ));
    let debug_listing = Command::new("dpkg-deb")
        .arg("--contents")
        .arg(&dbgsym)
        .output()
        .unwrap();
    assert!(
        debug_listing.status.success(),
        "{}",
        describe(&debug_listing)
    );
    let debug_listing = String::from_utf8_lossy(&debug_listing.stdout).to_string();

    let tree = tempfile::tempdir().unwrap();
    let x = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(tree.path())
        .output()
        .unwrap();
    assert!(x.status.success(), "{}", describe(&x));
    let control = tempfile::tempdir().unwrap();
    let e = Command::new("dpkg-deb")
        .arg("-e")
        .arg(&deb)
        .arg(control.path())
        .output()
        .unwrap();
    assert!(e.status.success(), "{}", describe(&e));
    // Stripped binaries; their debug information in the dbgsym package,
    // where gdb finds it by build id.
    let dbg_tree = tempfile::tempdir().unwrap();
    let dx = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&dbgsym)
        .arg(dbg_tree.path())
        .output()
        .unwrap();
    assert!(dx.status.success(), "{}", describe(&dx));
    for b in ["fencecron", "fencecron-shim"] {
        let binary = tree.path().join("usr/bin").join(b);
        let sections = readelf(&["-S", "-W"], &binary);
        assert!(
            !sections.contains(".debug_info"),
            "{b} in the package is not stripped:\n{sections}"
        );
        let notes = readelf(&["-n"], &binary);
        let id = notes
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
            .unwrap_or_else(|| panic!("{b} has no build id:\n{notes}"))
            .trim()
            .to_string();
        let rel = format!("usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]);
        assert!(
            debug_listing.contains(&format!("./{rel}")),
            "{rel} ({b}) not in the dbgsym package:\n{debug_listing}"
        );
        let debug_sections = readelf(&["-S", "-W"], &dbg_tree.path().join(&rel));
        assert!(
            debug_sections.contains(".debug_line") && debug_sections.contains(".debug_info"),
            "{rel} holds no line tables:\n{debug_sections}"
        );
    }
    let conffiles = std::fs::read_to_string(control.path().join("conffiles")).unwrap();
    assert_eq!(conffiles.trim(), "/etc/fencecron/jobs.toml");
    let postinst = std::fs::read_to_string(control.path().join("postinst")).unwrap();
    assert!(postinst.contains("adduser --system --group"), "{postinst}");
    let unit =
        std::fs::read_to_string(tree.path().join("lib/systemd/system/fencecron.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/bin/fencecron run --config /etc/fencecron/jobs.toml"),
        "{unit}"
    );
    assert!(!unit.contains("/usr/local/bin"), "{unit}");
    let check = clean(
        Command::new(tree.path().join("usr/bin/fencecron")),
        tree.path(),
    )
    .arg("check")
    .arg("--config")
    .arg(tree.path().join("etc/fencecron/jobs.toml"))
    .output()
    .unwrap();
    assert!(check.status.success(), "{}", describe(&check));
    // The packaged config runs nothing until edited, and neither it nor
    // `check` leaves unsaid that its SQLite store fences this host only.
    let packaged = std::fs::read_to_string(tree.path().join("etc/fencecron/jobs.toml")).unwrap();
    assert!(
        !packaged.lines().any(|l| l.trim() == "[[job]]"),
        "{packaged}"
    );
    assert!(packaged.contains("THIS HOST ONLY"), "{packaged}");
    assert!(
        String::from_utf8_lossy(&check.stdout).contains("fences the daemons of this host only"),
        "{}",
        describe(&check)
    );
    assert!(
        listing.contains("./usr/share/doc/fencecron/jobs.example.toml"),
        "{listing}"
    );
    // The packaged completions ask the packaged binary for the job names of
    // the config on the command line (here the example the package ships).
    let names = clean(
        Command::new(tree.path().join("usr/bin/fencecron")),
        tree.path(),
    )
    .args(["__complete", "jobs", "--", "fencecron", "--config"])
    .arg(
        tree.path()
            .join("usr/share/doc/fencecron/jobs.example.toml"),
    )
    .arg("trigger")
    .output()
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&names.stdout),
        "heartbeat\ncounter\nreport\n",
        "{}",
        describe(&names)
    );
    let bash = std::fs::read_to_string(
        tree.path()
            .join("usr/share/bash-completion/completions/fencecron"),
    )
    .unwrap();
    assert!(bash.contains("__complete jobs --"), "{bash}");
}

/// `readelf ARGS FILE`'s output (binutils, which the package build needs too).
fn readelf(args: &[&str], file: &Path) -> String {
    let o = Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "readelf {args:?} {}: {}",
        file.display(),
        describe(&o)
    );
    String::from_utf8_lossy(&o.stdout).to_string()
}

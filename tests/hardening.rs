//! Hostile input and a hostile environment, through the real binary:
//! shell-quoted `eval` output, stdout that cannot be written, oversized and
//! NUL-carrying config files, passwords in URL query strings, SQLite files
//! that another user could rewrite, values too large for the store, and the
//! systemd unit's sandbox.

mod common;

use std::path::Path;
use std::process::{Output, Stdio};

use common::harness::{code, describe, fencecron};

const EXIT_RUNTIME: i32 = 1;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A scratch directory and a SQLite store inside it.
fn scratch() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("fencecron.db").display());
    (dir, url)
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

//! A SQLite store whose disk fills up and is freed again, through the real
//! binary: the database lives on a small tmpfs this test mounts (root only;
//! skipped loudly otherwise, a failure under `CI=true`), a daemon runs a job
//! every second, a filler file takes the last free byte, and is deleted.
//!
//! What must hold: the errors name the full disk (not "unreachable"), and
//! once there is room the daemon runs the job again without a restart and
//! stores the stale-owner records it could not store while the disk was
//! full. Before the fix, a connection left inside the failed write
//! transaction went back to the pool and every later call failed with
//! "non-zero transaction depth" until the daemon was restarted.

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::daemon::{
    ev, ev_token, i64_field, is, job_toml, long_cmd, secs, str_field, token_of, write_config,
    Daemon, DaemonOpts,
};
use common::harness::run;
use common::unique;

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `"3m"`) on `dir`, private to this
    /// user (mode 0700, as fencecron wants the database's directory), or
    /// `None` after a loud message when mounting is not permitted. Under
    /// `CI=true` that is a failure instead.
    fn mount(dir: &Path, size: &str, test: &str) -> Option<Tmpfs> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("tmpfs")
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs {
                dir: dir.to_path_buf(),
            }),
            other => {
                let why = match other {
                    Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
                    Err(e) => e.to_string(),
                };
                if std::env::var("CI").as_deref() == Ok("true") {
                    panic!("{test}: cannot mount a tmpfs under CI=true (run as root): {why}");
                }
                skipped!(
                    "\n*** SKIPPED {test}: cannot mount a tmpfs ({why}); run as root to test a full disk ***\n"
                );
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            // Still busy (a process of a failed test): detach it now, the
            // kernel frees it when the last user is gone.
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

/// Writes `path` until the filesystem has no room left (ENOSPC), in large
/// chunks and then in single bytes, so not even a page is free.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).expect("create the filler file");
    let mut total = 0u64;
    for chunk in [64 * 1024, 4096, 1] {
        let buf = vec![0xa5u8; chunk];
        loop {
            match f.write(&buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("writing the filler file: {e}"),
            }
        }
    }
    let _ = f.sync_all();
    total
}

/// `fencecron stale --json` for the last 10 minutes, or `None` while the
/// command fails.
fn stale_records(store: &str, cwd: &Path) -> Option<Vec<Value>> {
    let out = run(
        common::harness::fencecron(cwd)
            .args(["stale", "--json", "--since", "10m", "--store", store]),
        None,
    );
    if !out.status.success() {
        return None;
    }
    match serde_json::from_slice(&out.stdout) {
        Ok(Value::Array(a)) => Some(a),
        other => panic!("stale --json is not an array: {other:?}"),
    }
}

/// The stale records, polled until one matches `pred` or `timeout` passes.
fn wait_for_record(
    store: &str,
    cwd: &Path,
    what: &str,
    pred: impl Fn(&Value) -> bool,
    timeout: Duration,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let records = stale_records(store, cwd);
        if let Some(r) = records.iter().flatten().find(|r| pred(r)) {
            return r.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no {what} record stored within {timeout:?}; records: {records:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn sqlite_disk_full_then_freed_recovers_without_restart() {
    let test = "sqlite_disk_full_then_freed_recovers_without_restart";
    let dir = tempfile::tempdir().expect("temp dir");
    let mnt = dir.path().join("db");
    std::fs::create_dir(&mnt).expect("mount point");
    let Some(_tmpfs) = Tmpfs::mount(&mnt, "3m", test) else {
        return;
    };
    let store = format!("sqlite://{}", mnt.join("fencecron.db").display());
    let job = unique("diskfull");
    // A job every second that runs until it is killed: the full disk hits a
    // renewal (so the lease is lost and its record cannot be stored) and
    // every acquire while it lasts.
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            &job,
            "* * * * * *",
            &long_cmd(dir.path()),
            "lease = \"5s\"",
        )],
    );
    // The daemon is declared after the tmpfs: it is stopped first.
    let d = Daemon::spawn(DaemonOpts::new("disk-full", &config, &store).debug());
    let started = d.expect("job_started", ev("job_started"), secs(60));
    let t1 = token_of(&started);
    d.expect("lease_renewed", ev_token("lease_renewed", t1), secs(15));

    let cut = d.len();
    let filler = mnt.join("filler");
    let bytes = fill(&filler);
    eprintln!("filled the tmpfs with {bytes} bytes");

    // The renewal cannot be written: the job's lease is lost.
    d.expect_from(cut, "lease_lost", ev_token("lease_lost", t1), secs(30));
    let (_, err) = d.expect_from(
        cut,
        "a store error naming the full disk",
        |e| {
            is(e, "store_unavailable")
                && str_field(e, "error").is_some_and(|s| s.contains("disk is full"))
        },
        secs(30),
    );
    let msg = str_field(&err, "error").unwrap_or_default().to_string();
    assert!(
        msg.contains("free space on") && !msg.contains("check that it is running"),
        "the disk-full error gives the wrong advice: {msg}"
    );

    // The CLI says the same and exits 1.
    let out = run(
        common::harness::fencecron(dir.path()).args([
            "lease",
            "acquire",
            &unique("diskfull-cli"),
            "--lease",
            "5s",
            "--store",
            &store,
        ]),
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "lease acquire on a full disk: {stderr}"
    );
    assert!(
        stderr.contains("disk is full") && stderr.contains("free space on"),
        "lease acquire on a full disk does not name it: {stderr}"
    );

    // A few more occurrences fail while the disk stays full.
    let mut n = cut;
    for _ in 0..3 {
        n =
            d.expect_from(
                n,
                "a failing acquire",
                |e| is(e, "store_unavailable") && str_field(e, "operation") == Some("acquire"),
                secs(30),
            )
            .0 + 1;
    }
    assert!(
        !d.all()[cut..]
            .iter()
            .any(|e| is(e, "job_started") && token_of(e) > t1),
        "a job started while the disk was full"
    );

    std::fs::remove_file(&filler).expect("remove the filler file");
    let freed = d.len();
    eprintln!("freed the tmpfs");

    // No restart: the next occurrences run again, with higher tokens.
    let (i, again) = d.expect_from(
        freed,
        "job_started after the disk was freed",
        |e| is(e, "job_started") && i64_field(e, "token").is_some_and(|t| t > t1),
        secs(60),
    );
    let t2 = token_of(&again);
    assert!(
        d.all()[freed..i]
            .iter()
            .all(|e| !str_field(e, "error").is_some_and(|s| s.contains("transaction depth"))),
        "a connection stayed inside a failed transaction: {}",
        d.summary()
    );
    eprintln!("token {t2} started after the disk was freed");

    // What could not be stored while the disk was full is stored now.
    wait_for_record(
        &store,
        dir.path(),
        "lease_lost",
        |r| str_field(r, "kind") == Some("lease_lost") && i64_field(r, "token") == Some(t1),
        secs(90),
    );
    // The lost lease was never released (the release failed too), so the
    // acquire after it took it over: that record is stored as well.
    if d.all()[cut..]
        .iter()
        .any(|e| is(e, "lease_taken_over") && i64_field(e, "previous_token") == Some(t1))
    {
        wait_for_record(
            &store,
            dir.path(),
            "lease_taken_over",
            |r| {
                str_field(r, "kind") == Some("lease_taken_over")
                    && i64_field(r, "token") == Some(t1)
            },
            secs(90),
        );
    }
    drop(d);
}

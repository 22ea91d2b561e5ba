//! Takeovers are visible in the daemon: when a node vanishes (here its
//! daemon and its job are SIGKILLed, as in a host crash) its lease expires
//! unreleased, and the node that takes the job over logs
//! `lease_taken_over` naming the vanished owner and stores a
//! `lease_taken_over` record that `fencecron stale` lists.

use crate::common;

use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use common::daemon::{
    ev, i64_field, job_toml, long_cmd, pid_of, secs, str_field, token_of, write_config, Daemon,
    DaemonOpts,
};
use common::harness::{fencecron, run};
use common::{Backend, TestStore};

#[test]
fn vanished_node_is_reported_by_the_node_that_takes_over() {
    let Some(ts) = TestStore::new(
        Backend::Sqlite,
        "takeover::vanished_node_is_reported_by_the_node_that_takes_over",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(
        dir.path(),
        "",
        &[job_toml(
            "takeover-job",
            "* * * * * *",
            &long_cmd(dir.path()),
            "lease = \"5s\"",
        )],
    );

    let mut a = Daemon::spawn(DaemonOpts::new("node-a", &config, &ts.url));
    let started = a.expect("node-a runs the job", ev("job_started"), secs(20));
    let (token_a, pid_a) = (token_of(&started), pid_of(&started));
    let acquired = a.expect(
        "node-a's lease",
        |e| ev("lease_acquired")(e) && i64_field(e, "token") == Some(token_a),
        secs(5),
    );
    let owner_a = str_field(&acquired, "owner_id")
        .expect("owner_id")
        .to_string();
    // The host dies: daemon and job at once, nothing released.
    a.signal(Signal::SIGKILL);
    let _ = killpg(Pid::from_raw(pid_a), Signal::SIGKILL);
    a.wait_exit(secs(10)).expect("node-a is gone");

    let b = Daemon::spawn(DaemonOpts::new("node-b", &config, &ts.url));
    let taken = b.expect("node-b takes over", ev("lease_taken_over"), secs(30));
    assert_eq!(taken["level"], "WARN", "{taken}");
    assert_eq!(str_field(&taken, "job"), Some("takeover-job"));
    assert_eq!(str_field(&taken, "resource"), Some("takeover-job"));
    assert_eq!(str_field(&taken, "node"), Some("node-b"));
    assert_eq!(str_field(&taken, "previous_node"), Some("node-a"));
    assert_eq!(
        str_field(&taken, "previous_owner_id"),
        Some(owner_a.as_str())
    );
    assert_eq!(i64_field(&taken, "previous_token"), Some(token_a));
    let token_b = token_of(&taken);
    assert_eq!(token_b, token_a + 1);
    assert!(str_field(&taken, "expired_at").is_some(), "{taken}");
    let acquired_b = b.expect(
        "node-b's lease_acquired",
        |e| ev("lease_acquired")(e) && i64_field(e, "token") == Some(token_b),
        secs(5),
    );
    assert_eq!(
        str_field(&taken, "owner_id"),
        str_field(&acquired_b, "owner_id")
    );
    // The job still runs: recording does not hold it up.
    b.expect(
        "node-b runs the job",
        |e| ev("job_started")(e) && i64_field(e, "token") == Some(token_b),
        secs(10),
    );

    // Stored in the background; wait for it to appear.
    let deadline = Instant::now() + secs(20);
    let rec = loop {
        let out = run(
            fencecron(dir.path()).args(["stale", "--json", "--store", &ts.url]),
            None,
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let all: Vec<Value> = serde_json::from_slice(&out.stdout).expect("stale --json");
        if let Some(r) = all.into_iter().find(|r| r["kind"] == "lease_taken_over") {
            break r;
        }
        assert!(Instant::now() < deadline, "no lease_taken_over record");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(rec["reason"], "expired_unreleased");
    assert_eq!(rec["resource"], "takeover-job");
    assert_eq!(rec["job"], "takeover-job");
    assert_eq!(rec["owner_id"], owner_a.as_str());
    assert_eq!(rec["token"], token_a);
    assert_eq!(rec["accepted_token"], token_b);
    assert_eq!(rec["node"], "node-a");
    assert_eq!(rec["stage"], "acquire");
}

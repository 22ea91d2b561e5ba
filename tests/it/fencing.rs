//! The article's end-to-end scenario with two real daemons on PostgreSQL:
//! a paused owner resumes after its lease went to another worker, and its
//! write is fenced off.
//!
//! 1. Daemon A runs the job with token N; the job starts its "work" (it
//!    writes its pid, prints, and then works in short steps).
//! 2. The test pauses A as a whole-host freeze would — the daemon, the run's
//!    watchdog and the job's process group — with SIGSTOP. (Pausing the
//!    daemon alone no longer lets the job outlive its lease: its watchdog
//!    kills it; `tests/watchdog.rs` proves that.) A stops renewing; its 5 s
//!    lease expires by the store's clock.
//! 3. Daemon B, which was refused while A held the lease, takes a later
//!    occurrence with token N+1; B's run writes `result` at once.
//! 4. A resumes and its job writes `result` with token N: `fencecron put`
//!    exits 3, B's value stays, and the rejection is recorded and logged.
//!    A's daemon finds its deadline passed, logs `lease_lost`, records it
//!    and kills the job.
//!
//! The job's process group is resumed before A's daemon, and the test waits
//! for the job's write before it resumes the daemon: a resumed daemon whose
//! kill deadline has passed SIGKILLs the job at once (as it must), so with
//! both resumed together the write would usually never be sent. After a
//! real pause (GC, VM freeze, SIGSTOP) nothing orders which process runs
//! first; this test pins down the order in which the stale write *does*
//! reach the store, which is the case fencing exists for.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use common::daemon::{
    ev, group_alive, i64_field, job_toml, read_pid_file, str_field, toml_str, Daemon, DaemonOpts,
};
use common::harness::{code, describe, fencecron, run};
use common::{bin, unique, Backend, TestStore};

/// The job. Each node does one real run (later occurrences exit at once);
/// the run on `$SLOW_NODE` works until the test creates `go`, writes, and
/// then keeps working so that its resumed daemon still finds it running.
const SCRIPT: &str = r#"
dir=$1
node=$FENCECRON_NODE
[ -e "$dir/pid-$node" ] && exit 0
echo $$ > "$dir/pid-$node.tmp" && mv "$dir/pid-$node.tmp" "$dir/pid-$node"
echo "token $FENCECRON_TOKEN: working"
if [ "$node" = "$SLOW_NODE" ]; then
    while [ ! -e "$dir/go" ]; do sleep 0.05; done
    echo "token $FENCECRON_TOKEN: resumed, writing"
fi
rc=0
fencecron --log-format json put result --value "from-$node-$FENCECRON_TOKEN" 2> "$dir/put-$node.err" || rc=$?
cat "$dir/put-$node.err" >&2
echo "$rc" > "$dir/put-$node.rc.tmp" && mv "$dir/put-$node.rc.tmp" "$dir/put-$node.rc"
if [ "$node" = "$SLOW_NODE" ]; then
    while :; do sleep 0.05; done
fi
exit "$rc"
"#;

const WAIT: Duration = Duration::from_secs(20);

/// Waits for a small file written with tmp+rename and returns its content.
fn wait_file(path: &Path, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            return s.trim().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {timeout:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn json_out(out: &std::process::Output) -> Value {
    assert_eq!(code(out), 0, "{}", describe(out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", describe(out)))
}

/// `fencecron get result --json` for the resource.
fn get_result(dir: &Path, store: &str, resource: &str) -> Value {
    let mut cmd = fencecron(dir);
    cmd.args([
        "get",
        "result",
        "--json",
        "--resource",
        resource,
        "--store",
        store,
    ]);
    json_out(&run(cmd, None))
}

/// The resource's records from `fencecron stale --json`.
fn stale_of(dir: &Path, store: &str, resource: &str) -> Vec<Value> {
    let mut cmd = fencecron(dir);
    cmd.args(["stale", "--json", "--store", store]);
    match json_out(&run(cmd, None)) {
        Value::Array(all) => all
            .into_iter()
            .filter(|r| r["resource"] == resource)
            .collect(),
        other => panic!("stale --json is not an array: {other}"),
    }
}

/// The parent of `pid` (for a job's leader: its run watchdog).
fn parent_of(pid: i32) -> Pid {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("job's /proc stat");
    let rest = &stat[stat.rfind(')').expect("stat") + 2..];
    let ppid = rest.split_whitespace().nth(1).expect("ppid");
    Pid::from_raw(ppid.parse().expect("ppid is a number"))
}

/// The JSON events in a log text (one object per line).
fn events_in(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(Value::is_object)
        .collect()
}

#[test]
fn paused_owner_is_fenced_off_after_its_lease_moves_on() {
    let Some(ts) = TestStore::new(Backend::Postgres, "fencing end-to-end") else {
        return;
    };
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    let job = unique("fencing-e2e");
    let (node_a, node_b) = ("fencing-a", "fencing-b");
    let config = dir.join("jobs.toml");
    let argv: Vec<String> = vec![
        "sh".into(),
        "-c".into(),
        SCRIPT.into(),
        "sh".into(),
        dir.display().to_string(),
    ];
    let extra = format!(
        "lease = \"5s\"\nenv = {{ SLOW_NODE = {} }}",
        toml_str(node_a)
    );
    std::fs::write(&config, job_toml(&job, "* * * * * *", &argv, &extra)).expect("jobs.toml");

    // `fencecron put` inside the job is found on PATH.
    let bin_dir = bin().parent().expect("bin dir").to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let opts = |node: &str| {
        let mut o = DaemonOpts::new(node, &config, &ts.url);
        o.env.push(("PATH".into(), path.clone()));
        o
    };
    let is_job = |e: &Value| str_field(e, "job") == Some(job.as_str());

    // 1. A takes the lease with token N and its job starts working.
    let mut a = Daemon::spawn(opts(node_a));
    let acquired_a = a.expect(
        "A's lease_acquired",
        |e| ev("lease_acquired")(e) && is_job(e),
        WAIT,
    );
    let n = i64_field(&acquired_a, "token").expect("token N");
    let job_pid = read_pid_file(&dir.join(format!("pid-{node_a}")), WAIT);
    let started = a.expect(
        "A's job_started",
        |e| ev("job_started")(e) && is_job(e),
        WAIT,
    );
    assert_eq!(i64_field(&started, "token"), Some(n));
    assert_eq!(
        i64_field(&started, "pid"),
        Some(i64::from(job_pid)),
        "the pid the job wrote is the one the daemon started (and its process group)"
    );
    a.expect(
        "A's job printing that it works",
        |e| {
            ev("job_output")(e)
                && str_field(e, "line") == Some(format!("token {n}: working").as_str())
        },
        WAIT,
    );

    // B competes and is refused while A holds the lease.
    let mut b = Daemon::spawn(opts(node_b));
    b.expect(
        "B refused while A holds the lease",
        |e| ev("occurrence_skipped")(e) && is_job(e) && str_field(e, "reason") == Some("held"),
        WAIT,
    );
    assert!(
        !dir.join(format!("pid-{node_b}")).exists(),
        "B must not run while A holds the lease"
    );

    // 2. Pause A like a frozen host: the daemon, the run's watchdog (the
    // job's parent) and the job's process group.
    let a_pid = a.pid();
    let watchdog = parent_of(job_pid);
    kill(a_pid, Signal::SIGSTOP).expect("SIGSTOP daemon A");
    kill(watchdog, Signal::SIGSTOP).expect("SIGSTOP A's run watchdog");
    killpg(Pid::from_raw(job_pid), Signal::SIGSTOP).expect("SIGSTOP A's job group");

    // 3. The lease expires; B takes a later occurrence with N+1 and writes.
    let acquired_b = b.expect(
        "B's lease_acquired after A's lease expired",
        |e| ev("lease_acquired")(e) && is_job(e),
        WAIT,
    );
    assert_eq!(
        i64_field(&acquired_b, "token"),
        Some(n + 1),
        "B's acquisition is the next generation"
    );
    assert_eq!(
        wait_file(&dir.join(format!("put-{node_b}.rc")), WAIT),
        "0",
        "B's put must be accepted"
    );
    let value_b = format!("from-{node_b}-{}", n + 1);
    let stored = get_result(dir, &ts.url, &job);
    assert_eq!(stored["value"].as_str(), Some(value_b.as_str()), "{stored}");

    // 4. A's job resumes and writes with token N: rejected.
    std::fs::write(dir.join("go"), "").expect("go");
    killpg(Pid::from_raw(job_pid), Signal::SIGCONT).expect("SIGCONT A's job group");
    let rc = wait_file(&dir.join(format!("put-{node_a}.rc")), WAIT);
    let put_err = std::fs::read_to_string(dir.join(format!("put-{node_a}.err"))).unwrap();
    assert_eq!(
        rc, "3",
        "A's stale put must exit 3 (stale); its stderr: {put_err}"
    );
    let rejected = events_in(&put_err)
        .into_iter()
        .find(|e| ev("stale_write_rejected")(e))
        .unwrap_or_else(|| panic!("no stale_write_rejected event in the put's stderr: {put_err}"));
    assert_eq!(i64_field(&rejected, "token"), Some(n), "{rejected}");
    assert_eq!(
        i64_field(&rejected, "accepted_token"),
        Some(n + 1),
        "{rejected}"
    );
    assert_eq!(str_field(&rejected, "node"), Some(node_a), "{rejected}");
    assert_eq!(str_field(&rejected, "key"), Some("result"), "{rejected}");
    assert_eq!(str_field(&rejected, "resource"), Some(job.as_str()));

    // A's daemon and watchdog resume, find the deadline passed and kill the
    // job.
    kill(watchdog, Signal::SIGCONT).expect("SIGCONT A's run watchdog");
    kill(a_pid, Signal::SIGCONT).expect("SIGCONT daemon A");
    let lost = a.expect(
        "A's lease_lost",
        |e| ev("lease_lost")(e) && is_job(e) && i64_field(e, "token") == Some(n),
        WAIT,
    );
    assert_eq!(str_field(&lost, "level"), Some("WARN"), "{lost}");
    assert_eq!(str_field(&lost, "node"), Some(node_a), "{lost}");
    let finished = a.expect(
        "A's job_finished for token N",
        |e| ev("job_finished")(e) && i64_field(e, "token") == Some(n),
        WAIT,
    );
    assert!(
        str_field(&finished, "signal").is_some(),
        "A's job must have been killed: {finished}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while group_alive(job_pid) {
        assert!(
            Instant::now() < deadline,
            "a process of A's job group survived the kill"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The put's rejection also reached A's daemon log, through the job's
    // stderr.
    a.expect(
        "the put's stale_write_rejected in A's job_output",
        |e| {
            ev("job_output")(e)
                && i64_field(e, "token") == Some(n)
                && str_field(e, "line")
                    .and_then(|l| serde_json::from_str::<Value>(l).ok())
                    .is_some_and(|inner| ev("stale_write_rejected")(&inner))
        },
        WAIT,
    );
    // And A's daemon logged it as its own top-level event of the job.
    a.expect(
        "A's own stale_write_rejected for token N",
        |e| ev("stale_write_rejected")(e) && is_job(e) && i64_field(e, "token") == Some(n),
        WAIT,
    );

    // B's data is retained.
    let stored = get_result(dir, &ts.url, &job);
    assert_eq!(stored["value"].as_str(), Some(value_b.as_str()), "{stored}");
    assert_eq!(stored["token"].as_i64(), Some(n + 1), "{stored}");

    // Both stale-owner facts are on record (the lost lease is stored in the
    // background; wait for it).
    let deadline = Instant::now() + WAIT;
    let records = loop {
        let recs = stale_of(dir, &ts.url, &job);
        let has = |kind: &str| recs.iter().any(|r| r["kind"] == kind);
        if has("write_rejected") && has("lease_lost") {
            break recs;
        }
        assert!(
            Instant::now() < deadline,
            "stale records for {job} within {WAIT:?}: {recs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let write = records
        .iter()
        .find(|r| r["kind"] == "write_rejected")
        .unwrap();
    assert_eq!(write["token"].as_i64(), Some(n), "{write}");
    assert_eq!(write["accepted_token"].as_i64(), Some(n + 1), "{write}");
    assert_eq!(write["key"], "result", "{write}");
    assert_eq!(write["node"], node_a, "{write}");
    assert_eq!(write["job"], job.as_str(), "{write}");
    let lease = records.iter().find(|r| r["kind"] == "lease_lost").unwrap();
    assert_eq!(lease["token"].as_i64(), Some(n), "{lease}");
    assert_eq!(lease["node"], node_a, "{lease}");
    assert_eq!(
        lease["owner_id"].as_str(),
        str_field(&acquired_a, "owner_id"),
        "{lease}"
    );
    assert!(
        records
            .iter()
            .all(|r| r["node"] == node_a && r["token"].as_i64() == Some(n)),
        "only A, with token N, is a stale owner: {records:?}"
    );

    for d in [&mut a, &mut b] {
        assert_eq!(
            d.stop(WAIT).map(|s| s.code()),
            Some(Some(0)),
            "[{}] clean shutdown",
            d.node
        );
    }
}

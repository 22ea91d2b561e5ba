//! A Patroni cluster of the tests' own: one etcd and three PostgreSQL
//! nodes managed by Patroni (Debian's `patroni` and `etcd-server`), all on
//! free loopback ports, as the `postgres` OS user in a temporary directory
//! that user owns (PostgreSQL refuses to run as root).
//!
//! [`Cluster::start`] waits, polling Patroni's REST API (`GET /cluster`),
//! for a leader and two streaming replicas; [`Cluster::url`] is the
//! multi-host URL a fleet uses; [`Cluster::switchover`] runs `patronictl
//! switchover`; [`Cluster::crash_leader`] SIGKILLs the leader's Patroni and
//! its postmaster's process group. Dropping the cluster kills every
//! process it started (the process groups of etcd and of each Patroni,
//! each postmaster's group, and any process whose command line names the
//! directory), then removes the directory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use super::free_port;
use super::harness::{describe, run};
use super::pg::{pg_bindir, postgres_dir};

/// Patroni's `ttl` (seconds): how long a leader key outlives its leader.
pub const TTL: u64 = 10;
/// Patroni's `loop_wait` (seconds): the HA loop's period.
pub const LOOP_WAIT: u64 = 1;
/// Patroni's `retry_timeout` (seconds); `loop_wait + 2 * retry_timeout`
/// stays within `ttl`, as Patroni wants.
pub const RETRY_TIMEOUT: u64 = 4;

/// Clusters are started one at a time: six PostgreSQL servers, six Patroni
/// and two etcd on 2 shared cores would make every timing a load test.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Why the Patroni tests cannot run here, if they cannot: what every
/// throwaway PostgreSQL needs (root, the server binaries, the `postgres`
/// user), and Patroni and etcd.
fn unavailable() -> Option<String> {
    if let Some(why) = super::pg::unavailable() {
        return Some(why);
    }
    for tool in ["patroni", "patronictl", "etcd"] {
        if which(tool).is_none() {
            return Some(format!(
                "`{tool}` is not installed (apt-get install patroni etcd-server; .ci/run does)"
            ));
        }
    }
    None
}

fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// Whether `test` must skip because Patroni, etcd, PostgreSQL or root are
/// missing: it then says why (`*** SKIPPED … ***`); under `CI=true` it
/// fails instead.
pub fn skip_unless_available(test: &str) -> bool {
    let Some(why) = unavailable() else {
        return false;
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: {why}; under CI=true this test must run");
    }
    skipped!("\n*** SKIPPED {test}: {why}. ***\n");
    true
}

/// One Patroni node.
pub struct Node {
    pub name: String,
    pub pg_port: u16,
    pub api_port: u16,
    pub config: PathBuf,
    pub data: PathBuf,
    log: PathBuf,
    patroni: Option<Child>,
}

/// One member as `GET /cluster` shows it.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    pub role: String,
    pub state: String,
}

impl Member {
    pub fn is_leader(&self) -> bool {
        (self.role == "leader" || self.role == "master") && self.state == "running"
    }

    pub fn is_streaming_replica(&self) -> bool {
        (self.role == "replica" || self.role == "sync_standby")
            && (self.state == "streaming" || self.state == "running")
    }
}

/// A running etcd and three Patroni nodes.
pub struct Cluster {
    pub synchronous_mode: bool,
    pub nodes: Vec<Node>,
    etcd: Option<Child>,
    dir: Option<tempfile::TempDir>,
    /// When this cluster's turn came (after any other test's cluster).
    pub started: Instant,
    _one_at_a_time: MutexGuard<'static, ()>,
}

/// How long the cluster may take to elect its first leader and stream to
/// both replicas (initdb, two base backups; on busy cores).
const BOOTSTRAP: Duration = Duration::from_secs(120);

impl Cluster {
    /// Starts etcd and three Patroni nodes and waits for a leader and two
    /// streaming replicas. `synchronous_mode` is Patroni's (one
    /// synchronous standby, not strict).
    pub fn start(synchronous_mode: bool) -> Cluster {
        let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let dir = postgres_dir();
        let path = dir.path().to_path_buf();
        let (client, peer) = (free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let etcd_log = std::fs::File::create(path.join("etcd.log")).expect("etcd log");
        let mut etcd_cmd = as_postgres_cmd("etcd");
        etcd_cmd
            .args(["--name", "e1", "--data-dir"])
            .arg(path.join("etcd"))
            .args(["--listen-client-urls", &etcd_url])
            .args(["--advertise-client-urls", &etcd_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("e1={peer_url}")])
            .arg("--enable-v2=true")
            .stdout(etcd_log.try_clone().expect("etcd log"))
            .stderr(etcd_log);
        let mut cluster = Cluster {
            synchronous_mode,
            nodes: Vec::new(),
            etcd: Some(spawn(etcd_cmd, "etcd")),
            dir: Some(dir),
            started: Instant::now(),
            _one_at_a_time: guard,
        };
        let bindir = pg_bindir().expect("checked by unavailable()");
        for i in 1..=3 {
            let name = format!("n{i}");
            let node = Node {
                pg_port: free_port(),
                api_port: free_port(),
                config: path.join(format!("{name}.yml")),
                data: path.join(format!("{name}.data")),
                log: path.join(format!("{name}.log")),
                name,
                patroni: None,
            };
            let yml = node_yml(&node, &path, client, &bindir, synchronous_mode);
            std::fs::write(&node.config, yml).expect("write patroni config");
            cluster.nodes.push(node);
        }
        for node in &mut cluster.nodes {
            let log = std::fs::File::create(&node.log).expect("patroni log");
            let mut cmd = as_postgres_cmd("patroni");
            cmd.arg(&node.config)
                .stdout(log.try_clone().expect("patroni log"))
                .stderr(log);
            node.patroni = Some(spawn(cmd, &node.name));
        }
        cluster.wait_healthy(3, BOOTSTRAP, "a leader and two streaming replicas");
        eprintln!(
            "patroni cluster (synchronous_mode {synchronous_mode}): a leader and two streaming \
             replicas after {:.1} s",
            cluster.started.elapsed().as_secs_f64()
        );
        cluster
    }

    /// `postgres://postgres@127.0.0.1:P1,…,127.0.0.1:P3/DB?QUERY`.
    pub fn url(&self, db: &str, query: &str) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.pg_port))
            .collect();
        let mut u = format!("postgres://postgres@{}/{db}", hosts.join(","));
        if !query.is_empty() {
            u.push('?');
            u.push_str(query);
        }
        u
    }

    /// Waits until every running node (the replicas too) has the
    /// database `db`: a replica that has not replayed `CREATE DATABASE` yet
    /// refuses connections to it.
    pub fn wait_database(&self, db: &str, timeout: Duration) {
        let psql = pg_bindir().expect("checked by unavailable()").join("psql");
        let deadline = Instant::now() + timeout;
        for node in self.nodes.iter().filter(|n| n.patroni.is_some()) {
            loop {
                let out = Command::new(&psql)
                    .args(["-h", "127.0.0.1", "-p", &node.pg_port.to_string()])
                    .args(["-U", "postgres", "-d", db, "-c", "SELECT 1"])
                    .stdin(Stdio::null())
                    .output()
                    .expect("run psql");
                if out.status.success() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} has no database {db} within {timeout:?}: {}\n{}",
                    node.name,
                    describe(&out),
                    self.logs()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    /// The members, as the first node whose REST API answers reports them.
    pub fn members(&self) -> Option<Vec<Member>> {
        self.nodes
            .iter()
            .filter(|n| n.patroni.is_some())
            .find_map(|n| cluster_members(n.api_port))
    }

    /// Waits until the members show a leader and `members - 1` streaming
    /// replicas (in synchronous mode one of them the synchronous standby);
    /// returns them. Panics with the members and the logs' tails.
    pub fn wait_healthy(&self, members: usize, timeout: Duration, what: &str) -> Vec<Member> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Some(m) = self.members() {
                let leaders = m.iter().filter(|m| m.is_leader()).count();
                let replicas = m.iter().filter(|m| m.is_streaming_replica()).count();
                let sync_ok = !self.synchronous_mode || m.iter().any(|m| m.role == "sync_standby");
                if leaders == 1 && replicas + 1 >= members && sync_ok {
                    return m;
                }
                last = Some(m);
            }
            if Instant::now() >= deadline {
                panic!(
                    "no {what} within {timeout:?}; members: {last:?}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The current leader's name (waiting up to `timeout` for one).
    pub fn leader(&self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self
                .members()
                .and_then(|m| m.into_iter().find(|m| m.is_leader()))
            {
                return l.name;
            }
            assert!(
                Instant::now() < deadline,
                "no leader within {timeout:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `patronictl switchover --leader L --candidate C --force`, to the
    /// synchronous standby in synchronous mode (Patroni refuses another),
    /// else to the first replica; returns (old leader, candidate).
    pub fn switchover(&self) -> (String, String) {
        let members = self.members().expect("a member answers");
        let leader = members
            .iter()
            .find(|m| m.is_leader())
            .unwrap_or_else(|| panic!("no leader to switch over from: {members:?}"))
            .name
            .clone();
        let candidate = members
            .iter()
            .find(|m| m.role == "sync_standby" && m.is_streaming_replica())
            .or_else(|| members.iter().find(|m| m.is_streaming_replica()))
            .unwrap_or_else(|| panic!("no replica to switch over to: {members:?}"))
            .name
            .clone();
        let mut cmd = Command::new("patronictl");
        cmd.arg("-c")
            .arg(&self.nodes[0].config)
            .args(["switchover", "--leader", &leader, "--candidate", &candidate])
            .arg("--force");
        let out = run(cmd, None);
        assert!(
            out.status.success(),
            "patronictl switchover failed: {}\n{}",
            describe(&out),
            self.logs()
        );
        (leader, candidate)
    }

    /// SIGKILLs the leader's Patroni and then its postmaster with its
    /// backends (their own process group: Patroni detaches the
    /// postmaster), so nobody releases the leader key: it expires after
    /// `ttl`. Returns the crashed node's name. The node stays down.
    pub fn crash_leader(&mut self) -> String {
        let leader = self.leader(Duration::from_secs(30));
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.name == leader)
            .expect("the leader is a node");
        if let Some(mut child) = node.patroni.take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        let postmaster =
            postmaster_pid(&node.data).unwrap_or_else(|| panic!("{leader} has no postmaster.pid"));
        let _ = killpg(Pid::from_raw(postmaster), Signal::SIGKILL);
        let _ = kill(Pid::from_raw(postmaster), Signal::SIGKILL);
        leader
    }

    /// The tails of etcd's and every node's log, for failure messages.
    pub fn logs(&self) -> String {
        let Some(dir) = &self.dir else {
            return String::new();
        };
        let mut out = String::new();
        let mut files = vec![("etcd".to_string(), dir.path().join("etcd.log"))];
        for n in &self.nodes {
            files.push((format!("patroni {}", n.name), n.log.clone()));
            files.push((
                format!("postgres {}", n.name),
                n.data.join("log").join("postgresql.log"),
            ));
        }
        // Patroni repeats its loop's state every second; what a stall needs
        // is what came before (initdb's and the server's own output).
        let repeated = [
            "Lock owner:",
            "bootstrap in progress",
            "not healthy enough for leader race",
            "waiting for leader to bootstrap",
        ];
        for (what, file) in files {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| !repeated.iter().any(|r| l.contains(r)))
                .collect();
            out.push_str(&format!(
                "--- {what} (tail) ---\n{}\n",
                lines[lines.len().saturating_sub(25)..].join("\n")
            ));
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Written without `eprintln!`, which panics when stderr is gone (a
        // closed pipe): a panic in this drop while the test panics would
        // abort and leave the cluster running.
        if std::thread::panicking() {
            let _ = writeln!(std::io::stderr(), "{}", self.logs());
        }
        // Patroni first, so that none restarts its postgres; then the
        // postmasters' groups; then etcd; then anything still naming the
        // directory (a postmaster Patroni was starting as it died).
        for node in &mut self.nodes {
            if let Some(mut child) = node.patroni.take() {
                let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
                let _ = child.wait();
            }
        }
        for node in &self.nodes {
            if let Some(pid) = postmaster_pid(&node.data) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        if let Some(mut child) = self.etcd.take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        if let Some(dir) = self.dir.take() {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let left = processes_naming(dir.path());
                if left.is_empty() {
                    break;
                }
                if Instant::now() >= deadline {
                    let _ = writeln!(
                        std::io::stderr(),
                        "patroni cluster: processes left behind: {left:?}"
                    );
                    break;
                }
                for pid in left {
                    kill_with_group(pid);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(dir);
        }
    }
}

/// A command run as the `postgres` OS user (through `runuser`), in `/`:
/// the checkout it would inherit may be private to its owner (a clone in a
/// `mktemp -d` directory is 0700), and Patroni's worker processes change
/// back into their parent's directory, so none of them started there.
fn as_postgres_cmd(program: &str) -> Command {
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "postgres", "--", program]).current_dir("/");
    cmd
}

/// Spawns `cmd` in a process group of its own (which [`Cluster`]'s drop
/// kills).
fn spawn(mut cmd: Command, what: &str) -> Child {
    cmd.stdin(Stdio::null()).process_group(0);
    cmd.spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"))
}

/// One node's Patroni configuration.
fn node_yml(node: &Node, dir: &Path, etcd_port: u16, bindir: &Path, sync: bool) -> String {
    format!(
        r#"scope: fencecron-test
name: {name}
restapi:
  listen: 127.0.0.1:{api}
  connect_address: 127.0.0.1:{api}
etcd3:
  host: 127.0.0.1:{etcd_port}
bootstrap:
  dcs:
    ttl: {TTL}
    loop_wait: {LOOP_WAIT}
    retry_timeout: {RETRY_TIMEOUT}
    maximum_lag_on_failover: 1048576
    synchronous_mode: {sync}
    postgresql:
      use_pg_rewind: true
      parameters:
        fsync: "off"
        wal_keep_size: 64MB
  initdb:
    - encoding: UTF8
    - auth: trust
  pg_hba:
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:{pg}
  connect_address: 127.0.0.1:{pg}
  data_dir: {data}
  bin_dir: {bindir}
  pgpass: {dir}/pgpass.{name}
  authentication:
    replication:
      username: postgres
    superuser:
      username: postgres
  parameters:
    unix_socket_directories: {dir}
    logging_collector: "on"
    log_directory: log
    log_filename: postgresql.log
"#,
        name = node.name,
        api = node.api_port,
        pg = node.pg_port,
        data = node.data.display(),
        bindir = bindir.display(),
        dir = dir.display(),
    )
}

/// The members from `GET /cluster` on the REST API at `port`, if it
/// answers.
fn cluster_members(port: u16) -> Option<Vec<Member>> {
    let body = http_get(port, "/cluster")?;
    let v: Value = serde_json::from_str(&body).ok()?;
    let members = v.get("members")?.as_array()?;
    Some(
        members
            .iter()
            .map(|m| Member {
                name: m.get("name").and_then(Value::as_str).unwrap_or("").into(),
                role: m.get("role").and_then(Value::as_str).unwrap_or("").into(),
                state: m.get("state").and_then(Value::as_str).unwrap_or("").into(),
            })
            .collect(),
    )
}

/// A plain HTTP/1.0 GET on loopback; the body of a 200, else `None`.
fn http_get(port: u16, path: &str) -> Option<String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut resp = String::new();
    s.read_to_string(&mut resp).ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200")
        .then_some(())
        .or_else(|| head.starts_with("HTTP/1.1 200").then_some(()))?;
    Some(body.to_string())
}

/// The postmaster's pid from `DATA/postmaster.pid`, if it is there.
fn postmaster_pid(data: &Path) -> Option<i32> {
    std::fs::read_to_string(data.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// Live processes whose command line mentions `dir`.
fn processes_naming(dir: &Path) -> Vec<i32> {
    let needle = dir.display().to_string();
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| *pid != me && super::daemon::pid_alive(*pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        })
        .collect()
}

/// SIGKILLs `pid` and, unless it is the test's own, its process group.
fn kill_with_group(pid: i32) {
    let own = nix::unistd::getpgrp();
    if let Ok(pgid) = nix::unistd::getpgid(Some(Pid::from_raw(pid))) {
        if pgid != own {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
}

//! `fencecron proxy` end to end: the real binary between a test client and a
//! real upstream HTTP server started by the test, which records every
//! request it applied (and when each arrived and finished, in one global
//! order).
//!
//! On SQLite always, on PostgreSQL and MySQL when their URLs are set.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use common::daemon::{str_field, wait_until};
use common::harness::{describe, fencecron, run, scrub};
use common::{bin, free_port, unique, Backend, TestStore};

const WAIT: Duration = Duration::from_secs(20);

// ------------------------------------------------------------ the upstream

/// What the upstream saw, in one global order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    /// A request arrived (its Fencing-Token header, its body).
    Arrived(String, String),
    /// It was applied and answered.
    Applied(String, String),
}

/// A real HTTP/1.1 server (keep-alive, Content-Length bodies) that applies
/// every request it gets after `delay` and answers 200 `applied BODY`.
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    fn start(delay: Duration) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind upstream");
        let addr = listener.local_addr().expect("upstream addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let seen = seen.clone();
                    std::thread::spawn(move || serve_upstream(conn, &seen, delay));
                }
            });
        }
        Upstream { addr, seen, stop }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The bodies applied, in order.
    fn applied(&self) -> Vec<String> {
        self.seen()
            .into_iter()
            .filter_map(|s| match s {
                Seen::Applied(_, body) => Some(body),
                Seen::Arrived(..) => None,
            })
            .collect()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve_upstream(conn: TcpStream, seen: &Mutex<Vec<Seen>>, delay: Duration) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
    let mut conn = conn;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut token = String::new();
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (name, value) = h.split_once(':').unwrap_or((h, ""));
            match name.to_ascii_lowercase().as_str() {
                "fencing-token" => token = value.trim().to_string(),
                "content-length" => length = value.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let body = String::from_utf8_lossy(&body).to_string();
        seen.lock()
            .unwrap()
            .push(Seen::Arrived(token.clone(), body.clone()));
        std::thread::sleep(delay);
        let answer = format!("applied {body}");
        seen.lock().unwrap().push(Seen::Applied(token, body));
        let res = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n{answer}",
            answer.len()
        );
        if conn.write_all(res.as_bytes()).is_err() {
            return;
        }
    }
}

// --------------------------------------------------------------- a client

/// A response: status and body.
#[derive(Debug)]
struct Reply {
    status: u16,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// POSTs `body` to `addr` with the header `Fencing-Token: fencing` (none
/// when `None`), over a connection of its own.
fn post(addr: SocketAddr, fencing: Option<&str>, body: &str) -> Reply {
    let mut conn = TcpStream::connect(addr).expect("connect to the proxy");
    conn.set_read_timeout(Some(Duration::from_secs(60))).ok();
    let header = fencing
        .map(|f| format!("Fencing-Token: {f}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "POST /apply?x=1 HTTP/1.1\r\nHost: test\r\n{header}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).expect("send");
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).expect("read the reply");
    let raw = String::from_utf8_lossy(&raw).to_string();
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {raw:?}"));
    let (head, rest) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        unchunk(rest)
    } else {
        rest.to_string()
    };
    Reply { status, body }
}

fn unchunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

// ------------------------------------------------------ the proxy process

/// A running `fencecron proxy` with its JSON log lines.
struct ProxyProc {
    child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Value>>>,
}

impl ProxyProc {
    fn start(store: &str, upstream: &str) -> ProxyProc {
        let mut cmd = Command::new(bin());
        scrub(&mut cmd)
            .args(["--log-format", "json", "--store", store, "proxy"])
            .args(["--listen", "127.0.0.1:0", "--upstream", upstream])
            .env("FENCECRON_NODE", "proxy-node")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start fencecron proxy");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { return };
                    let v = serde_json::from_str(&line)
                        .unwrap_or_else(|_| serde_json::json!({ "raw": line }));
                    log.lock().unwrap().push(v);
                }
            });
        }
        let mut p = ProxyProc {
            child,
            addr: "127.0.0.1:1".parse().unwrap(),
            log,
        };
        let started = p.wait_event("proxy_started", |_| true);
        p.addr = str_field(&started, "listen")
            .expect("listen field")
            .parse()
            .expect("listen address");
        p
    }

    fn events(&self, name: &str) -> Vec<Value> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|e| str_field(e, "event") == Some(name))
            .cloned()
            .collect()
    }

    fn wait_event(&self, name: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(e) = self.events(name).into_iter().find(|e| pred(e)) {
                return e;
            }
            assert!(
                Instant::now() < deadline,
                "no {name} event within {WAIT:?}; log: {:?}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM; the proxy must exit 0 after `proxy_stopped`.
    fn stop(mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("signal the proxy");
        let deadline = Instant::now() + WAIT;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                break st;
            }
            assert!(Instant::now() < deadline, "the proxy did not stop");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "the proxy exited with {status}");
        self.wait_event("proxy_stopped", |_| true);
    }
}

impl Drop for ProxyProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ------------------------------------------------------------- leases

/// `lease acquire --json`: (token, owner id), or `None` while it is held.
fn acquire(dir: &Path, store: &str, r: &str) -> Option<(i64, String)> {
    let out = run(
        fencecron(dir).args([
            "--store", store, "lease", "acquire", r, "--lease", "5s", "--json",
        ]),
        None,
    );
    match out.status.code() {
        Some(0) => {
            let v: Value = serde_json::from_slice(&out.stdout).expect("acquire --json");
            Some((
                v["token"].as_i64().expect("token"),
                v["owner_id"].as_str().expect("owner_id").to_string(),
            ))
        }
        Some(75) => None,
        _ => panic!("lease acquire failed: {}", describe(&out)),
    }
}

fn release(dir: &Path, store: &str, r: &str, (token, owner): &(i64, String)) {
    let out = run(
        fencecron(dir).args([
            "--store",
            store,
            "lease",
            "release",
            r,
            "--owner-id",
            owner,
            "--token",
            &token.to_string(),
        ]),
        None,
    );
    assert!(out.status.success(), "release: {}", describe(&out));
}

/// Two generations of a fresh resource: the first released, the second
/// held. Returns the resource and both tokens.
fn two_generations(dir: &Path, store: &str, prefix: &str) -> (String, i64, i64) {
    let r = unique(prefix);
    let first = acquire(dir, store, &r).expect("a fresh resource is free");
    release(dir, store, &r, &first);
    let second = acquire(dir, store, &r).expect("released");
    assert!(second.0 > first.0);
    (r, first.0, second.0)
}

/// The `fencecron stale --json` records of resource `r`.
fn stale_of(dir: &Path, store: &str, r: &str) -> Vec<Value> {
    let out = run(
        fencecron(dir).args(["--store", store, "stale", "--json"]),
        None,
    );
    assert!(out.status.success(), "stale: {}", describe(&out));
    let all: Vec<Value> = serde_json::from_slice(&out.stdout).expect("stale --json");
    all.into_iter()
        .filter(|v| v["resource"].as_str() == Some(r))
        .collect()
}

fn fencing(r: &str, token: i64) -> String {
    format!("{r}:{token}")
}

// ------------------------------------------------------------- the tests

/// The article's scenario through the proxy: owner A (token N) stops
/// renewing, as a paused process does; its lease expires by the store's
/// clock and `fencecron exec` takes it over (token N+1), its job reading
/// the header from `FENCECRON_FENCING_HEADER`; the new owner's request is
/// applied; then A resumes and sends: 409, not applied upstream, recorded
/// in `fencecron stale` with stage `proxy` and logged as
/// `stale_write_rejected`.
fn paused_owner(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start(Duration::ZERO);
    let proxy = ProxyProc::start(&ts.url, &upstream.url());
    let r = unique("proxy-paused");
    let (old, _owner) = acquire(dir.path(), &ts.url, &r).expect("fresh");
    let reply = post(proxy.addr, Some(&fencing(&r, old)), "old-1");
    assert_eq!((reply.status, reply.body.as_str()), (200, "applied old-1"));

    // A is paused: it never renews. The new owner gets the lease once it
    // expired by the store's clock.
    let header_file = dir.path().join("header");
    let script = format!(
        "printf %s \"$FENCECRON_FENCING_HEADER\" > '{}'",
        header_file.display()
    );
    wait_until(
        WAIT,
        || {
            let out = run(
                fencecron(dir.path())
                    .args(["--store", &ts.url, "exec", &r, "--lease", "5s"])
                    .args(["--", "sh", "-c", &script]),
                None,
            );
            match out.status.code() {
                Some(0) => true,
                Some(75) => {
                    std::thread::sleep(Duration::from_millis(200));
                    false
                }
                _ => panic!("exec failed: {}", describe(&out)),
            }
        },
        || "the expired lease was never taken over".into(),
    );
    let header = std::fs::read_to_string(&header_file).expect("the job wrote its header");
    let (name, token) = header.rsplit_once(':').expect("RESOURCE:TOKEN");
    let new: i64 = token.parse().expect("a decimal token");
    assert_eq!(name, r);
    assert!(new > old, "{header}");

    let reply = post(proxy.addr, Some(&header), "new-1");
    assert_eq!((reply.status, reply.body.as_str()), (200, "applied new-1"));

    // A resumes and writes with its old token.
    let reply = post(proxy.addr, Some(&fencing(&r, old)), "old-2");
    assert_eq!(reply.status, 409, "{reply:?}");
    let body = reply.json();
    assert_eq!(body["reason"], "stale", "{body}");
    assert_eq!(body["token"], old);
    assert_eq!(body["accepted_token"], new);
    assert!(
        body["message"].as_str().unwrap().contains("not forwarded"),
        "{body}"
    );
    assert_eq!(upstream.applied(), ["old-1", "new-1"]);

    let recs = stale_of(dir.path(), &ts.url, &r);
    let rec = recs
        .iter()
        .find(|v| v["stage"] == "proxy")
        .unwrap_or_else(|| panic!("no proxy record: {recs:?}"));
    assert_eq!(rec["kind"], "write_rejected");
    assert_eq!(rec["reason"], "stale");
    assert_eq!(rec["token"], old);
    assert_eq!(rec["accepted_token"], new);
    assert_eq!(rec["node"], "proxy-node");
    assert_eq!(rec["operation_id"], body["operation_id"]);

    let ev = proxy.wait_event("stale_write_rejected", |e| {
        str_field(e, "resource") == Some(r.as_str())
    });
    assert_eq!(ev["stage"], "proxy");
    assert_eq!(ev["level"], "WARN");
    assert_eq!(ev["token"], old);
    assert_eq!(ev["accepted_token"], new);
    assert_eq!(ev["reason"], "stale");
    // Never a request's body.
    assert!(!format!("{:?}", proxy.log.lock().unwrap()).contains("old-2"));
    proxy.stop();
}

#[test]
fn paused_owner_sqlite() {
    paused_owner(Backend::Sqlite, "proxy::paused_owner_sqlite");
}

#[test]
fn paused_owner_postgres() {
    paused_owner(Backend::Postgres, "proxy::paused_owner_postgres");
}

#[test]
fn paused_owner_mysql() {
    paused_owner(Backend::MySql, "proxy::paused_owner_mysql");
}

/// Writers of the old generation keep sending while the new owner starts
/// sending: once a request of the newer token reached the upstream, no
/// older one is applied, none is even in flight upstream (the proxy let the
/// older ones finish first), and every 409 is a request the upstream never
/// saw.
fn mixed_tokens(backend: Backend, test: &str) {
    const OLD_WRITERS: usize = 6;
    const NEW_WRITERS: usize = 3;
    const NEW_REQUESTS: usize = 5;
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start(Duration::from_millis(5));
    let proxy = ProxyProc::start(&ts.url, &upstream.url());
    let (r, old, new) = two_generations(dir.path(), &ts.url, "proxy-mixed");
    let addr = proxy.addr;
    let replies = Arc::new(Mutex::new(Vec::new()));
    let old_applied = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for w in 0..OLD_WRITERS {
        let (r, replies, count) = (r.clone(), replies.clone(), old_applied.clone());
        threads.push(std::thread::spawn(move || {
            // Until refused: then this generation is over.
            for i in 0..2000 {
                let body = format!("old-{w}-{i}");
                let reply = post(addr, Some(&fencing(&r, old)), &body);
                let refused = reply.status == 409;
                if reply.status == 200 {
                    count.fetch_add(1, Ordering::SeqCst);
                }
                replies.lock().unwrap().push((body, reply));
                if refused {
                    return;
                }
            }
            panic!("old writer {w} was never refused");
        }));
    }
    // The new owner starts while the old writers are busy.
    wait_until(
        WAIT,
        || old_applied.load(Ordering::SeqCst) >= OLD_WRITERS * 3,
        || "the old writers got nothing through".into(),
    );
    for w in 0..NEW_WRITERS {
        let (r, replies) = (r.clone(), replies.clone());
        threads.push(std::thread::spawn(move || {
            for i in 0..NEW_REQUESTS {
                let body = format!("new-{w}-{i}");
                let reply = post(addr, Some(&fencing(&r, new)), &body);
                replies.lock().unwrap().push((body, reply));
            }
        }));
    }
    for t in threads {
        t.join().expect("writer thread");
    }
    let seen = upstream.seen();
    let first_new = seen
        .iter()
        .position(|s| matches!(s, Seen::Arrived(t, _) if *t == fencing(&r, new)))
        .expect("the new owner's requests reached the upstream");
    let old_header = fencing(&r, old);
    let late: Vec<_> = seen[first_new..]
        .iter()
        .filter(|s| matches!(s, Seen::Arrived(t, _) | Seen::Applied(t, _) if *t == old_header))
        .collect();
    assert!(
        late.is_empty(),
        "old-token requests at the upstream after the newer token arrived: {late:?}"
    );
    let applied = upstream.applied();
    let replies = replies.lock().unwrap();
    for (body, reply) in replies.iter() {
        match reply.status {
            200 => assert!(applied.contains(body), "{body} answered 200, never applied"),
            409 => {
                assert!(!applied.contains(body), "{body} refused, yet applied");
                assert!(body.starts_with("old-"), "{body} refused: {reply:?}");
                assert_eq!(reply.json()["accepted_token"], new);
            }
            other => panic!("{body}: unexpected status {other}: {reply:?}"),
        }
    }
    let news = replies
        .iter()
        .filter(|(b, _)| b.starts_with("new-"))
        .count();
    assert_eq!(news, NEW_WRITERS * NEW_REQUESTS);
    assert_eq!(
        applied.len(),
        replies.iter().filter(|(_, r)| r.status == 200).count()
    );
    let refusals = stale_of(dir.path(), &ts.url, &r);
    assert_eq!(
        refusals.len(),
        replies.iter().filter(|(_, r)| r.status == 409).count(),
        "every refusal is recorded"
    );
}

#[test]
fn mixed_tokens_sqlite() {
    mixed_tokens(Backend::Sqlite, "proxy::mixed_tokens_sqlite");
}

#[test]
fn mixed_tokens_postgres() {
    mixed_tokens(Backend::Postgres, "proxy::mixed_tokens_postgres");
}

#[test]
fn mixed_tokens_mysql() {
    mixed_tokens(Backend::MySql, "proxy::mixed_tokens_mysql");
}

/// Two proxies on one store agree: once proxy A accepted N+1, proxy B
/// (which accepted N before) refuses N. Forged tokens are refused by both.
fn two_proxies(backend: Backend, test: &str) {
    let Some(ts) = TestStore::new(backend, test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start(Duration::ZERO);
    let a = ProxyProc::start(&ts.url, &upstream.url());
    let b = ProxyProc::start(&ts.url, &upstream.url());
    let (r, old, new) = two_generations(dir.path(), &ts.url, "proxy-two");
    assert_eq!(post(b.addr, Some(&fencing(&r, old)), "b-old-1").status, 200);
    assert_eq!(post(a.addr, Some(&fencing(&r, new)), "a-new").status, 200);
    let reply = post(b.addr, Some(&fencing(&r, old)), "b-old-2");
    assert_eq!(reply.status, 409, "{reply:?}");
    assert_eq!(reply.json()["reason"], "stale");
    assert_eq!(reply.json()["accepted_token"], new);
    assert_eq!(post(b.addr, Some(&fencing(&r, new)), "b-new").status, 200);
    let reply = post(a.addr, Some(&fencing(&r, old)), "a-old");
    assert_eq!(reply.status, 409, "{reply:?}");
    assert_eq!(upstream.applied(), ["b-old-1", "a-new", "b-new"]);
    // Above the fence: never issued.
    let reply = post(b.addr, Some(&fencing(&r, new + 1)), "b-forged");
    assert_eq!(reply.status, 409, "{reply:?}");
    assert_eq!(reply.json()["reason"], "forged");
    assert_eq!(reply.json()["accepted_token"], new);
    assert!(upstream.applied().len() == 3);
    b.wait_event("stale_write_rejected", |e| e["reason"] == "forged");
    a.stop();
    b.stop();
}

#[test]
fn two_proxies_sqlite() {
    two_proxies(Backend::Sqlite, "proxy::two_proxies_sqlite");
}

#[test]
fn two_proxies_postgres() {
    two_proxies(Backend::Postgres, "proxy::two_proxies_postgres");
}

#[test]
fn two_proxies_mysql() {
    two_proxies(Backend::MySql, "proxy::two_proxies_mysql");
}

/// What the proxy refuses before forwarding, and what it says when the
/// upstream is down: a forged token (never leased), a missing or malformed
/// header (400), an unreachable upstream (502).
#[test]
fn refusals_and_upstream_down_sqlite() {
    let ts = TestStore::new(Backend::Sqlite, "proxy::refusals").expect("sqlite");
    let dir = tempfile::tempdir().unwrap();
    let upstream = Upstream::start(Duration::ZERO);
    let proxy = ProxyProc::start(&ts.url, &upstream.url());

    let never = unique("proxy-never");
    let reply = post(proxy.addr, Some(&fencing(&never, 1)), "forged");
    assert_eq!(reply.status, 409, "{reply:?}");
    assert_eq!(reply.json()["reason"], "forged");
    assert!(
        reply.json()["message"]
            .as_str()
            .unwrap()
            .contains("never leased"),
        "{reply:?}"
    );
    let recs = stale_of(dir.path(), &ts.url, &never);
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(
        (recs[0]["stage"].as_str(), recs[0]["reason"].as_str()),
        (Some("proxy"), Some("forged"))
    );

    let reply = post(proxy.addr, None, "no-header");
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(reply.json()["error"], "missing_fencing_token");
    for bad in ["no-colon", "r:abc", "r:-1", ":1"] {
        let reply = post(proxy.addr, Some(bad), "malformed");
        assert_eq!(reply.status, 400, "{bad}: {reply:?}");
        assert_eq!(reply.json()["error"], "malformed_fencing_token", "{bad}");
    }
    assert!(upstream.applied().is_empty(), "{:?}", upstream.applied());

    // A valid token, an upstream nobody listens on.
    let down = ProxyProc::start(&ts.url, &format!("http://127.0.0.1:{}", free_port()));
    let r = unique("proxy-down");
    let (token, _) = acquire(dir.path(), &ts.url, &r).expect("fresh");
    let reply = post(down.addr, Some(&fencing(&r, token)), "lost");
    assert_eq!(reply.status, 502, "{reply:?}");
    assert_eq!(reply.json()["error"], "upstream_unreachable");
    let ev = down.wait_event("proxy_upstream_failed", |_| true);
    assert_eq!(ev["resource"], r.as_str());
    proxy.stop();
    down.stop();
}

/// A taken listen address is named at start-up (exit 1); so is a store that
/// cannot be reached.
#[test]
fn start_up_errors() {
    let ts = TestStore::new(Backend::Sqlite, "proxy::start_up_errors").expect("sqlite");
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = run(
        fencecron(dir.path())
            .args(["--store", &ts.url, "proxy", "--listen", &addr])
            .args(["--upstream", "http://127.0.0.1:9"]),
        None,
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot listen on {addr}")), "{err}");

    let nowhere = format!("postgres://fencecron@127.0.0.1:{}/none", free_port());
    let out = run(
        fencecron(dir.path())
            .args(["--store", &nowhere, "proxy", "--listen", "127.0.0.1:0"])
            .args(["--upstream", "http://127.0.0.1:9"]),
        None,
    );
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let out = run(
        fencecron(dir.path())
            .args(["--store", &ts.url, "proxy", "--listen", "127.0.0.1:0"])
            .args(["--upstream", "https://example.com"]),
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

/// A store that stops answering while the proxy runs: 503, nothing
/// forwarded, `store_unavailable` logged; once it answers again, requests
/// pass again.
#[test]
fn store_outage_postgres() {
    let Some(ts) = TestStore::new(Backend::Postgres, "proxy::store_outage_postgres") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (tcp, url) = common::proxy::Proxy::for_url(&ts.url, 5432);
    let upstream = Upstream::start(Duration::ZERO);
    let proxy = ProxyProc::start(&url, &upstream.url());
    let r = unique("proxy-outage");
    let (token, _) = acquire(dir.path(), &ts.url, &r).expect("fresh");
    assert_eq!(
        post(proxy.addr, Some(&fencing(&r, token)), "before").status,
        200
    );
    tcp.blackhole();
    let reply = post(proxy.addr, Some(&fencing(&r, token)), "during");
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(reply.json()["error"], "store_unavailable");
    proxy.wait_event("store_unavailable", |e| e["operation"] == "admit");
    tcp.restore();
    wait_until(
        WAIT,
        || post(proxy.addr, Some(&fencing(&r, token)), "after").status == 200,
        || "the proxy never recovered".into(),
    );
    assert_eq!(&upstream.applied()[..2], ["before", "after"]);
    assert!(!upstream.applied().contains(&"during".to_string()));
}

/// A job the daemon runs finds `FENCECRON_FENCING_HEADER`: its resource and
/// token, as the proxy's header takes them.
#[test]
fn daemon_job_gets_the_fencing_header() {
    use common::daemon::{job_toml, sh, write_config, Daemon, DaemonOpts};
    let ts = TestStore::new(Backend::Sqlite, "proxy::daemon_job_header").expect("sqlite");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("header");
    let job = unique("proxy-header");
    let script = format!(
        "printf '%s|%s|%s' \"$FENCECRON_FENCING_HEADER\" \"$FENCECRON_RESOURCE\" \"$FENCECRON_TOKEN\" > '{0}.tmp' && mv '{0}.tmp' '{0}'",
        out.display()
    );
    let config = write_config(
        dir.path(),
        "lease = \"5s\"",
        &[job_toml(
            &job,
            "* * * * * *",
            &sh(&script),
            "resource = \"a:b c\"",
        )],
    );
    let _daemon = Daemon::spawn(DaemonOpts::new("proxy-header-node", &config, &ts.url));
    wait_until(WAIT, || out.exists(), || "the job never ran".into());
    let text = std::fs::read_to_string(&out).unwrap();
    let parts: Vec<&str> = text.split('|').collect();
    assert_eq!(parts[1], "a:b c", "{text}");
    assert_eq!(parts[0], format!("{}:{}", parts[1], parts[2]), "{text}");
}

//! A small TCP proxy on 127.0.0.1 that can black-hole traffic, to make a
//! real database unreachable for one daemon without touching the server.
//!
//! [`Proxy::blackhole`] stops forwarding bytes in both directions but keeps
//! every socket open (also for connections accepted meanwhile), like a
//! network partition: callers see silence, not a reset. [`Proxy::restore`]
//! closes the black-holed connections and forwards new ones again.
//! [`Proxy::hold`] instead stops reading, so bytes wait in the kernel's
//! buffers, and [`Proxy::release`] delivers them: a store that answers late.
//! While holding, the proxy notes when it first saw a client's bytes
//! waiting on each connection ([`Proxy::held_requests`]): calls in flight,
//! unanswered.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

struct State {
    upstream: SocketAddr,
    blackholed: AtomicBool,
    held: AtomicBool,
    /// When, during the current hold, bytes from a client were first seen
    /// waiting to go to the server, by connection.
    held_requests: Mutex<Vec<(usize, SystemTime)>>,
    /// Numbers the connections.
    next_conn: AtomicUsize,
    /// The connections whose client's last bytes forwarded have had no
    /// bytes back from the server since: a call in flight.
    outstanding: Mutex<Vec<usize>>,
    stop: AtomicBool,
    /// Every socket of every connection still tracked (client side and
    /// upstream side), so `restore` and drop can close them.
    conns: Mutex<Vec<TcpStream>>,
}

/// A running proxy.
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on 127.0.0.1:0 and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let state = Arc::new(State {
            upstream,
            blackholed: AtomicBool::new(false),
            held: AtomicBool::new(false),
            held_requests: Mutex::new(Vec::new()),
            next_conn: AtomicUsize::new(0),
            outstanding: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            conns: Mutex::new(Vec::new()),
        });
        let accept = {
            let state = Arc::clone(&state);
            std::thread::Builder::new()
                .name("proxy-accept".into())
                .spawn(move || accept_loop(listener, &state))
                .expect("spawn proxy")
        };
        Proxy {
            addr,
            state,
            accept: Some(accept),
        }
    }

    /// A proxy for the server of a `postgres://` / `mysql://` URL, and the
    /// same URL pointing at the proxy.
    pub fn for_url(url: &str, default_port: u16) -> (Proxy, String) {
        let mut u = url::Url::parse(url).unwrap_or_else(|e| panic!("bad URL {url}: {e}"));
        let host = u.host_str().unwrap_or("127.0.0.1").to_string();
        let port = u.port().unwrap_or(default_port);
        let upstream = (host.as_str(), port)
            .to_socket_addrs()
            .unwrap_or_else(|e| panic!("cannot resolve {host}:{port}: {e}"))
            .next()
            .expect("an address");
        let proxy = Proxy::start(upstream);
        u.set_host(Some("127.0.0.1")).expect("set host");
        u.set_port(Some(proxy.addr.port())).expect("set port");
        (proxy, u.to_string())
    }

    /// Stops forwarding in both directions; sockets stay open.
    pub fn blackhole(&self) {
        self.state.blackholed.store(true, Ordering::SeqCst);
        eprintln!("[proxy {}] black-holed", self.addr);
    }

    /// Stops moving bytes, in both directions, without dropping any.
    pub fn hold(&self) {
        self.state.held_requests.lock().unwrap().clear();
        self.state.held.store(true, Ordering::SeqCst);
        eprintln!("[proxy {}] holding traffic", self.addr);
    }

    /// When, during the current hold, a client's bytes were first seen
    /// waiting for the server (a statement sent and unanswered), one time
    /// per connection whose bytes still wait, in the order seen.
    pub fn held_requests(&self) -> Vec<SystemTime> {
        let seen = self.state.held_requests.lock().unwrap();
        seen.iter().map(|(_, t)| *t).collect()
    }

    /// Whether every call forwarded so far has had bytes back (nothing
    /// held or in flight through the proxy).
    pub fn idle(&self) -> bool {
        self.state.outstanding.lock().unwrap().is_empty() && self.held_requests().is_empty()
    }

    /// Delivers what was held and forwards as usual again.
    pub fn release(&self) {
        self.state.held.store(false, Ordering::SeqCst);
        eprintln!("[proxy {}] released held traffic", self.addr);
    }

    /// Closes every black-holed connection and forwards new ones again.
    pub fn restore(&self) {
        let mut conns = self.state.conns.lock().unwrap();
        for s in conns.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.state.blackholed.store(false, Ordering::SeqCst);
        eprintln!("[proxy {}] restored", self.addr);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        for s in self.state.conns.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, state: &Arc<State>) {
    for client in listener.incoming() {
        if state.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(client) = client else { continue };
        let _ = client.set_nodelay(true);
        if state.blackholed.load(Ordering::SeqCst) {
            // Accepted by the kernel already; hold it open and silent.
            state.conns.lock().unwrap().push(client);
            continue;
        }
        let upstream = match TcpStream::connect_timeout(&state.upstream, Duration::from_secs(5)) {
            Ok(u) => u,
            Err(e) => {
                eprintln!("[proxy] cannot reach {}: {e}", state.upstream);
                continue;
            }
        };
        let _ = upstream.set_nodelay(true);
        let conn = state.next_conn.fetch_add(1, Ordering::SeqCst);
        {
            let mut conns = state.conns.lock().unwrap();
            for s in [&client, &upstream] {
                if let Ok(c) = s.try_clone() {
                    conns.push(c);
                }
            }
        }
        for (from, to, to_server) in [
            (client.try_clone(), upstream.try_clone(), true),
            (upstream.try_clone(), client.try_clone(), false),
        ] {
            let (Ok(from), Ok(to)) = (from, to) else {
                continue;
            };
            let state = Arc::clone(state);
            let _ = std::thread::Builder::new()
                .name("proxy-pump".into())
                .spawn(move || pump(from, to, conn, to_server, &state));
        }
    }
}

/// Copies `from` → `to` until either side closes; while black-holed, bytes
/// read are dropped; while held, bytes stay unread, and a client's
/// (`to_server`) are noted when first seen. Notes which connections have a
/// call in flight (forwarded to the server, nothing back yet).
fn pump(mut from: TcpStream, mut to: TcpStream, conn: usize, to_server: bool, state: &State) {
    let client = to_server.then_some(conn);
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 16 * 1024];
    loop {
        if state.stop.load(Ordering::SeqCst) {
            break;
        }
        if state.held.load(Ordering::SeqCst) {
            // Peek leaves the bytes where they are (waiting up to the read
            // timeout); the poll interval otherwise.
            let noted = |c| {
                state
                    .held_requests
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|(n, _)| *n == c)
            };
            let waiting = client
                .filter(|c| !noted(*c))
                .filter(|_| from.peek(&mut buf[..1]).is_ok_and(|n| n > 0));
            if let Some(c) = waiting {
                let mut seen = state.held_requests.lock().unwrap();
                if state.held.load(Ordering::SeqCst) && !seen.iter().any(|(n, _)| *n == c) {
                    seen.push((c, SystemTime::now()));
                }
            } else {
                std::thread::sleep(Duration::from_millis(10));
            }
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if state.blackholed.load(Ordering::SeqCst) {
                    continue;
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                // Forwarded: no longer held, in flight until bytes come back.
                let mut outstanding = state.outstanding.lock().unwrap();
                outstanding.retain(|c| *c != conn);
                if to_server {
                    outstanding.push(conn);
                    drop(outstanding);
                    state
                        .held_requests
                        .lock()
                        .unwrap()
                        .retain(|(c, _)| *c != conn);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => break,
        }
    }
    // A closed connection has nothing in flight.
    state.outstanding.lock().unwrap().retain(|c| *c != conn);
    state
        .held_requests
        .lock()
        .unwrap()
        .retain(|(c, _)| *c != conn);
    // While black-holed the connection must look alive: leave it open for
    // `restore` to close.
    if !state.blackholed.load(Ordering::SeqCst) {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    }
}

//! The fencing HTTP proxy (`fencecron proxy`): the write boundary for
//! destinations that do not check tokens themselves (another application's
//! HTTP API, a webhook).
//!
//! Every request carries `Fencing-Token: <resource>:<token>`. The proxy asks
//! the store ([`Store::admit`](crate::store::Fences::admit)) whether the token was issued for that
//! resource and is at least the highest one admitted for it so far (raising
//! that in the same statement), and forwards the request only then. The
//! highest admitted token lives in the store, so every proxy on one store
//! agrees. Refusals are recorded in the store and logged as
//! `stale_write_rejected` with stage `proxy`.
//!
//! Within one proxy, requests of one resource pass a gate
//! ([`tokio::sync::RwLock`], fair): requests with the resource's current
//! token share it, and a newer token takes it alone, so it is forwarded only
//! once every request with an older token has finished upstream (its
//! response fully sent back), and no older request is forwarded afterwards.
//! Across proxies only the store orders them: a request another proxy
//! admitted just before the newer token may still be on its way upstream.
//!
//! The gate is held across the forward, never a store row lock: a row lock
//! held for the length of an upstream call would, on SQLite, hold the whole
//! database's write lock and stop every lease renewal meanwhile.
//!
//! Architecture invariant: nothing is forwarded unchecked. A store that does
//! not answer means 503, never a pass.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{OwnedRwLockReadGuard, RwLock};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::events;
use crate::names::Name;
use crate::store::{AdmitOutcome, AdmitRequest, StaleRecord, Store, Token};

/// The request header that carries the token: `Fencing-Token:
/// <resource>:<token>`.
pub const HEADER: &str = "fencing-token";

/// The variable that hands a job its header value (`<resource>:<token>`).
pub const ENV_VAR: &str = "FENCECRON_FENCING_HEADER";

/// The value of the header for a resource and token.
pub fn header_value(resource: &str, token: Token) -> String {
    format!("{resource}:{token}")
}

/// A parsed `Fencing-Token` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencingToken {
    pub resource: Name,
    pub token: Token,
}

/// Parses a header value: the resource, a colon, the token in decimal. The
/// resource may itself contain colons (the last one separates the token);
/// it is validated as every resource name is. The error is one sentence.
pub fn parse_header(value: &[u8]) -> Result<FencingToken, String> {
    let text = std::str::from_utf8(value)
        .map_err(|_| "the Fencing-Token header is not UTF-8 text".to_string())?;
    let Some((resource, token)) = text.rsplit_once(':') else {
        return Err(format!(
            "the Fencing-Token header {text:?} has no colon; send RESOURCE:TOKEN, the value of ${ENV_VAR}"
        ));
    };
    let token = token.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "the token {token:?} in the Fencing-Token header is not a decimal number; send RESOURCE:TOKEN, the value of ${ENV_VAR}"
        ));
    }
    let token: Token = token
        .parse()
        .map_err(|_| format!("the token {token} in the Fencing-Token header is too large"))?;
    let resource = Name::parse("resource", resource.trim())
        .map_err(|e| format!("in the Fencing-Token header, {e}"))?;
    Ok(FencingToken { resource, token })
}

/// Where requests go: `http://host[:port][/prefix]`.
#[derive(Debug, Clone)]
pub struct Upstream {
    scheme: hyper::http::uri::Scheme,
    authority: hyper::http::uri::Authority,
    /// The path prefix, without a trailing slash (empty for none).
    prefix: String,
    /// The URL as given, for messages.
    shown: String,
}

impl Upstream {
    /// Parses `--upstream`. Only `http://`: the proxy runs beside its
    /// upstream (or behind a TLS terminator), not across a network.
    pub fn parse(url: &str) -> Result<Upstream, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("--upstream {url:?} is not a URL ({e}); give http://HOST:PORT"))?;
        let parts = uri.into_parts();
        match parts.scheme.as_ref().map(|s| s.as_str()) {
            Some("http") => {}
            Some(other) => {
                return Err(format!(
                    "--upstream {url:?}: the scheme {other} is not supported; give an http:// URL (put a TLS terminator in front of an https upstream)"
                ))
            }
            None => return Err(format!("--upstream {url:?} has no scheme; give http://HOST:PORT")),
        }
        let authority = parts
            .authority
            .ok_or_else(|| format!("--upstream {url:?} has no host; give http://HOST:PORT"))?;
        if authority.as_str().contains('@') {
            return Err("--upstream must not carry credentials; the proxy passes the client's Authorization header on".to_string());
        }
        let path = parts
            .path_and_query
            .map(|p| p.to_string())
            .unwrap_or_default();
        if path.contains('?') {
            return Err(format!("--upstream {url:?} has a query; give a base URL"));
        }
        Ok(Upstream {
            scheme: parts.scheme.unwrap_or(hyper::http::uri::Scheme::HTTP),
            authority,
            prefix: path.trim_end_matches('/').to_string(),
            shown: url.to_string(),
        })
    }

    /// The upstream URI for a request's path and query.
    fn uri_for(&self, req: &Uri) -> Result<Uri, hyper::http::Error> {
        let pq = req.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{pq}", self.prefix))
            .build()
    }
}

impl std::fmt::Display for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)
    }
}

/// The proxy's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub upstream: Upstream,
    /// The node id refusals are recorded with.
    pub node: String,
    /// How long the upstream may take to answer a request (its response
    /// head); then 504.
    pub upstream_timeout: Duration,
    /// How long in-flight requests may finish after a stop signal.
    pub drain: Duration,
}

/// The body of every response the proxy sends.
pub type Body = BoxBody<Bytes, hyper::Error>;

/// One resource's gate: the highest token this proxy admitted for it.
type Gate = Arc<RwLock<Token>>;

/// A running proxy's state, shared by its connections.
pub struct Proxy {
    store: Arc<dyn Store>,
    settings: Settings,
    client: Client<HttpConnector, Incoming>,
    /// One gate per resource this proxy admitted a request for (a few
    /// bytes each, for as long as the proxy runs).
    gates: Mutex<HashMap<Name, Gate>>,
}

/// Hop-by-hop headers (RFC 9110 section 7.6.1), never passed on; with
/// them, every header the `Connection` header names.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
    for name in named {
        headers.remove(name);
    }
}

/// A JSON answer of the proxy itself (never the upstream's).
fn answer(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut res = Response::new(
        Full::new(Bytes::from(format!("{body}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    res
}

/// 400: the request carries no usable token; nothing was forwarded.
fn bad_request(error: &str, message: &str) -> Response<Body> {
    answer(
        StatusCode::BAD_REQUEST,
        json!({"error": error, "message": format!("{message}; the request was not forwarded")}),
    )
}

/// 409: the token is stale or forged; the record is in the store.
fn refused(rec: &StaleRecord) -> Response<Body> {
    let message = match (rec.reason.as_str(), rec.accepted_token) {
        ("stale", Some(newer)) => format!(
            "stale fencing token: token {} for resource {:?} is older than token {newer}, which this resource's proxy already accepted; a newer owner holds the resource, so this request was not forwarded (do not retry it with the same token)",
            rec.token, rec.resource
        ),
        (_, Some(fence)) => format!(
            "forged fencing token: fencecron never issued token {} for resource {:?} (the newest it issued is {fence}); this request was not forwarded",
            rec.token, rec.resource
        ),
        _ => format!(
            "forged fencing token: resource {:?} was never leased, so fencecron never issued token {} for it; this request was not forwarded",
            rec.resource, rec.token
        ),
    };
    answer(
        StatusCode::CONFLICT,
        json!({
            "error": "fencing_token_refused",
            "reason": rec.reason,
            "resource": rec.resource,
            "token": rec.token,
            "accepted_token": rec.accepted_token,
            "operation_id": rec.operation_id,
            "message": message,
        }),
    )
}

impl Proxy {
    /// A proxy forwarding to `settings.upstream`, checking with `store`.
    pub fn new(store: Arc<dyn Store>, settings: Settings) -> Arc<Proxy> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.enforce_http(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Arc::new(Proxy {
            store,
            settings,
            client,
            gates: Mutex::new(HashMap::new()),
        })
    }

    fn gate(&self, resource: &Name) -> Gate {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates.entry(resource.clone()).or_default().clone()
    }

    /// Answers one request: 400 without a usable token, 409 refused, 503
    /// when the store cannot check it, else the upstream's answer (502 when
    /// it cannot be reached, 504 when it does not answer in time).
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let mut values = req.headers().get_all(HEADER).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            let none = req.headers().get(HEADER).is_none();
            return if none {
                bad_request(
                    "missing_fencing_token",
                    &format!("the request has no Fencing-Token header; a request without a token is not fenced, so send Fencing-Token: RESOURCE:TOKEN (the value of ${ENV_VAR})"),
                )
            } else {
                bad_request(
                    "malformed_fencing_token",
                    "the request has more than one Fencing-Token header; send exactly one",
                )
            };
        };
        let fencing = match parse_header(value.as_bytes()) {
            Ok(f) => f,
            Err(e) => return bad_request("malformed_fencing_token", &e),
        };
        if req.method() == Method::CONNECT {
            return answer(
                StatusCode::METHOD_NOT_ALLOWED,
                json!({"error": "connect_not_supported", "message": "the fencing proxy forwards requests to its upstream; CONNECT is not supported"}),
            );
        }
        let gate = self.gate(&fencing.resource);
        match self.pass(&gate, &fencing).await {
            Ok(guard) => self.forward(req, &fencing, guard).await,
            Err(res) => {
                self.forget_unused(&fencing.resource, gate);
                res
            }
        }
    }

    /// Waits at the resource's gate and has the store check the token; the
    /// guard keeps the gate until the response is passed on.
    async fn pass(
        &self,
        gate: &Gate,
        fencing: &FencingToken,
    ) -> Result<OwnedRwLockReadGuard<Token>, Response<Body>> {
        loop {
            let read = gate.clone().read_owned().await;
            if fencing.token <= *read {
                // The admitted token again (or an older one, which the store
                // refuses): shares the gate with its generation's requests.
                self.admit(fencing).await?;
                return Ok(read);
            }
            drop(read);
            let mut write = gate.clone().write_owned().await;
            if fencing.token < *write {
                // Another request raised it meanwhile: check as an old one.
                continue;
            }
            // Alone: every request with an older token has finished.
            self.admit(fencing).await?;
            *write = fencing.token;
            return Ok(write.downgrade());
        }
    }

    /// Drops the gate of a resource this proxy never admitted anything for
    /// once nobody waits at it, so requests with made-up resource names
    /// leave nothing behind.
    fn forget_unused(&self, resource: &Name, gate: Gate) {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        // The map's reference and this one: no other request holds it.
        if Arc::strong_count(&gate) == 2 && gate.try_read().is_ok_and(|t| *t == Token::default()) {
            gates.remove(resource);
        }
    }

    /// The store's check; `Err` is the answer to send instead of
    /// forwarding.
    async fn admit(&self, fencing: &FencingToken) -> Result<(), Response<Body>> {
        let req = AdmitRequest {
            resource: &fencing.resource,
            token: fencing.token,
            node: &self.settings.node,
            operation_id: uuid::Uuid::new_v4(),
        };
        let admitted = self.store.admit(&req).await;
        if admitted.is_ok() {
            // The proxy's only calls: an answer ends its outage.
            events::store_answered_all(self.store.outages());
        }
        match admitted {
            Ok(AdmitOutcome::Admitted) => Ok(()),
            Ok(AdmitOutcome::Refused(rec)) => {
                events::stale_write_rejected(&rec);
                Err(refused(&rec))
            }
            Err(e) => {
                events::store_unavailable(
                    self.store.outages(),
                    "admit",
                    None,
                    &e.to_string(),
                    None,
                );
                Err(answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    json!({
                        "error": "store_unavailable",
                        "message": format!("the fencecron store could not check the fencing token ({e}); the request was not forwarded, retry later"),
                    }),
                ))
            }
        }
    }

    /// Sends the request upstream, holding `guard` (this resource's gate)
    /// until the upstream's response has been passed on in full.
    async fn forward(
        &self,
        req: Request<Incoming>,
        fencing: &FencingToken,
        guard: OwnedRwLockReadGuard<Token>,
    ) -> Response<Body> {
        let (mut parts, body) = req.into_parts();
        parts.uri = match self.settings.upstream.uri_for(&parts.uri) {
            Ok(uri) => uri,
            Err(e) => return bad_request("bad_request_target", &format!("{e}")),
        };
        strip_hop_by_hop(&mut parts.headers);
        // The client connection sets the upstream's own Host.
        parts.headers.remove(HOST);
        let sent = self.client.request(Request::from_parts(parts, body));
        let upstream = &self.settings.upstream;
        let failed = match tokio::time::timeout(self.settings.upstream_timeout, sent).await {
            Ok(Ok(res)) => Ok(res),
            Ok(Err(e)) => {
                let detail = error_chain(&e);
                let message = format!("the upstream {upstream} did not answer ({detail}); the request may or may not have reached it");
                Err((
                    StatusCode::BAD_GATEWAY,
                    "upstream_unreachable",
                    detail,
                    message,
                ))
            }
            Err(_) => {
                let detail = format!(
                    "no response within {}",
                    humantime::format_duration(self.settings.upstream_timeout)
                );
                let message = format!("the upstream {upstream} gave {detail}; the request may or may not have been applied");
                Err((
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream_timeout",
                    detail,
                    message,
                ))
            }
        };
        let res = match failed {
            Ok(res) => res,
            Err((status, error, detail, message)) => {
                events::proxy_upstream_failed(
                    fencing.resource.as_str(),
                    fencing.token,
                    &upstream.to_string(),
                    &detail,
                );
                return answer(status, json!({ "error": error, "message": message }));
            }
        };
        let (mut parts, body) = res.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        // The gate is released when the body is done (or dropped).
        let body = body
            .map_frame(move |frame| {
                let _held = &guard;
                frame
            })
            .boxed();
        Response::from_parts(parts, body)
    }
}

/// An error and its sources, for one line of text.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Binds the listen address; the error names it.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).await.map_err(|e| {
        format!("cannot listen on {addr} for the fencing proxy ({e}); choose a free address with --listen")
    })
}

/// Serves `listener` until `stop`; then stops accepting, lets in-flight
/// requests finish for up to `settings.drain`, and returns how many
/// connections were still open when it gave up.
pub async fn serve(proxy: Arc<Proxy>, listener: TcpListener, stop: CancellationToken) -> usize {
    let tracker = TaskTracker::new();
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                // Out of descriptors and the like: try again shortly.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (proxy, stop) = (proxy.clone(), stop.clone());
        tracker.spawn(async move {
            let service = service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, std::convert::Infallible>(proxy.handle(req).await) }
            });
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.cancelled() => {
                    // Finish the request in progress, then close.
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    drop(listener);
    tracker.close();
    let open = tracker.len();
    events::proxy_stopping(open);
    match tokio::time::timeout(proxy.settings.drain, tracker.wait()).await {
        Ok(()) => 0,
        Err(_) => tracker.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(s: &str) -> Result<(String, Token), String> {
        parse_header(s.as_bytes()).map(|f| (f.resource.to_string(), f.token))
    }

    #[test]
    fn header_parsing() {
        assert_eq!(parsed("reports:7"), Ok(("reports".into(), Token::new(7))));
        // The last colon separates the token: resources may contain colons.
        assert_eq!(
            parsed("statement:monthly:4294967297"),
            Ok(("statement:monthly".into(), Token::new(4_294_967_297)))
        );
        assert_eq!(parsed(" r:1 "), Ok(("r".into(), Token::new(1))));
        assert_eq!(parsed("café:2"), Ok(("café".into(), Token::new(2))));
        assert_eq!(
            parsed(&header_value("a b:c", Token::new(9))),
            Ok(("a b:c".into(), Token::new(9)))
        );
        assert!(parsed("reports").unwrap_err().contains("no colon"));
        assert!(parsed("reports:").unwrap_err().contains("not a decimal"));
        assert!(parsed("reports:-1").unwrap_err().contains("not a decimal"));
        assert!(parsed("reports:+1").unwrap_err().contains("not a decimal"));
        assert!(parsed("reports:1x").unwrap_err().contains("not a decimal"));
        assert!(parsed("reports:99999999999999999999")
            .unwrap_err()
            .contains("too large"));
        assert!(parsed(":5").unwrap_err().contains("empty"));
        assert!(parsed(&format!("{}:5", "r".repeat(201)))
            .unwrap_err()
            .contains("at most 200"));
        assert!(parse_header(b"r\xff:1").unwrap_err().contains("UTF-8"));
    }

    #[test]
    fn upstream_urls() {
        let u = Upstream::parse("http://127.0.0.1:8080/api/").unwrap();
        let uri = u.uri_for(&"/v1/items?x=1".parse().unwrap()).unwrap();
        assert_eq!(uri.to_string(), "http://127.0.0.1:8080/api/v1/items?x=1");
        let u = Upstream::parse("http://localhost:9").unwrap();
        assert_eq!(
            u.uri_for(&"/".parse().unwrap()).unwrap().to_string(),
            "http://localhost:9/"
        );
        assert!(Upstream::parse("https://x").unwrap_err().contains("https"));
        assert!(Upstream::parse("localhost:9").is_err());
        assert!(Upstream::parse("http://u:p@x:1")
            .unwrap_err()
            .contains("credentials"));
        assert!(Upstream::parse("http://x:1/?a=b")
            .unwrap_err()
            .contains("query"));
    }

    #[test]
    fn hop_by_hop_headers_stay_behind() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert(HEADER, HeaderValue::from_static("r:1"));
        h.insert("authorization", HeaderValue::from_static("Bearer x"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["authorization", HEADER]);
    }
}

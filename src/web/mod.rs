//! The web view on the `[http]` listener: `/` (jobs, live nodes, stale
//! records and lease losses), `/jobs/NAME` (a job's definition, runs and,
//! with `[http] token_file`, its actions) and `/runs/ID` (one run and its
//! output tail). Server-rendered HTML through [`html::Html`], which escapes
//! every value; no script, no external asset, refreshed by `<meta
//! http-equiv="refresh">`.
//!
//! A page view reads the store at most once per table, each read bounded
//! in rows ([`PAGE_RUNS`], [`JOB_RUNS`], twice [`STALE_SHOWN`] of the last
//! [`STALE_WINDOW`]); drift comes from what the heartbeat last computed
//! ([`drift_seen`]). `/metrics` never comes here.
//!
//! Actions (`POST /jobs/NAME/trigger|pause|resume`) need a token of the
//! token file ([`tokens`]): `Authorization: Bearer TOKEN` or the form's
//! `token` field. A form must also carry this process's CSRF value (a
//! hidden field of the page) and come from the same origin (`Origin`,
//! `Sec-Fetch-Site`); a request with the bearer header needs no CSRF value
//! (a browser sends no such header cross-site without a preflight, which
//! this server never allows). The store calls are the CLI's
//! (`request_trigger`, `pause`, `resume`), recorded as asked by `web:NAME`.

mod html;
pub mod tokens;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use chrono::Utc;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};

use crate::config::Job;
use crate::domain::{RunState, TriggerState};
use crate::fleet::{Drift, JobFacts};
use crate::store::{
    millis, NodeInfo, PauseInfo, RunInfo, RunQuery, StaleKind, StaleRecord, Store, StoreTime,
    TriggerInfo,
};
use html::{decode_segment, Html};
pub use tokens::Tokens;

/// The newest runs `/` reads (all jobs): a job's last outcome and last
/// success are found among them.
pub const PAGE_RUNS: u32 = 500;
/// The runs `/jobs/NAME` lists.
pub const JOB_RUNS: u32 = 50;
/// How far back `/` reads stale-owner records and lease losses...
pub const STALE_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// ...and how many of the newest of each it shows (it reads twice as many
/// of both kinds together).
pub const STALE_SHOWN: u32 = 20;
/// How often the pages refresh themselves (seconds).
pub const REFRESH_SECS: u32 = 10;
/// The largest form an action accepts.
const MAX_FORM: usize = 16 * 1024;

/// What the web view serves from.
pub struct Web {
    store: Arc<dyn Store>,
    jobs: RwLock<Arc<Vec<Arc<Job>>>>,
    tokens: Option<Tokens>,
    csrf: String,
    node: String,
    /// The listener is on a loopback address: a page answers only a
    /// loopback `Host` (see [`host_allowed`]).
    loopback: bool,
}

impl Web {
    /// The view of `node`'s jobs, served on `listen`; with `tokens`, its
    /// actions too.
    pub fn new(
        store: Arc<dyn Store>,
        jobs: Vec<Arc<Job>>,
        tokens: Option<Tokens>,
        node: String,
        listen: std::net::SocketAddr,
    ) -> Arc<Web> {
        let csrf = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        Arc::new(Web {
            store,
            jobs: RwLock::new(Arc::new(jobs)),
            tokens,
            csrf,
            node,
            loopback: listen.ip().is_loopback(),
        })
    }

    /// The job list after a reload (SIGHUP).
    pub fn set_jobs(&self, jobs: Vec<Arc<Job>>) {
        if let Ok(mut j) = self.jobs.write() {
            *j = Arc::new(jobs);
        }
    }

    fn jobs(&self) -> Arc<Vec<Arc<Job>>> {
        self.jobs
            .read()
            .map(|j| j.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }
}

/// The drift among the live nodes as this node's heartbeat last computed
/// it (the page shows it without reading every node's definitions).
static DRIFT: Mutex<BTreeMap<String, Drift>> = Mutex::new(BTreeMap::new());

/// The heartbeat's latest drift, for the pages.
pub fn drift_seen(drift: &BTreeMap<String, Drift>) {
    if let Ok(mut d) = DRIFT.lock() {
        d.clone_from(drift);
    }
}

fn drift() -> BTreeMap<String, Drift> {
    DRIFT.lock().map(|d| d.clone()).unwrap_or_default()
}

type Answer = Response<Full<Bytes>>;

fn respond(status: StatusCode, kind: &'static str, body: String) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    r
}

fn plain(status: StatusCode, text: String) -> Answer {
    respond(status, "text/plain; charset=utf-8", text + "\n")
}

fn page(status: StatusCode, body: String) -> Answer {
    respond(status, "text/html; charset=utf-8", body)
}

/// Whether a page answers a request for `host` (its `Host` header): on a
/// loopback listener only a loopback name (`127.0.0.1`, `[::1]`,
/// `localhost`, any port), so that a page of another site whose name was
/// made to resolve to 127.0.0.1 (DNS rebinding) cannot read the view
/// through the browser of someone on this host.
fn host_allowed(loopback: bool, host: Option<&str>) -> bool {
    if !loopback {
        return true;
    }
    let Some(host) = host else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Answers a request the metrics endpoints did not take.
pub async fn answer(web: &Web, req: Request<hyper::body::Incoming>) -> Answer {
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    let page = matches!(
        parts.as_slice(),
        [""] | ["jobs", _] | ["runs", _] | ["jobs", _, _]
    );
    if !page {
        return not_found();
    }
    let host = req
        .headers()
        .get(hyper::header::HOST)
        .and_then(|h| h.to_str().ok());
    if !host_allowed(web.loopback, host) {
        return plain(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "refused: Host {:?} is not a loopback name, and this listener is on loopback (where another site could reach it by DNS rebinding); open http://127.0.0.1:PORT/, or have the proxy send Host 127.0.0.1:PORT",
                host.unwrap_or("")
            ),
        );
    }
    let method = req.method().clone();
    let get = method == Method::GET || method == Method::HEAD;
    let result = match (get, method == Method::POST, parts.as_slice()) {
        (true, _, [""]) => index(web).await,
        (true, _, ["jobs", name]) => match decode_segment(name) {
            Some(name) => job_page(web, &name).await,
            None => Ok(not_found()),
        },
        (true, _, ["runs", id]) => run_page(web, id).await,
        (_, true, ["jobs", name, action]) => match decode_segment(name) {
            Some(name) => act(web, req, &name, action).await,
            None => Ok(not_found()),
        },
        (false, _, [""] | ["jobs", _] | ["runs", _]) => Ok(plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "this page answers GET only".into(),
        )),
        _ => Ok(not_found()),
    };
    result.unwrap_or_else(|e| {
        plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the store did not answer ({e}); the page is shown again once it does"),
        )
    })
}

fn not_found() -> Answer {
    plain(
        StatusCode::NOT_FOUND,
        "not found; try /, /jobs/NAME, /runs/ID, /metrics, /livez or /readyz".into(),
    )
}

type Result<T> = std::result::Result<T, crate::store::StoreError>;

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#111;background:#fff}\
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.4em 0 .4em}\
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.25em .6em;border-bottom:1px solid #ddd;vertical-align:top}\
th{background:#f3f3f3}.muted{color:#666}.ok{color:#17692a}.bad{color:#b00020;font-weight:600}.warn{color:#8a5a00;font-weight:600}\
pre{background:#f6f6f6;padding:.8em;overflow:auto;white-space:pre-wrap}form{display:inline-block;margin:.3em 1em .3em 0;padding:.5em;border:1px solid #ddd}\
a{color:#0645ad}";

/// The page's head and header; `refresh` seconds, or none.
fn head(h: &mut Html, web: &Web, title: &str, refresh: bool) {
    h.raw("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    if refresh {
        h.raw("<meta http-equiv=\"refresh\" content=\"")
            .show(REFRESH_SECS)
            .raw("\">");
    }
    h.raw("<meta name=\"viewport\" content=\"width=device-width\"><title>")
        .text(title)
        .raw(" · fencecron</title><style>")
        .raw(STYLE)
        .raw("</style></head><body><h1><a href=\"/\">fencecron</a> · ")
        .text(title)
        .raw("</h1><p class=\"muted\">served by node ")
        .text(&web.node)
        .raw(" at ")
        .text(&crate::store::rfc3339(Utc::now()));
    if refresh {
        h.raw(" · refreshes every ").show(REFRESH_SECS).raw(" s");
    }
    h.raw(" · <a href=\"/metrics\">metrics</a></p>");
}

fn ago(now: StoreTime, t: StoreTime) -> String {
    crate::output::relative(now.to_utc(), t.to_utc())
}

fn outcome_class(o: &RunState) -> &'static str {
    match o.as_str() {
        "succeeded" => "ok",
        "running" => "",
        _ => "bad",
    }
}

/// `/`.
async fn index(web: &Web) -> Result<Answer> {
    let store = web.store.as_ref();
    let now = store.now().await?;
    let runs = store
        .runs(&RunQuery {
            limit: PAGE_RUNS,
            ..RunQuery::default()
        })
        .await?;
    let pauses = store.pauses(now).await?;
    let nodes = store.nodes().await?;
    let stale = store
        .latest_stale(StoreTime(now.0 - millis(STALE_WINDOW)), STALE_SHOWN * 2)
        .await?;
    let drift = drift();
    let jobs = web.jobs();

    let mut h = Html::default();
    head(&mut h, web, "fleet", true);
    h.raw("<h2>Jobs</h2><table><tr><th>job</th><th>schedule</th><th>next (UTC)</th><th>next (job's zone)</th><th>state</th><th>last outcome</th><th>last success</th><th>runs</th></tr>");
    let live: Vec<&NodeInfo> = nodes.iter().filter(|n| n.live(now)).collect();
    let live_since = live.iter().map(|n| n.started_at.to_utc()).min();
    for job in jobs.iter() {
        let name = job.name.as_str();
        let mine: Vec<&RunInfo> = runs.iter().filter(|r| r.job == name).collect();
        let running = mine.iter().find(|r| r.outcome == RunState::Running);
        let last = mine.iter().find(|r| r.outcome != RunState::Running);
        let success = mine.iter().find(|r| r.outcome.as_str() == "succeeded");
        let paused = pauses.iter().find(|p| p.job == name);
        let next = job.schedule.next_after(Utc::now());
        h.raw("<tr><td>").link("/jobs/", name, name).raw("</td>");
        h.raw("<td><code>")
            .text(job.schedule.expr())
            .raw("</code> ")
            .text(job.schedule.tz().name())
            .raw("</td>");
        h.cell(&next.map_or("-".into(), crate::store::rfc3339));
        h.cell(&next.map_or("-".into(), |t| {
            crate::commands::local_time(t, job.schedule.tz())
        }));
        h.raw("<td>");
        state(&mut h, now, running.copied(), paused, || {
            let facts = JobFacts {
                live_since,
                paused: paused.is_some(),
                running: running.is_some(),
                runs: mine
                    .iter()
                    .take(2)
                    .map(|r| (r.scheduled_at.map(StoreTime::to_utc), r.started_at.to_utc()))
                    .collect(),
            };
            crate::fleet::overdue(&job.schedule, now.to_utc(), &facts)
        });
        if let Some(d) = drift.get(name) {
            h.raw("<br><span class=\"warn\">config drift: ")
                .text(&d.with_text())
                .raw("</span>");
        }
        h.raw("</td>");
        match last {
            Some(r) => {
                h.raw("<td class=\"")
                    .raw(outcome_class(&r.outcome))
                    .raw("\">")
                    .link("/runs/", r.owner_id.as_str(), r.outcome.as_str())
                    .raw(" <span class=\"muted\">")
                    .text(&ago(now, r.finished_at.unwrap_or(r.started_at)))
                    .raw("</span></td>");
            }
            None => {
                h.cell("-");
            }
        }
        h.cell(&success.map_or("-".into(), |r| {
            ago(now, r.finished_at.unwrap_or(r.started_at))
        }));
        h.raw("<td>").link("/jobs/", name, "runs").raw("</td></tr>");
    }
    h.raw("</table>");
    if jobs.is_empty() {
        h.raw("<p class=\"muted\">this node schedules no job</p>");
    }

    h.raw("<h2>Live nodes</h2><table><tr><th>node</th><th>host</th><th>version</th><th>state</th><th>running</th><th>config</th><th>started</th><th>last seen</th><th>drift</th></tr>");
    for n in &live {
        let in_drift: Vec<&str> = drift
            .values()
            .filter(|d| {
                d.nodes_without.contains(&n.node)
                    || d.nodes_with.values().any(|v| v.contains(&n.node))
            })
            .map(|d| d.job.as_str())
            .collect();
        h.raw("<tr>");
        h.cell(&n.node).cell(&n.hostname).cell(&n.version);
        h.cell(n.shown_state(now));
        h.cell(&n.running.to_string());
        h.raw("<td><code>")
            .text(crate::fleet::short(&n.config_digest))
            .raw("</code></td>");
        h.cell(&ago(now, n.started_at)).cell(&ago(now, n.last_seen));
        if in_drift.is_empty() {
            h.raw("<td class=\"ok\">none</td>");
        } else {
            h.raw("<td class=\"warn\">")
                .text(&in_drift.join(", "))
                .raw("</td>");
        }
        h.raw("</tr>");
    }
    h.raw("</table>");
    let gone = nodes.len() - live.len();
    if gone > 0 {
        h.raw("<p class=\"muted\">")
            .show(gone)
            .raw(" node row(s) gone (see <code>fencecron nodes</code>)</p>");
    }

    // Newest first, both kinds: each table shows up to STALE_SHOWN.
    let (losses, rejected): (Vec<&StaleRecord>, Vec<&StaleRecord>) = stale
        .iter()
        .partition(|s| s.kind != StaleKind::WriteRejected);
    stale_table(&mut h, now, "Stale-owner records", &rejected);
    stale_table(&mut h, now, "Lease losses and takeovers", &losses);
    h.raw("</body></html>\n");
    Ok(page(StatusCode::OK, h.finish()))
}

/// A job's state: running, paused, overdue or idle.
fn state(
    h: &mut Html,
    now: StoreTime,
    running: Option<&RunInfo>,
    paused: Option<&PauseInfo>,
    overdue: impl FnOnce() -> Option<String>,
) {
    if let Some(r) = running {
        h.raw("running on ")
            .text(&r.node)
            .raw(" with token ")
            .show(r.token)
            .raw(" since ")
            .text(&ago(now, r.started_at));
    } else if let Some(p) = paused {
        h.raw("<span class=\"warn\">paused</span> by ")
            .text(&p.paused_by);
        match p.until {
            Some(u) => h.raw(" until ").text(&u.rfc3339()),
            None => h.raw(" until resumed"),
        };
        if let Some(note) = &p.note {
            h.raw(": ").text(note);
        }
    } else if let Some(reason) = overdue() {
        h.raw("<span class=\"bad\">overdue</span>: ").text(&reason);
    } else {
        h.raw("idle");
    }
}

fn stale_table(h: &mut Html, now: StoreTime, title: &'static str, rows: &[&StaleRecord]) {
    h.raw("<h2>")
        .raw(title)
        .raw(" <span class=\"muted\">(last 24 h, newest ")
        .show(STALE_SHOWN)
        .raw(")</span></h2>");
    if rows.is_empty() {
        h.raw("<p class=\"muted\">none</p>");
        return;
    }
    h.raw("<table><tr><th>when</th><th>kind</th><th>reason</th><th>job</th><th>resource</th><th>key</th><th>node</th><th>token</th><th>accepted</th><th>stage</th></tr>");
    for s in rows.iter().take(STALE_SHOWN as usize) {
        h.raw("<tr>");
        h.cell(&ago(now, s.at))
            .cell(s.kind.as_str())
            .cell(s.reason.as_str())
            .cell(s.job.as_deref().unwrap_or("-"))
            .cell(&s.resource)
            .cell(s.key.as_deref().unwrap_or("-"))
            .cell(&s.node)
            .cell(&s.token.to_string())
            .cell(&s.accepted_token.map_or("-".into(), |t| t.to_string()))
            .cell(s.stage.as_str());
        h.raw("</tr>");
    }
    h.raw("</table>");
}

/// `/jobs/NAME`.
async fn job_page(web: &Web, name: &str) -> Result<Answer> {
    let jobs = web.jobs();
    let Some(job) = jobs.iter().find(|j| j.name.as_str() == name) else {
        return Ok(plain(
            StatusCode::NOT_FOUND,
            format!("this node has no job {name:?}; see / for its jobs"),
        ));
    };
    let store = web.store.as_ref();
    let now = store.now().await?;
    let runs = store
        .runs(&RunQuery {
            job: Some(name),
            limit: JOB_RUNS,
            ..RunQuery::default()
        })
        .await?;
    let pauses = store.pauses(now).await?;
    let paused = pauses.iter().find(|p| p.job == name);
    let actions = web.tokens.is_some();

    let mut h = Html::default();
    // A page with forms does not refresh itself (it would clear them).
    head(&mut h, web, name, !actions);
    h.raw("<p>state: ");
    state(
        &mut h,
        now,
        runs.iter().find(|r| r.outcome == RunState::Running),
        paused,
        || None,
    );
    let next = job.schedule.next_after(Utc::now());
    h.raw("<br>schedule: <code>")
        .text(job.schedule.expr())
        .raw("</code> ")
        .text(job.schedule.tz().name())
        .raw("; next: ")
        .text(&next.map_or("-".into(), crate::store::rfc3339))
        .raw(" (")
        .text(&next.map_or("-".into(), |t| {
            crate::commands::local_time(t, job.schedule.tz())
        }))
        .raw(")</p>");

    if actions {
        h.raw("<h2>Actions</h2>");
        action_form(&mut h, web, name, "trigger", "Run now", false);
        action_form(&mut h, web, name, "pause", "Pause", true);
        action_form(&mut h, web, name, "resume", "Resume", false);
        h.raw(" <a href=\"\">refresh</a>");
    }

    h.raw("<h2>Recent runs</h2>");
    if runs.is_empty() {
        h.raw("<p class=\"muted\">no run in the history</p>");
    } else {
        h.raw("<table><tr><th>started</th><th>trigger</th><th>node</th><th>token</th><th>outcome</th><th>exit</th><th>took</th></tr>");
        for r in &runs {
            h.raw("<tr>")
                .cell(&r.started_at.rfc3339())
                .cell(&r.trigger)
                .cell(&r.node)
                .cell(&r.token.to_string());
            h.raw("<td class=\"")
                .raw(outcome_class(&r.outcome))
                .raw("\">")
                .link("/runs/", r.owner_id.as_str(), r.outcome.as_str())
                .raw("</td>");
            h.cell(&exit_text(r));
            h.cell(&r.duration_ms.map_or("-".into(), |ms| format!("{ms} ms")));
            h.raw("</tr>");
        }
        h.raw("</table>");
    }
    let published = crate::fleet::published(std::slice::from_ref(job));
    if let Some((_, digest, definition)) = published.first() {
        h.raw("<h2>Definition <span class=\"muted\">(")
            .text(crate::fleet::short(digest))
            .raw(")</span></h2><pre>")
            .text(&pretty(definition))
            .raw("</pre>");
    }
    h.raw("</body></html>\n");
    Ok(page(StatusCode::OK, h.finish()))
}

fn pretty(json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(json)
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|_| json.to_string())
}

fn exit_text(r: &RunInfo) -> String {
    match (&r.signal, r.exit_code) {
        (Some(s), _) => s.clone(),
        (None, Some(c)) => c.to_string(),
        (None, None) => "-".into(),
    }
}

fn action_form(
    h: &mut Html,
    web: &Web,
    job: &str,
    action: &'static str,
    label: &'static str,
    pause: bool,
) {
    h.raw("<form method=\"post\" action=\"/jobs/")
        .text(&html::path_segment(job))
        .raw("/")
        .raw(action)
        .raw("\"><input type=\"hidden\" name=\"csrf\" value=\"")
        .text(&web.csrf)
        .raw("\">");
    if pause {
        h.raw("<label>note <input name=\"note\" maxlength=\"1000\"></label> <label>for <input name=\"for\" size=\"6\" placeholder=\"2h\"></label> ");
    }
    h.raw("<label>token <input type=\"password\" name=\"token\" autocomplete=\"off\" required></label> <button>")
        .raw(label)
        .raw("</button></form>");
}

/// `/runs/ID`: ID is the run's owner id.
async fn run_page(web: &Web, id: &str) -> Result<Answer> {
    let Ok(owner_id) = id.parse::<crate::store::OwnerId>() else {
        return Ok(plain(
            StatusCode::NOT_FOUND,
            "a run's id is its owner id, a UUID; follow a link of / or /jobs/NAME".into(),
        ));
    };
    let runs = web
        .store
        .runs(&RunQuery {
            owner_id: Some(owner_id),
            limit: 1,
            ..RunQuery::default()
        })
        .await?;
    let Some(r) = runs.first() else {
        return Ok(plain(
            StatusCode::NOT_FOUND,
            format!("no run {id} in the history (pruned, or never recorded)"),
        ));
    };
    let mut h = Html::default();
    head(
        &mut h,
        web,
        &format!("{} run {}", r.job, r.token),
        r.outcome == RunState::Running,
    );
    h.raw("<table>");
    let row = |h: &mut Html, k: &'static str, v: &str| {
        h.raw("<tr><th>").raw(k).raw("</th>").cell(v).raw("</tr>");
    };
    h.raw("<tr><th>job</th><td>")
        .link("/jobs/", &r.job, &r.job)
        .raw("</td></tr>");
    row(&mut h, "resource", &r.resource);
    row(&mut h, "outcome", r.outcome.as_str());
    row(&mut h, "exit", &exit_text(r));
    row(&mut h, "trigger", &r.trigger);
    row(&mut h, "node", &r.node);
    row(&mut h, "owner id", r.owner_id.as_str());
    row(&mut h, "token", &r.token.to_string());
    row(
        &mut h,
        "scheduled",
        &r.scheduled_at.map_or("-".into(), StoreTime::rfc3339),
    );
    row(&mut h, "started", &r.started_at.rfc3339());
    row(
        &mut h,
        "finished",
        &r.finished_at.map_or("-".into(), StoreTime::rfc3339),
    );
    row(
        &mut h,
        "took",
        &r.duration_ms.map_or("-".into(), |ms| format!("{ms} ms")),
    );
    h.raw("</table><h2>Output (tail)</h2><pre>")
        .text(r.output.as_deref().unwrap_or(""))
        .raw("</pre></body></html>\n");
    Ok(page(StatusCode::OK, h.finish()))
}

/// Why an action is refused before it reaches the store.
fn refuse(status: StatusCode, why: &str) -> Answer {
    let mut r = plain(status, why.to_string());
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert("www-authenticate", HeaderValue::from_static("Bearer"));
    }
    r
}

/// `POST /jobs/NAME/ACTION`.
async fn act(
    web: &Web,
    req: Request<hyper::body::Incoming>,
    job: &str,
    action: &str,
) -> Result<Answer> {
    let Some(tokens) = &web.tokens else {
        return Ok(refuse(
            StatusCode::FORBIDDEN,
            "actions are off: the web view is read-only without [http] token_file",
        ));
    };
    if !matches!(action, "trigger" | "pause" | "resume") {
        return Ok(not_found());
    }
    // Same origin only: a browser says where a form came from.
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if let Some(site) = header("sec-fetch-site") {
        if site != "same-origin" && site != "none" {
            return Ok(refuse(
                StatusCode::FORBIDDEN,
                "refused: the request came from another site (Sec-Fetch-Site); act from this server's own page",
            ));
        }
    }
    if let Some(origin) = header("origin") {
        let host = header("host").unwrap_or_default();
        if origin != format!("http://{host}") && origin != format!("https://{host}") {
            return Ok(refuse(
                StatusCode::FORBIDDEN,
                "refused: the request's Origin is not this server; act from this server's own page",
            ));
        }
    }
    let bearer =
        header("authorization").and_then(|a| a.strip_prefix("Bearer ").map(str::to_string));
    let body = match Limited::new(req.into_body(), MAX_FORM).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(refuse(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the form is larger than 16 KiB or was cut off; send a shorter note",
            ))
        }
    };
    let form: BTreeMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    let given = bearer.clone().or_else(|| form.get("token").cloned());
    let Some(who) = given.as_deref().and_then(|t| tokens.name_of(t)) else {
        return Ok(refuse(
            StatusCode::UNAUTHORIZED,
            "refused: no valid token; send `Authorization: Bearer TOKEN` or the form's token field with a token of [http] token_file",
        ));
    };
    if bearer.is_none() && form.get("csrf").map(String::as_str) != Some(web.csrf.as_str()) {
        return Ok(refuse(
            StatusCode::FORBIDDEN,
            "refused: the form's CSRF value is missing or from an older page (the daemon restarted); reload the page and send it again",
        ));
    }
    let jobs = web.jobs();
    let Some(job) = jobs.iter().find(|j| j.name.as_str() == job) else {
        return Ok(plain(
            StatusCode::NOT_FOUND,
            format!("this node has no job {job:?}; see / for its jobs"),
        ));
    };
    let name = job.name.as_str();
    let by = format!("web:{who}");
    let store = web.store.as_ref();
    let done = match action {
        "trigger" => {
            let request = TriggerInfo {
                id: uuid::Uuid::new_v4().to_string(),
                job: name.to_string(),
                requested_at: store.now().await?,
                requested_by: by,
                state: TriggerState::Pending,
                node: None,
                token: None,
                detail: None,
            };
            store.request_trigger(&request).await?;
            crate::events::trigger_requested(name, &request.id, &request.requested_by);
            format!(
                "trigger {} of {name} requested by {}",
                request.id, request.requested_by
            )
        }
        "pause" => {
            let note = form.get("note").map(|n| n.trim()).filter(|n| !n.is_empty());
            if let Some(n) = note {
                if n.len() > 1000 || n.chars().any(char::is_control) {
                    return Ok(refuse(
                        StatusCode::BAD_REQUEST,
                        "the note must be one line of at most 1000 bytes",
                    ));
                }
            }
            let for_ = match form.get("for").map(|f| f.trim()).filter(|f| !f.is_empty()) {
                None => None,
                Some(f) => match humantime::parse_duration(f) {
                    Ok(d) if !d.is_zero() => Some(d),
                    _ => {
                        return Ok(refuse(
                            StatusCode::BAD_REQUEST,
                            "`for` is not a duration such as 30m or 2h; leave it empty to pause until resumed",
                        ))
                    }
                },
            };
            let now = store.now().await?;
            let pause = PauseInfo {
                job: name.to_string(),
                note: note.map(str::to_string),
                since: now,
                until: for_.map(|d| StoreTime(now.0 + millis(d))),
                paused_by: by,
            };
            if let Some(p) = store.pause(&pause, false).await? {
                return Ok(refuse(
                    StatusCode::CONFLICT,
                    &format!(
                        "{name} is already paused by {}; resume it first",
                        p.paused_by
                    ),
                ));
            }
            crate::events::job_paused(&pause);
            format!("{name} paused fleet-wide by {}", pause.paused_by)
        }
        _ => {
            let was = store.resume(name).await?;
            crate::events::job_resumed(name, was);
            if was {
                format!("{name} resumed fleet-wide by {by}")
            } else {
                format!("{name} was not paused")
            }
        }
    };
    let mut r = plain(StatusCode::SEE_OTHER, done);
    if let Ok(loc) = HeaderValue::from_str(&format!("/jobs/{}", html::path_segment(name))) {
        r.headers_mut().insert(hyper::header::LOCATION, loc);
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{CallEnd, Notice, OpenOptions, StoreHook, StoreUrl};

    /// Every store operation, by name.
    #[derive(Default)]
    struct Calls(Mutex<Vec<&'static str>>);

    impl StoreHook for Calls {
        fn called(&self, operation: &'static str, _: Duration, _: CallEnd) {
            self.0.lock().unwrap().push(operation);
        }
        fn noticed(&self, _: Notice<'_>) {}
    }

    impl Calls {
        fn take(&self) -> Vec<&'static str> {
            let mut v = std::mem::take(&mut *self.0.lock().unwrap());
            v.sort_unstable();
            v
        }
    }

    #[test]
    fn a_loopback_listener_answers_loopback_hosts_only() {
        for ok in [
            "127.0.0.1:9464",
            "127.0.0.1",
            "localhost:9464",
            "LOCALHOST",
            "[::1]:9464",
            "[::1]",
            "127.0.0.2:1",
        ] {
            assert!(host_allowed(true, Some(ok)), "{ok}");
        }
        for refused in [
            "evil.example:9464",
            "evil.example",
            "10.0.0.1:9464",
            "[2001:db8::1]:80",
            "",
        ] {
            assert!(!host_allowed(true, Some(refused)), "{refused}");
        }
        assert!(!host_allowed(true, None));
        assert!(host_allowed(false, Some("fencecron.example")));
        assert!(host_allowed(false, None));
    }

    /// What a page view costs the store, whatever the fleet's size: one
    /// read per table (each bounded in rows by its query), and the store's
    /// clock; serving `/` every second is five small reads a second.
    #[tokio::test]
    async fn a_page_view_reads_each_table_once() {
        let dir = tempfile::tempdir().unwrap();
        let url =
            StoreUrl::parse(&format!("sqlite://{}", dir.path().join("s.db").display())).unwrap();
        let calls = Arc::new(Calls::default());
        let store = crate::store::open(
            &url,
            &OpenOptions {
                hook: Some(calls.clone()),
                ..OpenOptions::default()
            },
        )
        .unwrap();
        store.migrate().await.unwrap();
        let config = crate::config::parse(
            std::path::Path::new("jobs.toml"),
            "[[job]]\nname = \"a\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n\
             [[job]]\nname = \"b\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n",
        )
        .unwrap();
        let web = Web::new(
            store,
            config.jobs,
            None,
            "n".into(),
            "127.0.0.1:9464".parse().unwrap(),
        );
        calls.take();
        for _ in 0..3 {
            assert_eq!(index(&web).await.unwrap().status(), StatusCode::OK);
        }
        let mut want = Vec::new();
        for _ in 0..3 {
            want.extend(["latest_stale", "nodes", "now", "pauses", "runs"]);
        }
        want.sort_unstable();
        assert_eq!(calls.take(), want);
        assert_eq!(job_page(&web, "a").await.unwrap().status(), StatusCode::OK);
        assert_eq!(calls.take(), ["now", "pauses", "runs"]);
        assert_eq!(
            job_page(&web, "nope").await.unwrap().status(),
            StatusCode::NOT_FOUND
        );
        let missing = uuid::Uuid::new_v4().to_string();
        assert_eq!(
            run_page(&web, &missing).await.unwrap().status(),
            StatusCode::NOT_FOUND
        );
        assert_eq!(calls.take(), ["runs"]);
    }
}

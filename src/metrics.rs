//! Prometheus metrics and the health of the daemon, served over HTTP when
//! the config asks for it (`[http] listen = "127.0.0.1:9464"`).
//!
//! Every metric moves where its event is logged (`events.rs` calls in
//! here), so the log and the metrics say the same thing; scraping reads
//! atomics only and never queries the store. `/livez` answers from the
//! scheduler loop's last turn, `/readyz` from the last store call's result.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// How long the scheduler loop may go without turning before `/livez` says
/// 503: it turns at least every 30 s (its longest sleep), so three times
/// that.
pub const LIVE_WITHIN: Duration = Duration::from_secs(90);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabel {
    job: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobOutcome {
    job: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobReason {
    job: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Operation {
    operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Version {
    version: String,
    commit: String,
}

fn seconds_histogram() -> Histogram {
    // 1 ms .. about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The daemon's metrics (one set per process).
pub struct Metrics {
    registry: Registry,
    runs: Family<JobOutcome, Counter>,
    duration: Family<JobLabel, Histogram, fn() -> Histogram>,
    last_success: Family<JobLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    last_run: Family<JobLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    next_run: Family<JobLabel, Gauge>,
    paused: Family<JobLabel, Gauge>,
    nodes: Family<StateLabel, Gauge>,
    running: Family<JobLabel, Gauge>,
    skipped: Family<JobReason, Counter>,
    lateness: Histogram,
    lease_lost: Family<JobReason, Counter>,
    stale_writes: Family<JobLabel, Counter>,
    store_errors: Family<Operation, Counter>,
    store_latency: Family<Operation, Histogram, fn() -> Histogram>,
    drift_jobs: Gauge,
    /// Unix milliseconds of the scheduler loop's last turn (0: never).
    loop_turned_ms: AtomicI64,
    /// Whether the store answered the last call (and migrations are done).
    store_ok: AtomicBool,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("fencecron");
        let runs = Family::<JobOutcome, Counter>::default();
        registry.register(
            "job_runs",
            "Runs that ended, by job and outcome",
            runs.clone(),
        );
        let duration = Family::<JobLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            seconds_histogram,
        );
        registry.register_with_unit(
            "job_duration",
            "How long runs took, start to end",
            Unit::Seconds,
            duration.clone(),
        );
        let last_success = Family::<JobLabel, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register_with_unit(
            "job_last_success_timestamp",
            "When the job last ended with outcome succeeded (Unix time)",
            Unit::Seconds,
            last_success.clone(),
        );
        let last_run = Family::<JobLabel, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        registry.register_with_unit(
            "job_last_run_timestamp",
            "When a run of the job last ended, whatever its outcome (Unix time)",
            Unit::Seconds,
            last_run.clone(),
        );
        let next_run = Family::<JobLabel, Gauge>::default();
        registry.register_with_unit(
            "job_next_run_timestamp",
            "The job's next scheduled instant on this node (Unix time)",
            Unit::Seconds,
            next_run.clone(),
        );
        let paused = Family::<JobLabel, Gauge>::default();
        registry.register(
            "job_paused",
            "1 while the job is paused fleet-wide, as this node's last heartbeat saw it",
            paused.clone(),
        );
        let nodes = Family::<StateLabel, Gauge>::default();
        registry.register(
            "nodes",
            "Node rows by state, as this node's last heartbeat read them",
            nodes.clone(),
        );
        let running = Family::<JobLabel, Gauge>::default();
        registry.register(
            "job_running",
            "Runs in progress on this node",
            running.clone(),
        );
        let skipped = Family::<JobReason, Counter>::default();
        registry.register(
            "occurrences_skipped",
            "Occurrences not run here, by job and reason",
            skipped.clone(),
        );
        let lateness = seconds_histogram();
        registry.register_with_unit(
            "fire_lateness",
            "From a run's scheduled instant to its start",
            Unit::Seconds,
            lateness.clone(),
        );
        let lease_lost = Family::<JobReason, Counter>::default();
        registry.register(
            "lease_lost",
            "Leases lost during a run, by job and reason",
            lease_lost.clone(),
        );
        let stale_writes = Family::<JobLabel, Counter>::default();
        registry.register(
            "stale_writes_rejected",
            "Fenced writes rejected as stale, forged or from the wrong owner",
            stale_writes.clone(),
        );
        let store_errors = Family::<Operation, Counter>::default();
        registry.register(
            "store_errors",
            "Store calls that failed, by operation",
            store_errors.clone(),
        );
        let store_latency = Family::<Operation, Histogram, fn() -> Histogram>::new_with_constructor(
            seconds_histogram,
        );
        registry.register_with_unit(
            "store_latency",
            "How long store calls took, by operation",
            Unit::Seconds,
            store_latency.clone(),
        );
        let drift_jobs = Gauge::default();
        registry.register(
            "config_drift_jobs",
            "Jobs the live nodes disagree about (config_drift), as this node sees them",
            drift_jobs.clone(),
        );
        let build = Family::<Version, Gauge>::default();
        build
            .get_or_create(&Version {
                version: env!("CARGO_PKG_VERSION").to_string(),
                commit: env!("FENCECRON_COMMIT").to_string(),
            })
            .set(1);
        registry.register("build_info", "The running fencecron version", build);
        Metrics {
            registry,
            runs,
            duration,
            last_success,
            last_run,
            next_run,
            paused,
            nodes,
            running,
            skipped,
            lateness,
            lease_lost,
            stale_writes,
            store_errors,
            store_latency,
            drift_jobs,
            loop_turned_ms: AtomicI64::new(0),
            store_ok: AtomicBool::new(false),
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

fn job(job: &str) -> JobLabel {
    JobLabel {
        job: job.to_string(),
    }
}

/// The process's metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

impl Metrics {
    fn run_started(&self, name: &str, lateness: Option<Duration>) {
        self.running.get_or_create(&job(name)).inc();
        if let Some(l) = lateness {
            self.lateness.observe(l.as_secs_f64());
        }
    }

    fn run_finished(&self, name: &str, outcome: &str, took: Duration) {
        self.running.get_or_create(&job(name)).dec();
        self.runs
            .get_or_create(&JobOutcome {
                job: name.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
        self.duration
            .get_or_create(&job(name))
            .observe(took.as_secs_f64());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        self.last_run
            .get_or_create(&job(name))
            .set(now.as_secs_f64());
        if outcome == SUCCEEDED {
            self.last_success
                .get_or_create(&job(name))
                .set(now.as_secs_f64());
        }
    }

    fn jobs_configured(&self, names: &[&str], removed: &[&str]) {
        for name in removed {
            let l = job(name);
            self.next_run.remove(&l);
            self.paused.remove(&l);
        }
        for name in names {
            let l = job(name);
            for outcome in ZERO_OUTCOMES {
                let _ = self.runs.get_or_create(&JobOutcome {
                    job: name.to_string(),
                    outcome: outcome.to_string(),
                });
            }
            let _ = self.running.get_or_create(&l);
            let _ = self.stale_writes.get_or_create(&l);
            let _ = self.paused.get_or_create(&l);
            let _ = self.duration.get_or_create(&l);
        }
    }

    fn set_nodes<'a>(&self, states: impl IntoIterator<Item = &'a str>) {
        let mut counts: std::collections::BTreeMap<&str, i64> =
            NODE_STATES.iter().map(|s| (*s, 0)).collect();
        for s in states {
            *counts.entry(s).or_default() += 1;
        }
        for (state, n) in counts {
            self.nodes
                .get_or_create(&StateLabel {
                    state: state.to_string(),
                })
                .set(n);
        }
    }

    fn restore(&self, name: &str, last_success: Option<f64>, last_run: Option<f64>) {
        // A run that ended since the start is newer than the history read.
        let l = job(name);
        if let Some(t) = last_success {
            let g = self.last_success.get_or_create(&l);
            if g.get() < t {
                g.set(t);
            }
        }
        if let Some(t) = last_run {
            let g = self.last_run.get_or_create(&l);
            if g.get() < t {
                g.set(t);
            }
        }
    }

    fn occurrence_skipped(&self, name: &str, reason: &str) {
        self.skipped
            .get_or_create(&JobReason {
                job: name.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    fn store_call(&self, operation: &str, took: Duration, answered: bool) {
        let op = Operation {
            operation: operation.to_string(),
        };
        self.store_latency
            .get_or_create(&op)
            .observe(took.as_secs_f64());
        if !answered {
            self.store_errors.get_or_create(&op).inc();
        }
        self.store_ok.store(answered, Ordering::Relaxed);
    }
}

/// A run started; `lateness` is from its scheduled instant (none for `exec`).
pub fn run_started(name: &str, lateness: Option<Duration>) {
    global().run_started(name, lateness);
}

/// The outcome of a run that succeeded (`domain::RunOutcome::Succeeded`):
/// what moves `fencecron_job_last_success_timestamp_seconds`.
pub const SUCCEEDED: &str = "succeeded";

/// A run ended with `outcome` (as `job_finished` names it) after `took`.
pub fn run_finished(name: &str, outcome: &str, took: Duration) {
    global().run_finished(name, outcome, took);
}

pub fn occurrence_skipped(name: &str, reason: &str) {
    global().occurrence_skipped(name, reason);
}

pub fn lease_lost(name: &str, reason: &str) {
    global()
        .lease_lost
        .get_or_create(&JobReason {
            job: name.to_string(),
            reason: reason.to_string(),
        })
        .inc();
}

pub fn stale_write_rejected(name: Option<&str>) {
    global()
        .stale_writes
        .get_or_create(&job(name.unwrap_or("")))
        .inc();
}

/// The outcomes every configured job has a `fencecron_job_runs_total`
/// series for from the start, at zero: the ones "no success" and "too many
/// failures" alerts divide by.
pub const ZERO_OUTCOMES: [&str; 2] = [SUCCEEDED, "failed"];

/// The job set this node schedules (at start and on each reload): every
/// job gets its series at zero (runs by the outcomes of [`ZERO_OUTCOMES`],
/// running, stale writes, paused, duration), and a removed job's
/// next-run and paused gauges go.
pub fn jobs_configured(names: &[&str], removed: &[&str]) {
    global().jobs_configured(names, removed);
}

/// The job's last success and last run (Unix seconds) as the run history
/// says at start: a gauge already newer (a run ended since) stays.
pub fn restore(name: &str, last_success: Option<f64>, last_run: Option<f64>) {
    global().restore(name, last_success, last_run);
}

/// The job's next scheduled instant on this node.
pub fn next_run(name: &str, at: chrono::DateTime<chrono::Utc>) {
    global()
        .next_run
        .get_or_create(&job(name))
        .set(at.timestamp());
}

/// Whether the job is paused fleet-wide, as this node last saw it: the
/// pauses in force read by every heartbeat, an occurrence skipped as
/// paused, a pause or resume from this node's web view.
pub fn paused(name: &str, paused: bool) {
    global()
        .paused
        .get_or_create(&job(name))
        .set(i64::from(paused));
}

/// The node states `fencecron_nodes` always has a series for: the states
/// `NodeInfo::shown_state` shows (a stopped node shows as `gone`).
pub const NODE_STATES: [&str; 3] = ["running", "draining", "gone"];

/// The node rows by shown state (`NodeInfo::shown_state`), as a heartbeat
/// read them: every state of [`NODE_STATES`] is set, to zero if none.
pub fn nodes<'a>(states: impl IntoIterator<Item = &'a str>) {
    global().set_nodes(states);
}

/// How many jobs are in config drift (`config_drift`).
pub fn config_drift_jobs(n: usize) {
    global()
        .drift_jobs
        .set(i64::try_from(n).unwrap_or(i64::MAX));
}

/// A store call ended: its latency, and whether the store answered (the
/// store's hook, `events::store_hook`, with `[http]`).
pub fn store_call(operation: &str, took: Duration, answered: bool) {
    global().store_call(operation, took, answered);
}

/// What the metrics cost one occurrence that runs, on this machine: the
/// updates of its events and store calls (acquire, two renewals, release,
/// a held skip on this node's next instant), timed over `rounds` rounds on
/// a registry of its own. For `fencecron bench`.
pub fn cost_per_occurrence(rounds: u32) -> Duration {
    let m = Metrics::new();
    let names: Vec<String> = (0..50).map(|i| format!("bench-job-{i}")).collect();
    let started = std::time::Instant::now();
    for r in 0..rounds {
        let name = &names[r as usize % names.len()];
        m.store_call("acquire", Duration::from_micros(200), true);
        m.run_started(name, Some(Duration::from_millis(3)));
        m.store_call("renew", Duration::from_micros(200), true);
        m.store_call("renew", Duration::from_micros(200), true);
        m.run_finished(name, SUCCEEDED, Duration::from_millis(40));
        m.store_call("release", Duration::from_micros(200), true);
        m.occurrence_skipped(name, "held");
    }
    started.elapsed() / rounds.max(1)
}

/// The scheduler loop turned (for `/livez`).
pub fn loop_turned() {
    let now = chrono::Utc::now().timestamp_millis();
    global().loop_turned_ms.store(now, Ordering::Relaxed);
}

fn live() -> bool {
    let turned = global().loop_turned_ms.load(Ordering::Relaxed);
    turned > 0 && chrono::Utc::now().timestamp_millis() - turned < LIVE_WITHIN.as_millis() as i64
}

fn ready() -> bool {
    global().store_ok.load(Ordering::Relaxed)
}

/// Serves `/metrics`, `/livez` and `/readyz` on `listener` until `stop`;
/// with `web`, every other path is the web view's (`crate::web`).
pub async fn serve(
    listener: TcpListener,
    stop: CancellationToken,
    web: Option<std::sync::Arc<crate::web::Web>>,
) {
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(_) => continue,
            },
        };
        let stop = stop.clone();
        let web = web.clone();
        tokio::spawn(async move {
            let conn = http1::Builder::new().serve_connection(
                TokioIo::new(stream),
                service_fn(move |req| answer(req, web.clone())),
            );
            tokio::select! {
                _ = conn => {}
                _ = stop.cancelled() => {}
            }
        });
    }
}

/// Binds the endpoint (`[http] listen`); the error names the address.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr).await.map_err(|e| {
        format!("cannot listen on {addr} for [http] ({e}); choose a free address or remove [http]")
    })
}

async fn answer(
    req: Request<hyper::body::Incoming>,
    web: Option<std::sync::Arc<crate::web::Web>>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    // The metrics and health never reach the web view (nor the store).
    let own = matches!(req.uri().path(), "/metrics" | "/livez" | "/readyz");
    if let (false, Some(web)) = (own, web) {
        return Ok(crate::web::answer(&web, req).await);
    }
    let text = |status: StatusCode, body: String, kind: &'static str| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(kind),
        );
        Ok(r)
    };
    const PLAIN: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into(), PLAIN);
    }
    match req.uri().path() {
        "/metrics" => text(
            StatusCode::OK,
            global().render(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
        "/livez" if live() => text(StatusCode::OK, "ok\n".into(), PLAIN),
        "/livez" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the scheduler loop has not turned recently\n".into(),
            PLAIN,
        ),
        "/readyz" if ready() => text(StatusCode::OK, "ok\n".into(), PLAIN),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the store did not answer the last call\n".into(),
            PLAIN,
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; try /metrics, /livez or /readyz\n".into(),
            PLAIN,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Every configured job has its series before any run; the history's
    /// timestamps restore the gauges without going back past a newer run;
    /// every node state has a count.
    #[test]
    fn series_exist_from_the_start_and_restored_times_never_go_back() {
        let m = Metrics::new();
        m.jobs_configured(&["a\"b", "c"], &[]);
        let text = m.render();
        for series in [
            "fencecron_job_runs_total{job=\"c\",outcome=\"succeeded\"}",
            "fencecron_job_runs_total{job=\"c\",outcome=\"failed\"}",
            "fencecron_job_running{job=\"c\"}",
            "fencecron_job_paused{job=\"c\"}",
            "fencecron_stale_writes_rejected_total{job=\"c\"}",
            "fencecron_job_duration_seconds_count{job=\"c\"}",
        ] {
            assert_eq!(sample(&text, series), Some(0.0), "{series} in\n{text}");
        }
        assert!(text.contains("job=\"a\\\"b\""), "{text}");
        m.restore("c", Some(100.0), Some(200.0));
        m.run_finished("a\"b", SUCCEEDED, Duration::from_millis(1));
        let after_run = m.last_success.get_or_create(&job("a\"b")).get();
        m.restore("a\"b", Some(100.0), Some(100.0));
        let text = m.render();
        assert_eq!(
            sample(
                &text,
                "fencecron_job_last_success_timestamp_seconds{job=\"c\"}"
            ),
            Some(100.0)
        );
        assert_eq!(
            sample(&text, "fencecron_job_last_run_timestamp_seconds{job=\"c\"}"),
            Some(200.0)
        );
        assert_eq!(m.last_success.get_or_create(&job("a\"b")).get(), after_run);
        m.set_nodes(["running", "running", "gone"]);
        let text = m.render();
        assert_eq!(
            sample(&text, "fencecron_nodes{state=\"running\"}"),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, "fencecron_nodes{state=\"draining\"}"),
            Some(0.0)
        );
        m.jobs_configured(&["c"], &["a\"b"]);
        assert!(!m.render().contains("fencecron_job_paused{job=\"a"));
    }
}

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
        if outcome == SUCCEEDED {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            self.last_success
                .get_or_create(&job(name))
                .set(now.as_secs_f64());
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

/// Serves `/metrics`, `/livez` and `/readyz` on `listener` until `stop`.
pub async fn serve(listener: TcpListener, stop: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(_) => continue,
            },
        };
        let stop = stop.clone();
        tokio::spawn(async move {
            let conn =
                http1::Builder::new().serve_connection(TokioIo::new(stream), service_fn(answer));
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
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
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

//! `fencecron bench`: what each store operation costs through fencecron,
//! beside the same SQL sent raw through the same pool and a bare `SELECT 1`,
//! measured interleaved in one run so the ratios hold on a noisy machine.
//!
//! It works only on resources named `fencecron-bench-<run id>-<client>` and
//! deletes them (leases, values, stale records) when it ends.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use crate::cli::{BenchArgs, Cli};
use crate::error::{Error, Result};
use crate::names::Name;
use crate::store::{
    AcquireOutcome, AcquireRequest, OpenOptions, PutRequest, RawOp, Store, StoreError, Token,
    MIN_LEASE,
};

use super::Context;

/// The operations measured, in report order.
const OPS: [(&str, RawOp); 6] = [
    ("acquire (free)", RawOp::AcquireFree),
    ("acquire (held)", RawOp::AcquireHeld),
    ("renew", RawOp::Renew),
    ("release", RawOp::Release),
    ("put", RawOp::Put),
    ("get", RawOp::Get),
];

/// Which path a sample went through.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Fencecron,
    Raw,
    Ping,
}

const PATHS: [Path; 3] = [Path::Fencecron, Path::Raw, Path::Ping];

/// Latencies of one client for one operation, per path.
#[derive(Default)]
struct Samples {
    by_path: [Vec<Duration>; 3],
}

pub async fn run(cli: &Cli, args: &BenchArgs) -> Result<u8> {
    if args.clients == 0 || args.resources == 0 {
        return Err(Error::Usage(
            "--clients and --resources must be at least 1".to_string(),
        ));
    }
    let ctx = Context::load(cli, false)?;
    let store = ctx
        .store(&OpenOptions {
            max_connections: u32::try_from(args.clients).unwrap_or(u32::MAX).max(1),
            call_timeout: Duration::from_secs(30),
        })
        .await?;
    let prefix = format!(
        "fencecron-bench-{}-",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    println!(
        "fencecron bench: store {} ({}), {} client(s), {} resource(s), {} per operation",
        ctx.store_url,
        store.backend(),
        args.clients,
        args.resources,
        humantime::format_duration(args.duration.0)
    );
    let result = measure(&store, &prefix, args).await;
    let cleaned = store.purge_prefix(&prefix).await;
    let report = result?;
    cleaned?;
    print_report(&report);
    Ok(0)
}

/// Runs every operation for `duration`, all clients at once.
async fn measure(
    store: &Arc<dyn Store>,
    prefix: &str,
    args: &BenchArgs,
) -> Result<Vec<(&'static str, Vec<Samples>)>> {
    let mut report = Vec::new();
    for (label, op) in OPS {
        let mut tasks = Vec::new();
        for client in 0..args.clients {
            let store = store.clone();
            let resource = Name::parse("resource", &format!("{prefix}{}", client % args.resources))
                .map_err(Error::Usage)?;
            let duration = args.duration.0;
            tasks.push(tokio::spawn(async move {
                client_loop(store.as_ref(), op, &resource, duration).await
            }));
        }
        let mut per_client = Vec::new();
        for t in tasks {
            let samples = t
                .await
                .map_err(|e| Error::Runtime(format!("bench client failed: {e}")))??;
            per_client.push(samples);
        }
        report.push((label, per_client));
    }
    Ok(report)
}

/// One client: rotates fencecron / raw / ping call by call, timing only the
/// measured call (set-up calls such as the release after a measured acquire
/// are not timed).
async fn client_loop(
    store: &dyn Store,
    op: RawOp,
    resource: &Name,
    duration: Duration,
) -> Result<Samples, StoreError> {
    let node = "bench";
    let key = Name::parse("key", "bench").expect("valid key");
    let mut samples = Samples::default();
    // A lease to renew / a token to write with / a holder for "held".
    let (mut owner, mut token) = (Uuid::nil().to_string(), 0);
    if matches!(
        op,
        RawOp::AcquireHeld | RawOp::Renew | RawOp::Put | RawOp::Get
    ) {
        let (o, t) = take(store, resource).await?;
        owner = o;
        token = t;
        if op == RawOp::Get {
            put(store, resource, &key, token, &owner).await?;
        }
    }
    let end = Instant::now() + duration;
    let mut i = 0usize;
    while Instant::now() < end {
        let path = PATHS[i % PATHS.len()];
        i += 1;
        let elapsed = match (path, op) {
            (Path::Ping, _) => timed(store.raw(RawOp::Ping, resource, "", 0)).await?.1,
            (Path::Fencecron, RawOp::AcquireFree) => {
                let (outcome, d) = timed(store.acquire(&request(resource, node))).await?;
                if let AcquireOutcome::Acquired(l) = outcome {
                    store
                        .release(resource, &l.owner_id.to_string(), l.token)
                        .await?;
                }
                d
            }
            (Path::Raw, RawOp::AcquireFree) => {
                let owner = Uuid::new_v4().to_string();
                let (t, d) = timed(store.raw(RawOp::AcquireFree, resource, &owner, 0)).await?;
                if let Some(t) = t {
                    store.release(resource, &owner, t).await?;
                }
                d
            }
            (Path::Fencecron, RawOp::AcquireHeld) => {
                timed(store.acquire(&request(resource, node))).await?.1
            }
            (Path::Fencecron, RawOp::Renew) => {
                timed(store.renew(resource, &owner, token, MIN_LEASE))
                    .await?
                    .1
            }
            (Path::Fencecron, RawOp::Release) | (Path::Raw, RawOp::Release) => {
                let (o, t) = take(store, resource).await?;
                if path == Path::Raw {
                    timed(store.raw(RawOp::Release, resource, &o, t)).await?.1
                } else {
                    timed(store.release(resource, &o, t)).await?.1
                }
            }
            (Path::Fencecron, RawOp::Put) => {
                let start = Instant::now();
                put(store, resource, &key, token, &owner).await?;
                start.elapsed()
            }
            (Path::Fencecron, RawOp::Get) => timed(store.get(resource, &key)).await?.1,
            (Path::Raw, other) => timed(store.raw(other, resource, &owner, token)).await?.1,
            (Path::Fencecron, RawOp::Ping) => Duration::ZERO,
        };
        samples.by_path[path as usize].push(elapsed);
    }
    // Leave nothing held behind (the purge deletes the rows anyway).
    if token > 0 {
        let _ = store.release(resource, &owner, token).await;
    }
    Ok(samples)
}

fn request<'a>(resource: &'a Name, node: &'a str) -> AcquireRequest<'a> {
    AcquireRequest {
        resource,
        lease: MIN_LEASE,
        node,
        occurrence: None,
    }
}

/// Takes the (expired or free) lease, waiting out a holder if needed.
async fn take(store: &dyn Store, resource: &Name) -> Result<(String, Token), StoreError> {
    loop {
        match store.acquire(&request(resource, "bench")).await? {
            AcquireOutcome::Acquired(l) => return Ok((l.owner_id.to_string(), l.token)),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn put(
    store: &dyn Store,
    resource: &Name,
    key: &Name,
    token: Token,
    owner: &str,
) -> Result<(), StoreError> {
    store
        .put(&PutRequest {
            resource,
            key,
            value: b"bench",
            token,
            owner_id: Some(owner),
            once: false,
            node: "bench",
            job: None,
            stage: "bench",
            operation_id: Uuid::new_v4(),
        })
        .await
        .map(|_| ())
}

async fn timed<T>(
    fut: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<(T, Duration), StoreError> {
    let start = Instant::now();
    let v = fut.await?;
    Ok((v, start.elapsed()))
}

/// Median, p99 and throughput of one path of one operation over all clients.
struct Stats {
    n: usize,
    median: Duration,
    p99: Duration,
    ops_per_s: f64,
}

fn stats(per_client: &[Samples], path: Path) -> Option<Stats> {
    let mut all: Vec<Duration> = per_client
        .iter()
        .flat_map(|s| s.by_path[path as usize].iter().copied())
        .collect();
    if all.is_empty() {
        return None;
    }
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() as f64 - 1.0) * p).round() as usize];
    // Each client's rate on this path, summed: the throughput the store
    // sustains for this path with this many concurrent clients.
    let ops_per_s = per_client
        .iter()
        .map(|s| {
            let v = &s.by_path[path as usize];
            let busy: Duration = v.iter().sum();
            if busy.is_zero() {
                0.0
            } else {
                v.len() as f64 / busy.as_secs_f64()
            }
        })
        .sum();
    Some(Stats {
        n: all.len(),
        median: pct(0.5),
        p99: pct(0.99),
        ops_per_s,
    })
}

fn print_report(report: &[(&'static str, Vec<Samples>)]) {
    println!(
        "{:<16} {:>8} {:>11} {:>11} {:>10} {:>11} {:>11} {:>11} {:>9} {:>9}",
        "operation",
        "n",
        "median_us",
        "p99_us",
        "ops/s",
        "raw_med_us",
        "raw_p99_us",
        "ping_med_us",
        "vs_raw",
        "vs_ping"
    );
    for (label, per_client) in report {
        let (Some(f), Some(r), Some(p)) = (
            stats(per_client, Path::Fencecron),
            stats(per_client, Path::Raw),
            stats(per_client, Path::Ping),
        ) else {
            continue;
        };
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
        println!(
            "{:<16} {:>8} {:>11.1} {:>11.1} {:>10.0} {:>11.1} {:>11.1} {:>11.1} {:>8.2}x {:>8.2}x",
            label,
            f.n,
            us(f.median),
            us(f.p99),
            f.ops_per_s,
            us(r.median),
            us(r.p99),
            us(p.median),
            ratio(f.median, r.median),
            ratio(f.median, p.median),
        );
    }
    println!(
        "vs_raw: fencecron median / the same SQL sent raw through the same pool (target <= 1.30x)"
    );
    println!("vs_ping: fencecron median / a bare SELECT 1 round trip, measured interleaved");
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

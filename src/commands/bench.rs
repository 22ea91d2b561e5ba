//! `fencecron bench`: what each store operation costs through fencecron,
//! beside the same SQL sent raw through the same pool and a bare `SELECT 1`,
//! measured interleaved in one run so the ratios hold on a noisy machine.
//!
//! It works only on resources named `fencecron-bench-<run id>-<client>` and
//! deletes them (leases, values, stale records) when it ends, also when it is
//! interrupted with SIGINT or SIGTERM.
//!
//! How the measurement is kept honest:
//! * each client runs the three paths (fencecron, raw, ping) in rounds, in a
//!   freshly shuffled order every round, so no path always follows the same
//!   other path (a call right after a committing write, or after an idle
//!   gap, is slower on a loaded machine);
//! * every fencecron sample is checked to have had the intended outcome (a
//!   "free" acquire must win, a "held" one must lose, a renew must renew, a
//!   put must be accepted, a get must find the value, a raw winning acquire
//!   must be releasable with its owner and token); a sample with another
//!   outcome is dropped and counted in the `odd` column instead of being
//!   timed as if it were the operation;
//! * the resource row exists before "acquire (free)" is measured, so the
//!   first call is not a first-ever creation (a different statement);
//! * consecutive renews and puts are at least a millisecond apart: expiry
//!   and write times have millisecond resolution, and a renew or raw put
//!   in the same millisecond as the previous one writes identical values,
//!   which SQLite and InnoDB skip (no page write, no log flush), so the
//!   sample would be the cost of not writing. A daemon renews every few
//!   seconds and always changes the row.
//!
//! The pool has one connection per client. sqlx 0.8 pings a connection when
//! it goes back to the pool (in a background task), so every path,
//! `SELECT 1` included, may wait for the previous call's return ping; the
//! ratios are unaffected, and a pool of two per client measured no faster
//! on a 2-core machine (the ping then competes for the CPU instead).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

use crate::cli::{BenchArgs, Cli};
use crate::domain::Stage;
use crate::error::{Error, Exit, Result};
use crate::events;
use crate::names::Name;
use crate::output::{self, Out};
use crate::signals::Signals;
use crate::store::{
    open_bench, AcquireOutcome, AcquireRequest, BenchStore, OpenOptions, OwnerId, PutOutcome,
    PutRequest, RawOp, ReleaseOutcome, RenewOutcome, StoreError, Token, MAX_LEASE, MIN_LEASE,
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
    /// Calls whose outcome was not the operation being measured (dropped).
    odd: [usize; 3],
}

pub async fn run(cli: &Cli, args: &BenchArgs) -> Result<Exit> {
    if args.clients == 0 || args.resources == 0 {
        return Err(Error::Usage(
            "--clients and --resources must be at least 1".to_string(),
        ));
    }
    if args.resources < args.clients {
        return Err(Error::Usage(format!(
            "--resources ({}) must be at least --clients ({}): clients sharing a resource would take each other's leases and time contention instead of the operation",
            args.resources, args.clients
        )));
    }
    let ctx = Context::load(cli, false)?;
    let store = open_bench(
        &ctx.store_url,
        &OpenOptions {
            max_connections: u32::try_from(args.clients).unwrap_or(u32::MAX),
            call_timeout: Duration::from_secs(30),
            hook: Some(events::store_hook(false)),
        },
    )?;
    store.migrate().await?;
    let prefix = format!(
        "fencecron-bench-{}-",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let mut signals = Signals::stop()?;
    let mut out = Out::stdout();
    writeln!(
        out,
        "fencecron bench: store {} ({}), {} client(s), {} resource(s), {} per operation",
        ctx.store_url,
        store.backend(),
        args.clients,
        args.resources,
        humantime::format_duration(args.duration)
    )?;
    let result = tokio::select! {
        r = measure(&store, &prefix, args) => Some(r),
        _ = signals.next() => None,
    };
    if result.is_none() {
        // The client tasks were aborted with the measuring future; give any
        // statement already on the wire a moment to finish before purging.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let cleaned = store.purge_prefix(&prefix).await;
    let Some(result) = result else {
        cleaned?;
        output::error_line("bench: interrupted; its rows were removed");
        return Ok(Exit::Interrupted);
    };
    let report = result?;
    cleaned?;
    print_report(&mut out, &report)?;
    Ok(Exit::Success)
}

/// Runs every operation for `duration`, all clients at once.
async fn measure(
    store: &Arc<dyn BenchStore>,
    prefix: &str,
    args: &BenchArgs,
) -> Result<Vec<(&'static str, Vec<Samples>)>> {
    let mut report = Vec::new();
    for (label, op) in OPS {
        // A JoinSet aborts its tasks when dropped (on SIGINT), so no client
        // keeps writing after the purge.
        let mut tasks = JoinSet::new();
        for client in 0..args.clients {
            let store = store.clone();
            let resource = Name::parse("resource", &format!("{prefix}{}", client % args.resources))
                .map_err(Error::Usage)?;
            let duration = args.duration;
            tasks.spawn(async move { client_loop(store.as_ref(), op, &resource, duration).await });
        }
        let mut per_client = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let samples =
                joined.map_err(|e| Error::Runtime(format!("bench client failed: {e}")))??;
            per_client.push(samples);
        }
        report.push((label, per_client));
    }
    Ok(report)
}

/// One client: runs fencecron / raw / ping in rounds, shuffled per round,
/// timing only the measured call (set-up calls such as the release after a
/// measured acquire are not timed).
async fn client_loop(
    store: &dyn BenchStore,
    op: RawOp,
    resource: &Name,
    duration: Duration,
) -> Result<Samples, StoreError> {
    let key = Name::parse("key", "bench").expect("valid key");
    let mut samples = Samples::default();
    // A lease to renew / a token to write with / a holder for "held". The
    // holder of "held" must outlast the measurement, or the lease would
    // become free half-way and the "held" samples would be wins.
    let holder_lease = (duration + Duration::from_secs(30)).clamp(MIN_LEASE, MAX_LEASE);
    let (mut owner, mut token) = (OwnerId::fresh(), Token::default());
    if op == RawOp::AcquireFree {
        let (o, t) = take(store, resource, MIN_LEASE).await?;
        store.release(resource, o, t).await?;
    }
    if matches!(
        op,
        RawOp::AcquireHeld | RawOp::Renew | RawOp::Put | RawOp::Get
    ) {
        let lease = if op == RawOp::AcquireHeld {
            holder_lease
        } else {
            MIN_LEASE
        };
        let (o, t) = take(store, resource, lease).await?;
        owner = o;
        token = t;
        if op == RawOp::Get {
            put(store, resource, &key, token, owner).await?;
        }
    }
    let mut rng = Rng::new();
    let writes_row = matches!(op, RawOp::Renew | RawOp::Put);
    let mut last_write: Option<Instant> = None;
    let mut order = PATHS;
    let mut next = PATHS.len();
    let end = Instant::now() + duration;
    while Instant::now() < end {
        if next == PATHS.len() {
            rng.shuffle(&mut order);
            next = 0;
        }
        let path = order[next];
        next += 1;
        if writes_row && path != Path::Ping {
            if let Some(t) = last_write {
                // Untimed: see the module docs.
                tokio::time::sleep_until(t + Duration::from_millis(1)).await;
            }
        }
        // `None`: the call did not have the outcome being measured.
        let sample: Option<Duration> = match (path, op) {
            (Path::Ping, _) => Some(
                timed(store.raw(RawOp::Ping, resource, "", Token::default()))
                    .await?
                    .1,
            ),
            (Path::Fencecron, RawOp::AcquireFree) => {
                let (outcome, d) = timed(store.acquire(&request(resource, MIN_LEASE))).await?;
                match outcome {
                    AcquireOutcome::Acquired(l) => {
                        store.release(resource, l.owner_id, l.token).await?;
                        Some(d)
                    }
                    _ => None,
                }
            }
            (Path::Raw, RawOp::AcquireFree) => {
                let owner = OwnerId::fresh();
                let (t, d) = timed(store.raw(
                    RawOp::AcquireFree,
                    resource,
                    owner.as_str(),
                    Token::default(),
                ))
                .await?;
                match t {
                    // Releasing with this owner and token proves it won.
                    Some(t) => match store.release(resource, owner, t).await? {
                        ReleaseOutcome::Released => Some(d),
                        ReleaseOutcome::Refused(_) => None,
                    },
                    None => None,
                }
            }
            (Path::Fencecron, RawOp::AcquireHeld) => {
                let (outcome, d) = timed(store.acquire(&request(resource, holder_lease))).await?;
                match outcome {
                    AcquireOutcome::Held { .. } | AcquireOutcome::LostRace => Some(d),
                    AcquireOutcome::Acquired(l) => {
                        // The holder's lease ran out: this call is the holder now.
                        owner = l.owner_id;
                        token = l.token;
                        None
                    }
                    AcquireOutcome::OccurrenceTaken { .. }
                    | AcquireOutcome::NotYetDue { .. }
                    | AcquireOutcome::Superseded { .. }
                    | AcquireOutcome::Paused { .. } => None,
                }
            }
            (Path::Fencecron, RawOp::Renew) => {
                let (outcome, d) = timed(store.renew(resource, owner, token, MIN_LEASE)).await?;
                match outcome {
                    RenewOutcome::Renewed { .. } => Some(d),
                    RenewOutcome::Refused(_) => None,
                }
            }
            (Path::Fencecron, RawOp::Release) | (Path::Raw, RawOp::Release) => {
                let (o, t) = take(store, resource, MIN_LEASE).await?;
                if path == Path::Raw {
                    Some(
                        timed(store.raw(RawOp::Release, resource, o.as_str(), t))
                            .await?
                            .1,
                    )
                } else {
                    let (outcome, d) = timed(store.release(resource, o, t)).await?;
                    (outcome == ReleaseOutcome::Released).then_some(d)
                }
            }
            (Path::Fencecron, RawOp::Put) => {
                let (outcome, d) = timed(put(store, resource, &key, token, owner)).await?;
                matches!(outcome, PutOutcome::Accepted { .. }).then_some(d)
            }
            (Path::Fencecron, RawOp::Get) => {
                let (value, d) = timed(store.get(resource, &key)).await?;
                value.is_some().then_some(d)
            }
            (Path::Raw, other) => Some(
                timed(store.raw(other, resource, owner.as_str(), token))
                    .await?
                    .1,
            ),
            (Path::Fencecron, RawOp::Ping) => Some(Duration::ZERO),
        };
        if writes_row && path != Path::Ping {
            last_write = Some(Instant::now());
        }
        match sample {
            Some(d) => samples.by_path[path as usize].push(d),
            None => samples.odd[path as usize] += 1,
        }
    }
    // Leave nothing held behind (the purge deletes the rows anyway).
    if token > Token::default() {
        let _ = store.release(resource, owner, token).await;
    }
    Ok(samples)
}

fn request(resource: &Name, lease: Duration) -> AcquireRequest<'_> {
    AcquireRequest {
        resource,
        lease,
        node: "bench",
        occurrence: None,
        next_occurrence: None,
        owner_id: OwnerId::fresh(),
        run: None,
    }
}

/// Takes the (expired or free) lease, waiting out a holder if needed.
async fn take(
    store: &dyn BenchStore,
    resource: &Name,
    lease: Duration,
) -> Result<(OwnerId, Token), StoreError> {
    loop {
        match store.acquire(&request(resource, lease)).await? {
            AcquireOutcome::Acquired(l) => return Ok((l.owner_id, l.token)),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

async fn put(
    store: &dyn BenchStore,
    resource: &Name,
    key: &Name,
    token: Token,
    owner: OwnerId,
) -> Result<PutOutcome, StoreError> {
    store
        .put(&PutRequest {
            resource,
            key,
            value: b"bench",
            token,
            owner_id: owner,
            once: false,
            node: "bench",
            job: None,
            stage: Stage::Bench,
            operation_id: Uuid::new_v4(),
        })
        .await
}

async fn timed<T>(
    fut: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<(T, Duration), StoreError> {
    let start = Instant::now();
    let v = fut.await?;
    Ok((v, start.elapsed()))
}

/// A small xorshift generator for shuffling the path order (no crate needed
/// for three elements).
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        // Any non-zero seed; a UUIDv4 is random enough.
        Rng((Uuid::new_v4().as_u128() as u64) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Fisher–Yates.
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// Median, p99 and throughput of one path of one operation over all clients.
struct Stats {
    n: usize,
    odd: usize,
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
        odd: per_client.iter().map(|s| s.odd[path as usize]).sum(),
        median: pct(0.5),
        p99: pct(0.99),
        ops_per_s,
    })
}

fn print_report(out: &mut Out, report: &[(&'static str, Vec<Samples>)]) -> Result<()> {
    writeln!(
        out,
        "{:<16} {:>8} {:>5} {:>11} {:>11} {:>10} {:>11} {:>11} {:>11} {:>9} {:>9}",
        "operation",
        "n",
        "odd",
        "median_us",
        "p99_us",
        "ops/s",
        "raw_med_us",
        "raw_p99_us",
        "ping_med_us",
        "vs_raw",
        "vs_ping"
    )?;
    let mut odd_total = 0;
    for (label, per_client) in report {
        let (Some(f), Some(r), Some(p)) = (
            stats(per_client, Path::Fencecron),
            stats(per_client, Path::Raw),
            stats(per_client, Path::Ping),
        ) else {
            writeln!(out, "{label:<16} (no complete samples)")?;
            continue;
        };
        odd_total += f.odd + r.odd;
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
        writeln!(
            out,
            "{:<16} {:>8} {:>5} {:>11.1} {:>11.1} {:>10.0} {:>11.1} {:>11.1} {:>11.1} {:>8.2}x {:>8.2}x",
            label,
            f.n,
            f.odd + r.odd,
            us(f.median),
            us(f.p99),
            f.ops_per_s,
            us(r.median),
            us(r.p99),
            us(p.median),
            ratio(f.median, r.median),
            ratio(f.median, p.median),
        )?;
    }
    let metrics = crate::metrics::cost_per_occurrence(100_000);
    writeln!(
        out,
        "metrics: {:.2} us per occurrence that runs (its metric updates, timed here), {:.1}% of a bare round trip",
        us(metrics),
        report
            .iter()
            .find_map(|(_, c)| stats(c, Path::Ping))
            .map_or(0.0, |p| 100.0 * metrics.as_secs_f64() / p.median.as_secs_f64().max(1e-9))
    )?;
    writeln!(
        out,
        "vs_raw: fencecron median / the same SQL sent raw through the same pool (target <= 1.30x)"
    )?;
    writeln!(
        out,
        "vs_ping: fencecron median / a bare SELECT 1 round trip, measured interleaved"
    )?;
    writeln!(
        out,
        "ops/s: per client, calls / time spent in them on this path, summed over clients"
    )?;
    if odd_total > 0 {
        writeln!(
            out,
            "odd: {odd_total} call(s) did not have the measured outcome (e.g. a `held` acquire that won) and were left out"
        )?;
    }
    Ok(())
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

//! `fencecron run`: ties the scheduler, the supervisor, signals and systemd
//! together.
//!
//! One scheduler task owns a min-heap of (next instant, job) and sleeps until
//! the earliest instant; each due occurrence becomes its own task that
//! competes for the lease and, on winning, runs the job under the
//! [`Supervisor`]. Signals arrive through signal-hook: SIGTERM/SIGINT cancel
//! one [`CancellationToken`] that every task watches, SIGHUP sends a new job
//! list to the scheduler. Shutdown waits for every task in the
//! [`TaskTracker`], so leases are released before the process exits.

mod occurrence;
mod scheduler;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use sd_notify::NotifyState;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_tokio::Signals;
use tokio::sync::{mpsc, OnceCell};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cli::Cli;
use crate::clock::Clock;
use crate::commands::Context;
use crate::config::Job;
use crate::error::{Error, Result};
use crate::events;
use crate::names::Name;
use crate::runs::{self, RunRecords};
use crate::store::{self, OpenOptions, Store};
use crate::supervise::Supervisor;

use scheduler::Scheduler;

/// Time limit for one store call made by the daemon.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections per daemon unless `store.max_connections` says otherwise:
/// twenty hosts fit in PostgreSQL's default limit of 100. A caller that
/// finds every connection busy waits for one to come back instead of
/// opening another, which costs a round trip at most.
const DEFAULT_MAX_CONNECTIONS: u32 = 4;

/// Runs the daemon until SIGTERM/SIGINT; returns exit code 0 after a clean
/// shutdown.
pub async fn run(cli: &Cli, node_flag: Option<String>) -> Result<u8> {
    let mut ctx = Context::load(cli, true)?;
    // Computed while the context still holds the config (it names the
    // config file to the jobs).
    let child_env = ctx.child_env()?;
    // The job list is held once, by the scheduler: with croner's schedules
    // at about 5 KB each, every copy of 1,000 jobs costs 5 MB.
    let config = ctx
        .config
        .take()
        .ok_or_else(|| Error::Usage("fencecron run needs a config file".to_string()))?;
    let started_with = StartedWith {
        store: config.store.clone(),
        store_max_connections: config.store_max_connections,
        node_id: config.node_id.clone(),
    };
    let node = node_flag.unwrap_or_else(|| ctx.node.clone());
    Name::parse("node", &node).map_err(|m| Error::Usage(format!("--node-id: {m}")))?;

    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| Error::Runtime(format!("cannot install signal handlers: {e}")))?;
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let ready = Arc::new(OnceCell::new());
    let store = store::open(
        &ctx.store_url,
        &OpenOptions {
            max_connections: config
                .store_max_connections
                .unwrap_or(DEFAULT_MAX_CONNECTIONS),
            call_timeout: CALL_TIMEOUT,
        },
    )?;
    let mut supervisor = Supervisor::new(store.clone(), node.clone(), child_env);
    match RunRecords::open(&node, &ctx.store_url) {
        Ok(records) => {
            let records = Arc::new(records);
            supervisor = supervisor.with_records(records.clone());
            // Leases of runs an earlier process of this node left behind are
            // given back once those runs are provably dead.
            tracker.spawn(runs::recover(records, store.clone(), node.clone()));
        }
        Err(e) => events::run_record_failed(
            None,
            &format!("no run-record directory ({e}); after a crash this node's leases expire by themselves"),
        ),
    }

    // Apply migrations now if the store answers; if not, the first firing
    // retries, and the daemon keeps running either way.
    {
        let store = store.clone();
        let ready = ready.clone();
        tracker.spawn(async move {
            if let Err(e) = ensure_ready(&ready, store.as_ref()).await {
                events::store_unavailable("migrate", None, &e.to_string(), None);
            }
        });
    }

    let (reload_tx, reload_rx) = mpsc::channel(4);
    let running = Arc::new(Mutex::new(HashSet::new()));
    let scheduler = Scheduler::new(Shared {
        supervisor,
        running: running.clone(),
        ready,
        shutdown: shutdown.clone(),
        tracker: tracker.clone(),
        clock: Clock::system(),
    });
    let job_count = config.jobs.len();
    tracker.spawn(scheduler.run(config.jobs, reload_rx));

    events::daemon_started(
        &node,
        job_count,
        &ctx.store_url.to_string(),
        &ctx.config_path.display().to_string(),
    );
    notify(&[
        NotifyState::Ready,
        NotifyState::Status(&format!("scheduling {job_count} job(s) as {node}")),
    ]);

    let reason = loop {
        match signals.next().await {
            Some(SIGHUP) => reload(&ctx, &started_with, &reload_tx).await,
            Some(SIGTERM) => break "SIGTERM",
            Some(SIGINT) => break "SIGINT",
            Some(_) => {}
            None => break "signal stream closed",
        }
    };
    notify(&[
        NotifyState::Stopping,
        NotifyState::Status("stopping: terminating jobs and releasing leases"),
    ]);
    let in_progress = running.lock().map(|r| r.len()).unwrap_or(0);
    events::daemon_stopping(reason, in_progress);
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    events::daemon_stopped();
    Ok(0)
}

/// Sends states to systemd when run under `Type=notify`; a no-op otherwise.
fn notify(states: &[NotifyState<'_>]) {
    let _ = sd_notify::notify(false, states);
}

/// The settings a reload cannot change.
struct StartedWith {
    store: Option<store::StoreUrl>,
    store_max_connections: Option<u32>,
    node_id: Option<String>,
}

/// Reloads jobs.toml on SIGHUP. An invalid file keeps the old jobs.
async fn reload(ctx: &Context, original: &StartedWith, tx: &mpsc::Sender<Vec<Job>>) {
    notify(&[NotifyState::Reloading]);
    match ctx.reload_config() {
        Err(e) => events::config_invalid(&e.to_string()),
        Ok(new) => {
            if !ctx.store_from_flag && new.store != original.store {
                events::config_ignored("store", "the store cannot change while running; restart the daemon to use the new store");
            }
            if new.store_max_connections != original.store_max_connections {
                events::config_ignored(
                    "store.max_connections",
                    "the connection pool cannot be resized while running; restart the daemon",
                );
            }
            if new.node_id != original.node_id {
                events::config_ignored(
                    "node.id",
                    "the node id cannot change while running; restart the daemon",
                );
            }
            let count = new.jobs.len();
            let _ = tx.send(new.jobs).await;
            notify(&[NotifyState::Status(&format!("scheduling {count} job(s)"))]);
        }
    }
    notify(&[NotifyState::Ready]);
}

/// Applies migrations once per process; retried by later callers on failure.
async fn ensure_ready(ready: &OnceCell<()>, store: &dyn Store) -> Result<(), store::StoreError> {
    ready.get_or_try_init(|| store.migrate()).await.map(|_| ())
}

/// What the scheduler and every occurrence of this node share.
#[derive(Clone)]
struct Shared {
    supervisor: Supervisor,
    /// Resources with a run in progress on this node.
    running: Arc<Mutex<HashSet<String>>>,
    /// Set once migrations are applied.
    ready: Arc<OnceCell<()>>,
    /// Cancelled at SIGTERM/SIGINT.
    shutdown: CancellationToken,
    /// Every task of the daemon; shutdown waits for all of them.
    tracker: TaskTracker,
    /// Wall time: instants, give-up times.
    clock: Clock,
}

//! `fencecron run`: the daemon as the command line starts it. Resolves the
//! config, store and node, catches signals, and hands the daemon plain
//! settings and a control stream: SIGHUP becomes a reloaded job list, the
//! first SIGTERM a drain (running jobs may finish for `node.shutdown_grace`),
//! SIGINT or a second SIGTERM a stop at once.

use std::sync::Arc;

use tokio::sync::mpsc;

use crate::cli::Cli;
use crate::config::Job;
use crate::daemon::{self, Control, Settings};
use crate::domain::NodeId;
use crate::error::{Error, Exit, Result};
use crate::events;
use crate::metrics;
use crate::runs::RunRecords;
use crate::signals::{Received, Signals};
use crate::store::{self, OpenOptions, StoreUrl};
use crate::web::Web;

use super::Context;

/// Runs the daemon until SIGTERM/SIGINT; returns exit code 0 after a clean
/// shutdown.
pub async fn run(cli: &Cli, node_flag: Option<String>) -> Result<Exit> {
    let mut ctx = Context::load(cli, true)?;
    // Computed while the context still holds the config (it names the
    // config file to the jobs).
    let child_env = ctx.child_env()?;
    // The job list goes to the daemon's scheduler, which holds it once.
    let config = ctx
        .config
        .take()
        .ok_or_else(|| Error::Usage("fencecron run needs a config file".to_string()))?;
    let started_with = StartedWith {
        store: config.store.clone(),
        store_max_connections: config.store_max_connections,
        node_id: config.node_id.clone(),
        node_max_running: config.node_max_running,
        node_shutdown_grace: config.node_shutdown_grace,
        http_listen: config.http_listen,
        http_token_file: config.http_token_file.as_ref().map(|t| t.path.clone()),
    };
    // Validated once: the flag here, the others when the context was
    // resolved; the daemon keeps this `NodeId`.
    let node = match node_flag {
        Some(flag) => NodeId::parse(&flag),
        None => ctx.node_id(),
    }
    .map_err(|m| Error::Usage(format!("--node-id: {m}")))?;

    let signals = Signals::stop_and_hangup()?;
    // With `[http]`, the store's hook also times every call (metrics and
    // `/readyz`).
    let store = store::open(
        &ctx.store_url,
        &OpenOptions {
            hook: Some(events::store_hook(config.http_listen.is_some())),
            ..daemon::store_options(config.store_max_connections)
        },
    )?;
    // `[http]`: metrics, health and the web view (its actions with
    // `token_file`), served until the daemon has stopped.
    let http_stop = tokio_util::sync::CancellationToken::new();
    let web = match config.http_listen {
        Some(addr) => {
            let tokens = match &config.http_token_file {
                Some(file) => Some(file.load()?),
                None => None,
            };
            let web = Web::new(
                store.clone(),
                config.jobs.clone(),
                tokens,
                node.to_string(),
                addr,
            );
            let listener = metrics::bind(addr).await.map_err(Error::Runtime)?;
            tokio::spawn(metrics::serve(
                listener,
                http_stop.clone(),
                Some(web.clone()),
            ));
            Some(web)
        }
        None => None,
    };
    let records = match RunRecords::open(node.as_str(), &ctx.store_url) {
        Ok(records) => Some(Arc::new(records)),
        Err(e) => {
            events::run_record_failed(
                None,
                &format!("no run-record directory ({e}); after a crash this node's leases expire by themselves"),
            );
            None
        }
    };
    let settings = Settings {
        node,
        max_running: config.node_max_running,
        history: config.history,
        jobs: config.jobs,
        store,
        child_env,
        records,
        store_display: ctx.store_url.to_string(),
        store_scope: ctx.store_url.scope(),
        config_display: ctx.config_path.display().to_string(),
        watchdog: systemd_watchdog(),
        shutdown_grace: config.node_shutdown_grace,
        metrics: config.http_listen.is_some(),
    };
    let (tx, rx) = mpsc::channel(4);
    let jobs = settings.jobs.clone();
    let control = tokio::spawn(control(signals, ctx, started_with, jobs, tx, web));
    daemon::run(settings, rx).await;
    control.abort();
    http_stop.cancel();
    Ok(Exit::Success)
}

/// Half of systemd's `WatchdogSec=` when it asks this process for pings
/// (`WATCHDOG_USEC`, and `WATCHDOG_PID` naming this process when set, as
/// `sd_watchdog_enabled(3)` reads them).
fn systemd_watchdog() -> Option<std::time::Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok()? != std::process::id() {
            return None;
        }
    }
    (usec > 0).then(|| std::time::Duration::from_micros(usec / 2))
}

/// The settings a reload cannot change.
struct StartedWith {
    store: Option<StoreUrl>,
    store_max_connections: Option<u32>,
    node_id: Option<NodeId>,
    node_max_running: Option<u32>,
    node_shutdown_grace: std::time::Duration,
    http_listen: Option<std::net::SocketAddr>,
    http_token_file: Option<std::path::PathBuf>,
}

/// Turns signals into the daemon's control messages until it stops: the
/// first SIGTERM drains (what systemd and a rolling upgrade send), SIGINT
/// (an operator's Ctrl-C) and any SIGTERM after the first stop at once.
/// SIGHUP during a drain is ignored: nothing more is scheduled. `jobs` is
/// the list the daemon runs: each reload keeps those of its jobs the file
/// still has unchanged, so the daemon holds them once.
async fn control(
    mut signals: Signals,
    ctx: Context,
    started_with: StartedWith,
    mut jobs: Vec<Arc<Job>>,
    tx: mpsc::Sender<Control>,
    web: Option<Arc<Web>>,
) {
    let mut draining = false;
    loop {
        let message = match signals.next().await {
            Some(Received::Hangup) if draining => continue,
            Some(Received::Hangup) => {
                let reloaded = reload(&ctx, &started_with, &jobs);
                if let Ok(new) = &reloaded {
                    jobs = new.clone();
                    if let Some(web) = &web {
                        web.set_jobs(new.clone());
                    }
                }
                Control::Reload(reloaded)
            }
            Some(Received::Stop("SIGTERM")) if !draining => {
                draining = true;
                Control::Drain("SIGTERM")
            }
            Some(Received::Stop(name)) => Control::Stop(name),
            None => Control::Stop("signal stream closed"),
        };
        let stop = matches!(message, Control::Stop(_));
        if tx.send(message).await.is_err() || stop {
            return;
        }
    }
}

/// Reads jobs.toml again (SIGHUP) the way the daemon was started, and logs
/// what a reload cannot change.
fn reload(
    ctx: &Context,
    original: &StartedWith,
    running: &[Arc<Job>],
) -> Result<Vec<Arc<Job>>, String> {
    let new = ctx.reload_config(running).map_err(|e| e.to_string())?;
    if !ctx.store_from_flag && new.store != original.store {
        events::config_ignored(
            "store",
            "the store cannot change while running; restart the daemon to use the new store",
        );
    }
    if new.store_max_connections != original.store_max_connections {
        events::config_ignored(
            "store.max_connections",
            "the connection pool cannot be resized while running; restart the daemon",
        );
    }
    if new.http_listen != original.http_listen {
        events::config_ignored(
            "http.listen",
            "the metrics and health endpoint cannot move while running; restart the daemon",
        );
    }
    if new.http_token_file.as_ref().map(|t| &t.path) != original.http_token_file.as_ref() {
        events::config_ignored(
            "http.token_file",
            "the web view's tokens are read at start-up; restart the daemon",
        );
    }
    if new.node_max_running != original.node_max_running {
        events::config_ignored(
            "node.max_running",
            "the node's capacity cannot change while running; restart the daemon",
        );
    }
    if new.node_shutdown_grace != original.node_shutdown_grace {
        events::config_ignored(
            "node.shutdown_grace",
            "the drain's length is read at start-up; restart the daemon (the stop uses the old value)",
        );
    }
    if new.node_id != original.node_id {
        events::config_ignored(
            "node.id",
            "the node id cannot change while running; restart the daemon",
        );
    }
    Ok(new.jobs)
}

//! The subcommands. Each takes a [`Context`] (config, store URL, node id)
//! and returns the process exit code or an [`Error`].

mod bench;
mod check;
mod epoch;
mod exec;
mod fenced;
mod lease;

use std::path::PathBuf;
use std::sync::Arc;

use crate::cli::{Cli, Command};
use crate::config::{self, Config};
use crate::error::{Error, Result};
use crate::store::{self, OpenOptions, Store, StoreUrl};

/// How long a command that is about to exit waits for a stale-owner record
/// it is storing in the background (e.g. of a takeover) to reach the store.
pub(crate) const RECORD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What every command needs: the config (when there is one), the store URL
/// and this node's id.
pub struct Context {
    pub config: Option<Config>,
    pub config_path: PathBuf,
    pub store_url: StoreUrl,
    /// Whether the store came from `--store`/`$FENCECRON_STORE`.
    pub store_from_flag: bool,
    pub node: String,
}

impl Context {
    /// Resolves config and store. The config file is required when named by
    /// `--config` or `$FENCECRON_CONFIG`; the default path is optional for
    /// commands that do not need jobs.
    pub fn load(cli: &Cli, need_config: bool) -> Result<Context> {
        let (config_path, explicit) = match &cli.config {
            Some(p) => (p.clone(), true),
            None => (PathBuf::from(config::DEFAULT_PATH), false),
        };
        let config = if explicit || need_config || config_path.exists() {
            Some(config::load(&config_path)?)
        } else {
            None
        };
        let (store_url, store_from_flag) = match &cli.store {
            Some(raw) => (
                StoreUrl::parse(raw).map_err(|m| Error::Usage(format!("--store: {m}")))?,
                true,
            ),
            None => (
                config
                    .as_ref()
                    .and_then(|c| c.store.clone())
                    .unwrap_or_else(StoreUrl::default_sqlite),
                false,
            ),
        };
        let node = std::env::var("FENCECRON_NODE")
            .ok()
            .filter(|n| !n.is_empty())
            .or_else(|| config.as_ref().and_then(|c| c.node_id.clone()))
            .unwrap_or_else(hostname);
        let store_url = store_url.absolutize();
        Ok(Context {
            config,
            config_path,
            store_url,
            store_from_flag,
            node,
        })
    }

    /// The variables a job needs so that `fencecron put/get` inside it reach
    /// this store: the config path, and the store URL when it was given on the
    /// command line or is an (absolute) SQLite file. A PostgreSQL or MySQL
    /// URL from the config file is not copied into every job's environment;
    /// the job finds it through the config. `FENCECRON_BIN` is the running
    /// binary, for jobs that call `fencecron put` when it is not on `PATH`.
    pub fn child_store_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if let Ok(exe) = std::env::current_exe() {
            env.push(("FENCECRON_BIN".to_string(), exe.display().to_string()));
        }
        if self.config.is_some() {
            let path =
                std::path::absolute(&self.config_path).unwrap_or_else(|_| self.config_path.clone());
            env.push(("FENCECRON_CONFIG".to_string(), path.display().to_string()));
        }
        if self.store_from_flag || self.store_url.backend() == store::Backend::Sqlite {
            env.push((
                "FENCECRON_STORE".to_string(),
                self.store_url.expose().to_string(),
            ));
        }
        env
    }

    /// Opens the store and applies migrations (every command does, so any
    /// command works on a fresh database).
    pub async fn store(&self, opts: &OpenOptions) -> Result<Arc<dyn Store>> {
        let s = store::open(&self.store_url, opts)?;
        s.migrate().await?;
        Ok(s)
    }
}

/// This host's name, the default node id.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Runs the parsed command line; returns the exit code.
pub async fn dispatch(cli: Cli) -> Result<u8> {
    match &cli.command {
        Command::Run { node_id } => crate::daemon::run(&cli, node_id.clone()).await,
        Command::Check => check::run(&cli),
        Command::Exec(args) => exec::run(&cli, args).await,
        Command::Lease(cmd) => lease::run(&cli, cmd).await,
        Command::Put(args) => fenced::put(&cli, args).await,
        Command::Get(args) => fenced::get(&cli, args).await,
        Command::Stale(args) => fenced::stale(&cli, args).await,
        Command::Bench(args) => bench::run(&cli, args).await,
        Command::Epoch(args) => epoch::run(&cli, args).await,
    }
}

/// Prints a value as one line of JSON.
pub(crate) fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    let s =
        serde_json::to_string(v).map_err(|e| Error::Runtime(format!("cannot encode JSON: {e}")))?;
    println!("{s}");
    Ok(())
}

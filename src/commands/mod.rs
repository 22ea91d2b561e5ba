//! The subcommands. Each takes a [`Context`] (config, store URL, node id)
//! and returns how it ended ([`Exit`]) or an [`Error`]; `src/error.rs` maps
//! both to exit codes.

mod bench;
mod check;
mod epoch;
mod exec;
mod fenced;
mod fleet;
pub(crate) use fleet::local_time;
mod generate;
mod guard;
mod lease;
mod proxy;
mod run;

use std::path::PathBuf;
use std::sync::Arc;

pub use generate::{complete, COMPLETE_ARG};

use crate::cli::{Cli, Command};
use crate::config::{self, Config};
use crate::domain::NodeId;
use crate::error::{Error, Exit, Result};
use crate::events;
use crate::job_env::{self, ChildEnv, JobStore};
use crate::output::Out;
use crate::store::{self, OpenOptions, Store, StoreUrl};

/// How long a command that is about to exit waits for a stale-owner record
/// it is storing in the background (e.g. of a takeover) to reach the store.
pub(crate) const RECORD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What every command needs: the config (when there is one), the store URL
/// and this node's id.
pub(crate) struct Context {
    pub(crate) config: Option<Config>,
    pub(crate) config_path: PathBuf,
    pub(crate) store_url: StoreUrl,
    /// Whether the store was given outside the config file: `--store`,
    /// `$FENCECRON_STORE` or `$FENCECRON_STORE_FILE`.
    pub(crate) store_from_flag: bool,
    /// This host's node id as commands record it (`put`'s rejections, the
    /// proxy's refusals): the text as given.
    pub(crate) node: String,
    /// The same id as a daemon needs it, validated once: the config's
    /// `node.id` as loaded, else `node` checked here (an invalid
    /// `$FENCECRON_NODE` or host name is refused only by `run`).
    node_id: std::result::Result<NodeId, String>,
}

impl Context {
    /// Resolves config and store. The config file is required when named by
    /// `--config` or `$FENCECRON_CONFIG`; the default path is optional for
    /// commands that do not need jobs. The store is, in order: `--store` or
    /// `$FENCECRON_STORE`, the URL in the file `$FENCECRON_STORE_FILE`
    /// names, the config's `[store]` (`url`, `url_env` or `url_file`, read
    /// by [`config::load`]), and for a config without `[store]` the
    /// embedded SQLite default. With neither a config nor a store, a command
    /// that needs no config (they all touch the store) refuses: it must not
    /// fence against a database it would create on the spot (docs/principles.md,
    /// principle 10).
    pub(crate) fn load(cli: &Cli, need_config: bool) -> Result<Context> {
        let (config_path, explicit) = match &cli.config {
            Some(p) => (p.clone(), true),
            None => (PathBuf::from(config::DEFAULT_PATH), false),
        };
        let given = given_store(cli)?;
        let config = if !need_config && given.is_none() && !config_path.exists() {
            return Err(no_store(&config_path, explicit));
        } else if explicit || need_config || config_path.exists() {
            Some(match given {
                Some(_) => config::load_store_given(&config_path)?,
                None => config::load(&config_path)?,
            })
        } else {
            None
        };
        let store_from_flag = given.is_some();
        let store_url = match given {
            Some(url) => url,
            None => config
                .as_ref()
                .and_then(|c| c.store.clone())
                .unwrap_or_else(StoreUrl::default_sqlite),
        };
        // `$FENCECRON_NODE`, else the config's `node.id` (validated when
        // it was loaded), else the host name. Commands record the text as
        // given; `run` needs a valid id ([`Context::node_id`]).
        let (node, node_id) = match std::env::var("FENCECRON_NODE")
            .ok()
            .filter(|n| !n.is_empty())
        {
            Some(n) => (n.clone(), NodeId::parse(&n)),
            None => match config.as_ref().and_then(|c| c.node_id.clone()) {
                Some(id) => (id.to_string(), Ok(id)),
                None => {
                    let h = hostname();
                    (h.clone(), NodeId::parse(&h))
                }
            },
        };
        let store_url = store_url.absolutize();
        Ok(Context {
            config,
            config_path,
            store_url,
            store_from_flag,
            node,
            node_id,
        })
    }

    /// This node's id for a daemon (see `node_id`), or why it is not one.
    pub(crate) fn node_id(&self) -> std::result::Result<NodeId, String> {
        self.node_id.clone()
    }

    /// Reads the config file again (SIGHUP), the way [`Context::load`] did:
    /// when the store was given outside the file, `store.url_env` is not
    /// read. Keeps each job of `running` that the file still has unchanged
    /// ([`config::load_reusing`]).
    pub(crate) fn reload_config(
        &self,
        running: &[Arc<config::Job>],
    ) -> Result<Config, config::ConfigError> {
        config::load_reusing(&self.config_path, self.store_from_flag, running)
    }

    /// What jobs started by this process get and lose so that `fencecron
    /// put/get` inside them reach this store while the store's credentials
    /// stay out of their environment (see [`crate::job_env`]). Call it while
    /// the context still holds the config. May create the private file
    /// holding the store URL; it is removed when the returned value (and
    /// every clone) is dropped.
    pub(crate) fn child_env(&self) -> Result<ChildEnv> {
        let config = self.config.as_ref();
        let env = ChildEnv::new(&JobStore {
            url: &self.store_url,
            config_path: config.map(|_| self.config_path.as_path()),
            url_env: config.and_then(|c| c.store_url_env.as_deref()),
        })
        .map_err(|e| {
            Error::Runtime(format!(
                "cannot create the private file that gives jobs the store URL ({e}); check that $RUNTIME_DIRECTORY or the temporary directory is writable"
            ))
        })?;
        if !env.scrubbed.is_empty() {
            events::job_env_filtered(&env.scrubbed.join(","));
        }
        Ok(env)
    }

    /// Opens the store and applies migrations (every command does, so any
    /// command works on a fresh database). What the store notices is logged
    /// ([`events::store_hook`]) unless `opts` brings a hook of its own.
    pub(crate) async fn store(&self, opts: &OpenOptions) -> Result<Arc<dyn Store>> {
        let opts = OpenOptions {
            hook: Some(
                opts.hook
                    .clone()
                    .unwrap_or_else(|| events::store_hook(false)),
            ),
            ..opts.clone()
        };
        let s = store::open(&self.store_url, &opts)?;
        s.migrate().await?;
        Ok(s)
    }
}

/// The store given outside the config file: `--store` or `$FENCECRON_STORE`
/// (clap reads both), else the URL in the file `$FENCECRON_STORE_FILE`
/// names (how a job started by fencecron finds a store whose URL holds a
/// password): the URL alone or an environment file's `NAME=URL` line.
fn given_store(cli: &Cli) -> Result<Option<StoreUrl>> {
    if let Some(raw) = &cli.store {
        return StoreUrl::parse(raw)
            .map(Some)
            .map_err(|m| Error::Usage(format!("--store: {m}")));
    }
    let Some(path) = std::env::var_os(job_env::STORE_FILE_VAR).filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let path = PathBuf::from(path);
    let raw = job_env::read_url_file(&path).map_err(|e| {
        Error::Usage(format!(
            "cannot read the store URL from ${} ({}): {e}; it exists only while the fencecron that started this job runs, so pass --store URL or --config FILE instead",
            job_env::STORE_FILE_VAR,
            path.display()
        ))
    })?;
    store::url_in_file_text(&raw).map(Some).map_err(|m| {
        Error::Usage(format!(
            "${} ({}): {m}",
            job_env::STORE_FILE_VAR,
            path.display()
        ))
    })
}

/// The refusal when there is neither a config file nor a store URL.
fn no_store(config_path: &std::path::Path, explicit: bool) -> Error {
    let looked_for = if !explicit {
        format!(
            "$FENCECRON_CONFIG is unset and the default config file {} does not exist",
            config_path.display()
        )
    } else {
        let from = match std::env::var_os("FENCECRON_CONFIG") {
            Some(v) if v == config_path.as_os_str() => "$FENCECRON_CONFIG",
            _ => "--config",
        };
        format!(
            "the config file {} named by {from} does not exist",
            config_path.display()
        )
    };
    Error::Usage(format!(
        "no store to fence against: {looked_for}; point this command at your fleet's store with --config FILE, --store URL or $FENCECRON_STORE (fencecron does not create a local database on its own)"
    ))
}

/// This host's name, the default node id.
pub(crate) fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Runs the parsed command line; returns how it ended ([`Exit`]).
pub async fn dispatch(cli: Cli) -> Result<Exit> {
    match &cli.command {
        Command::Run { node_id } => run::run(&cli, node_id.clone()).await,
        Command::Check { connect } => check::run(&cli, *connect).await,
        Command::Exec(args) => exec::run(&cli, args).await,
        Command::Lease(cmd) => lease::run(&cli, cmd).await,
        Command::Put(args) => fenced::put(&cli, args).await,
        Command::Get(args) => fenced::get(&cli, args).await,
        Command::Stale(args) => fenced::stale(&cli, args).await,
        Command::Bench(args) => bench::run(&cli, args).await,
        Command::Proxy(args) => proxy::run(&cli, args).await,
        Command::Guard(cmd) => guard::run(cmd).await,
        Command::Epoch(args) => epoch::run(&cli, args).await,
        Command::Runs(args) => fleet::runs(&cli, args).await,
        Command::Nodes { json } => fleet::nodes(&cli, *json).await,
        Command::Status { json } => fleet::status(&cli, *json).await,
        Command::Trigger(args) => fleet::trigger(&cli, args).await,
        Command::Pause(args) => fleet::pause(&cli, args).await,
        Command::Resume { job } => fleet::resume(&cli, job).await,
        Command::Completions { shell } => generate::completions(*shell),
        Command::Man { dir } => generate::man_pages(dir),
    }
}

/// An owner id given on the command line or in the job's environment: a
/// UUID (every owner id the store issues is one), or a usage error that says
/// where a real one comes from. A string that is not a UUID never reaches the
/// store, where it could only be refused as "not the owner".
pub(crate) fn owner_id_arg(o: &str) -> Result<store::OwnerId> {
    o.parse().map_err(|e: store::BadOwnerId| {
        Error::Usage(format!(
            "{e}; pass --owner-id O with the owner_id that `fencecron lease acquire` printed with the token, or run inside a fencecron job ($FENCECRON_OWNER_ID)"
        ))
    })
}

/// Prints a value as one line of JSON.
pub(crate) fn print_json<T: serde::Serialize>(v: &T) -> Result<()> {
    let s =
        serde_json::to_string(v).map_err(|e| Error::Runtime(format!("cannot encode JSON: {e}")))?;
    writeln!(Out::stdout(), "{s}")
}

//! The command line: clap definitions only. `main.rs` wires them to
//! [`crate::commands`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// A duration flag in humantime syntax ("30s", "5m", "1h").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl std::str::FromStr for HumanDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s)
            .map(HumanDuration)
            .map_err(|e| format!("`{s}` is not a duration like 30s, 5m or 1h ({e})"))
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines for terminals.
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, event, fields.
    Json,
}

/// `fencecron --version`: the package version and the commit it was built
/// from (`unknown` outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("FENCECRON_COMMIT"),
    ")"
);

/// fencecron: a job runner whose jobs carry a fencing token.
#[derive(Debug, Parser)]
#[command(name = "fencecron", version = VERSION, about, long_about = None)]
pub struct Cli {
    /// The jobs file [default: $FENCECRON_CONFIG, else /etc/fencecron/jobs.toml].
    #[arg(long, global = true, value_name = "FILE", env = "FENCECRON_CONFIG")]
    pub config: Option<PathBuf>,

    /// Store URL (sqlite://PATH, postgres://…, mysql://…); overrides the config.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "FENCECRON_STORE",
        hide_env_values = true
    )]
    pub store: Option<String>,

    /// Log format [default: native journal entries when stderr is the
    /// journal (`JOURNAL_STREAM`), else text].
    #[arg(long, global = true, value_enum, env = "FENCECRON_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,

    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: schedule the jobs of the config under fenced leases.
    Run {
        /// This instance's node id [default: config's node.id, else the host name].
        #[arg(long, value_name = "ID")]
        node_id: Option<String>,
    },
    /// Validate the config and print each job's next fire times.
    Check,
    /// Run one command under a fenced lease (kill-on-loss, token in its environment).
    Exec(ExecArgs),
    /// Take, renew, release and list leases by hand.
    #[command(subcommand)]
    Lease(LeaseCommand),
    /// Fenced write into the built-in fenced store.
    Put(PutArgs),
    /// Read a value and the token that wrote it.
    Get(GetArgs),
    /// List stale-owner records (rejected writes, lost leases) from every host.
    Stale(StaleArgs),
    /// Measure store latency and throughput against a bare round trip.
    Bench(BenchArgs),
    /// Fencing HTTP proxy: forward requests to an upstream only with a current fencing token.
    Proxy(ProxyArgs),
    /// The SQL guard: the fence check inside a job's own database.
    #[command(subcommand)]
    Guard(GuardCommand),
    /// Show the epoch of fencing tokens, or advance it (in failover hooks).
    Epoch(EpochArgs),
    /// List the fleet's runs, newest first, from the run history.
    Runs(RunsArgs),
    /// Show the fleet's daemons: live, draining or gone, version, config digest, runs held.
    Nodes {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show each job of the config: schedule, next instant, paused, running, last run, live nodes, overdue (exit 3).
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Ask the fleet to run JOB once, now, under its lease (a new token).
    Trigger(TriggerArgs),
    /// Pause JOB fleet-wide: no daemon runs its instants until it is resumed.
    Pause(PauseArgs),
    /// Resume a paused JOB fleet-wide.
    Resume {
        /// The job, as named in the config.
        job: String,
    },
    /// Print shell completions for SHELL (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (fencecron.1 and one per subcommand) into DIR.
    Man {
        #[arg(value_name = "DIR")]
        dir: std::path::PathBuf,
    },
}

/// `fencecron epoch [show|advance]`.
#[derive(Debug, Args)]
pub struct EpochArgs {
    #[command(subcommand)]
    pub action: Option<EpochAction>,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

/// What `fencecron epoch` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum EpochAction {
    /// Print the stored and the effective epoch (the default).
    Show,
    /// Raise the epoch so that every later token is greater than every token
    /// issued before, for any resource; run it in the store's promotion hook.
    Advance,
}

/// `fencecron exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The resource to lease.
    pub resource: String,
    /// Lease length (5s..=300s) [default: 30s].
    #[arg(long, value_name = "D")]
    pub lease: Option<HumanDuration>,
    /// Renewal interval [default: a third of the lease].
    #[arg(long, value_name = "D")]
    pub renew_every: Option<HumanDuration>,
    /// SIGTERM-to-SIGKILL grace [default: a fifth of the lease].
    #[arg(long, value_name = "D")]
    pub kill_grace: Option<HumanDuration>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `fencecron lease …`.
#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Take a lease; print resource, owner_id, token, expires_at.
    Acquire {
        resource: String,
        /// Lease length (5s..=300s) [default: 30s].
        #[arg(long, value_name = "D")]
        lease: Option<HumanDuration>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Extend a lease, keeping the token.
    Renew {
        resource: String,
        #[arg(long, value_name = "UUID")]
        owner_id: String,
        #[arg(long, value_name = "T")]
        token: i64,
        /// Lease length (5s..=300s) [default: 30s].
        #[arg(long, value_name = "D")]
        lease: Option<HumanDuration>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Give a lease up.
    Release {
        resource: String,
        #[arg(long, value_name = "UUID")]
        owner_id: String,
        #[arg(long, value_name = "T")]
        token: i64,
    },
    /// All leases, held or not.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `fencecron put`.
#[derive(Debug, Args)]
pub struct PutArgs {
    pub key: String,
    /// [default: $FENCECRON_RESOURCE]
    #[arg(long, value_name = "R", env = "FENCECRON_RESOURCE")]
    pub resource: Option<String>,
    /// [default: $FENCECRON_TOKEN]
    #[arg(long, value_name = "T", env = "FENCECRON_TOKEN")]
    pub token: Option<i64>,
    /// The owner id the token was issued to (required; a UUID)
    /// [default: $FENCECRON_OWNER_ID]
    #[arg(long, value_name = "O", env = "FENCECRON_OWNER_ID")]
    pub owner_id: Option<String>,
    /// Require a strictly greater token; an equal one is "already applied".
    #[arg(long)]
    pub once: bool,
    /// The value as text.
    #[arg(long, value_name = "V", conflicts_with = "file")]
    pub value: Option<String>,
    /// Read the value from a file.
    #[arg(long, value_name = "F")]
    pub file: Option<PathBuf>,
    /// Label recorded with a rejection: where in the job the write happened.
    #[arg(long, value_name = "S", default_value = "put")]
    pub stage: String,
}

/// `fencecron get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    pub key: String,
    /// [default: $FENCECRON_RESOURCE]
    #[arg(long, value_name = "R", env = "FENCECRON_RESOURCE")]
    pub resource: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `fencecron stale`.
#[derive(Debug, Args)]
pub struct StaleArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Only records newer than this (e.g. 1h).
    #[arg(long, value_name = "D")]
    pub since: Option<HumanDuration>,
    /// Also list the rejections the SQL guard keeps in this database (a
    /// job's own; repeat for several).
    #[arg(long, value_name = "URL")]
    pub guard: Vec<String>,
}

/// `--db`: the job's own database, where the guard lives.
#[derive(Debug, Args)]
pub struct GuardDb {
    /// The job's database: postgres://…, mysql://… or sqlite://PATH (not
    /// fencecron's store).
    #[arg(
        long = "db",
        value_name = "URL",
        env = "FENCECRON_GUARD_DB",
        hide_env_values = true
    )]
    pub url: String,
}

/// `fencecron guard …`.
#[derive(Debug, Subcommand)]
pub enum GuardCommand {
    /// Create or update the guard in a job's own database (idempotent).
    Install {
        #[command(flatten)]
        db: GuardDb,
    },
    /// Print the guard's DDL for a DBA (the statements `install` runs).
    Ddl {
        #[arg(long, value_enum)]
        backend: GuardBackend,
    },
    /// Print the DDL that attaches the guard to a table whose rows carry
    /// their writer's token (PostgreSQL, SQLite).
    Trigger {
        #[arg(long, value_enum)]
        backend: GuardBackend,
        /// The table (a plain identifier, optionally schema.table).
        #[arg(long, value_name = "T")]
        table: String,
        /// The column holding each row's token (FENCECRON_TOKEN).
        #[arg(long, value_name = "C")]
        column: String,
        /// The resource the table's writers lease.
        #[arg(long, value_name = "R")]
        resource: String,
    },
    /// After the guard refused this job's transaction: record the refusal
    /// in the guard's rejections table (and the daemon's log).
    Record {
        #[command(flatten)]
        db: GuardDb,
        /// [default: $FENCECRON_RESOURCE]
        #[arg(long, value_name = "R", env = "FENCECRON_RESOURCE")]
        resource: Option<String>,
        /// [default: $FENCECRON_TOKEN]
        #[arg(long, value_name = "T", env = "FENCECRON_TOKEN")]
        token: Option<i64>,
        /// Print the record as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The database a guard's DDL is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GuardBackend {
    #[value(alias = "postgresql")]
    Postgres,
    #[value(alias = "mariadb")]
    Mysql,
    Sqlite,
}

/// `fencecron runs`.
#[derive(Debug, Args)]
pub struct RunsArgs {
    /// Only this job's runs.
    pub job: Option<String>,
    /// Only runs started within this long (e.g. 1h), by the store's clock.
    #[arg(long, value_name = "D")]
    pub since: Option<HumanDuration>,
    /// At most this many runs (1..=1000).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub limit: u32,
    /// Print a JSON array.
    #[arg(long)]
    pub json: bool,
}

/// `fencecron trigger`.
#[derive(Debug, Args)]
pub struct TriggerArgs {
    /// The job, as named in the config.
    pub job: String,
    /// Wait for the run to end and exit with its exit code (128 + signal
    /// when it was killed).
    #[arg(long)]
    pub wait: bool,
    /// How long to wait for a daemon to take the request before giving up
    /// (exit 1).
    #[arg(long, value_name = "D", default_value = "15s")]
    pub timeout: HumanDuration,
}

/// `fencecron pause`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    /// The job, as named in the config.
    pub job: String,
    /// Why (shown by `status` and logged with each skipped instant).
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,
    /// Resume by itself after this long (e.g. 2h).
    #[arg(long = "for", value_name = "D")]
    pub for_: Option<HumanDuration>,
}

/// `fencecron bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Concurrent clients.
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Measuring time per operation.
    #[arg(long, value_name = "D", default_value = "2s")]
    pub duration: HumanDuration,
    /// Distinct bench resources to spread the load over.
    #[arg(long, default_value_t = 16)]
    pub resources: usize,
}

/// `fencecron proxy`.
#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Address to listen on (HOST:PORT, e.g. 127.0.0.1:8480).
    #[arg(long, value_name = "ADDR")]
    pub listen: std::net::SocketAddr,
    /// Where admitted requests go: http://HOST:PORT[/PREFIX].
    #[arg(long, value_name = "URL")]
    pub upstream: String,
    /// How long the upstream may take to answer a request (then 504).
    #[arg(long, value_name = "D", default_value = "30s")]
    pub upstream_timeout: HumanDuration,
    /// How long in-flight requests may finish after SIGTERM/SIGINT.
    #[arg(long, value_name = "D", default_value = "10s")]
    pub drain: HumanDuration,
}

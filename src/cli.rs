//! The command line: clap definitions only. `main.rs` wires them to
//! [`crate::commands`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::store::Token;

pub use crate::logging::LogFormat;

/// `fencecron --version`: the package version and the commit it was built
/// from (`unknown` outside a git checkout).
pub(crate) const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("FENCECRON_COMMIT"),
    ")"
);

/// The heading the global options are listed under in every command's
/// `--help`, apart from the command's own.
const GLOBAL: &str = "Global options";

/// fencecron: a job runner whose jobs carry a fencing token.
#[derive(Debug, Parser)]
#[command(name = "fencecron", version = VERSION, about, long_about = None)]
pub struct Cli {
    /// The jobs file [default: $FENCECRON_CONFIG, else /etc/fencecron/jobs.toml].
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "FILE", env = "FENCECRON_CONFIG")]
    pub(crate) config: Option<PathBuf>,

    /// Store URL (sqlite://PATH, postgres://…, mysql://…); overrides the config.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        value_name = "URL",
        env = "FENCECRON_STORE",
        hide_env_values = true
    )]
    pub(crate) store: Option<String>,

    /// Log format [default: native journal entries when stderr is the
    /// journal (`JOURNAL_STREAM`), else text].
    #[arg(long, global = true, help_heading = GLOBAL, value_enum, env = "FENCECRON_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

impl Cli {
    /// Whether only warnings and errors are logged (`exec --quiet`).
    pub fn quiet(&self) -> bool {
        matches!(&self.command, Command::Exec(args) if args.quiet)
    }

    /// Whether this runs the daemon (`run`).
    pub fn is_daemon(&self) -> bool {
        matches!(self.command, Command::Run { .. })
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the daemon: schedule the jobs of the config under fenced leases.
    Run {
        /// This instance's node id [default: config's node.id, else the host name].
        #[arg(long, value_name = "ID")]
        node_id: Option<String>,
    },
    /// Validate the config and print each job's next fire times.
    Check {
        /// Also connect to the store (without changing it): that it answers
        /// within 5 s, the migrations are applied or can be, the user has the
        /// privileges the daemon needs, and the offset between this host's
        /// clock and the store's.
        #[arg(long)]
        connect: bool,
    },
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
        /// The shell to write completions for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (fencecron.1 and one per subcommand) into DIR.
    Man {
        /// The directory to write the pages into (it must exist).
        #[arg(value_name = "DIR")]
        dir: std::path::PathBuf,
    },
}

/// `fencecron epoch [show|advance]`.
#[derive(Debug, Args)]
pub(crate) struct EpochArgs {
    #[command(subcommand)]
    pub(crate) action: Option<EpochAction>,
    /// Print JSON.
    #[arg(long, global = true)]
    pub(crate) json: bool,
}

/// What `fencecron epoch` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub(crate) enum EpochAction {
    /// Print the stored and the effective epoch (the default).
    Show,
    /// Raise the epoch so that every later token is greater than every token
    /// issued before, for any resource; run it in the store's promotion hook.
    Advance,
}

/// `fencecron exec`.
#[derive(Debug, Args)]
pub(crate) struct ExecArgs {
    /// The resource to lease.
    pub(crate) resource: String,
    /// Lease length (5s..=300s) [default: 30s].
    #[arg(long, value_name = "D", value_parser = humantime::parse_duration)]
    pub(crate) lease: Option<Duration>,
    /// Renewal interval [default: a third of the lease].
    #[arg(long, value_name = "D", value_parser = humantime::parse_duration)]
    pub(crate) renew_every: Option<Duration>,
    /// SIGTERM-to-SIGKILL grace [default: a fifth of the lease].
    #[arg(long, value_name = "D", value_parser = humantime::parse_duration)]
    pub(crate) kill_grace: Option<Duration>,
    /// Log only warnings and errors (the lease lost, a stale write, a store
    /// outage), not the INFO events of every run: for cron and timers that
    /// mail or keep whatever reaches stderr. `FENCECRON_LOG` still wins.
    #[arg(long, short = 'q')]
    pub(crate) quiet: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<String>,
}

/// `fencecron lease …`.
#[derive(Debug, Subcommand)]
pub(crate) enum LeaseCommand {
    /// Take a lease; print resource, owner_id, token, expires_at.
    Acquire {
        /// The resource to lease (1..=200 characters, no control characters).
        resource: String,
        /// Lease length (5s..=300s) [default: 30s].
        #[arg(long, value_name = "D", value_parser = humantime::parse_duration)]
        lease: Option<Duration>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Extend a lease, keeping the token.
    Renew {
        /// The leased resource.
        resource: String,
        /// The owner id `lease acquire` printed (a UUID).
        #[arg(long, value_name = "UUID")]
        owner_id: String,
        /// The token `lease acquire` printed with that owner id.
        #[arg(long, value_name = "T")]
        token: Token,
        /// Lease length (5s..=300s) [default: 30s].
        #[arg(long, value_name = "D", value_parser = humantime::parse_duration)]
        lease: Option<Duration>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Give a lease up.
    Release {
        /// The leased resource.
        resource: String,
        /// The owner id `lease acquire` printed (a UUID).
        #[arg(long, value_name = "UUID")]
        owner_id: String,
        /// The token `lease acquire` printed with that owner id.
        #[arg(long, value_name = "T")]
        token: Token,
    },
    /// Hide a lease that is not held from `lease list` and `status` (a
    /// removed job's) until its resource is acquired again; its fence stays.
    Forget {
        /// The leased resource.
        resource: String,
    },
    /// All leases, held or not (but forgotten ones).
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `fencecron put`.
#[derive(Debug, Args)]
pub(crate) struct PutArgs {
    /// The key to write, within the resource (1..=200 characters).
    pub(crate) key: String,
    /// The resource whose lease fences the write [default:
    /// $FENCECRON_RESOURCE, set in every job]
    #[arg(long, value_name = "R", env = "FENCECRON_RESOURCE")]
    pub(crate) resource: Option<String>,
    /// The fencing token the write carries (required) [default:
    /// $FENCECRON_TOKEN]
    #[arg(long, value_name = "T", env = "FENCECRON_TOKEN")]
    pub(crate) token: Option<Token>,
    /// The owner id the token was issued to (required; a UUID)
    /// [default: $FENCECRON_OWNER_ID]
    #[arg(long, value_name = "O", env = "FENCECRON_OWNER_ID")]
    pub(crate) owner_id: Option<String>,
    /// Require a strictly greater token; an equal one is "already applied".
    #[arg(long)]
    pub(crate) once: bool,
    /// The value as text.
    #[arg(long, value_name = "V", conflicts_with = "file")]
    pub(crate) value: Option<String>,
    /// Read the value from a file.
    #[arg(long, value_name = "F")]
    pub(crate) file: Option<PathBuf>,
    /// Label recorded with a rejection: where in the job the write happened.
    #[arg(long, value_name = "S", default_value = "put")]
    pub(crate) stage: String,
}

/// `fencecron get`.
#[derive(Debug, Args)]
pub(crate) struct GetArgs {
    /// The key to read.
    pub(crate) key: String,
    /// The resource the key belongs to [default: $FENCECRON_RESOURCE]
    #[arg(long, value_name = "R", env = "FENCECRON_RESOURCE")]
    pub(crate) resource: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `fencecron stale`.
#[derive(Debug, Args)]
pub(crate) struct StaleArgs {
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Only records newer than this (e.g. 1h).
    #[arg(long, value_name = "D", value_parser = humantime::parse_duration)]
    pub(crate) since: Option<Duration>,
    /// Only the newest N records (still listed oldest first); 0 lists all.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub(crate) limit: usize,
    /// Also list the rejections the SQL guard keeps in this database (a
    /// job's own; repeat for several).
    #[arg(long, value_name = "URL")]
    pub(crate) guard: Vec<String>,
}

/// `--db`: the job's own database, where the guard lives.
#[derive(Debug, Args)]
pub(crate) struct GuardDb {
    /// The job's database: postgres://…, mysql://… or sqlite://PATH (not
    /// fencecron's store).
    #[arg(
        long = "db",
        value_name = "URL",
        env = "FENCECRON_GUARD_DB",
        hide_env_values = true
    )]
    pub(crate) url: String,
}

/// `fencecron guard …`.
#[derive(Debug, Subcommand)]
pub(crate) enum GuardCommand {
    /// Create or update the guard in a job's own database (idempotent).
    Install {
        #[command(flatten)]
        db: GuardDb,
    },
    /// Print the guard's DDL for a DBA (the statements `install` runs).
    Ddl {
        /// The database the DDL is written for.
        #[arg(long, value_enum)]
        backend: GuardBackend,
    },
    /// Print the DDL that attaches the guard to a table whose rows carry
    /// their writer's token (PostgreSQL, SQLite).
    Trigger {
        /// The database the DDL is written for.
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
        token: Option<Token>,
        /// Print the record as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// The database a guard's DDL is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum GuardBackend {
    #[value(alias = "postgresql")]
    Postgres,
    #[value(alias = "mariadb")]
    Mysql,
    Sqlite,
}

/// `fencecron runs`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct RunsArgs {
    /// Only this job's runs (a job named `show` is written `-- show`).
    pub(crate) job: Option<String>,
    /// Only runs started within this long (e.g. 1h), by the store's clock.
    #[arg(long, value_name = "D", value_parser = humantime::parse_duration)]
    pub(crate) since: Option<Duration>,
    /// Only runs that ended so.
    #[arg(long, value_name = "OUTCOME", value_parser = ["succeeded", "failed", "timed_out", "lease_lost", "shutdown"])]
    pub(crate) outcome: Option<String>,
    /// Only runs of this node.
    #[arg(long, value_name = "NODE")]
    pub(crate) node: Option<String>,
    #[command(subcommand)]
    pub(crate) show: Option<RunsCommand>,
    /// At most this many runs (1..=1000).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub(crate) limit: u32,
    /// Print a JSON array.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `fencecron runs show`.
#[derive(Debug, Subcommand)]
pub(crate) enum RunsCommand {
    /// One run with the tail of its output, as the history kept it
    /// (`[history] output`, 4 KiB by default).
    Show {
        /// The run's owner id (`runs --json` shows it; `FENCECRON_OWNER_ID`
        /// in the job).
        run: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `fencecron trigger`.
#[derive(Debug, Args)]
pub(crate) struct TriggerArgs {
    /// The job, as named in the config.
    pub(crate) job: String,
    /// Wait for the run to end (its last attempt, when the job's `retries`
    /// run it again), print its output tail and exit with its exit code
    /// (128 + signal when it was killed).
    #[arg(long)]
    pub(crate) wait: bool,
    /// How long to wait for a daemon to take the request before giving up
    /// (exit 1).
    #[arg(long, value_name = "D", default_value = "15s", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Duration,
}

/// `fencecron pause`.
#[derive(Debug, Args)]
pub(crate) struct PauseArgs {
    /// The job, as named in the config.
    pub(crate) job: String,
    /// Why (shown by `status` and logged with each skipped instant).
    #[arg(long, value_name = "TEXT")]
    pub(crate) note: Option<String>,
    /// Resume by itself after this long (e.g. 2h).
    #[arg(long = "for", value_name = "D", value_parser = humantime::parse_duration)]
    pub(crate) for_: Option<Duration>,
    /// Replace a pause in force (else a paused job's pause is refused,
    /// exit 75).
    #[arg(long)]
    pub(crate) replace: bool,
}

/// `fencecron bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// Concurrent clients.
    #[arg(long, default_value_t = 1)]
    pub(crate) clients: usize,
    /// Measuring time per operation.
    #[arg(long, value_name = "D", default_value = "2s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Distinct bench resources to spread the load over.
    #[arg(long, default_value_t = 16)]
    pub(crate) resources: usize,
}

/// `fencecron proxy`.
#[derive(Debug, Args)]
pub(crate) struct ProxyArgs {
    /// Address to listen on (HOST:PORT, e.g. 127.0.0.1:8480).
    #[arg(long, value_name = "ADDR")]
    pub(crate) listen: std::net::SocketAddr,
    /// Where admitted requests go: http://HOST:PORT[/PREFIX].
    #[arg(long, value_name = "URL")]
    pub(crate) upstream: String,
    /// How long the upstream may take to answer a request (then 504).
    #[arg(long, value_name = "D", default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) upstream_timeout: Duration,
    /// How long in-flight requests may finish after SIGTERM/SIGINT.
    #[arg(long, value_name = "D", default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) drain: Duration,
}

/// A command-line error as the rest of fencecron's errors read: one
/// sentence that says what is wrong and where to look, e.g. ``the following
/// required arguments were not provided: --owner-id <UUID>, --token <T>;
/// see `fencecron lease renew --help` ``. clap's own rendering spreads it
/// over several lines prefixed `error:`; its tips are left out.
pub fn usage_error_sentence<I, T>(e: &clap::Error, args: I) -> String
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString>,
{
    let text = e.render().to_string();
    let mut lines = text.lines();
    let mut sentence = lines
        .next()
        .unwrap_or_default()
        .trim_start_matches("error:")
        .trim()
        .to_string();
    let mut items = Vec::new();
    let mut command = command_path(args);
    for line in lines {
        if let Some(usage) = line.strip_prefix("Usage: ") {
            // `fencecron lease renew --owner-id <UUID> …`: the words before
            // the first option or argument name the (sub)command.
            command = usage
                .split_whitespace()
                .take_while(|w| !w.starts_with(['-', '<', '[']))
                .collect::<Vec<_>>()
                .join(" ");
        } else if line.starts_with("  ") && !line.trim().is_empty() {
            items.push(line.trim().to_string());
        }
    }
    if !items.is_empty() {
        let sep = if sentence.ends_with(':') { " " } else { ": " };
        sentence = format!("{sentence}{sep}{}", items.join(", "));
    }
    format!("{sentence}; see `{command} --help`")
}

/// `fencecron lease renew` for the arguments `fencecron lease renew …`: the
/// subcommands named, in order, wherever global options stand between them.
fn command_path<I, T>(args: I) -> String
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString>,
{
    use clap::CommandFactory;
    let mut cmd = Cli::command();
    let mut path = vec![cmd.get_name().to_string()];
    for arg in args.into_iter().skip(1) {
        let arg: std::ffi::OsString = arg.into();
        let Some(arg) = arg.to_str() else { continue };
        if arg == "--" {
            break;
        }
        if let Some(sub) = cmd.find_subcommand(arg).cloned() {
            path.push(sub.get_name().to_string());
            cmd = sub;
        }
    }
    path.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentence(args: &[&str]) -> String {
        let e = Cli::try_parse_from(args).expect_err("the arguments are wrong");
        usage_error_sentence(&e, args)
    }

    #[test]
    fn argument_errors_are_one_sentence_naming_the_help() {
        let s = sentence(&["fencecron", "lease", "renew", "r"]);
        assert_eq!(
            s,
            "the following required arguments were not provided: --owner-id <UUID>, \
             --token <T>; see `fencecron lease renew --help`"
        );
        let s = sentence(&["fencecron", "--bogus"]);
        assert!(s.starts_with("unexpected argument '--bogus' found"), "{s}");
        assert!(s.ends_with("; see `fencecron --help`"), "{s}");
        let s = sentence(&["fencecron", "lease", "acquire", "r", "--lease", "soon"]);
        assert!(!s.contains('\n'), "{s}");
        assert!(s.contains("--lease"), "{s}");
        assert!(s.ends_with("see `fencecron lease acquire --help`"), "{s}");
    }
}

#[cfg(test)]
mod help_tests {
    use super::*;
    use clap::CommandFactory;

    /// Every option and argument of every command says what it is in
    /// `--help` (and so in the man pages).
    #[test]
    fn every_option_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                if arg.is_hide_set() || ["help", "version"].contains(&arg.get_id().as_str()) {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "fencecron", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }
}

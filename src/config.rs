//! `jobs.toml` → a validated [`Config`].
//!
//! Everything is checked here, at the boundary: unknown keys, durations,
//! cron expressions, time zones, lease timing, names, duplicates, the store
//! URL. Every error names the file, the line and the key. Code after this
//! module works only with valid values.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::domain::NodeId;
use crate::names::Name;
use crate::schedule::Schedule;
use crate::store::StoreUrl;
use crate::timing::{LeaseTiming, TimingError, DEFAULT_LEASE};

mod tables;

/// Where the config is looked for when neither `--config` nor
/// `$FENCECRON_CONFIG` names one.
pub(crate) const DEFAULT_PATH: &str = "/etc/fencecron/jobs.toml";

/// The largest config file read, in bytes: 8 MiB, about 50,000 jobs with
/// commands, resources and env (a thousand take about 170 KB; 50,000 jobs
/// of four keys are 4.7 MB). The limit is there for a file named by mistake
/// (a log, a dump, `/dev/zero`), which must not exhaust the host, least of
/// all on SIGHUP while the daemon runs jobs. A jobs.toml is parsed a job at
/// a time ([`tables`]), but such a file has no jobs to cut at, and parsing
/// TOML as one document with the spans every error message needs costs
/// about 30 times a real file's size in memory, and up to 80 times for the
/// worst text (8 MiB of `1,1,1,…` took 640 MB). It was 1 MiB (about 10,000
/// jobs) while the parser, toml 0.8, needed over a hundred times the file's
/// size.
pub const MAX_CONFIG_BYTES: u64 = 8 * 1024 * 1024;

/// The largest `store.max_connections` accepted.
pub(crate) const MAX_STORE_CONNECTIONS: u32 = 64;

/// The largest `node.max_running`.
pub(crate) const MAX_RUNNING: u32 = 100_000;

/// `node.shutdown_grace` unless the config says otherwise: how long a
/// stopping daemon lets its running jobs finish by themselves.
pub(crate) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The largest `node.shutdown_grace`: a day (systemd's `TimeoutStopSec=`
/// must exceed it anyway).
pub(crate) const MAX_SHUTDOWN_GRACE: Duration = Duration::from_secs(24 * 3600);

/// The largest `jitter`: a day, the longest sensible spread of a job.
pub(crate) const MAX_JITTER: Duration = Duration::from_secs(24 * 3600);

/// `[http] token_file`: where the web view's tokens are, and where the
/// key was written (for errors about the file).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TokenFile {
    pub(crate) path: PathBuf,
    at: ConfigError,
}

impl TokenFile {
    /// Reads and checks the file (mode, format); an error is reported at
    /// the key, `jobs.toml:LINE:COL: http.token_file: ...`.
    pub(crate) fn load(&self) -> Result<crate::web::tokens::Tokens, ConfigError> {
        crate::web::tokens::load(&self.path).map_err(|message| ConfigError {
            message,
            ..self.at.clone()
        })
    }
}

/// A loaded, validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Config {
    /// The file it was read from.
    pub(crate) path: PathBuf,
    /// The store, when the file names one. `None` also when the file uses
    /// `store.url_env` but was loaded with [`load_store_given`].
    pub(crate) store: Option<StoreUrl>,
    /// `store.url_env`: the variable the store URL is read from, when set.
    pub(crate) store_url_env: Option<String>,
    /// `store.max_connections`: the daemon's pool size, when set.
    pub(crate) store_max_connections: Option<u32>,
    /// The node id, when the file sets one.
    pub(crate) node_id: Option<NodeId>,
    /// `node.max_running`: how many runs this daemon holds at once; `None`
    /// (the default) for no limit.
    pub(crate) node_max_running: Option<u32>,
    /// `node.shutdown_grace`: on SIGTERM the daemon competes for nothing
    /// more and lets its running jobs finish for up to this long before it
    /// stops them (default 30 s; zero stops them at once).
    pub(crate) node_shutdown_grace: Duration,
    /// `[http] listen`: where the daemon serves `/metrics`, `/livez` and
    /// `/readyz`; `None` (the default) serves nothing.
    pub(crate) http_listen: Option<std::net::SocketAddr>,
    /// `[http] token_file`: who may trigger, pause and resume from the web
    /// view (`crate::web::tokens`); `None`: the view is read-only. Checked
    /// (readable by its owner only, well-formed) by `run` and `check`
    /// ([`TokenFile::load`]), not by every command that reads the config.
    pub(crate) http_token_file: Option<TokenFile>,
    /// `[history]`: how much run history the fleet keeps.
    pub(crate) history: History,
    /// The jobs, in file order; shared, so that a reload can keep the jobs
    /// it finds unchanged ([`load_reusing`]) and the web view holds no copy.
    pub(crate) jobs: Vec<Arc<Job>>,
}

/// `[history]`: the run history's retention, per job, and how much output
/// each run keeps. Pruned by every daemon's housekeeping (hourly), never on
/// a run's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct History {
    /// `keep`: the newest runs kept per job (default 100).
    pub(crate) keep: u32,
    /// `max_age`: runs older than this go (default 30 days).
    pub(crate) max_age: Duration,
    /// `output`: bytes of each run's last output kept (default 4096; 0
    /// keeps none).
    pub(crate) output: usize,
    /// `stale`: stale-owner records older than this go (default 30 days).
    pub(crate) stale: Duration,
    /// `values`: stored values older than this go, unless their resource's
    /// lease was held within it (default 90 days).
    pub(crate) values: Duration,
    /// `nodes`: node rows (`fencecron nodes`) not seen for this long go
    /// (default 7 days).
    pub(crate) nodes: Duration,
}

impl Default for History {
    fn default() -> Self {
        History {
            keep: 100,
            max_age: Duration::from_secs(30 * 24 * 3600),
            output: 4096,
            stale: Duration::from_secs(30 * 24 * 3600),
            values: Duration::from_secs(90 * 24 * 3600),
            nodes: crate::store::NODE_RETENTION,
        }
    }
}

/// A job's retry policy: after a run that failed (non-zero exit, a signal
/// fencecron did not send, `timeout`, or a command that could not start),
/// up to `retries` new runs, each under a fresh acquire, the first
/// `backoff` after the failure, doubling up to `backoff_max`; never one
/// that would start after the job's next instant is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retry {
    pub(crate) retries: u32,
    pub(crate) backoff: Duration,
    pub(crate) backoff_max: Duration,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            retries: 0,
            backoff: Duration::from_secs(10),
            backoff_max: Duration::from_secs(600),
        }
    }
}

impl Retry {
    /// The wait before retry number `attempt` (1-based).
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        crate::backoff::Backoff::new(self.backoff, self.backoff_max).nth_wait(attempt)
    }
}

/// One validated job.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Job {
    pub(crate) name: Name,
    pub(crate) schedule: Schedule,
    /// argv; never passed through a shell.
    pub(crate) command: Vec<String>,
    pub(crate) resource: Name,
    pub(crate) timeout: Option<Duration>,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) workdir: Option<PathBuf>,
    pub(crate) timing: LeaseTiming,
    /// When the job exits with this code, it is reporting a stale write
    /// rejected by its own storage: the daemon records and logs it.
    pub(crate) stale_exit_code: Option<i32>,
    /// `retries`, `retry_backoff`, `retry_backoff_max`: how a failed run is
    /// tried again.
    pub(crate) retry: Retry,
    /// `starting_deadline`: an occurrence not started this long after its
    /// instant is skipped (`deadline`); `None`: until the next instant is
    /// due or a lease length has passed.
    pub(crate) starting_deadline: Option<Duration>,
    /// `catchup`: whether the newest instant that fell due while this
    /// daemon could not fire it (paused, suspended, starved) still runs.
    pub(crate) catchup: Catchup,
    /// `overlap`: what an instant does while a run of an earlier one still
    /// holds the lease.
    pub(crate) overlap: Overlap,
    /// `on_failure`: argv run once after a run that did not succeed.
    pub(crate) on_failure: Option<Vec<String>>,
    /// Where its keys were written, for messages about them.
    pub(crate) place: Place,
}

/// What a daemon does with instants that fell due while it could not fire
/// them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Catchup {
    /// Run the newest of them once, late (the older ones are `missed`).
    #[default]
    Latest,
    /// Run none of them (`missed`); the next instant runs on time.
    None,
}

/// What an instant does while a run of an earlier instant (or a manual run)
/// still holds the job's lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Overlap {
    /// Skip the instant (`held`); the running one finishes.
    #[default]
    Skip,
    /// Take the lease from the running owner with a new, higher token. Its
    /// next renewal is refused, so it is terminated through the lease-loss
    /// path on whichever host it runs, and its writes with the old token
    /// are rejected from the moment the new token exists.
    Replace,
}

/// How late an instant may be fired and still count as on time under
/// `catchup = "none"`: a scheduler that was not paused fires within
/// milliseconds.
pub(crate) const CATCHUP_TOLERANCE: Duration = Duration::from_secs(1);

/// Line and column of a job's keys in the file. Where a job was written is
/// not part of what it is: every `Place` equals every other, so moving a
/// job in the file is not a change on reload.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Place {
    pub(crate) command: (usize, usize),
    pub(crate) workdir: Option<(usize, usize)>,
}

impl PartialEq for Place {
    fn eq(&self, _: &Place) -> bool {
        true
    }
}

impl Config {
    /// An error about job `job`'s `key`, at `at` (line, column) in this
    /// file, as config errors are shown.
    pub(crate) fn error_at(
        &self,
        at: (usize, usize),
        job: &Name,
        key: &str,
        message: String,
    ) -> ConfigError {
        ConfigError {
            path: self.path.clone(),
            line: Some(at.0),
            column: Some(at.1),
            key: Some(format!("job `{job}`.{key}")),
            message,
        }
    }
}

/// A configuration error: file, line and key, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub(crate) path: PathBuf,
    pub(crate) line: Option<usize>,
    pub(crate) column: Option<usize>,
    pub(crate) key: Option<String>,
    pub(crate) message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.path.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(col) = self.column {
                write!(f, ":{col}")?;
            }
        }
        f.write_str(": ")?;
        if let Some(key) = &self.key {
            write!(f, "{key}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    store: Option<Spanned<RawStore>>,
    node: Option<RawNode>,
    http: Option<RawHttp>,
    history: Option<RawHistory>,
    defaults: Option<RawDefaults>,
    job: Option<Vec<Spanned<RawJob>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    url: Option<Spanned<String>>,
    url_env: Option<Spanned<String>>,
    url_file: Option<Spanned<String>>,
    max_connections: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    listen: Spanned<String>,
    token_file: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHistory {
    keep: Option<Spanned<i64>>,
    max_age: Option<Spanned<String>>,
    output: Option<Spanned<i64>>,
    stale: Option<Spanned<String>>,
    values: Option<Spanned<String>>,
    nodes: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    id: Option<Spanned<String>>,
    max_running: Option<Spanned<i64>>,
    shutdown_grace: Option<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDefaults {
    lease: Option<Spanned<String>>,
    renew_every: Option<Spanned<String>>,
    kill_grace: Option<Spanned<String>>,
    timezone: Option<Spanned<String>>,
    jitter: Option<Spanned<String>>,
    starting_deadline: Option<Spanned<String>>,
    catchup: Option<Spanned<String>>,
    overlap: Option<Spanned<String>>,
    on_failure: Option<Spanned<Vec<String>>>,
    stale_exit_code: Option<Spanned<i64>>,
    retries: Option<Spanned<i64>>,
    retry_backoff: Option<Spanned<String>>,
    retry_backoff_max: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: Spanned<String>,
    schedule: Spanned<String>,
    command: Spanned<Vec<String>>,
    resource: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    env: Option<Spanned<BTreeMap<String, String>>>,
    workdir: Option<Spanned<String>>,
    lease: Option<Spanned<String>>,
    renew_every: Option<Spanned<String>>,
    kill_grace: Option<Spanned<String>>,
    timezone: Option<Spanned<String>>,
    jitter: Option<Spanned<String>>,
    starting_deadline: Option<Spanned<String>>,
    catchup: Option<Spanned<String>>,
    overlap: Option<Spanned<String>>,
    on_failure: Option<Spanned<Vec<String>>>,
    stale_exit_code: Option<Spanned<i64>>,
    retries: Option<Spanned<i64>>,
    retry_backoff: Option<Spanned<String>>,
    retry_backoff_max: Option<Spanned<String>>,
}

/// Reads and validates a config file.
pub(crate) fn load(path: &Path) -> Result<Config, ConfigError> {
    load_with(path, true, None)
}

/// Reads and validates a config file for a command whose store is given
/// elsewhere (`--store`, `$FENCECRON_STORE`, `$FENCECRON_STORE_FILE`): the
/// variable named by `store.url_env` and the file named by `store.url_file`
/// are not read, so they may be missing (jobs do not inherit the variable),
/// and `store` is then `None`.
pub(crate) fn load_store_given(path: &Path) -> Result<Config, ConfigError> {
    load_with(path, false, None)
}

/// Reads and validates a config file again (a reload: SIGHUP), as
/// [`load`] (`store_given: false`) or [`load_store_given`] did, keeping
/// each job of `previous` that the file still has unchanged instead of a
/// copy of it: a reload of 10,000 jobs that changes a few then holds only
/// those few twice, not the whole list (about 5 MB at 10,000 jobs). A kept
/// job keeps the `place` it was first read at ([`Place`] is not part of what
/// a job is); only `check`, which never reloads, shows places of jobs.
pub(crate) fn load_reusing(
    path: &Path,
    store_given: bool,
    previous: &[Arc<Job>],
) -> Result<Config, ConfigError> {
    load_with(path, !store_given, Some(&Reuse::of(previous)))
}

/// The jobs of the config loaded before, for a reload to keep.
struct Reuse<'a> {
    jobs: &'a [Arc<Job>],
    /// The indices of `jobs` by name, sorted only when a job is not where
    /// it was.
    by_name: std::cell::OnceCell<Vec<usize>>,
}

impl<'a> Reuse<'a> {
    fn of(jobs: &'a [Arc<Job>]) -> Reuse<'a> {
        Reuse {
            jobs,
            by_name: std::cell::OnceCell::new(),
        }
    }

    /// Job number `i` of the file, shared: the previous config's job when
    /// it is the same job, else `job`.
    fn keep(&self, i: usize, job: Job) -> Arc<Job> {
        let before = match self.jobs.get(i) {
            Some(same) if same.name == job.name => Some(same),
            _ => {
                let by_name = self.by_name.get_or_init(|| {
                    let mut order: Vec<usize> = (0..self.jobs.len()).collect();
                    order.sort_by(|&a, &b| {
                        self.jobs[a].name.as_str().cmp(self.jobs[b].name.as_str())
                    });
                    order
                });
                by_name
                    .binary_search_by(|&k| self.jobs[k].name.as_str().cmp(job.name.as_str()))
                    .ok()
                    .map(|k| &self.jobs[by_name[k]])
            }
        };
        match before {
            Some(same) if **same == job => same.clone(),
            _ => Arc::new(job),
        }
    }
}

fn load_with(
    path: &Path,
    read_url_env: bool,
    reuse: Option<&Reuse<'_>>,
) -> Result<Config, ConfigError> {
    let text = read_text(path)?;
    let lines = Lines::new(&text);
    let config = Parser {
        path,
        text: &text,
        lines: &lines,
        base: 0,
        read_url_env,
        reuse,
        rest: None,
    }
    .parse();
    drop(lines);
    drop(text);
    release_freed_memory();
    config
}

/// Hands the memory a parse freed back to the operating system. Parsing
/// 10,000 jobs takes about 35 MB for a moment (the TOML tokens and document)
/// in small blocks between which the jobs kept are allocated, so the
/// allocator keeps most of those pages: without this a daemon that loaded
/// 10,000 jobs held about 60 MB idle, and each SIGHUP could add to it.
/// glibc's `malloc_trim` returns every whole free page of every arena; it
/// takes about a millisecond, once per load (and once per installed job
/// list: `daemon::scheduler`).
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases pages glibc's allocator holds free;
    // it takes no pointer and is thread-safe (it locks each arena).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The size from which glibc's allocator maps a block of its own, which
/// goes back to the system when freed: 128 KiB, glibc's default, but fixed
/// ([`keep_large_blocks_apart`]).
pub const MMAP_THRESHOLD: usize = 128 * 1024;

/// Fixes glibc's mmap threshold at [`MMAP_THRESHOLD`]; the daemon calls it
/// first, before any thread starts. Left to itself, glibc raises the threshold to the size
/// of each mapped block freed (up to 32 MiB), after which the large blocks
/// of a reload (the new set's definitions, a few MB; the parser's tokens)
/// come from the heaps the small ones live in and leave holes there: eight
/// SIGHUPs of 10,000 jobs took a daemon from 31 to 37-38 MB, with peaks of
/// 44 MB; with the threshold fixed, 31 to 32.5 MB and 36 MB (BENCHMARKS.md,
/// "Large blocks apart"). A run's path allocates no block that large (no
/// mmap call in a fleet's steady state, counted there). A one-off command
/// keeps glibc's default: it loads once and exits.
pub fn keep_large_blocks_apart() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a parameter of glibc's allocator; it takes
    // no pointer, and it runs before this process starts a thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
    }
}

/// Reads the whole file as UTF-8, refusing one larger than
/// [`MAX_CONFIG_BYTES`] without reading more than one byte beyond the limit
/// (a FIFO or a device has no size to check first).
fn read_text(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let fail = |message: String| ConfigError {
        path: path.to_path_buf(),
        line: None,
        column: None,
        key: None,
        message,
    };
    let cannot_read = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            return fail(format!(
                "cannot read the config file ({e}); {}",
                who_may_read(path)
            ));
        }
        fail(format!(
            "cannot read the config file ({e}); pass --config FILE or set FENCECRON_CONFIG"
        ))
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
        .map_err(cannot_read)?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(fail(format!(
            "the config file is larger than {MAX_CONFIG_BYTES} bytes (8 MiB), the most fencecron reads; check that --config names your jobs.toml (a real one is a few KB)"
        )));
    }
    String::from_utf8(bytes).map_err(|e| {
        cannot_read(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("it is not UTF-8: {e}"),
        ))
    })
}

/// Who may read a file this user may not: its group (the package makes
/// `/etc/fencecron/jobs.toml` root's and group `fencecron`'s, 0640).
fn who_may_read(path: &Path) -> String {
    let Ok(meta) = std::fs::metadata(path) else {
        return "run this as root or as the user the daemon runs as".to_string();
    };
    let group = crate::store::group_name(&meta);
    format!(
        "only its owner and group `{group}` may read it: run this as root or as a member of group `{group}` (e.g. `sudo -u {group} fencecron ...`), or add your user to the group with `usermod -aG {group} USER`"
    )
}

/// Validates config text; `path` is only used in messages.
#[cfg(test)]
pub(crate) fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
    Parser {
        path,
        text,
        lines: &Lines::new(text),
        base: 0,
        read_url_env: true,
        reuse: None,
        rest: None,
    }
    .parse()
}

#[derive(Clone, Copy)]
struct Parser<'a> {
    path: &'a Path,
    /// What is parsed: the file, or one `[[job]]` table of it.
    text: &'a str,
    /// Where the file's lines start.
    lines: &'a Lines,
    /// The offset of `text` in the file: a span of `text` plus `base` is
    /// where it is in the file.
    base: usize,
    /// Whether `store.url_env` and `store.url_file` are resolved (see
    /// [`load_store_given`]).
    read_url_env: bool,
    /// A reload's previous jobs, kept where unchanged ([`load_reusing`]).
    reuse: Option<&'a Reuse<'a>>,
    /// Set when `text` is the file without its jobs ([`tables::without`]):
    /// where its offsets are in the file.
    rest: Option<&'a tables::Rest>,
}

/// A config's tables other than its jobs and `[history]`, checked.
struct Settings {
    store: Option<StoreUrl>,
    store_url_env: Option<String>,
    store_max_connections: Option<u32>,
    node_id: Option<NodeId>,
    node_max_running: Option<u32>,
    node_shutdown_grace: Duration,
    http_listen: Option<std::net::SocketAddr>,
    http_token_file: Option<TokenFile>,
}

impl Settings {
    fn config(self, path: &Path, history: History, jobs: Vec<Arc<Job>>) -> Config {
        Config {
            path: path.to_path_buf(),
            store: self.store,
            store_url_env: self.store_url_env,
            store_max_connections: self.store_max_connections,
            node_id: self.node_id,
            node_max_running: self.node_max_running,
            node_shutdown_grace: self.node_shutdown_grace,
            http_listen: self.http_listen,
            http_token_file: self.http_token_file,
            history,
            jobs,
        }
    }
}

/// The jobs checked so far, with the names and resources they hold.
#[derive(Default)]
struct JobSet {
    jobs: Vec<Arc<Job>>,
    /// Name to the job's index.
    names: HashMap<String, usize>,
    /// Resource to the index of the job that holds it.
    resources: HashMap<String, usize>,
}

/// One `[[job]]` table parsed as a document of its own.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobTable {
    job: Vec<Spanned<RawJob>>,
}

impl Parser<'_> {
    /// Line and column in the file of an offset in `text`.
    fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = match self.rest {
            Some(rest) => rest.file_offset(offset),
            None => offset,
        };
        self.lines.line_col(self.base + offset)
    }

    /// An error at a span of the file.
    fn at(
        &self,
        span: Range<usize>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        let (line, column) = self.line_col(span.start);
        ConfigError {
            path: self.path.to_path_buf(),
            line: Some(line),
            column: Some(column),
            key: Some(key.into()),
            message: message.into(),
        }
    }

    fn parse(&self) -> Result<Config, ConfigError> {
        match self.parse_by_job() {
            Some(config) => Ok(config),
            None => self.parse_whole(),
        }
    }

    /// The file parsed as one document.
    fn parse_whole(&self) -> Result<Config, ConfigError> {
        let raw = self.document(self.text)?;
        let settings = self.settings(&raw)?;
        let defaults = raw.defaults.unwrap_or_default();
        let raw_jobs = raw.job.unwrap_or_default();
        let mut set = JobSet {
            jobs: Vec::with_capacity(raw_jobs.len()),
            ..JobSet::default()
        };
        for (i, spanned) in raw_jobs.iter().enumerate() {
            self.add_job(i, spanned, &defaults, &mut set)?;
        }
        let history = match &raw.history {
            Some(h) => self.history(h)?,
            None => History::default(),
        };
        Ok(settings.config(self.path, history, set.jobs))
    }

    /// The file parsed one `[[job]]` table at a time ([`tables`]): the same
    /// config as the whole parse, holding about a twentieth of what it holds
    /// beyond the jobs kept (1.5 times the file's size instead of 30).
    /// `None` when the file has a shape the cut leaves to the whole parse,
    /// or anything in it is wrong: the whole parse then decides, so every
    /// error is worded and placed as it always was (and the spans of
    /// `[defaults]`, read only for errors, need no offset here).
    fn parse_by_job(&self) -> Option<Config> {
        let tables = tables::job_tables(self.text)?;
        if tables.is_empty() {
            return None;
        }
        let rest = tables::without(self.text, &tables);
        let others = Parser {
            text: &rest.text,
            rest: Some(&rest),
            ..*self
        };
        let raw = others.document(&rest.text).ok()?;
        if raw.job.is_some() {
            // `job` written some other way as well (`job = [...]`).
            return None;
        }
        let settings = others.settings(&raw).ok()?;
        let history = match &raw.history {
            Some(h) => others.history(h).ok()?,
            None => History::default(),
        };
        let defaults = raw.defaults.unwrap_or_default();
        let mut set = JobSet {
            jobs: Vec::with_capacity(tables.len()),
            ..JobSet::default()
        };
        for (i, range) in tables.into_iter().enumerate() {
            let part = Parser {
                text: &self.text[range.clone()],
                base: range.start,
                ..*self
            };
            let table: JobTable = toml::from_str(part.text).ok()?;
            let [job] = <[_; 1]>::try_from(table.job).ok()?;
            part.add_job(i, &job, &defaults, &mut set).ok()?;
        }
        Some(settings.config(self.path, history, set.jobs))
    }

    /// `text` as TOML, deserialized: a syntax error has no key; a value of
    /// the wrong kind or an unknown key has the path serde was at.
    fn document(&self, text: &str) -> Result<RawConfig, ConfigError> {
        // An error at `span` (its start's line and column), under `key`.
        let error_at = |span: Option<std::ops::Range<usize>>, key, message: &str| {
            let (line, column) = match span {
                Some(span) => {
                    let (l, c) = self.line_col(span.start);
                    (Some(l), Some(c))
                }
                None => (None, None),
            };
            ConfigError {
                path: self.path.to_path_buf(),
                line,
                column,
                key,
                message: message.trim().to_string(),
            }
        };
        let toml_error =
            |key: Option<String>, e: toml::de::Error| error_at(e.span(), key, e.message());
        let document = toml::de::Deserializer::parse(text).map_err(|e| {
            // Worded, and placed, as toml_edit (toml 0.8) did, which names
            // the duplicate key and its table; toml 0.9's own error only
            // for what toml_edit accepts.
            match toml_edit::ImDocument::parse(text) {
                Err(old) => error_at(old.span(), None, old.message()),
                Ok(_) => toml_error(None, e),
            }
        })?;
        serde_path_to_error::deserialize(document).map_err(|e| {
            let key = key_path(e.path(), e.inner().message());
            toml_error(key, e.into_inner())
        })
    }

    /// The tables other than the jobs and `[history]`, checked.
    fn settings(&self, raw: &RawConfig) -> Result<Settings, ConfigError> {
        let store = match &raw.store {
            Some(s) => self.store(s)?,
            None => None,
        };
        let store_max_connections = match raw.store.as_ref().and_then(|s| s.get_ref().max_connections.as_ref()) {
            Some(n) => Some(
                u32::try_from(*n.get_ref())
                    .ok()
                    .filter(|n| (1..=MAX_STORE_CONNECTIONS).contains(n))
                    .ok_or_else(|| {
                        self.at(
                            n.span(),
                            "store.max_connections",
                            format!(
                                "{} is not between 1 and {MAX_STORE_CONNECTIONS}; every daemon opens up to this many connections, so keep hosts x max_connections below the database's own limit",
                                n.get_ref()
                            ),
                        )
                    })?,
            ),
            None => None,
        };
        let node_id = match raw.node.as_ref().and_then(|n| n.id.as_ref()) {
            Some(id) => {
                Some(NodeId::parse(id.get_ref()).map_err(|m| self.at(id.span(), "node.id", m))?)
            }
            None => None,
        };
        let node_max_running = match raw.node.as_ref().and_then(|n| n.max_running.as_ref()) {
            Some(n) => Some(
                u32::try_from(*n.get_ref())
                    .ok()
                    .filter(|n| (1..=MAX_RUNNING).contains(n))
                    .ok_or_else(|| {
                        self.at(
                            n.span(),
                            "node.max_running",
                            format!(
                                "{} is not between 1 and {MAX_RUNNING}; it bounds the runs this daemon holds at once (leave it out for no limit)",
                                n.get_ref()
                            ),
                        )
                    })?,
            ),
            None => None,
        };
        let node_shutdown_grace = match raw.node.as_ref().and_then(|n| n.shutdown_grace.as_ref()) {
            Some(g) => {
                let grace = self.duration(g, "node.shutdown_grace")?;
                if grace > MAX_SHUTDOWN_GRACE {
                    return Err(self.at(
                        g.span(),
                        "node.shutdown_grace",
                        format!(
                            "`{}` is longer than 24h; give running jobs at most a day to finish when the daemon stops (\"0s\" stops them at once)",
                            g.get_ref()
                        ),
                    ));
                }
                grace
            }
            None => DEFAULT_SHUTDOWN_GRACE,
        };
        let http_listen =
            match &raw.http {
                Some(h) => Some(h.listen.get_ref().parse::<std::net::SocketAddr>().map_err(
                    |_| {
                        self.at(
                            h.listen.span(),
                            "http.listen",
                            format!(
                                "`{}` is not an address and port like 127.0.0.1:9464 or [::1]:9464",
                                h.listen.get_ref()
                            ),
                        )
                    },
                )?),
                None => None,
            };
        let http_token_file = match raw.http.as_ref().and_then(|h| h.token_file.as_ref()) {
            None => None,
            Some(file) => {
                let path = file.get_ref();
                if !path.starts_with('/') || path.contains('\0') {
                    return Err(self.at(
                        file.span(),
                        "http.token_file",
                        format!("{path:?} is not an absolute path; give the file of `NAME TOKEN` lines as one, such as /etc/fencecron/web-tokens"),
                    ));
                }
                Some(TokenFile {
                    path: PathBuf::from(path),
                    at: self.at(file.span(), "http.token_file", ""),
                })
            }
        };
        let store_url_env = raw
            .store
            .as_ref()
            .and_then(|s| s.get_ref().url_env.as_ref())
            .map(|v| v.get_ref().clone());
        Ok(Settings {
            store,
            store_url_env,
            store_max_connections,
            node_id,
            node_max_running,
            node_shutdown_grace,
            http_listen,
            http_token_file,
        })
    }

    /// Checks job `i` and adds it to `set`; its name and its resource must
    /// be its own.
    fn add_job(
        &self,
        i: usize,
        spanned: &Spanned<RawJob>,
        defaults: &RawDefaults,
        set: &mut JobSet,
    ) -> Result<(), ConfigError> {
        let job = self.job(i, spanned, defaults)?;
        let raw_job = spanned.get_ref();
        if let Some(first) = set.names.insert(job.name.to_string(), i) {
            return Err(self.at(
                raw_job.name.span(),
                format!("job[{i}].name"),
                format!(
                    "job name `{}` is already used by job[{first}]; job names must be unique",
                    job.name
                ),
            ));
        }
        if let Some(other) = set.resources.insert(job.resource.to_string(), i) {
            let other = &set.jobs[other].name;
            let span = raw_job
                .resource
                .as_ref()
                .map_or(raw_job.name.span(), |r| r.span());
            return Err(self.at(
                span,
                format!("job `{}`.resource", job.name),
                format!(
                    "resource `{}` is already used by job `{other}`; each job needs its own resource, because the resource's lease records which scheduled occurrence ran last",
                    job.resource
                ),
            ));
        }
        set.jobs.push(match self.reuse {
            Some(reuse) => reuse.keep(i, job),
            None => Arc::new(job),
        });
        Ok(())
    }

    /// `[history]`, checked.
    fn history(&self, raw: &RawHistory) -> Result<History, ConfigError> {
        let mut h = History::default();
        if let Some(keep) = &raw.keep {
            h.keep = u32::try_from(*keep.get_ref())
                .ok()
                .filter(|k| (1..=1_000_000).contains(k))
                .ok_or_else(|| {
                    self.at(
                        keep.span(),
                        "history.keep",
                        format!(
                            "{} is not between 1 and 1000000 (the newest runs kept per job)",
                            keep.get_ref()
                        ),
                    )
                })?;
        }
        if let Some(age) = &raw.max_age {
            h.max_age = self.duration(age, "history.max_age")?;
            if h.max_age < Duration::from_secs(60) {
                return Err(self.at(
                    age.span(),
                    "history.max_age",
                    "keep runs for at least 1m (for example \"30d\")",
                ));
            }
        }
        for (raw, key, kept, what) in [
            (
                &raw.stale,
                "history.stale",
                &mut h.stale,
                "stale-owner records",
            ),
            (
                &raw.values,
                "history.values",
                &mut h.values,
                "stored values",
            ),
            (&raw.nodes, "history.nodes", &mut h.nodes, "node rows"),
        ] {
            if let Some(age) = raw {
                *kept = self.duration(age, key)?;
                if *kept < Duration::from_secs(3600) {
                    return Err(self.at(
                        age.span(),
                        key,
                        format!("keep {what} for at least 1h (for example \"30d\")"),
                    ));
                }
            }
        }
        if let Some(out) = &raw.output {
            h.output = usize::try_from(*out.get_ref())
                .ok()
                .filter(|o| *o <= 65_536)
                .ok_or_else(|| {
                    self.at(
                        out.span(),
                        "history.output",
                        format!(
                            "{} is not between 0 and 65536 (bytes of each run's last output kept; 0 keeps none)",
                            out.get_ref()
                        ),
                    )
                })?;
        }
        Ok(h)
    }

    fn store(&self, s: &Spanned<RawStore>) -> Result<Option<StoreUrl>, ConfigError> {
        let raw = s.get_ref();
        if let Some(url) = raw.url.as_ref().filter(|u| u.get_ref().contains('\0')) {
            return Err(self.at(
                url.span(),
                "store.url",
                "the URL contains a NUL byte; remove the \\u0000",
            ));
        }
        if let Some(var) = &raw.url_env {
            let name = var.get_ref();
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(self.at(
                    var.span(),
                    "store.url_env",
                    format!("{name:?} is not an environment variable name; give a non-empty name without `=` or NUL, such as FENCECRON_DATABASE_URL"),
                ));
            }
        }
        if let Some(file) = &raw.url_file {
            let path = file.get_ref();
            if !path.starts_with('/') || path.contains('\0') {
                return Err(self.at(
                    file.span(),
                    "store.url_file",
                    format!("{path:?} is not an absolute path; give the file holding the store URL as one, such as /etc/fencecron/store-url"),
                ));
            }
        }
        // Exactly one source of the URL: the second one set is the error.
        let mut given = [
            ("store.url", raw.url.as_ref()),
            ("store.url_env", raw.url_env.as_ref()),
            ("store.url_file", raw.url_file.as_ref()),
        ]
        .into_iter()
        .filter_map(|(key, v)| v.map(|v| (key, v)));
        let first = given.next();
        if let Some((key, second)) = given.next() {
            return Err(self.at(
                second.span(),
                key,
                format!(
                    "set only one of store.url, store.url_env and store.url_file; {} is set too",
                    first.map(|f| f.0).unwrap_or_default()
                ),
            ));
        }
        match first {
            None => Ok(None),
            Some(("store.url", url)) => StoreUrl::parse(url.get_ref())
                .map(Some)
                .map_err(|m| self.at(url.span(), "store.url", m)),
            Some(_) if !self.read_url_env => Ok(None),
            Some(("store.url_file", file)) => {
                crate::store::read_url_file(Path::new(file.get_ref()))
                    .map(Some)
                    .map_err(|m| self.at(file.span(), "store.url_file", m))
            }
            Some((_, env)) => {
                let var = env.get_ref();
                let value = std::env::var(var).map_err(|_| {
                    self.at(
                        env.span(),
                        "store.url_env",
                        format!(
                            "environment variable `{var}` is not set; export it or use store.url"
                        ),
                    )
                })?;
                StoreUrl::parse(&value).map(Some).map_err(|m| {
                    self.at(
                        env.span(),
                        "store.url_env",
                        format!("the URL in `{var}` is invalid: {m}"),
                    )
                })
            }
        }
    }

    fn duration(&self, d: &Spanned<String>, key: &str) -> Result<Duration, ConfigError> {
        humantime::parse_duration(d.get_ref()).map_err(|e| {
            self.at(
                d.span(),
                key,
                format!(
                    "`{}` is not a duration like 30s, 5m or 1h ({e})",
                    d.get_ref()
                ),
            )
        })
    }

    fn job(
        &self,
        i: usize,
        spanned: &Spanned<RawJob>,
        defaults: &RawDefaults,
    ) -> Result<Job, ConfigError> {
        let raw = spanned.get_ref();
        let name = Name::parse("job", raw.name.get_ref())
            .map_err(|m| self.at(raw.name.span(), format!("job[{i}].name"), m))?;
        let key = |k: &str| format!("job `{name}`.{k}");

        // Job-level values override [defaults]; errors point at whichever
        // line the value came from.
        let pick = |job, default, k| job_or_default(job, default, key(k), k);

        let (tz_value, tz_key) = pick(&raw.timezone, &defaults.timezone, "timezone");
        let tz = match &tz_value {
            Some(v) => {
                Schedule::parse_tz(v.get_ref()).map_err(|m| self.at(v.span(), &tz_key, m))?
            }
            None => chrono_tz::Tz::UTC,
        };
        let mut schedule = Schedule::parse(raw.schedule.get_ref(), tz)
            .map_err(|m| self.at(raw.schedule.span(), key("schedule"), m))?;
        let (jitter_value, jitter_key) = pick(&raw.jitter, &defaults.jitter, "jitter");
        if let Some(j) = &jitter_value {
            let d = self.duration(j, &jitter_key)?;
            if d < Duration::from_secs(1) || d > MAX_JITTER {
                return Err(self.at(
                    j.span(),
                    &jitter_key,
                    "jitter must be between 1s and 24h (instants are whole seconds); remove it for none",
                ));
            }
            schedule = schedule.with_jitter(name.as_str(), d);
        }
        let (deadline_value, deadline_key) = pick(
            &raw.starting_deadline,
            &defaults.starting_deadline,
            "starting_deadline",
        );
        let (on_failure, on_failure_key) = job_or_default(
            &raw.on_failure,
            &defaults.on_failure,
            key("on_failure"),
            "on_failure",
        );
        if let Some(h) = on_failure {
            let argv = h.get_ref();
            if argv.first().is_none_or(|a| a.is_empty()) || argv.iter().any(|a| a.contains('\0')) {
                return Err(self.at(
                    h.span(),
                    &on_failure_key,
                    "on_failure is an argv array such as [\"/usr/local/bin/notify\", \"--job\"], not empty and without NUL bytes",
                ));
            }
        }
        let on_failure = on_failure.map(|h| h.get_ref().clone());
        let (catchup_value, catchup_key) = pick(&raw.catchup, &defaults.catchup, "catchup");
        let catchup = match catchup_value.map(|c| (c, c.get_ref().as_str())) {
            None | Some((_, "latest")) => Catchup::Latest,
            Some((_, "none")) => Catchup::None,
            Some((c, other)) => {
                return Err(self.at(
                    c.span(),
                    &catchup_key,
                    format!(
                    "`{other}` is not a catch-up policy; use \"latest\" (the default) or \"none\""
                ),
                ))
            }
        };
        let (overlap_value, overlap_key) = pick(&raw.overlap, &defaults.overlap, "overlap");
        let overlap = match overlap_value.map(|c| (c, c.get_ref().as_str())) {
            None | Some((_, "skip")) => Overlap::Skip,
            Some((_, "replace")) => Overlap::Replace,
            Some((c, other)) => {
                return Err(self.at(
                    c.span(),
                    &overlap_key,
                    format!(
                    "`{other}` is not an overlap policy; use \"skip\" (the default) or \"replace\""
                ),
                ))
            }
        };
        let retry = self.retry(raw, defaults, &key)?;
        let starting_deadline = match deadline_value {
            Some(d) => match self.duration(d, &deadline_key)? {
                v if v.is_zero() => {
                    return Err(self.at(
                        d.span(),
                        &deadline_key,
                        "starting_deadline must be longer than 0s; remove it for none",
                    ))
                }
                v => Some(v),
            },
            None => None,
        };

        let command = raw.command.get_ref().clone();
        if command.is_empty() || command[0].is_empty() {
            return Err(self.at(
                raw.command.span(),
                key("command"),
                "the command is empty; give an argv array such as [\"/usr/local/bin/task\", \"--flag\"]",
            ));
        }
        if let Some(arg) = command.iter().find(|a| a.contains('\0')) {
            return Err(self.at(
                raw.command.span(),
                key("command"),
                format!("argument {arg:?} contains a NUL byte, which no argument can hold; remove the \\u0000"),
            ));
        }

        let resource = match &raw.resource {
            Some(r) => Name::parse("resource", r.get_ref())
                .map_err(|m| self.at(r.span(), key("resource"), m))?,
            None => name.clone(),
        };

        let timeout = match &raw.timeout {
            Some(t) => {
                let d = self.duration(t, &key("timeout"))?;
                if d.is_zero() {
                    return Err(self.at(
                        t.span(),
                        key("timeout"),
                        "timeout must be longer than 0s",
                    ));
                }
                Some(d)
            }
            None => None,
        };

        let mut env = BTreeMap::new();
        if let Some(e) = &raw.env {
            for (k, v) in e.get_ref() {
                if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                    // A key with a NUL or newline is shown escaped.
                    let shown = if k.chars().any(char::is_control) {
                        format!("{k:?}")
                    } else {
                        k.clone()
                    };
                    return Err(self.at(
                        e.span(),
                        key(&format!("env.{shown}")),
                        "environment variable names must be non-empty without `=` or NUL, and values without NUL; rename the variable or remove the \\u0000",
                    ));
                }
                if k.starts_with("FENCECRON_") {
                    return Err(self.at(
                        e.span(),
                        key(&format!("env.{k}")),
                        "FENCECRON_* variables are set by the daemon for every run; choose another name",
                    ));
                }
                env.insert(k.clone(), v.clone());
            }
        }

        let workdir = match &raw.workdir {
            Some(w) if w.get_ref().is_empty() => {
                return Err(self.at(
                    w.span(),
                    key("workdir"),
                    "workdir is empty; remove it or give a directory",
                ))
            }
            Some(w) if w.get_ref().contains('\0') => {
                return Err(self.at(
                    w.span(),
                    key("workdir"),
                    "workdir contains a NUL byte, which no path can hold; remove the \\u0000",
                ))
            }
            Some(w) => Some(PathBuf::from(w.get_ref())),
            None => None,
        };

        let (lease_v, lease_k) = pick(&raw.lease, &defaults.lease, "lease");
        let (renew_v, renew_k) = pick(&raw.renew_every, &defaults.renew_every, "renew_every");
        let (grace_v, grace_k) = pick(&raw.kill_grace, &defaults.kill_grace, "kill_grace");
        let lease = match &lease_v {
            Some(v) => self.duration(v, &lease_k)?,
            None => DEFAULT_LEASE,
        };
        let renew_every = renew_v
            .as_ref()
            .map(|v| self.duration(v, &renew_k))
            .transpose()?;
        let kill_grace = grace_v
            .as_ref()
            .map(|v| self.duration(v, &grace_k))
            .transpose()?;
        let timing = LeaseTiming::new(lease, renew_every, kill_grace).map_err(|e| {
            let (v, k) = match &e {
                TimingError::Lease(_) => (&lease_v, &lease_k),
                TimingError::RenewEvery(_) => (&renew_v, &renew_k),
                TimingError::KillGrace(_) => (&grace_v, &grace_k),
            };
            // A derived value has no line of its own: point at the lease or,
            // failing that, the job.
            let span = v
                .as_ref()
                .or(lease_v.as_ref())
                .map_or(raw.name.span(), |s| s.span());
            let k = if v.is_some() { k.clone() } else { key("lease") };
            self.at(span, k, e.to_string())
        })?;

        let stale_exit_code = match (&raw.stale_exit_code, &defaults.stale_exit_code) {
            (Some(c), _) => Some(self.exit_code(c, &key("stale_exit_code"))?),
            (None, Some(c)) => Some(self.exit_code(c, "defaults.stale_exit_code")?),
            (None, None) => None,
        };

        Ok(Job {
            name,
            schedule,
            command,
            resource,
            timeout,
            env,
            workdir,
            timing,
            stale_exit_code,
            starting_deadline,
            retry,
            catchup,
            overlap,
            on_failure,
            place: Place {
                command: self.line_col(raw.command.span().start),
                workdir: raw.workdir.as_ref().map(|w| self.line_col(w.span().start)),
            },
        })
    }

    /// `retries`, `retry_backoff`, `retry_backoff_max` of a job (or
    /// `[defaults]`), checked.
    fn retry(
        &self,
        raw: &RawJob,
        defaults: &RawDefaults,
        key: &dyn Fn(&str) -> String,
    ) -> Result<Retry, ConfigError> {
        let pick = |job, default, k| job_or_default(job, default, key(k), k);
        let mut retry = Retry::default();
        let (n, n_key) = job_or_default(&raw.retries, &defaults.retries, key("retries"), "retries");
        if let Some(n) = n {
            retry.retries = u32::try_from(*n.get_ref())
                .ok()
                .filter(|n| *n <= 100)
                .ok_or_else(|| {
                    self.at(
                        n.span(),
                        &n_key,
                        format!("{} is not between 0 and 100", n.get_ref()),
                    )
                })?;
        }
        let (b, b_key) = pick(&raw.retry_backoff, &defaults.retry_backoff, "retry_backoff");
        if let Some(b) = b {
            retry.backoff = self.duration(b, &b_key)?;
            if retry.backoff < Duration::from_secs(1) || retry.backoff > Duration::from_secs(86_400)
            {
                return Err(self.at(b.span(), &b_key, "retry_backoff must be between 1s and 24h"));
            }
        }
        let (m, m_key) = pick(
            &raw.retry_backoff_max,
            &defaults.retry_backoff_max,
            "retry_backoff_max",
        );
        match m {
            Some(m) => {
                retry.backoff_max = self.duration(m, &m_key)?;
                if retry.backoff_max < retry.backoff {
                    return Err(self.at(
                        m.span(),
                        &m_key,
                        "retry_backoff_max must be at least retry_backoff",
                    ));
                }
            }
            None => retry.backoff_max = retry.backoff_max.max(retry.backoff),
        }
        Ok(retry)
    }

    fn exit_code(&self, c: &Spanned<i64>, key: &str) -> Result<i32, ConfigError> {
        match *c.get_ref() {
            v @ 1..=125 => Ok(v as i32),
            v => Err(self.at(
                c.span(),
                key,
                format!("{v} is not a usable exit code; choose one in 1..=125"),
            )),
        }
    }
}

/// A job's value of key `k`, else the `[defaults]` one, with the key an
/// error about it names (`job_key`, or `defaults.k`).
fn job_or_default<'a, T>(
    job: &'a Option<Spanned<T>>,
    default: &'a Option<Spanned<T>>,
    job_key: String,
    k: &str,
) -> (Option<&'a Spanned<T>>, String) {
    match job {
        Some(v) => (Some(v), job_key),
        None => (default.as_ref(), format!("defaults.{k}")),
    }
}

/// The dotted key a TOML error is about, such as `job[1].colour` or
/// `defaults.lease`: the path serde was at (without the private fields of
/// `toml::Spanned`), plus the field an unknown or missing field error names
/// (serde reports those at the table holding it). `None` for a syntax error,
/// which has no key.
fn key_path(path: &serde_path_to_error::Path, message: &str) -> Option<String> {
    use serde_path_to_error::Segment;
    let mut key = String::new();
    let mut last = None;
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => key.push_str(&format!("[{index}]")),
            Segment::Map { key: k } | Segment::Enum { variant: k } => {
                if k.starts_with("$__") {
                    continue;
                }
                if !key.is_empty() {
                    key.push('.');
                }
                key.push_str(k);
                last = Some(k.as_str());
            }
            Segment::Unknown => {}
        }
    }
    // An unknown field is already the path's last key; a missing one is not.
    let named = ["unknown field `", "missing field `"]
        .iter()
        .find_map(|p| message.trim().strip_prefix(p))
        .and_then(|rest| rest.split('`').next())
        .filter(|field| last != Some(*field));
    if let Some(field) = named {
        if !key.is_empty() {
            key.push('.');
        }
        key.push_str(field);
    }
    (!key.is_empty()).then_some(key)
}

/// Where each line of a text starts, found once, so that turning a byte
/// offset into a line and column costs a binary search instead of a scan
/// of the text before it (one per job made loading quadratic).
struct Lines {
    starts: Vec<usize>,
    len: usize,
}

impl Lines {
    fn new(text: &str) -> Lines {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Lines {
            starts,
            len: text.len(),
        }
    }

    /// 1-based line and column (in bytes) of a byte offset.
    fn line_col(&self, offset: usize) -> (usize, usize) {
        let offset = offset.min(self.len);
        // The last line starting at or before `offset`.
        let line = self.starts.partition_point(|&start| start <= offset);
        (line, offset - self.starts[line - 1] + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ConfigError {
        parse(Path::new("jobs.toml"), text).unwrap_err()
    }

    const JOB: &str = "[[job]]\nname = \"a\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n";

    /// `[store] url_file`: the URL is read from the file (alone or as an
    /// environment file's `NAME=URL` line), a file open to other users is
    /// refused with the chmod that fixes it, a relative path is refused,
    /// and only one of `url`, `url_env`, `url_file` may be set (the second
    /// one named at its line and column). The file's content never shows
    /// in an error.
    #[test]
    fn store_url_file_is_read_private_and_exclusive() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("store-url");
        let write = |text: &str, mode: u32| {
            std::fs::write(&file, text).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let conf = format!("[store]\nurl_file = \"{}\"\n{JOB}", file.display());
        let parsed = |text: &str| parse(Path::new("jobs.toml"), text);

        write("postgres://fencecron:s3cret@db.internal/fencecron\n", 0o640);
        let c = parsed(&conf).unwrap();
        let url = c.store.unwrap();
        assert_eq!(
            url.expose(),
            "postgres://fencecron:s3cret@db.internal/fencecron"
        );
        assert_eq!(url.scope(), "fleet");

        write(
            "FENCECRON_DATABASE_URL='postgres://f:s3cret@db/f?sslmode=require'\n",
            0o600,
        );
        let c = parsed(&conf).unwrap();
        assert_eq!(
            c.store.unwrap().expose(),
            "postgres://f:s3cret@db/f?sslmode=require"
        );

        write("postgres://fencecron:s3cret@db.internal/fencecron\n", 0o644);
        let e = parsed(&conf).unwrap_err();
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(2), Some("store.url_file"))
        );
        assert!(
            e.message.contains("mode 0644") && e.message.contains("chmod o-rwx"),
            "{e}"
        );
        assert!(!e.to_string().contains("s3cret"), "{e}");

        write(
            "postgres://fencecron:s3cret@db.internal/fencecron\nmore\n",
            0o640,
        );
        let e = parsed(&conf).unwrap_err();
        assert!(
            e.message.contains("2 lines") && !e.to_string().contains("s3cret"),
            "{e}"
        );

        write("ftp://fencecron:s3cret@db.internal/fencecron\n", 0o640);
        let e = parsed(&conf).unwrap_err();
        assert!(
            e.message.contains("unsupported scheme") && !e.to_string().contains("s3cret"),
            "{e}"
        );

        let e = err(&format!("[store]\nurl_file = \"store-url\"\n{JOB}"));
        assert!(e.message.contains("absolute path"), "{e}");
        let e = err(&format!(
            "[store]\nurl = \"sqlite://x.db\"\nurl_file = \"{}\"\n{JOB}",
            file.display()
        ));
        assert_eq!((e.line, e.column), (Some(3), Some(12)), "{e}");
        assert_eq!(e.key.as_deref(), Some("store.url_file"));
        assert!(
            e.message.contains("only one of") && e.message.contains("store.url is set"),
            "{e}"
        );

        // A command whose store is given elsewhere does not read the file.
        std::fs::remove_file(&file).unwrap();
        let p = dir.path().join("jobs.toml");
        std::fs::write(&p, &conf).unwrap();
        assert!(load(&p).unwrap_err().message.contains("does not exist"));
        assert!(load_store_given(&p).unwrap().store.is_none());
    }

    #[test]
    fn history_and_retries_parse_and_bad_values_name_their_key() {
        let c = parse(
            Path::new("jobs.toml"),
            &format!("[history]\nkeep = 5\nmax_age = \"2h\"\noutput = 0\nstale = \"2d\"\nvalues = \"3d\"\nnodes = \"1d\"\n[defaults]\nretries = 2\n{JOB}retry_backoff = \"3s\"\n"),
        )
        .unwrap();
        assert_eq!(
            c.history,
            History {
                keep: 5,
                max_age: Duration::from_secs(7_200),
                output: 0,
                stale: Duration::from_secs(2 * 86_400),
                values: Duration::from_secs(3 * 86_400),
                nodes: Duration::from_secs(86_400),
            }
        );
        let r = c.jobs[0].retry;
        assert_eq!((r.retries, r.backoff), (2, Duration::from_secs(3)));
        assert_eq!(r.backoff_max, Duration::from_secs(600));
        assert_eq!(
            (r.delay(1), r.delay(2), r.delay(20)),
            (
                Duration::from_secs(3),
                Duration::from_secs(6),
                Duration::from_secs(600)
            )
        );
        assert_eq!(
            parse(Path::new("jobs.toml"), JOB).unwrap().history,
            History::default()
        );
        for (text, key) in [
            ("[history]\nkeep = 0\n".to_string(), "history.keep"),
            ("[history]\noutput = 70000\n".to_string(), "history.output"),
            ("[history]\nstale = \"1m\"\n".to_string(), "history.stale"),
            ("[history]\nvalues = \"1s\"\n".to_string(), "history.values"),
            ("[history]\nnodes = \"1m\"\n".to_string(), "history.nodes"),
            (
                "[history]\nmax_age = \"1s\"\n".to_string(),
                "history.max_age",
            ),
            (format!("{JOB}retries = 101\n"), "job `a`.retries"),
            (
                format!("{JOB}retry_backoff = \"1m\"\nretry_backoff_max = \"10s\"\n"),
                "job `a`.retry_backoff_max",
            ),
            (
                format!("[defaults]\nretry_backoff = \"0s\"\n{JOB}"),
                "defaults.retry_backoff",
            ),
        ] {
            let e = err(&text);
            assert_eq!(e.key.as_deref(), Some(key), "{text}: {e}");
        }
    }

    #[test]
    fn shutdown_grace_defaults_to_30s_and_bad_values_name_their_key() {
        let c = parse(Path::new("jobs.toml"), JOB).unwrap();
        assert_eq!(c.node_shutdown_grace, Duration::from_secs(30));
        for (grace, want) in [("0s", 0), ("2m", 120), ("24h", 86_400)] {
            let c = parse(
                Path::new("jobs.toml"),
                &format!("[node]\nshutdown_grace = \"{grace}\"\n{JOB}"),
            )
            .unwrap();
            assert_eq!(c.node_shutdown_grace, Duration::from_secs(want), "{grace}");
        }
        for grace in ["\"soon\"", "\"25h\"", "30"] {
            let e = err(&format!("[node]\nshutdown_grace = {grace}\n{JOB}"));
            assert_eq!(
                e.key.as_deref(),
                Some("node.shutdown_grace"),
                "{grace}: {e}"
            );
            assert_eq!((e.line, e.column), (Some(2), Some(18)), "{grace}: {e}");
        }
    }

    #[test]
    fn minimal() {
        let c = parse(Path::new("jobs.toml"), JOB).unwrap();
        assert_eq!(c.jobs.len(), 1);
        assert_eq!(c.jobs[0].resource.as_str(), "a");
        assert_eq!(c.jobs[0].timing.lease, DEFAULT_LEASE);
    }

    #[test]
    fn unknown_key_names_line_and_key() {
        let e = err(&format!("{JOB}colour = \"red\"\n"));
        assert_eq!(e.line, Some(5));
        assert!(e.to_string().contains("colour"), "{e}");
    }

    #[test]
    fn toml_errors_name_the_key() {
        let e = err(&format!("[defaults]\nlease = 5\n{JOB}"));
        assert_eq!(e.key.as_deref(), Some("defaults.lease"), "{e}");
        let e = err(&format!("{JOB}{JOB}colour = 1\n"));
        assert_eq!(e.key.as_deref(), Some("job[1].colour"), "{e}");
        let e = err("[[job]]\nname = \"a\"\ncommand = [\"true\"]\n");
        assert_eq!(e.key.as_deref(), Some("job[0].schedule"), "{e}");
    }

    #[test]
    fn bad_cron_names_job() {
        let e =
            err("[[job]]\nname = \"nightly\"\nschedule = \"61 * * * *\"\ncommand = [\"true\"]\n");
        assert_eq!(e.line, Some(3));
        assert_eq!(e.key.as_deref(), Some("job `nightly`.schedule"));
    }

    #[test]
    fn lease_from_defaults_points_at_defaults() {
        let e = err(&format!("[defaults]\nlease = \"2s\"\n{JOB}"));
        assert_eq!(e.line, Some(2));
        assert_eq!(e.key.as_deref(), Some("defaults.lease"));
    }

    #[test]
    fn jitter_from_the_job_or_the_defaults() {
        let c = parse(
            Path::new("jobs.toml"),
            &format!("[defaults]\njitter = \"1h\"\n{JOB}"),
        )
        .unwrap();
        let off = c.jobs[0].schedule.jitter_offset();
        assert!(off < Duration::from_secs(3600), "{off:?}");
        let plain = parse(Path::new("jobs.toml"), JOB).unwrap();
        assert_eq!(plain.jobs[0].schedule.jitter_offset(), Duration::ZERO);
        assert_ne!(
            c.jobs[0].schedule, plain.jobs[0].schedule,
            "a reload sees the change"
        );
        for bad in ["500ms", "25h"] {
            let e = err(&format!("{JOB}jitter = \"{bad}\"\n"));
            assert_eq!(e.line, Some(5), "{e}");
            assert!(
                e.to_string()
                    .contains(".jitter: jitter must be between 1s and 24h"),
                "{e}"
            );
        }
    }

    #[test]
    fn starting_deadline_from_the_job_or_the_defaults() {
        let c = parse(
            Path::new("jobs.toml"),
            &format!("[defaults]\nstarting_deadline = \"30s\"\n{JOB}"),
        )
        .unwrap();
        assert_eq!(c.jobs[0].starting_deadline, Some(Duration::from_secs(30)));
        let e = err(&format!("{JOB}starting_deadline = \"0s\"\n"));
        assert_eq!(e.line, Some(5), "{e}");
        assert!(
            e.to_string()
                .contains(".starting_deadline: starting_deadline must be longer than 0s"),
            "{e}"
        );
    }

    #[test]
    fn catchup_latest_or_none() {
        let c = parse(
            Path::new("jobs.toml"),
            &format!("{JOB}catchup = \"none\"\n"),
        )
        .unwrap();
        assert_eq!(c.jobs[0].catchup, Catchup::None);
        let c = parse(Path::new("jobs.toml"), JOB).unwrap();
        assert_eq!(c.jobs[0].catchup, Catchup::Latest);
        let e = err(&format!("{JOB}catchup = \"all\"\n"));
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.to_string().contains("is not a catch-up policy"), "{e}");
    }

    #[test]
    fn overlap_skip_or_replace() {
        let c = parse(
            Path::new("jobs.toml"),
            &format!("{JOB}overlap = \"replace\"\n"),
        )
        .unwrap();
        assert_eq!(c.jobs[0].overlap, Overlap::Replace);
        let c = parse(Path::new("jobs.toml"), JOB).unwrap();
        assert_eq!(c.jobs[0].overlap, Overlap::Skip);
        let e = err(&format!("{JOB}overlap = \"queue\"\n"));
        assert_eq!(e.line, Some(5), "{e}");
        assert!(e.to_string().contains("is not an overlap policy"), "{e}");
    }

    #[test]
    fn duplicates() {
        let e = err(&format!("{JOB}{JOB}"));
        assert_eq!(e.line, Some(6));
        assert!(e.message.contains("already used"));
    }

    /// A syntax error is worded and placed as before jobs.toml was read
    /// with toml 0.9: the duplicate key and its table named, an unclosed
    /// array at the end of the file; no key (the file is not TOML).
    #[test]
    fn syntax_errors_are_worded_and_placed_as_before() {
        let e = err(&format!("{JOB}name = \"b\"\n"));
        assert_eq!(
            (e.line, e.column, e.key.as_deref()),
            (Some(5), Some(1), None)
        );
        assert_eq!(e.message, "duplicate key `name` in table `job`");
        let e = err("[defaults]\nlease = \"10s\"\ncommand = [\n");
        assert_eq!((e.line, e.column), (Some(4), Some(1)));
        assert_eq!(e.message, "invalid array\nexpected `]`");
        let e = err("[defaults]\n[defaults]\n");
        assert_eq!((e.line, e.column), (Some(2), Some(1)));
        assert_eq!(
            e.message,
            "invalid table header\nduplicate key `defaults` in document root"
        );
        // What serde reports keeps its key path.
        let e = err(&format!("{JOB}timeout = 5\n"));
        assert_eq!((e.line, e.column), (Some(5), Some(11)));
        assert_eq!(e.key.as_deref(), Some("job[0].timeout"));
    }

    /// `n` jobs, each with a command and a workdir (whose places are
    /// recorded), a resource and a timeout.
    fn jobs(n: usize) -> String {
        (0..n)
            .map(|i| {
                format!(
                    "[[job]]\nname = \"j{i}\"\nschedule = \"0 */5 * * * *\"\ncommand = [\"true\", \"{i}\"]\nworkdir = \"/\"\ntimeout = \"1m\"\n\n"
                )
            })
            .collect()
    }

    /// CPU time this thread has used.
    fn thread_cpu() -> Duration {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
        Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
    }

    /// The least CPU time of three parses of `text`.
    fn parse_cpu(text: &str) -> Duration {
        (0..3)
            .map(|_| {
                let t0 = thread_cpu();
                let config = parse(Path::new("jobs.toml"), text).unwrap();
                let spent = thread_cpu() - t0;
                drop(config);
                spent
            })
            .min()
            .unwrap()
    }

    /// Loading grows linearly with the number of jobs (issue 30: every
    /// job's line and column used to be found by scanning the text before
    /// it, so 10,000 jobs took seconds, at start and on every SIGHUP). No
    /// wall-clock threshold: the CPU time of 8N jobs against N jobs, best of
    /// three each, is about 8x when linear (8.1x measured) and tends to 64x
    /// when quadratic; at these sizes a single scan of the text before each
    /// job already makes it about 20x (17x with 400 and 3,200 jobs); the bound,
    /// 14x, leaves room for a loaded machine's cache misses.
    #[test]
    fn load_time_is_linear_in_the_number_of_jobs() {
        let (small, large) = (jobs(600), jobs(4800));
        let (t_small, t_large) = (parse_cpu(&small), parse_cpu(&large));
        let ratio = t_large.as_secs_f64() / t_small.as_secs_f64().max(1e-6);
        assert!(
            ratio < 14.0,
            "8x the jobs took {ratio:.1}x the CPU time ({t_small:?} -> {t_large:?}): loading is not linear"
        );
    }

    /// A parser of `text` (with its own line index, leaked: tests only).
    fn parser(text: &str) -> Parser<'_> {
        Parser {
            path: Path::new("jobs.toml"),
            text,
            lines: Box::leak(Box::new(Lines::new(text))),
            base: 0,
            read_url_env: true,
            reuse: None,
            rest: None,
        }
    }

    /// A line and column.
    type At = (usize, usize);

    /// Every job's places: `Place` compares equal to every other.
    fn places(c: &Config) -> Vec<(At, Option<At>)> {
        c.jobs
            .iter()
            .map(|j| (j.place.command, j.place.workdir))
            .collect()
    }

    /// Files with tables between and under the jobs, comments, CRLF line
    /// ends, multi-line values and strings that look like headers.
    fn mixed(n: usize, crlf: bool) -> String {
        let mut text = String::from(
            "# fleet\n[node]\nid = \"n1\"\n\n[defaults]\nlease = \"2m\"\ntimezone = \"Europe/Paris\"\n",
        );
        for i in 0..n {
            text.push_str(&format!(
                "\n  [[job]] # {i}\nname = \"j{i}\"\nschedule = \"0 {} * * * *\"\ncommand = [\n  \"sh\",\n  \"-c\",\n  \"\"\"\n[[job]]\n[store]\"\"\",\n]\n",
                i % 60
            ));
            if i % 3 == 0 {
                text.push_str(&format!(
                    "workdir = '/tmp'\n[job.env]\nA = \"{i}\"\nB = '[x]'\n"
                ));
            }
            if i == n / 2 {
                text.push_str("[history]\nkeep = 7\n[http]\nlisten = \"127.0.0.1:9101\"\ntoken_file = \"/etc/fencecron/tokens\"\n");
            }
        }
        if crlf {
            text = text.replace('\n', "\r\n");
        }
        text
    }

    /// Parsed one job at a time, a file gives the config the whole parse
    /// gives, to every job's line and column.
    #[test]
    fn by_job_and_whole_agree() {
        for (text, n) in [
            (jobs(40), 40),
            (mixed(30, false), 30),
            (mixed(30, true), 30),
        ] {
            let p = parser(&text);
            let by_job = p.parse_by_job().expect("the file is cut at its jobs");
            let whole = p.parse_whole().unwrap();
            assert_eq!(by_job, whole);
            assert_eq!(places(&by_job), places(&whole));
            assert_eq!(by_job.jobs.len(), n);
        }
        let c = parse(Path::new("jobs.toml"), &mixed(4, false)).unwrap();
        assert_eq!(c.history.keep, 7);
        let token_file = c.http_token_file.as_ref().unwrap();
        assert_eq!(
            (token_file.at.line, token_file.at.column),
            (Some(49), Some(14))
        );
        assert_eq!(c.jobs[3].env.get("A").map(String::as_str), Some("3"));
        assert_eq!(c.jobs[2].command[2], "[[job]]\n[store]");
    }

    /// What the cut leaves to the whole parse, and every error, come out
    /// as the whole parse has them: the same config, or the same error at
    /// the same line, column and key.
    #[test]
    fn the_whole_parse_decides_shapes_and_errors() {
        let job = |i: usize| {
            format!("[[job]]\nname = \"j{i}\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n")
        };
        let four: String = (0..4).map(job).collect();
        // Valid, left to the whole parse: `[job.env]` after another table.
        let late_env = format!("{four}[defaults]\nlease = \"2m\"\n[job.env]\nA = \"1\"\n");
        let p = parser(&late_env);
        assert!(p.parse_by_job().is_none());
        let c = p.parse().unwrap();
        assert_eq!(c, p.parse_whole().unwrap());
        assert_eq!(c.jobs[3].env.get("A").map(String::as_str), Some("1"));
        for text in [
            format!("job = []\n{four}"),
            format!("{four}{}", job(2)),
            format!("[defaults]\nlease = \"soon\"\n{four}"),
            format!("{four}colour = \"red\"\n{}", job(9)),
            format!("[defaults]\n{four}[defaults]\n"),
            format!("{four}[[job]]\nname = \"x\nschedule = 1\n"),
            format!("{four}[history]\nkeep = 0\n"),
            format!("[[job]]\nname = \"a\"\n{four}"),
        ] {
            let p = parser(&text);
            assert!(p.parse_by_job().is_none(), "{text}");
            let whole = p.parse_whole().unwrap_err();
            assert_eq!(p.parse().unwrap_err(), whole, "{text}");
        }
    }

    /// Loading holds little more than the file and the jobs it keeps: the
    /// bytes held beyond what the config keeps peak at about 1.5 times the
    /// file (the names and resources checked for duplicates, the line
    /// index, one job's document), where the whole document took about 30
    /// times (issue 30: 41 MB to check 10,000 jobs), and the rest of the
    /// file parsed with its jobs blanked out 3.5 times (the parser reserves
    /// its tokens by the length of the text, blanks included). Counted by
    /// the tests' allocator, so no other thread's memory and no timing
    /// count; the bound, 2.5 times, fails with either.
    #[test]
    fn a_load_holds_little_beyond_the_file_and_its_jobs() {
        use crate::testing::alloc::held_by;
        let text = jobs(4800);
        let p = parser(&text);
        let (config, peak, kept) = held_by(|| p.parse().unwrap());
        let (whole, whole_peak, whole_kept) = held_by(|| p.parse_whole().unwrap());
        assert_eq!(config, whole);
        let (beyond, whole_beyond) = (peak - kept, whole_peak - whole_kept);
        assert!(
            2 * beyond < 5 * text.len(),
            "a load of {} bytes held {beyond} bytes beyond the {kept} its config keeps (the whole parse: {whole_beyond})",
            text.len()
        );
    }

    /// A reload keeps each job the file still has unchanged, wherever it
    /// moved in the file, and reads the others anew: what it returns is the
    /// config a fresh load returns, and beyond the file it holds little more
    /// than the list of the kept jobs (a SIGHUP of 10,000 jobs held them all
    /// twice, about 5 MB, for the moment of the reload: issue 30).
    #[test]
    fn a_reload_keeps_the_jobs_it_finds_unchanged() {
        use crate::testing::alloc::held_by;
        let text = jobs(4800);
        let first = parse(Path::new("jobs.toml"), &text).unwrap();
        // A job added at the top moves every other one; j7 changes.
        let edited = format!(
            "[[job]]\nname = \"new\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n\n{}",
            text.replace(
                "command = [\"true\", \"7\"]",
                "command = [\"false\", \"7\"]"
            )
        );
        let reuse = Reuse::of(&first.jobs);
        let reload = |text| {
            Parser {
                reuse: Some(&reuse),
                ..parser(text)
            }
            .parse()
            .unwrap()
        };
        let reloaded = reload(&edited);
        assert_eq!(reloaded, parse(Path::new("jobs.toml"), &edited).unwrap());
        let old = |name: &str| first.jobs.iter().find(|j| j.name.as_str() == name).unwrap();
        for job in &reloaded.jobs {
            let kept = match job.name.as_str() {
                "new" | "j7" => false,
                name => Arc::ptr_eq(job, old(name)),
            };
            let fresh = matches!(job.name.as_str(), "new" | "j7");
            assert!(kept != fresh, "job {}: kept {kept}", job.name);
        }
        assert_eq!(reloaded.jobs[8].command[0], "false");

        let fresh = parser(&text);
        let kept_again = Parser {
            reuse: Some(&reuse),
            ..fresh
        };
        let (again, peak, kept) = held_by(|| kept_again.parse().unwrap());
        let (_, fresh_peak, fresh_kept) = held_by(|| fresh.parse().unwrap());
        assert!(again
            .jobs
            .iter()
            .zip(&first.jobs)
            .all(|(a, b)| Arc::ptr_eq(a, b)));
        assert!(
            kept * 10 < fresh_kept && peak * 2 < fresh_peak,
            "a reload of the same file kept {kept} bytes (peak {peak}); a fresh load keeps {fresh_kept} (peak {fresh_peak})"
        );
    }

    /// With the mmap threshold fixed, a block above it is mapped apart even
    /// after a larger mapped block was freed; left to itself, glibc raises
    /// the threshold to that block's size and serves the next ones from the
    /// heaps, where a reload's large blocks left holes (BENCHMARKS.md,
    /// "Large blocks apart"). Read from the `IS_MMAPPED` bit (2) of the
    /// size word glibc keeps before each block it hands out. Checked in a
    /// process of its own (this test binary run again for this test alone):
    /// in one that ran other tests, a free block of the heap may fit the
    /// request, and glibc serves that before it maps anything.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn large_blocks_are_mapped_apart_after_a_larger_one_is_freed() {
        const CHILD: &str = "FENCECRON_TEST_MMAP_THRESHOLD_CHILD";
        let name = "config::tests::large_blocks_are_mapped_apart_after_a_larger_one_is_freed";
        if std::env::var_os(CHILD).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([name, "--exact", "--test-threads=1", "--nocapture"])
                .env(CHILD, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && text.contains("1 passed"),
                "the check in a fresh process failed ({}):\n{text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            return;
        }
        keep_large_blocks_apart();
        // SAFETY: plain malloc and free of blocks used by nothing else; the
        // word read lies just before `block`, in glibc's header of it.
        let mapped = unsafe {
            libc::free(libc::malloc(4 << 20));
            let block = libc::malloc(MMAP_THRESHOLD + 64 * 1024);
            assert!(!block.is_null());
            let size_word = block.cast::<usize>().sub(1).read();
            libc::free(block);
            size_word & 2 != 0
        };
        assert!(
            mapped,
            "a block of {} KiB came from the heap after a 4 MiB one was freed",
            (MMAP_THRESHOLD >> 10) + 64
        );
    }

    /// Lines and columns from the line index agree with counting from the
    /// start of the text, at every offset (a multi-byte character, an empty
    /// line, no final newline).
    #[test]
    fn line_and_column_of_every_offset() {
        let text = "a = 1\n\n[b]\nc = \"\u{e9}\"\nd";
        let lines = Lines::new(text);
        for offset in 0..=text.len() + 2 {
            let clamped = offset.min(text.len());
            if !text.is_char_boundary(clamped) {
                continue;
            }
            let before = &text[..clamped];
            let line = before.matches('\n').count() + 1;
            let column = before.rfind('\n').map_or(clamped, |nl| clamped - nl - 1) + 1;
            assert_eq!(lines.line_col(offset), (line, column), "offset {offset}");
        }
        let c = parse(Path::new("jobs.toml"), &jobs(3)).unwrap();
        assert_eq!(c.jobs[2].place.command, (18, 11));
        assert_eq!(c.jobs[2].place.workdir, Some((19, 11)));
    }
}

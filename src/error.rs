//! The crate's error type and its mapping to the documented exit codes.
//!
//! Library code returns typed errors that carry context; `main` prints the
//! one-sentence message and exits with [`Error::exit_code`].

use crate::config::ConfigError;
use crate::store::StoreError;

/// Exit code: success; also a command whose stdout reader went away.
pub(crate) const EXIT_OK: u8 = 0;
/// Exit code: runtime failure (store unreachable, I/O).
pub const EXIT_RUNTIME: u8 = 1;
/// Exit code: usage or configuration error.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: stale write rejected, or not the lease owner.
pub(crate) const EXIT_STALE: u8 = 3;
/// Exit code: what was asked for does not exist (`get` of a missing key),
/// distinct from [`EXIT_RUNTIME`], so a script can tell "nothing written
/// yet" from "the store could not be read".
pub(crate) const EXIT_MISSING: u8 = 4;
/// Exit code: `status` found a job overdue (an old instant without a run,
/// or no live node has the job). The same number as [`EXIT_STALE`]: both
/// mean "something is out of date", and a monitoring script tells them
/// apart by the command it ran.
pub(crate) const EXIT_OVERDUE: u8 = 3;
/// Exit code: the lease is held by another owner (EX_TEMPFAIL).
pub(crate) const EXIT_HELD: u8 = 75;
/// Exit code: the job's program could not be started (not found, not
/// executable), as a shell reports it; `exec` and `trigger --wait` alike.
pub(crate) const EXIT_CANNOT_START: u8 = 127;
/// Exit code: interrupted by SIGINT/SIGTERM before the work was done
/// (128 + SIGINT, as a shell reports it).
pub(crate) const EXIT_INTERRUPTED: u8 = 130;

/// How a command that did not fail ends. With [`Error::exit_code`] this is
/// the only source of fencecron's exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done: [`EXIT_OK`].
    Success,
    /// `exec`: the job's own shell-style code (its exit code, or 128 +
    /// signal), passed through.
    Job(u8),
    /// Stopped by a signal before finishing: [`EXIT_INTERRUPTED`].
    Interrupted,
    /// `status` printed everything and found a job overdue:
    /// [`EXIT_OVERDUE`].
    Overdue,
}

impl Exit {
    /// The process exit code.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => EXIT_OK,
            Exit::Job(code) => code,
            Exit::Interrupted => EXIT_INTERRUPTED,
            Exit::Overdue => EXIT_OVERDUE,
        }
    }
}

/// Everything a fencecron command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad flags or arguments.
    #[error("{0}")]
    Usage(String),
    /// jobs.toml could not be loaded or is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Not the lease owner (renew/release refused).
    #[error("{0}")]
    NotOwner(String),
    /// A fenced write was rejected as stale or forged.
    #[error("{0}")]
    Stale(String),
    /// The lease is held by another owner.
    #[error("{0}")]
    Held(String),
    /// A key or other thing asked for does not exist.
    #[error("{0}")]
    Missing(String),
    /// The job's program could not be started.
    #[error("{0}")]
    CannotStart(String),
    /// Local I/O or process failure.
    #[error("{0}")]
    Runtime(String),
    /// Stdout could not be written (see [`crate::output`]).
    #[error("cannot write the output to stdout ({0}); check where stdout goes, e.g. a full disk")]
    Output(std::io::Error),
}

impl Error {
    /// The process exit code docs/commands.md documents for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Usage(_) | Error::Config(_) => EXIT_USAGE,
            Error::Store(_) | Error::Runtime(_) => EXIT_RUNTIME,
            Error::Missing(_) => EXIT_MISSING,
            Error::CannotStart(_) => EXIT_CANNOT_START,
            Error::NotOwner(_) | Error::Stale(_) => EXIT_STALE,
            Error::Held(_) => EXIT_HELD,
            Error::Output(_) if self.is_closed_pipe() => EXIT_OK,
            Error::Output(_) => EXIT_RUNTIME,
        }
    }

    /// Whether this is stdout's reader having gone away (`… | head`): the
    /// reader stopped on purpose, so the command ends quietly with
    /// [`EXIT_OK`] and prints nothing (see [`crate::output`]).
    pub fn is_closed_pipe(&self) -> bool {
        matches!(self, Error::Output(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// Shorthand for results in this crate.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

//! fencecron: a job-runner daemon with fenced execution.
//!
//! Instances on several hosts compete for per-job leases in one shared SQL
//! store; the winner runs the job with a monotonically increasing fencing
//! token in its environment, renews the lease in the background and kills
//! the job before it can no longer prove ownership. See `ARCHITECTURE.md`
//! for the module map and the invariants each module owns.

// Stdout is written only through `output::Out`, whose errors are values, not
// panics (a closed pipe, a full disk).
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub(crate) mod backoff;
pub mod cli;
pub(crate) mod clock;
pub mod commands;
pub mod config;
pub(crate) mod daemon;
pub mod domain;
pub mod error;
pub(crate) mod events;
pub mod fence;
pub(crate) mod fleet;
pub(crate) mod guard;
pub(crate) mod job_env;
pub mod logging;
pub(crate) mod metrics;
pub mod names;
pub mod output;
pub mod proctree;
pub(crate) mod proxy;
pub(crate) mod runs;
pub(crate) mod schedule;
pub mod shim;
pub(crate) mod signals;
pub mod store;
pub(crate) mod supervise;
#[cfg(test)]
mod testing;
pub(crate) mod timing;
pub(crate) mod web;

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

pub mod backoff;
pub mod cli;
pub mod clock;
pub mod commands;
pub mod config;
pub mod daemon;
pub mod domain;
pub mod error;
pub mod events;
pub mod fence;
pub mod fleet;
pub mod guard;
pub mod job_env;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod output;
pub mod proctree;
pub mod proxy;
pub mod runs;
pub mod schedule;
pub mod shim;
pub mod signals;
pub mod store;
pub mod supervise;
#[cfg(test)]
mod testing;
pub mod timing;
pub mod web;

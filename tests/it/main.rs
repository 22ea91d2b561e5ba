//! The integration tests: one test binary, one module per area, and one
//! helper kit ([`common`]) that every module shares.
//!
//! Run one area or one test by name, as with any libtest binary:
//! `cargo test --test it -- cli::`, `cargo test -- clock_behind`.

mod common;

mod check;
mod cli;
mod daemon;
mod daemon_faults;
mod disk_full;
mod failover;
mod fencing;
mod hardening;
mod job_credentials;
mod migrate;
mod recipes;
mod store_conformance;
mod takeover;
mod watchdog;

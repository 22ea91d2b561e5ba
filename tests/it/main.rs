//! The integration tests: one test binary, one module per area, and one
//! helper kit ([`common`]) that every module shares.
//!
//! Run one area or one test by name, as with any libtest binary:
//! `cargo test --test it -- cli::`, `cargo test -- clock_behind`.

/// Says that (part of) a test did not run, and why, where a newcomer sees
/// it: straight to the process's stderr, which libtest does not capture
/// (its capture only takes `eprintln!`), so the line shows in `cargo test`'s
/// own output instead of vanishing with a passing test's.
macro_rules! skipped {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

mod common;

mod check;
mod check_connect;
mod cli;
mod daemon;
mod daemon_faults;
mod disk_full;
mod drain;
mod failover;
mod fencing;
mod fleet;
mod guard;
mod hardening;
mod job_credentials;
mod migrate;
mod multi_host;
mod nodes;
mod patroni;
mod policies;
mod process_tree;
mod proxy;
mod recipes;
mod retention;
mod store_errors;
mod takeover;
mod watchdog;
mod web;

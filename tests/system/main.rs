//! Tests that change the machine itself: install the package system-wide
//! (`/etc/fencecron`, the `fencecron` user). They are a test binary of their
//! own because cargo runs test binaries one after another: while one of
//! these holds `/etc/fencecron/jobs.toml`, no test of `tests/it/` runs, so
//! none of them reads a default config it did not expect.
//!
//! `cargo test --test system` runs them alone; `cargo test` runs them after
//! the integration tests.

/// As in `tests/it/main.rs`: a line straight to stderr that libtest does
/// not capture.
macro_rules! skipped {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

// The one helper kit of the integration tests; this binary uses a part.
#[path = "../it/common/mod.rs"]
#[allow(dead_code, unused_macros, unused_imports)]
mod common;

mod install;

//! Helpers shared by `tests/store_conformance.rs` and `tests/cli.rs`:
//! opening a real store through the library, and running the real binary
//! with an environment that no outer `FENCECRON_*` variable can leak into.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use fencecron::store::{open, OpenOptions, Store, StoreUrl};

use super::{bin, TestStore};

/// Opens the test's store through the library and applies the migrations.
pub async fn open_store(ts: &TestStore, max_connections: u32) -> Arc<dyn Store> {
    let url = StoreUrl::parse(&ts.url).expect("test store URL parses");
    let store = open(
        &url,
        &OpenOptions {
            max_connections,
            call_timeout: Duration::from_secs(20),
        },
    )
    .expect("store opens");
    store.migrate().await.expect("migrations apply");
    store
}

/// Every variable the binary reads; removed so the caller's shell cannot
/// change what a test sees.
const FENCECRON_VARS: &[&str] = &[
    "FENCECRON_CONFIG",
    "FENCECRON_STORE",
    "FENCECRON_STORE_FILE",
    "FENCECRON_LOG_FORMAT",
    "FENCECRON_LOG",
    "RUST_LOG",
    "FENCECRON_RESOURCE",
    "FENCECRON_TOKEN",
    "FENCECRON_OWNER_ID",
    "FENCECRON_EXPIRES_AT",
    "FENCECRON_JOB",
    "FENCECRON_SCHEDULED_AT",
    "FENCECRON_NODE",
    "STATE_DIRECTORY",
];

/// A `fencecron` invocation with a clean environment, run in `cwd` (so a
/// default SQLite file could never land in the repository).
pub fn fencecron(cwd: &Path) -> Command {
    clean(Command::new(bin()), cwd)
}

/// Any command (e.g. `faketime` wrapping the binary) with the same clean
/// environment and working directory as [`fencecron`].
pub fn clean(mut cmd: Command, cwd: &Path) -> Command {
    for v in FENCECRON_VARS {
        cmd.env_remove(v);
    }
    cmd.current_dir(cwd).stdin(Stdio::null());
    cmd
}

/// Runs a command, feeding `stdin` when given, and returns its output.
pub fn run(mut cmd: Command, stdin: Option<&[u8]>) -> Output {
    let out = if let Some(input) = stdin {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn fencecron");
        let mut pipe = child.stdin.take().expect("stdin pipe");
        let input = input.to_vec();
        // Write from another thread so a large value cannot deadlock against
        // a full stdout pipe.
        let writer = std::thread::spawn(move || {
            pipe.write_all(&input).expect("write stdin");
        });
        let out = child.wait_with_output().expect("wait for fencecron");
        writer.join().expect("stdin writer");
        out
    } else {
        cmd.output().expect("run fencecron")
    };
    out
}

/// The exit code, panicking (with the output) when killed by a signal.
pub fn code(out: &Output) -> i32 {
    out.status
        .code()
        .unwrap_or_else(|| panic!("fencecron died by a signal: {}", describe(out)))
}

/// Stdout and stderr, for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

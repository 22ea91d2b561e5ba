//! Opening a real store through the library, and running commands — the
//! real binary above all — with an environment that no outer `FENCECRON_*`
//! variable can leak into: one list of those variables, one runner.

use std::borrow::BorrowMut;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
            ..OpenOptions::default()
        },
    )
    .expect("store opens");
    store.migrate().await.expect("migrations apply");
    store
}

/// Every variable the binary reads, and those the daemon sets for its jobs;
/// removed so the caller's shell cannot change what a test sees. The one
/// list every command a test starts goes through ([`scrub`]).
const FENCECRON_VARS: &[&str] = &[
    "FENCECRON_CONFIG",
    "FENCECRON_STORE",
    "FENCECRON_STORE_FILE",
    "FENCECRON_LOG_FORMAT",
    "FENCECRON_LOG",
    "RUST_LOG",
    "FENCECRON_RESOURCE",
    "FENCECRON_TOKEN",
    "FENCECRON_FENCING_HEADER",
    "FENCECRON_OWNER_ID",
    "FENCECRON_EXPIRES_AT",
    "FENCECRON_JOB",
    "FENCECRON_SCHEDULED_AT",
    "FENCECRON_NODE",
    "STATE_DIRECTORY",
];

/// Removes every variable of the outer environment that fencecron reads
/// from `cmd`'s environment; set the ones a test wants afterwards.
pub fn scrub(cmd: &mut Command) -> &mut Command {
    for v in FENCECRON_VARS {
        cmd.env_remove(v);
    }
    cmd
}

/// A `fencecron` invocation with a clean environment, run in `cwd` (so a
/// default SQLite file could never land in the repository).
pub fn fencecron(cwd: &Path) -> Command {
    clean(Command::new(bin()), cwd)
}

/// Any command (e.g. `faketime` wrapping the binary) with the same clean
/// environment and working directory as [`fencecron`].
pub fn clean(mut cmd: Command, cwd: &Path) -> Command {
    scrub(&mut cmd).current_dir(cwd).stdin(Stdio::null());
    cmd
}

/// How long a command run by [`run`] may take before the test fails: only a
/// bound on a hang, never a measure of speed.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// How much of each output stream [`run`] echoes.
const ECHO_LIMIT: usize = 4096;

/// Runs a short command to completion and returns its output: the one
/// runner of the tests. `cmd` is a `Command` or a `&mut Command`; `stdin`
/// is fed to it when given (else it reads an empty stdin). The command and
/// the start of its output are echoed to the test's stderr, which libtest
/// shows when the test fails. A command still running after [`RUN_LIMIT`]
/// is killed and the test panics.
pub fn run(mut cmd: impl BorrowMut<Command>, stdin: Option<&[u8]>) -> Output {
    let cmd = cmd.borrow_mut();
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    // Every pipe has its own thread, so a large stdin cannot deadlock
    // against a full stdout pipe.
    let writer = stdin.map(|input| {
        let mut pipe = child.stdin.take().expect("stdin pipe");
        let input = input.to_vec();
        std::thread::spawn(move || {
            // The command may exit without reading all of it.
            let _ = pipe.write_all(&input);
        })
    });
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = pipe.read_to_end(&mut b);
            b
        })
    };
    let out_t = reader(Box::new(child.stdout.take().expect("stdout pipe")));
    let err_t = reader(Box::new(child.stderr.take().expect("stderr pipe")));
    let deadline = Instant::now() + RUN_LIMIT;
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if let Some(w) = writer {
        w.join().expect("stdin writer");
    }
    let out = Output {
        status,
        stdout: out_t.join().expect("stdout reader"),
        stderr: err_t.join().expect("stderr reader"),
    };
    let echo = |b: &[u8]| {
        let text = String::from_utf8_lossy(&b[..b.len().min(ECHO_LIMIT)]);
        let more = b.len().saturating_sub(ECHO_LIMIT);
        if more > 0 {
            format!("{}… ({more} more bytes)", text.trim_end())
        } else {
            text.trim_end().to_string()
        }
    };
    eprintln!(
        "$ {cmd:?}\n  -> {status}\n  stdout: {}\n  stderr: {}",
        echo(&out.stdout),
        echo(&out.stderr)
    );
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

/// Makes `cmd` start in the cgroup v2 directory `dir` (it moves itself
/// there between fork and exec, so it never runs outside it).
pub fn into_cgroup(cmd: &mut Command, dir: &Path) {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let procs = std::ffi::CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
        .expect("cgroup path without NUL");
    // SAFETY: between fork and exec the closure makes only
    // async-signal-safe system calls on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let n = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if n == 1 {
                Ok(())
            } else {
                Err(err)
            }
        });
    }
}

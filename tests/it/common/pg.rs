//! Throwaway PostgreSQL servers of the tests' own: initdb and `pg_ctl` as
//! the `postgres` OS user, in a temporary directory that user owns, on free
//! loopback ports (the failover test's primary and standby, the time-zone
//! test's server under `faketime`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::harness::describe;

/// The directory of `initdb`, `pg_ctl`, `pg_basebackup`, if any.
pub fn pg_bindir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("FENCECRON_TEST_PG_BINDIR") {
        return Some(PathBuf::from(dir));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("bin"))
        .filter(|bin| bin.join("initdb").is_file() && bin.join("pg_basebackup").is_file())
        .collect();
    found.sort();
    found.pop()
}

/// Why the test cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("it must run as root to start PostgreSQL as the postgres user".into());
    }
    if pg_bindir().is_none() {
        return Some(
            "no PostgreSQL server binaries (set FENCECRON_TEST_PG_BINDIR or install postgresql)"
                .into(),
        );
    }
    let postgres_user = Command::new("id").args(["-u", "postgres"]).output();
    if !postgres_user.is_ok_and(|o| o.status.success()) {
        return Some("there is no `postgres` OS user".into());
    }
    None
}

/// Whether `test` must skip because it cannot start servers here: it then
/// says why (`*** SKIPPED … ***`); under `CI=true` it fails instead.
pub fn skip_unless_available(test: &str) -> bool {
    let Some(why) = unavailable() else {
        return false;
    };
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{test}: {why}; under CI=true this test must run");
    }
    skipped!("\n*** SKIPPED {test}: {why}. ***\n");
    true
}

/// Runs a PostgreSQL program as the `postgres` OS user; panics with its
/// output when it fails.
pub fn as_postgres(bindir: &Path, program: &str, args: &[&str]) -> Output {
    as_postgres_under(None, bindir, program, args)
}

/// libfaketime itself. A server is started with it preloaded rather than
/// under the `faketime` wrapper, which waits for every process that
/// inherited its clock (the server outlives `pg_ctl`).
pub fn libfaketime() -> &'static str {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| Path::new(p).is_file())
    .expect("libfaketime is not installed; .ci/run installs it (apt-get install faketime)")
}

/// [`as_postgres`] with libfaketime preloaded and `FAKETIME=OFFSET` when
/// given (the program's children, a server started by `pg_ctl`, inherit
/// the fake clock).
pub fn as_postgres_under(
    faketime: Option<&str>,
    bindir: &Path,
    program: &str,
    args: &[&str],
) -> Output {
    let mut cmd = Command::new("runuser");
    cmd.args(["-u", "postgres", "--"]);
    if let Some(offset) = faketime {
        cmd.arg("env")
            .arg(format!("LD_PRELOAD={}", libfaketime()))
            .arg(format!("FAKETIME={offset}"));
    }
    let out = cmd
        .arg(bindir.join(program))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        describe(&out)
    );
    out
}

/// One PostgreSQL server of the test.
pub struct Instance {
    pub name: &'static str,
    pub bindir: PathBuf,
    pub data: PathBuf,
    pub sockets: PathBuf,
    pub port: u16,
}

impl Instance {
    pub fn start(&self) {
        self.start_under(None)
    }

    /// Starts the server with libfaketime's `FAKETIME=OFFSET` (e.g.
    /// `"-3600s"`) when given: its `now()` is the real time moved by the
    /// offset.
    pub fn start_under(&self, faketime: Option<&str>) {
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -c port={} -k {} -c fsync=off -c wal_keep_size=64MB",
            self.port,
            self.sockets.display()
        );
        let log = self.data.with_extension("log");
        as_postgres_under(
            faketime,
            &self.bindir,
            "pg_ctl",
            &[
                "-D",
                &self.data.display().to_string(),
                "-l",
                &log.display().to_string(),
                "-w",
                "-t",
                "30",
                "-o",
                &opts,
                "start",
            ],
        );
    }

    /// `pg_ctl stop -m fast`: a clean shutdown.
    pub fn stop(&self) {
        as_postgres(
            &self.bindir,
            "pg_ctl",
            &[
                "-D",
                &self.data.display().to_string(),
                "-m",
                "fast",
                "-w",
                "-t",
                "30",
                "stop",
            ],
        );
    }

    /// `pg_ctl stop -m immediate`: no shutdown checkpoint, no waiting for
    /// the standby; a crash, as far as the data is concerned.
    pub fn crash(&self) -> std::io::Result<Output> {
        Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bindir.join("pg_ctl"))
            .args(["-D", &self.data.display().to_string()])
            .args(["-m", "immediate", "-w", "-t", "30", "stop"])
            .output()
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.data.with_extension("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// A temporary directory the `postgres` OS user owns, for servers' data
/// and sockets; it goes when dropped.
pub fn postgres_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("fencecron-pg-")
        .tempdir()
        .expect("temp dir");
    let chown = Command::new("chown")
        .args(["postgres:", &dir.path().display().to_string()])
        .output()
        .expect("chown");
    assert!(chown.status.success(), "{}", describe(&chown));
    dir
}

impl Instance {
    /// A server named `name` with its data in `dir` (from [`postgres_dir`])
    /// on a free port; nothing is created yet.
    pub fn new(dir: &Path, name: &'static str) -> Instance {
        Instance {
            name,
            bindir: pg_bindir().expect("checked by unavailable()"),
            data: dir.join(name),
            sockets: dir.to_path_buf(),
            port: super::free_port(),
        }
    }

    /// `initdb`: trust authentication for `postgres`, no fsync.
    pub fn initdb(&self) {
        as_postgres(
            &self.bindir,
            "initdb",
            &[
                "-D",
                &self.data.display().to_string(),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
            ],
        );
    }
}

/// One initialised server (not started) in its own temporary directory,
/// which goes when the returned directory is dropped.
pub fn standalone(name: &'static str) -> (tempfile::TempDir, Instance) {
    let dir = postgres_dir();
    let pg = Instance::new(dir.path(), name);
    pg.initdb();
    (dir, pg)
}

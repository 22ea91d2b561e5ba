//! The README's "Install on a host", run as written, on this machine.
//!
//! The shell block of that section is read from README.md itself, so the
//! README cannot drift from what is tested. Each of its lines is run as
//! written, but for what this machine must do differently, and a line the
//! test does not know fails it (teach the test, or fix the README):
//!
//! - `cargo build`: the binaries under test are the build;
//!   `packaging/build-deb.sh` gets them as BIN_DIR (gzip -1 for speed) and
//!   `apt install` of the package is `dpkg -i` (what apt runs; no network);
//! - `sudo -u USER` is `runuser -u USER --`, other `sudo` is dropped (the
//!   test is root; Debian has no `sudo` by default);
//! - the database URL is one of this test's own (a role with a password,
//!   on the PostgreSQL server of `FENCECRON_TEST_POSTGRES_URL`);
//! - `editor FILE # uncomment LINE` uncomments LINE in FILE;
//! - systemd (not PID 1 here) is replaced by running the installed unit's
//!   `ExecStart=` as its `User=`/`Group=`, with its `EnvironmentFile=`,
//!   `UMask=`, `STATE_DIRECTORY`/`RUNTIME_DIRECTORY` made with the unit's
//!   modes, and a `NOTIFY_SOCKET` the test waits on for `READY=1`;
//!   `systemctl status` checks it still runs, `journalctl` reads its log.
//!
//! Then the day-two commands run as root and as `fencecron`, with no flags
//! and no environment but `PATH`, and a user outside group `fencecron` is
//! told how to get access. The guard stops the daemon and purges the
//! package, `/etc/fencecron` and the `fencecron` user and group even when
//! the test fails. It installs system-wide: it needs root and `dpkg`, takes
//! a lock so only one runs at a time on the host, and skips (loudly) where
//! fencecron is already installed.

use std::fs;
use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::Executor;

use crate::common::daemon::secs;
use crate::common::harness::{describe, run};
use crate::common::{self, unique, Backend, TestStore};

const TEST: &str = "readme_install_steps_work_as_written";
/// The `PATH` every command runs with: the system's, so `fencecron` is the
/// package's `/usr/bin/fencecron`.
const PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
const UNIT: &str = "/lib/systemd/system/fencecron.service";
const ETC: &str = "/etc/fencecron";
const USER: &str = "fencecron";

#[test]
fn readme_install_steps_work_as_written() {
    if !nix::unistd::Uid::effective().is_root() {
        skipped!(
            "\n*** SKIPPED {TEST}: it installs a package system-wide; run the tests as root ***\n"
        );
        return;
    }
    if !succeeds(Command::new("dpkg").arg("--version")) {
        skipped!("\n*** SKIPPED {TEST}: dpkg is not installed (a Debian or Ubuntu host) ***\n");
        return;
    }
    // Root and dpkg: anything else missing fails under CI.
    if !succeeds(Command::new("runuser").arg("--version")) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{TEST}: runuser (util-linux) is missing under CI=true"
        );
        skipped!("\n*** SKIPPED {TEST}: runuser (util-linux) is not installed ***\n");
        return;
    }
    let Some(ts) = TestStore::new(Backend::Postgres, TEST) else {
        return;
    };
    let lock = fs::File::create(std::env::temp_dir().join("fencecron-install-test.lock")).unwrap();
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("lock");
    for (what, there) in [
        (ETC, Path::new(ETC).exists()),
        ("the user fencecron", user(USER).is_some()),
        (
            "the package fencecron",
            succeeds(Command::new("dpkg").args(["-s", "fencecron"])),
        ),
    ] {
        if there {
            skipped!("\n*** SKIPPED {TEST}: {what} already exists on this host; the test installs and purges fencecron system-wide, so it leaves an existing install alone ***\n");
            return;
        }
    }

    // A database of the test's own, reached as a role with a password, as
    // a fleet's would be. Dropped last.
    let db = Database::create(&ts.url);
    let mut host = Host::default();
    let build = tempfile::tempdir().unwrap();
    let mut deb = None;
    let mut daemon_up = false;

    for step in readme_install_block() {
        let (command, comment) = match step.split_once(" # ") {
            Some((c, note)) => (c.trim(), note.trim()),
            None => (step.trim(), ""),
        };
        eprintln!("README: {step}");
        if command.starts_with("cargo build ") {
            // The binaries under test are what was built.
        } else if command == "packaging/build-deb.sh" {
            let root = Path::new(env!("CARGO_MANIFEST_DIR"));
            let out = run(
                {
                    let mut c = Command::new(root.join(command));
                    c.arg(common::bin().parent().unwrap())
                        .arg(build.path())
                        .env("DEB_COMPRESS", "gzip:1");
                    c
                },
                None,
            );
            assert!(out.status.success(), "{}", describe(&out));
            deb = Some(String::from_utf8_lossy(&out.stdout).trim().to_string());
        } else if command.starts_with("sudo apt install ") && command.ends_with("/fencecron_*.deb")
        {
            let deb = deb
                .as_ref()
                .expect("the README builds the package before installing it");
            host.installed = true;
            let out = run(cmd("dpkg", &["-i", deb]), None);
            assert!(out.status.success(), "{}", describe(&out));
            assert!(user(USER).is_some(), "the package created no user {USER}");
        } else if let Some(file) = command.strip_prefix("sudo editor ") {
            let line = comment
                .strip_prefix("uncomment ")
                .and_then(|l| l.split(';').next())
                .unwrap_or_else(|| {
                    panic!("{TEST}: the editor step says no `uncomment LINE`: {step}")
                })
                .trim();
            let text = fs::read_to_string(file).unwrap();
            let commented = format!("# {line}");
            assert_eq!(
                text.lines().filter(|l| l.trim() == commented).count(),
                1,
                "{file} has no single `{commented}` line to uncomment:\n{text}"
            );
            let edited: String = text
                .lines()
                .map(|l| if l.trim() == commented { line } else { l })
                .flat_map(|l| [l, "\n"])
                .collect();
            // "add jobs": one that writes through the store, as the
            // service user, inside the daemon's sandbox of environment.
            let job = if comment.contains("add jobs") {
                JOB
            } else {
                ""
            };
            fs::write(file, edited + job).unwrap();
        } else if command == "sudo systemctl enable --now fencecron" {
            host.daemon = Some(Daemon::start());
            daemon_up = true;
        } else if command == "systemctl status fencecron" {
            let d = host.daemon.as_mut().expect("started");
            assert!(
                d.child.try_wait().unwrap().is_none(),
                "the daemon exited:\n{}",
                d.log()
            );
        } else if command.starts_with("journalctl -u fencecron") {
            let d = host.daemon.as_ref().expect("started");
            let log = d.log();
            assert!(
                log.lines().any(|l| l.contains("event=\"daemon_started\"")
                    && l.contains("scope=\"fleet\"")
                    && l.contains(&db.name)),
                "no daemon_started with scope=fleet on the test's database:\n{log}"
            );
            assert!(
                !log.contains(&db.password),
                "the password is in the log:\n{log}"
            );
        } else if command.contains("sudo ") {
            let script = as_root_or_user(command).replace(README_URL, &db.url);
            assert!(
                !command.contains("postgres://") || script.contains(&db.url),
                "{TEST}: the README's URL is not `{README_URL}` any more: {step}"
            );
            let out = run(cmd("sh", &["-c", &script]), None);
            assert!(out.status.success(), "{script}: {}", describe(&out));
            if command.contains(" check --connect") {
                assert!(
                    stdout(&out).contains("fences every daemon that uses it"),
                    "check does not say the store fences a fleet: {}",
                    describe(&out)
                );
            }
        } else {
            panic!("{TEST}: README's install line `{step}` is not one the test knows how to run; teach tests/system/install.rs");
        }
    }
    assert!(daemon_up, "the README's install steps started no daemon");
    let d = host.daemon.as_mut().unwrap();
    let deadline = Instant::now() + secs(60);
    while !d.log().lines().any(|l| {
        l.contains("event=\"job_finished\"")
            && l.contains("job=\"install-check\"")
            && l.contains("outcome=\"succeeded\"")
    }) {
        assert!(
            Instant::now() < deadline && d.child.try_wait().unwrap().is_none(),
            "the job did not succeed:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Day two: as root and as the service user, no flags, no environment.
    for args in [
        &["check", "--connect"][..],
        &["status"],
        &["nodes"],
        &["lease", "list"],
    ] {
        for user in ["root", USER] {
            let out = run(as_user(user, args), None);
            assert!(
                out.status.success(),
                "{user}: fencecron {args:?}: {}",
                describe(&out)
            );
            // `nodes` lists daemons, not jobs: the one started above, running.
            if args[0] == "nodes" {
                assert!(stdout(&out).contains(" running "), "{}", describe(&out));
            } else if args[0] != "check" {
                assert!(stdout(&out).contains("install-check"), "{}", describe(&out));
            }
            if args[0] == "check" {
                let text = stdout(&out);
                assert!(
                    text.contains(&db.name) && text.contains("fences every daemon that uses it"),
                    "{user}: check names another store: {}",
                    describe(&out)
                );
            }
        }
    }
    // A user outside group fencecron is told how to get in, not to pass
    // --config.
    let out = run(as_user("nobody", &["status"]), None);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(
        err.contains("group `fencecron`") && err.contains("root") && !err.contains("pass --config"),
        "{err}"
    );

    let mut d = host.daemon.take().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = Instant::now() + secs(60);
    let status = loop {
        if let Some(status) = d.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not stop on SIGTERM:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}:\n{}", d.log());
    assert!(d.log().contains("event=\"daemon_stopped\""), "{}", d.log());
    host.teardown(true);
}

/// The job the test adds where the README says "add jobs": `fencecron
/// put` inside it reaches the store the daemon read from `url_file`.
const JOB: &str = r#"
[[job]]
name = "install-check"
schedule = "* * * * * *"
command = ["fencecron", "put", "last-run", "--value", "ok"]
"#;

/// The URL the README's install block writes, replaced by the test's own.
const README_URL: &str = "postgres://fencecron:SECRET@db.internal/fencecron";

/// The commands of the first `sh` block under "## Install on a host" in
/// README.md: comments and blank lines dropped, continued lines joined.
fn readme_install_block() -> Vec<String> {
    let readme =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = &readme[readme
        .find("\n## Install on a host\n")
        .expect("README.md has a section `## Install on a host`")..];
    let start = section.find("```sh\n").expect("an sh block") + "```sh\n".len();
    let end = start + section[start..].find("```").expect("the block ends");
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in section[start..end].lines() {
        let line = line.trim();
        if current.is_empty() && (line.is_empty() || line.starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    assert!(current.is_empty(), "the block ends in a continued line");
    commands
}

/// A README line for a root shell: `sudo -u USER` becomes
/// `runuser -u USER --`, any other `sudo` goes.
fn as_root_or_user(command: &str) -> String {
    let mut words = command.split(' ').filter(|w| !w.is_empty());
    let mut out: Vec<String> = Vec::new();
    while let Some(w) = words.next() {
        if w != "sudo" {
            out.push(w.to_string());
        } else if let Some(flag) = words.next() {
            if flag == "-u" {
                let user = words.next().expect("sudo -u USER");
                out.push(format!("runuser -u {user} --"));
            } else {
                out.push(flag.to_string());
            }
        }
    }
    out.join(" ")
}

/// `fencecron ARGS` as `user` (root directly, others through runuser),
/// with only `PATH` in the environment.
fn as_user(user: &str, args: &[&str]) -> Command {
    let mut c = if user == "root" {
        Command::new("fencecron")
    } else {
        let mut c = Command::new("runuser");
        c.args(["-u", user, "--", "fencecron"]);
        c
    };
    c.args(args);
    system(c)
}

/// `program ARGS` as [`system`] runs it.
fn cmd(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    system(c)
}

/// A command with the system's `PATH` and nothing else, in `/`.
fn system(mut c: Command) -> Command {
    c.env_clear()
        .env("PATH", PATH)
        .env("HOME", "/root")
        .current_dir("/")
        .stdin(Stdio::null());
    c
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn succeeds(c: &mut Command) -> bool {
    c.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn user(name: &str) -> Option<nix::unistd::User> {
    nix::unistd::User::from_name(name).ok().flatten()
}

/// The last `KEY=` line of the installed unit.
fn unit_key(unit: &str, key: &str) -> String {
    unit.lines()
        .rev()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{UNIT} has no {key}=:\n{unit}"))
        .trim()
        .to_string()
}

/// The daemon as systemd would run the installed unit.
struct Daemon {
    child: Child,
    log: Arc<Mutex<String>>,
    _dirs: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Daemon {
        let unit = fs::read_to_string(UNIT).unwrap();
        let exec = unit_key(&unit, "ExecStart");
        assert!(
            !exec.contains(['"', '\'', '$']),
            "ExecStart= needs a real parser: {exec}"
        );
        let argv: Vec<&str> = exec.split_whitespace().collect();
        let account = user(&unit_key(&unit, "User")).expect("the unit's User= exists");
        let group = nix::unistd::Group::from_name(&unit_key(&unit, "Group"))
            .unwrap()
            .expect("the unit's Group= exists");
        let mode = |key: &str| u32::from_str_radix(&unit_key(&unit, key), 8).unwrap();
        let umask = mode("UMask");

        let dirs = tempfile::Builder::new()
            .prefix("fencecron-install-")
            .tempdir()
            .unwrap();
        fs::set_permissions(dirs.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let made = |name: &str, key: &str| {
            let d = dirs.path().join(name);
            fs::create_dir(&d).unwrap();
            chown(&d, Some(account.uid.as_raw()), Some(group.gid.as_raw())).unwrap();
            fs::set_permissions(&d, fs::Permissions::from_mode(mode(key))).unwrap();
            d
        };
        let state = made(&unit_key(&unit, "StateDirectory"), "StateDirectoryMode");
        let runtime = made(
            &format!("run-{}", unit_key(&unit, "RuntimeDirectory")),
            "RuntimeDirectoryMode",
        );
        let notify_path = dirs.path().join("notify");
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        fs::set_permissions(&notify_path, fs::Permissions::from_mode(0o666)).unwrap();

        let mut env: Vec<(String, String)> = vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            ("HOME".into(), account.dir.display().to_string()),
            ("USER".into(), account.name.clone()),
            ("LOGNAME".into(), account.name.clone()),
            ("STATE_DIRECTORY".into(), state.display().to_string()),
            ("RUNTIME_DIRECTORY".into(), runtime.display().to_string()),
            ("NOTIFY_SOCKET".into(), notify_path.display().to_string()),
        ];
        env.extend(environment_file(&unit_key(&unit, "EnvironmentFile")));

        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .envs(env)
            .uid(account.uid.as_raw())
            .gid(group.gid.as_raw())
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: umask is async-signal-safe and allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(umask));
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        {
            let log = log.clone();
            let mut stderr = child.stderr.take().unwrap();
            std::thread::spawn(move || {
                use std::io::Read;
                let mut buf = [0u8; 4096];
                while let Ok(n) = stderr.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    log.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let mut d = Daemon {
            child,
            log,
            _dirs: dirs,
        };
        // Type=notify: started once READY=1 arrives (the store answered).
        notify
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let deadline = Instant::now() + secs(120);
        let mut buf = [0u8; 4096];
        loop {
            if let Ok(n) = notify.recv(&mut buf) {
                if String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .any(|l| l == "READY=1")
                {
                    break;
                }
            }
            assert!(
                d.child.try_wait().unwrap().is_none(),
                "the daemon exited before READY=1:\n{}",
                d.log()
            );
            assert!(
                Instant::now() < deadline,
                "no READY=1 within 120 s:\n{}",
                d.log()
            );
        }
        d
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }
}

/// `EnvironmentFile=[-]PATH` read as systemd reads it: `KEY=VALUE` lines,
/// `#` and `;` comments, quotes around the value dropped; a missing file
/// is fine with the `-`.
fn environment_file(setting: &str) -> Vec<(String, String)> {
    let (optional, path) = match setting.strip_prefix('-') {
        Some(p) => (true, p),
        None => (false, setting),
    };
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => panic!("EnvironmentFile={setting}: {e}"),
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with(['#', ';']))
        .map(|l| {
            let (k, v) = l
                .split_once('=')
                .unwrap_or_else(|| panic!("{path}: not KEY=VALUE: {l}"));
            let v = v.trim();
            let v = v
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .or_else(|| v.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
                .unwrap_or(v);
            (k.trim().to_string(), v.to_string())
        })
        .collect()
}

/// What the test put on the host, taken off again even when it fails.
#[derive(Default)]
struct Host {
    installed: bool,
    daemon: Option<Daemon>,
}

impl Host {
    /// Stops the daemon, purges the package, then removes what the purge
    /// leaves: `/etc/fencecron` (the URL file) and the user and group.
    /// `strict`: each step must succeed (the test's own end).
    fn teardown(&mut self, strict: bool) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.child.kill();
            let _ = d.child.wait();
        }
        let mut failed = Vec::new();
        if std::mem::take(&mut self.installed) {
            let out = cmd("dpkg", &["-P", "fencecron"]).output();
            if !out.as_ref().is_ok_and(|o| o.status.success()) {
                failed.push(format!("dpkg -P fencecron: {out:?}"));
            }
            if let Err(e) = fs::remove_dir_all(ETC) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    failed.push(format!("rm -r {ETC}: {e}"));
                }
            }
            // userdel refuses while a process of the user lives: a job's
            // watchdog (fencecron-shim) outlives a killed daemon briefly.
            let deadline = Instant::now() + secs(30);
            while user(USER).is_some() && !succeeds(&mut cmd("userdel", &[USER])) {
                if Instant::now() > deadline {
                    failed.push(format!("userdel {USER}"));
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if nix::unistd::Group::from_name(USER).ok().flatten().is_some()
                && !succeeds(&mut cmd("groupdel", &[USER]))
            {
                failed.push(format!("groupdel {USER}"));
            }
        }
        if strict {
            assert!(failed.is_empty(), "cleaning up: {failed:?}");
            assert!(!Path::new(ETC).exists() && user(USER).is_none());
            assert!(!succeeds(Command::new("dpkg").args(["-s", "fencecron"])));
        } else if !failed.is_empty() {
            eprintln!("{TEST}: could not clean up: {failed:?}");
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.teardown(false);
    }
}

/// A PostgreSQL database and a role with a password that owns it, as the
/// fleet's store; both dropped on drop.
struct Database {
    admin_url: String,
    name: String,
    password: String,
    url: String,
}

impl Database {
    fn create(admin_url: &str) -> Database {
        let name = unique("fencecron_install").replace('-', "_");
        let password = uuid_like();
        let mut url = url::Url::parse(admin_url).unwrap();
        url.set_username(&name).unwrap();
        url.set_password(Some(&password)).unwrap();
        url.set_path(&format!("/{name}"));
        let db = Database {
            admin_url: admin_url.to_string(),
            url: url.to_string(),
            name,
            password,
        };
        db.admin(&[
            format!("CREATE ROLE {} LOGIN PASSWORD '{}'", db.name, db.password),
            format!("CREATE DATABASE {0} OWNER {0}", db.name),
        ]);
        db
    }

    /// Runs admin statements on a runtime of their own (the test may be
    /// unwinding).
    fn admin(&self, statements: &[String]) {
        let url = self.admin_url.clone();
        let statements = statements.to_vec();
        std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                let admin = sqlx::PgPool::connect(&url).await.unwrap();
                for s in statements {
                    admin.execute(s.as_str()).await.unwrap();
                }
                admin.close().await;
            })
        })
        .join()
        .expect("admin statements");
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        let url = self.admin_url.clone();
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            tokio::runtime::Runtime::new().unwrap().block_on(async {
                let admin = sqlx::PgPool::connect(&url).await?;
                admin
                    .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
                    .await?;
                admin
                    .execute(format!("DROP ROLE IF EXISTS {name}").as_str())
                    .await?;
                admin.close().await;
                Ok::<_, sqlx::Error>(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!(
                "{TEST}: could not drop database and role {}: {dropped:?}",
                self.name
            );
        }
    }
}

/// A random password of hex digits (no character a URL must escape).
fn uuid_like() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

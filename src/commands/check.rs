//! `fencecron check`: validate the config, look at what its jobs need on
//! this host, and show each job's next fire times.
//!
//! What only the host can tell (a job's `workdir`, its command) is looked
//! at here and not when the daemon loads the file: a directory created
//! later must not stop a daemon from starting. A path that is certainly
//! wrong here is an error; one that could still appear before the job runs
//! (under a volatile directory, or a bare command on a `PATH` that may not
//! be the daemon's) is a warning.
//!
//! With `--connect` it also asks the store, without changing it
//! ([`crate::store::probe`]): does it answer within [`CONNECT_LIMIT`], are
//! the migrations applied or can they be, does the user have the
//! privileges the daemon needs, how far is its clock from this host's. A
//! store the daemon could not use (unreachable, refused login, missing
//! database, migrations it cannot apply, missing privileges) exits 1.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;

use crate::cli::Cli;
use crate::config::{Config, ConfigError, Job};
use crate::error::{Error, Exit, Result};
use crate::output::{self, Out};
use crate::store::{probe, rfc3339, Backend, Clock, Probe};
use crate::supervise::workdir_problem;

use super::Context;

/// Directories whose content is made at boot or by other programs: a path
/// under one may exist by the time the job runs.
const VOLATILE: [&str; 4] = ["/tmp", "/var/tmp", "/run", "/dev/shm"];

/// How long `check --connect` gives the store to answer, connecting
/// included, before it exits 1 naming the timeout.
pub const CONNECT_LIMIT: Duration = Duration::from_secs(5);

/// A clock offset from which `check --connect` warns: NTP keeps hosts
/// within milliseconds, and a second moves when an instant runs.
const CLOCK_WARN_MS: i64 = 1000;

pub async fn run(cli: &Cli, connect: bool) -> Result<Exit> {
    let ctx = Context::load(cli, true)?;
    let Some(config) = ctx.config else {
        return Ok(Exit::Success);
    };
    // The web view's tokens: as `run` reads them (mode 0600, the format).
    if let Some(tokens) = &config.http_token_file {
        tokens.load()?;
    }
    let findings = host_findings(&config, std::env::var_os("PATH").as_deref(), &VOLATILE);
    let mut first_error = None;
    for f in findings {
        match f {
            Finding::Warning(w) => output::error_line(format_args!("warning: {w}")),
            Finding::Error(e) => {
                if first_error.is_none() {
                    first_error = Some(e);
                } else {
                    output::error_line(&e);
                }
            }
        }
    }
    if let Some(e) = first_error {
        return Err(Error::Config(e));
    }
    let mut out = Out::stdout();
    writeln!(
        out,
        "{}: ok, {} job(s), store {}",
        config.path.display(),
        config.jobs.len(),
        ctx.store_url
    )?;
    // A SQLite store on every host makes each host a fleet of one that
    // runs every job: said here, and by the daemon at start.
    writeln!(out, "{}", ctx.store_url.scope_line())?;
    let now = Utc::now();
    for job in &config.jobs {
        writeln!(
            out,
            "job {} (resource {}, schedule \"{}\" in {}, lease {}, renew every {}, kill grace {})",
            job.name,
            job.resource,
            job.schedule.expr(),
            job.schedule.tz(),
            humantime::format_duration(job.timing.lease),
            humantime::format_duration(job.timing.renew_every),
            humantime::format_duration(job.timing.kill_grace),
        )?;
        let jitter = job.schedule.jitter_offset();
        if !jitter.is_zero() {
            writeln!(
                out,
                "  jitter: every instant +{} (from the job's name; the same on every host)",
                humantime::format_duration(jitter)
            )?;
        }
        let tz = job.schedule.tz();
        for at in job.schedule.upcoming(now, 3) {
            // UTC first (what the logs and the store say), then, for a job
            // in another zone, the same instant on its own wall clock.
            if tz == chrono_tz::Tz::UTC {
                writeln!(out, "  next: {}", rfc3339(at))?;
            } else {
                writeln!(
                    out,
                    "  next: {}  ({})",
                    rfc3339(at),
                    super::fleet::local_time(at, tz)
                )?;
            }
        }
    }
    if !connect {
        return Ok(Exit::Success);
    }
    let found = probe(&ctx.store_url, CONNECT_LIMIT).await?;
    let report = report(&found);
    for line in &report.lines {
        writeln!(out, "{line}")?;
    }
    for w in &report.warnings {
        output::error_line(format_args!("warning: {w}"));
    }
    match report.problems.len() {
        0 => Ok(Exit::Success),
        1 => Err(Error::Runtime(report.problems.concat())),
        n => {
            for p in &report.problems {
                output::error_line(format_args!("error: {p}"));
            }
            Err(Error::Runtime(format!(
                "the daemon could not use the store {}: {n} problems, above; fix them and run `fencecron check --connect` again",
                ctx.store_url
            )))
        }
    }
}

/// What `check --connect` prints: lines on stdout, warnings, and the
/// problems that make the store unusable for the daemon (exit 1); each one
/// sentence.
#[derive(Debug, Default)]
struct Report {
    lines: Vec<String>,
    warnings: Vec<String>,
    problems: Vec<String>,
}

/// At most `n` items, then how many more.
fn some_of(items: &[String], n: usize) -> String {
    let mut s = items.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    if items.len() > n {
        s.push_str(&format!(" and {} more", items.len() - n));
    }
    s
}

fn millis(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn report(p: &Probe) -> Report {
    let mut r = Report::default();
    r.lines.push(match p.connect_time {
        Some(t) => format!(
            "store: answers: {} (connected in {})",
            p.answered,
            millis(t)
        ),
        None => format!("store: answers: {}", p.answered),
    });
    let m = &p.migrations;
    let applied = m.known.len() - m.pending.len();
    if let Some(refused) = &m.refused {
        r.problems.push(refused.clone());
    } else if m.unreadable {
        r.lines.push(format!(
            "store: migrations: which are applied is unknown, as user {} may not read fencecron_migrations",
            p.user
        ));
    } else if m.pending.is_empty() {
        r.lines
            .push(format!("store: migrations: all {} applied", m.known.len()));
    } else {
        let versions = m
            .pending
            .iter()
            .map(|v| format!("{v:04}"))
            .collect::<Vec<_>>()
            .join(", ");
        if m.cannot_apply.is_empty() && applied == 0 {
            r.lines.push(format!(
                "store: migrations: none of {} applied yet (a fresh database); they can be applied by user {}, as the daemon does at its first start",
                m.known.len(),
                p.user
            ));
        } else if m.cannot_apply.is_empty() {
            r.lines.push(format!(
                "store: migrations: {applied} of {} applied; {} pending ({versions}) can be applied by user {}, as the daemon does at its start",
                m.known.len(),
                m.pending.len(),
                p.user
            ));
        } else {
            r.problems.push(format!(
                "user {} cannot apply the {} pending migrations ({versions}) that the daemon applies at its start: it lacks {}; grant them, or apply the migrations once as a user that has them (any fencecron command does, e.g. `fencecron lease list`)",
                p.user,
                m.pending.len(),
                some_of(&m.cannot_apply, 6)
            ));
        }
    }
    if let Some(why) = &p.read_only {
        r.problems.push(format!(
            "the store's server ({}) is {why}: the daemon cannot write there; point the store URL at the primary, or list the cluster's hosts with ?target_session_attrs=read-write so that the primary is found",
            p.answered
        ));
    }
    if p.missing.is_empty() {
        r.lines.push(format!(
            "store: privileges: user {} has what the daemon needs ({})",
            p.user, p.checked
        ));
    } else {
        let grant = match p.backend {
            Backend::Postgres => "GRANT CREATE ON SCHEMA …, GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA … and GRANT USAGE ON ALL SEQUENCES IN SCHEMA … to it",
            Backend::MySql => "GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE, CREATE, ALTER, INDEX, CREATE ROUTINE, ALTER ROUTINE ON the database.* to it",
            Backend::Sqlite => "run fencecron as the user that owns the database and its directory",
        };
        r.problems.push(format!(
            "user {} lacks what the daemon needs on the store: {}; {grant}",
            p.user,
            p.missing.join(", ")
        ));
    }
    match p.clock {
        Clock::Kernel => r.lines.push(
            "store: clock: SQLite's clock is this host's kernel clock, so the offset is 0 by construction".into(),
        ),
        Clock::Measured { offset, round_trip } => {
            let side = if offset >= 0 { "ahead of" } else { "behind" };
            r.lines.push(format!(
                "store: clock: the store's clock is {} ms {side} this host's (measured at the middle of a {} round trip)",
                offset.abs(),
                millis(round_trip)
            ));
            if offset <= -CLOCK_WARN_MS {
                r.warnings.push(format!(
                    "this host's clock is {} ms ahead of the store's: the daemon here waits that long at each instant for the store's clock to reach it (occurrence_early), and more than 60 s ahead it skips the instant (clock_ahead); fix this host's time synchronisation (NTP)",
                    -offset
                ));
            } else if offset >= CLOCK_WARN_MS {
                r.warnings.push(format!(
                    "this host's clock is {offset} ms behind the store's: the daemon here competes for each instant that much late, and skips (clock_behind) an instant whose next one is already due by the store's clock; fix this host's time synchronisation (NTP)"
                ));
            }
        }
    }
    if p.backend == Backend::Sqlite {
        r.lines.push(
            "store: note: SQLite fences only the daemons of one host (they share this file and this kernel's clock); daemons on other hosts are not fenced against them: for several hosts use PostgreSQL or MySQL".into(),
        );
    }
    r
}

/// Something `check` found about the host rather than the file.
#[derive(Debug)]
enum Finding {
    /// The job would fail to start here.
    Error(ConfigError),
    /// The job would fail to start here unless something appears first.
    Warning(String),
}

/// What `check` finds on this host; `volatile` are the directories whose
/// content may appear later.
fn host_findings(
    config: &Config,
    path_var: Option<&std::ffi::OsStr>,
    volatile: &[&str],
) -> Vec<Finding> {
    let mut found = Vec::new();
    if config.jobs.is_empty() {
        found.push(Finding::Warning(format!(
            "{}: no [[job]] in the file; a daemon started with it runs nothing",
            config.path.display()
        )));
    }
    // Each directory and program is looked at once, however many jobs
    // name it (10,000 jobs running `true` in `/` would stat PATH 10,000
    // times).
    let path_dirs: Vec<PathBuf> = path_var
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default();
    let mut workdirs: HashMap<&Path, Option<String>> = HashMap::new();
    let mut found_on_path: HashMap<&str, bool> = HashMap::new();
    for job in &config.jobs {
        let mut workdir_ok = false;
        if let Some(dir) = &job.workdir {
            let problem = workdirs
                .entry(dir.as_path())
                .or_insert_with(|| workdir_problem(dir));
            workdir_ok = problem.is_none();
            if let Some(problem) = problem {
                let message = format!(
                    "{} {problem}; create the directory or fix the path",
                    dir.display()
                );
                found.push(classify(config, job, "workdir", dir, message, volatile));
            }
        }
        let program = job.command[0].as_str();
        let on_path = || {
            *found_on_path.entry(program).or_insert_with(|| {
                path_dirs
                    .iter()
                    .any(|d| executable_problem(&d.join(program)).is_none())
            })
        };
        found.extend(command_finding(
            config, job, workdir_ok, on_path, path_var, volatile,
        ));
    }
    found
}

/// An error, or a warning when `path` lies under a volatile directory.
fn classify(
    config: &Config,
    job: &Job,
    key: &str,
    path: &Path,
    message: String,
    volatile: &[&str],
) -> Finding {
    let at = match key {
        "workdir" => job.place.workdir.unwrap_or(job.place.command),
        _ => job.place.command,
    };
    let e = config.error_at(at, &job.name, key, message);
    if volatile.iter().any(|v| path.starts_with(v)) {
        Finding::Warning(format!("{e} (it may still appear before the job runs)"))
    } else {
        Finding::Error(e)
    }
}

/// What is wrong with a job's program, if anything: `workdir_ok` when its
/// workdir exists, `on_path` whether a bare program name is found on PATH.
fn command_finding(
    config: &Config,
    job: &Job,
    workdir_ok: bool,
    on_path: impl FnOnce() -> bool,
    path_var: Option<&std::ffi::OsStr>,
    volatile: &[&str],
) -> Option<Finding> {
    let program = Path::new(&job.command[0]);
    if job.command[0].contains('/') {
        let full: PathBuf = match (&job.workdir, program.is_absolute()) {
            (_, true) => program.to_path_buf(),
            // Relative to the workdir; without one, to the daemon's own
            // working directory, which `check` cannot know.
            (Some(dir), false) if workdir_ok => dir.join(program),
            _ => return None,
        };
        let problem = executable_problem(&full)?;
        let message = format!(
            "`{}` {problem}; fix the path or install the program",
            full.display()
        );
        return Some(classify(config, job, "command", &full, message, volatile));
    }
    if on_path() {
        return None;
    }
    let (line, _) = job.place.command;
    Some(Finding::Warning(format!(
        "{}:{line}: job `{}`.command: `{}` is not on this shell's PATH ({}); the daemon's PATH may differ, but install it or give an absolute path",
        config.path.display(),
        job.name,
        job.command[0],
        path_var.map(|p| p.to_string_lossy().into_owned()).unwrap_or_default()
    )))
}

/// Why `path` cannot be executed, if it cannot.
fn executable_problem(path: &Path) -> Option<&'static str> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Some("is a directory"),
        Ok(m) if m.permissions().mode() & 0o111 == 0 => Some("is not executable"),
        Ok(_) => None,
        Err(_) => Some("does not exist"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Migrations;

    fn probe(clock: Clock) -> Probe {
        Probe {
            backend: Backend::Postgres,
            answered: "PostgreSQL 15 at h:5432, database d, user u".into(),
            user: "u".into(),
            connect_time: Some(Duration::from_millis(2)),
            migrations: Migrations {
                known: vec![1, 2, 3],
                pending: vec![3],
                cannot_apply: Vec::new(),
                refused: None,
                unreadable: false,
            },
            missing: Vec::new(),
            checked: "everything".into(),
            clock,
            read_only: None,
        }
    }

    #[test]
    fn a_large_clock_offset_is_a_warning_that_says_what_it_does() {
        let measured = |offset| Clock::Measured {
            offset,
            round_trip: Duration::from_micros(300),
        };
        let r = report(&probe(measured(12)));
        assert!(r.warnings.is_empty() && r.problems.is_empty(), "{r:?}");
        assert!(
            r.lines
                .iter()
                .any(|l| l.contains("the store's clock is 12 ms ahead of this host's")),
            "{r:?}"
        );
        assert!(
            r.lines
                .iter()
                .any(|l| l.contains("1 pending (0003) can be applied")),
            "{r:?}"
        );
        // The store 2.5 s behind: this host runs ahead.
        let r = report(&probe(measured(-2500)));
        assert!(r.problems.is_empty(), "{r:?}");
        assert!(
            r.warnings.len() == 1
                && r.warnings[0].contains("2500 ms ahead of the store's")
                && r.warnings[0].contains("clock_ahead"),
            "{r:?}"
        );
        let r = report(&probe(measured(30_000)));
        assert!(
            r.warnings.len() == 1
                && r.warnings[0].contains("30000 ms behind the store's")
                && r.warnings[0].contains("clock_behind"),
            "{r:?}"
        );
    }

    #[test]
    fn what_the_daemon_could_not_use_is_a_problem() {
        let mut p = probe(Clock::Kernel);
        p.missing = vec!["INSERT/UPDATE on fencecron_leases".into()];
        p.migrations.cannot_apply = vec!["CREATE on schema public".into()];
        let r = report(&p);
        assert_eq!(r.problems.len(), 2, "{r:?}");
        assert!(r.problems[0].contains("cannot apply the 1 pending migrations (0003)"));
        assert!(r.problems[1].contains(
            "user u lacks what the daemon needs on the store: INSERT/UPDATE on fencecron_leases"
        ));
        p.migrations.refused = Some("migrated by a newer fencecron".into());
        assert!(report(&p).problems[0].contains("newer fencecron"));
    }

    fn config(dir: &Path, jobs: &str) -> Config {
        let path = dir.join("jobs.toml");
        std::fs::write(&path, jobs).unwrap();
        crate::config::load(&path).unwrap()
    }

    fn job(name: &str, command: &str, extra: &str) -> String {
        format!("[[job]]\nname = \"{name}\"\nschedule = \"* * * * *\"\ncommand = [\"{command}\"]\n{extra}\n")
    }

    fn texts(found: &[Finding]) -> Vec<String> {
        found
            .iter()
            .map(|f| match f {
                Finding::Error(e) => format!("error: {e}"),
                Finding::Warning(w) => format!("warning: {w}"),
            })
            .collect()
    }

    #[test]
    fn no_jobs_is_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let c = config(dir.path(), "");
        let found = texts(&host_findings(&c, None, &VOLATILE));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("warning: ") && found[0].contains("no [[job]]"),
            "{found:?}"
        );
    }

    #[test]
    fn missing_workdir_and_program_are_errors_with_file_line_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        let text = job("a", "/bin/sh", &format!("workdir = \"{}\"", gone.display()))
            + &job("b", &format!("{}/nope", dir.path().display()), "");
        let c = config(dir.path(), &text);
        // Nothing counts as volatile here, wherever the temporary
        // directory is.
        let found = texts(&host_findings(
            &c,
            Some(std::ffi::OsStr::new("/usr/bin:/bin")),
            &[],
        ));
        let file = dir.path().join("jobs.toml");
        assert_eq!(
            found,
            [
                format!(
                    "error: {}:5:11: job `a`.workdir: {} does not exist; create the directory or fix the path",
                    file.display(),
                    gone.display()
                ),
                format!(
                    "error: {}:9:11: job `b`.command: `{}/nope` does not exist; fix the path or install the program",
                    file.display(),
                    dir.path().display()
                ),
            ]
        );
    }

    #[test]
    fn what_could_appear_later_is_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let text = job("a", "sh", "workdir = \"/run/fencecron-check-test/none\"")
            + &job("b", "no-such-program-fencecron", "")
            + &job("c", "sh", "")
            + &job("d", "/bin/sh", "");
        let c = config(dir.path(), &text);
        let found = texts(&host_findings(
            &c,
            Some(std::ffi::OsStr::new("/usr/bin:/bin")),
            &VOLATILE,
        ));
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("warning: ")
                && found[0].contains("job `a`.workdir")
                && found[0].contains("may still appear"),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("warning: ")
                && found[1].contains("job `b`.command")
                && found[1].contains("not on this shell's PATH"),
            "{found:?}"
        );
    }
}

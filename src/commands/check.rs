//! `fencecron check`: validate the config, look at what its jobs need on
//! this host, and show each job's next fire times.
//!
//! What only the host can tell (a job's `workdir`, its command) is looked
//! at here and not when the daemon loads the file: a directory created
//! later must not stop a daemon from starting. A path that is certainly
//! wrong here is an error; one that could still appear before the job runs
//! (under a volatile directory, or a bare command on a `PATH` that may not
//! be the daemon's) is a warning.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use chrono::Utc;

use crate::cli::Cli;
use crate::config::{Config, ConfigError, Job};
use crate::error::{Error, Exit, Result};
use crate::output::{self, Out};
use crate::store::rfc3339;
use crate::supervise::workdir_problem;

use super::Context;

/// Directories whose content is made at boot or by other programs: a path
/// under one may exist by the time the job runs.
const VOLATILE: [&str; 4] = ["/tmp", "/var/tmp", "/run", "/dev/shm"];

pub fn run(cli: &Cli) -> Result<Exit> {
    let ctx = Context::load(cli, true)?;
    let Some(config) = ctx.config else {
        return Ok(Exit::Success);
    };
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
        for at in job.schedule.upcoming(now, 3) {
            writeln!(out, "  next: {}", rfc3339(at))?;
        }
    }
    Ok(Exit::Success)
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
    for job in &config.jobs {
        if let Some(dir) = &job.workdir {
            if let Some(problem) = workdir_problem(dir) {
                let message = format!(
                    "{} {problem}; create the directory or fix the path",
                    dir.display()
                );
                found.push(classify(config, job, "workdir", dir, message, volatile));
            }
        }
        found.extend(command_finding(config, job, path_var, volatile));
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

fn command_finding(
    config: &Config,
    job: &Job,
    path_var: Option<&std::ffi::OsStr>,
    volatile: &[&str],
) -> Option<Finding> {
    let program = Path::new(&job.command[0]);
    if job.command[0].contains('/') {
        let full: PathBuf = match (&job.workdir, program.is_absolute()) {
            (_, true) => program.to_path_buf(),
            // Relative to the workdir; without one, to the daemon's own
            // working directory, which `check` cannot know.
            (Some(dir), false) if workdir_problem(dir).is_none() => dir.join(program),
            _ => return None,
        };
        let problem = executable_problem(&full)?;
        let message = format!(
            "`{}` {problem}; fix the path or install the program",
            full.display()
        );
        return Some(classify(config, job, "command", &full, message, volatile));
    }
    let dirs: Vec<PathBuf> = path_var
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default();
    if dirs
        .iter()
        .any(|d| executable_problem(&d.join(program)).is_none())
    {
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

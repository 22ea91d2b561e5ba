//! `fencecron completions SHELL` and `fencecron man DIR`: generated from the
//! clap definitions in `cli.rs`, so they cannot drift from the parser, plus
//! what `--help` does not say: per command its exit codes, environment,
//! files and examples (one table, [`manual::COMMANDS`], kept in agreement
//! with the commands table of docs/commands.md by a
//! test), and `jobs.toml(5)`, made from
//! the configuration reference ([`config_page`]).
//!
//! Completions offer the config's job names for a JOB argument. clap's
//! generated scripts are static; clap_complete's dynamic completion (its
//! `unstable-dynamic` feature, registered through `COMPLETE=bash fencecron`)
//! is still marked unstable, changes between minor versions and would
//! replace the packaged scripts by a call into the binary for every
//! completion. Instead each generated script gets a small hand-written
//! addition that asks the hidden `fencecron __complete jobs` for the names.

mod config_page;
mod manual;
mod roff;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::cli::Cli;
use crate::config;
use crate::error::{Error, Exit, Result, EXIT_RUNTIME, EXIT_USAGE};
use crate::output::Out;

use manual::{CommandDoc, ENVIRONMENT, EXIT_CODES, FILES, STORE_ENV};

/// Prints the completion script for `shell` to stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<Exit> {
    Out::stdout().write_all(completion_script(shell).as_bytes())?;
    Ok(Exit::Success)
}

/// The id of the positional argument that names a job of the config.
const JOB_ARG: &str = "job";

/// The (visible) subcommands with a JOB argument, and every long option
/// that takes a value on them (global ones included), as `--name`.
fn job_commands() -> (Vec<String>, Vec<String>) {
    let mut cmd = Cli::command();
    cmd.build();
    let mut names = Vec::new();
    let mut options = Vec::new();
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if !sub.get_positionals().any(|a| a.get_id() == JOB_ARG) {
            continue;
        }
        names.push(sub.get_name().to_string());
        for arg in sub.get_arguments() {
            let takes = arg.get_num_args().is_some_and(|n| n.takes_values());
            if let (Some(long), true) = (arg.get_long(), takes) {
                let long = format!("--{long}");
                if !options.contains(&long) {
                    options.push(long);
                }
            }
        }
    }
    (names, options)
}

/// clap_complete's script for `shell`, with job names for JOB arguments
/// in bash, zsh and fish.
fn completion_script(shell: clap_complete::Shell) -> String {
    use clap_complete::Shell;
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "fencecron", &mut buf);
    let script = String::from_utf8_lossy(&buf).into_owned();
    let (commands, options) = job_commands();
    match shell {
        Shell::Bash => {
            let addition = format!(
                r#"
# Job names for the JOB argument of {list}: the names in the
# config this command line would use (its --config, $FENCECRON_CONFIG, else
# /etc/fencecron/jobs.toml), from `fencecron __complete jobs`.
_fencecron_jobs() {{
    _fencecron "$@"
    local cur="${{COMP_WORDS[COMP_CWORD]}}" sub="" w i args=0 skip=0 bin="${{COMP_WORDS[0]}}"
    [[ $cur == -* ]] && return 0
    for (( i = 1; i < COMP_CWORD; i++ )); do
        w="${{COMP_WORDS[i]}}"
        if (( skip )); then skip=0; continue; fi
        case "$w" in
            --) return 0 ;;
            {options}) skip=1 ;;
            -*) ;;
            *) if [[ -z $sub ]]; then sub="$w"; else args=$((args + 1)); fi ;;
        esac
    done
    (( skip || args )) && return 0
    case "$sub" in
        {cases}) ;;
        *) return 0 ;;
    esac
    [[ -x $bin ]] || bin=fencecron
    local IFS=$'\n'
    COMPREPLY=( $(compgen -W "$("$bin" __complete jobs -- "${{COMP_WORDS[@]:0:COMP_CWORD}}" 2>/dev/null)" -- "$cur") )
}}
"#,
                list = commands.join(", "),
                options = options.join("|"),
                cases = commands.join("|"),
            );
            let script = script.replace("complete -F _fencecron ", "complete -F _fencecron_jobs ");
            match script.find("\nif [[ \"${BASH_VERSINFO[0]}\"") {
                Some(at) => format!("{}{addition}{}", &script[..at + 1], &script[at + 1..]),
                None => format!("{script}{addition}complete -F _fencecron_jobs -o bashdefault -o default fencecron\n"),
            }
        }
        Shell::Zsh => {
            // clap_complete writes a positional as ':job -- HELP:_default'
            // (or '::job…' when optional); the action becomes ours.
            let mut out = String::new();
            for line in script.split_inclusive('\n') {
                let arg = line.strip_prefix("':").map(|l| l.trim_start_matches(':'));
                if arg.is_some_and(|a| a.starts_with(&format!("{JOB_ARG} -- "))) {
                    out.push_str(&line.replacen(":_default'", ":_fencecron_jobs'", 1));
                } else {
                    out.push_str(line);
                }
            }
            let addition = r#"
(( $+functions[_fencecron_jobs] )) ||
_fencecron_jobs() {
    # The job names of the config this command line would use.
    local -a words_now jobs expl
    words_now=(${(Q)${(z)LBUFFER}})
    jobs=(${(f)"$(${words_now[1]:-fencecron} __complete jobs -- "${words_now[@]}" 2>/dev/null)"})
    _wanted jobs expl 'job' compadd -a jobs
}
"#;
            match out.find("\nif [ \"$funcstack[1]\" = \"_fencecron\" ]") {
                Some(at) => format!("{}{addition}{}", &out[..at + 1], &out[at + 1..]),
                None => format!("{addition}{out}"),
            }
        }
        Shell::Fish => format!(
            r#"{script}
# Job names for the JOB argument: the names in the config this command line
# would use, from `fencecron __complete jobs`.
function __fish_fencecron_jobs
    set -l words (commandline -opc)
    $words[1] __complete jobs -- $words 2>/dev/null
end
complete -c fencecron -n "__fish_fencecron_using_subcommand {commands}" -f -a "(__fish_fencecron_jobs)" -d job
"#,
            commands = commands.join(" ")
        ),
        _ => script,
    }
}

/// The first argument by which the completion scripts ask for names.
pub const COMPLETE_ARG: &str = "__complete";

/// `fencecron __complete jobs -- WORDS…`, what the completion scripts run:
/// the job names of the config the command line being completed would use
/// (its `--config`, else `$FENCECRON_CONFIG`, else the default path), one a
/// line. Reads the local file only, never the store; prints nothing on any
/// error and always exits 0: a completion must not print messages into the
/// shell. Handled before the command line is parsed, so it is in no
/// `--help`, man page or completion.
pub fn complete(args: Vec<std::ffi::OsString>) -> std::process::ExitCode {
    let args: Vec<String> = args
        .into_iter()
        .filter_map(|a| a.into_string().ok())
        .collect();
    if let [what, dashes, words @ ..] = args.as_slice() {
        if what == "jobs" && dashes == "--" {
            let path = config_in(words)
                .or_else(|| {
                    std::env::var_os("FENCECRON_CONFIG")
                        .filter(|v| !v.is_empty())
                        .map(PathBuf::from)
                })
                .unwrap_or_else(|| PathBuf::from(config::DEFAULT_PATH));
            if let Ok(config) = config::load_store_given(&path) {
                let mut names = String::new();
                for job in &config.jobs {
                    names.push_str(job.name.as_str());
                    names.push('\n');
                }
                let _ = Out::stdout().write_all(names.as_bytes());
            }
        }
    }
    std::process::ExitCode::from(crate::error::EXIT_OK)
}

/// The `--config` of a command line being completed (`--config F` or
/// `--config=F`, before any `--`), with a leading `~/` and shell quotes
/// taken as the shell would.
fn config_in(words: &[String]) -> Option<PathBuf> {
    let mut found = None;
    let mut iter = words.iter().skip(1);
    while let Some(w) = iter.next() {
        if w == "--" {
            break;
        }
        if w == "--config" {
            found = iter.next().cloned();
        } else if let Some(v) = w.strip_prefix("--config=") {
            found = Some(v.to_string());
        }
    }
    let raw = found.filter(|v| !v.is_empty())?;
    let unquoted = ['"', '\'']
        .iter()
        .find_map(|q| raw.strip_prefix(*q).and_then(|r| r.strip_suffix(*q)))
        .unwrap_or(&raw);
    match (unquoted.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => Some(Path::new(&home).join(rest)),
        _ => Some(PathBuf::from(unquoted)),
    }
}

/// Writes `fencecron.1`, `fencecron-SUB.1` (nested: `fencecron-lease-acquire.1`)
/// and `jobs.toml.5` into `dir`, which must exist.
pub fn man_pages(dir: &Path) -> Result<Exit> {
    if !dir.is_dir() {
        return Err(Error::Usage(format!(
            "{} is not a directory; create it first (e.g. mkdir -p {})",
            dir.display(),
            dir.display()
        )));
    }
    let mut cmd = Cli::command().name("fencecron");
    cmd.build();
    write_pages(&cmd, &[], dir)?;
    write(&dir.join("jobs.toml.5"), config_page::page().as_bytes())?;
    Ok(Exit::Success)
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes)
        .map_err(|e| Error::Runtime(format!("cannot write {}: {e}", path.display())))
}

/// Writes the page of `cmd`, at `path` (`["lease", "acquire"]`) under
/// `fencecron`, and those of its visible subcommands.
fn write_pages(cmd: &clap::Command, path: &[&str], dir: &Path) -> Result<()> {
    let name = std::iter::once("fencecron")
        .chain(path.iter().copied())
        .collect::<Vec<_>>()
        .join("-");
    let page = page(cmd, path, &name)
        .map_err(|e| Error::Runtime(format!("cannot render the man page of {name}: {e}")))?;
    write(&dir.join(format!("{name}.1")), page.as_bytes())?;
    for sub in cmd.get_subcommands().filter(|s| is_page(s)) {
        let mut sub_path = path.to_vec();
        sub_path.push(sub.get_name());
        write_pages(sub, &sub_path, dir)?;
    }
    Ok(())
}

/// Whether a subcommand gets a page: not hidden, not clap's `help`.
fn is_page(cmd: &clap::Command) -> bool {
    !cmd.is_hide_set() && cmd.get_name() != "help"
}

/// One section-1 page: clap_mangen's sections from the definitions, then
/// EXIT STATUS, ENVIRONMENT, FILES, EXAMPLES and SEE ALSO.
fn page(cmd: &clap::Command, path: &[&str], name: &str) -> std::io::Result<String> {
    let man = clap_mangen::Man::new(
        cmd.clone()
            .name(name.to_string())
            .bin_name(name.replace('-', " ")),
    );
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    man.render_name_section(&mut buf)?;
    man.render_synopsis_section(&mut buf)?;
    man.render_description_section(&mut buf)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut buf)?;
    }
    let subs: Vec<&clap::Command> = cmd.get_subcommands().filter(|s| is_page(s)).collect();
    if !subs.is_empty() {
        man.render_subcommands_section(&mut buf)?;
    }
    if cmd.get_version().is_some() {
        man.render_version_section(&mut buf)?;
    }
    let mut out = String::from_utf8_lossy(&buf).into_owned();
    out.push_str(&sections(path, &subs));
    Ok(out)
}

/// The rows of [`manual::COMMANDS`] for the page at `path` and, for a page
/// without rows of its own (`lease`), those of the pages below it.
fn rows_for(path: &str) -> (Vec<&'static CommandDoc>, bool) {
    let own: Vec<_> = manual::rows_of(path).collect();
    if !own.is_empty() {
        return (own, true);
    }
    let prefix = format!("{path} ");
    let below = manual::COMMANDS
        .iter()
        .filter(|c| c.pages.iter().any(|p| p.starts_with(&prefix)))
        .collect();
    (below, false)
}

fn sections(path: &[&str], subs: &[&clap::Command]) -> String {
    let top = path.is_empty();
    let joined = path.join(" ");
    let (rows, own) = if top {
        (manual::COMMANDS.iter().collect(), false)
    } else {
        rows_for(&joined)
    };
    // No hyphenation: paths and variable names stay whole.
    let mut out = String::from(".nh\n");

    out.push_str(".SH \"EXIT STATUS\"\n");
    if own {
        let mut codes: Vec<(u8, Vec<&str>)> = Vec::new();
        for (code, when) in rows.iter().flat_map(|r| r.exits.iter()) {
            match codes.iter_mut().find(|(c, _)| c == code) {
                Some((_, whens)) if !whens.contains(when) => whens.push(when),
                Some(_) => {}
                None => codes.push((*code, vec![when])),
            }
        }
        codes.sort_by_key(|(c, _)| *c);
        for row in &rows {
            if let Some(p) = row.passthrough {
                let _ = write!(out, ".TP\n\\fIcode\\fR\n{}\n", esc(&capital(p)));
            }
        }
        for (code, whens) in codes {
            let _ = write!(
                out,
                ".TP\n\\fB{code}\\fR\n{}\n",
                esc(&capital(&whens.join("; ")))
            );
        }
        let _ = write!(
            out,
            ".PP\nAs every command, it also exits {EXIT_USAGE} on a command-line error and {EXIT_RUNTIME} on a runtime failure (an I/O error); \\fBfencecron\\fR(1) lists every code.\n"
        );
    } else if top {
        for (code, what) in EXIT_CODES {
            let _ = write!(out, ".TP\n\\fB{code}\\fR\n{}\n", esc(&capital(what)));
        }
        out.push_str(".PP\n\\fBexec\\fR and \\fBtrigger \\-\\-wait\\fR exit with the job's own code (128 + signal when a signal ended it). Each command's page says which codes it has.\n");
    } else {
        out.push_str("That of the subcommand: see its page below.\n");
    }

    let store = rows.iter().any(|r| r.store) || top;
    let mut vars: Vec<&str> = Vec::new();
    for (var, _) in ENVIRONMENT {
        let used = if top {
            STORE_ENV.contains(var) || *var == "RUNTIME_DIRECTORY"
        } else {
            (store && STORE_ENV.contains(var)) || rows.iter().any(|r| r.env.contains(var))
        };
        if used {
            vars.push(var);
        }
    }
    if !vars.is_empty() {
        out.push_str(".SH ENVIRONMENT\n");
        for (var, what) in ENVIRONMENT.iter().filter(|(v, _)| vars.contains(v)) {
            let _ = write!(out, ".TP\n\\fB{}\\fR\n{}\n", esc(var), esc(what));
        }
    }

    if store {
        out.push_str(".SH FILES\n");
        let runtime = vars.contains(&"RUNTIME_DIRECTORY");
        for (file, what) in FILES {
            if file.starts_with("/run/") && !runtime {
                continue;
            }
            let _ = write!(out, ".TP\n{}\n{}\n", esc(file), esc(what));
        }
    }

    let examples: Vec<&(&str, &str)> = if top {
        ["check", "run", "trigger"]
            .iter()
            .filter_map(|p| manual::rows_of(p).next())
            .filter_map(|r| r.examples.first())
            .collect()
    } else {
        rows.iter()
            .flat_map(|r| r.examples.iter())
            .take(3)
            .collect()
    };
    if !examples.is_empty() {
        out.push_str(".SH EXAMPLES\n");
        for (line, what) in examples {
            let _ = write!(
                out,
                ".PP\n{}\n.PP\n.RS 4\n.nf\n{}\n.fi\n.RE\n",
                esc(what),
                esc(line).replace('-', "\\-")
            );
        }
    }

    out.push_str(".SH \"SEE ALSO\"\n");
    let mut see: Vec<(String, u8)> = Vec::new();
    if !top {
        see.push(("fencecron".into(), 1));
        if path.len() > 1 {
            see.push((format!("fencecron-{}", path[..path.len() - 1].join("-")), 1));
        }
    }
    let prefix: String = path.iter().map(|p| format!("-{p}")).collect();
    for sub in subs {
        see.push((format!("fencecron{prefix}-{}", sub.get_name()), 1));
    }
    if store {
        see.push(("jobs.toml".into(), 5));
    }
    let refs: Vec<String> = see
        .iter()
        .map(|(n, s)| format!("\\fB{}\\fR({s})", n.replace('-', "\\-")))
        .collect();
    out.push_str(&refs.join(", "));
    out.push('\n');
    out
}

/// Text for a roff text line; `-` stays a hyphen.
fn esc(s: &str) -> String {
    roff::text(s)
}

fn capital(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_of_the_command_line_is_found() {
        let w = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
        assert_eq!(config_in(&w("fencecron trigger")), None);
        assert_eq!(
            config_in(&w("fencecron --config /x/j.toml trigger")),
            Some(PathBuf::from("/x/j.toml"))
        );
        assert_eq!(
            config_in(&w("fencecron trigger --config=\"/y.toml\"")),
            Some(PathBuf::from("/y.toml"))
        );
        assert_eq!(config_in(&w("fencecron exec r -- --config /z")), None);
    }

    /// The scripts' hand-written parts found their place in clap_complete's
    /// output (a new clap_complete that moved it fails here).
    #[test]
    fn completion_scripts_ask_for_job_names() {
        use clap_complete::Shell;
        let (commands, options) = job_commands();
        assert_eq!(commands, ["runs", "trigger", "pause", "resume"]);
        assert!(
            options.contains(&"--config".to_string()) && options.contains(&"--timeout".to_string())
        );
        assert!(!options.contains(&"--wait".to_string()));
        let bash = completion_script(Shell::Bash);
        assert_eq!(
            bash.matches("complete -F _fencecron_jobs ").count(),
            2,
            "{bash}"
        );
        assert!(!bash.contains("complete -F _fencecron "));
        assert!(
            !bash.contains("__complete)"),
            "the hidden command is offered"
        );
        assert!(bash.contains(&format!("\"$bin\" {COMPLETE_ARG} jobs -- ")));
        let zsh = completion_script(Shell::Zsh);
        assert_eq!(zsh.matches(":_fencecron_jobs'").count(), 4);
        let defined = zsh.find("\n_fencecron_jobs() {").unwrap();
        assert!(defined < zsh.find("\nif [ \"$funcstack[1]\"").unwrap());
        let fish = completion_script(Shell::Fish);
        assert!(fish.contains("__fish_fencecron_using_subcommand runs trigger pause resume\""));
        assert!(
            !fish.contains("-a \"__complete\""),
            "the hidden command is offered"
        );
    }
}

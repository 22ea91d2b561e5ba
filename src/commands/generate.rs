//! `fencecron completions SHELL` and `fencecron man DIR`: generated from the
//! clap definitions in `cli.rs`, so they cannot drift from the parser.

use std::path::Path;

use clap::CommandFactory;

use crate::cli::Cli;
use crate::error::{Error, Exit, Result};
use crate::output::Out;

/// Prints the completion script for `shell` to stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<Exit> {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "fencecron", &mut buf);
    Out::stdout().write_all(&buf)?;
    Ok(Exit::Success)
}

/// Writes `fencecron.1` and `fencecron-SUB.1` (nested: `fencecron-lease-acquire.1`)
/// into `dir`, which must exist.
pub fn man_pages(dir: &Path) -> Result<Exit> {
    if !dir.is_dir() {
        return Err(Error::Usage(format!(
            "{} is not a directory; create it first (e.g. mkdir -p {})",
            dir.display(),
            dir.display()
        )));
    }
    let cmd = Cli::command().name("fencecron");
    write_pages(&cmd, "fencecron", dir)?;
    Ok(Exit::Success)
}

fn write_pages(cmd: &clap::Command, name: &str, dir: &Path) -> Result<()> {
    let page = cmd
        .clone()
        .name(name.to_string())
        .bin_name(name.replace('-', " "));
    let mut buf = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut buf)
        .map_err(|e| Error::Runtime(format!("cannot render the man page of {name}: {e}")))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, buf)
        .map_err(|e| Error::Runtime(format!("cannot write {}: {e}", path.display())))?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(())
}

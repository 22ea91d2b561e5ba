//! Everything a command prints on stdout goes through [`Out`], so that a
//! failed write is an [`Error::Output`] (never a panic, as `println!` would
//! be) and is turned into an exit code once, in `main`:
//!
//! * a closed pipe (`fencecron stale | head`): the reader stopped reading on
//!   purpose, so the command stops quietly with exit 0, like `rg` and `fd`
//!   (a shell's `set -o pipefail` does not trip over it);
//! * any other write error (`> /dev/full`: ENOSPC): one sentence on stderr,
//!   exit 1.
//!
//! Shell-`eval`-able `key=value` lines are built with [`shell_quote`].
//! `clippy::print_stdout` is denied crate-wide so no `println!` creeps back.

use std::fmt;
use std::io::{self, Write};

use crate::error::{Error, Result};

/// The process's stdout, with write errors as [`Error::Output`].
pub struct Out {
    stdout: io::Stdout,
}

impl Out {
    /// Stdout. Rust's stdout is line-buffered, so an error surfaces at the
    /// line that hit it; [`Out::flush`] before returning for output that
    /// does not end in a newline.
    pub fn stdout() -> Out {
        Out {
            stdout: io::stdout(),
        }
    }

    /// Lets `write!`/`writeln!` return this crate's [`Result`].
    pub fn write_fmt(&mut self, args: fmt::Arguments<'_>) -> Result<()> {
        self.stdout.lock().write_fmt(args).map_err(Error::Output)
    }

    /// Raw bytes (`get` prints a value as stored).
    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        self.stdout.lock().write_all(bytes).map_err(Error::Output)
    }

    /// Flushes what is buffered.
    pub fn flush(&mut self) -> Result<()> {
        self.stdout.lock().flush().map_err(Error::Output)
    }
}

/// A value quoted for a POSIX shell: the whole value in single quotes, each
/// `'` written as `'\''`. Inside single quotes nothing is special (`$`,
/// backticks, `\`, `;`, spaces, newlines), so `eval "$(fencecron lease
/// acquire …)"` sets each variable to exactly the printed value and runs
/// nothing.
pub fn shell_quote(value: &str) -> String {
    let mut q = String::with_capacity(value.len() + 2);
    q.push('\'');
    for c in value.chars() {
        if c == '\'' {
            q.push_str("'\\''");
        } else {
            q.push(c);
        }
    }
    q.push('\'');
    q
}

/// Writes one `key='value'` line for `eval`.
pub fn assignment(out: &mut Out, key: &str, value: impl fmt::Display) -> Result<()> {
    writeln!(out, "{key}={}", shell_quote(&value.to_string()))
}

/// Writes a fatal error's one sentence to stderr. A stderr that cannot be
/// written to is ignored: there is nowhere left to report it.
pub fn error_line(message: impl fmt::Display) {
    let _ = writeln!(io::stderr().lock(), "fencecron: {message}");
}

/// Writes one line to stderr as it is (no `fencecron: ` prefix), for a
/// reader that parses it; a stderr that cannot be written to is ignored.
pub fn error_line_raw(line: &str) {
    let _ = writeln!(io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes() {
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("job"), "'job'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote("x$(id)`id`;\\"), "'x$(id)`id`;\\'");
    }
}

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
pub(crate) struct Out {
    stdout: io::Stdout,
}

impl Out {
    /// Stdout. Rust's stdout is line-buffered, so an error surfaces at the
    /// line that hit it; [`Out::flush`] before returning for output that
    /// does not end in a newline.
    pub(crate) fn stdout() -> Out {
        Out {
            stdout: io::stdout(),
        }
    }

    /// Lets `write!`/`writeln!` return this crate's [`Result`].
    pub(crate) fn write_fmt(&mut self, args: fmt::Arguments<'_>) -> Result<()> {
        self.stdout.lock().write_fmt(args).map_err(Error::Output)
    }

    /// Raw bytes (`get` prints a value as stored).
    pub(crate) fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        self.stdout.lock().write_all(bytes).map_err(Error::Output)
    }

    /// Flushes what is buffered.
    pub(crate) fn flush(&mut self) -> Result<()> {
        self.stdout.lock().flush().map_err(Error::Output)
    }
}

/// A value quoted for a POSIX shell: the whole value in single quotes, each
/// `'` written as `'\''`. Inside single quotes nothing is special (`$`,
/// backticks, `\`, `;`, spaces, newlines), so `eval "$(fencecron lease
/// acquire …)"` sets each variable to exactly the printed value and runs
/// nothing.
pub(crate) fn shell_quote(value: &str) -> String {
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
pub(crate) fn assignment(out: &mut Out, key: &str, value: impl fmt::Display) -> Result<()> {
    writeln!(out, "{key}={}", shell_quote(&value.to_string()))
}

/// How a [`Table`] column lines its cells up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    /// Numbers.
    Right,
}

/// A table for people: each column as wide as its widest cell, so names
/// of any length keep the columns straight; two spaces between columns;
/// the last column is not padded. Scripts read `--json` instead.
pub(crate) struct Table {
    columns: Vec<(&'static str, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub(crate) fn new(columns: &[(&'static str, Align)]) -> Table {
        Table {
            columns: columns.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row: one cell per column.
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.columns.len());
        self.rows.push(cells);
    }

    /// Writes the header and the rows.
    pub(crate) fn print(self, out: &mut Out) -> Result<()> {
        for line in self.render() {
            writeln!(out, "{line}")?;
        }
        Ok(())
    }

    /// The header and the rows, one string a line.
    fn render(&self) -> Vec<String> {
        let width = |s: &str| s.chars().count();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| width(&r[i]))
                    .chain([width(self.columns[i].0)])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let header: Vec<String> = self.columns.iter().map(|c| c.0.to_string()).collect();
        let mut lines = Vec::with_capacity(self.rows.len() + 1);
        for cells in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let last = i + 1 == cells.len();
                let pad = widths[i].saturating_sub(width(cell));
                if i > 0 {
                    line.push_str("  ");
                }
                match self.columns[i].1 {
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(cell);
                    }
                    Align::Left => {
                        line.push_str(cell);
                        if !last {
                            line.extend(std::iter::repeat_n(' ', pad));
                        }
                    }
                }
            }
            lines.push(line);
        }
        lines
    }
}

/// `t` relative to `now` for a person: `45s ago`, `3m ago`, `in 2h`,
/// `2d ago` (whole units, rounded down; `now` for under a second).
pub(crate) fn relative(
    now: chrono::DateTime<chrono::Utc>,
    t: chrono::DateTime<chrono::Utc>,
) -> String {
    let ms = (t - now).num_milliseconds();
    let secs = ms.unsigned_abs() / 1000;
    if secs == 0 {
        return "now".to_string();
    }
    let span = match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    };
    if ms < 0 {
        format!("{span} ago")
    } else {
        format!("in {span}")
    }
}

/// Writes a fatal error's one sentence to stderr. A stderr that cannot be
/// written to is ignored: there is nowhere left to report it.
pub fn error_line(message: impl fmt::Display) {
    let _ = writeln!(io::stderr().lock(), "fencecron: {message}");
}

/// Writes one line to stderr as it is (no `fencecron: ` prefix), for a
/// reader that parses it; a stderr that cannot be written to is ignored.
pub(crate) fn error_line_raw(line: &str) {
    let _ = writeln!(io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_fit_cells_of_any_length() {
        let mut t = Table::new(&[
            ("NAME", Align::Left),
            ("TOKEN", Align::Right),
            ("NODE", Align::Left),
        ]);
        let long = "a-job-whose-name-is-much-longer-than-twenty-characters";
        t.row(vec![long.into(), "7".into(), "host-a".into()]);
        t.row(vec!["b".into(), "12345".into(), "h".into()]);
        let lines = t.render();
        assert_eq!(
            lines[0],
            format!("NAME{}  TOKEN  NODE", " ".repeat(long.len() - 4))
        );
        assert_eq!(lines[1], format!("{long}      7  host-a"));
        assert_eq!(
            lines[2],
            format!("b{}  12345  h", " ".repeat(long.len() - 1))
        );
    }

    #[test]
    fn relative_times() {
        use chrono::{Duration, TimeZone, Utc};
        let now = Utc.with_ymd_and_hms(2026, 12, 7, 3, 0, 0).unwrap();
        let at = |s: i64| relative(now, now + Duration::seconds(s));
        assert_eq!(at(0), "now");
        assert_eq!(at(-45), "45s ago");
        assert_eq!(at(25), "in 25s");
        assert_eq!(at(-200), "3m ago");
        assert_eq!(at(7300), "in 2h");
        assert_eq!(at(-3 * 86_400 - 5), "3d ago");
    }

    #[test]
    fn quotes() {
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("job"), "'job'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote("x$(id)`id`;\\"), "'x$(id)`id`;\\'");
    }
}

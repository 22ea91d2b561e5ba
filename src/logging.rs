//! Where logging lives: the global subscriber's set-up and the formats it
//! writes. The events themselves are `events.rs`; `cli` takes its
//! `--log-format` values from here.

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum LogFormat {
    /// Human-readable lines for terminals.
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, event, fields.
    Json,
}

/// Installs the global subscriber: logs go to stderr, `RUST_LOG` (or
/// `FENCECRON_LOG`) filters, default `info` for fencecron's own events.
/// sqlx's own lines (slow statements, slow pool checkouts) are off by
/// default: they carry no `event` field, and every store failure that
/// matters already reaches the log as a catalogue event.
///
/// Without a format asked for (`--log-format`, `FENCECRON_LOG_FORMAT`), and
/// with stderr connected to the journal (`JOURNAL_STREAM` names it, as
/// systemd sets it for a unit), events are sent as native journal entries
/// instead: every field a journal field (`F_EVENT=lease_lost`), WARN and
/// ERROR as journal priorities. Should the journal's socket not open, text
/// on stderr it is. `quiet` (`exec --quiet`) lowers the default to WARN
/// and above.
pub fn init(format: Option<LogFormat>, quiet: bool) {
    let default = if quiet {
        "warn,sqlx=off"
    } else {
        "info,sqlx=off"
    };
    let filter = || {
        EnvFilter::try_from_env("FENCECRON_LOG")
            .or_else(|_| EnvFilter::try_from_default_env())
            .unwrap_or_else(|_| EnvFilter::new(default))
    };
    if format.is_none() && stderr_is_the_journal() {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        if let Ok(journal) = tracing_journald::layer() {
            let journal = journal.with_syslog_identifier("fencecron".to_string());
            let _ = tracing_subscriber::registry()
                .with(filter())
                .with(journal)
                .try_init();
            return;
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        // A log line that cannot be written (stderr a closed pipe) is
        // dropped; the fallback would `eprintln!`, which panics then.
        .log_internal_errors(false)
        .with_target(false);
    let _ = match format.unwrap_or(LogFormat::Text) {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
        LogFormat::Text => builder.with_ansi(false).try_init(),
    };
}

/// Whether stderr is the journal's stream: `JOURNAL_STREAM` is
/// `DEVICE:INODE` of the stream systemd connected, and stderr is still it
/// (not redirected since, e.g. by a shell in between).
fn stderr_is_the_journal() -> bool {
    let Ok(value) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    nix::sys::stat::fstat(libc::STDERR_FILENO).is_ok_and(|st| st.st_dev == dev && st.st_ino == ino)
}

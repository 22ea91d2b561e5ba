//! OS signals, caught in one place for the commands that run for a while:
//! the daemon (`run`), `exec` and `bench`.
//!
//! Once caught, a signal no longer ends the process by default; the command
//! turns it into an orderly stop (terminate jobs, release leases, remove
//! its rows) or, for the daemon, a reload. signal-hook's handlers only
//! write to a pipe that a tokio task reads, so nothing runs inside the
//! handler itself.

use futures::StreamExt;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

/// A signal as a command sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// SIGTERM or SIGINT (its name, for the log): stop.
    Stop(&'static str),
    /// SIGHUP: reload (the daemon) or stop (`exec`).
    Hangup,
}

/// Signals being caught.
pub struct Signals(signal_hook_tokio::Signals);

impl Signals {
    /// Catches SIGTERM, SIGINT and SIGHUP from now on.
    pub fn stop_and_hangup() -> Result<Signals> {
        Self::catch(&[SIGTERM, SIGINT, SIGHUP])
    }

    /// Catches SIGTERM and SIGINT from now on.
    pub fn stop() -> Result<Signals> {
        Self::catch(&[SIGTERM, SIGINT])
    }

    fn catch(signals: &[i32]) -> Result<Signals> {
        signal_hook_tokio::Signals::new(signals)
            .map(Signals)
            .map_err(|e| Error::Runtime(format!("cannot install signal handlers: {e}")))
    }

    /// The next signal; `None` once no more can arrive.
    pub async fn next(&mut self) -> Option<Received> {
        loop {
            match self.0.next().await? {
                SIGTERM => return Some(Received::Stop("SIGTERM")),
                SIGINT => return Some(Received::Stop("SIGINT")),
                SIGHUP => return Some(Received::Hangup),
                _ => {}
            }
        }
    }

    /// Cancels `token` at the first signal, whichever it is.
    pub fn cancel_on_first(mut self, token: CancellationToken) -> JoinHandle<()> {
        tokio::spawn(async move {
            if self.next().await.is_some() {
                token.cancel();
            }
        })
    }
}

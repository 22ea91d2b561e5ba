//! OS signals, caught in one place for the commands that run for a while:
//! the daemon (`run`), `exec` and `bench`.
//!
//! Once caught, a signal no longer ends the process by default; the command
//! turns it into an orderly stop (terminate jobs, release leases, remove
//! its rows) or, for the daemon, a reload. tokio's handlers only note the
//! signal and wake the runtime's driver, so nothing runs inside the handler
//! itself.

use tokio::signal::unix::{signal, Signal, SignalKind};
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
pub struct Signals {
    term: Signal,
    int: Signal,
    /// `None` when SIGHUP is not caught (its default action stays).
    hup: Option<Signal>,
}

impl Signals {
    /// Catches SIGTERM, SIGINT and SIGHUP from now on.
    pub fn stop_and_hangup() -> Result<Signals> {
        let mut signals = Self::stop()?;
        signals.hup = Some(catch(SignalKind::hangup())?);
        Ok(signals)
    }

    /// Catches SIGTERM and SIGINT from now on.
    pub fn stop() -> Result<Signals> {
        Ok(Signals {
            term: catch(SignalKind::terminate())?,
            int: catch(SignalKind::interrupt())?,
            hup: None,
        })
    }

    /// The next signal; `None` once no more can arrive.
    pub async fn next(&mut self) -> Option<Received> {
        let hup = async {
            match &mut self.hup {
                Some(hup) => hup.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            got = self.term.recv() => got.map(|()| Received::Stop("SIGTERM")),
            got = self.int.recv() => got.map(|()| Received::Stop("SIGINT")),
            got = hup => got.map(|()| Received::Hangup),
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

fn catch(kind: SignalKind) -> Result<Signal> {
    signal(kind).map_err(|e| Error::Runtime(format!("cannot install signal handlers: {e}")))
}

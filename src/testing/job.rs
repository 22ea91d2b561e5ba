//! A fake job for the supervisor: [`FakeLauncher`] starts [`FakeJob`]s that
//! record every signal and every deadline handed to their "watchdog", and
//! end as scripted (on their own after a while, on SIGTERM after a while or
//! never, always on SIGKILL), on tokio's clock.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::Signal;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::store::{Lease, Token};
use crate::supervise::{JobProcess, Launch, RunSpec};

/// How a fake job behaves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Script {
    /// Exits by itself (with `exit_code`) this long after it started;
    /// `None`: runs until it is signalled.
    pub runs_for: Option<Duration>,
    pub exit_code: i32,
    /// Exits this long after SIGTERM (by the signal); `None`: ignores it.
    pub term_takes: Option<Duration>,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            runs_for: None,
            exit_code: 0,
            term_takes: Some(Duration::ZERO),
        }
    }
}

/// What happened to one fake job, shared by the job and the test.
#[derive(Debug)]
struct JobState {
    started: Instant,
    script: Script,
    signals: Vec<(Instant, Signal)>,
    confirms: Vec<(Instant, Instant, Instant)>,
    ended: Option<(Instant, ExitStatus)>,
    reaped: bool,
}

/// The test's handle on a started fake job.
#[derive(Debug, Clone)]
pub(crate) struct JobHandle {
    pub resource: String,
    pub token: Token,
    pub owner_id: crate::store::OwnerId,
    /// The watchdog's deadlines the job was started with.
    pub term_at: Instant,
    pub kill_at: Instant,
    state: Arc<Mutex<JobState>>,
    wake: Arc<Notify>,
}

impl JobHandle {
    fn lock(&self) -> MutexGuard<'_, JobState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When it started.
    pub(crate) fn started(&self) -> Instant {
        self.lock().started
    }

    /// Every signal sent to its group, with when.
    pub(crate) fn signals(&self) -> Vec<(Instant, Signal)> {
        self.lock().signals.clone()
    }

    /// Every deadline pair (term, kill) confirmed to its watchdog, with when.
    pub(crate) fn confirms(&self) -> Vec<(Instant, Instant, Instant)> {
        self.lock().confirms.clone()
    }

    /// When and how it ended, if it did.
    pub(crate) fn ended(&self) -> Option<(Instant, ExitStatus)> {
        self.lock().ended
    }

    /// Whether the supervisor cleaned up its group after it ended.
    pub(crate) fn reaped(&self) -> bool {
        self.lock().reaped
    }

    /// Makes it exit now with `code`.
    pub(crate) fn exit(&self, code: i32) {
        {
            let mut s = self.lock();
            if s.ended.is_none() {
                s.ended = Some((Instant::now(), ExitStatus::from_raw(code << 8)));
            }
        }
        self.wake.notify_one();
    }

    /// The instant it ends by (if it has not ended), from its script and the
    /// signals it got; records the end once it is reached.
    fn poll_end(&self) -> Result<ExitStatus, Option<Instant>> {
        let mut s = self.lock();
        if let Some((_, status)) = s.ended {
            return Ok(status);
        }
        let mut ends: Vec<(Instant, ExitStatus)> = Vec::new();
        if let Some(d) = s.script.runs_for {
            ends.push((s.started + d, ExitStatus::from_raw(s.script.exit_code << 8)));
        }
        for (at, sig) in &s.signals {
            match (sig, s.script.term_takes) {
                (Signal::SIGKILL, _) => ends.push((*at, ExitStatus::from_raw(libc::SIGKILL))),
                (Signal::SIGTERM, Some(d)) => {
                    ends.push((*at + d, ExitStatus::from_raw(libc::SIGTERM)))
                }
                _ => {}
            }
        }
        let first = ends.into_iter().min_by_key(|(at, _)| *at);
        match first {
            Some((at, status)) if at <= Instant::now() => {
                s.ended = Some((at, status));
                Ok(status)
            }
            Some((at, _)) => Err(Some(at)),
            None => Err(None),
        }
    }
}

/// A started fake job.
struct FakeJob {
    pid: u32,
    handle: JobHandle,
}

#[async_trait]
impl JobProcess for FakeJob {
    fn pid(&self) -> u32 {
        self.pid
    }

    fn watchdog_pid(&self) -> Option<u32> {
        None
    }

    fn forward_output(&mut self, _job: &str, _token: Token, _tail: usize) {}

    fn signal(&mut self, sig: Signal) {
        self.handle.lock().signals.push((Instant::now(), sig));
        self.handle.wake.notify_one();
    }

    fn confirm(&mut self, term_at: Instant, kill_at: Instant) {
        self.handle
            .lock()
            .confirms
            .push((Instant::now(), term_at, kill_at));
    }

    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            match self.handle.poll_end() {
                Ok(status) => return Ok(status),
                Err(Some(at)) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.handle.wake.notified() => {}
                    }
                }
                Err(None) => self.handle.wake.notified().await,
            }
        }
    }

    async fn reap(&mut self) {
        self.handle.lock().reaped = true;
    }
}

/// Starts fake jobs and remembers them.
#[derive(Default)]
pub(crate) struct FakeLauncher {
    script: Mutex<Script>,
    /// Refuse to start, with this message.
    refuse: Mutex<Option<String>>,
    started: Mutex<Vec<JobHandle>>,
}

impl FakeLauncher {
    pub(crate) fn new(script: Script) -> Arc<FakeLauncher> {
        Arc::new(FakeLauncher {
            script: Mutex::new(script),
            ..Default::default()
        })
    }

    /// Jobs started from now on fail to start with `message`.
    pub(crate) fn refuse(&self, message: &str) {
        *self.refuse.lock().unwrap() = Some(message.to_string());
    }

    /// Every job started so far.
    pub(crate) fn started(&self) -> Vec<JobHandle> {
        self.started.lock().unwrap().clone()
    }
}

#[async_trait]
impl Launch for FakeLauncher {
    async fn start(
        &self,
        _spec: &RunSpec,
        lease: &Lease,
        _node: &str,
        term_at: Instant,
        kill_at: Instant,
    ) -> Result<Box<dyn JobProcess>, String> {
        if let Some(m) = self.refuse.lock().unwrap().clone() {
            return Err(m);
        }
        let handle = JobHandle {
            resource: lease.resource.clone(),
            token: lease.token,
            owner_id: lease.owner_id,
            term_at,
            kill_at,
            state: Arc::new(Mutex::new(JobState {
                started: Instant::now(),
                script: *self.script.lock().unwrap(),
                signals: Vec::new(),
                confirms: Vec::new(),
                ended: None,
                reaped: false,
            })),
            wake: Arc::new(Notify::new()),
        };
        let mut started = self.started.lock().unwrap();
        started.push(handle.clone());
        Ok(Box::new(FakeJob {
            pid: 10_000 + started.len() as u32,
            handle,
        }))
    }
}

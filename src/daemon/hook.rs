//! `on_failure`: a command run once after a run of the job did not succeed,
//! with the run's facts in its environment, so that a webhook or a page is
//! one `curl` away.
//!
//! The hook runs outside the lease (the run is over), with the jobs'
//! environment (the store's credentials kept out of it), a time limit, and
//! no retry: its failure is logged (`on_failure_failed`) and that is all.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::domain::RunOutcome;
use crate::events;
use crate::job_env::ChildEnv;
use crate::store::Token;

/// How long a hook may run before it is killed.
pub(super) const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// The most of a failing hook's stderr that goes into its event.
const STDERR_TAIL: usize = 2048;

/// What a hook is told about the run.
pub(super) struct Failure {
    pub job: String,
    pub resource: String,
    pub node: String,
    pub token: Token,
    pub outcome: RunOutcome,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub scheduled_at: String,
    pub run_id: String,
}

impl Failure {
    /// Whether the run may be retried ([`RunOutcome::retryable`]).
    pub(super) fn outcome_retryable(&self) -> bool {
        self.outcome.retryable()
    }
}

/// Runs `argv` for `failure` and logs how it ended.
pub(super) async fn on_failure(
    argv: Vec<String>,
    env: ChildEnv,
    job_env: BTreeMap<String, String>,
    failure: Failure,
) {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    for name in &env.remove {
        cmd.env_remove(name);
    }
    cmd.envs(job_env)
        .envs(env.set.iter().map(|(k, v)| (k, v)))
        .env("FENCECRON_JOB", &failure.job)
        .env("FENCECRON_RESOURCE", &failure.resource)
        .env("FENCECRON_NODE", &failure.node)
        .env("FENCECRON_TOKEN", failure.token.to_string())
        .env("FENCECRON_OUTCOME", failure.outcome.as_str())
        .env("FENCECRON_SCHEDULED_AT", &failure.scheduled_at)
        .env("FENCECRON_RUN_ID", &failure.run_id)
        .env_remove("FENCECRON_EXIT_CODE")
        .env_remove("FENCECRON_SIGNAL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for name in crate::job_env::DAEMON_ONLY {
        cmd.env_remove(name);
    }
    if let Some(code) = failure.exit_code {
        cmd.env("FENCECRON_EXIT_CODE", code.to_string());
    }
    if let Some(signal) = failure.signal {
        cmd.env("FENCECRON_SIGNAL", events::signal_name(signal));
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            events::on_failure_failed(
                &failure.job,
                &format!("cannot start `{}`: {e}; check on_failure's path", argv[0]),
            );
            return;
        }
    };
    let mut stderr = child.stderr.take();
    let run = async {
        let mut buf = Vec::new();
        if let Some(err) = stderr.as_mut() {
            let _ = err.read_to_end(&mut buf).await;
        }
        (child.wait().await, buf)
    };
    match tokio::time::timeout(HOOK_TIMEOUT, run).await {
        Ok((Ok(status), _)) if status.success() => events::on_failure_finished(&failure.job),
        Ok((Ok(status), err)) => {
            let tail = &err[err.len().saturating_sub(STDERR_TAIL)..];
            events::on_failure_failed(
                &failure.job,
                &format!(
                    "`{}` ended with {status}: {}",
                    argv[0],
                    String::from_utf8_lossy(tail).trim()
                ),
            );
        }
        Ok((Err(e), _)) => events::on_failure_failed(&failure.job, &format!("waiting for it: {e}")),
        Err(_) => events::on_failure_failed(
            &failure.job,
            &format!("still running after {}s; killed", HOOK_TIMEOUT.as_secs()),
        ),
    }
}

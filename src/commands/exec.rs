//! `fencecron exec RESOURCE -- CMD…`: one command under a fenced lease,
//! supervised exactly like a daemon job (same renewal, same deadlines).

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cli::{Cli, ExecArgs};
use crate::error::{Error, Exit, Result};
use crate::events;
use crate::fence;
use crate::names::Name;
use crate::signals::Signals;
use crate::store::{AcquireOutcome, AcquireRequest, OpenOptions};
use crate::supervise::{LeaseTiming, RunSpec, SuperviseError, Supervisor, DEFAULT_LEASE};

use super::lease::held_error;
use super::{Context, RECORD_WAIT};

pub async fn run(cli: &Cli, args: &ExecArgs) -> Result<Exit> {
    let ctx = Context::load(cli, false)?;
    let resource = Name::parse("resource", &args.resource).map_err(Error::Usage)?;
    let timing = LeaseTiming::new(
        args.lease.unwrap_or(DEFAULT_LEASE),
        args.renew_every,
        args.kill_grace,
    )
    .map_err(|e| Error::Usage(e.to_string()))?;
    // Before the lease is taken: failing to set up the job's environment
    // must not leave a lease behind.
    let child_env = ctx.child_env()?;
    // Signals are caught before anything else so that a SIGTERM during the
    // acquire still ends in an orderly release.
    let shutdown = CancellationToken::new();
    let signal_task = Signals::stop_and_hangup()?.cancel_on_first(shutdown.clone());

    let store = ctx
        .store(&OpenOptions {
            max_connections: 2,
            call_timeout: timing.renew_every.min(std::time::Duration::from_secs(10)),
            ..OpenOptions::default()
        })
        .await?;
    let sent = Instant::now();
    let outcome = store
        .acquire(&AcquireRequest {
            resource: &resource,
            lease: timing.lease,
            node: &ctx.node,
            occurrence: None,
            next_occurrence: None,
            owner_id: crate::store::OwnerId::fresh(),
            run: None,
        })
        .await?;
    let lease = match outcome {
        AcquireOutcome::Acquired(l) => l,
        other => return Err(held_error(&resource, &other)),
    };
    events::lease_acquired(Some(resource.as_str()), &lease, &ctx.node);
    // Stored in the background; the command waits for it only at its end.
    let recording = fence::taken_over(&store, Some(resource.as_str()), &lease, &ctx.node);
    let spec = RunSpec {
        job: resource.to_string(),
        resource,
        command: args.command.clone(),
        env: Default::default(),
        workdir: None,
        timing,
        timeout: None,
        stale_exit_code: None,
        scheduled_at: None,
        inherit_stdio: true,
        history: None,
    };
    let resource_name = spec.resource.to_string();
    let supervisor = Supervisor::new(store, ctx.node.clone(), child_env);
    let result = supervisor.run(&spec, lease, sent, shutdown).await;
    fence::finish_recording(recording, &resource_name, RECORD_WAIT).await;
    let result = result.map_err(|e| match e {
        SuperviseError::Spawn { .. } => Error::CannotStart(e.to_string()),
        e => Error::Runtime(e.to_string()),
    })?;
    signal_task.abort();
    Ok(Exit::Job(result.shell_code()))
}

//! `fencecron lease acquire|renew|release|list`.

use serde_json::json;

use crate::cli::{Cli, LeaseCommand};
use crate::error::{Error, Exit, Result};
use crate::fence;
use crate::names::Name;
use crate::output::{self, Align, Out, Table};
use crate::store::{
    AcquireOutcome, AcquireRequest, Lease, OpenOptions, ReleaseOutcome, RenewOutcome,
};
use crate::supervise::DEFAULT_LEASE;

use super::{owner_id_arg, print_json, Context, RECORD_WAIT};

pub async fn run(cli: &Cli, cmd: &LeaseCommand) -> Result<Exit> {
    let ctx = Context::load(cli, false)?;
    match cmd {
        LeaseCommand::Acquire {
            resource,
            lease,
            json,
        } => {
            let resource = Name::parse("resource", resource).map_err(Error::Usage)?;
            let lease = checked_lease(*lease)?;
            let store = ctx.store(&OpenOptions::default()).await?;
            let outcome = store
                .acquire(&AcquireRequest {
                    resource: &resource,
                    lease,
                    node: &ctx.node,
                    occurrence: None,
                    next_occurrence: None,
                    owner_id: crate::store::OwnerId::fresh(),
                    run: None,
                })
                .await?;
            match outcome {
                AcquireOutcome::Acquired(l) => {
                    let recording = fence::taken_over(&store, None, &l, &ctx.node);
                    let printed = if *json {
                        print_json(&l)
                    } else {
                        print_lease(&l)
                    };
                    if let Err(e) = printed {
                        // Nobody learned the owner id and token, so nobody
                        // could use or release this lease: give it back
                        // rather than block the resource until it expires.
                        let _ = store.release(&resource, l.owner_id, l.token).await;
                        fence::finish_recording(recording, &l.resource, RECORD_WAIT).await;
                        return Err(e);
                    }
                    fence::finish_recording(recording, &l.resource, RECORD_WAIT).await;
                    Ok(Exit::Success)
                }
                other => Err(held_error(&resource, &other)),
            }
        }
        LeaseCommand::Renew {
            resource,
            owner_id,
            token,
            lease,
            json,
        } => {
            let resource = Name::parse("resource", resource).map_err(Error::Usage)?;
            let owner_id = owner_id_arg(owner_id)?;
            let lease = checked_lease(*lease)?;
            let store = ctx.store(&OpenOptions::default()).await?;
            match store.renew(&resource, owner_id, *token, lease).await? {
                RenewOutcome::Renewed { expires_at } => {
                    if *json {
                        print_json(&json!({
                            "resource": resource.as_str(),
                            "owner_id": owner_id,
                            "token": token,
                            "expires_at": expires_at,
                        }))?;
                    } else {
                        output::assignment(&mut Out::stdout(), "expires_at", expires_at)?;
                    }
                    Ok(Exit::Success)
                }
                RenewOutcome::Refused(r) => Err(Error::NotOwner(format!(
                    "cannot renew {resource} as owner {owner_id} with token {token}: {r}; acquire a new lease instead"
                ))),
            }
        }
        LeaseCommand::Release {
            resource,
            owner_id,
            token,
        } => {
            let resource = Name::parse("resource", resource).map_err(Error::Usage)?;
            let owner_id = owner_id_arg(owner_id)?;
            let store = ctx.store(&OpenOptions::default()).await?;
            match store.release(&resource, owner_id, *token).await? {
                ReleaseOutcome::Released => Ok(Exit::Success),
                ReleaseOutcome::Refused(r) => Err(Error::NotOwner(format!(
                    "cannot release {resource} as owner {owner_id} with token {token}: {r}; nothing to do"
                ))),
            }
        }
        LeaseCommand::Forget { resource } => {
            let resource = Name::parse("resource", resource).map_err(Error::Usage)?;
            let store = ctx.store(&OpenOptions::default()).await?;
            let now = store.now().await?;
            match store.forget(&resource, now).await? {
                Some(true) => Ok(Exit::Success),
                Some(false) => Err(Error::Held(format!(
                    "the lease of {resource} is held; forget it once it is released or expired"
                ))),
                None => Err(Error::Missing(format!(
                    "no lease of {resource} in the store; check the resource name with `fencecron lease list`"
                ))),
            }
        }
        LeaseCommand::List { json } => {
            let store = ctx.store(&OpenOptions::default()).await?;
            let leases = store.list().await?;
            if *json {
                print_json(&leases)?;
            } else {
                // Ages by the store's clock, which decides expiry.
                let now = store.now().await?.to_utc();
                let mut table = Table::new(&[
                    ("RESOURCE", Align::Left),
                    ("TOKEN", Align::Right),
                    ("HELD", Align::Left),
                    ("EXPIRES_AT", Align::Left),
                    ("", Align::Left),
                    ("OWNER_ID", Align::Left),
                    ("NODE", Align::Left),
                ]);
                for l in leases {
                    table.row(vec![
                        l.resource,
                        l.token.to_string(),
                        if l.held { "yes" } else { "no" }.to_string(),
                        l.expires_at.to_string(),
                        output::relative(now, l.expires_at.to_utc()),
                        l.owner_id.to_string(),
                        l.node,
                    ]);
                }
                table.print(&mut Out::stdout())?;
            }
            Ok(Exit::Success)
        }
    }
}

/// `lease acquire`'s text output: one `key='value'` line per field, quoted
/// for the documented `eval "$(fencecron lease acquire …)"`, so a resource
/// named `x$(touch pwned)` sets `$resource` to exactly that and runs nothing.
fn print_lease(l: &Lease) -> Result<()> {
    let mut out = Out::stdout();
    output::assignment(&mut out, "resource", &l.resource)?;
    output::assignment(&mut out, "owner_id", l.owner_id)?;
    output::assignment(&mut out, "token", l.token)?;
    output::assignment(&mut out, "expires_at", l.expires_at)?;
    if let Some(prev) = &l.taken_over {
        output::assignment(&mut out, "previous_owner_id", prev.owner_id)?;
        output::assignment(&mut out, "previous_node", &prev.node)?;
        output::assignment(&mut out, "previous_token", prev.token)?;
        output::assignment(&mut out, "previous_expired_at", prev.expired_at)?;
    }
    Ok(())
}

/// The lease length from a flag, checked before the store is touched.
fn checked_lease(flag: Option<std::time::Duration>) -> Result<std::time::Duration> {
    let lease = flag.unwrap_or(DEFAULT_LEASE);
    if lease < crate::store::MIN_LEASE || lease > crate::store::MAX_LEASE {
        return Err(Error::Usage(format!(
            "--lease {} is outside 5s..=300s; choose a lease between 5s and 300s",
            humantime::format_duration(lease)
        )));
    }
    Ok(lease)
}

/// The exit-75 error for a lease someone else holds.
pub(crate) fn held_error(resource: &Name, outcome: &AcquireOutcome) -> Error {
    match outcome {
        AcquireOutcome::LostRace => Error::Held(format!(
            "lease {resource} was just taken by a concurrent acquirer; retry after it expires or is released"
        )),
        AcquireOutcome::Held {
            owner_id,
            node,
            token,
            expires_at,
        } => Error::Held(format!(
            "lease {resource} is held by {owner_id} on {node} with token {token} until {expires_at}; retry after it expires or is released",
        )),
        AcquireOutcome::OccurrenceTaken { last_occurrence } => Error::Held(format!(
            "occurrence of {resource} was already taken (last occurrence {last_occurrence})"
        )),
        AcquireOutcome::NotYetDue { store_now } => Error::Held(format!(
            "occurrence of {resource} is not due yet by the store's clock ({store_now}); retry later"
        )),
        AcquireOutcome::Superseded { store_now } => Error::Held(format!(
            "occurrence of {resource} is already superseded by the store's clock ({store_now}); this host's clock runs behind"
        )),
        AcquireOutcome::Paused { note, .. } => Error::Held(format!(
            "{resource} is paused{}; run `fencecron resume` to run it again",
            note.as_deref().map(|n| format!(" ({n})")).unwrap_or_default()
        )),
        AcquireOutcome::Acquired(_) => Error::Runtime("internal: acquired is not an error".into()),
    }
}

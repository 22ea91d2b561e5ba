//! `fencecron epoch [show|advance]`: the epoch of fencing tokens.
//!
//! `advance` is for failover hooks (Patroni `on_role_change`, orchestrator
//! or MHA hooks): after a promotion, every token the new primary issues is
//! greater than any the old primary could have issued, also for commits the
//! new primary never received.

use crate::cli::{Cli, EpochAction, EpochArgs};
use crate::error::{Exit, Result};
use crate::events;
use crate::output::{self, Out};
use crate::store::{EpochInfo, OpenOptions};

use super::{print_json, Context};

pub async fn run(cli: &Cli, args: &EpochArgs) -> Result<Exit> {
    let ctx = Context::load(cli, false)?;
    let store = ctx.store(&OpenOptions::default()).await?;
    let info = match args.action.unwrap_or(EpochAction::Show) {
        EpochAction::Show => store.epoch().await?,
        EpochAction::Advance => {
            let info = store.advance_epoch().await?;
            events::epoch_advanced(&info);
            info
        }
    };
    if args.json {
        print_json(&info)?;
    } else {
        print_text(&info)?;
    }
    Ok(Exit::Success)
}

/// `key='value'` lines, like `lease acquire` (`eval`-able).
fn print_text(info: &EpochInfo) -> Result<()> {
    let mut out = Out::stdout();
    output::assignment(&mut out, "epoch", info.effective)?;
    output::assignment(&mut out, "stored_epoch", info.stored)?;
    if let Some(tl) = info.timeline {
        output::assignment(&mut out, "timeline", tl)?;
    }
    output::assignment(&mut out, "lowest_token", info.lowest_token)?;
    let highest = info
        .highest_token
        .map(|t| t.to_string())
        .unwrap_or_default();
    output::assignment(&mut out, "highest_token", highest)
}

//! `fencecron epoch [show|advance]`: the epoch of fencing tokens.
//!
//! `advance` is for failover hooks (Patroni `on_role_change`, orchestrator
//! or MHA hooks): after a promotion, every token the new primary issues is
//! greater than any the old primary could have issued, also for commits the
//! new primary never received.

use crate::cli::{Cli, EpochAction, EpochArgs};
use crate::error::Result;
use crate::events;
use crate::store::{EpochInfo, OpenOptions};

use super::{print_json, Context};

pub async fn run(cli: &Cli, args: &EpochArgs) -> Result<u8> {
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
        print_text(&info);
    }
    Ok(0)
}

/// `key=value` lines, like `lease acquire`.
fn print_text(info: &EpochInfo) {
    println!("epoch={}", info.effective);
    println!("stored_epoch={}", info.stored);
    if let Some(tl) = info.timeline {
        println!("timeline={tl}");
    }
    println!("lowest_token={}", info.lowest_token);
    match info.highest_token {
        Some(t) => println!("highest_token={t}"),
        None => println!("highest_token="),
    }
}

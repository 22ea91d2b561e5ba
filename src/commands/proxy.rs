//! `fencecron proxy`: the fencing HTTP proxy ([`crate::proxy`]), wired to
//! the store of the config or `--store`, the node id and the stop signals.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cli::{Cli, ProxyArgs};
use crate::error::{Error, Exit, Result};
use crate::events;
use crate::proxy::{self, Proxy, Settings, Upstream};
use crate::signals::Signals;
use crate::store::OpenOptions;

use super::Context;

/// Connections to the store: one per request being checked at once. A
/// check is one short read, so a few serve many concurrent requests.
const STORE_CONNECTIONS: u32 = 8;

/// How long a request waits for the store's check before it is refused
/// with 503: a store that does not answer never lets a request through.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn run(cli: &Cli, args: &ProxyArgs) -> Result<Exit> {
    let upstream = Upstream::parse(&args.upstream).map_err(Error::Usage)?;
    let ctx = Context::load(cli, false)?;
    // Signals first: a stop during start-up still ends the proxy cleanly.
    let stop = CancellationToken::new();
    let signal_task = Signals::stop()?.cancel_on_first(stop.clone());
    let store = ctx
        .store(&OpenOptions {
            max_connections: STORE_CONNECTIONS,
            call_timeout: CHECK_TIMEOUT,
            ..OpenOptions::default()
        })
        .await?;
    let listener = proxy::bind(args.listen).await.map_err(Error::Runtime)?;
    let listen = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| args.listen.to_string());
    events::proxy_started(
        &listen,
        &upstream.to_string(),
        &ctx.node,
        &ctx.store_url.to_string(),
    );
    let proxy = Proxy::new(
        store,
        Settings {
            upstream,
            node: ctx.node.clone(),
            upstream_timeout: args.upstream_timeout,
            drain: args.drain,
        },
    );
    let abandoned = proxy::serve(proxy, listener, stop).await;
    signal_task.abort();
    events::proxy_stopped(abandoned);
    Ok(Exit::Success)
}

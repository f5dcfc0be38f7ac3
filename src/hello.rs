//! The hello exchange: every second (and at once after a change) this
//! daemon sends its hello to every peer and records the hello each one
//! sends back; a peer's own hellos arrive through `PICKET HELLO`. Both
//! land in the [`PeerTable`](crate::quorum::table::PeerTable), where each group
//! task sees the configs its peers announce; the highest epoch seen is
//! persisted. It is the daemon's, not one group's: it reads the shared
//! context and stands above it, the groups below only read the table.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::context::DaemonCtx;
use crate::quorum::peers::{Hello, PeerLink};
use crate::quorum::table::PEER_TTL;

/// Take in a peer's hello: remember it and adopt a higher epoch. Returns
/// false when the sender is not a configured peer (or is this daemon).
pub async fn receive(ctx: &DaemonCtx, hello: &Hello) -> bool {
    let now = Instant::now();
    if hello.id == ctx.id || !ctx.peer_table.record_hello(hello, now) {
        return false;
    }
    observe_epoch(ctx, hello).await;
    true
}

/// Take in the hello the peer at `idx` replied with.
async fn receive_reply(ctx: &DaemonCtx, idx: usize, hello: &Hello) -> bool {
    let now = Instant::now();
    if hello.id == ctx.id || !ctx.peer_table.record_hello_at(idx, hello, now) {
        return false;
    }
    observe_epoch(ctx, hello).await;
    true
}

async fn observe_epoch(ctx: &DaemonCtx, hello: &Hello) {
    if let Err(e) = ctx.state.observe_epoch(hello.current_epoch).await {
        tracing::debug!(error = %e, "cannot persist an observed epoch");
    }
}

/// Send hellos to every peer every second and at once when asked;
/// `own` builds this daemon's hello at each round.
pub async fn run(
    ctx: Arc<DaemonCtx>,
    own: impl Fn() -> Hello + Send + 'static,
    cancel: CancellationToken,
) {
    let period = Duration::from_secs(1);
    let sends = TaskTracker::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(period) => {}
            _ = ctx.hello_now.notified() => {}
        }
        let hello = own();
        for (i, link) in ctx.peers.iter().enumerate() {
            let link = link.clone();
            let hello = hello.clone();
            let ctx = ctx.clone();
            let cancel = cancel.clone();
            sends.spawn(async move {
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = exchange(&ctx, i, &link, &hello) => {}
                }
            });
        }
        ctx.peer_table.export_metrics(Instant::now(), PEER_TTL);
    }
    sends.close();
    sends.wait().await;
}

async fn exchange(ctx: &DaemonCtx, i: usize, link: &PeerLink, hello: &Hello) {
    // A peer that announces another address than the one configured here
    // only recognises our hellos by id, and only after it has learnt ours
    // the same way: ask each peer for its id until it is known, so that
    // neither side waits for the other.
    if !ctx.peer_table.known(i)
        && let Ok(frame) = link.request(vec!["SENTINEL".into(), "MYID".into()]).await
        && let Some(id) = crate::resp::frame_text(&frame)
        && id != ctx.run_id
    {
        ctx.peer_table.set_run_id(i, id);
    }
    match link.hello(hello).await {
        Ok(reply) => {
            receive_reply(ctx, i, &reply).await;
        }
        Err(e) => tracing::debug!(peer = %link.addr(), error = %e, "hello failed"),
    }
}

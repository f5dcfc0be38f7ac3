//! The driver of a group: the task that owns the [`Group`], reads the
//! clock once per wake-up, hands each input (a probe report, a message,
//! the result of an effect, a change of the peer table, a timer) to the
//! decisions, and publishes the view. The decisions ask for work through
//! [`Effects`](super::effects::Effects), which executes it; nothing else in
//! `src/group/` reads the clock or starts a task.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::effects::{Effects, Internal};
use super::{Group, GroupError, GroupHandle, GroupMsg, GroupView, Woken, client_options};
use crate::config::GroupConfig;
use crate::context::DaemonCtx;
use crate::discovery::memory::MemoryBackend;
use crate::discovery::runner::DiscoveryRunner;
use crate::failover::ops::InstanceOps;
use crate::metrics as m;
use crate::probe::ProbeEvent;
use crate::quorum::table::PeerSnapshot;

/// How often a group's view is rebuilt when nothing changed (its ages).
const VIEW_REFRESH: Duration = Duration::from_secs(1);

/// The shortest gap between two publications of a group's view, unless
/// its master changed.
const VIEW_MIN_GAP: Duration = Duration::from_millis(20);

/// Start the task of one group; it runs on `tasks` until `parent` (or its
/// handle's `cancel`) is cancelled.
pub fn spawn(
    cfg: GroupConfig,
    ctx: Arc<DaemonCtx>,
    discovery: Arc<DiscoveryRunner>,
    recorders: Vec<MemoryBackend>,
    parent: &CancellationToken,
    tasks: &TaskTracker,
) -> Result<GroupHandle, GroupError> {
    let client = client_options(&cfg)?;
    let pod_watch = match &cfg.members {
        Some(mc) => Some(
            crate::discovery::kubernetes::members::PodWatch::new(
                &cfg.name,
                &mc.resolved(&cfg.discovery),
            )
            .map_err(|e| GroupError::Members(e.to_string()))?,
        ),
        None => None,
    };
    let record = ctx.state.group(&cfg.name);
    let (master, config_epoch) = super::start_config(&cfg, &record);
    let now = Instant::now();
    let cancel = parent.child_token();
    let (tx, rx) = mpsc::channel(1024);
    let (probe_tx, probe_rx) = mpsc::channel(4096);
    let (internal_tx, internal_rx) = mpsc::channel(1024);
    let effects = Effects::new(
        cfg.name.clone(),
        InstanceOps {
            client: client.clone(),
            admin_port: cfg.admin_port,
        },
        discovery.clone(),
        ctx.clone(),
        internal_tx,
        probe_tx,
        cancel.clone(),
    );
    let mut g = Group::new(
        cfg,
        ctx,
        client,
        discovery,
        recorders,
        effects,
        (master.clone(), config_epoch),
        (now, unix_now()),
        None,
    );
    g.probe_from_start(&record);
    if let Some(w) = pod_watch {
        // The watcher reports on a watch channel (bursts of pod changes
        // coalesce); a forwarder hands each snapshot to the mailbox.
        let (members_tx, mut members_rx) = watch::channel(None);
        tasks.spawn(w.run(members_tx, cancel.clone()));
        let mailbox = tx.clone();
        tasks.spawn(async move {
            while members_rx.changed().await.is_ok() {
                let snapshot = members_rx.borrow_and_update().clone();
                if let Some(m) = snapshot
                    && mailbox.send(Box::new(GroupMsg::Members(m))).await.is_err()
                {
                    break;
                }
            }
        });
    }
    // The views go out on a watch channel: the API and the hellos read
    // the newest, and a burst of changes is read once.
    let view_tx = watch::Sender::new(g.view.clone());
    let handle = GroupHandle {
        tx,
        view: view_tx.subscribe(),
        cancel,
    };
    tracing::info!(group = %g.cfg.name, master = %g.master, config_epoch = g.config_epoch, "monitoring group");
    metrics::gauge!(m::CONFIG_EPOCH, "group" => g.label.clone()).set(g.config_epoch as f64);
    metrics::gauge!(m::GROUP_MASTER, "group" => g.label.clone(), m::SERVER_LABEL => g.master.to_string())
        .set(1.0);
    // Boxed: an async fn keeps its arguments and the locals they are moved
    // into side by side, and the group (2 KiB) was stored twice in every
    // group's task.
    tasks.spawn(run(Box::new(g), view_tx, rx, probe_rx, internal_rx));
    Ok(handle)
}

/// The next change of the peer table, with the receiver to wait on again
/// (false: the table is gone).
async fn peers_changed(
    mut rx: watch::Receiver<PeerSnapshot>,
) -> (bool, watch::Receiver<PeerSnapshot>) {
    let open = rx.changed().await.is_ok();
    (open, rx)
}

/// The task: handle one thing at a time, to completion.
pub(super) async fn run(
    mut g: Box<Group>,
    view_tx: watch::Sender<Arc<GroupView>>,
    mut rx: mpsc::Receiver<Box<GroupMsg>>,
    mut probe_rx: mpsc::Receiver<Box<ProbeEvent>>,
    mut internal_rx: mpsc::Receiver<Box<Internal>>,
) {
    let mut next_tick = Instant::now();
    let mut last_view = Instant::now();
    // A token's future, polled at every wake-up of the task, takes the
    // token's lock each time: a watcher waits for it instead and fires a
    // oneshot, whose poll is one atomic load.
    let (stop_tx, mut stopped) = oneshot::channel::<()>();
    let cancel = g.effects.cancel().clone();
    tokio::spawn(async move {
        cancel.cancelled().await;
        let _ = stop_tx.send(());
    });
    // Kept across iterations, as the timer below: a change notification
    // (and a timer) made anew at every message were registered and freed
    // a thousand times a second with a thousand instances.
    let peers_changed = peers_changed(g.ctx.peer_table.subscribe());
    tokio::pin!(peers_changed);
    let mut peers_open = true;
    let sleep = tokio::time::sleep_until(next_tick);
    tokio::pin!(sleep);
    // Whether the INFO cadences must be looked at again: not after a PING
    // that changed nothing, by far the most frequent message.
    let mut cadence_due = true;
    g.now = Instant::now();
    g.unix_now = unix_now();
    g.peers = g.ctx.peer_table.snapshot();
    g.sync_liveness();
    loop {
        let mut wake = g.next_wake(next_tick);
        if g.dirty {
            wake = wake.min(last_view + VIEW_MIN_GAP);
        }
        if sleep.deadline() != wake {
            sleep.as_mut().reset(wake);
        }
        let woken = tokio::select! {
            _ = &mut stopped => break,
            Some(ev) = probe_rx.recv() => Woken::Probe(ev),
            Some(msg) = rx.recv() => Woken::Msg(msg),
            Some(int) = internal_rx.recv() => Woken::Internal(int),
            (open, rx) = &mut peers_changed, if peers_open => {
                peers_open = open;
                peers_changed.set(self::peers_changed(rx));
                if !open {
                    continue;
                }
                Woken::Peers
            }
            _ = &mut sleep => Woken::Timer,
        };
        g.now = Instant::now();
        g.unix_now = unix_now();
        g.peers = g.ctx.peer_table.snapshot();
        let timer = matches!(woken, Woken::Timer);
        cadence_due |= g.on_wake(woken);
        if timer {
            let now = Instant::now();
            if now >= next_tick {
                // On the probes' grid: the groups tick in the wake-ups
                // that send the PINGs (see `probe::grain`).
                let period = g.tick_period_now();
                let t =
                    crate::probe::on_grid(now + period, crate::probe::grain(g.cfg.ping_period()));
                next_tick = if t > now { t } else { now + period };
            }
        }
        // The view is published when something in it changed (a burst of
        // changes once per VIEW_MIN_GAP; a new master at once), and once a
        // second for its ages: rebuilding every group's view ten times a
        // second was a fifth of the CPU at a thousand instances.
        let now = Instant::now();
        let since = now.duration_since(last_view);
        if g.urgent || (g.dirty && since >= VIEW_MIN_GAP) || since >= VIEW_REFRESH {
            g.publish_view();
            view_tx.send_replace(g.view.clone());
            if g.urgent {
                // The hello is built from the published views: asked for
                // before this publication (a new master, SDOWN), it may
                // have carried the old view, and the peers would have
                // learnt the change only from the next periodic hello.
                g.ctx.hello_now.notify_one();
            }
            g.dirty = false;
            g.urgent = false;
            last_view = now;
        }
        if cadence_due {
            g.update_info_cadence(now);
            g.update_sync_holds();
            cadence_due = false;
        }
    }
    // Background retries of the discovery backends end with the group too.
    g.effects.stop().await;
    tracing::info!(group = %g.cfg.name, "group task stopped");
}

/// Seconds since the Unix epoch.
pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

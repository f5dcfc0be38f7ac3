//! Running under a service manager: systemd's notify protocol.
//!
//! - `READY=1` (with a `STATUS=` line) once the configuration is valid, both
//!   listeners are bound and every group is started;
//! - `WATCHDOG=1` every half `WatchdogSec` (`WATCHDOG_USEC`), but only while
//!   every group task makes progress: each publishes its view at least
//!   every 200 ms, so a view that has not changed for a while means a task
//!   that is stuck or gone, and the missing pings let systemd restart the
//!   daemon;
//! - `STATUS=` lines such as `3 groups, 2/2 peers reachable`;
//! - `RELOADING=1` and `READY=1` around a reload (SIGHUP), `STOPPING=1` on
//!   SIGTERM/SIGINT.
//!
//! Without `NOTIFY_SOCKET` in the environment every call here is a no-op.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::Running;
use crate::daemon::Daemon;
use crate::group::view::GroupView;

/// How often `STATUS=` is refreshed when systemd asked for no watchdog.
pub const STATUS_PERIOD: Duration = Duration::from_secs(10);

/// A group whose view has not changed for this long (or for one watchdog
/// period, if longer) is considered stuck. Views are published at least
/// every 200 ms; the margin absorbs a loaded machine.
pub const MIN_STALE_AFTER: Duration = Duration::from_secs(2);

/// How recently a peer must have answered to count as reachable in `STATUS=`
/// (the same time-to-live as the `picket_peer_up` gauge).
const PEER_TTL: Duration = Duration::from_secs(3);

/// Send `states` to the service manager; a failure is logged, never fatal
/// (the daemon works the same without systemd).
fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify the service manager");
    }
}

/// Whether a service manager listens (`NOTIFY_SOCKET` is set).
pub fn enabled() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

/// `READY=1` with the current status line.
pub fn notify_ready(daemon: &Daemon) {
    let status = status_line(daemon);
    send(&[NotifyState::Ready, NotifyState::Status(&status)]);
}

/// `RELOADING=1` with the monotonic time systemd (v253+) requires with it.
pub fn notify_reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[
            NotifyState::Reloading,
            now,
            NotifyState::Status("reloading the configuration"),
        ]),
        // Without the timestamp a recent systemd would fail the reload, so
        // say nothing about it rather than something it rejects.
        Err(e) => tracing::warn!(error = %e, "cannot read the monotonic clock"),
    }
}

/// `STOPPING=1`.
pub fn notify_stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// The one-line summary sent as `STATUS=`, e.g. `3 groups, 2/2 peers
/// reachable`, followed by groups in failover and stall protection.
pub fn status_line(daemon: &Daemon) -> String {
    let now = Instant::now();
    let views = daemon.views();
    let peers = daemon.ctx.peer_table.snapshot();
    let reachable = peers
        .iter()
        .filter(|p| {
            p.last_seen
                .is_some_and(|t| now.saturating_duration_since(t) <= PEER_TTL)
        })
        .count();
    let mut line = format!(
        "{} group{}, {reachable}/{} peers reachable",
        views.len(),
        if views.len() == 1 { "" } else { "s" },
        peers.len()
    );
    let failing: Vec<&str> = views
        .iter()
        .filter(|v| v.failover.is_some())
        .map(|v| v.name.as_str())
        .collect();
    if !failing.is_empty() {
        line.push_str(&format!(", failover in progress: {}", failing.join(" ")));
    }
    if daemon.ctx.tilt.until().is_some_and(|u| now < u) {
        line.push_str(", stall protection active");
    }
    line
}

/// Why the watchdog withholds its ping.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stalled {
    /// The group task ended (its view channel is closed).
    #[error("group {0}: its task has stopped")]
    Stopped(String),
    /// The group task has not published a view for too long.
    #[error("group {group}: no progress for {secs} s")]
    NoProgress {
        /// The group.
        group: String,
        /// Seconds since its view last changed.
        secs: u64,
    },
}

/// Tracks, per group, when its view last changed.
///
/// It keeps its own receiver of each group's view channel, so that reading
/// does not disturb anyone else's, and notices a group restarted by a reload
/// (a different channel under the same name). Generic over the channel's
/// value so that it can be tested without a group task.
#[derive(Debug)]
pub struct Liveness<T = Arc<GroupView>> {
    stale_after: Duration,
    seen: HashMap<String, (watch::Receiver<T>, Instant)>,
}

impl<T> Liveness<T> {
    /// A group is stuck after `stale_after` without a new view.
    pub fn new(stale_after: Duration) -> Self {
        Liveness {
            stale_after,
            seen: HashMap::new(),
        }
    }

    /// Check every group (name and view channel) at `now`. A group seen for
    /// the first time (or restarted) starts its clock now; groups no longer
    /// listed are forgotten.
    pub fn check<'a>(
        &mut self,
        groups: impl IntoIterator<Item = (&'a str, &'a watch::Receiver<T>)>,
        now: Instant,
    ) -> Result<(), Vec<Stalled>>
    where
        T: 'a,
    {
        let mut problems = Vec::new();
        let mut present = std::collections::HashSet::new();
        for (name, view) in groups {
            present.insert(name.to_string());
            let entry = self
                .seen
                .entry(name.to_string())
                .or_insert_with(|| (view.clone(), now));
            if !entry.0.same_channel(view) {
                *entry = (view.clone(), now);
            }
            let (rx, last_change) = entry;
            match rx.has_changed() {
                Err(_) => problems.push(Stalled::Stopped(name.to_string())),
                Ok(true) => {
                    rx.mark_unchanged();
                    *last_change = now;
                }
                Ok(false) => {
                    let idle = now.saturating_duration_since(*last_change);
                    if idle > self.stale_after {
                        problems.push(Stalled::NoProgress {
                            group: name.to_string(),
                            secs: idle.as_secs(),
                        });
                    }
                }
            }
        }
        self.seen.retain(|name, _| present.contains(name));
        if problems.is_empty() {
            Ok(())
        } else {
            problems.sort_by_key(|p| p.to_string());
            Err(problems)
        }
    }
}

/// Tell the service manager the daemon is ready and start the task that
/// pings the watchdog and refreshes `STATUS=` (when a manager listens).
pub fn started(running: &Running) {
    if !enabled() {
        return;
    }
    notify_ready(&running.daemon);
    let watchdog = sd_notify::watchdog_enabled();
    tracing::info!(watchdog = ?watchdog, "service manager notified");
    running.tasks.spawn(supervise(
        running.daemon.clone(),
        running.cancel.clone(),
        watchdog,
    ));
}

/// Ping the watchdog every half `watchdog` while every group makes
/// progress, and keep `STATUS=` current; without a watchdog only the status
/// is refreshed, every [`STATUS_PERIOD`].
pub async fn supervise(daemon: Arc<Daemon>, cancel: CancellationToken, watchdog: Option<Duration>) {
    let period = match watchdog {
        Some(w) => (w / 2).max(Duration::from_millis(1)),
        None => STATUS_PERIOD,
    };
    let mut liveness = Liveness::new(MIN_STALE_AFTER.max(period));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_status = String::new();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let groups = daemon
            .groups
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let verdict = liveness.check(
            groups.iter().map(|(name, h)| (name.as_str(), &h.view)),
            Instant::now(),
        );
        let status = match &verdict {
            Ok(()) => status_line(&daemon),
            Err(problems) => {
                let text = problems
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                tracing::error!(problems = %text, "watchdog: not pinging systemd");
                format!("unhealthy: {text}")
            }
        };
        let mut states = Vec::with_capacity(2);
        if watchdog.is_some() && verdict.is_ok() {
            states.push(NotifyState::Watchdog);
        }
        if status != last_status {
            states.push(NotifyState::Status(&status));
        }
        if !states.is_empty() {
            send(&states);
        }
        last_status = status;
    }
}

/// Why `picket health` failed.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// The HTTP client could not be built.
    #[error("cannot build an HTTP client: {0}")]
    Client(String),
    /// No answer.
    #[error("cannot reach http://{addr}/healthz: {reason}")]
    Unreachable {
        /// The daemon's `http_listen`.
        addr: String,
        /// Why.
        reason: String,
    },
    /// An answer other than 200.
    #[error("http://{addr}/healthz answered {status}")]
    Unhealthy {
        /// The daemon's `http_listen`.
        addr: String,
        /// The HTTP status.
        status: u16,
    },
}

/// `picket health`: whether the daemon at `addr` (its `http_listen`)
/// answers `/healthz` with 200 within `timeout`. Container health checks
/// use it so that the image needs no HTTP client of its own.
pub async fn check_health(addr: &str, timeout: Duration) -> Result<(), HealthError> {
    crate::tls::install_crypto_provider();
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .no_proxy()
        .build()
        .map_err(|e| HealthError::Client(e.to_string()))?;
    let response = client
        .get(format!("http://{addr}/healthz"))
        .send()
        .await
        .map_err(|e| HealthError::Unreachable {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(HealthError::Unhealthy {
            addr: addr.to_string(),
            status: response.status().as_u16(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        l: &mut Liveness<u32>,
        groups: &[(&str, &watch::Receiver<u32>)],
    ) -> Result<(), Vec<Stalled>> {
        l.check(groups.iter().copied(), Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_publishing_views_is_alive() {
        let (tx, rx) = watch::channel(0u32);
        let mut l = Liveness::new(Duration::from_secs(2));
        for i in 0..10 {
            assert_eq!(check(&mut l, &[("a", &rx)]), Ok(()));
            tokio::time::advance(Duration::from_secs(1)).await;
            tx.send_replace(i);
        }
        assert_eq!(check(&mut l, &[("a", &rx)]), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_group_is_stuck_after_the_limit() {
        let (_tx, rx) = watch::channel(0u32);
        let mut l = Liveness::new(Duration::from_secs(2));
        assert_eq!(check(&mut l, &[("a", &rx)]), Ok(()));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(check(&mut l, &[("a", &rx)]), Ok(()), "at the limit");
        tokio::time::advance(Duration::from_millis(1100)).await;
        assert_eq!(
            check(&mut l, &[("a", &rx)]),
            Err(vec![Stalled::NoProgress {
                group: "a".into(),
                secs: 3
            }])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_group_task_is_reported_at_once() {
        let (a_tx, a) = watch::channel(0u32);
        let (_b_tx, b) = watch::channel(0u32);
        let mut l = Liveness::new(Duration::from_secs(2));
        assert_eq!(check(&mut l, &[("a", &a), ("b", &b)]), Ok(()));
        drop(a_tx);
        assert_eq!(
            check(&mut l, &[("a", &a), ("b", &b)]),
            Err(vec![Stalled::Stopped("a".into())])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_group_gets_a_fresh_clock_and_removed_groups_are_forgotten() {
        let (_old_tx, old) = watch::channel(0u32);
        let mut l = Liveness::new(Duration::from_secs(2));
        assert_eq!(check(&mut l, &[("a", &old)]), Ok(()));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(check(&mut l, &[("a", &old)]).is_err());
        // A reload replaced the task: a new channel under the same name.
        let (_new_tx, new) = watch::channel(0u32);
        assert_eq!(check(&mut l, &[("a", &new)]), Ok(()));
        assert_eq!(check(&mut l, &[]), Ok(()));
        assert!(l.seen.is_empty());
    }
}

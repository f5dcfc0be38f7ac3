//! What every group task shares: identity, persisted state, peer links,
//! the event bus and stall protection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::events::Events;
use crate::metrics as m;
use crate::quorum::peers::{Hello, PeerLink};
use crate::quorum::state::StateStore;

/// What this daemon knows about one peer.
#[derive(Debug, Clone)]
pub struct PeerEntry {
    /// Configured address.
    pub addr: String,
    /// Its id, from its hello.
    pub id: Option<String>,
    /// When it last answered anything.
    pub last_seen: Option<Instant>,
    /// When its last hello arrived (the only proof of its current config).
    pub last_hello: Option<Instant>,
    /// Its last hello.
    pub hello: Option<Hello>,
}

/// The peers' latest hellos and liveness.
#[derive(Debug)]
pub struct PeerTable {
    entries: Mutex<Vec<PeerEntry>>,
}

impl PeerTable {
    /// One entry per configured peer.
    pub fn new(addrs: &[String]) -> Self {
        PeerTable {
            entries: Mutex::new(
                addrs
                    .iter()
                    .map(|a| PeerEntry {
                        addr: a.clone(),
                        id: None,
                        last_seen: None,
                        last_hello: None,
                        hello: None,
                    })
                    .collect(),
            ),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PeerEntry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record a hello: matched by address, else by id. Returns false for a
    /// sender that is not a configured peer (its hello is then ignored:
    /// membership is static).
    pub fn record_hello(&self, hello: &Hello, now: Instant) -> bool {
        let mut g = self.lock();
        let idx = g.iter().position(|e| e.addr == hello.addr).or_else(|| {
            g.iter()
                .position(|e| e.id.as_deref() == Some(hello.id.as_str()))
        });
        match idx {
            Some(i) => {
                Self::store(&mut g[i], hello, now);
                true
            }
            None => false,
        }
    }

    /// Record the hello the peer at `idx` sent back in reply to ours: it is
    /// that peer whatever address it announces (behind NAT or a proxy,
    /// configured by another name, listening on 0.0.0.0 without
    /// `announce`).
    pub fn record_hello_at(&self, idx: usize, hello: &Hello, now: Instant) -> bool {
        match self.lock().get_mut(idx) {
            Some(e) => {
                Self::store(e, hello, now);
                true
            }
            None => false,
        }
    }

    /// Remember the id the peer at `idx` gave for itself (`SENTINEL
    /// MYID`), so that its own hellos are recognised by id when the
    /// address it announces is not the one configured here.
    pub fn set_id(&self, idx: usize, id: String) {
        if let Some(e) = self.lock().get_mut(idx) {
            e.id = Some(id);
        }
    }

    /// The id of the peer at `idx`, once known.
    pub fn id_of(&self, idx: usize) -> Option<String> {
        self.lock().get(idx).and_then(|e| e.id.clone())
    }

    fn store(e: &mut PeerEntry, hello: &Hello, now: Instant) {
        e.id = Some(hello.id.clone());
        e.last_seen = Some(now);
        e.last_hello = Some(now);
        e.hello = Some(hello.clone());
        metrics::gauge!(m::PEER_UP, "peer" => e.addr.clone()).set(1.0);
    }

    /// Record that the peer at `idx` answered something.
    pub fn mark_seen(&self, idx: usize, now: Instant) {
        if let Some(e) = self.lock().get_mut(idx) {
            e.last_seen = Some(now);
        }
    }

    /// A copy of every entry.
    pub fn snapshot(&self) -> Vec<PeerEntry> {
        self.lock().clone()
    }

    /// Refresh the peer-up gauges.
    pub fn export_metrics(&self, now: Instant, ttl: Duration) {
        for e in self.lock().iter() {
            let up = e
                .last_seen
                .is_some_and(|t| now.saturating_duration_since(t) <= ttl);
            metrics::gauge!(m::PEER_UP, "peer" => e.addr.clone()).set(if up { 1.0 } else { 0.0 });
        }
    }
}

/// Stall protection (Sentinel's TILT): when the daemon's own timer jumps,
/// it stops acting for a while and does not count the stall as downtime.
#[derive(Debug)]
pub struct Tilt {
    until: Mutex<Option<Instant>>,
    entered: Mutex<Option<Instant>>,
    events: Events,
}

impl Tilt {
    /// Not in TILT.
    pub fn new(events: Events) -> Self {
        Tilt {
            until: Mutex::new(None),
            entered: Mutex::new(None),
            events,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stall of `gap` was seen at `now`: stay in TILT for `period`.
    pub fn enter(&self, now: Instant, gap: Duration, period: Duration) {
        let mut g = self.lock();
        let was = g.is_some_and(|u| now < u);
        *g = Some(now + period);
        if !was {
            *self.entered.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
            metrics::counter!(m::TILTS).increment(1);
            metrics::gauge!(m::TILT).set(1.0);
            self.events.emit(
                crate::events::EventKind::Tilt,
                format!("#tilt mode entered (timer jumped {} ms)", gap.as_millis()),
            );
        }
    }

    /// Whether TILT is active at `now` (leaving it emits `-tilt`).
    pub fn active(&self, now: Instant) -> bool {
        let mut g = self.lock();
        match *g {
            Some(u) if now < u => true,
            Some(_) => {
                *g = None;
                metrics::gauge!(m::TILT).set(0.0);
                self.events
                    .emit(crate::events::EventKind::TiltExit, "#tilt mode exited");
                false
            }
            None => false,
        }
    }

    /// When TILT ends (or ended).
    pub fn until(&self) -> Option<Instant> {
        *self.lock()
    }

    /// When the latest TILT began (INFO's `sentinel_tilt_since_seconds`).
    pub fn since(&self) -> Option<Instant> {
        *self.entered.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The daemon-wide context shared by the group tasks, the API and HTTP.
#[derive(Debug)]
pub struct DaemonCtx {
    /// This daemon's id.
    pub id: String,
    /// Address announced to peers and clients.
    pub announce: String,
    /// Persisted state.
    pub state: Arc<StateStore>,
    /// Links to the peers (same order as the config's `peers`).
    pub peers: Vec<PeerLink>,
    /// What the peers said.
    pub peer_table: PeerTable,
    /// Event bus.
    pub events: Events,
    /// Wake the hello task (a config changed).
    pub hello_now: Notify,
    /// Stall protection.
    pub tilt: Tilt,
    /// Password required on `listen` (and sent to peers).
    pub password: Option<String>,
    /// `SENTINEL SIMULATE-FAILURE` flags ([`CRASH_AFTER_ELECTION`],
    /// [`CRASH_AFTER_PROMOTION`]): crash tests make the leader exit at the
    /// worst moments.
    pub simulate_failure: std::sync::atomic::AtomicU8,
}

/// Exit right after winning an election.
pub const CRASH_AFTER_ELECTION: u8 = 1;
/// Exit right after the promotion step succeeded.
pub const CRASH_AFTER_PROMOTION: u8 = 2;

impl DaemonCtx {
    /// Exit the process (code 99, like Sentinel) if `flag` is set.
    pub fn maybe_crash(&self, flag: u8, what: &str) {
        if self
            .simulate_failure
            .load(std::sync::atomic::Ordering::SeqCst)
            & flag
            != 0
        {
            tracing::warn!("simulated failure: exiting {what}");
            std::process::exit(99);
        }
    }

    /// Number of daemons in the quorum (peers + self).
    pub fn daemons(&self) -> usize {
        self.peers.len() + 1
    }

    /// A majority of all configured daemons.
    pub fn majority(&self) -> usize {
        self.daemons() / 2 + 1
    }
}

/// A running daemon: what the RESP API and the HTTP server read.
#[derive(Debug)]
pub struct Daemon {
    /// Shared context.
    pub ctx: Arc<DaemonCtx>,
    /// Group tasks by name.
    pub groups: std::sync::RwLock<std::collections::HashMap<String, crate::group::GroupHandle>>,
    /// The configuration in force.
    pub config: std::sync::RwLock<crate::config::Config>,
    /// Prometheus renderer (None when another recorder was installed).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Set once every listener is bound and every group started.
    pub ready: std::sync::atomic::AtomicBool,
    /// Start time, for uptime.
    pub started: Instant,
}

impl Daemon {
    /// A group's handle.
    pub fn group(&self, name: &str) -> Option<crate::group::GroupHandle> {
        self.groups
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Every group's current view, sorted by name.
    pub fn views(&self) -> Vec<Arc<crate::group::view::GroupView>> {
        let mut v: Vec<_> = self
            .groups
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|h| h.view.borrow().clone())
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// This daemon's hello.
    pub fn hello(&self) -> Hello {
        let groups = self.groups.read().unwrap_or_else(|e| e.into_inner());
        Hello {
            id: self.ctx.id.clone(),
            addr: self.ctx.announce.clone(),
            current_epoch: self.ctx.state.current_epoch(),
            groups: crate::group::hello_groups(&groups),
        }
    }

    /// Take in a peer's hello: remember it, adopt a higher epoch and any
    /// newer group config. Returns false when the sender is not a peer.
    pub fn apply_hello(&self, hello: &Hello) -> bool {
        let now = Instant::now();
        if hello.id == self.ctx.id || !self.ctx.peer_table.record_hello(hello, now) {
            return false;
        }
        self.adopt_from_hello(hello);
        true
    }

    /// Take in the hello the peer at `idx` replied with (see
    /// [`PeerTable::record_hello_at`]).
    pub fn apply_hello_reply(&self, idx: usize, hello: &Hello) -> bool {
        let now = Instant::now();
        if hello.id == self.ctx.id || !self.ctx.peer_table.record_hello_at(idx, hello, now) {
            return false;
        }
        self.adopt_from_hello(hello);
        true
    }

    fn adopt_from_hello(&self, hello: &Hello) {
        if let Err(e) = self.ctx.state.observe_epoch(hello.current_epoch) {
            tracing::debug!(error = %e, "cannot persist an observed epoch");
        }
        let groups = self.groups.read().unwrap_or_else(|e| e.into_inner());
        for g in &hello.groups {
            if let Some(h) = groups.get(&g.name)
                && g.config_epoch > h.view.borrow().config_epoch
            {
                let _ = h.tx.try_send(crate::group::GroupMsg::PeerConfig {
                    from: hello.id.clone(),
                    group: g.clone(),
                });
            }
        }
    }
}

/// Send hellos to every peer every second and at once when asked.
pub async fn run_hello(daemon: Arc<Daemon>, cancel: tokio_util::sync::CancellationToken) {
    let period = Duration::from_secs(1);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
            _ = daemon.ctx.hello_now.notified() => {}
        }
        let hello = daemon.hello();
        for (i, link) in daemon.ctx.peers.iter().enumerate() {
            let link = link.clone();
            let hello = hello.clone();
            let d = daemon.clone();
            tokio::spawn(async move {
                // A peer that announces another address than the one
                // configured here only recognises our hellos by id, and
                // only after it has learnt ours the same way: ask each
                // peer for its id until it is known, so that neither side
                // waits for the other.
                if d.ctx.peer_table.id_of(i).is_none()
                    && let Ok(frame) = link.request(vec!["SENTINEL".into(), "MYID".into()]).await
                    && let Some(id) = crate::resp::frame_text(&frame)
                    && id != d.ctx.id
                {
                    d.ctx.peer_table.set_id(i, id);
                }
                match link.hello(&hello).await {
                    Ok(reply) => {
                        d.apply_hello_reply(i, &reply);
                    }
                    Err(e) => tracing::debug!(peer = %link.addr(), error = %e, "hello failed"),
                }
            });
        }
        daemon
            .ctx
            .peer_table
            .export_metrics(Instant::now(), Duration::from_secs(3));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(id: &str, addr: &str) -> Hello {
        Hello {
            id: id.into(),
            addr: addr.into(),
            current_epoch: 0,
            groups: Vec::new(),
        }
    }

    #[test]
    fn hellos_are_matched_by_address_then_by_learnt_id() {
        let t = PeerTable::new(&["10.0.0.2:26379".into(), "proxy:7000".into()]);
        let now = Instant::now();
        assert!(t.record_hello(&hello("b", "10.0.0.2:26379"), now));
        // Announced under another address than the configured one.
        let c = hello("c", "10.0.0.3:26379");
        assert!(!t.record_hello(&c, now));
        t.set_id(1, "c".into());
        assert!(t.record_hello(&c, now));
        assert_eq!(t.snapshot()[1].hello.as_ref(), Some(&c));
        // A stranger is still refused.
        assert!(!t.record_hello(&hello("x", "10.0.0.9:26379"), now));
    }

    #[test]
    fn a_reply_is_recorded_for_the_peer_it_came_from() {
        let t = PeerTable::new(&["proxy:7000".into()]);
        let now = Instant::now();
        let c = hello("c", "0.0.0.0:26379");
        assert!(t.record_hello_at(0, &c, now));
        assert_eq!(t.id_of(0).as_deref(), Some("c"));
        assert_eq!(t.snapshot()[0].last_seen, Some(now));
        assert!(!t.record_hello_at(1, &c, now));
    }
}

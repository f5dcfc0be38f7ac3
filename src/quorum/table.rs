//! What this daemon knows of its peers: their ids, when they were last
//! heard from, and their last hello. Published through a `watch`, so that
//! group tasks read it without a shared lock and wake up when a peer
//! announces a different config (and only then: a hello that repeats the
//! last one, or an answer that only proves the peer alive, updates the
//! table without waking anyone).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics as m;
use crate::quorum::peers::{Hello, HelloGroup};

/// How long a peer counts as reachable after it last answered.
pub const PEER_TTL: Duration = Duration::from_secs(3);

/// What this daemon knows about one peer.
#[derive(Debug, Clone)]
pub struct PeerEntry {
    /// Configured address.
    pub addr: String,
    /// Its id, from its hello.
    pub id: Option<String>,
    /// Its run id, from its hello or `SENTINEL MYID`.
    pub run_id: Option<String>,
    /// When it last answered anything.
    pub last_seen: Option<Instant>,
    /// When its last hello arrived (the only proof of its current config).
    pub last_hello: Option<Instant>,
    /// Its last hello.
    pub hello: Option<Arc<Hello>>,
    /// Its groups by name (from the last hello).
    groups: Arc<HashMap<String, HelloGroup>>,
    /// When this daemon started listening for it.
    since: Instant,
}

impl PeerEntry {
    fn new(addr: String, since: Instant) -> PeerEntry {
        PeerEntry {
            addr,
            id: None,
            run_id: None,
            last_seen: None,
            last_hello: None,
            hello: None,
            groups: Arc::default(),
            since,
        }
    }

    /// The peer's view of group `name`, from its last hello.
    pub fn group(&self, name: &str) -> Option<&HelloGroup> {
        self.groups.get(name)
    }

    /// Not known to be down: it answered within `ttl`, or it has not been
    /// heard from yet and this daemon started less than `ttl` ago (a
    /// just-restarted daemon must not report its peers down before it has
    /// had the chance to hear them; a peer that was heard and went quiet
    /// is down after the same `ttl`).
    pub fn reachable(&self, now: Instant, ttl: Duration) -> bool {
        match self.last_seen {
            Some(t) => now.saturating_duration_since(t) <= ttl,
            None => now.saturating_duration_since(self.since) <= ttl,
        }
    }

    /// Its last hello is no older than `ttl`.
    pub fn hello_within(&self, now: Instant, ttl: Duration) -> bool {
        self.last_hello
            .is_some_and(|t| now.saturating_duration_since(t) <= ttl)
    }
}

/// A copy of the whole table, cheap to take (the hellos are shared).
pub type PeerSnapshot = Arc<Vec<PeerEntry>>;

/// The peers' latest hellos and liveness.
#[derive(Debug)]
pub struct PeerTable {
    tx: watch::Sender<PeerSnapshot>,
}

impl PeerTable {
    /// One entry per configured peer.
    pub fn new(addrs: &[String]) -> Self {
        let now = Instant::now();
        let entries = addrs
            .iter()
            .cloned()
            .map(|a| PeerEntry::new(a, now))
            .collect();
        PeerTable {
            tx: watch::Sender::new(Arc::new(entries)),
        }
    }

    /// The table as it is now.
    pub fn snapshot(&self) -> PeerSnapshot {
        self.tx.borrow().clone()
    }

    /// A receiver that wakes when a peer's announced config changes.
    pub fn subscribe(&self) -> watch::Receiver<PeerSnapshot> {
        self.tx.subscribe()
    }

    /// Change the entry at `idx` (if any); wake the subscribers when `f`
    /// says it changed what they act on.
    fn modify(&self, idx: Option<usize>, f: impl FnOnce(&mut PeerEntry) -> bool) -> bool {
        let mut found = false;
        self.tx.send_if_modified(|t| {
            let Some(i) = idx.filter(|i| *i < t.len()) else {
                return false;
            };
            found = true;
            f(&mut Arc::make_mut(t)[i])
        });
        found
    }

    /// Record a hello: matched by address, else by id. Returns false for a
    /// sender that is not a configured peer (its hello is then ignored:
    /// membership is static).
    pub fn record_hello(&self, hello: &Hello, now: Instant) -> bool {
        let idx = {
            let t = self.tx.borrow();
            t.iter()
                .position(|e| e.addr == hello.addr)
                .or_else(|| {
                    t.iter()
                        .position(|e| e.id.as_deref() == Some(hello.id.as_str()))
                })
                .or_else(|| {
                    // The run id `SENTINEL MYID` gave (a daemon older than
                    // run ids gave its id there).
                    let r = hello.run_id.as_ref().unwrap_or(&hello.id);
                    t.iter().position(|e| e.run_id.as_ref() == Some(r))
                })
        };
        self.record_hello_at_opt(idx, hello, now)
    }

    /// Record the hello the peer at `idx` sent back in reply to ours: it is
    /// that peer whatever address it announces (behind NAT or a proxy,
    /// configured by another name, listening on 0.0.0.0 without
    /// `announce`).
    pub fn record_hello_at(&self, idx: usize, hello: &Hello, now: Instant) -> bool {
        self.record_hello_at_opt(Some(idx), hello, now)
    }

    fn record_hello_at_opt(&self, idx: Option<usize>, hello: &Hello, now: Instant) -> bool {
        self.modify(idx, |e| {
            let groups: HashMap<String, HelloGroup> = hello
                .groups
                .iter()
                .map(|g| (g.name.clone(), g.clone()))
                .collect();
            let changed = e.id.as_deref() != Some(hello.id.as_str()) || *e.groups != groups;
            e.id = Some(hello.id.clone());
            if hello.run_id.is_some() {
                e.run_id = hello.run_id.clone();
            }
            e.last_seen = Some(now);
            e.last_hello = Some(now);
            e.hello = Some(Arc::new(hello.clone()));
            if changed {
                e.groups = Arc::new(groups);
            }
            metrics::gauge!(m::PEER_UP, "peer" => e.addr.clone()).set(1.0);
            changed
        })
    }

    /// Remember the run id the peer at `idx` gave for itself (`SENTINEL
    /// MYID`), so that its own hellos are recognised when the address it
    /// announces is not the one configured here.
    pub fn set_run_id(&self, idx: usize, run_id: String) {
        self.modify(Some(idx), |e| {
            e.run_id = Some(run_id);
            false
        });
    }

    /// Whether the peer at `idx` is known by an id or run id yet.
    pub fn known(&self, idx: usize) -> bool {
        self.tx
            .borrow()
            .get(idx)
            .is_some_and(|e| e.id.is_some() || e.run_id.is_some())
    }

    /// The id of the peer at `idx`, once known.
    pub fn id_of(&self, idx: usize) -> Option<String> {
        self.tx.borrow().get(idx).and_then(|e| e.id.clone())
    }

    /// Record that the peer at `idx` answered something.
    pub fn mark_seen(&self, idx: usize, now: Instant) {
        self.modify(Some(idx), |e| {
            e.last_seen = Some(e.last_seen.map_or(now, |t| t.max(now)));
            false
        });
    }

    /// Refresh the peer-up gauges. They say what was heard: the start-up
    /// grace of [`PeerEntry::reachable`] is for counting a quorum, and an
    /// operator looking at a fresh daemon must see a peer it never heard
    /// from as down.
    pub fn export_metrics(&self, now: Instant, ttl: Duration) {
        for e in self.tx.borrow().iter() {
            let up = e
                .last_seen
                .is_some_and(|t| now.saturating_duration_since(t) <= ttl);
            metrics::gauge!(m::PEER_UP, "peer" => e.addr.clone()).set(if up { 1.0 } else { 0.0 });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::Addr;

    fn hello(id: &str, addr: &str) -> Hello {
        Hello {
            id: id.into(),
            run_id: None,
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
        let mut c = hello("c", "10.0.0.3:26379");
        c.run_id = Some("9f".repeat(20));
        assert!(!t.record_hello(&c, now));
        // Learnt from SENTINEL MYID, which gives the run id.
        t.set_run_id(1, "9f".repeat(20));
        assert!(t.known(1));
        assert!(t.record_hello(&c, now));
        assert_eq!(t.snapshot()[1].hello.as_deref(), Some(&c));
        // A stranger is still refused.
        assert!(!t.record_hello(&hello("x", "10.0.0.9:26379"), now));
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_not_heard_yet_is_down_only_after_the_same_silence_as_one_that_went_quiet() {
        let t = PeerTable::new(&["10.0.0.2:26379".into(), "10.0.0.3:26379".into()]);
        let ttl = Duration::from_secs(3);
        let start = Instant::now();
        t.record_hello(&hello("b", "10.0.0.2:26379"), start);
        let at = |s: u64| start + Duration::from_secs(s);
        let snap = t.snapshot();
        assert!(snap[0].reachable(at(2), ttl) && snap[1].reachable(at(2), ttl));
        assert!(!snap[0].reachable(at(4), ttl) && !snap[1].reachable(at(4), ttl));
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

    #[test]
    fn subscribers_wake_only_when_a_peer_announces_another_config() {
        let t = PeerTable::new(&["10.0.0.2:26379".into()]);
        let mut rx = t.subscribe();
        rx.mark_unchanged();
        let now = Instant::now();
        let mut h = hello("b", "10.0.0.2:26379");
        h.groups.push(HelloGroup {
            name: "g".into(),
            master: Addr::new("10.0.0.5", 6379),
            config_epoch: 1,
            sdown: false,
            replicas: None,
            failover_epoch: None,
            promoting: None,
            stand_back: None,
            stand_back_leader: None,
        });
        t.record_hello(&h, now);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        // The same hello again, an answer: no wake-up, but recorded.
        t.record_hello(&h, now + Duration::from_secs(1));
        t.mark_seen(0, now + Duration::from_secs(2));
        assert!(!rx.has_changed().unwrap());
        let s = t.snapshot();
        assert_eq!(s[0].last_hello, Some(now + Duration::from_secs(1)));
        assert_eq!(s[0].last_seen, Some(now + Duration::from_secs(2)));
        assert_eq!(s[0].group("g").map(|g| g.config_epoch), Some(1));
        // A newer config wakes.
        h.groups[0].config_epoch = 2;
        t.record_hello(&h, now + Duration::from_secs(3));
        assert!(rx.has_changed().unwrap());
    }
}

//! The simulated network, when the run asks for one ([`NetFaults`]):
//! peer messages (hellos, IS-DOWN questions and their answers) and probe
//! replies are delayed, duplicated and reordered; daemons lose one
//! direction of a link to another daemon (one-way cuts); a daemon's
//! process stalls (SIGSTOP, a VM pause), which its group must notice as a
//! jump of its clock and answer with TILT.
//!
//! Without it (the default, and the tests' fixed seeds) every message
//! arrives in the step it was sent, as before: the schedules and trace
//! hashes of the seeds the tests and the open findings name do not move.
//! Its draws come from an rng of its own, so that the fault schedule of a
//! seed (`Sim::rng`) is the same with and without the network.
//!
//! What is realistic and what is not: a probe talks to its server over one
//! TCP connection, so its replies keep their order (a reply is delayed, and
//! overtaken by other servers' replies and peer messages, never by its own
//! server's next one); a duplicated reply follows its original. Hellos and
//! questions go out on tasks of their own (`hello.rs`, the peer links'
//! retries), so they may overtake one another. A question answered after
//! the peer link's timeout (500 ms, as the daemon sets it) fails there.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;

use super::super::effects::Internal;
use super::super::{GroupMsg, Woken};
use super::Sim;
use crate::addr::Addr;
use crate::context::DaemonCtx;
use crate::probe::ProbeEvent;
use crate::quorum::peers::{Hello, IsDownQuery, IsDownReply};
use crate::resp::RespError;

/// The peer links' command timeout in the daemon (`lib.rs`).
const PEER_TIMEOUT_MS: u64 = 500;

/// What the asker's link reports when the answer does not come in time.
fn timed_out() -> Result<IsDownReply, RespError> {
    Err(RespError::Timeout(Duration::from_millis(PEER_TIMEOUT_MS)))
}

/// Which network faults a run has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetFaults {
    /// The longest one-way delay of a message (ms); each message draws its
    /// own from 0 to this, and arrives at the next 10-ms step after it.
    pub delay_ms: u64,
    /// The chance that a message is delivered twice.
    pub duplicate: f64,
    /// One-way cuts between daemons (one hears the other, not back) come
    /// and go, 0.5 to 3 s each.
    pub one_way_cuts: bool,
    /// Daemons' processes stall for 1.2 to 4 s (the stall threshold is 1 s
    /// with the simulation's `down_after`): TILT.
    pub stalls: bool,
    /// A server's replies to one daemon are lost for 0.5 to 3 s (about
    /// every 6 virtual s) while what the daemon sends still arrives: its
    /// probe hears nothing. Not in [`NetFaults::all`], so that the seeds
    /// recorded before it replay the same schedules (`--server-cuts`).
    pub server_cuts: bool,
}

impl NetFaults {
    /// What `--net` turns on: every fault but `server_cuts`, at the
    /// delays of a loaded network.
    pub fn all() -> NetFaults {
        NetFaults {
            delay_ms: 40,
            duplicate: 0.02,
            one_way_cuts: true,
            stalls: true,
            server_cuts: false,
        }
    }
}

/// A message on its way.
enum Delivery {
    /// A probe's report, to the daemon that probes (the incarnation that
    /// started the probe: a restarted daemon has new probes).
    Probe {
        to: usize,
        ctx: Arc<DaemonCtx>,
        ev: ProbeEvent,
    },
    /// An IS-DOWN question from `from` (its link `peer`) to `to` (the
    /// incarnation it was sent to: a restart breaks the connection).
    Question {
        from: usize,
        ctx: Arc<DaemonCtx>,
        to: usize,
        to_ctx: Arc<DaemonCtx>,
        peer: usize,
        query: IsDownQuery,
        sent: u64,
    },
    /// The answer (or the link's failure) back to the asker.
    Answer {
        to: usize,
        ctx: Arc<DaemonCtx>,
        peer: usize,
        epoch: u64,
        result: Result<IsDownReply, RespError>,
    },
    /// A hello from `from` to `to` (the incarnation it was sent to: a
    /// hello on its way to a process that restarts is lost with the
    /// connection, it does not reach the new process).
    Hello {
        from: usize,
        to: usize,
        ctx: Arc<DaemonCtx>,
        hello: Hello,
    },
}

/// The network's state: what is on its way, and the faults in force.
pub(in crate::group) struct Net {
    faults: Option<NetFaults>,
    rng: StdRng,
    /// By delivery time (virtual ms), then by sending order.
    queue: BTreeMap<(u64, u64), Delivery>,
    seq: u64,
    /// A probe link's last delivery (its replies keep their order).
    link_last: BTreeMap<(usize, Addr), u64>,
    /// `(from, to)`: what `from` sends `to` is lost, until then (ms).
    one_way: BTreeMap<(usize, usize), u64>,
    /// A daemon's process does not run until then (ms).
    pub(super) stalled_until: BTreeMap<usize, u64>,
    /// `(daemon, server)`: the server's replies to the daemon are lost,
    /// until then (ms).
    server_lost: BTreeMap<(usize, Addr), u64>,
    /// No new faults (the schedule's end: healing and settling).
    calm: bool,
}

impl Net {
    /// No network: every message arrives at once (the tests).
    pub(super) fn off() -> Net {
        Net::new(None, 0)
    }

    /// The network of a run; its draws are seeded by `seed`.
    pub(super) fn new(faults: Option<NetFaults>, seed: u64) -> Net {
        Net {
            faults,
            rng: StdRng::seed_from_u64(seed ^ 0x6e65_7477_6f72_6b00),
            queue: BTreeMap::new(),
            seq: 0,
            link_last: BTreeMap::new(),
            one_way: BTreeMap::new(),
            stalled_until: BTreeMap::new(),
            server_lost: BTreeMap::new(),
            calm: false,
        }
    }

    /// Whether messages go through the network (else they arrive at once).
    pub(super) fn on(&self) -> bool {
        self.faults.is_some()
    }

    /// Whether daemon `i`'s process is stalled at `ms`.
    pub(super) fn stalled(&self, i: usize, ms: u64) -> bool {
        self.stalled_until.get(&i).is_some_and(|u| ms < *u)
    }

    /// No new fault from now on, and the one-way cuts and stalls end.
    pub(super) fn calm(&mut self) {
        self.calm = true;
        self.one_way.clear();
        self.stalled_until.clear();
        self.server_lost.clear();
    }

    fn lost(&self, from: usize, to: usize, ms: u64) -> bool {
        self.one_way.get(&(from, to)).is_some_and(|u| ms < *u)
    }

    /// Whether daemons `i` and `j` hear each other at `ms` (neither
    /// direction lost, neither process stalled).
    pub(super) fn both_ways(&self, i: usize, j: usize, ms: u64) -> bool {
        !self.lost(i, j, ms) && !self.lost(j, i, ms) && !self.stalled(i, ms) && !self.stalled(j, ms)
    }

    /// Whether server `a`'s replies reach daemon `i` at `ms`.
    pub(super) fn hears_server(&self, i: usize, a: &Addr, ms: u64) -> bool {
        self.server_lost
            .get(&(i, a.clone()))
            .is_none_or(|u| ms >= *u)
    }

    /// The delivery step of a message sent at `ms`.
    fn arrival(&mut self, ms: u64) -> u64 {
        let max = self.faults.map_or(0, |f| f.delay_ms);
        let d = self.rng.random_range(0..=max);
        // The next 10-ms step at or after `ms + d`, never `ms` itself.
        ((ms + d) / 10 + 1) * 10
    }

    fn duplicate(&mut self) -> bool {
        let p = self.faults.map_or(0.0, |f| f.duplicate);
        p > 0.0 && self.rng.random_bool(p)
    }

    fn push(&mut self, at: u64, d: Delivery) {
        self.seq += 1;
        self.queue.insert((at, self.seq), d);
    }
}

impl Sim {
    /// A probe's report to daemon `i`, through the network.
    pub(super) fn send_probe(&mut self, i: usize, ev: ProbeEvent) {
        let addr = match &ev {
            ProbeEvent::Ping { addr, .. }
            | ProbeEvent::Info { addr, .. }
            | ProbeEvent::SyncHeld { addr, .. }
            | ProbeEvent::Unreachable { addr, .. } => addr.clone(),
        };
        let ms = self.ms;
        if self
            .net
            .server_lost
            .get(&(i, addr.clone()))
            .is_some_and(|u| ms < *u)
        {
            return;
        }
        let ctx = self.daemons[i].ctx.clone();
        let last = self.net.link_last.get(&(i, addr.clone())).copied();
        let at = self.net.arrival(self.ms).max(last.unwrap_or(0));
        self.net.link_last.insert((i, addr), at);
        if self.net.duplicate() {
            let (to, ctx, ev) = (i, ctx.clone(), ev.clone());
            self.net.push(at, Delivery::Probe { to, ctx, ev });
        }
        self.net.push(at, Delivery::Probe { to: i, ctx, ev });
    }

    /// Daemon `i`'s question on its link `peer`, through the network.
    pub(super) fn send_question(&mut self, i: usize, peer: usize, query: IsDownQuery) {
        let to = Sim::peer_of(i, peer);
        let copies = if self.net.duplicate() { 2 } else { 1 };
        for _ in 0..copies {
            let at = self.net.arrival(self.ms);
            let d = Delivery::Question {
                from: i,
                ctx: self.daemons[i].ctx.clone(),
                to,
                to_ctx: self.daemons[to].ctx.clone(),
                peer,
                query: query.clone(),
                sent: self.ms,
            };
            self.net.push(at, d);
        }
    }

    /// Daemon `i`'s hello to daemon `j`, through the network.
    pub(super) fn send_hello(&mut self, i: usize, j: usize, hello: &Hello) {
        if self.net.lost(i, j, self.ms) || self.net.stalled(i, self.ms) {
            return;
        }
        let copies = if self.net.duplicate() { 2 } else { 1 };
        for _ in 0..copies {
            let at = self.net.arrival(self.ms);
            let d = Delivery::Hello {
                from: i,
                to: j,
                ctx: self.daemons[j].ctx.clone(),
                hello: hello.clone(),
            };
            self.net.push(at, d);
        }
    }

    /// Put `query` to daemon `to` through its own answer path (a vote is
    /// persisted before the reply goes), and check the vote it reports
    /// (invariant 1).
    pub(super) async fn ask(
        &mut self,
        to: usize,
        query: IsDownQuery,
    ) -> Result<IsDownReply, RespError> {
        let epoch = query.epoch;
        let (tx, mut rx) = oneshot::channel();
        let msg = GroupMsg::IsDown { query, reply: tx };
        Box::pin(self.wake(to, Woken::Msg(Box::new(msg)))).await;
        let result = match rx.try_recv() {
            Ok(Ok(r)) => Ok(r),
            _ => Err(RespError::Closed),
        };
        if let Ok(r) = &result
            && r.leader_epoch == epoch
            && let Some(leader) = &r.leader
        {
            self.check_vote(to, epoch, leader);
        }
        result
    }

    /// Deliver what is due by now, in order, then let the network's own
    /// faults come and go (one draw per step).
    pub(super) async fn deliver_due(&mut self) {
        if !self.net.on() {
            return;
        }
        self.net_faults();
        while let Some(entry) = self.net.queue.first_entry() {
            if entry.key().0 > self.ms {
                break;
            }
            let d = entry.remove();
            self.deliver(d).await;
        }
    }

    async fn deliver(&mut self, d: Delivery) {
        let at = self.now();
        match d {
            Delivery::Probe { to, ctx, mut ev } => {
                if !Arc::ptr_eq(&ctx, &self.daemons[to].ctx) {
                    return;
                }
                match &mut ev {
                    ProbeEvent::Ping { at: t, .. }
                    | ProbeEvent::Info { at: t, .. }
                    | ProbeEvent::SyncHeld { at: t, .. }
                    | ProbeEvent::Unreachable { at: t, .. } => *t = at,
                }
                self.wake(to, Woken::Probe(Box::new(ev))).await;
            }
            Delivery::Question {
                from,
                ctx,
                to,
                to_ctx,
                peer,
                query,
                sent,
            } => {
                let epoch = query.epoch;
                let deadline = sent + PEER_TIMEOUT_MS;
                // A daemon that is down refuses the connection at once (one
                // that restarted meanwhile broke it); a stalled one, or a link that loses the question, leaves
                // the asker waiting for its timeout.
                let restarted = !Arc::ptr_eq(&to_ctx, &self.daemons[to].ctx);
                let (result, when) = if !self.daemons[to].up || restarted {
                    (Err(RespError::Closed), self.net.arrival(self.ms))
                } else if self.net.stalled(to, self.ms)
                    || self.cut(from, to)
                    || self.net.lost(from, to, self.ms)
                    || self.ms >= deadline
                {
                    (timed_out(), deadline)
                } else {
                    let result = self.ask(to, query).await;
                    // Back to the asker, or its link's timeout.
                    let back = self.net.arrival(self.ms);
                    match result {
                        Ok(_) if back >= deadline || self.net.lost(to, from, self.ms) => {
                            (timed_out(), deadline)
                        }
                        r => (r, back),
                    }
                };
                let when = when.max(self.ms + 10);
                if let Ok(r) = &result
                    && self.net.duplicate()
                {
                    let dup = Delivery::Answer {
                        to: from,
                        ctx: ctx.clone(),
                        peer,
                        epoch,
                        result: Ok(r.clone()),
                    };
                    self.net.push(when, dup);
                }
                let d = Delivery::Answer {
                    to: from,
                    ctx,
                    peer,
                    epoch,
                    result,
                };
                self.net.push(when, d);
            }
            Delivery::Answer {
                to,
                ctx,
                peer,
                epoch,
                result,
            } => {
                if !Arc::ptr_eq(&ctx, &self.daemons[to].ctx) {
                    return;
                }
                let answer = Internal::Answer {
                    peer,
                    epoch,
                    at,
                    result,
                };
                self.wake(to, Woken::Internal(Box::new(answer))).await;
            }
            Delivery::Hello {
                from,
                to,
                ctx,
                hello,
            } => {
                if !Arc::ptr_eq(&ctx, &self.daemons[to].ctx)
                    || !self.daemons[to].up
                    || self.net.stalled(to, self.ms)
                    || self.cut(from, to)
                {
                    return;
                }
                let table = &self.daemons[to].ctx.peer_table;
                table.record_hello_at(Sim::link_of(to, from), &hello, at);
                table.mark_seen(Sim::link_of(to, from), at);
                self.wake(to, Woken::Peers).await;
            }
        }
    }

    /// One draw per step: a one-way cut between two daemons (about every
    /// 3 virtual s, 0.5 to 3 s long), a daemon's process stalled (about
    /// every 6 virtual s, 1.2 to 4 s long), or a server's replies to a
    /// daemon lost (about every 6 virtual s, 0.5 to 3 s long).
    fn net_faults(&mut self) {
        let Some(f) = self.net.faults else {
            return;
        };
        let n = self.daemons.len();
        if self.net.calm || n < 2 {
            return;
        }
        let r = self.net.rng.random_range(0..600u32);
        if f.one_way_cuts && r < 2 {
            let from = self.net.rng.random_range(0..n);
            let to = (from + self.net.rng.random_range(1..n)) % n;
            let until = self.ms + self.net.rng.random_range(500..3000);
            self.net.one_way.insert((from, to), until);
            self.note(
                n,
                format!("fault: {from} not heard by {to} until {until} ms"),
            );
        } else if f.stalls && r == 2 {
            let i = self.net.rng.random_range(0..n);
            let until = self.ms + self.net.rng.random_range(1200..4000);
            if !self.net.stalled(i, self.ms) {
                self.net.stalled_until.insert(i, until);
                self.note(n, format!("fault: daemon {i} stalled until {until} ms"));
            }
        } else if f.server_cuts && r == 3 {
            let i = self.net.rng.random_range(0..n);
            let k = self.net.rng.random_range(0..self.servers.0.len());
            let a = self.servers.0[k].addr.clone();
            let until = self.ms + self.net.rng.random_range(500..3000);
            self.note(
                n,
                format!("fault: {a}'s replies to {i} lost until {until} ms"),
            );
            self.net.server_lost.insert((i, a), until);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three daemons, two seconds into a healthy group, with the network
    /// on but no fault of its own: the test sets the one it is about.
    async fn healthy() -> Sim {
        let mut sim = Sim::new(3, 2, 1);
        let quiet = NetFaults {
            delay_ms: 0,
            duplicate: 0.0,
            one_way_cuts: false,
            stalls: false,
            server_cuts: false,
        };
        sim.net = Net::new(Some(quiet), 1);
        sim.run_for(2_000).await;
        sim
    }

    /// A process that does not run for 2 s notices it at its next wake and
    /// goes into TILT; the daemons that ran do not.
    #[tokio::test]
    async fn a_stalled_daemon_notices_the_jump_of_its_clock_and_goes_into_tilt() {
        let mut sim = healthy().await;
        assert!(sim.daemons[0].ctx.tilt.since().is_none());
        sim.net.stalled_until.insert(0, sim.ms + 2_000);
        sim.run_for(1_900).await;
        assert!(
            sim.daemons[0].ctx.tilt.since().is_none(),
            "stalled: nothing ran"
        );
        sim.run_for(200).await;
        assert!(
            sim.daemons[0].ctx.tilt.active(sim.now()),
            "TILT once the stalled process runs again"
        );
        for d in &sim.daemons[1..] {
            assert!(d.ctx.tilt.since().is_none(), "{}", d.ctx.id);
        }
        assert!(sim.violations.is_empty(), "{:#?}", sim.violations);
    }

    /// A daemon that loses the master's replies (its commands would still
    /// arrive) sees the master down on its own, and the others, who hear
    /// it, keep it: nothing fails over.
    #[tokio::test]
    async fn a_daemon_that_loses_the_masters_replies_sees_it_down_alone() {
        let mut sim = healthy().await;
        let master = crate::addr::Addr {
            host: "127.0.0.1".into(),
            port: 7000,
        };
        let down = |sim: &Sim, i: usize| {
            sim.daemons[i]
                .g
                .instances
                .get(&master)
                .is_some_and(|x| x.sdown.is_down())
        };
        sim.net
            .server_lost
            .insert((0, master.clone()), sim.ms + 3_000);
        sim.run_for(2_500).await;
        assert!(down(&sim, 0), "silent for 2.5 s: down for daemon 0");
        assert!(!down(&sim, 1) && !down(&sim, 2));
        assert!(
            !sim.trace.iter().any(|(_, _, w)| w.starts_with("promote")),
            "{:#?}",
            sim.trace
        );
        assert!(sim.violations.is_empty(), "{:#?}", sim.violations);
    }

    /// A replica is re-pointed only on an INFO read since it was first
    /// seen following another master: a daemon that loses its replies
    /// holds an INFO that may be from before a newer failover re-pointed
    /// or promoted it (the simulation with every fault, seed 9867: a
    /// daemon back from a stall re-pointed the master published meanwhile
    /// to the dead old one, on an INFO 1.4 s old).
    #[tokio::test]
    async fn a_replica_is_re_pointed_only_on_an_info_read_since_it_looked_wrong() {
        let mut sim = healthy().await;
        let (m, r) = (super::super::addr(7000), super::super::addr(7002));
        let follows = |sim: &Sim, port: u16| {
            sim.daemons[0]
                .g
                .instances
                .get(&r)
                .and_then(|i| i.info.as_ref())
                .is_some_and(|x| x.master_port == Some(port))
        };
        // 7002 follows 7001 for a moment, long enough for daemon 0 to
        // read it so.
        sim.servers.get_mut(&r).master = Some(super::super::addr(7001));
        for _ in 0..300 {
            if follows(&sim, 7001) {
                break;
            }
            sim.run_for(10).await;
        }
        assert!(follows(&sim, 7001), "{:#?}", sim.trace);
        // Then its replies to daemon 0 are lost, and it follows the
        // master again.
        sim.net.server_lost.insert((0, r.clone()), sim.ms + 3_000);
        sim.servers.get_mut(&r).master = Some(m.clone());
        let from = sim.trace.len();
        sim.run_for(4_000).await;
        assert!(follows(&sim, 7000), "read again once its replies came back");
        assert!(
            !sim.trace[from..]
                .iter()
                .any(|(_, _, w)| w.starts_with("repoint 127.0.0.1:7002")),
            "re-pointed on the INFO held: {:#?}",
            &sim.trace[from..]
        );
        assert!(sim.violations.is_empty(), "{:#?}", sim.violations);
    }

    /// A daemon back with an old config demotes no stray master for
    /// `PROMOTED_GRACE` after its start: the majority that confirms its
    /// config may be as stale as itself, and the peer that holds the
    /// newer one speaks within a hello period (the simulation with every
    /// fault, seed 11353: back 160 ms, it demoted the master the newer
    /// failover had published, on the hello of a peer of the old epoch).
    #[tokio::test]
    async fn a_daemon_back_with_an_old_config_waits_for_the_peers_before_demoting() {
        use super::super::addr;
        let mut sim = healthy().await;
        // Daemon 0 led a failover to 7001 at epoch 2 and went down at
        // once: the others never heard of it, and 7000 is still a master.
        sim.crash(0);
        sim.crash(2);
        let state = sim.daemons[0].ctx.state.clone();
        state.observe_epoch(2).await.expect("the state file");
        state
            .set_config("g", 2, &addr(7001), vec![addr(7000), addr(7002)])
            .await
            .expect("the state file");
        let ms = sim.ms;
        sim.servers.get_mut(&addr(7001)).promote(ms);
        sim.servers.get_mut(&addr(7002)).master = Some(addr(7001));
        sim.run_for(500).await;
        // Back together; daemon 0 is heard by the others only 1 s later.
        sim.restart(0);
        sim.restart(2);
        for j in [1, 2] {
            sim.net.one_way.insert((0, j), sim.ms + 1_000);
        }
        let from = sim.trace.len();
        sim.run_for(6_000).await;
        assert!(
            !sim.trace[from..]
                .iter()
                .any(|(_, _, w)| w.starts_with("demote 127.0.0.1:7001")),
            "the newer master demoted: {:#?}",
            &sim.trace[from..]
        );
        for d in &sim.daemons {
            assert_eq!(d.g.master, addr(7001), "{:#?}", &sim.trace[from..]);
        }
        assert!(sim.violations.is_empty(), "{:#?}", sim.violations);
    }
}

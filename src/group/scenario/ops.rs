//! What the servers answer beyond life and death, where the group's
//! decisions depend on it: a planned switchover (`FAILOVER TO`, as Redis
//! and Valkey run it), a script that keeps a server busy (`-BUSY`, `SCRIPT
//! KILL`) and a server loading its data after a restart (`-LOADING`).
//! With `ops` on (`picket-sim --ops`), the schedule asks for switchovers
//! and lets scripts run and restarts load beside its other faults, from an
//! rng of its own: a seed's other faults are the same with and without it.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::oneshot;

use super::{Sim, Woken};
use crate::addr::Addr;
use crate::context::DaemonCtx;
use crate::failover::machine::PromoteError;
use crate::failover::ops::ScriptKill;
use crate::group::GroupMsg;
use crate::group::effects::Internal;
use crate::resp::RespError;

/// A `FAILOVER TO` under way on a master: its writes are paused until the
/// candidate has copied all of them, then it turns replica of the
/// candidate, which turns master; at its timeout it serves again.
pub(super) struct Switching {
    daemon: usize,
    /// The daemon that asked, in this life (one restarted since has
    /// forgotten its failover: the result is not fed to it).
    ctx: Arc<DaemonCtx>,
    epoch: u64,
    old: Addr,
    candidate: Addr,
    /// The command's own timeout (virtual ms).
    deadline: u64,
    handed_over: bool,
    /// Dragonfly's `REPLTAKEOVER`: the old master exits once it handed
    /// over, and the command fails at its own timeout.
    takeover: bool,
}

impl Sim {
    /// Daemon `i`'s `FAILOVER TO candidate` on `old` in `epoch`: refused at
    /// once as Redis refuses it, or under way (the result comes from
    /// [`Sim::step_switchovers`]).
    pub(super) fn failover_to(
        &mut self,
        i: usize,
        epoch: u64,
        old: Addr,
        candidate: Addr,
        timeout: Duration,
    ) -> Option<Internal> {
        let refused = |m: String| {
            Some(Internal::SwitchedOver(
                epoch,
                Err(PromoteError::from_failover_refusal(m)),
            ))
        };
        if !self.reaches(i, &old) {
            return refused(format!("{old}: unreachable"));
        }
        let Some(o) = self.servers.get(&old) else {
            return refused(format!("{old}: unknown"));
        };
        if o.master.is_some() {
            return refused("ERR FAILOVER is not valid when server is a replica".into());
        }
        if o.failing_over_to.is_some() {
            return refused("ERR FAILOVER already in progress".into());
        }
        let Some(c) = self
            .servers
            .get(&candidate)
            .filter(|c| c.alive && c.master.as_ref() == Some(&old))
        else {
            return refused(format!("ERR FAILOVER target {candidate} is not a replica"));
        };
        // Redis asks for a replica online: one that reconnected for a copy
        // (another history) is not yet.
        if c.replid != o.replid || !c.serving(self.ms) {
            return refused("ERR FAILOVER target replica is not online".into());
        }
        let deadline = self.ms + timeout.as_millis().max(100) as u64;
        self.start_switching(i, epoch, old, candidate, deadline, false);
        None
    }

    /// `old` hands over to `candidate` once it has caught up, or serves
    /// again at `deadline`; daemon `i` learns which in `epoch`.
    fn start_switching(
        &mut self,
        i: usize,
        epoch: u64,
        old: Addr,
        candidate: Addr,
        deadline: u64,
        takeover: bool,
    ) {
        self.servers.get_mut(&old).failing_over_to = Some(candidate.clone());
        self.switching.push(Switching {
            daemon: i,
            ctx: self.daemons[i].ctx.clone(),
            epoch,
            old,
            candidate,
            deadline,
            handed_over: false,
            takeover,
        });
    }

    /// Daemon `i`'s `REPLTAKEOVER secs` on Dragonfly replica `candidate`
    /// in `epoch`: at once when it is a master already (the command is
    /// idempotent) or refused as Dragonfly refuses it; otherwise its
    /// master locks down and the result comes from
    /// [`Sim::step_switchovers`].
    pub(super) fn repl_takeover(
        &mut self,
        i: usize,
        epoch: u64,
        candidate: Addr,
        timeout: Duration,
    ) -> Option<Internal> {
        let failed = |m: String| {
            Some(Internal::SwitchedOver(
                epoch,
                Err(PromoteError::SwitchoverTimedOut(format!(
                    "REPLTAKEOVER on {candidate}: Couldn't execute takeover: {m}"
                ))),
            ))
        };
        if !self.reaches(i, &candidate) {
            return Some(Internal::SwitchedOver(
                epoch,
                Err(PromoteError::Promotion(format!("{candidate}: unreachable"))),
            ));
        }
        let Some(c) = self.servers.get(&candidate) else {
            return failed("unknown".into());
        };
        let Some(old) = c.master.clone() else {
            self.promoted.insert((i, epoch));
            return Some(Internal::SwitchedOver(epoch, Ok(())));
        };
        if !self.servers.linked(c) || c.stopping_at.is_some() {
            return failed("the replica is not in stable sync".into());
        }
        if self.failing_over(&old) {
            return failed("a takeover is under way".into());
        }
        let deadline = self.ms + timeout.as_secs().max(1) * 1000;
        self.start_switching(i, epoch, old, candidate, deadline, true);
        None
    }

    /// Every 10 virtual ms: a dead server forgets its script, its loading
    /// and its `FAILOVER`; a switchover whose candidate has caught up hands
    /// over; the daemon that asked learns the outcome as its executor
    /// does (the candidate read as a master, or nothing by the timeout
    /// and one second).
    pub(super) async fn step_switchovers(&mut self) {
        for s in self.servers.0.iter_mut().filter(|s| !s.alive) {
            s.failing_over_to = None;
            s.busy_until = 0;
            s.script_wrote = false;
            s.loading_until = 0;
        }
        let ms = self.ms;
        let mut done = Vec::new();
        for (k, sw) in self.switching.iter_mut().enumerate() {
            let old = self.servers.get(&sw.old).cloned();
            let ready = old.as_ref().is_some_and(|o| {
                o.alive
                    && o.failing_over_to.as_ref() == Some(&sw.candidate)
                    && self.servers.get(&sw.candidate).is_some_and(|c| {
                        c.serving(ms)
                            && c.sync_due.is_none()
                            && c.master.as_ref() == Some(&sw.old)
                            && c.replid == o.replid
                            && c.offset >= o.offset
                    })
            });
            if !sw.handed_over && ready {
                self.servers.get_mut(&sw.candidate).promote(ms);
                let o = self.servers.get_mut(&sw.old);
                if sw.takeover {
                    // "Takeover accepted, shutting down."; its supervisor
                    // (a pod's restart, systemd) starts it again, empty.
                    o.alive = false;
                    o.restart_at = Some(ms + 1_000);
                } else {
                    o.master = Some(sw.candidate.clone());
                }
                o.failing_over_to = None;
                sw.handed_over = true;
            } else if !sw.handed_over && ms >= sw.deadline {
                let o = self.servers.get_mut(&sw.old);
                if o.failing_over_to.as_ref() == Some(&sw.candidate) {
                    o.failing_over_to = None;
                }
            }
            let reads_master = !self.cut_server.contains(&(sw.daemon, sw.candidate.clone()))
                && self
                    .servers
                    .get(&sw.candidate)
                    .is_some_and(|c| c.serving(ms) && c.master.is_none());
            if sw.handed_over && reads_master {
                done.push((k, Ok(())));
            } else if ms >= sw.deadline + if sw.takeover { 0 } else { 1_000 } {
                done.push((
                    k,
                    Err(PromoteError::SwitchoverTimedOut(format!(
                        "{} did not take over from {}",
                        sw.candidate, sw.old
                    ))),
                ));
            }
        }
        for (k, r) in done.into_iter().rev() {
            let sw = self.switching.remove(k);
            let n = self.daemons.len();
            self.note(
                n,
                format!(
                    "{} {} to {}",
                    sw.old,
                    if sw.handed_over {
                        "handed over"
                    } else {
                        "kept (switchover timed out)"
                    },
                    sw.candidate
                ),
            );
            if r.is_ok() && self.same_life(sw.daemon, &sw.ctx) {
                self.promoted.insert((sw.daemon, sw.epoch));
            }
            let result = Internal::SwitchedOver(sw.epoch, r);
            self.feed_back(sw.daemon, &sw.ctx, result).await;
        }
    }

    /// `SCRIPT KILL` from daemon `i` on `a`.
    pub(super) fn script_kill(&mut self, i: usize, a: &Addr) -> Result<ScriptKill, RespError> {
        let ms = self.ms;
        if self.cut_server.contains(&(i, a.clone())) {
            return Err(RespError::Closed);
        }
        let s = self.servers.get_mut(a);
        if !s.alive || ms < s.loading_until {
            return Err(RespError::Closed);
        }
        if ms >= s.busy_until {
            return Ok(ScriptKill::NotBusy);
        }
        if s.script_wrote {
            return Ok(ScriptKill::Unkillable);
        }
        s.busy_until = 0;
        Ok(ScriptKill::Killed)
    }

    /// Invariant 20: the server the backend routes clients to at its
    /// newest epoch, a live master, is never made a replica (demoted or
    /// re-pointed) by a daemon that hears the daemon that published it
    /// (both ways, up, running): the writes it acknowledged since would be
    /// lost with its copy of another server. A failover first fences it
    /// out of the backend. A daemon cut off from that one longer than the
    /// grace a stray master gets does demote it, as Sentinel does: it
    /// cannot know.
    pub(super) fn check_routed_kept(&mut self, i: usize, a: &Addr, what: &str) {
        if self.hears(i, self.routed_by)
            && self.routing.1.as_ref() == Some(a)
            && self
                .servers
                .get(a)
                .is_some_and(|s| s.alive && s.master.is_none())
        {
            self.violations.push(format!(
                "{} ms: daemon {i} {what} {a}, the master clients are routed to at epoch {}: \
                 the writes it acknowledged are lost",
                self.ms, self.routing.0
            ));
        }
    }

    /// `a` back with its data (a new run id, the same history and offset,
    /// as after a clean `SHUTDOWN` with persistence), loading it for
    /// `loading` ms.
    fn restart_loading(&mut self, a: &Addr, loading: u64) {
        let ms = self.ms;
        let s = self.servers.get_mut(a);
        s.back_with_data(ms);
        s.run_id = format!("{ms:040}");
        s.loading_until = ms + loading;
    }

    /// `SENTINEL FAILOVER` asked of daemon `i`, its answer not awaited.
    pub(super) async fn switchover_asked(&mut self, i: usize) {
        let n = self.daemons.len();
        self.note(n, format!("fault: switchover asked of daemon {i}"));
        let (reply, _) = oneshot::channel();
        let msg = GroupMsg::Switchover { to: None, reply };
        self.wake(i, Woken::Msg(Box::new(msg))).await;
    }

    /// One of the operations' faults, when the schedule has them: a
    /// switchover asked of a daemon, a script on its master (one that
    /// wrote, a third of the time: `SCRIPT KILL` cannot end it), or its
    /// master killed and restarted with its data, loading it for a while.
    pub(super) async fn ops_fault(&mut self) {
        let n = self.daemons.len();
        let up: Vec<usize> = (0..n).filter(|&i| self.daemons[i].up).collect();
        if up.is_empty() {
            return;
        }
        let i = up[self.ops_rng.random_range(0..up.len())];
        let m = self.daemons[i].g.master.clone();
        // A planned schedule has no server fault: only switchovers.
        let kind = if self.planned {
            0
        } else {
            self.ops_rng.random_range(0..3u32)
        };
        match kind {
            0 => self.switchover_asked(i).await,
            1 => {
                let ms = self.ms;
                let busy = self.ops_rng.random_range(500..6_000);
                let wrote = self.ops_rng.random_bool(0.3);
                if let Some(s) = self.servers.0.iter_mut().find(|s| s.addr == m)
                    && s.serving(ms)
                {
                    s.busy_until = ms + busy;
                    s.script_wrote = wrote;
                    self.note(
                        n,
                        format!("fault: a script on {m} for {busy} ms, wrote={wrote}"),
                    );
                }
            }
            _ => {
                let down = self.ops_rng.random_range(20..150);
                let loading = self.ops_rng.random_range(300..3_000);
                if self.servers.get(&m).is_some_and(|s| s.alive) {
                    self.servers.get_mut(&m).alive = false;
                    self.run_for(down).await;
                    self.restart_loading(&m, loading);
                    self.note(
                        n,
                        format!(
                            "fault: restart {m} with its data after {down} ms, loading for {loading} ms"
                        ),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Sim, addr};
    use super::*;

    /// `SENTINEL FAILOVER` asked of daemon `i`; its answer.
    async fn ask_switchover(
        sim: &mut Sim,
        i: usize,
    ) -> oneshot::Receiver<Result<(), crate::failover::FailoverError>> {
        let (reply, rx) = oneshot::channel();
        let msg = GroupMsg::Switchover { to: None, reply };
        sim.wake(i, Woken::Msg(Box::new(msg))).await;
        rx
    }

    /// Run until a daemon has sent its switchover's `FAILOVER` (at most
    /// 3 virtual s).
    async fn until_switchover_sent(sim: &mut Sim) {
        for _ in 0..300 {
            if sim
                .trace
                .iter()
                .any(|(_, _, w)| w.starts_with("switchover "))
            {
                return;
            }
            sim.run_for(10).await;
        }
        panic!("no FAILOVER within 3 s: {:#?}", sim.trace);
    }

    /// Since trace entry `from`, nobody published the old master 7000 (a
    /// replica once handed over), and the group settled on 7001, routed.
    fn assert_settled_on_7001_without_routing_7000(sim: &Sim, from: usize) {
        let routed_old: Vec<_> = sim.trace[from..]
            .iter()
            .filter(|(_, _, w)| w.starts_with("publish 127.0.0.1:7000"))
            .collect();
        assert!(
            routed_old.is_empty(),
            "the old master, a replica, was published: {routed_old:?} {:#?}",
            sim.trace
        );
        let new = addr(7001);
        for d in &sim.daemons {
            assert_eq!(d.g.master, new, "{}: {:#?}", d.ctx.id, sim.trace);
        }
        assert_eq!(sim.routing.1, Some(new), "{:#?}", sim.trace);
        sim.assert_no_violation();
    }

    #[tokio::test]
    async fn a_planned_switchover_hands_over_first_and_publishes_after() {
        let mut sim = Sim::new(3, 2, 5);
        sim.run_for(3_000).await;
        let mut answer = ask_switchover(&mut sim, 0).await;
        sim.run_for(3_000).await;
        assert!(
            matches!(answer.try_recv(), Ok(Ok(()))),
            "the election was won: {:#?}",
            sim.trace
        );
        let new = addr(7001);
        for d in &sim.daemons {
            assert_eq!(d.g.master, new, "{}: {:#?}", d.ctx.id, sim.trace);
        }
        let switch = sim.at("switchover 127.0.0.1:7000 to 127.0.0.1:7001");
        let handed = sim.at("127.0.0.1:7000 handed over to 127.0.0.1:7001");
        let publish = sim.at("publish 127.0.0.1:7001");
        assert!(
            sim.at("fence") < switch && switch < handed && handed < publish,
            "{:#?}",
            sim.trace
        );
        // The old master was paused, not lost: it follows the new one with
        // everything it took, as the other replica does.
        sim.assert_followed(7001, &[7000, 7002]);
        let (old, now) = (
            sim.servers.get(&addr(7000)).map(|s| s.offset),
            sim.servers.get(&new).map(|s| s.offset),
        );
        assert!(old <= now, "{old:?} <= {now:?}");
        assert_eq!(sim.routing, (1, Some(new)));
        sim.assert_no_violation();
    }

    /// A switchover hands over only to a replica of the master: the
    /// replica with the best priority follows another server (a master
    /// gone since), so `FAILOVER TO` it could only be refused until its
    /// timeout, and meanwhile nothing would re-point it (the simulation
    /// with every fault, seed 20198: the server it followed came back
    /// empty and it copied it).
    #[tokio::test]
    async fn a_switchover_hands_over_only_to_a_replica_of_the_master() {
        let mut sim = Sim::new(3, 2, 5);
        sim.run_for(3_000).await;
        // Read so by every daemon, and asked before a daemon re-points it
        // (500 ms after it first looked wrong).
        sim.servers.get_mut(&addr(7001)).master = Some(addr(7009));
        sim.run_for(200).await;
        let mut answer = ask_switchover(&mut sim, 0).await;
        sim.run_for(3_000).await;
        assert!(matches!(answer.try_recv(), Ok(Ok(()))), "{:#?}", sim.trace);
        sim.at("switchover 127.0.0.1:7000 to 127.0.0.1:7002");
        assert!(
            !sim.trace
                .iter()
                .any(|(_, _, w)| w.contains("to 127.0.0.1:7001")),
            "{:#?}",
            sim.trace
        );
        for d in &sim.daemons {
            assert_eq!(d.g.master, addr(7002), "{}: {:#?}", d.ctx.id, sim.trace);
        }
        sim.assert_no_violation();
    }

    #[tokio::test]
    async fn a_switchover_whose_candidate_never_catches_up_leaves_the_old_master_routed() {
        let mut sim = Sim::new(3, 2, 6);
        sim.run_for(3_000).await;
        // The candidate's link copies nothing more (a link so slow that it
        // never catches up), and the master has taken writes it has not
        // copied: FAILOVER waits for it, and its timeout ends it.
        sim.servers.get_mut(&addr(7001)).lag_ms = 600_000;
        sim.servers.get_mut(&addr(7000)).offset += 50;
        let _answer = ask_switchover(&mut sim, 0).await;
        sim.run_for(16_000).await;
        sim.at("127.0.0.1:7000 kept (switchover timed out)");
        assert!(
            !sim.trace.iter().any(|(_, _, w)| w.contains("handed over")),
            "{:#?}",
            sim.trace
        );
        let old = addr(7000);
        for d in &sim.daemons {
            assert_eq!(d.g.master, old, "{}: {:#?}", d.ctx.id, sim.trace);
        }
        assert!(sim.servers.get(&old).is_some_and(|s| s.master.is_none()));
        assert_eq!(
            sim.routing.1,
            Some(old),
            "routed again after the abort: {:#?}",
            sim.trace
        );
        sim.assert_no_violation();
    }

    /// A switchover asked of a daemon that voted for another daemon's
    /// failover, still under way, is refused (Sentinel's `-INPROG`):
    /// started in a newer epoch, it was published, and the first leader,
    /// cut off from everything while it retried its promotion, came back,
    /// promoted its candidate and re-pointed the switchover's new master
    /// to it, losing the writes that master had acknowledged (the
    /// simulation with switchovers, seed 242).
    #[tokio::test]
    async fn a_switchover_is_refused_while_another_daemons_failover_may_still_promote() {
        let mut sim = Sim::new(3, 2, 6);
        sim.run_for(3_000).await;
        // Daemon 2's switchover waits for a candidate that does not catch
        // up: its failover runs on.
        sim.servers.get_mut(&addr(7001)).lag_ms = 600_000;
        sim.servers.get_mut(&addr(7000)).offset += 50;
        let _first = ask_switchover(&mut sim, 2).await;
        sim.run_for(500).await;
        sim.at("switchover 127.0.0.1:7000 to 127.0.0.1:7001 at 1");
        let mut second = ask_switchover(&mut sim, 0).await;
        sim.run_for(500).await;
        assert!(
            matches!(
                second.try_recv(),
                Ok(Err(crate::failover::FailoverError::AnotherLeader))
            ),
            "{:#?}",
            sim.trace
        );
        assert!(
            !sim.trace
                .iter()
                .any(|(_, d, w)| *d == 0 && w == "start election"),
            "{:#?}",
            sim.trace
        );
        sim.assert_no_violation();
    }

    /// A switchover of a master that reports `role:slave` (handed over or
    /// demoted already) is refused at once: no `FAILOVER` can run on it,
    /// and one retried until `failover_timeout` held every peer back while
    /// the group had no master (the simulation with switchovers, seed
    /// 2796). The automatic failover handles it (invariant 11).
    #[tokio::test]
    async fn a_switchover_of_a_master_that_reports_role_slave_is_refused() {
        let mut sim = Sim::new(3, 2, 6);
        sim.run_for(3_000).await;
        let (old, new) = (addr(7000), addr(7001));
        sim.servers.get_mut(&new).master = None;
        sim.servers.get_mut(&old).master = Some(new.clone());
        sim.run_for(300).await;
        let mut answer = ask_switchover(&mut sim, 0).await;
        sim.run_for(300).await;
        assert!(
            matches!(
                answer.try_recv(),
                Ok(Err(crate::failover::FailoverError::MasterDown))
            ),
            "{:#?}",
            sim.trace
        );
        assert!(
            !sim.trace.iter().any(|(_, _, w)| w == "start election"),
            "{:#?}",
            sim.trace
        );
    }

    /// The outcome of a switchover that comes while its leader's process
    /// is stalled is taken when the process runs again, as a stopped
    /// process finds it queued. The simulation dropped it: the leader
    /// waited for it until its deadline (seeds 907 with switchovers and
    /// 6876 with every fault, which never settled). Stalled before its
    /// promotion was confirmed, the leader steps down (TILT: a newer
    /// election may have run unheard), and the group settles on the
    /// server that took over.
    #[tokio::test]
    async fn a_result_that_comes_while_the_leader_is_stalled_is_taken_when_it_runs_again() {
        let mut sim = Sim::new(3, 2, 5);
        sim.run_for(3_000).await;
        let _answer = ask_switchover(&mut sim, 0).await;
        until_switchover_sent(&mut sim).await;
        assert_eq!(sim.daemons[0].g.switchovers_sent, 1, "{:#?}", sim.trace);
        let from = sim.trace.len();
        sim.net.stalled_until.insert(0, sim.ms + 2_000);
        sim.run_for(1_500).await;
        sim.at("127.0.0.1:7000 handed over to 127.0.0.1:7001");
        assert!(
            !sim.trace
                .iter()
                .any(|(_, d, w)| *d == 0 && w.starts_with("publish")),
            "a stalled process ran: {:#?}",
            sim.trace
        );
        sim.run_for(600).await;
        // Taken at once, not at the command's deadline (its timeout and
        // 5 s).
        assert_eq!(sim.daemons[0].g.switchovers_sent, 0, "{:#?}", sim.trace);
        sim.run_for(15_000).await;
        assert_settled_on_7001_without_routing_7000(&sim, from);
    }

    /// Redis refuses `REPLICAOF` (`NO ONE` included) while a `FAILOVER`
    /// runs, and so does the simulated server: obeyed, a server demoted
    /// while its `FAILOVER` waited handed over to its old target later
    /// (`picket-sim` with every fault, seed 6249).
    #[tokio::test]
    async fn replicaof_is_refused_while_a_failover_runs() {
        let mut sim = Sim::new(1, 1, 6);
        sim.run_for(2_000).await;
        sim.servers.get_mut(&addr(7001)).lag_ms = 600_000;
        sim.servers.get_mut(&addr(7000)).offset += 50;
        let started = sim.failover_to(0, 1, addr(7000), addr(7001), Duration::from_secs(5));
        assert!(started.is_none(), "FAILOVER under way");
        for w in [
            crate::group::effects::Work::Demote {
                addr: addr(7000),
                flavour: crate::probe::Flavour::Redis,
                master: addr(7002),
            },
            crate::group::effects::Work::Promote {
                epoch: 1,
                candidate: addr(7000),
                flavour: crate::probe::Flavour::Redis,
                flush: false,
                chosen: None,
            },
        ] {
            let r = sim.carry_out(0, w).await;
            assert!(
                matches!(
                    r,
                    Some(Internal::Demoted(_, Err(_)))
                        | Some(Internal::Failover(
                            _,
                            crate::failover::machine::Input::Promoted(Err(_))
                        ))
                ),
                "{r:?}"
            );
        }
        let s = sim.servers.get(&addr(7000)).cloned();
        assert!(s.is_some_and(|s| s.master.is_none() && s.failing_over_to.is_some()));
    }

    /// Each promotion draws a new replication id and keeps the old one as
    /// the second, as Redis does: a replica of the old history no further
    /// on goes on without a copy (and takes the new id), one further on
    /// (an old master that took writes the new one never had) takes a
    /// full copy and drops them.
    #[tokio::test]
    async fn a_promotion_draws_a_new_history_that_its_old_replicas_continue() {
        let mut sim = Sim::new(1, 1, 6);
        let (old, new, other) = (addr(7000), addr(7001), addr(7002));
        let history = sim.servers.get(&old).map(|s| s.replid.clone());
        sim.servers.get_mut(&old).offset = 1_200;
        sim.servers.get_mut(&new).promote(5);
        let n = sim.servers.get(&new).cloned().expect("a server");
        assert_ne!(Some(&n.replid), history.as_ref());
        assert_eq!(n.replid2, history.clone().map(|h| (h, 1_000)));
        sim.servers.get_mut(&other).master = Some(new.clone());
        sim.servers.get_mut(&old).master = Some(new.clone());
        let mut lost = sim.servers.replicate(10);
        let o = sim.servers.get(&other).cloned().expect("a server");
        assert!(sim.servers.linked(&o));
        assert_eq!(o.replid, n.replid, "continued, with the new history");
        assert!(
            !sim.servers
                .linked(&sim.servers.get(&old).cloned().expect("a server"))
        );
        for ms in [500, 1_010, 1_020] {
            lost.extend(sim.servers.replicate(ms));
        }
        assert_eq!(lost, vec![(old.clone(), new.clone(), 1_200, 1_003)]);
        assert_eq!(sim.servers.get(&old).map(|s| &s.replid), Some(&n.replid));
        // Promoting a master changes nothing.
        sim.servers.get_mut(&new).promote(2_000);
        assert_eq!(sim.servers.get(&new).map(|s| &s.replid), Some(&n.replid));
    }

    /// A switchover hands over to a replica only: a server that reports
    /// `role:master` (a stray an unplanned failover left, a replica
    /// promoted in place and not demoted yet) ranks first for an unplanned
    /// failover, as the replica an earlier leader promoted, but `FAILOVER
    /// TO` refuses it (the simulation with switchovers, seed 12157: the
    /// switchover retried it until the old master looked down, then
    /// promoted it).
    #[tokio::test]
    async fn a_switchover_hands_over_to_a_replica_not_to_a_stray_master() {
        let mut sim = Sim::new(3, 2, 6);
        sim.run_for(3_000).await;
        let stray = addr(7002);
        let ms = sim.ms;
        sim.servers.get_mut(&stray).promote(ms);
        sim.servers.get_mut(&stray).offset += 50;
        // Read as a master by every daemon, and left one for
        // PROMOTED_GRACE (promoted in place).
        sim.run_for(300).await;
        for d in &sim.daemons {
            let role =
                d.g.instances
                    .get(&stray)
                    .and_then(|i| i.info.as_ref())
                    .map(|x| x.role);
            assert_eq!(role, Some(crate::probe::Role::Master), "{}", d.ctx.id);
        }
        let _answer = ask_switchover(&mut sim, 0).await;
        until_switchover_sent(&mut sim).await;
        let sent: Vec<_> = sim
            .trace
            .iter()
            .filter(|(_, _, w)| w.starts_with("switchover "))
            .map(|(_, _, w)| w.clone())
            .collect();
        assert!(
            sent.iter()
                .all(|w| w.starts_with("switchover 127.0.0.1:7000 to 127.0.0.1:7001")),
            "{sent:?}"
        );
    }

    /// A switchover's `FAILOVER`, retried by a leader that did not hear of
    /// the newer switchovers that handed its old master over and back, is
    /// not sent: the server is in another history than when the failover
    /// began (the simulation with switchovers and the network's faults,
    /// seed 6131: the stale command handed the newer master's group over).
    #[tokio::test]
    async fn a_switchover_retried_after_the_master_was_handed_over_and_back_is_refused() {
        let mut sim = Sim::new(3, 2, 6);
        sim.run_for(2_000).await;
        let (old, new) = (addr(7000), addr(7001));
        let began = sim.servers.get(&old).map(|s| s.replid.clone());
        let work = |history: Option<String>| crate::group::effects::Work::Switchover {
            epoch: 9,
            old_master: old.clone(),
            flavour: crate::probe::Flavour::Redis,
            candidate: new.clone(),
            listed_as: new.clone(),
            timeout: Duration::from_secs(5),
            ends_by_unix: 0,
            history,
        };
        // Handed over to 7001 and back.
        let (ms, caught_up) = (sim.ms, sim.servers.get(&old).map_or(0, |s| s.offset));
        sim.servers.get_mut(&new).offset = caught_up;
        sim.servers.get_mut(&new).promote(ms);
        sim.servers.get_mut(&old).master = Some(new.clone());
        sim.run_for(100).await;
        // `FAILOVER` hands over once its target has caught up.
        let (ms, caught_up) = (sim.ms, sim.servers.get(&new).map_or(0, |s| s.offset));
        sim.servers.get_mut(&old).offset = caught_up;
        sim.servers.get_mut(&old).promote(ms);
        sim.servers.get_mut(&new).master = Some(old.clone());
        sim.run_for(100).await;
        let r = sim.carry_out(0, work(began)).await;
        assert!(
            matches!(
                &r,
                Some(Internal::SwitchedOver(9, Err(PromoteError::OldMasterNotMaster(m))))
                    if m.contains("another history")
            ),
            "{r:?}"
        );
        assert!(
            sim.servers
                .get(&old)
                .is_some_and(|s| s.failing_over_to.is_none())
        );
        // In the history it has now, the command goes out.
        let now = sim.servers.get(&old).map(|s| s.replid.clone());
        let r = sim.carry_out(0, work(now)).await;
        assert!(r.is_none(), "{r:?}");
        assert!(
            sim.servers
                .get(&old)
                .is_some_and(|s| s.failing_over_to.is_some())
        );
    }

    /// A switchover's leader killed after its `FAILOVER` was sent, which
    /// the server completes without it: restarted, the leader holds the
    /// epoch it led with the master it kept, and that server is a replica
    /// now. Its peers must not take that epoch from its hellos and route
    /// the backends to the old master (the simulation with every fault,
    /// seed 2248: the Service routed to a replica until the group failed
    /// it over).
    #[tokio::test]
    async fn a_switchover_leader_back_after_the_server_handed_over_does_not_route_the_old_master() {
        let mut sim = Sim::new(3, 2, 5);
        sim.run_for(3_000).await;
        let _answer = ask_switchover(&mut sim, 0).await;
        // Daemon 0 is killed as soon as it has sent `FAILOVER`, before
        // the server's answer.
        until_switchover_sent(&mut sim).await;
        sim.crash(0);
        let mut handed = false;
        for _ in 0..300 {
            sim.run_for(10).await;
            if sim.trace.iter().any(|(_, _, w)| w.contains("handed over")) {
                handed = true;
                break;
            }
        }
        assert!(handed, "the server did not hand over: {:#?}", sim.trace);
        assert_eq!(sim.daemons[0].ctx.state.group("g").led_epoch, 1);
        let from = sim.trace.len();
        sim.restart(0);
        sim.run_for(12_000).await;
        // The group fails the replica-reporting master over and routes
        // the new one.
        assert_settled_on_7001_without_routing_7000(&sim, from);
    }

    /// A switchover's leader killed as soon as its `FAILOVER` went out and
    /// restarted before the server hands over: it reads its kept master
    /// as a master, but the server may still hand over (until the
    /// command's timeout, recorded in the state file before it went out),
    /// and it neither publishes that master again nor announces its
    /// epoch with it meanwhile (the simulation with switchovers, seed
    /// 2353: published 30 ms before the handover, and the Service routed
    /// clients to a replica).
    #[tokio::test]
    async fn a_switchover_leader_back_before_the_server_handed_over_does_not_route_the_old_master()
    {
        let mut sim = Sim::new(3, 2, 5);
        sim.run_for(3_000).await;
        // The candidate copies nothing for now: FAILOVER waits for it.
        sim.servers.get_mut(&addr(7001)).lag_ms = 600_000;
        sim.servers.get_mut(&addr(7000)).offset += 50;
        let _answer = ask_switchover(&mut sim, 0).await;
        until_switchover_sent(&mut sim).await;
        sim.at("switchover 127.0.0.1:7000 to 127.0.0.1:7001 at 1");
        assert!(sim.daemons[0].ctx.state.group("g").led_switchover_until > 0);
        sim.crash(0);
        sim.restart(0);
        let from = sim.trace.len();
        // Back, it reads the kept master as one; then the candidate
        // catches up and the server hands over.
        sim.run_for(1_000).await;
        sim.servers.get_mut(&addr(7001)).lag_ms = 100;
        sim.run_for(500).await;
        sim.at("127.0.0.1:7000 handed over to 127.0.0.1:7001");
        sim.run_for(12_000).await;
        assert_settled_on_7001_without_routing_7000(&sim, from);
    }

    /// The master runs a script for 5 s; whether it has written.
    async fn busy_master(wrote: bool) -> Sim {
        let mut sim = Sim::new(3, 2, 8);
        sim.run_for(3_000).await;
        let ms = sim.ms;
        let m = sim.servers.get_mut(&addr(7000));
        m.busy_until = ms + 5_000;
        m.script_wrote = wrote;
        sim.run_for(8_000).await;
        sim
    }

    #[tokio::test]
    async fn a_master_busy_with_a_script_that_can_be_killed_is_not_failed_over() {
        let sim = busy_master(false).await;
        sim.at("script kill 127.0.0.1:7000");
        assert!(
            !sim.trace.iter().any(|(_, _, w)| w.starts_with("promote")),
            "{:#?}",
            sim.trace
        );
        for d in &sim.daemons {
            assert_eq!(d.g.master, addr(7000), "{}: {:#?}", d.ctx.id, sim.trace);
        }
        sim.assert_no_violation();
    }

    #[tokio::test]
    async fn a_master_whose_script_has_written_is_failed_over() {
        let sim = busy_master(true).await;
        let kill = sim.at("script kill 127.0.0.1:7000");
        assert!(kill < sim.at("promote"), "{:#?}", sim.trace);
        for d in &sim.daemons {
            assert_ne!(d.g.master, addr(7000), "{}: {:#?}", d.ctx.id, sim.trace);
        }
        sim.assert_no_violation();
    }

    #[tokio::test]
    async fn a_master_back_with_its_data_and_loading_it_is_not_failed_over() {
        let mut sim = Sim::new(3, 2, 9);
        sim.run_for(3_000).await;
        let m = addr(7000);
        sim.servers.get_mut(&m).alive = false;
        sim.run_for(50).await;
        sim.restart_loading(&m, 3_000);
        sim.run_for(6_000).await;
        assert!(
            !sim.trace.iter().any(|(_, _, w)| w.starts_with("promote")),
            "{:#?}",
            sim.trace
        );
        for d in &sim.daemons {
            assert_eq!(d.g.master, m, "{}: {:#?}", d.ctx.id, sim.trace);
        }
        sim.assert_followed(7000, &[7001, 7002]);
        sim.assert_no_violation();
    }

    /// A master back empty is judged behind a replica read already,
    /// without waiting for another replica that restarted and is still
    /// loading its data (unread): waiting, the daemons let the first take
    /// the empty server's full copy (the simulation with every fault, seed
    /// 11764).
    #[tokio::test]
    async fn a_master_back_empty_is_judged_without_waiting_for_a_loading_replica() {
        let mut sim = Sim::new(3, 2, 9);
        sim.run_for(3_000).await;
        let (m, loading, replica) = (addr(7000), addr(7001), addr(7002));
        // The replica back loading its data (it answers `-LOADING`, and
        // its INFO cannot be read), and the daemons restarted since: they
        // have not read it.
        sim.servers.get_mut(&loading).alive = false;
        sim.run_for(50).await;
        sim.restart_loading(&loading, 10_000);
        sim.run_for(100).await;
        for i in 0..3 {
            sim.crash(i);
            sim.restart(i);
        }
        sim.run_for(1_000).await;
        for d in &sim.daemons {
            let i = d.g.instances.get(&loading).expect("a known replica");
            assert!(i.info.is_none() && !i.sdown.is_down(), "{}", d.ctx.id);
        }
        let had = sim.servers.get(&replica).map_or(0, |s| s.offset);
        sim.servers.get_mut(&m).alive = false;
        sim.run_for(30).await;
        let ms = sim.ms;
        let s = sim.servers.get_mut(&m);
        s.alive = true;
        let before = s.restart_empty(ms);
        sim.mark_emptied(&m, &before);
        sim.run_for(3_000).await;
        let now = sim.servers.get(&replica).map_or(0, |s| s.offset);
        assert!(
            now >= had,
            "{replica} copied the empty master: {had} -> {now}"
        );
        sim.assert_no_violation();
    }
}

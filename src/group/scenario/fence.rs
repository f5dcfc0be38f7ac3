//! `min-replicas-to-write` on the simulated servers, and the isolation
//! fence picket keeps with it (`group::isolation`).
//!
//! As Redis 7 does it (`replication.c`, `refreshGoodSlavesCount` and
//! `checkGoodReplicasStatus`): a replica acknowledges its offset once a
//! second (`REPLCONF ACK`, at its replication cron); a master counts, once
//! a second, the replicas whose last acknowledgement is no older than
//! `min-replicas-max-lag` seconds, and refuses every write command with
//! `-NOREPLICAS` (`FLUSHALL` among them) while fewer than
//! `min-replicas-to-write` are counted. A replica never refuses for it,
//! and a restart forgets what `CONFIG SET` set.
//!
//! A server's replication links can be cut (`links_cut`): neither copies
//! nor acknowledgements cross, while the daemons may still reach it. That
//! is the partition isolation fencing is for: a master cut off from its
//! replicas, its clients still writing to it.

use rand::Rng;

use super::{Server, Servers, Sim};
use crate::addr::Addr;
use crate::failover::ops::threshold_kept;
use crate::group::isolation::SYNC_GRACE;
use crate::resp::RespError;

/// The group's isolation fencing in the tests and `picket-sim
/// --isolation`: one replica within a second.
pub(super) const FENCED: &str = "[group.isolation_fencing]\nmin_replicas = 1\nmax_lag = \"1s\"\n";

/// What Redis answers a write while too few replicas acknowledge.
pub(super) const NOREPLICAS: &str = "NOREPLICAS Not enough good replicas to write.";

/// A cut of a master's replication links, checked (invariant 15).
#[derive(Debug, Clone, Copy)]
pub(super) struct LinkCut {
    /// Since when the master should refuse writes (the cut, or the last
    /// moment the daemons could not know better).
    from: u64,
    /// The master's process then.
    generation: u32,
    /// The fence was lowered then: raising it may wait for the replicas
    /// to synchronise.
    grace: bool,
}

impl Server {
    /// Takes a write at `ms`: a master, answering, with its fence met.
    pub(super) fn takes_writes(&self, ms: u64) -> bool {
        self.serving(ms)
            && self.master.is_none()
            && (self.min_replicas == 0 || self.good_replicas >= self.min_replicas)
    }

    /// A new process: what `CONFIG SET` set is gone.
    pub(super) fn forget_settings(&mut self) {
        self.generation += 1;
        self.min_replicas = 0;
        self.max_lag_s = 10;
        self.good_replicas = 0;
    }
}

impl Servers {
    /// Replicas acknowledge and masters count their good replicas, once
    /// a second. A master counts a replica whose acknowledgements stopped
    /// (its link cut) until they are `max_lag_s` old, as Redis does: it
    /// does not see the cut, only the silence.
    pub(super) fn replication_cron(&mut self, ms: u64) {
        if !ms.is_multiple_of(1000) {
            return;
        }
        let acking: Vec<Addr> = self
            .0
            .iter()
            .filter(|s| s.serving(ms) && self.linked(s))
            .map(|s| s.addr.clone())
            .collect();
        for s in self.0.iter_mut().filter(|s| acking.contains(&s.addr)) {
            s.acked_ms = ms;
        }
        let good: Vec<u32> = self
            .0
            .iter()
            .map(|m| {
                let counted = self.0.iter().filter(|r| {
                    r.alive
                        && r.master.as_ref() == Some(&m.addr)
                        && r.sync_due.is_none()
                        && m.continues(&r.replid, r.offset)
                        && ms.saturating_sub(r.acked_ms) <= m.max_lag_s * 1000
                });
                u32::try_from(counted.count()).unwrap_or(u32::MAX)
            })
            .collect();
        for (m, n) in self.0.iter_mut().zip(good) {
            m.good_replicas = n;
        }
    }
}

impl Sim {
    /// Fault: the replication links of the master the first up daemon
    /// names are cut, three times in ten with every daemon's link to it
    /// (a master alone with its clients). Checked from then on
    /// (invariant 15).
    pub(super) fn cut_links_of_master(&mut self) {
        let n = self.daemons.len();
        let Some(m) = self
            .daemons
            .iter()
            .find(|d| d.up)
            .map(|d| d.g.master.clone())
        else {
            return;
        };
        let alone = self.rng.random_bool(0.3);
        let configured = self.fencing.map_or(0, |(min, _)| min);
        let s = self.servers.get_mut(&m);
        s.links_cut = true;
        let cut = LinkCut {
            from: self.ms,
            generation: s.generation,
            grace: s.min_replicas < configured,
        };
        let fenced = !cut.grace;
        self.link_cuts.entry(m.clone()).or_insert(cut);
        if alone {
            for i in 0..n {
                self.cut_server.insert((i, m.clone()));
            }
        }
        self.note(
            n,
            format!(
                "fault: cut the replication links of {m}{}, its fence {}",
                if alone { " and the daemons'" } else { "" },
                if fenced { "in force" } else { "lowered" }
            ),
        );
    }

    /// Every replication link is back.
    pub(super) fn heal_links(&mut self) {
        for s in &mut self.servers.0 {
            s.links_cut = false;
        }
        self.link_cuts.clear();
    }

    /// Whether the daemons cannot know better than to leave `a`'s fence
    /// lowered: no answering replica is visible to a running daemon, or
    /// fewer than a majority of the daemons run or reach `a`.
    fn fence_may_be_lowered(&self, a: &Addr) -> bool {
        let up: Vec<usize> = (0..self.daemons.len())
            .filter(|&i| self.daemons[i].up)
            .collect();
        let reaches = |s: &Addr| {
            up.iter()
                .filter(|&&i| !self.cut_server.contains(&(i, s.clone())))
                .count()
        };
        let replica_seen = self.servers.0.iter().any(|r| {
            r.addr != *a && r.serving(self.ms) && r.master.is_some() && reaches(&r.addr) > 0
        });
        let majority = self.daemons.len() / 2 + 1;
        !replica_seen || up.len() < majority || reaches(a) < majority
    }

    /// `a`'s fence was just set to `value`: a lowering the daemons could
    /// not know better than to make starts the clock of invariant 15
    /// again (with the grace of the raise). Judged at that instant: the
    /// next check may already see a replica a demotion made one since.
    fn fence_set_on(&mut self, a: &Addr, value: u32) {
        let Some((min, _)) = self.fencing else {
            return;
        };
        if value < min && self.link_cuts.contains_key(a) && self.fence_may_be_lowered(a) {
            let ms = self.ms;
            if let Some(cut) = self.link_cuts.get_mut(a) {
                cut.from = ms;
                cut.grace = true;
            }
        }
    }

    /// Invariant 15: a master whose replication links are cut takes no
    /// write once `max_lag` and Redis' two seconds (a cron to count, an
    /// acknowledgement's period) have passed, as long as the daemons can
    /// know better. The rule lowers the fence when the daemons that see
    /// the master see no replica up, so while the fence is lowered and
    /// they cannot know better ([`Sim::fence_may_be_lowered`]), the clock
    /// starts again; from a lowered fence, raising it may wait for the
    /// replicas to synchronise ([`SYNC_GRACE`]). A restart forgets the
    /// fence and ends the check.
    pub(super) fn check_link_cuts(&mut self) {
        let (Some((min, lag)), false) = (self.fencing, self.link_cuts.is_empty()) else {
            return;
        };
        let ms = self.ms;
        let cuts: Vec<Addr> = self.link_cuts.keys().cloned().collect();
        for a in cuts {
            let (Some(s), Some(cut)) = (self.servers.get(&a), self.link_cuts.get(&a).copied())
            else {
                continue;
            };
            if !s.alive || !s.links_cut || s.generation != cut.generation {
                self.link_cuts.remove(&a);
                continue;
            }
            if s.min_replicas < min && self.fence_may_be_lowered(&a) {
                self.link_cuts.insert(
                    a,
                    LinkCut {
                        from: ms,
                        grace: true,
                        ..cut
                    },
                );
                continue;
            }
            let grace = if cut.grace {
                SYNC_GRACE.as_millis() as u64 + 2_000
            } else {
                0
            };
            if s.takes_writes(ms) && ms > cut.from + lag * 1000 + 2_000 + grace {
                self.violations.push(format!(
                    "{ms} ms: invariant 15: {a} took writes {} ms after its replication links were cut{}, \
                     with min-replicas-to-write {} ({} good replicas)",
                    ms - cut.from,
                    if cut.grace { " (or the daemons could see it)" } else { "" },
                    s.min_replicas,
                    s.good_replicas
                ));
                self.link_cuts.remove(&a);
            }
        }
    }

    /// Invariant 15, settled: the master holds the configured fence and
    /// every other server none (a promotion must not find one left).
    /// Not while a majority of the daemons sees the master down: no daemon
    /// keeps a fence on a master it does not see up (seed 1920 of
    /// `--isolation --net`: a master judged for its reboot while its
    /// replicas were dead stays SDOWN `#reboot` after they came back and
    /// copied it, until the retried failover).
    pub(super) fn check_settled_fence(&mut self, master: &Addr) {
        let Some((min, _)) = self.fencing else {
            return;
        };
        let down = self.daemons.iter().filter(|d| d.g.master_sdown()).count();
        if down > self.daemons.len() / 2 {
            self.note(
                self.daemons.len(),
                format!("settled on {master}, seen down by {down} daemons: its fence not checked"),
            );
            return;
        }
        for s in &self.servers.0 {
            let want = if s.addr == *master { min } else { 0 };
            if s.min_replicas != want {
                self.violations.push(format!(
                    "{} ms: invariant 15: settled on {master}, but {} has min-replicas-to-write {} (want {want})",
                    self.ms, s.addr, s.min_replicas
                ));
            }
        }
    }

    /// `CONFIG GET` then `CONFIG SET` of `min-replicas-to-write` (and of
    /// `min-replicas-max-lag` with `lag`) on `a` by daemon `i`, as
    /// `InstanceOps::set_min_replicas` sends them: the values before.
    pub(super) fn set_min_replicas(
        &mut self,
        i: usize,
        a: &Addr,
        target: u32,
        lag: Option<u64>,
        keep: u32,
    ) -> Result<(u32, u64), RespError> {
        let Some(s) = self.servers.get(a).filter(|_| self.reaches(i, a)) else {
            return Err(RespError::Closed);
        };
        let kept = threshold_kept(s.min_replicas, target, keep);
        if kept {
            self.note(
                i,
                format!("min-replicas-to-write {} kept on {a}", s.min_replicas),
            );
        } else {
            self.note(i, format!("min-replicas-to-write {target} on {a}"));
        }
        let s = self.servers.get_mut(a);
        if s.dragonfly {
            return Err(RespError::Unexpected(format!(
                "{a}: CONFIG GET min-replicas-to-write replied [] (no such setting: not Redis or Valkey?)"
            )));
        }
        let before = (s.min_replicas, s.max_lag_s);
        if let Some(lag) = lag {
            s.max_lag_s = lag;
        }
        if !kept {
            s.min_replicas = target;
            self.fence_set_on(a, target);
        }
        Ok(before)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Sim, addr};
    use super::FENCED;

    /// Three daemons keeping a fence of one replica within 1 s, settled.
    async fn fenced() -> Sim {
        let mut sim = Sim::with_group(3, 2, 1, FENCED);
        sim.run_for(8_000).await;
        let m = sim.servers.get(&addr(7000)).expect("7000");
        assert_eq!((m.min_replicas, m.max_lag_s), (1, 1), "{:#?}", sim.trace);
        assert!(m.takes_writes(sim.ms));
        for p in [7001, 7002] {
            let r = sim.servers.get(&addr(p)).expect("a replica");
            assert_eq!(r.min_replicas, 0);
        }
        sim
    }

    /// [`fenced`], then both replicas dead for 8 s: the fence lowered.
    async fn replicas_dead() -> Sim {
        let mut sim = fenced().await;
        for p in [7001, 7002] {
            sim.servers.get_mut(&addr(p)).alive = false;
        }
        sim.run_for(8_000).await;
        let m = sim.servers.get(&addr(7000)).expect("7000");
        assert_eq!(m.min_replicas, 0, "lowered: {:#?}", sim.trace);
        sim
    }

    /// The last virtual ms, within the next `ms`, at which `a` took a
    /// write (its offset grew).
    async fn last_write(sim: &mut Sim, a: u16, ms: u64) -> u64 {
        let mut last = sim.ms;
        let mut offset = sim.servers.get(&addr(a)).map_or(0, |s| s.offset);
        for _ in 0..ms / 100 {
            sim.run_for(100).await;
            let now = sim.servers.get(&addr(a)).map_or(0, |s| s.offset);
            if now != offset {
                last = sim.ms;
                offset = now;
            }
        }
        last
    }

    /// The master cut off from its replicas and from every daemon, its
    /// clients still with it: it takes writes for at most the lag and
    /// Redis' two seconds of cron and acknowledgement; the daemons fail
    /// it over meanwhile and keep the fence on the new master.
    #[tokio::test]
    async fn an_isolated_master_stops_acknowledging_writes_within_the_lag() {
        let mut sim = fenced().await;
        let cut = sim.ms;
        sim.servers.get_mut(&addr(7000)).links_cut = true;
        for i in 0..3 {
            sim.cut_server.insert((i, addr(7000)));
        }
        let last = last_write(&mut sim, 7000, 8_000).await;
        assert!(
            last - cut <= 3_000,
            "took writes {} ms into its isolation: {:#?}",
            last - cut,
            sim.trace
        );
        let new = sim.daemons[0].g.master.clone();
        assert_ne!(new, addr(7000), "failed over: {:#?}", sim.trace);
        let m = sim.servers.get(&new).expect("the new master");
        assert_eq!(m.min_replicas, 1, "{:#?}", sim.trace);
        assert!(m.takes_writes(sim.ms));
        sim.assert_no_violation();
    }

    /// The master's replication links cut, the daemons still seeing every
    /// server: they see both replicas up, so none lowers the fence, and
    /// the master refuses writes until the links are back; nothing fails
    /// over.
    #[tokio::test]
    async fn replicas_cut_off_from_the_master_but_seen_by_the_daemons_keep_the_fence() {
        let mut sim = fenced().await;
        let cut = sim.ms;
        sim.servers.get_mut(&addr(7000)).links_cut = true;
        let last = last_write(&mut sim, 7000, 10_000).await;
        assert!(last - cut <= 3_000, "{} ms: {:#?}", last - cut, sim.trace);
        let m = sim.servers.get(&addr(7000)).expect("7000");
        assert_eq!(m.min_replicas, 1, "{:#?}", sim.trace);
        for d in &sim.daemons {
            assert_eq!(d.g.master, addr(7000));
        }
        sim.servers.get_mut(&addr(7000)).links_cut = false;
        let back = sim.ms;
        let last = last_write(&mut sim, 7000, 3_000).await;
        assert!(last > back + 1_000, "writable again: {:#?}", sim.trace);
        sim.assert_no_violation();
    }

    /// Both replicas dead: the daemons, all seeing the master up and no
    /// replica, lower the fence so that the master stays writable, and
    /// raise it again once the replicas are back and linked.
    #[tokio::test]
    async fn a_fenced_group_stays_writable_when_both_replicas_die() {
        let mut sim = replicas_dead().await;
        let before = sim.ms;
        let last = last_write(&mut sim, 7000, 2_000).await;
        assert!(last > before + 1_000, "writable: {:#?}", sim.trace);
        for p in [7001, 7002] {
            sim.servers.get_mut(&addr(p)).back_with_data(sim.ms);
        }
        sim.run_for(15_000).await;
        let m = sim.servers.get(&addr(7000)).expect("7000");
        assert_eq!(m.min_replicas, 1, "raised again: {:#?}", sim.trace);
        assert!(m.takes_writes(sim.ms));
        sim.assert_no_violation();
    }

    /// Both replicas dead: every daemon lowers the fence. They come back
    /// while the master's replication links are cut, so they cannot
    /// synchronise, and every daemon waits for that before raising it
    /// again (`SYNC_GRACE`). A daemon restarted meanwhile starts at the
    /// full fence and raises it; the others, finding it raised, keep it
    /// rather than lower it again to wait (seed 1877 of `picket-sim
    /// --isolation --net`: a daemon out of TILT did).
    #[tokio::test]
    async fn a_fence_another_daemon_raised_is_not_lowered_again_to_wait_for_synchronisation() {
        let mut sim = replicas_dead().await;
        let fence = |sim: &Sim| sim.servers.get(&addr(7000)).map(|s| s.min_replicas);
        sim.servers.get_mut(&addr(7000)).links_cut = true;
        for p in [7001, 7002] {
            let ms = sim.ms;
            sim.servers.get_mut(&addr(p)).back_with_data(ms);
        }
        sim.run_for(3_000).await;
        assert_eq!(fence(&sim), Some(0), "waiting for them: {:#?}", sim.trace);
        sim.crash(0);
        sim.restart(0);
        for _ in 0..50 {
            sim.run_for(100).await;
            if fence(&sim) == Some(1) {
                break;
            }
        }
        assert_eq!(
            fence(&sim),
            Some(1),
            "raised by the restarted daemon: {:#?}",
            sim.trace
        );
        // Past the others' next check of the fence (every 5 s).
        for _ in 0..70 {
            sim.run_for(100).await;
            assert_eq!(fence(&sim), Some(1), "lowered again: {:#?}", sim.trace);
        }
        assert!(
            sim.trace.iter().any(|(_, i, w)| *i != 0
                && w.starts_with("min-replicas-to-write 1 kept on 127.0.0.1:7000")),
            "{:#?}",
            sim.trace
        );
        sim.assert_no_violation();
    }
}

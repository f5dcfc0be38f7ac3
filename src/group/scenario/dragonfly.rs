//! Dragonfly where the group's decisions depend on it (`picket-sim
//! --dragonfly`; what each rule stands for is in
//! `shared/reference/dragonfly.md` §3-4 and docs/reliability.md, "Crashes
//! and restarts", measured on Dragonfly v1.40.1):
//!
//! - INFO: `dragonfly_version`, no `run_id`, `uptime_in_seconds`; a
//!   master lists its replicas without offsets and has no
//!   `master_repl_offset`; a replica reports `slave_repl_offset`.
//! - A replica that loses its master tries it again 500 ms later, and
//!   every 500 ms while that fails (`replica.cc` `MainReplicationFb`); a
//!   master of another history is copied at once, whatever `CLIENT PAUSE`
//!   says (it pauses client connections only): nothing holds a restarted
//!   Dragonfly back but being first.
//! - `REPLICAOF NO ONE` on a replica in that retry stops its replication
//!   at once but answers, and makes it a master, only when the sleep ends
//!   (`ReplicaOfNoOne` joins the fiber); its INFO waits meanwhile.
//! - A replica of a replica is refused ("Replicating a replica is
//!   unsupported"), the replica's replication untouched; a `REPLICAOF` to
//!   a replica whose `REPLICAOF NO ONE` waits greets it once it is a
//!   master (the replica's own retries go on until then).
//! - `REPLTAKEOVER` (`ops.rs`): the master locks, waits for the replica
//!   to catch up, and exits; the replica becomes a master.
//! - A process that starts draws a new replication id and comes up a
//!   master (nothing tells it to replicate), with its data or without.
//! - With `--break_replication_on_master_restart=true` (`picket-sim
//!   --break-replication`, as deploy/kubernetes runs it), a replica that
//!   finds its master in another history stops, its data kept, until a
//!   `REPLICAOF` names a master again.

use std::sync::Arc;

use super::super::effects::Internal;
use super::{REPLICAOF_REFUSED, Server, Servers, Sim};
use crate::addr::Addr;
use crate::context::DaemonCtx;
use crate::failover::CommandFailed;
use crate::failover::machine::{Input, PromoteError};
use crate::resp::RespError;

/// How long a Dragonfly replica sleeps between two tries of its master.
const RETRY_MS: u64 = 500;

/// How often picket sends again a re-point refused beside a promotion
/// (`failover/ops.rs` `REPOINT_RETRY`).
const REPOINT_RETRY_MS: u64 = 20;

/// `sync_due` of a replica that stopped replicating for good
/// (`--break_replication_on_master_restart`).
const STOPPED: u64 = u64::MAX;

/// A Dragonfly answer that comes later than the command.
pub(super) struct Pending {
    at: u64,
    daemon: usize,
    /// The daemon's life that asked (one restarted since is not told).
    ctx: Arc<DaemonCtx>,
    what: Later,
}

enum Later {
    /// `REPLICAOF NO ONE` answers once the candidate's retry sleep ends.
    Promotion {
        epoch: u64,
        candidate: Addr,
        flush: bool,
    },
    /// A `REPLICAOF` that waited for its master's promotion greets it.
    Greets {
        epoch: Option<u64>,
        replica: Addr,
        master: Addr,
        demote: bool,
    },
    /// A re-point refused beside a promotion, sent again until `until`.
    Retry {
        epoch: Option<u64>,
        replica: Addr,
        master: Addr,
        until: u64,
    },
}

/// What a Dragonfly `REPLICAOF host port` did.
enum Replicaof {
    Done,
    /// Waits for its new master's promotion, due then.
    Waits(u64),
    Refused(String),
}

/// What a failover's re-point of `replica` reports to it (nothing for a
/// topology repair, `epoch` None).
fn repoint_sent(
    epoch: Option<u64>,
    replica: Addr,
    r: Result<(), CommandFailed>,
) -> Option<Internal> {
    epoch.map(|e| Internal::Failover(e, Input::RepointSent(replica, r)))
}

impl Server {
    /// Its process started at `ms`: Dragonfly counts its uptime from
    /// there and comes up a master.
    pub(super) fn dragonfly_started(&mut self, ms: u64) {
        self.started_ms = ms;
        self.sync_due = None;
        self.stopping_at = None;
        self.asked = false;
        self.restart_at = None;
        if self.dragonfly {
            self.master = None;
        }
    }

    /// Back with its data at `ms` (a snapshot loaded, or a blip): the
    /// Redis servers here keep their process and history; a Dragonfly
    /// process draws a new history.
    pub(super) fn back_with_data(&mut self, ms: u64) {
        self.alive = true;
        self.forget_settings();
        if self.dragonfly {
            self.dragonfly_started(ms);
            self.replid = format!("{:036}{:04}", ms + 1, self.addr.port % 10_000);
            self.replid2 = None;
        }
    }
}

impl Servers {
    /// What Dragonfly's `INFO` answers on `s` at `ms`.
    pub(super) fn dragonfly_info(&self, s: &Server, ms: u64) -> String {
        let mut out = format!(
            "# Server\r\nredis_version:7.4.0\r\ndragonfly_version:df-v1.40.1\r\n\
             uptime_in_seconds:{}\r\n# Replication\r\n",
            ms.saturating_sub(s.started_ms) / 1000
        );
        match &s.master {
            None => {
                let replicas: Vec<&Server> = self
                    .0
                    .iter()
                    .filter(|r| {
                        r.alive && r.sync_due.is_none() && r.master.as_ref() == Some(&s.addr)
                    })
                    .collect();
                out += &format!("role:master\r\nconnected_slaves:{}\r\n", replicas.len());
                for (i, r) in replicas.iter().enumerate() {
                    out += &format!(
                        "slave{i}:ip={},port={},state=online,lag=0\r\n",
                        r.addr.host, r.addr.port
                    );
                }
                out += &format!("master_replid:{}\r\n", s.replid);
            }
            Some(m) => {
                out += &format!(
                    "role:slave\r\nmaster_host:{}\r\nmaster_port:{}\r\nmaster_link_status:{}\r\n\
                     master_last_io_seconds_ago:0\r\nmaster_sync_in_progress:0\r\n\
                     master_replid:{}\r\nslave_repl_offset:{}\r\nslave_priority:{}\r\n\
                     slave_read_only:1\r\n",
                    m.host,
                    m.port,
                    if self.linked(s) { "up" } else { "down" },
                    s.replid,
                    s.offset,
                    s.priority
                );
            }
        }
        out += "# Keyspace\r\n";
        if s.offset > 0 {
            out += &format!("db0:keys={},expires=0,avg_ttl=0\r\n", s.offset);
        }
        out
    }

    /// Every 10 virtual ms: Dragonfly replicas notice a lost master and
    /// try it again every 500 ms, continue a history it continues and copy
    /// it otherwise. Returns the full copies taken (`(replica, from,
    /// had, got)`).
    pub(super) fn dragonfly_links(&mut self, ms: u64) -> Vec<(Addr, Addr, u64, u64)> {
        let masters: Vec<Server> = self
            .0
            .iter()
            .filter(|m| m.alive && m.master.is_none() && ms >= m.loading_until)
            .cloned()
            .collect();
        let mut lost = Vec::new();
        for s in self.0.iter_mut().filter(|s| s.dragonfly && s.alive) {
            if s.stopping_at.is_some() {
                continue;
            }
            let Some(to) = s.master.clone() else {
                s.sync_due = None;
                continue;
            };
            let m = masters.iter().find(|m| m.addr == to);
            match s.sync_due {
                None if m.is_none() => {
                    s.sync_due = Some(ms + RETRY_MS);
                    s.asked = false;
                }
                Some(due) if ms >= due => match m {
                    Some(m) if m.continues(&s.replid, s.offset) => {
                        s.replid.clone_from(&m.replid);
                        s.sync_due = None;
                        s.asked = false;
                    }
                    Some(_) if s.break_replication && !s.asked => {
                        // "Encountered different master repl id": it stays
                        // a replica, link down, until a `REPLICAOF`.
                        s.sync_due = Some(STOPPED);
                    }
                    Some(m) => {
                        s.asked = false;
                        lost.push((s.addr.clone(), m.addr.clone(), s.offset, m.offset));
                        s.offset = m.offset;
                        s.lineage = m.lineage;
                        s.replid.clone_from(&m.replid);
                        s.replid2 = None;
                        s.sync_due = None;
                    }
                    None => s.sync_due = Some(due + RETRY_MS * ((ms - due) / RETRY_MS + 1)),
                },
                _ => {}
            }
        }
        lost
    }
}

impl Sim {
    /// `REPLICAOF host port` on Dragonfly `replica`, as the server takes
    /// it.
    fn df_replicaof(&mut self, replica: &Addr, master: &Addr) -> Replicaof {
        let ms = self.ms;
        let target = self.servers.get(master).cloned();
        let r = self.servers.get_mut(replica);
        if r.stopping_at.is_some() {
            return Replicaof::Refused("replication cancelled".into());
        }
        if r.master.as_ref() == Some(master) && r.sync_due.is_none() {
            return Replicaof::Done;
        }
        match target {
            Some(m) if m.alive && m.master.is_none() => {
                r.master = Some(master.clone());
                r.sync_due = Some(ms);
                r.asked = true;
                Replicaof::Done
            }
            Some(m) if m.alive && m.stopping_at.is_some() => {
                Replicaof::Waits(m.stopping_at.unwrap_or(ms))
            }
            Some(m) if m.alive => Replicaof::Refused(format!(
                "could not greet master {master}: Replicating a replica is unsupported"
            )),
            _ => Replicaof::Refused(format!("could not connect to master {master}")),
        }
    }

    /// Daemon `i`'s promotion of Dragonfly `candidate` (`REPLICAOF NO
    /// ONE`, and with `flush` a `FLUSHALL`): at once on a replica that is
    /// connected, at the end of its retry's sleep on one that lost its
    /// master.
    pub(super) fn df_promote(
        &mut self,
        i: usize,
        epoch: u64,
        candidate: &Addr,
        flush: bool,
        restarted: Option<String>,
    ) -> Option<Internal> {
        let done = |r| Some(Internal::Failover(epoch, Input::Promoted(r)));
        if !self.reaches(i, candidate) {
            return done(Err(PromoteError::Promotion(format!(
                "{candidate}: unreachable"
            ))));
        }
        if let Some(why) = restarted {
            return done(Err(PromoteError::CandidateRestarted(format!(
                "{candidate}: {why}"
            ))));
        }
        if self.failing_over(candidate) {
            return done(Err(PromoteError::Promotion(format!(
                "{candidate}: LOADING Dragonfly is loading the dataset in memory"
            ))));
        }
        let ms = self.ms;
        let s = self.servers.get_mut(candidate);
        let at = match (s.stopping_at, s.sync_due) {
            (Some(t), _) => t,
            // A replica stopped for good has no retry to wait for.
            (None, Some(due)) if s.master.is_some() && due != STOPPED => due.max(ms),
            _ => {
                s.promote(ms);
                s.sync_due = None;
                return done(Self::flushed(s, flush));
            }
        };
        s.stopping_at = Some(at);
        let promotion = Later::Promotion {
            epoch,
            candidate: candidate.clone(),
            flush,
        };
        self.push_later(at, i, self.daemons[i].ctx.clone(), promotion);
        None
    }

    fn flushed(s: &Server, flush: bool) -> Result<(), PromoteError> {
        if flush && s.misconf {
            Err(PromoteError::Flush(format!(
                "{}: MISCONF Errors writing to the AOF file",
                s.addr
            )))
        } else {
            Ok(())
        }
    }

    /// Daemon `i`'s re-point of Dragonfly `replica` to `master`, tried
    /// again every 20 ms for `retry_for` while refused.
    pub(super) fn df_repoint(
        &mut self,
        i: usize,
        epoch: Option<u64>,
        replica: Addr,
        master: Addr,
        retry_for: u64,
    ) -> Option<Internal> {
        if !self.reaches(i, &replica) {
            let e = CommandFailed(format!("{replica}: unreachable"));
            return repoint_sent(epoch, replica, Err(e));
        }
        if self.failing_over(&replica) {
            let e = CommandFailed(format!("{replica}: {REPLICAOF_REFUSED}"));
            return repoint_sent(epoch, replica, Err(e));
        }
        let (at, later) = match self.df_replicaof(&replica, &master) {
            Replicaof::Done => return repoint_sent(epoch, replica, Ok(())),
            Replicaof::Refused(e) if retry_for == 0 => {
                let e = CommandFailed(format!("{replica}: {e}"));
                return repoint_sent(epoch, replica, Err(e));
            }
            Replicaof::Refused(_) => (
                self.ms + REPOINT_RETRY_MS,
                Later::Retry {
                    epoch,
                    replica,
                    master,
                    until: self.ms + retry_for,
                },
            ),
            Replicaof::Waits(at) => (
                at,
                Later::Greets {
                    epoch,
                    replica,
                    master,
                    demote: false,
                },
            ),
        };
        self.push_later(at, i, self.daemons[i].ctx.clone(), later);
        None
    }

    /// An answer to daemon `i` (in the life `ctx`) that comes at `at`.
    fn push_later(&mut self, at: u64, daemon: usize, ctx: Arc<DaemonCtx>, what: Later) {
        self.dragonfly_pending.push(Pending {
            at,
            daemon,
            ctx,
            what,
        });
    }

    /// Daemon `i`'s demotion of Dragonfly server `a` to `master`
    /// (`REPLICAOF`, then `CLIENT KILL LADDR`, which changes nothing
    /// here).
    pub(super) fn df_demote(&mut self, i: usize, a: Addr, master: Addr) -> Option<Internal> {
        let refused = |e: &str| Err(RespError::Server(crate::resp::classify_error(e)));
        if !self.reaches(i, &a) {
            return Some(Internal::Demoted(a, Err(RespError::Closed)));
        }
        if self.failing_over(&a) {
            let r = refused("LOADING Dragonfly is loading the dataset in memory");
            return Some(Internal::Demoted(a, r));
        }
        match self.df_replicaof(&a, &master) {
            Replicaof::Done => Some(Internal::Demoted(a, Ok(()))),
            Replicaof::Refused(e) => Some(Internal::Demoted(a, refused(&format!("ERR {e}")))),
            Replicaof::Waits(at) => {
                let greets = Later::Greets {
                    epoch: None,
                    replica: a,
                    master,
                    demote: true,
                };
                self.push_later(at, i, self.daemons[i].ctx.clone(), greets);
                None
            }
        }
    }

    /// Every 10 virtual ms: a dead server forgets its waiting `REPLICAOF
    /// NO ONE`; the answers due now come, promotions first (a re-point
    /// that waited on one greets the master it made).
    pub(super) async fn step_dragonfly(&mut self) {
        let ms = self.ms;
        for s in self.servers.0.iter_mut().filter(|s| !s.alive) {
            s.stopping_at = None;
        }
        let due: Vec<Addr> = self
            .servers
            .0
            .iter()
            .filter(|s| !s.alive && s.restart_at.is_some_and(|t| t <= ms))
            .map(|s| s.addr.clone())
            .collect();
        for a in due {
            let s = self.servers.get_mut(&a);
            s.alive = true;
            s.restart_at = None;
            let before = s.restart_empty(ms);
            self.mark_emptied(&a, &before);
            self.note(self.daemons.len(), format!("{a} started again, empty"));
        }
        let mut due: Vec<Pending> = Vec::new();
        let mut k = 0;
        while k < self.dragonfly_pending.len() {
            if self.dragonfly_pending[k].at <= ms {
                due.push(self.dragonfly_pending.remove(k));
            } else {
                k += 1;
            }
        }
        // In the order the commands reached the servers (Dragonfly runs
        // `REPLICAOF` commands to one server one after the other), except
        // that a replica greets a master whose promotion answers at the
        // same moment after it. Promotions first, before: a `REPLICAOF`
        // sent to a server before another daemon's `REPLICAOF NO ONE` was
        // applied after it, and left a replica the master that the newer
        // epoch had just promoted (the simulation on Dragonfly, seed 45).
        due.sort_by_key(|p| p.at);
        let promoted: Vec<(Addr, usize)> = due
            .iter()
            .enumerate()
            .filter_map(|(k, p)| match &p.what {
                Later::Promotion { candidate, .. } => Some((candidate.clone(), k)),
                _ => None,
            })
            .collect();
        let mut keyed: Vec<(usize, Pending)> = due
            .into_iter()
            .enumerate()
            .map(|(k, p)| {
                let after = match &p.what {
                    Later::Greets { master, .. } => {
                        promoted.iter().find(|(c, _)| c == master).map(|(_, j)| *j)
                    }
                    _ => None,
                };
                (after.map_or(2 * k, |j| 2 * k.max(j) + 1), p)
            })
            .collect();
        keyed.sort_by_key(|(key, _)| *key);
        let due = keyed.into_iter().map(|(_, p)| p);
        for p in due {
            let result = match p.what {
                Later::Promotion {
                    epoch,
                    candidate,
                    flush,
                } => {
                    let s = self.servers.get_mut(&candidate);
                    let r = if s.alive && s.stopping_at == Some(p.at) {
                        s.stopping_at = None;
                        s.promote(ms);
                        s.sync_due = None;
                        Self::flushed(s, flush)
                    } else {
                        Err(PromoteError::Promotion(format!(
                            "{candidate}: connection closed"
                        )))
                    };
                    self.note(p.daemon, format!("{candidate} answers REPLICAOF NO ONE"));
                    if r.is_ok() && self.same_life(p.daemon, &p.ctx) {
                        self.promoted.insert((p.daemon, epoch));
                    }
                    Some(Internal::Failover(epoch, Input::Promoted(r)))
                }
                Later::Greets {
                    epoch,
                    replica,
                    master,
                    demote,
                } => {
                    let up = self
                        .servers
                        .get(&master)
                        .is_some_and(|m| m.alive && m.master.is_none());
                    let alive = self.servers.get(&replica).is_some_and(|r| r.alive);
                    let r = if up && alive {
                        let r = self.servers.get_mut(&replica);
                        r.master = Some(master.clone());
                        r.sync_due = Some(ms);
                        r.asked = true;
                        Ok(())
                    } else {
                        Err(format!("{replica}: could not greet master {master}"))
                    };
                    if demote {
                        Some(Internal::Demoted(
                            replica,
                            r.map_err(|e| {
                                RespError::Server(crate::resp::classify_error(&format!("ERR {e}")))
                            }),
                        ))
                    } else {
                        repoint_sent(epoch, replica, r.map_err(CommandFailed))
                    }
                }
                Later::Retry {
                    epoch,
                    replica,
                    master,
                    until,
                } => {
                    let alive = self.servers.get(&replica).is_some_and(|r| r.alive);
                    let tried = if alive {
                        self.df_replicaof(&replica, &master)
                    } else {
                        Replicaof::Refused(format!("{replica}: connection closed"))
                    };
                    let r = match tried {
                        Replicaof::Done => Ok(()),
                        Replicaof::Refused(e) if ms + REPOINT_RETRY_MS >= until => {
                            Err(CommandFailed(format!("{replica}: {e}")))
                        }
                        Replicaof::Refused(_) => {
                            let again = Later::Retry {
                                epoch,
                                replica,
                                master,
                                until,
                            };
                            self.push_later(ms + REPOINT_RETRY_MS, p.daemon, p.ctx, again);
                            continue;
                        }
                        Replicaof::Waits(at) => {
                            let greets = Later::Greets {
                                epoch,
                                replica,
                                master,
                                demote: false,
                            };
                            self.push_later(at, p.daemon, p.ctx, greets);
                            continue;
                        }
                    };
                    repoint_sent(epoch, replica, r)
                }
            };
            if let Some(r) = result {
                self.feed_back(p.daemon, &p.ctx, r).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::addr;
    use super::*;
    use crate::group::effects::Work;
    use crate::probe::info::parse_info;
    use crate::probe::reboot::Identity;

    /// Three daemons (quorum 2) watching Dragonfly servers.
    fn dragonfly_sim(seed: u64, break_replication: bool) -> Sim {
        let mut sim = Sim::new(3, 2, seed);
        for s in &mut sim.servers.0 {
            s.dragonfly = true;
            s.break_replication = break_replication;
        }
        sim
    }

    /// Kill the master, 7000, and start it again empty `down` ms later.
    async fn bounce_master_empty(sim: &mut Sim, down: u64) {
        let m = addr(7000);
        sim.servers.get_mut(&m).alive = false;
        sim.run_for(down).await;
        let ms = sim.ms;
        let s = sim.servers.get_mut(&m);
        s.alive = true;
        let before = s.restart_empty(ms);
        sim.mark_emptied(&m, &before);
    }

    fn offset(sim: &Sim, port: u16) -> u64 {
        sim.servers.get(&addr(port)).map_or(0, |s| s.offset)
    }

    /// The documented race on Dragonfly (docs/reliability.md, "Crashes and
    /// restarts"): the replicas try their lost master again 500 ms after
    /// the kill and would copy it, empty; the candidate's `REPLICAOF NO
    /// ONE` answers only then, and the other replica's re-point, sent
    /// beside it, greets the candidate at that moment, before its own
    /// retry could copy anything.
    #[tokio::test]
    async fn a_dragonfly_master_bounced_empty_is_failed_over_before_its_replicas_copy_it() {
        let mut sim = dragonfly_sim(11, false);
        sim.run_for(3_000).await;
        let kill = sim.ms;
        bounce_master_empty(&mut sim, 100).await;
        sim.run_for(5_000).await;
        let new = addr(7001);
        for d in &sim.daemons {
            assert_eq!(d.g.master, new, "{}: {:#?}", d.ctx.id, sim.trace);
        }
        let promote = sim.at("promote 127.0.0.1:7001");
        let beside = sim.at("repoint 127.0.0.1:7002 to 127.0.0.1:7001");
        let answer = sim.at("127.0.0.1:7001 answers REPLICAOF NO ONE");
        let publish = sim.at("publish 127.0.0.1:7001");
        assert!(
            promote < beside && beside < answer && answer < publish,
            "{:#?}",
            sim.trace
        );
        let answered_at = sim.trace[answer].0;
        assert!(
            answered_at >= kill + RETRY_MS,
            "the answer waits for the retry's sleep: {answered_at} ms, kill at {kill} ms"
        );
        assert!(offset(&sim, 7001) > 1000 && offset(&sim, 7002) > 1000);
        sim.assert_followed(7001, &[7000, 7002]);
        sim.assert_no_violation();
    }

    /// The server model: with the flag, replicas whose master came back
    /// in another history keep their data and wait; without it they copy
    /// the empty server at their next retry. No daemon runs.
    #[tokio::test]
    async fn break_replication_keeps_a_replica_off_a_master_restarted_empty() {
        for (flag, kept) in [(true, true), (false, false)] {
            let mut sim = dragonfly_sim(12, flag);
            sim.run_for(2_000).await;
            for i in 0..3 {
                sim.crash(i);
            }
            let before = offset(&sim, 7002);
            bounce_master_empty(&mut sim, 100).await;
            sim.run_for(2_000).await;
            let r = sim.servers.get(&addr(7002)).expect("7002");
            assert_eq!(
                r.offset >= before,
                kept,
                "flag {flag}: {} then {}",
                before,
                r.offset
            );
            assert_eq!(r.sync_due == Some(STOPPED), flag);
            assert!(!sim.servers.linked(r) || !flag);
        }
    }

    /// `REPLTAKEOVER`: the candidate catches up and takes over, the old
    /// master exits, the new one is published after; the old master,
    /// started again empty by its supervisor (a master of its own, in a
    /// new history), is made a replica.
    #[tokio::test]
    async fn a_dragonfly_switchover_takes_over_and_the_old_master_exits() {
        let mut sim = dragonfly_sim(13, true);
        sim.run_for(3_000).await;
        sim.switchover_asked(0).await;
        sim.run_for(3_000).await;
        let new = addr(7001);
        for d in &sim.daemons {
            assert_eq!(d.g.master, new, "{}: {:#?}", d.ctx.id, sim.trace);
        }
        let handed = sim.at("127.0.0.1:7000 handed over to 127.0.0.1:7001");
        let publish = sim.at("publish 127.0.0.1:7001");
        assert!(
            sim.at("fence") < handed && handed < publish,
            "{:#?}",
            sim.trace
        );
        let exited = sim.trace[handed].0;
        let started = sim.at("127.0.0.1:7000 started again, empty");
        assert!(sim.trace[started].0 >= exited + 1_000, "{:#?}", sim.trace);
        sim.run_for(3_000).await;
        sim.assert_followed(7001, &[7000, 7002]);
        assert_eq!(sim.routing, (1, Some(new)));
        sim.assert_no_violation();
    }

    /// A candidate restarted (empty, a master of its own) after it was
    /// chosen: neither promoted nor copied through a re-point sent beside
    /// its promotion. Dragonfly has no `run_id`: its uptime tells.
    #[tokio::test]
    async fn a_dragonfly_candidate_restarted_since_it_was_chosen_is_neither_promoted_nor_copied() {
        let mut sim = dragonfly_sim(15, true);
        sim.run_for(3_000).await;
        for i in 0..3 {
            sim.crash(i);
        }
        let (cand, other) = (addr(7001), addr(7002));
        let chosen = sim
            .servers
            .get(&cand)
            .map(|s| Identity::of(&parse_info(&sim.servers.info(s, sim.ms))));
        assert!(chosen.as_ref().is_some_and(|c| c.uptime_secs >= Some(2)));
        let held = offset(&sim, 7002);
        let ms = sim.ms;
        let before = sim.servers.get_mut(&cand).restart_empty(ms);
        sim.mark_emptied(&cand, &before);
        sim.run_for(100).await;
        let repoint = |master_chosen| Work::Repoint {
            epoch: Some(1),
            replica: other.clone(),
            flavour: crate::probe::Flavour::Dragonfly,
            master: cand.clone(),
            retry_for: Duration::from_millis(500),
            master_chosen,
        };
        let r = sim.carry_out(0, repoint(chosen.clone())).await;
        assert!(
            matches!(&r, Some(Internal::Failover(_, Input::RepointSent(_, Err(e)))) if e.0.contains("restarted since it was chosen")),
            "{r:?}"
        );
        let promote = Work::Promote {
            epoch: 1,
            candidate: cand.clone(),
            flavour: crate::probe::Flavour::Dragonfly,
            flush: false,
            chosen: chosen.clone(),
        };
        let r = sim.carry_out(0, promote).await;
        assert!(
            matches!(
                r,
                Some(Internal::Failover(
                    _,
                    Input::Promoted(Err(PromoteError::CandidateRestarted(_)))
                ))
            ),
            "{r:?}"
        );
        sim.run_for(1_000).await;
        assert_eq!(
            sim.servers.get(&other).and_then(|s| s.master.clone()),
            Some(addr(7000))
        );
        assert!(offset(&sim, 7002) >= held);
        // Unchecked, the same re-point goes through: the check is what
        // keeps the replica off the restarted server.
        let r = sim.carry_out(0, repoint(None)).await;
        assert!(
            r.is_none()
                || matches!(
                    r,
                    Some(Internal::Failover(_, Input::RepointSent(_, Ok(()))))
                ),
            "{r:?}"
        );
        sim.run_for(1_000).await;
        assert_eq!(
            sim.servers.get(&other).and_then(|s| s.master.clone()),
            Some(cand)
        );
    }

    /// Dragonfly refuses a replica of a replica and leaves the replica's
    /// replication as it was; a `REPLICAOF` to a replica whose `REPLICAOF
    /// NO ONE` waits greets it when that answers.
    #[tokio::test]
    async fn a_dragonfly_replica_refuses_a_replica_as_its_master() {
        let mut sim = dragonfly_sim(14, false);
        sim.run_for(1_000).await;
        let (r, other) = (addr(7002), addr(7001));
        assert!(matches!(
            sim.df_replicaof(&r, &other),
            Replicaof::Refused(e) if e.contains("Replicating a replica is unsupported")
        ));
        assert_eq!(
            sim.servers.get(&r).and_then(|s| s.master.clone()),
            Some(addr(7000))
        );
        sim.servers.get_mut(&other).stopping_at = Some(sim.ms + 300);
        assert!(matches!(sim.df_replicaof(&r, &other), Replicaof::Waits(t) if t == sim.ms + 300));
        assert_eq!(
            sim.servers.get(&r).and_then(|s| s.master.clone()),
            Some(addr(7000))
        );
    }
}

//! Step 9 and topology repair outside failovers: a returning old master
//! (or any stray master) is demoted as soon as it answers, and a replica
//! of the wrong master is re-pointed — only while this daemon's view is
//! confirmed by a majority and its own master looks sane.

use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::Group;
use super::effects::Work;
use crate::addr::Addr;
use crate::events::{Detail, EventKind};
use crate::metrics as m;
use crate::probe::Role;
use crate::quorum::peers::HelloGroup;
use crate::quorum::table::PEER_TTL;
use crate::resp::RespError;

/// How long a replica promoted in place is left a master before this
/// daemon takes it for a stray: four hello periods, as Sentinel waits four
/// publish periods before it converts a replica that turned master, for
/// the leader's hello with the newer config to arrive through a lost
/// message or two, a stalled daemon or a link down one way for a moment.
/// With two, a daemon that had not heard the leader for 2 s demoted the
/// master of the newer config, and the daemons never agreed again: the
/// others do not adopt a config whose master reports `role:slave` (the
/// simulation with the network's faults, seed 176).
pub(super) const PROMOTED_GRACE: Duration = Duration::from_secs(4);

/// When `inst` last appeared as what it is now: its role changed, it was
/// connected again, or it answered again after it was down. A stray
/// master is demoted only once a majority's hellos came after that: a
/// replica the other daemons promoted while this daemon was cut off,
/// stalled or restarting, or whose promotion it did not see, looks here
/// exactly like a returning old master or a restarted replica, and only
/// the peers' configs tell them apart (the simulation: seed 594, a
/// daemon back from a cut of 2.6 s demoted the master published
/// meanwhile, 80 ms after the cut healed; 497 and 628, the same after the
/// daemon's own master or the stray restarted). The hello exchange it
/// asks for answers within a round trip.
fn appeared_at(inst: &super::observe::Instance) -> Option<Instant> {
    [inst.role_changed_at, inst.connected_at, inst.up_again_at]
        .into_iter()
        .flatten()
        .max()
}

impl Group {
    /// Whether this daemon may reconfigure instances on its own: not in
    /// TILT, no election or failover, and its config confirmed by a
    /// majority (its own view is not stale).
    pub(super) fn may_reconfigure(&self, now: Instant) -> bool {
        if self.failover.is_some() || self.election.busy() || self.ctx.tilt.active(now) {
            return false;
        }
        let mut confirmed = 1;
        for e in self.peers.iter() {
            // Any peer known to hold a newer config, however old its hello:
            // this daemon's view is stale and must not act on it.
            if e.group(&self.cfg.name)
                .is_some_and(|g| g.config_epoch > self.config_epoch)
            {
                return false;
            }
            // A peer that leads an election or failover newer than this
            // daemon's config, by its last hello within the TTL: the
            // replica it promotes is a master before its config comes (the
            // simulation, seed 351 with operations: a daemon just
            // restarted demoted it on that leader's hello of a moment
            // before its publication).
            // So too a peer that voted for such a leader (`stand_back`):
            // a daemon just restarted, on its old config, demoted the
            // master the others were failing over, which a voter's
            // confirmation of that old config made look like a stray (the
            // simulation with every fault, seed 3765).
            if e.hello_within(now, PEER_TTL)
                && e.group(&self.cfg.name)
                    .is_some_and(|g| self.fails_over_past_config(now, g))
            {
                return false;
            }
            // Only a recent hello confirms the peer's config; an answer to
            // IS-DOWN proves it is alive, not what it believes (a daemon
            // back from a partition hears answers before hellos).
            if e.hello_within(now, PEER_TTL) {
                confirmed += 1;
            }
        }
        confirmed >= self.ctx.majority()
    }

    /// The replica a leader is promoting in the newest epoch newer than
    /// this daemon's config that it knows of: from its own election (it
    /// leads, voted, or was asked for a vote), or announced by a peer's
    /// hello within the TTL. The peer's word counts because a daemon that
    /// was cut off during the election hears of the promotion only from
    /// the voters until the leader's config reaches it: the simulation
    /// with the network's faults, seed 728, a daemon back from an
    /// isolation demoted the master published 220 ms before, on the hello
    /// of a voter that had not adopted its config yet.
    ///
    /// Its own knowledge counts as long as it announces it
    /// (`failover_timeout` from when it learnt it, the time a leader has
    /// to promote and publish), or while it runs that failover itself.
    /// Kept for good, an election lost before any promotion left the
    /// replica it named, a stray master, neither demoted nor re-pointed
    /// by any daemon that had taken part (the simulation with every
    /// fault, seed 3960: two candidates of a split election named the old
    /// master, back as a master, and it never followed the master the
    /// group kept).
    pub(super) fn intended_promotion(&self, now: Instant) -> Option<Addr> {
        let running = self.failover.as_ref().map(|f| f.machine.epoch);
        let own = self
            .election
            .intention(self.config_epoch)
            .filter(|(epoch, _)| Some(*epoch) == running)
            .or_else(|| self.election.announced_intention(now, self.config_epoch));
        self.peers
            .iter()
            .filter(|e| e.hello_within(now, PEER_TTL))
            .filter_map(|e| e.group(&self.cfg.name)?.promoting.as_ref())
            .filter(|p| p.epoch > self.config_epoch)
            .map(|p| (p.epoch, &p.replica))
            .chain(own)
            .max_by_key(|(epoch, _)| *epoch)
            .map(|(_, a)| a.clone())
    }

    /// A peer's hello within the TTL says a leader fails the master over
    /// in an epoch newer than this daemon's config: the peer leads it, or
    /// voted for its leader (see `Observation::promotion_out`).
    pub(super) fn peer_failing_over(&self, now: Instant) -> bool {
        self.peers
            .iter()
            .filter(|e| e.hello_within(now, PEER_TTL))
            .filter_map(|e| e.group(&self.cfg.name))
            .any(|g| self.fails_over_past_config(now, g))
    }

    /// A peer's hello `g` says a leader fails over in an epoch newer than
    /// this daemon's config: the peer leads it, or voted for a leader that
    /// has not said since that it stopped.
    fn fails_over_past_config(&self, now: Instant, g: &HelloGroup) -> bool {
        g.failing_over_past(self.config_epoch, |epoch, leader| {
            self.leader_stopped(now, epoch, leader)
        })
    }

    /// The leader `leader` is known not to fail over in `epoch` any more:
    /// it is this daemon (whose own election and failover say what runs),
    /// or its hello within the TTL was sent after it began that epoch
    /// (its current epoch is at least that one: a leader's epoch is one
    /// it began, never one it voted in) and names no failover of that
    /// epoch or a newer one. Without this, the vote of a leader that
    /// aborted at once held every daemon that heard of it back for the
    /// whole `failover_timeout` (the simulation with every fault, seed
    /// 3434: the master, back empty, stayed down 8 s longer, and the
    /// group did not settle). A leader cut off from everyone is not heard
    /// and stays stood back for (seed 855).
    fn leader_stopped(&self, now: Instant, epoch: u64, leader: &str) -> bool {
        if leader == self.ctx.id {
            return true;
        }
        self.peers.iter().any(|e| {
            e.id.as_deref() == Some(leader)
                && e.hello_within(now, PEER_TTL)
                && e.hello.as_ref().is_some_and(|h| h.current_epoch >= epoch)
                && e.group(&self.cfg.name)
                    .is_some_and(|g| g.failover_epoch.is_none_or(|f| f < epoch))
        })
    }

    /// `addr` is up and reports `role:master` on an INFO read on its
    /// current connection.
    pub(super) fn reports_master_now(&self, addr: &Addr) -> bool {
        self.instances
            .get(addr)
            .is_some_and(|i| i.fresh() && i.info.as_ref().is_some_and(|x| x.role == Role::Master))
    }

    /// `addr` reports `role:slave` on an INFO read on its current
    /// connection.
    pub(super) fn reports_replica_now(&self, addr: &Addr) -> bool {
        self.instances
            .get(addr)
            .is_some_and(|i| i.fresh() && i.info.as_ref().is_some_and(|x| x.role == Role::Replica))
    }

    /// `addr` is down, or reports `role:slave` on an INFO read on its
    /// current connection.
    pub(super) fn not_a_master_now(&self, addr: &Addr) -> bool {
        self.instances.get(addr).is_some_and(|i| i.sdown.is_down())
            || self.reports_replica_now(addr)
    }

    /// Since when the master this daemon's config names has looked sane
    /// (a master on an INFO of its current connection, not a restart
    /// still to be judged) without a break, if it does now.
    fn track_master_sane(&mut self, now: Instant) -> Option<Instant> {
        let master = &self.master;
        let sane = self.reports_master_now(master)
            && self
                .instances
                .get(master)
                .is_some_and(|i| !i.reboot_unjudged);
        self.master_sane_since = match self.master_sane_since.take() {
            Some((a, t)) if sane && a == *master => Some((a, t)),
            _ if sane => Some((master.clone(), now)),
            _ => None,
        };
        self.master_sane_since.as_ref().map(|(_, t)| *t)
    }

    pub(super) fn check_topology(&mut self, now: Instant) {
        self.confirm_start_config();
        // Not held back with the repairs: it only publishes a config this
        // daemon adopted, as the leader did.
        self.publish_adopted_when_due();
        let master = self.master.clone();
        let sane_since = self.track_master_sane(now);
        if !self.may_reconfigure(now) {
            return;
        }
        self.publish_current_if_needed();
        let master_up = self
            .instances
            .get(&master)
            .is_some_and(|i| !i.sdown.is_down());
        // Sentinel's "master looks sane": up, and a master on a fresh INFO.
        // Only then is another instance that reports role:master a stray to
        // demote. With the master down (or not a master), that instance is
        // far more likely a replica that a leader has just promoted, whose
        // new config has not reached this daemon yet: demoting it would
        // undo the failover and trigger a second one.
        // A master that restarted and is not judged yet (its replicas'
        // holdings still to be read) is not sane either: it may be the
        // empty server the others have already failed over.
        let master_sane = sane_since.is_some();
        let master_read_at = self.instances.get(&master).and_then(|i| i.info_at);
        let mut reread_master = false;
        let mut reread = Vec::new();
        let intended = self.intended_promotion(now);
        // Unless announce_hostnames, a replica must follow the master by its
        // IP: a replica told a name resolves it on its own main thread at
        // each reconnect (Redis does), and stalls for the resolver's
        // timeout when the name is gone with the master's container.
        let master_id = if self.cfg.announce_hostnames {
            (master.clone(), self.ip_of(&master))
        } else {
            (self.wire(&master), None)
        };
        let intended_id = intended.as_ref().map(|a| (a.clone(), self.ip_of(a)));
        // This daemon and the peers whose hello came after `t`: with a
        // majority of them, no newer config was in flight at `t` that this
        // daemon has not heard (it would have come with a hello, and
        // `may_reconfigure` would have stood this daemon down).
        let peers = self.peers.clone();
        let majority = self.ctx.majority();
        let heard_by_majority_since = |t: Instant| {
            1 + peers
                .iter()
                .filter(|e| e.last_hello.is_some_and(|h| h >= t))
                .count()
                >= majority
        };
        // A daemon just started waits as long for the peers' configs (as
        // Sentinel waits four publish periods after it creates an
        // instance): the confirmation of its own by a majority may come
        // from peers as stale as itself (the simulation with every fault,
        // seed 11353: two daemons of the old epoch, the one that had led
        // the newer failover down for 11 s; back at once with one of
        // them, the other demoted the master it had published, 160 ms
        // before its hello came).
        let just_started = now.saturating_duration_since(self.started) < PROMOTED_GRACE;
        let mut awaiting_hellos: Option<Instant> = None;
        let mut demote = Vec::new();
        let mut repoint = Vec::new();
        let admin_port = self.cfg.admin_port;
        for inst in self.instances.values_mut() {
            if inst.addr == master || Some(&inst.addr) == intended.as_ref() {
                inst.wrong_master_since = None;
                continue;
            }
            if !inst.fresh() {
                continue;
            }
            let Some(info) = inst.info.as_ref() else {
                continue;
            };
            if inst
                .last_action
                .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
            {
                continue;
            }
            match info.role {
                // A returning old master (or any stray master): demoted
                // before anything could route to it (invariant 6), once
                // the master was read as a master since this one turned
                // master (read again now if not): a daemon that stalled, or
                // whose probe of a dead master has not failed yet, holds a
                // master's INFO from before. A replica promoted in place
                // (not a server that came back as a master) is left
                // PROMOTED_GRACE for a newer config to arrive: the
                // leader's hello goes out at its publication and every
                // second after. Demoting it before undid a failover this
                // daemon had not heard of (the simulation with the
                // network's faults, seed 37: a daemon of the old epoch
                // demoted the replica just promoted, as the old master had
                // come back, and the group never settled).
                Role::Master
                    if master_sane
                        && (just_started
                            || inst.promoted_in_place_at.is_some_and(|t| {
                                now.saturating_duration_since(t) < PROMOTED_GRACE
                            })) => {}
                // Not before a majority's hellos came after it appeared
                // (`appeared_at`), and after the master last turned sane:
                // meanwhile the daemon waits, and has asked for them. A
                // stray that has been a master all along becomes one to
                // demote only when this daemon's master looks sane again,
                // and hellos from before that say nothing of an election
                // begun while the master was down, whose leader may be
                // making that stray the master (the simulation with every
                // fault, seed 30569: a daemon stalled 0.8 s while its
                // master was down demoted, 60 ms after the master came
                // back, the stray the others had just published at a newer
                // epoch, on hellos from before their election).
                Role::Master
                    if master_sane
                        && [appeared_at(inst), sane_since]
                            .into_iter()
                            .flatten()
                            .max()
                            .is_some_and(|t| !heard_by_majority_since(t)) =>
                {
                    awaiting_hellos = awaiting_hellos.max(appeared_at(inst)).max(sane_since);
                }
                Role::Master if master_sane => {
                    let confirmed = match (inst.role_changed_at, master_read_at) {
                        (Some(turned), Some(read)) => read >= turned,
                        (None, read) => read.is_some(),
                        (Some(_), None) => false,
                    };
                    if confirmed {
                        inst.last_action = Some(now);
                        demote.push((inst.addr.clone(), info.flavour));
                    } else {
                        reread_master = true;
                    }
                }
                Role::Replica if master_up => {
                    let points_at = |(a, ip): &(Addr, Option<IpAddr>)| {
                        super::observe::names_master(info, a, *ip, admin_port)
                    };
                    // Following the replica a leader is promoting in a newer
                    // epoch is right too: its config is on the way.
                    let follows =
                        points_at(&master_id) || intended_id.as_ref().is_some_and(points_at);
                    if follows {
                        inst.wrong_master_since = None;
                    } else {
                        let since = *inst.wrong_master_since.get_or_insert(now);
                        // On an INFO read since it was first seen wrong
                        // (asked for now if none came): the one held may
                        // be from before a newer failover re-pointed or
                        // promoted it, when the replies are lost or the
                        // daemon stalled (the simulation with every fault,
                        // seed 9867: a daemon back from a stall re-pointed
                        // the master published meanwhile to the dead old
                        // one, on an INFO 1.4 s old).
                        let due = now.duration_since(since) >= Duration::from_millis(500);
                        if due && inst.info_at.is_some_and(|t| t > since) {
                            inst.last_action = Some(now);
                            repoint.push((inst.addr.clone(), info.flavour));
                        } else if due {
                            reread.push(inst.addr.clone());
                        }
                    }
                }
                _ => {}
            }
        }
        if reread_master {
            reread.push(master.clone());
        }
        for a in &reread {
            self.refresh_info(a);
        }
        // Asked once for each time waited from: the hellos' replies come
        // back within a round trip, and a peer's hello wakes the group to
        // look again. A stray that appears anew while one waits (it
        // answered again after its INFO) needs hellos from after that:
        // waiting for the periodic ones cost half a second on average.
        if awaiting_hellos > self.awaiting_hellos {
            self.ctx.hello_now.notify_one();
        }
        self.awaiting_hellos = awaiting_hellos;
        self.dirty |= !demote.is_empty() || !repoint.is_empty();
        for (addr, flavour) in demote {
            self.emit(EventKind::ConvertToSlave, &Detail::Replica(addr.clone()));
            tracing::info!(group = %self.cfg.name, instance = %addr, master = %master, "demoting a stray master");
            let master = self.wire(&master);
            self.effects.run(Work::Demote {
                addr,
                flavour,
                master,
            });
        }
        for (addr, flavour) in repoint {
            self.emit(EventKind::FixSlaveConfig, &Detail::Replica(addr.clone()));
            let master = self.wire(&master);
            self.effects.run(Work::Repoint {
                epoch: None,
                replica: addr,
                flavour,
                master,
                retry_for: Duration::ZERO,
                master_chosen: None,
            });
        }
    }

    pub(super) fn on_demoted(&mut self, addr: Addr, r: Result<(), RespError>) {
        match r {
            Ok(()) => {
                metrics::counter!(m::DEMOTIONS, "group" => self.label.clone()).increment(1);
                self.refresh_info(&addr);
            }
            Err(e) => {
                tracing::warn!(group = %self.cfg.name, instance = %addr, error = %e, "demotion failed; will retry");
            }
        }
    }
}

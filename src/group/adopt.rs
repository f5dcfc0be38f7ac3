//! The group's config (master and config epoch): adopting a new one (this
//! daemon's own publication, step 7, or a peer's), persisting it, and
//! publishing it to the discovery backends.

use std::time::Duration;

use tokio::time::Instant;

use super::effects::Work;
use super::observe::INFO_FAST;
use super::view::{FailoverOutcome, LastFailover};
use super::{Group, members};
use crate::addr::Addr;
use crate::discovery::runner::RunnerError;
use crate::discovery::{Reporter, Topology};
use crate::events::{Detail, EventKind};
use crate::metrics as m;
use crate::probe::Role;
use crate::quorum::peers::HelloGroup;
use crate::quorum::state::StateError;
use crate::resp::RespError;

impl Group {
    /// Make `master` the group's master with `epoch`, in memory at once
    /// (every caller persists and publishes it right after, see
    /// [`Group::persist_and_publish`]).
    ///
    /// A config that cannot be persisted (full disk) is still served from
    /// memory: it is the one a majority agreed on (this daemon's own
    /// promotion, which its peers adopt and persist, or a peer's config
    /// confirmed by the master's own role), and keeping the older one
    /// would send clients to a master that is no longer one. Forgetting it
    /// in a restart only makes this daemon stale until the next hello, like
    /// a daemon that was partitioned during the failover. The write is
    /// retried every second ([`Group::retry_persist_config`]).
    pub(super) fn adopt_master(
        &mut self,
        master: Addr,
        epoch: u64,
        reporter: Reporter,
        from: Option<&str>,
    ) {
        self.published_epoch = Some(epoch);
        self.start_announced = None;
        self.republish_due = None;
        let old = std::mem::replace(&mut self.master, master.clone());
        self.config_epoch = epoch;
        metrics::gauge!(m::CONFIG_EPOCH, "group" => self.label.clone()).set(epoch as f64);
        metrics::gauge!(m::GROUP_MASTER, "group" => self.label.clone(), m::SERVER_LABEL => old.to_string()).set(0.0);
        metrics::gauge!(m::GROUP_MASTER, "group" => self.label.clone(), m::SERVER_LABEL => master.to_string()).set(1.0);
        self.ensure_instance(&master);
        self.ensure_instance(&old);
        if let Some(i) = self.instances.get_mut(&old) {
            i.last_seen_master = true;
        }
        if old != master {
            // Sentinel converts an old master it cannot reach into a fresh
            // replica entry (role slave, no run id, no INFO yet); what it
            // last reported as a master says nothing about what it will be
            // when it comes back, and clients read `role-reported`.
            if let Some(i) = self.instances.get_mut(&old).filter(|i| !i.connected) {
                // Kept aside: when it comes back, a new process shows
                // against it (`+reboot`).
                i.identity_before = i.info.take().zip(i.info_at);
                i.info_at = None;
                i.role_changed_at = Some(self.now);
            }
            if let Some(from) = from {
                self.emit(
                    EventKind::ConfigUpdateFrom,
                    &Detail::Text(format!(
                        "sentinel {from} @ {} {} {}",
                        self.cfg.name, master.host, master.port
                    )),
                );
            }
            let (o, n) = (self.wire(&old), self.wire(&master));
            self.emit(
                EventKind::SwitchMaster,
                &Detail::Text(format!(
                    "{} {} {} {} {}",
                    self.cfg.name, o.host, o.port, n.host, n.port
                )),
            );
        }
        if old != master {
            self.election.on_master_changed(self.now, epoch);
        } else {
            self.election.on_master_kept(epoch);
        }
        self.master_role_down = false;
        if old != master {
            self.master_since = self.now;
            self.refresh_info(&master);
        }
        metrics::gauge!(m::MASTER_ODOWN, "group" => self.label.clone()).set(0.0);
        if reporter == Reporter::Observer && old != master {
            self.last_failover = Some(LastFailover {
                epoch,
                from: old.clone(),
                to: Some(master.clone()),
                outcome: FailoverOutcome::Observed,
                at_unix: self.unix_now,
                duration_ms: None,
            });
        }
        self.ctx.hello_now.notify_one();
        self.dirty = true;
        self.urgent = true;
        self.isolation_on_adopt();
    }

    /// Persist the adopted config, then publish `topology` to every
    /// backend. `machine`: the failover machine waits for the result.
    ///
    /// The leader writes first, at once, from what it knows as it
    /// promotes. A daemon that learnt the outcome from a peer persists it
    /// at once but publishes only when its turn comes, after a pause per
    /// rank ([`Group::publish_adopted_when_due`]), and then normally finds
    /// the objects already showing the epoch and writes nothing (three
    /// daemons writing one outcome at once fought with 409 Conflicts).
    pub(super) fn persist_and_publish(&mut self, topology: Topology, machine: bool) {
        let deadline = self.cfg.failover_timeout;
        self.config_persisting = true;
        self.epoch_publication = Some((topology.reporter, topology.old_master.clone()));
        self.persisted_known = self.known_servers();
        self.publication_read_asked = None;
        if topology.reporter == Reporter::Observer && !machine {
            // Not `topology`'s replicas: taken as the config is adopted,
            // they are those of the moment of the promotion (none follows
            // the new master yet), and written seconds later they took the
            // replica label off the pods the leader had labelled at this
            // epoch meanwhile (issue 27, a real API server: both replicas
            // lost it for 1.3 s after every failover).
            self.adopted_publication = Some(AdoptedPublication {
                epoch: topology.epoch,
                due: self.now + members::RANK_STEP * (1 + self.rank() as u32),
            });
            self.effects.run(Work::PersistConfig {
                epoch: topology.epoch,
                master: topology.master,
                known: self.persisted_known.clone(),
            });
            return;
        }
        self.adopted_publication = None;
        self.published_replicas = self.linked_replicas().cloned().collect();
        self.effects.run(Work::PersistAndPublish {
            topology,
            known: self.persisted_known.clone(),
            deadline,
            machine,
        });
    }

    /// Publish the config adopted from a peer once this daemon's turn
    /// comes, with the replicas linked to the master as read then
    /// ([`Group::read_for_publication`]), not as they were when the config
    /// came: every daemon publishes each epoch, and a later publication
    /// from an older view undoes what an earlier one wrote from a newer
    /// view at the same epoch (the backends' epoch check lets an equal
    /// epoch through).
    pub(super) fn publish_adopted_when_due(&mut self) {
        let Some(p) = &self.adopted_publication else {
            return;
        };
        if p.epoch != self.config_epoch || self.failover.is_some() {
            // A newer config came meanwhile, with its own publication; or
            // this daemon fails over in a newer epoch, whose fence the
            // backends hold, and whose outcome it publishes (the
            // simulation, seed 6876 with operations: the adopted epoch went
            // out after the newer one).
            self.adopted_publication = None;
            return;
        }
        if !self.read_for_publication(p.due) {
            return;
        }
        self.adopted_publication = None;
        let (reporter, old) = self
            .epoch_publication
            .clone()
            .unwrap_or((Reporter::Observer, None));
        self.publish_epoch_now(reporter, old);
    }

    /// Publish this epoch's config now, with the replicas linked as read
    /// now and what the epoch's first publication said (`reporter`, and
    /// `old`, the old master as it was written).
    fn publish_epoch_now(&mut self, reporter: Reporter, old: Option<Addr>) {
        self.publication_read_asked = None;
        self.published_replicas = self.linked_replicas().cloned().collect();
        let mut topology = self.topology(reporter, None);
        topology.old_master = old;
        self.effects.run(Work::Republish {
            topology,
            deadline: self.cfg.failover_timeout,
        });
    }

    /// Whether a publication whose turn comes at `due` may be made now:
    /// from INFO read after its turn came. At `due` every server is asked
    /// for INFO at once, and the publication waits for the replies that
    /// name its replicas ([`Group::read_since`]): a publication names the
    /// replicas linked to the master, and one made from a view older than
    /// another daemon's earlier write takes the replica label off a pod
    /// that daemon saw linked since. Servers that do not answer are waited
    /// for [`INFO_FAST`] at most (a publication that waited is made as
    /// before, from what is known).
    pub(super) fn read_for_publication(&mut self, due: Instant) -> bool {
        let now = self.now;
        if now < due {
            return false;
        }
        match self.publication_read_asked {
            Some(asked) if asked >= due => self.read_since(asked) || now >= asked + INFO_FAST,
            _ => {
                self.publication_read_asked = Some(now);
                let addrs: Vec<Addr> = self.instances.keys().cloned().collect();
                for a in &addrs {
                    self.refresh_info(a);
                }
                false
            }
        }
    }

    /// Whether what a publication names was read at or after `t`: the
    /// master's INFO, and, when that INFO shows no replica list to go by
    /// (a Dragonfly that hides it, a server not a master any more), the
    /// INFO of every replica that answers (one down or disconnected
    /// answers nothing and is not linked anyway).
    fn read_since(&self, t: Instant) -> bool {
        let read = |i: &super::observe::Instance| i.info_at.is_some_and(|at| at >= t);
        if !self.instances.get(&self.master).is_some_and(|i| read(i)) {
            return false;
        }
        super::observe::master_list(&self.instances, &self.master).is_some()
            || self
                .instances
                .values()
                .filter(|i| i.addr != self.master && i.connected && !i.sdown.is_down())
                .all(|i| read(i))
    }

    /// When a waiting publication is next due to be looked at (its turn,
    /// or the end of its wait for INFO), for the group task's timer; None
    /// when nothing waits or that time is past (the next tick or INFO
    /// looks at it).
    pub(super) fn publication_deadline(&self) -> Option<Instant> {
        let due = self
            .adopted_publication
            .as_ref()
            .map(|p| p.due)
            .or(self.republish_due)?;
        let at = match self.publication_read_asked {
            Some(asked) if asked >= due => asked + INFO_FAST,
            _ => due,
        };
        (at > self.now).then_some(at)
    }

    pub(super) fn on_published(
        &mut self,
        now: Instant,
        epoch: u64,
        persisted: Result<bool, StateError>,
        machine: bool,
        result: Result<(), RunnerError>,
    ) {
        self.on_config_persisted(epoch, persisted);
        if machine {
            self.on_failover_result(
                now,
                epoch,
                crate::failover::machine::Input::Published(result),
            );
        } else if let Err(e) = result {
            tracing::warn!(group = %self.cfg.name, epoch, error = %e, "publishing the config failed");
        }
    }

    pub(super) fn on_config_persisted(&mut self, epoch: u64, result: Result<bool, StateError>) {
        self.config_persisting = false;
        if epoch != self.config_epoch {
            return;
        }
        match result {
            Ok(_) => {
                if self.config_unpersisted {
                    tracing::info!(group = %self.cfg.name, master = %self.master, epoch, "the current master is persisted");
                }
                self.config_unpersisted = false;
            }
            Err(e) => {
                if !self.config_unpersisted {
                    tracing::error!(group = %self.cfg.name, error = %e, master = %self.master, epoch, "cannot persist the new master; serving it from memory and retrying");
                }
                self.config_unpersisted = true;
            }
        }
    }

    /// Persist a config that [`Group::adopt_master`] could only apply in
    /// memory, once the state file can be written again.
    pub(super) fn retry_persist_config(&mut self) {
        if !self.config_unpersisted || self.config_persisting {
            return;
        }
        self.write_config();
    }

    /// Write the servers the group knows again when they changed since the
    /// config was written (a replica learnt from the master's INFO after
    /// the failover, one forgotten), as Sentinel rewrites its config when
    /// it finds a replica. A daemon restarted later probes them from the
    /// start: without them, one that restarted while the master it knew was
    /// dead never heard of a replica that followed that master, and the
    /// failover it then led left that replica behind (the simulation with
    /// the network's faults, seed 535).
    pub(super) fn persist_known_servers(&mut self) {
        if self.config_unpersisted || self.config_persisting {
            return;
        }
        if self.known_servers() == self.persisted_known {
            return;
        }
        self.write_config();
    }

    /// Write the current config, with the servers known now.
    fn write_config(&mut self) {
        self.config_persisting = true;
        self.persisted_known = self.known_servers();
        self.effects.run(Work::PersistConfig {
            epoch: self.config_epoch,
            master: self.master.clone(),
            known: self.persisted_known.clone(),
        });
    }

    /// The servers this group probes besides its master, persisted with
    /// each config so that a restarted daemon probes them from the start.
    pub(super) fn known_servers(&self) -> Vec<Addr> {
        self.instances
            .keys()
            .filter(|a| **a != self.master)
            .cloned()
            .collect()
    }

    /// `old` when the master is no longer `old` (the `from` of a
    /// publication, as in Sentinel's client-reconfig-script arguments).
    pub(super) fn replaced(&self, old: Addr) -> Option<Addr> {
        (old != self.master).then_some(old)
    }

    pub(super) fn topology(&self, reporter: Reporter, old_master: Option<Addr>) -> Topology {
        Topology {
            group: self.cfg.name.clone(),
            epoch: self.config_epoch,
            // Backends get what clients get: IPs for named servers unless
            // announce_hostnames (a pod or an EndpointSlice is found by IP).
            master: self.wire(&self.master),
            old_master: old_master.map(|a| self.wire(&a)),
            // Only replicas linked to the master: a lone empty master (a
            // rescheduled pod) or a dead replica must never be published
            // or labelled as a replica.
            replicas: self.linked_replicas().map(|a| self.wire(a)).collect(),
            reporter,
        }
    }

    /// The start-up config's kept master has reported `role:master` since
    /// this daemon started: the hellos announce the epoch this daemon led
    /// from now on ([`Group::start_announced`]), and the peers adopt it.
    /// Not waiting for this daemon's own publication, which needs a
    /// majority's hellos, nor for an INFO read on the current connection:
    /// a master this daemon judges restarted with less is paused by it and
    /// answers no INFO, and only the peers' adoption of the epoch lets
    /// them publish past the fence it holds (seeds 422 and 1032 with every
    /// fault: the backends routed to nobody until the end).
    ///
    /// [`Group::start_announced`]: super::Group
    pub(super) fn confirm_start_config(&mut self) {
        let reported_master = self
            .instances
            .get(&self.master)
            .and_then(|i| i.info.as_ref())
            .is_some_and(|x| x.role == Role::Master);
        if self.start_announced.is_some() && reported_master && !self.switchover_out(self.now) {
            self.start_announced = None;
            self.dirty = true;
            self.ctx.hello_now.notify_one();
        }
    }

    /// Publish the current config once per config epoch when nobody did
    /// in this process yet (after a start or a restart), so that backends
    /// converge without waiting for a failover: only once the master itself
    /// reports `role:master` on a fresh INFO and a majority confirms the
    /// config. Backends refuse it if they hold a newer epoch.
    ///
    /// Within an epoch the publication is made again when the linked
    /// replicas change (a new member attached, a replica lost), after
    /// [`members::REPUBLISH_SETTLE`] plus [`members::RANK_STEP`] per rank:
    /// the first daemon writes, the others find the objects already so and
    /// write nothing.
    pub(super) fn publish_current_if_needed(&mut self) {
        if !self.reports_master_now(&self.master) {
            return;
        }
        if self.start_announced.is_some() && self.switchover_out(self.now) {
            // The kept master of a switchover this daemon led before a
            // restart: the server may still hand over.
            return;
        }
        if self.adopted_publication.is_some() {
            // This epoch's first publication by this daemon is still to come.
            return;
        }
        let now = self.now;
        let republish = self.published_epoch == Some(self.config_epoch);
        if republish {
            // Called at every INFO of the group: compared in place, not
            // collected.
            if self.linked_replicas().eq(self.published_replicas.iter()) {
                self.republish_due = None;
                return;
            }
            if self.config_persisting {
                // The epoch's own publication is still under way.
                return;
            }
        }
        // The first daemon in rank order writes; the others come after it
        // and find the objects already showing the epoch (after a start,
        // three daemons writing at once fought with 409 Conflicts).
        // A re-publication has no leader: the first daemon writes after a
        // short settle (changes within it, replicas re-attaching one after
        // another, make one write), the others a rank step apart after it.
        let rank = self.rank() as u32;
        let wait = members::RANK_STEP * rank
            + if republish {
                members::REPUBLISH_SETTLE
            } else {
                Duration::ZERO
            };
        let due = *self.republish_due.get_or_insert(now + wait);
        if !self.read_for_publication(due) {
            return;
        }
        self.republish_due = None;
        self.published_epoch = Some(self.config_epoch);
        // A re-publication says what the epoch's first one said, with the
        // replicas of now.
        let (reporter, old) = match (&self.epoch_publication, republish) {
            (Some((r, old)), true) => (*r, old.clone()),
            _ => (Reporter::Observer, None),
        };
        self.epoch_publication = Some((reporter, old.clone()));
        self.publish_epoch_now(reporter, old);
    }

    /// A peer announces a newer config for this group: adopt it at once
    /// when it names the same master, else once the master it names
    /// reports `role:master` itself. A peer's word alone never moves the
    /// master: a peer that lies about an epoch (or a corrupt hello)
    /// changes nothing.
    ///
    /// Not while a switchover's command of this daemon may still hand
    /// over on the server: adopting a config abandons the failover, and
    /// one that names the kept master routes it at the fence's epoch (the
    /// simulation with every fault, seed 6066: adopted 10 ms after the
    /// last `FAILOVER`, which then handed over, and clients were routed to
    /// a replica). The command ends within its timeout and a few seconds.
    pub(super) fn check_peer_configs(&mut self, now: Instant) {
        if self.switchover_out(now) {
            return;
        }
        let newest = self
            .peers
            .iter()
            .filter_map(|e| {
                let g = e.group(&self.cfg.name)?;
                let from = e.id.clone()?;
                (g.config_epoch > self.config_epoch).then(|| (from, g.clone()))
            })
            .max_by_key(|(_, g)| g.config_epoch);
        let Some((from, group)) = newest else {
            return;
        };
        if group.master == self.master {
            self.adopt_from_peer(&from, group);
            return;
        }
        let key = (group.config_epoch, group.master.clone());
        if self.checking_peer_config.as_ref() == Some(&key) {
            return;
        }
        self.checking_peer_config = Some(key);
        self.effects.run(Work::CheckPeerConfig { from, group });
    }

    pub(super) fn on_peer_config_checked(
        &mut self,
        from: String,
        group: HelloGroup,
        role: Result<Role, RespError>,
    ) {
        self.checking_peer_config = None;
        if group.config_epoch <= self.config_epoch || self.switchover_out(self.now) {
            return;
        }
        match role {
            Ok(Role::Master) => self.adopt_from_peer(&from, group),
            Ok(other) => tracing::warn!(
                group = %self.cfg.name, peer = %from, epoch = group.config_epoch,
                master = %group.master, role = ?other,
                "a peer announces a master that does not report role:master; not adopting"
            ),
            Err(e) => tracing::info!(
                group = %self.cfg.name, peer = %from, epoch = group.config_epoch,
                master = %group.master, error = %e,
                "cannot confirm the master a peer announces; will retry"
            ),
        }
    }

    /// Adopt a newer config a peer announced (already checked).
    fn adopt_from_peer(&mut self, from: &str, group: HelloGroup) {
        tracing::info!(group = %self.cfg.name, from = %from, epoch = group.config_epoch, master = %group.master, "adopting a newer config from a peer");
        let abandoned = self.failover.take().map(|run| {
            tracing::warn!(group = %self.cfg.name, epoch = run.machine.epoch, "a newer config exists; abandoning this failover");
            run.machine.epoch
        });
        let actions = self.election.abandon();
        self.run_election_actions(self.now, actions);
        // This daemon's failover may have fenced the backends at its own
        // epoch, above the config it adopts (a voter that had not heard
        // the older epoch's leader yet elected this daemon too): the
        // peer's master is published at the fence's epoch, or every
        // backend would refuse it and stay without a master (the chaos
        // test with isolation fencing, seed 1592590344). No other daemon
        // can publish at that epoch: this one won it.
        // Not while that failover's promotion or its re-points are still
        // out: on Dragonfly they take effect when they answer, and one of
        // them may yet make the peer's master a replica (the simulation on
        // Dragonfly, seed 1138: published at the fence's epoch, that
        // master became a replica of this failover's candidate 200 ms
        // later). It is routed at the fence's epoch once they have
        // answered and it still reads as a master (`route_kept_master`).
        let now = self.now;
        let epoch = match abandoned {
            Some(e) if e > group.config_epoch && self.commands_out(now) => {
                self.kept_route = Some((e, now));
                group.config_epoch
            }
            _ => abandoned.map_or(group.config_epoch, |e| e.max(group.config_epoch)),
        };
        let old = self.master.clone();
        self.adopt_master(group.master, epoch, Reporter::Observer, Some(from));
        let topology = self.topology(Reporter::Observer, self.replaced(old));
        self.persist_and_publish(topology, false);
    }
}

/// A config adopted from a peer that this daemon publishes when its turn
/// comes ([`Group::publish_adopted_when_due`]).
#[derive(Debug)]
pub(super) struct AdoptedPublication {
    /// The config's epoch (a newer config drops this one's publication).
    epoch: u64,
    /// When this daemon's turn comes: the leader first, then a rank step
    /// per daemon before this one.
    due: Instant,
}

//! Who belongs to the group: members from Kubernetes pods
//! (`[group.members]`), forgetting servers that are gone (a pod deleted
//! or replaced; a static replica down for `forget_after` that the master no
//! longer lists), the planned handover when the master's pod is being
//! deleted, and which replicas are linked to the master (the only ones
//! published or labelled as replicas).
//!
//! A new member is only probed here; if it is not a replica of the master
//! (a rescheduled pod comes back as an empty lone master) `repair.rs`
//! `check_topology` makes it one under the rules of demoting a returning
//! master: a majority confirms this daemon's config and the master looks
//! sane.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Group, SwitchoverReply};
use crate::addr::Addr;
use crate::discovery::kubernetes::members::Members;
use crate::probe::Role;

/// How long each daemon waits per rank (its place among the reachable
/// daemons' ids) before it hands over or re-publishes on its own: the
/// first does it at once, the others find it done and write nothing.
pub(super) const RANK_STEP: Duration = Duration::from_millis(1000);

/// How long the first daemon in rank order waits before it re-publishes
/// an epoch whose linked replicas changed: long enough for replicas
/// re-attaching together to make one write, short against the target of
/// a new replica labelled within 2 × `down_after` + 1 s of being Ready
/// (a whole [`RANK_STEP`] here was a second of the 2 s picket took).
pub(super) const REPUBLISH_SETTLE: Duration = Duration::from_millis(200);

impl Group {
    /// The pod watch reports the group's pods.
    pub(super) fn on_members(&mut self, now: Instant, members: Arc<Members>) {
        for m in &members.pods {
            // A pod is a member once Ready: a starting server that does
            // not answer yet would only be SDOWN. One being deleted is
            // kept while it lasts, not taken in.
            let addr = self.identify(&m.addr);
            self.gone.remove(&addr);
            if m.ready && m.deleting.is_none() {
                self.ensure_instance(&addr);
            }
        }
        let intended = self.election.intended(self.config_epoch).cloned();
        let gone: Vec<Addr> = self
            .instances
            .keys()
            .filter(|a| **a != self.master && Some(*a) != intended.as_ref())
            .filter(|a| !self.is_member(a, &members))
            .cloned()
            .collect();
        for addr in gone {
            tracing::info!(group = %self.cfg.name, instance = %addr,
                "forgetting an instance: no pod of the group has its address any more");
            self.forget_instance(&addr);
            self.gone.insert(addr);
        }
        self.members = Some(members);
        self.check_handover(now);
        self.dirty = true;
    }

    /// Whether a pod of `members` has `addr` (by the IP a name resolved to).
    fn is_member(&self, addr: &Addr, members: &Members) -> bool {
        let wire = self.wire(addr);
        members
            .pods
            .iter()
            .any(|m| m.addr == *addr || m.addr == wire)
    }

    /// A replica the master lists may be added unless its pod is known to
    /// be gone (a master lists a dead replica until its link times out),
    /// and, once the pods are known, only if it is one of them. Before the
    /// first list (the API unreachable at start-up) the master's list is
    /// taken as it is: a failover must find its replicas.
    pub(super) fn may_add_listed(&self, addr: &Addr) -> bool {
        !self.gone.contains(addr)
            && self
                .members
                .as_ref()
                .is_none_or(|m| self.is_member(addr, m))
    }

    /// The master's pod is being deleted: once per master, a planned
    /// switchover to the best replica, by the first daemon in rank order
    /// (the others only if it has not happened after their turn).
    pub(super) fn check_handover(&mut self, now: Instant) {
        let enabled = self
            .cfg
            .members
            .as_ref()
            .is_some_and(|m| m.handover_on_delete);
        let Some(members) = self.members.clone() else {
            return;
        };
        if !enabled {
            return;
        }
        let master = self.master.clone();
        let deleting = members
            .at(&self.wire(&master))
            .or_else(|| members.at(&master))
            .and_then(|m| m.deleting.map(|g| (m.pod.clone(), g)));
        let Some((pod, grace)) = deleting else {
            return;
        };
        if self.handover.as_ref().is_some_and(|h| h.master == master) {
            let h = self.handover.as_ref().expect("checked above");
            if h.requested || now < h.due {
                return;
            }
        } else {
            let rank = self.rank();
            let due = now + RANK_STEP * rank as u32;
            tracing::info!(group = %self.cfg.name, %pod, master = %master, grace = ?grace, rank,
                "the master's pod is being deleted: handing over to the best replica");
            self.handover = Some(Handover {
                master: master.clone(),
                due,
                requested: false,
            });
            if now < due {
                return;
            }
        }
        if self.failover.is_some() || self.election.busy() || self.pending_switchover.is_some() {
            return;
        }
        if let Some(h) = self.handover.as_mut() {
            h.requested = true;
        }
        self.start_switchover(now, None, SwitchoverReply::Handover { pod });
    }

    /// This daemon's place (0: first) among itself and the peers that
    /// count as reachable (heard within the peer TTL, or not yet heard in
    /// the start-up grace), ordered by address: every daemon's own
    /// `announce` against the addresses its peers are configured by, which
    /// a symmetric configuration makes the same list everywhere, hellos or
    /// not (ids are learnt from hellos, which a daemon that has just
    /// started has not had yet: all three then ranked themselves first).
    pub(super) fn rank(&self) -> usize {
        let now = self.now;
        let me = self.ctx.announce.as_str();
        self.peers
            .iter()
            .filter(|p| p.reachable(now, crate::quorum::table::PEER_TTL))
            .filter(|p| p.addr.as_str() < me)
            .count()
    }

    /// Forget replicas of a static group that have been unreachable for
    /// `forget_after` and that the master does not list. An instance last
    /// seen as a master is kept: it must be demoted if it comes back.
    pub(super) fn forget_long_gone(&mut self, now: Instant) {
        let after = self.cfg.forget_after;
        let intended = self.election.intended(self.config_epoch).cloned();
        let old: Vec<Addr> = self
            .instances
            .values()
            .filter(|i| i.addr != self.master && Some(&i.addr) != intended.as_ref())
            .filter(|i| !i.last_seen_master)
            .filter(|i| now.saturating_duration_since(i.sdown.last_valid()) >= after)
            .filter(|i| !self.master_lists(&i.addr))
            .map(|i| i.addr.clone())
            .collect();
        for addr in old {
            tracing::info!(group = %self.cfg.name, instance = %addr, forget_after = ?after,
                "forgetting a replica: down for forget_after and no longer listed by the master");
            self.forget_instance(&addr);
        }
    }

    /// Whether the master's last INFO lists `addr` among its replicas.
    fn master_lists(&self, addr: &Addr) -> bool {
        let ip = self.ip_of(addr);
        self.instances
            .get(&self.master)
            .and_then(|m| m.info.as_ref())
            .is_some_and(|i| {
                i.replicas
                    .iter()
                    .any(|r| addr.is_reported_as(ip, Some(&r.ip), Some(r.port)))
            })
    }

    /// The replicas that replicate from the master now: listed online by
    /// its fresh INFO, or, when it hides the list or is not fresh, whose
    /// own fresh INFO follows it with the link up. Only these are
    /// published (a replica Service must not send reads to an empty lone
    /// master or a replica still loading). In address order (the
    /// instances' map order), so that two sets compare without sorting.
    pub(super) fn linked_replicas(&self) -> impl Iterator<Item = &Addr> {
        let master = &self.master;
        let listed = super::observe::master_list(&self.instances, master);
        let master_ip = self.ip_of(master);
        let admin_port = self.cfg.admin_port;
        self.instances
            .values()
            .filter(|i| i.addr != *master)
            .filter(move |i| match listed {
                Some(rs) => i.listed_online(rs),
                None => {
                    i.fresh()
                        && i.info.as_ref().is_some_and(|x| {
                            x.role == Role::Replica
                                && x.master_link_up
                                && super::observe::names_master(x, master, master_ip, admin_port)
                        })
                }
            })
            .map(|i| &i.addr)
    }
}

/// The handover started for the master whose pod is being deleted.
#[derive(Debug)]
pub(super) struct Handover {
    /// The master it is for (a new master's pod is a new handover).
    pub(super) master: Addr,
    /// When this daemon's turn comes.
    pub(super) due: Instant,
    /// The switchover was asked for.
    pub(super) requested: bool,
}

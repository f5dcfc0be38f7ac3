//! Isolation fencing (`[group.isolation_fencing]`, Redis and Valkey).
//!
//! picket keeps `min-replicas-to-write` / `min-replicas-max-lag` on the
//! master, so that a master cut off from its replicas stops acknowledging
//! writes within the lag: what an isolated old master can take (and lose
//! when it is demoted) is bounded by the lag instead of by the partition.
//! The other servers of the group are kept at `min-replicas-to-write 0`.
//!
//! The threshold is lowered while the replicas are dead and the master is
//! not isolated, so that the master stays writable; it is restored once the
//! replicas are back. The rule, computed alike by every daemon from its own
//! view and its peers' hellos (each hello carries the sender's
//! [`ReplicaSight`]):
//!
//! - Only daemons that see the master up count, each with the number of
//!   replicas it sees up (answering its probes, whatever their link).
//! - With fewer than `needed` such daemons the fence is the configured
//!   `min_replicas`: nobody may lower it. `needed` is a majority of all
//!   daemons and at least `daemons - quorum + 1`, so that while they see the
//!   master up no ODOWN (and so no failover) is possible.
//! - Otherwise the fence is `min(min_replicas, K)`, K the smallest number of
//!   replicas that `needed` of them agree on (the `needed`-th smallest).
//!   K is 0 only when `needed` daemons see the master up and no replica at
//!   all: the replicas are dead, and with no replica there is nobody to
//!   promote, so the master's writes cannot be lost to a failover.
//!
//! Why this is safe for the case that matters, a master isolated from its
//! replicas while the daemons still reach it: the daemons then still see the
//! replicas (K ≥ 1), so the fence stays and the master refuses writes. A
//! master isolated from the daemons too is seen down by them: it does not
//! count, nothing lowers its fence, and the daemons could not reach it to
//! lower it anyway. The fence is lowered only on evidence from a majority
//! that sees the master, and only as far as they agree.
//!
//! Raising it again waits for the returning replicas to have synchronised
//! (their link to the master up), at most [`SYNC_GRACE`]: a fence raised
//! before any replica can acknowledge would refuse every write meanwhile.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use super::effects::Work;
use super::view::{GroupView, IsolationFenceView, SightView};
use super::{Group, ms};
use crate::addr::Addr;
use crate::config::IsolationFencingConfig;
use crate::events::EventKind;
use crate::events::{master_details, replica_details};
use crate::metrics as m;
use crate::probe::{Flavour, Role};
use crate::quorum::peers::ReplicaSight;
use crate::quorum::table::PEER_TTL;
use crate::resp::RespError;

/// How long returning replicas get to synchronise before the fence is
/// raised anyway (safety first: the master then refuses writes until one
/// has caught up).
pub const SYNC_GRACE: Duration = Duration::from_secs(10);
/// How often the fence on the master is read back: a restarted master has
/// forgotten what `CONFIG SET` set.
const VERIFY_EVERY: Duration = Duration::from_secs(5);
/// Pause after a failed read or write of a server's fence.
const RETRY_AFTER: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------
// The decision (pure)

/// What one daemon sees of the master and its replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sight {
    /// It sees the master up.
    pub master_up: bool,
    /// Its replicas as it sees them.
    pub replicas: ReplicaSight,
}

/// The parameters of the decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// The configured `min-replicas-to-write`.
    pub min_replicas: u32,
    /// How many daemons that see the master up it takes to lower the fence.
    pub needed: usize,
    /// See [`SYNC_GRACE`].
    pub sync_grace: Duration,
}

impl Rule {
    /// The rule for `daemons` daemons (peers + self) and `quorum`.
    pub fn new(min_replicas: u32, daemons: usize, quorum: u32) -> Rule {
        let majority = daemons / 2 + 1;
        // With this many seeing the master up, fewer than `quorum` can see
        // it down: no ODOWN.
        let no_odown = (daemons + 1).saturating_sub(quorum as usize);
        Rule {
            min_replicas,
            needed: majority.max(no_odown).max(1),
            sync_grace: SYNC_GRACE,
        }
    }

    /// The fence the replicas seen up justify, and the one the replicas
    /// seen linked (synchronised) justify: `min(min_replicas, K)`, K the
    /// `needed`-th smallest count among the daemons that see the master
    /// up; `min_replicas` when fewer than `needed` daemons see it up.
    pub fn targets(&self, sights: &[Sight]) -> (u32, u32) {
        let mut up: Vec<u32> = Vec::new();
        let mut linked: Vec<u32> = Vec::new();
        for s in sights.iter().filter(|s| s.master_up) {
            if crate::mutation::planted(crate::mutation::Mutation::FenceOnLinkedReplicas) {
                up.push(s.replicas.linked);
            } else {
                up.push(s.replicas.up);
            }
            linked.push(s.replicas.linked);
        }
        if up.len() < self.needed {
            return (self.min_replicas, self.min_replicas);
        }
        up.sort_unstable();
        linked.sort_unstable();
        let k = self.needed - 1;
        (
            self.min_replicas.min(up[k]),
            self.min_replicas.min(linked[k]),
        )
    }
}

/// The fence one daemon wants on the current master, with the hysteresis
/// of raising it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FenceState {
    current: Option<u32>,
    raise_since: Option<Instant>,
    /// What the replicas seen up justify, at the last step.
    justified: u32,
}

impl FenceState {
    /// The fence to keep from `now` on, given every daemon's sight: lowered
    /// at once to what the replicas seen up justify; raised at once as far
    /// as the synchronised replicas justify, and all the way once they all
    /// have synchronised or after `sync_grace`. A new master starts at the
    /// full target (nothing lowered yet).
    pub fn step(&mut self, now: Instant, rule: &Rule, sights: &[Sight]) -> u32 {
        let (up, linked) = rule.targets(sights);
        let current = self.current.unwrap_or(up);
        let next = if current >= up {
            up
        } else {
            let since = *self.raise_since.get_or_insert(now);
            if linked >= up || now.saturating_duration_since(since) >= rule.sync_grace {
                up
            } else {
                current.max(linked)
            }
        };
        if next >= up {
            self.raise_since = None;
        }
        self.current = Some(next);
        self.justified = up;
        next
    }

    /// What the replicas seen up justified at the last step: a fence
    /// found on the master above the one wanted, up to this, is left
    /// there ([`FenceState::found`]).
    pub fn justified(&self) -> u32 {
        self.justified
    }

    /// The master was found holding `value`, above the fence wanted and
    /// within what the replicas seen up justify: another daemon (or this
    /// one before a stall) raised it already. It is kept, and the raise
    /// this daemon was waiting for is done: lowering it again only to
    /// wait for the replicas' synchronisation would unfence a master cut
    /// off from live replicas (the simulation, `--isolation --net`, seed
    /// 1877: a daemon out of TILT lowered a fence the others had raised,
    /// the master's links cut).
    pub fn found(&mut self, value: u32) {
        if self.current.is_some_and(|c| value > c) && value <= self.justified {
            self.current = Some(value);
            if value >= self.justified {
                self.raise_since = None;
            }
        }
    }

    /// Forget everything (a new master).
    pub fn reset(&mut self) {
        *self = FenceState::default();
    }

    /// Whether a raise is waiting for replicas to synchronise.
    pub fn raising(&self) -> bool {
        self.raise_since.is_some()
    }
}

/// The sight a daemon reports for a group, from its published view.
///
/// `up` counts every other server of the group that answers, a stray
/// master among them: one just re-pointed or demoted whose next INFO has
/// not been read yet is a replica already, and one about to be demoted
/// will be one. Counting only those whose last INFO said `role:slave`
/// lowered the fence of a new master cut off from the old one its leader
/// had just re-pointed, on the sights of peers that had not read it since
/// (the simulation, `--isolation --net --ops`, seed 3620). Too many
/// counted keeps the fence (the safe side); too few unfences a master.
pub fn replica_sight(v: &GroupView) -> ReplicaSight {
    let mut s = ReplicaSight::default();
    // A named master is followed by its IP (servers are told IPs).
    let master_ip = v.master_view().and_then(|m| m.ip);
    for r in v.instances.iter().filter(|i| !i.is_master && i.up) {
        s.up += 1;
        if r.role == Role::Replica
            && r.master_link_up
            && v.master
                .is_reported_as(master_ip, r.master_host.as_deref(), r.master_port)
        {
            s.linked += 1;
        }
    }
    s
}

// ---------------------------------------------------------------------------
// The group's part: gathering the sights, keeping the fence on the servers

/// What the apply tasks report back.
#[derive(Debug, Default)]
struct Applied {
    /// A read/write of the master's fence is running.
    in_flight: bool,
    /// The master, the value found or set on it, and when.
    confirmed: Option<(Addr, u32, Instant)>,
    /// The last failure and when.
    error: Option<(String, Instant)>,
    /// Replicas being cleared.
    clearing: HashSet<Addr>,
    /// Replicas cleared, with the run id they had then (a restart re-reads
    /// the server's own config).
    cleared: HashMap<Addr, Option<String>>,
}

/// The isolation-fencing state of one group task.
#[derive(Debug)]
pub(super) struct Isolation {
    cfg: Option<IsolationFencingConfig>,
    state: FenceState,
    target: Option<u32>,
    sights: Vec<(String, Sight)>,
    own: Option<ReplicaSight>,
    warned_dragonfly: bool,
    applied: Applied,
}

impl Isolation {
    /// The state of a group with `cfg` (None: no fencing).
    pub(super) fn new(group: &str, cfg: Option<IsolationFencingConfig>) -> Isolation {
        if let Some(c) = &cfg {
            // From start-up, so that rules and panels find the series.
            metrics::gauge!(m::FENCE_LOWERED, "group" => group.to_string()).set(0.0);
            metrics::gauge!(m::FENCE_MIN_REPLICAS, "group" => group.to_string())
                .set(f64::from(c.min_replicas));
            for change in ["raised", "lowered", "cleared"] {
                metrics::counter!(m::FENCE_CHANGES, "group" => group.to_string(), "change" => change)
                    .increment(0);
            }
            metrics::counter!(m::FENCE_ERRORS, "group" => group.to_string()).increment(0);
        }
        Isolation {
            cfg,
            state: FenceState::default(),
            target: None,
            sights: Vec::new(),
            own: None,
            warned_dragonfly: false,
            applied: Applied::default(),
        }
    }
}

impl Group {
    fn fence_rule(&self, cfg: &IsolationFencingConfig) -> Rule {
        Rule::new(cfg.min_replicas, self.ctx.daemons(), self.cfg.quorum)
    }

    /// Every daemon's sight of the current master: this one's (from its
    /// published view) and each peer's from a fresh hello about the same
    /// master and config epoch. Peers that send no sight do not count.
    fn fence_sights(&self, now: Instant) -> Vec<(String, Sight)> {
        let own = (self.view.master == self.master).then(|| replica_sight(&self.view));
        let mut out = Vec::new();
        if let Some(replicas) = own {
            out.push((
                self.ctx.id.clone(),
                Sight {
                    master_up: !self.master_sdown(),
                    replicas,
                },
            ));
        }
        for e in self.peers.iter() {
            if !e.hello_within(now, PEER_TTL) {
                continue;
            }
            let Some(h) = &e.hello else { continue };
            let Some(g) = e.group(&self.cfg.name) else {
                continue;
            };
            if g.master != self.master || g.config_epoch != self.config_epoch {
                continue;
            }
            if let Some(replicas) = g.replicas {
                out.push((
                    h.id.clone(),
                    Sight {
                        master_up: !g.sdown,
                        replicas,
                    },
                ));
            }
        }
        out
    }

    /// Hook of [`Group::adopt_master`]: a (maybe new) master. Its fence is
    /// derived afresh and set at once, also by a leader in the middle of its
    /// failover (the promoted replica must not stay unfenced until the
    /// failover ends).
    pub(super) fn isolation_on_adopt(&mut self) {
        if self.isolation.cfg.is_none() {
            return;
        }
        self.isolation.state.reset();
        {
            let master = self.master.clone();
            let a = &mut self.isolation.applied;
            if a.confirmed.as_ref().is_some_and(|(m, _, _)| *m != master) {
                a.confirmed = None;
            }
            // A master is no cleared replica; the old master is cleared again
            // once it reports role:slave.
            a.cleared.remove(&master);
        }
        let now = self.now;
        self.isolation_decide(now);
        self.isolation_apply(now, true);
    }

    /// Hook of [`Group::on_tick`]: decide the fence and keep it on the
    /// servers.
    pub(super) fn isolation_tick(&mut self, now: Instant) {
        if self.isolation.cfg.is_none() {
            return;
        }
        self.isolation_decide(now);
        self.isolation_apply(now, false);
        self.isolation_clear_replicas(now);
    }

    fn isolation_decide(&mut self, now: Instant) {
        let Some(cfg) = self.isolation.cfg.clone() else {
            return;
        };
        let sights = self.fence_sights(now);
        let own = sights
            .first()
            .filter(|(id, _)| *id == self.ctx.id)
            .map(|(_, s)| s.replicas);
        if own.is_some() && own != self.isolation.own {
            // The peers decide from this daemon's sight too: tell them now,
            // not at the next periodic hello.
            self.isolation.own = own;
            self.ctx.hello_now.notify_one();
        }
        let rule = self.fence_rule(&cfg);
        let plain: Vec<Sight> = sights.iter().map(|(_, s)| *s).collect();
        let target = self.isolation.state.step(now, &rule, &plain);
        if self.isolation.target != Some(target) {
            let lowered = target < cfg.min_replicas;
            tracing::info!(
                group = %self.cfg.name, master = %self.master, target, lowered,
                sights = ?sights, "isolation fence target"
            );
            metrics::gauge!(m::FENCE_LOWERED, "group" => self.label.clone()).set(if lowered {
                1.0
            } else {
                0.0
            });
            self.isolation.target = Some(target);
        }
        self.isolation.sights = sights;
    }

    fn isolation_apply(&mut self, now: Instant, forced: bool) {
        let (Some(cfg), Some(target)) = (self.isolation.cfg.clone(), self.isolation.target) else {
            return;
        };
        let master = self.master.clone();
        if self.flavour_of(&master) == Flavour::Dragonfly {
            if !self.isolation.warned_dragonfly {
                self.isolation.warned_dragonfly = true;
                tracing::warn!(group = %self.cfg.name, master = %master, "isolation fencing: Dragonfly has no min-replicas-to-write; the master is not fenced");
            }
            return;
        }
        // Only a daemon whose view a majority confirms keeps the fence
        // (like any reconfiguration), except right after it adopted a new
        // master: then the leader sets it during its failover.
        let may = forced || (self.may_reconfigure(now) && self.reports_master_now(&master));
        if !may {
            return;
        }
        {
            let a = &self.isolation.applied;
            if a.in_flight {
                return;
            }
            if a.error
                .as_ref()
                .is_some_and(|(_, t)| now.saturating_duration_since(*t) < RETRY_AFTER)
            {
                return;
            }
            let current = a.confirmed.as_ref().is_some_and(|(m, v, t)| {
                *m == master && *v == target && now.saturating_duration_since(*t) < VERIFY_EVERY
            });
            if current && !forced {
                return;
            }
        }
        self.isolation.applied.in_flight = true;
        self.effects.run(Work::SetFence {
            master,
            target,
            lag: cfg.max_lag_secs(),
            keep: self.isolation.state.justified().max(target),
        });
    }

    /// The master's fence was read and set (or not).
    pub(super) fn on_fence_set(
        &mut self,
        master: Addr,
        (target, keep): (u32, u32),
        lag: u64,
        at: Instant,
        result: Result<(u32, u64), RespError>,
    ) {
        let group = self.cfg.name.clone();
        // A higher fence found within `keep` was left in place.
        let target = match &result {
            Ok((before, _)) if crate::failover::ops::threshold_kept(*before, target, keep) => {
                if self.master == master {
                    self.isolation.state.found(*before);
                    self.isolation.target = Some(*before);
                }
                *before
            }
            _ => target,
        };
        let a = &mut self.isolation.applied;
        a.in_flight = false;
        match result {
            Ok((before, _)) => {
                a.confirmed = Some((master.clone(), target, at));
                a.error = None;
                metrics::gauge!(m::FENCE_MIN_REPLICAS, "group" => self.label.clone())
                    .set(f64::from(target));
                if before != target {
                    let (event, change) = if target < before {
                        (EventKind::IsolationFenceLowered, "lowered")
                    } else {
                        (EventKind::IsolationFence, "raised")
                    };
                    let reason = match &self.isolation.cfg {
                        Some(cfg) if target < cfg.min_replicas => format!(
                            ": at least {} daemons see the master up and at most {target} replicas up",
                            self.fence_rule(cfg).needed
                        ),
                        _ => String::new(),
                    };
                    metrics::counter!(m::FENCE_CHANGES, "group" => self.label.clone(), "change" => change)
                        .increment(1);
                    self.ctx.events.emit(
                        event,
                        format!(
                            "{} #min-replicas-to-write {target} min-replicas-max-lag {lag}{reason}",
                            master_details(&group, &master)
                        ),
                    );
                }
            }
            Err(e) => {
                a.error = Some((format!("{master}: {e}"), at));
                metrics::counter!(m::FENCE_ERRORS, "group" => self.label.clone()).increment(1);
                tracing::warn!(group = %group, %master, error = %e, "cannot keep the isolation fence on the master");
            }
        }
    }

    /// Keep `min-replicas-to-write 0` on the other servers: a demoted or
    /// re-pointed server must not carry the fence into a promotion picket
    /// does not make. Only servers that say `role:slave` on a fresh INFO
    /// are touched, never one that might still be a master.
    fn isolation_clear_replicas(&mut self, now: Instant) {
        if !self.may_reconfigure(now) {
            return;
        }
        let todo: Vec<(Addr, Option<String>)> = {
            let a = &self.isolation.applied;
            if a.error
                .as_ref()
                .is_some_and(|(_, t)| now.saturating_duration_since(*t) < RETRY_AFTER)
            {
                return;
            }
            self.instances
                .values()
                .filter(|i| i.addr != self.master && i.connected && !i.sdown.is_down())
                .filter(|i| i.info_at.is_some_and(|t| Some(t) >= i.connected_at))
                .filter_map(|i| {
                    let info = i.info.as_ref()?;
                    (info.role == Role::Replica && info.flavour != Flavour::Dragonfly)
                        .then(|| (i.addr.clone(), info.run_id.clone()))
                })
                .filter(|(addr, run_id)| {
                    !a.clearing.contains(addr) && a.cleared.get(addr) != Some(run_id)
                })
                .collect()
        };
        for (addr, run_id) in todo {
            self.isolation.applied.clearing.insert(addr.clone());
            self.effects.run(Work::ClearFence { addr, run_id });
        }
    }

    /// A replica's fence was cleared (or not).
    pub(super) fn on_fence_cleared(
        &mut self,
        addr: Addr,
        run_id: Option<String>,
        at: Instant,
        result: Result<u32, RespError>,
    ) {
        let a = &mut self.isolation.applied;
        a.clearing.remove(&addr);
        match result {
            Ok(before) => {
                a.cleared.insert(addr.clone(), run_id);
                if before != 0 {
                    metrics::counter!(m::FENCE_CHANGES, "group" => self.label.clone(), "change" => "cleared")
                        .increment(1);
                    self.ctx.events.emit(
                        EventKind::IsolationFenceLowered,
                        format!(
                            "{} #min-replicas-to-write 0 (was {before}): not the master",
                            replica_details(&addr, &self.cfg.name, &self.master)
                        ),
                    );
                }
            }
            Err(e) => {
                a.error = Some((format!("{addr}: {e}"), at));
                metrics::counter!(m::FENCE_ERRORS, "group" => self.label.clone()).increment(1);
                tracing::warn!(group = %self.cfg.name, instance = %addr, error = %e, "cannot clear the isolation fence of a replica");
            }
        }
    }

    /// The fence for `/v1/status` (None without fencing).
    pub(super) fn isolation_view(&self) -> Option<IsolationFenceView> {
        let cfg = self.isolation.cfg.as_ref()?;
        let now = self.now;
        let target = self.isolation.target.unwrap_or(cfg.min_replicas);
        let a = &self.isolation.applied;
        let (in_force, confirmed_on, confirmed_ms) = match &a.confirmed {
            Some((m, v, t)) => (
                Some(*v),
                Some(m.clone()),
                Some(ms(now.saturating_duration_since(*t))),
            ),
            None => (None, None, None),
        };
        let rule = self.fence_rule(cfg);
        let reason = if self.flavour_of(&self.master) == Flavour::Dragonfly {
            Some(
                "Dragonfly has no min-replicas-to-write: the master cannot be fenced (docs/reliability.md)"
                    .to_string(),
            )
        } else if let Some((e, t)) = &a.error {
            Some(format!(
                "{} ms ago: {e}",
                ms(now.saturating_duration_since(*t))
            ))
        } else if target < cfg.min_replicas {
            Some(format!(
                "lowered: at least {} daemons see the master up and at most {target} replicas up",
                rule.needed
            ))
        } else if self.isolation.state.raising() {
            Some(format!(
                "replicas are back: raising the fence as they synchronise (at most {} s)",
                rule.sync_grace.as_secs()
            ))
        } else {
            None
        };
        Some(IsolationFenceView {
            min_replicas: cfg.min_replicas,
            max_lag_secs: cfg.max_lag_secs(),
            target,
            lowered: target < cfg.min_replicas,
            in_force,
            confirmed_on,
            confirmed_ms,
            sights: self
                .isolation
                .sights
                .iter()
                .map(|(id, s)| SightView {
                    daemon: id.clone(),
                    master_up: s.master_up,
                    replicas_up: s.replicas.up,
                    replicas_linked: s.replicas.linked,
                })
                .collect(),
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sight(master_up: bool, up: u32, linked: u32) -> Sight {
        Sight {
            master_up,
            replicas: ReplicaSight { up, linked },
        }
    }

    #[test]
    fn lowering_needs_a_majority_that_also_rules_out_odown() {
        assert_eq!(Rule::new(1, 3, 2).needed, 2);
        // quorum 1: a single daemon seeing the master down is ODOWN, so all
        // three must see it up.
        assert_eq!(Rule::new(1, 3, 1).needed, 3);
        assert_eq!(Rule::new(1, 3, 3).needed, 2);
        assert_eq!(Rule::new(1, 5, 3).needed, 3);
        assert_eq!(Rule::new(1, 1, 1).needed, 1);
    }

    #[test]
    fn targets_follow_what_the_needed_daemons_agree_on() {
        let r = Rule::new(1, 3, 2);
        // Replicas dead, master up for everyone: lowered to 0.
        let dead = [sight(true, 0, 0), sight(true, 0, 0), sight(true, 0, 0)];
        assert_eq!(r.targets(&dead), (0, 0));
        // One daemon still sees a replica: two agree on none.
        assert_eq!(
            r.targets(&[sight(true, 1, 1), sight(true, 0, 0), sight(true, 0, 0)]),
            (0, 0)
        );
        // Two see a replica: no lowering.
        assert_eq!(
            r.targets(&[sight(true, 1, 0), sight(true, 1, 0), sight(true, 0, 0)]),
            (1, 0)
        );
        // Replicas visible but cut off from the master (not linked): the
        // fence stays.
        let cut = [sight(true, 2, 0), sight(true, 2, 0), sight(true, 2, 0)];
        assert_eq!(r.targets(&cut), (1, 0));
        // The master is down for two daemons (isolated): nothing lowers.
        assert_eq!(
            r.targets(&[sight(true, 0, 0), sight(false, 0, 0), sight(false, 0, 0)]),
            (1, 1)
        );
        // Only this daemon's sight (peers silent or from an older version).
        assert_eq!(r.targets(&[sight(true, 0, 0)]), (1, 1));
        // min_replicas 2, one of two replicas dead: lowered to 1, not 0.
        let r2 = Rule::new(2, 3, 2);
        assert_eq!(
            r2.targets(&[sight(true, 1, 1), sight(true, 1, 1), sight(true, 2, 2)]),
            (1, 1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lowered_at_once_raised_once_replicas_synchronised_or_after_the_grace() {
        let r = Rule::new(1, 3, 2);
        let mut f = FenceState::default();
        let all = |s: Sight| [s, s, s];
        // A new master with its replicas: the full fence.
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 2, 2))), 1);
        // Both replicas die: lowered at once.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 0, 0))), 0);
        // One comes back and answers, but is still synchronising: not yet
        // raised (the master would refuse every write meanwhile)...
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 1, 0))), 0);
        assert!(f.raising());
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 1, 0))), 0);
        // ...until its link is up.
        tokio::time::advance(Duration::from_millis(500)).await;
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 1, 1))), 1);
        assert!(!f.raising());

        // Again, but the replica never synchronises: raised after the grace.
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 0, 0))), 0);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 1, 0))), 0);
        tokio::time::advance(SYNC_GRACE - Duration::from_millis(1)).await;
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 1, 0))), 0);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 1, 0))), 1);

        // Lowered, then the majority loses sight of the master (it may be
        // isolated now): back to the full fence at once.
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 0, 0))), 0);
        let isolated = [sight(true, 0, 0), sight(false, 0, 0), sight(false, 0, 0)];
        assert_eq!(f.step(Instant::now(), &r, &isolated), 1);

        // A reset (new master) starts at the full target, even with the
        // replicas not linked to it yet.
        f.reset();
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 1, 0))), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lowering_episode_restarts_the_grace() {
        let r = Rule::new(1, 3, 2);
        let mut f = FenceState::default();
        let all = |s: Sight| [s, s, s];
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 0, 0))), 0);
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 1, 0))), 0);
        tokio::time::advance(SYNC_GRACE / 2).await;
        // The replica dies again before it synchronised.
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 0, 0))), 0);
        assert!(!f.raising());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 1, 0))), 0);
        tokio::time::advance(SYNC_GRACE / 2).await;
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 1, 0))), 0);
        tokio::time::advance(SYNC_GRACE / 2).await;
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 1, 0))), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_found_raised_within_what_is_justified_is_kept() {
        let r = Rule::new(2, 3, 2);
        let mut f = FenceState::default();
        let all = |s: Sight| [s, s, s];
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 0, 0))), 0);
        // Both replicas back, not synchronised: this daemon waits...
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 2, 0))), 0);
        assert_eq!(f.justified(), 2);
        // ...but finds 3 on the master: more than justified, not kept.
        f.found(3);
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 2, 0))), 0);
        // It finds 1: kept, still waiting for the rest.
        f.found(1);
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 2, 0))), 1);
        assert!(f.raising());
        // It finds 2, all that is justified: the raise is done.
        f.found(2);
        assert!(!f.raising());
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 2, 0))), 2);
        // A lower value found changes nothing.
        f.found(0);
        assert_eq!(f.step(Instant::now(), &r, &all(sight(true, 2, 0))), 2);
    }
}

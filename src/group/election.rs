//! Steps 2–4 in the group: feeding the election machine
//! ([`crate::quorum::election`]) and carrying out its actions, the voter's
//! side of `PICKET IS-DOWN`, and replica selection as the machine sees it.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::effects::Work;
use super::{Group, SwitchoverReply, ms};
use crate::addr::Addr;
use crate::events::EventKind;
use crate::failover::select::{self, Candidate, SelectionLimits};
use crate::failover::{FailoverError, NoGoodReplica};
use crate::metrics as m;
use crate::quorum::election::{Action, Ask, Election, Observation, Replicas};
use crate::quorum::peers::{IsDownQuery, IsDownReply};
use crate::quorum::state::{StateError, Vote};
use crate::quorum::table::PEER_TTL;
use crate::quorum::vote::may_vote;
use crate::resp::RespError;

use super::observe::Instance;

/// The group's replicas for selection (step 4).
pub(super) struct ReplicaSet<'a> {
    instances: &'a std::collections::BTreeMap<Addr, Box<Instance>>,
    master: &'a Addr,
    limits: SelectionLimits,
    now: Instant,
    /// The replication id of the master when it is down for having
    /// restarted with less than its replicas: a replica in that history
    /// took a copy of it.
    restarted_history: Option<&'a String>,
    /// The replicas whose INFO names another master than the group's:
    /// none of them is a switchover's candidate.
    elsewhere: std::collections::BTreeSet<Addr>,
}

impl<'a> ReplicaSet<'a> {
    pub(super) fn new(
        instances: &'a std::collections::BTreeMap<Addr, Box<Instance>>,
        master: &'a Addr,
        elsewhere: std::collections::BTreeSet<Addr>,
        cfg: &crate::config::GroupConfig,
        now: Instant,
    ) -> ReplicaSet<'a> {
        let master_down_for = instances
            .get(master)
            .and_then(|i| i.sdown.down_since())
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or_default();
        // A new history only: a master that reloaded its data continues
        // the one its replicas follow, and every one of them would be
        // taken for a copy of it (no candidate left: the simulation with
        // operations, seed 97).
        let restarted_history = instances
            .get(master)
            .filter(|m| m.sdown.rebooted())
            .and_then(|m| {
                m.info
                    .as_ref()
                    .and_then(|i| i.replid.as_ref())
                    .filter(|h| m.history_before_reboot.as_ref() != Some(*h))
            });
        ReplicaSet {
            instances,
            master,
            limits: SelectionLimits::new(cfg.ping_period(), cfg.down_after, master_down_for),
            now,
            restarted_history,
            elsewhere,
        }
    }

    fn candidate(&self, i: &Instance) -> Candidate {
        let info = i.info.as_ref();
        Candidate {
            copied_restarted_master: self
                .restarted_history
                .as_ref()
                .is_some_and(|h| info.and_then(|x| x.replid.as_ref()) == Some(h)),
            addr: i.addr.clone(),
            sdown: i.sdown.is_down(),
            connected: i.connected,
            last_ok_age: self.now.saturating_duration_since(i.sdown.last_valid()),
            // Only what it said on its current connection: an INFO read
            // before the connection was lost may describe a process that
            // has died since (a Dragonfly replica has no `run_id` for the
            // promotion to check; it restarted with less, was chosen on
            // its old INFO and copied by the re-point sent beside its
            // promotion: the simulation on Dragonfly, seed 346).
            info_age: i
                .info_at
                .filter(|t| Some(*t) >= i.connected_at)
                .map(|t| self.now.saturating_duration_since(t)),
            role: info.map(|x| x.role).unwrap_or_default(),
            priority: info.and_then(|x| x.priority),
            // A master's own offset (one promoted by an earlier attempt,
            // or one that came back as a master on its own).
            offset: info.and_then(|x| {
                x.replica_offset.or(x
                    .master_offset
                    .filter(|_| x.role == crate::probe::Role::Master))
            }),
            loading: info.is_some_and(|x| x.loading),
            sync_in_progress: info.is_some_and(|x| x.sync_in_progress),
            link_down_since: info
                .and_then(|x| x.master_link_down_since_secs)
                .map(Duration::from_secs),
            busy: i.busy,
        }
    }
}

impl ReplicaSet<'_> {
    /// The best candidate (only `to` when given), among the servers that
    /// report `role:slave` of the group's master only when
    /// `replicas_only` (a switchover: `FAILOVER TO` and `REPLTAKEOVER`
    /// hand over to nothing else; a replica of another master, chosen and
    /// retried until the command's timeout, was left following that
    /// master meanwhile, which restarted empty and was copied: the
    /// simulation with every fault, seed 20198).
    fn select_among(&self, to: Option<&Addr>, replicas_only: bool) -> Result<Addr, NoGoodReplica> {
        let cands: Vec<Candidate> = self
            .instances
            .values()
            .filter(|i| {
                // `--to` may give a named server's IP.
                i.addr != *self.master
                    && to.is_none_or(|t| i.addr.is_reported_as(i.ip, Some(&t.host), Some(t.port)))
            })
            .map(|i| self.candidate(i))
            .collect();
        if let Some(t) = to
            && cands.is_empty()
        {
            return Err(NoGoodReplica::Unknown(t.clone()));
        }
        let (cands, others): (Vec<Candidate>, Vec<Candidate>) = cands.into_iter().partition(|c| {
            !replicas_only
                || (c.role != crate::probe::Role::Master && !self.elsewhere.contains(&c.addr))
        });
        let sel = select::select(&cands, &self.limits);
        sel.chosen.ok_or_else(|| {
            let mut excluded = sel.excluded;
            excluded.extend(others.into_iter().map(|c| {
                let why = if c.role == crate::probe::Role::Master {
                    select::Exclusion::NotAReplica
                } else {
                    select::Exclusion::FollowsAnotherMaster
                };
                (c.addr, why)
            }));
            NoGoodReplica::NoneSuitable(excluded)
        })
    }
}

impl Replicas for ReplicaSet<'_> {
    fn select(&self, to: Option<&Addr>) -> Result<Addr, NoGoodReplica> {
        self.select_among(to, false)
    }

    fn select_replica(&self, to: Option<&Addr>) -> Result<Addr, NoGoodReplica> {
        self.select_among(to, true)
    }

    fn reports_replica(&self, addr: &Addr) -> bool {
        self.instances
            .get(addr)
            .and_then(|i| i.info.as_ref())
            .is_some_and(|x| x.role == crate::probe::Role::Replica)
    }

    fn eligible(&self, addr: &Addr) -> bool {
        addr != self.master
            && self
                .instances
                .get(addr)
                .is_some_and(|i| select::exclusion(&self.candidate(i), &self.limits).is_none())
    }
}

impl Group {
    /// The replicas whose last INFO names another master than the
    /// group's.
    pub(super) fn following_elsewhere(&self) -> std::collections::BTreeSet<Addr> {
        let ip = self.ip_of(&self.master);
        self.instances
            .values()
            .filter(|i| {
                i.info.as_ref().is_some_and(|x| {
                    x.role == crate::probe::Role::Replica
                        && !super::observe::names_master(x, &self.master, ip, self.cfg.admin_port)
                })
            })
            .map(|i| i.addr.clone())
            .collect()
    }

    /// Feed the election machine with what the group observes now, then
    /// carry out its actions.
    pub(super) fn step_election(
        &mut self,
        now: Instant,
        f: impl FnOnce(&mut Election, &Observation<'_>) -> Vec<Action>,
    ) {
        let (actions, tilt) = self.decide(now, f);
        let reason = self.reason.clone();
        self.dirty |= !actions.is_empty();
        self.run_election_actions(now, actions);
        self.update_reason(now, tilt);
        self.dirty |= self.reason != reason;
    }

    /// Run `f` on the election machine with the observation of `now`;
    /// returns its actions and whether TILT is active.
    fn decide(
        &mut self,
        now: Instant,
        f: impl FnOnce(&mut Election, &Observation<'_>) -> Vec<Action>,
    ) -> (Vec<Action>, bool) {
        let tilt = self.ctx.tilt.active(now);
        let promotion_out = self.peer_failing_over(now) || self.commands_out(now);
        let replicas = ReplicaSet::new(
            &self.instances,
            &self.master,
            self.following_elsewhere(),
            &self.cfg,
            now,
        );
        let o = Observation {
            now,
            master_sdown: self.master_sdown(),
            tilt,
            config_epoch: self.config_epoch,
            replicas: &replicas,
            rank: self.rank(),
            promotion_out,
        };
        (f(&mut self.election, &o), tilt)
    }

    /// A peer's hello says it sees the master down while the quorum is not
    /// reached yet: ask the peers now, not at the next ask period. A dead
    /// process is seen by every daemon within milliseconds of each other,
    /// and the first to see it asked before the others did.
    pub(super) fn on_peer_sdown_hellos(&mut self, now: Instant) {
        if self.failover.is_some() || self.election.odown_since().is_some() || !self.master_sdown()
        {
            return;
        }
        let reported = self.peers.iter().any(|e| {
            e.group(&self.cfg.name)
                .is_some_and(|g| g.sdown && g.master == self.master)
        });
        if reported {
            self.election.master_went_down();
            self.step_election(now, |e, o| e.tick(o));
        }
    }

    pub(super) fn run_election_actions(&mut self, now: Instant, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Ask(ask) => self.ask_peers(ask),
                Action::PersistNewEpoch => {
                    let seen = self.ctx.state.group(&self.cfg.name).vote_epoch;
                    self.effects.run(Work::StartElection { seen });
                }
                Action::StartFailover(ballot) => self.start_failover(now, ballot),
                Action::Event(kind, detail) => {
                    if matches!(kind, EventKind::Odown | EventKind::OdownCleared) {
                        let odown = kind == EventKind::Odown;
                        metrics::gauge!(m::MASTER_ODOWN, "group" => self.label.clone())
                            .set(if odown { 1.0 } else { 0.0 });
                    }
                    self.emit(kind, &detail);
                }
                Action::Ended(result) => {
                    metrics::counter!(m::ELECTIONS, "group" => self.label.clone(), "result" => result.as_str())
                        .increment(1);
                    if result == crate::quorum::election::ElectionResult::Won {
                        self.ctx.maybe_crash(
                            crate::context::CRASH_AFTER_ELECTION,
                            "after the election",
                        );
                    }
                }
                Action::Switchover(r) => {
                    if let Some(reply) = self.switchover_reply.take() {
                        reply.send(&self.cfg.name, r);
                    }
                }
            }
        }
    }

    fn ask_peers(&mut self, ask: Ask) {
        let (epoch, candidate, promote) = match ask.vote {
            Some((epoch, promote)) => (epoch, Some(self.ctx.id.clone()), Some(promote)),
            None => (self.ctx.state.current_epoch(), None, None),
        };
        let query = IsDownQuery {
            group: self.cfg.name.clone(),
            master: self.master.clone(),
            config_epoch: self.config_epoch,
            epoch,
            candidate,
            promote,
        };
        for peer in 0..self.ctx.peers.len() {
            self.effects.run(Work::AskPeer {
                peer,
                query: query.clone(),
            });
        }
    }

    pub(super) fn on_answer(
        &mut self,
        now: Instant,
        peer: usize,
        epoch: u64,
        at: Instant,
        result: Result<IsDownReply, RespError>,
    ) {
        match result {
            Ok(r) => {
                self.ctx.peer_table.mark_seen(peer, at);
                // The answer counts as the peer's liveness at once (the
                // rank and the reachable daemons the election reads).
                self.peers = self.ctx.peer_table.snapshot();
                self.step_election(now, |e, o| e.on_answer(o, peer, epoch, at, &r));
            }
            Err(e) => {
                let addr = self.ctx.peers.get(peer).map(|l| l.addr().to_string());
                tracing::debug!(group = %self.cfg.name, peer = ?addr, error = %e, "peer did not answer");
            }
        }
    }

    pub(super) fn on_epoch_persisted(
        &mut self,
        now: Instant,
        result: Result<Option<u64>, StateError>,
    ) {
        let result = match result {
            Ok(None) => {
                tracing::info!(group = %self.cfg.name, "voted for another daemon meanwhile; not starting an election");
                let actions = self.election.on_epoch_superseded(now);
                self.run_election_actions(now, actions);
                return;
            }
            Ok(Some(epoch)) => {
                metrics::gauge!(m::CURRENT_EPOCH).set(epoch as f64);
                tracing::info!(group = %self.cfg.name, epoch, "starting election");
                Ok(epoch)
            }
            Err(e) => {
                tracing::error!(group = %self.cfg.name, error = %e, "cannot persist the new epoch; not starting an election");
                Err(e.to_string())
            }
        };
        self.step_election(now, |e, o| e.on_epoch(o, result));
    }

    /// `SENTINEL FAILOVER` / `PICKET FAILOVER`.
    pub(super) fn request_switchover(
        &mut self,
        now: Instant,
        to: Option<Addr>,
        reply: SwitchoverReply,
    ) {
        if self.reports_replica_now(&self.master) {
            // Handed over or demoted already (a switchover of a leader
            // that stepped down, a peer's config not adopted yet): no
            // `FAILOVER` can run on it, and retrying one until
            // `failover_timeout` held every peer back (the simulation with
            // switchovers, seed 2796). A master reporting `role:slave` is
            // failed over as a down one is (invariant 11).
            reply.send(&self.cfg.name, Err(FailoverError::MasterDown));
            return;
        }
        let (actions, _) = self.decide(now, |e, o| e.request_switchover(o, to.as_ref()));
        let mut answer = None;
        let mut rest = Vec::new();
        for a in actions {
            match a {
                // Only an immediate refusal comes back at once.
                Action::Switchover(r) => answer = Some(r),
                other => rest.push(other),
            }
        }
        match answer {
            Some(r) => reply.send(&self.cfg.name, r),
            None => self.switchover_reply = Some(reply),
        }
        self.run_election_actions(now, rest);
    }

    /// The voter's side of `PICKET IS-DOWN`: whether this daemon sees the
    /// master down and, for a candidate that is not behind, a vote that is
    /// durable before the answer goes out.
    pub(super) fn answer_is_down(
        &mut self,
        now: Instant,
        q: IsDownQuery,
        reply: oneshot::Sender<Result<IsDownReply, StateError>>,
    ) {
        self.note_newer_epoch(q.epoch);
        if q.candidate.is_some()
            && q.epoch > self.config_epoch
            && let Some(p) = &q.promote
        {
            self.election.note_asked(now, q.epoch, p.clone());
        }
        let tilt = self.ctx.tilt.active(now);
        // The master of a newer config than this daemon's (one it has not
        // adopted) is down to it when it is down or no master at all.
        let newer_down = q.master != self.master
            && q.config_epoch > self.config_epoch
            && self.not_a_master_now(&q.master);
        let down = !tilt && (newer_down || (q.master == self.master && self.master_sdown()));
        let work = if may_vote(&q, &self.master, self.config_epoch, newer_down) {
            Work::Vote {
                query: q,
                down,
                reply,
            }
        } else {
            // No vote (a question, or a candidate with a stale view).
            Work::AnswerWithoutVote {
                query: q,
                down,
                reply,
            }
        };
        self.effects.run(work);
    }

    pub(super) fn on_voted(
        &mut self,
        now: Instant,
        q: IsDownQuery,
        down: bool,
        result: Result<Vote, StateError>,
        reply: oneshot::Sender<Result<IsDownReply, StateError>>,
    ) {
        let vote = match result {
            Ok(v) => v,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let mut actions = Vec::new();
        if self.election.on_vote_cast(now, &q, &vote, &mut actions) {
            metrics::counter!(m::VOTES_GRANTED, "group" => self.label.clone()).increment(1);
        }
        self.run_election_actions(now, actions);
        let _ = reply.send(Ok(IsDownReply {
            down,
            leader: vote.leader,
            leader_epoch: vote.epoch,
        }));
    }

    /// Daemons reachable now, this one included.
    pub(super) fn reachable_daemons(&self, now: Instant) -> usize {
        1 + self
            .peers
            .iter()
            .filter(|e| e.reachable(now, PEER_TTL))
            .count()
    }

    /// Why nothing happens when something might be expected (status), and
    /// the quorum-reachable gauge.
    fn update_reason(&mut self, now: Instant, tilt: bool) {
        let votes = self.election.down_votes(now, self.master_sdown());
        let odown = self.election.odown_since().is_some();
        let reachable = self.reachable_daemons(now);
        self.reason = if tilt {
            Some("stall protection (TILT) active: not acting".into())
        } else if self.master_sdown() && !odown {
            Some(format!(
                "master is down for this daemon but only {votes} of the required quorum {} agree{}",
                self.cfg.quorum,
                if reachable < self.cfg.quorum as usize {
                    format!(
                        " (only {reachable} of {} daemons reachable)",
                        self.ctx.daemons()
                    )
                } else {
                    String::new()
                }
            ))
        } else if odown
            && !self.election.busy()
            && self.election.backoff_until(now).is_none()
            && self.peer_failing_over(now)
        {
            Some("master is ODOWN; a peer reports a failover under way in a newer epoch: waiting for its config".into())
        } else if odown && self.election.no_candidate() {
            Some("master is ODOWN but no replica can be promoted (none eligible): looking again every probe period".into())
        } else {
            self.election
                .backoff_until(now)
                .filter(|_| odown)
                .map(|until| {
                    format!(
                        "master is ODOWN; next failover attempt in {} ms",
                        ms(until - now)
                    )
                })
        };
        let ok = reachable >= self.ctx.majority().max(self.cfg.quorum as usize);
        if self.quorum_reachable != Some(ok) {
            self.quorum_reachable = Some(ok);
            metrics::gauge!(m::QUORUM_REACHABLE, "group" => self.label.clone()).set(if ok {
                1.0
            } else {
                0.0
            });
        }
    }
}

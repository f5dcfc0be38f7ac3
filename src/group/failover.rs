//! Steps 5–8 in the group: running the failover machine
//! ([`crate::failover::machine`]) this daemon won an election for, and
//! carrying out its actions: fence, promote (or switch over), publish,
//! re-point.

use std::time::Duration;

use tokio::time::Instant;

use super::effects::Work;
use super::view::{FailoverOutcome, LastFailover};
use super::{Group, Running, ms};
use crate::addr::Addr;
use crate::discovery::{Fence, Reporter};
use crate::events::{Detail, EventKind};
use crate::failover::machine::{Action, Failover, Input, Kind, Outcome, Phase};
use crate::metrics as m;
use crate::probe::reboot::Identity;
use crate::probe::{Flavour, Role};
use crate::quorum::election::Ballot;

/// How long after a switchover's own timeout its command has ended for
/// sure: the executor's watch of the takeover (1 s more) and of the old
/// master serving again (2 s), with the connection's own time.
const SWITCHOVER_SLACK: Duration = Duration::from_secs(5);

impl Group {
    /// The election is won: start the failover machine (step 5 on).
    pub(super) fn start_failover(&mut self, now: Instant, ballot: Ballot) {
        tracing::info!(group = %self.cfg.name, epoch = ballot.epoch, candidate = %ballot.candidate, "elected leader; failing over");
        let replicas = self.replica_addrs();
        let flavour = self.flavour_of(&ballot.candidate);
        let candidate = self
            .instances
            .get(&ballot.candidate)
            .and_then(|i| i.info.as_deref())
            .map(Identity::of);
        let master_history = self
            .instances
            .get(&self.master)
            .and_then(|i| i.info.as_ref())
            .and_then(|i| i.replid.clone());
        let (machine, actions) = Failover::start(
            now,
            ballot.epoch,
            ballot.kind,
            self.master.clone(),
            ballot.candidate,
            self.cfg.flush_on_failover,
            replicas,
            self.cfg.parallel_syncs,
            self.cfg.failover_timeout,
            flavour,
        );
        self.failover = Some(Box::new(Running {
            machine,
            started: ballot.started,
            candidate,
            master_history,
            superseded: false,
        }));
        self.emit(EventKind::FailoverStateSelectSlave, &Detail::Master);
        self.run_failover_actions(actions);
    }

    /// Whether a planned switchover runs and its old master is still the
    /// one handing over (before the promotion: after it, the master
    /// watched is the new one, whose SDOWN ends the failover as an
    /// unplanned one's does).
    pub(super) fn switching_over(&self) -> bool {
        self.failover.as_ref().is_some_and(|r| {
            r.machine.kind == Kind::Switchover
                && matches!(r.machine.phase(), Phase::Fencing | Phase::Promoting)
        })
    }

    /// A switchover whose old master is gone becomes unplanned
    /// ([`Input::MasterDown`]), which gives up what the old master
    /// acknowledged and the candidate has not copied: only on evidence
    /// that its process is gone (refused, or back with less) or on ODOWN.
    /// This daemon's own silence is not enough: a leader cut off from
    /// everything for `down_after` came back with the master SDOWN from
    /// its own isolation, and 30 ms after sending `FAILOVER` promoted the
    /// candidate over a master alive with writes the candidate did not
    /// hold (the simulation with switchovers, seed 22407). Sentinel has
    /// no such fallback: its switchover waits for its timeout.
    pub(super) fn switchover_master_gone(&mut self, now: Instant) {
        if !self.switching_over() {
            return;
        }
        let definite = self
            .instances
            .get(&self.master)
            .and_then(|i| i.sdown.reason())
            .is_some_and(|r| r != crate::probe::sdown::Reason::Silence);
        if definite || self.election.odown_since().is_some() {
            self.machine_input(now, Input::MasterDown);
        }
    }

    pub(super) fn machine_input(&mut self, now: Instant, input: Input) {
        let Some(run) = self.failover.as_mut() else {
            return;
        };
        let actions = run.machine.step(now, input);
        self.run_failover_actions(actions);
    }

    /// A failover of this daemon's that published nothing left the
    /// backends fenced at its epoch: its master is routed again at the
    /// fence's epoch (`route_kept_master_at`), at once after an abort, and
    /// after `failover_timeout` after stepping down for a newer election
    /// that has published nothing newer by then (the simulation with
    /// operations, seed 544: the newer leader was cut off, and clients
    /// had no master); in both cases, if the server answers, once an INFO
    /// read since then says it is still a master. The INFO held at the
    /// abort can be from before it: a daemon stalled during its failover
    /// (the process stopped, a VM paused) held the master's from before
    /// its stall, while another daemon had demoted that server and it had
    /// restarted as a replica, and routed clients to it (the simulation
    /// with every fault, seed 109).
    pub(super) fn route_kept_master(&mut self, now: Instant) {
        let Some((epoch, due)) = self.kept_route else {
            return;
        };
        if self.config_epoch >= epoch {
            self.kept_route = None;
            return;
        }
        // A switchover's `FAILOVER` still under way on the server may yet
        // hand over: its command ends (by the server's own timeout at the
        // latest) before the master is routed again (the simulation with
        // every fault, seed 6066: the failover aborted 10 ms after its
        // last `FAILOVER`, which then handed over, and clients were routed
        // to a replica).
        if now < due
            || self.failover.is_some()
            || self.election.busy()
            || self.switchover_out(now)
            || self.commands_out(now)
        {
            return;
        }
        let master = self.master.clone();
        let Some(inst) = self.instances.get(&master) else {
            self.kept_route = None;
            return;
        };
        // A server that does not answer is routed at once, as before the
        // failover: clients meet the same errors either way, and the
        // fence is not left on the backends. One that answers is read
        // again first (its probe answers within a round trip).
        if inst.connected && inst.info_at.is_none_or(|t| t < due) {
            self.refresh_info(&master);
            return;
        }
        self.kept_route = None;
        if inst.connected && inst.info.as_ref().is_some_and(|i| i.role == Role::Replica) {
            tracing::warn!(group = %self.cfg.name, epoch, master = %master,
                "the kept master reports role:slave: not routing it again");
            return;
        }
        tracing::info!(group = %self.cfg.name, epoch, master = %master, "no failover published a master: routing the kept master again at this daemon's fence");
        self.route_kept_master_at(epoch);
    }

    /// `epoch` seen in a peer's hello or question: this daemon's failover,
    /// if older and not promoted yet, steps down for that election.
    pub(super) fn note_newer_epoch(&mut self, epoch: u64) {
        let Some(run) = self.failover.as_mut() else {
            return;
        };
        if epoch <= run.machine.epoch
            || !matches!(run.machine.phase(), Phase::Fencing | Phase::Promoting)
        {
            return;
        }
        tracing::warn!(group = %self.cfg.name, epoch = run.machine.epoch, newer = epoch, "another daemon began a newer election; this failover steps down");
        run.superseded = true;
        self.machine_input(self.now, Input::Superseded(epoch));
    }

    /// This daemon's process stalled: its failover, if not promoted yet,
    /// steps down as for a newer election it may not have heard of.
    pub(super) fn step_down_after_stall(&mut self, now: Instant) {
        let Some(run) = self.failover.as_mut() else {
            return;
        };
        if !matches!(run.machine.phase(), Phase::Fencing | Phase::Promoting) {
            return;
        }
        tracing::warn!(group = %self.cfg.name, epoch = run.machine.epoch, "this daemon stalled during its failover, before the promotion; the failover steps down");
        run.superseded = true;
        self.machine_input(now, Input::Stalled);
    }

    /// The result of a step of the failover of `epoch`: fed to the machine
    /// if that failover still runs.
    pub(super) fn on_failover_result(&mut self, now: Instant, epoch: u64, input: Input) {
        let answered = match &input {
            Input::Promoted(_) => Some(None),
            Input::RepointSent(replica, _) => Some(Some(replica)),
            _ => None,
        };
        if let Some(replica) = answered
            && let Some(k) = self
                .commands_out
                .iter()
                .position(|c| c.epoch == epoch && c.replica.as_ref() == replica)
        {
            self.commands_out.swap_remove(k);
            // A master kept while they were out is read again after this
            // answer before it is routed.
            if let Some((e, due)) = self.kept_route {
                self.kept_route = Some((e, due.max(now)));
            }
        }
        if input == Input::Promoted(Ok(())) {
            self.ctx
                .maybe_crash(crate::context::CRASH_AFTER_PROMOTION, "after the promotion");
        }
        if self
            .failover
            .as_ref()
            .is_some_and(|r| r.machine.epoch == epoch)
        {
            self.machine_input(now, input);
        }
    }

    /// The server this daemon keeps paused now (`CLIENT PAUSE … ALL`,
    /// renewed before it runs out), if any:
    /// - the old master of this daemon's unplanned failover until the
    ///   candidate is promoted: its replicas take no full copy from it and
    ///   its clients no acknowledgement that the failover would lose. The
    ///   fence waits for every gating backend (a Kubernetes endpoint
    ///   controller that lags or stalls), and a master that came back with
    ///   less meanwhile had its replicas copy it once the pause of its
    ///   judgement ended (the simulation with a gating Service: 28 seeds of
    ///   300); a leader restarted since may not have judged it (it never
    ///   saw its run id before). Not in a switchover, whose `FAILOVER TO`
    ///   pauses writes itself and must hand over.
    /// - this daemon's master, judged back with less than its replicas
    ///   hold, for up to twice `failover_timeout` from the judgement: the
    ///   daemons that voted for a leader which then died stand back
    ///   `failover_timeout` before they try again, and its replicas copied
    ///   it once the first pause ended (seed 292 of the simulation with a
    ///   gating Service; seed 752 with the network's faults). Not for
    ///   longer: a group that cannot decide gets its master back, empty,
    ///   rather than an outage without end. The same for the replica a
    ///   leader is promoting in a newer epoch, judged so while this
    ///   daemon is still on the old config.
    ///
    /// Not on Dragonfly, whose pause does not hold replication.
    pub(super) fn keep_paused(&mut self, now: Instant) {
        let pause = super::observe::reboot_pause(self.cfg.down_after);
        if self
            .pause_renewed_at
            .is_some_and(|t| now.saturating_duration_since(t) < pause / 2)
            || self.ctx.tilt.active(now)
        {
            return;
        }
        let failing_over = self.failover.as_ref().and_then(|run| {
            (run.machine.kind == Kind::Unplanned
                && matches!(run.machine.phase(), Phase::Fencing | Phase::Promoting))
            .then(|| run.machine.old_master.clone())
        });
        // The master, or the replica a leader is promoting in a newer
        // epoch, judged back with less (`observe.rs` `judge_reboot`).
        let judged = |a: Addr| {
            self.instances.get(&a).and_then(|m| {
                (m.sdown.rebooted()
                    && m.sdown.down_since().is_some_and(|t| {
                        now.saturating_duration_since(t) < self.cfg.failover_timeout * 2
                    }))
                .then_some(a)
            })
        };
        let rebooted =
            judged(self.master.clone()).or_else(|| self.intended_promotion(now).and_then(judged));
        let Some(target) = failing_over.or(rebooted) else {
            return;
        };
        if self.flavour_of(&target) == Flavour::Dragonfly
            || !self.instances.get(&target).is_some_and(|i| i.connected)
        {
            return;
        }
        self.pause_renewed_at = Some(now);
        let target = self.wire(&target);
        self.effects.run(Work::Pause {
            target,
            pause,
            after: Duration::ZERO,
        });
    }

    pub(super) fn flavour_of(&self, addr: &Addr) -> Flavour {
        self.instances
            .get(addr)
            .and_then(|i| i.info.as_ref())
            .map(|i| i.flavour)
            .or_else(|| {
                self.instances
                    .get(&self.master)
                    .and_then(|i| i.info.as_ref())
                    .map(|i| i.flavour)
            })
            .unwrap_or_default()
    }

    fn run_failover_actions(&mut self, actions: Vec<Action>) {
        let Some(run) = self.failover.as_ref() else {
            return;
        };
        self.dirty |= !actions.is_empty();
        let epoch = run.machine.epoch;
        let deadline = self.cfg.failover_timeout;
        for action in actions {
            match action {
                Action::Event(kind, detail) => self.emit(kind, &detail),
                Action::Fence { old_master } => {
                    let fence = Fence {
                        group: self.cfg.name.clone(),
                        epoch,
                        old_master: self.wire(&old_master),
                    };
                    self.effects.run(Work::Fence {
                        epoch,
                        fence,
                        deadline,
                    });
                }
                Action::Promote { candidate, flush } => {
                    let flavour = self.flavour_of(&candidate);
                    tracing::info!(group = %self.cfg.name, %candidate, flush, "promoting");
                    self.commands_out.push(CommandOut {
                        epoch,
                        replica: None,
                        until: self.now + deadline,
                    });
                    let chosen = self.failover.as_ref().and_then(|r| r.candidate.clone());
                    self.effects.run(Work::Promote {
                        epoch,
                        candidate,
                        flavour,
                        flush,
                        chosen,
                    });
                }
                Action::Switchover {
                    candidate,
                    old_master,
                } => {
                    let flavour = self.flavour_of(&old_master);
                    let timeout = (self.cfg.failover_timeout / 2)
                        .clamp(Duration::from_secs(1), Duration::from_secs(10));
                    let listed_as = self.listed_by_master(&candidate);
                    tracing::info!(group = %self.cfg.name, %candidate, %listed_as, "switching over");
                    self.switchovers_sent += 1;
                    let ends_in = timeout + SWITCHOVER_SLACK;
                    let ends_by = self.now + ends_in;
                    self.switchover_ends_by = self.switchover_ends_by.max(Some(ends_by));
                    self.effects.run(Work::Switchover {
                        epoch,
                        old_master,
                        flavour,
                        candidate,
                        listed_as,
                        timeout,
                        ends_by_unix: self.unix_now + ends_in.as_secs_f64().ceil() as u64,
                        history: self
                            .failover
                            .as_ref()
                            .and_then(|r| r.master_history.clone()),
                    });
                }
                Action::Publish { master } => {
                    let old = self.master.clone();
                    self.adopt_master(master, epoch, Reporter::Leader, None);
                    let topology = self.topology(Reporter::Leader, self.replaced(old));
                    self.persist_and_publish(topology, true);
                }
                Action::Repoint {
                    replica,
                    master,
                    beside_promotion,
                } => {
                    let flavour = self.flavour_of(&replica);
                    self.emit(
                        EventKind::SlaveReconfSent,
                        &Detail::Replica(replica.clone()),
                    );
                    let master = self.wire(&master);
                    // Beside the promotion: the candidate refuses replicas
                    // until its REPLICAOF NO ONE has begun, which this
                    // re-point may overtake; retried until then, within the
                    // time the promotion itself is given.
                    if beside_promotion {
                        self.commands_out.push(CommandOut {
                            epoch,
                            replica: Some(replica.clone()),
                            until: self.now + deadline,
                        });
                    }
                    let (retry_for, master_chosen) = if beside_promotion {
                        (
                            crate::failover::ops::PROMOTE_ROLE_WAIT.min(deadline),
                            self.failover.as_ref().and_then(|r| r.candidate.clone()),
                        )
                    } else {
                        (Duration::ZERO, None)
                    };
                    self.effects.run(Work::Repoint {
                        epoch: Some(epoch),
                        replica,
                        flavour,
                        master,
                        retry_for,
                        master_chosen,
                    });
                }
                Action::Finished(outcome) => self.finish_failover(outcome),
            }
        }
    }

    /// A replica reports the new master with its link up (step 8).
    pub(super) fn feed_reconfiguration(&mut self, addr: &Addr) {
        let Some(run) = self.failover.as_ref() else {
            return;
        };
        if run.machine.phase() != Phase::Reconfiguring {
            return;
        }
        let target = run.machine.candidate.clone();
        let target_ip = self.ip_of(&target);
        let synced = self
            .instances
            .get(addr)
            .and_then(|i| i.info.as_ref())
            .is_some_and(|i| {
                i.role == Role::Replica
                    && i.master_link_up
                    && super::observe::names_master(i, &target, target_ip, self.cfg.admin_port)
            });
        if synced {
            self.machine_input(self.now, Input::ReplicaSynced(addr.clone()));
        }
    }

    fn finish_failover(&mut self, outcome: Outcome) {
        let now = self.now;
        let Some(run) = self.failover.take() else {
            return;
        };
        let (result, to) = match &outcome {
            Outcome::Completed => (
                FailoverOutcome::Completed,
                Some(run.machine.candidate.clone()),
            ),
            Outcome::CompletedWithTimeout => (
                FailoverOutcome::CompletedWithTimeout,
                Some(run.machine.candidate.clone()),
            ),
            Outcome::Aborted(why) => (FailoverOutcome::Aborted(why.clone()), None),
        };
        metrics::counter!(m::FAILOVERS, "group" => self.label.clone(), "result" => result.metric_label())
            .increment(1);
        let duration = now.saturating_duration_since(run.started);
        if to.is_some() {
            metrics::histogram!(m::FAILOVER_DURATION, "group" => self.label.clone())
                .record(duration.as_secs_f64());
        }
        tracing::info!(group = %self.cfg.name, epoch = run.machine.epoch, outcome = ?outcome, duration_ms = ms(duration), "failover finished");
        let completed = to.is_some();
        self.last_failover = Some(LastFailover {
            epoch: run.machine.epoch,
            from: run.machine.old_master.clone(),
            to,
            outcome: result,
            at_unix: self.unix_now,
            duration_ms: Some(ms(duration)),
        });
        // A completed failover: the next one may start whenever needed.
        self.election.on_failover_end(now, completed);
        if !completed
            && self.master == run.machine.old_master
            && self.config_epoch <= run.machine.epoch
        {
            if run.superseded {
                // Stepped down for a newer election: that leader fences
                // and publishes above this fence. Routing the old master
                // again now would have that leader abandon its failover
                // for it (`adopt_from_peer`); if that election comes to
                // nothing, the master is routed again at this fence's
                // epoch after `failover_timeout` (`route_kept_master`).
                self.kept_route = Some((run.machine.epoch, now + self.cfg.failover_timeout));
            } else {
                // Aborted before publication, after the fence was asked
                // for: the group keeps its master, as Sentinel does, and
                // the backends that were fenced (all or some) route to it
                // again, with the fence's epoch. Left fenced, they stayed
                // without a master until another failover, which never
                // came once that master was back (an unplanned failover
                // whose candidate could not be promoted; the chaos test
                // with flush_on_failover). An aborted switchover's master
                // serves again at once; an unplanned one's may still be
                // down, as it was routed before the failover, and is
                // failed over again after the back-off; it is routed once
                // read as a master after the abort (`route_kept_master`).
                self.kept_route = Some((run.machine.epoch, now));
                self.route_kept_master(now);
            }
        }
    }

    /// A promotion, or a re-point sent beside one, of a failover of this
    /// daemon's that is over (given up for a newer config, stepped down,
    /// aborted) has not answered yet: on Dragonfly it takes effect when it
    /// answers (a `REPLICAOF NO ONE` at the end of the replica's retry
    /// sleep, a re-point once its master's promotion has ended), and a
    /// failover started meanwhile chose its candidate without it (the
    /// simulation on Dragonfly, seed 1042: a daemon gave up its failover
    /// for a peer's newer config and, 100 ms later, promoted and published
    /// the replica its own earlier re-point then made a replica of the
    /// other candidate). No election starts here until they have
    /// answered, or until the failover's time is up for a lost answer.
    pub(super) fn commands_out(&mut self, now: Instant) -> bool {
        self.commands_out.retain(|c| now < c.until);
        let running = self.failover.as_ref().map(|r| r.machine.epoch);
        self.commands_out.iter().any(|c| Some(c.epoch) != running)
    }

    /// A switchover command of this daemon may still hand over on the
    /// server: its result has not come back, and its end is not past.
    /// The deadline stands in for a result that never comes (the
    /// executor's task lost with a stalled or restarting process): by
    /// then the server's own `FAILOVER` timeout has ended it.
    pub(super) fn switchover_out(&self, now: Instant) -> bool {
        (self.switchovers_sent > 0 && self.switchover_ends_by.is_some_and(|t| now < t))
            || self.switchover_before_start.is_some_and(|t| now < t)
    }

    /// Route the group's master again, at `epoch` (a fence of this
    /// daemon's that no publication followed), in every backend. Not a
    /// master that reports `role:slave` (`route_kept_master` asks): it was
    /// handed over or demoted meanwhile (a switchover's `FAILOVER` that
    /// went on on the server, another daemon's newer config), and routing
    /// clients there would send them to a replica (the simulation with
    /// every fault, seed 2501). The backends stay fenced until a newer
    /// config is published.
    fn route_kept_master_at(&mut self, epoch: u64) {
        let master = self.master.clone();
        self.adopt_master(master, epoch, Reporter::Leader, None);
        let topology = self.topology(Reporter::Leader, None);
        self.persist_and_publish(topology, false);
    }
}

/// A promotion (`replica` None) or a re-point beside it, sent by this
/// daemon's failover of `epoch`, whose answer has not come back; waited
/// for until `until` (`Group::commands_out`).
#[derive(Debug)]
pub(super) struct CommandOut {
    epoch: u64,
    replica: Option<Addr>,
    until: Instant,
}

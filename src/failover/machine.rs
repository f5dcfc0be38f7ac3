//! The failover state machine (failover steps 5–8 of ARCHITECTURE.md and the
//! planned switchover), pure: inputs and time in, actions out. The group
//! task carries the actions out and feeds their results back.
//!
//! ```text
//! Fencing ──ok──▶ Promoting ──ok──▶ Publishing ──ok──▶ Reconfiguring ──▶ Done
//!    │               │  ▲ retry (flush failed)                    (timeout: done anyway)
//!    └──timeout──────┴──┴──────────▶ Aborted (never after publication)
//! ```
//!
//! Gating (invariants 4 and 5): the old master is fenced before the
//! promotion is even attempted, and the new master is published only after
//! the promotion (and, with `flush_on_failover`, the flush) succeeded. Once
//! the new master is published the failover can only finish.
//!
//! On Dragonfly an unplanned failover without flush also sends the first
//! `parallel_syncs` re-points beside the promotion, not after its
//! publication ([`Failover::repoints_beside_promotion`]): a re-point is not
//! routing, so gating is untouched, and it stops those replicas from
//! reconnecting to a master that restarted empty while the promotion's
//! answer is still pending.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::addr::Addr;
use crate::discovery::runner::RunnerError;
use crate::events::{Detail, EventKind};
use crate::failover::CommandFailed;
use crate::probe::Flavour;

/// Unplanned failover or planned switchover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The master is down: `REPLICAOF NO ONE` on the candidate.
    Unplanned,
    /// The master is alive: `FAILOVER` (Redis/Valkey) or `REPLTAKEOVER`
    /// (Dragonfly). Never flushes.
    Switchover,
}

/// Where the failover is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for the discovery backends to drop the old master.
    Fencing,
    /// Promoting (and flushing) the candidate.
    Promoting,
    /// Persisting and publishing the new master.
    Publishing,
    /// Re-pointing the other replicas.
    Reconfiguring,
    /// Finished: the new master is in place.
    Done,
    /// Given up before publication.
    Aborted,
}

impl Phase {
    /// Name for status and Sentinel's `failover-state` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Fencing => "fence_old_master",
            Phase::Promoting => "send_slaveof_noone",
            Phase::Publishing => "update_config",
            Phase::Reconfiguring => "reconf_slaves",
            Phase::Done => "done",
            Phase::Aborted => "aborted",
        }
    }
}

/// Why a promotion step failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromoteError {
    /// REPLICAOF NO ONE / FAILOVER / REPLTAKEOVER failed or the role did not change.
    Promotion(String),
    /// FLUSHALL failed or DBSIZE was not 0 afterwards.
    Flush(String),
    /// The switchover did not complete in time and the old master serves again.
    SwitchoverTimedOut(String),
    /// The candidate is another process than the one chosen (it restarted
    /// since): promoting it would publish whatever it holds now, empty
    /// perhaps, and retrying cannot undo that.
    CandidateRestarted(String),
    /// A switchover's old master is a replica now (handed over or demoted
    /// by another daemon), or in another replication history than when the
    /// switchover began (handed over and back, restarted): no `FAILOVER`
    /// can run on it, or one would hand over a state of the group this
    /// failover did not choose for, and retrying until the failover
    /// timeout held every peer back.
    OldMasterNotMaster(String),
}

impl PromoteError {
    /// What a refused `FAILOVER TO` means: Redis and Valkey answer "ERR
    /// FAILOVER is not valid when server is a replica." on a replica
    /// (`replication.c`, `failoverCommand`); anything else may pass.
    pub fn from_failover_refusal(message: String) -> PromoteError {
        if message.contains("not valid when server is a replica") {
            PromoteError::OldMasterNotMaster(message)
        } else {
            PromoteError::Promotion(message)
        }
    }
}

/// An input to the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// Time passed.
    Tick,
    /// The fence was confirmed by the required backends (or failed).
    Fenced(Result<(), RunnerError>),
    /// The promotion step ended.
    Promoted(Result<(), PromoteError>),
    /// The new config was persisted and published (required backends).
    Published(Result<(), RunnerError>),
    /// A REPLICAOF to a replica was sent (or failed).
    RepointSent(Addr, Result<(), CommandFailed>),
    /// A replica reports the new master with its link up.
    ReplicaSynced(Addr),
    /// The group's master went down (SDOWN, or back with less than its
    /// replicas hold): before the publication the old master, after it
    /// the new one.
    MasterDown,
    /// Another daemon began an election in this newer epoch: it no
    /// longer waits for this one.
    Superseded(u64),
    /// This daemon's process stalled (TILT): another daemon may have
    /// begun a newer election meanwhile, unheard.
    Stalled,
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Fence `old_master` in every backend with `epoch`.
    Fence {
        /// The master leaving routing.
        old_master: Addr,
    },
    /// Promote the candidate (`flush`: FLUSHALL then check DBSIZE = 0).
    Promote {
        /// The replica.
        candidate: Addr,
        /// Whether to flush it before it can be advertised.
        flush: bool,
    },
    /// Planned switchover to the candidate.
    Switchover {
        /// The replica that takes over.
        candidate: Addr,
        /// The master handing over.
        old_master: Addr,
    },
    /// Persist the new config and publish it; emit `+switch-master`.
    Publish {
        /// The new master.
        master: Addr,
    },
    /// `REPLICAOF new_master` on a replica.
    Repoint {
        /// The replica.
        replica: Addr,
        /// Its new master.
        master: Addr,
        /// Sent beside the promotion, before the new master answered:
        /// retried while the candidate refuses replicas because its
        /// promotion has not begun yet.
        beside_promotion: bool,
    },
    /// Publish an event.
    Event(EventKind, Detail),
    /// The failover ended.
    Finished(Outcome),
}

/// How a failover ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The new master is published and the replicas re-pointed.
    Completed,
    /// Published; some replicas did not confirm in time.
    CompletedWithTimeout,
    /// Nothing was published.
    Aborted(String),
}

/// One failover in progress.
#[derive(Debug, Clone)]
pub struct Failover {
    /// The epoch won for it.
    pub epoch: u64,
    /// Unplanned or planned.
    pub kind: Kind,
    /// The master being replaced.
    pub old_master: Addr,
    /// The replica being promoted.
    pub candidate: Addr,
    /// Flush before publication.
    pub flush: bool,
    /// `flush_on_failover`: a switchover that becomes unplanned (its old
    /// master gone) flushes as an unplanned failover does.
    flush_if_unplanned: bool,
    /// Re-point the first replicas beside the promotion (Dragonfly,
    /// unplanned, no flush): [`Failover::repoints_beside_promotion`].
    early_repoints: bool,
    /// Re-points sent beside the promotion whose result is not known yet:
    /// one that fails is sent again after the publication.
    sent_early: BTreeSet<Addr>,
    phase: Phase,
    deadline: Instant,
    retry_at: Option<Instant>,
    todo: VecDeque<Addr>,
    in_flight: BTreeMap<Addr, Instant>,
    parallel_syncs: usize,
    reconf_timeout: Duration,
    reconf_deadline: Option<Instant>,
}

/// Delay before retrying a failed promotion or flush.
pub const PROMOTE_RETRY: Duration = Duration::from_millis(200);

impl Failover {
    /// Start a failover (the election is already won). Returns the machine
    /// and its first actions. `replicas` are the other replicas to re-point;
    /// `flavour` is the candidate's.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        now: Instant,
        epoch: u64,
        kind: Kind,
        old_master: Addr,
        candidate: Addr,
        flush_on_failover: bool,
        replicas: Vec<Addr>,
        parallel_syncs: u32,
        failover_timeout: Duration,
        flavour: Flavour,
    ) -> (Failover, Vec<Action>) {
        let todo = replicas
            .into_iter()
            .filter(|r| *r != candidate && *r != old_master)
            .collect();
        let flush = flush_on_failover && kind == Kind::Unplanned;
        let mut f = Failover {
            epoch,
            kind,
            flush,
            flush_if_unplanned: flush_on_failover,
            early_repoints: Self::repoints_beside_promotion(kind, flush, flavour),
            sent_early: BTreeSet::new(),
            old_master: old_master.clone(),
            candidate: candidate.clone(),
            phase: Phase::Fencing,
            deadline: now + failover_timeout,
            retry_at: None,
            todo,
            in_flight: BTreeMap::new(),
            parallel_syncs: parallel_syncs.max(1) as usize,
            // Sentinel's slave-reconf-timeout, bounded by the failover timeout.
            reconf_timeout: failover_timeout.min(Duration::from_secs(10)),
            reconf_deadline: None,
        };
        let step = if crate::mutation::planted(crate::mutation::Mutation::SkipFence) {
            f.phase = Phase::Promoting;
            f.promote_action()
        } else {
            Action::Fence { old_master }
        };
        let actions = vec![
            Action::Event(EventKind::SelectedSlave, Detail::Replica(candidate.clone())),
            step,
        ];
        (f, actions)
    }

    /// Whether the first `parallel_syncs` replicas are re-pointed at the
    /// moment of the promotion instead of after its publication.
    ///
    /// Dragonfly only, unplanned only, and not with `flush_on_failover`:
    /// - A Dragonfly replica retries its lost master every 500 ms and its
    ///   `REPLICAOF NO ONE` answers only after that sleep (Dragonfly
    ///   v1.40.1 `src/server/replica.cc:246` `MainReplicationFb`:
    ///   `SleepFor(500ms)`; `server_family.cc:3360` `ReplicaOfNoOne` joins
    ///   that fiber in `Replica::Stop`, `replica.cc:182`). Nothing holds a
    ///   restarted Dragonfly back (no pause, no sync hold), so the other
    ///   replicas' next retry, at the same moment as that answer, would
    ///   take a full copy of a master that restarted empty before a
    ///   re-point sent after the answer arrives. Their `REPLICAOF` stops
    ///   that retry.
    /// - Sent early, it is still safe: Dragonfly refuses a replica of a
    ///   replica (`ReplConf`: "Replicating a replica is unsupported"), so
    ///   the re-point either fails without touching the replica's current
    ///   replication (it is retried, then sent again after publication) or
    ///   waits on the candidate's `replicaof_mu_` until the candidate is a
    ///   master (`server_family.cc:3524-3529`; the replica greets its new
    ///   master before it stops the old replication, 3421 then 3439). It
    ///   then stops that replica's own retry a few round trips before the
    ///   retry, due at the same moment, could drop anything: a race won by
    ///   that margin on a real server, not by construction.
    /// - Redis and Valkey accept a replica of a replica: sent early, it
    ///   would chain the replica under a server that is still a replica of
    ///   the dead master. They need none of it either: their `REPLICAOF NO
    ///   ONE` answers at once and the sync hold keeps a restarted master
    ///   from serving full copies meanwhile.
    /// - A switchover's master is alive: nothing to race.
    /// - With `flush_on_failover` the group's data is dropped anyway, and
    ///   the replicas follow the new master only once it is flushed.
    pub fn repoints_beside_promotion(kind: Kind, flush: bool, flavour: Flavour) -> bool {
        kind == Kind::Unplanned && !flush && flavour == Flavour::Dragonfly
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the machine has finished (done or aborted).
    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Done | Phase::Aborted)
    }

    fn promote_action(&self) -> Action {
        let kind = match self.kind {
            Kind::Switchover
                if crate::mutation::planted(
                    crate::mutation::Mutation::SwitchoverWithoutHandover,
                ) =>
            {
                Kind::Unplanned
            }
            k => k,
        };
        match kind {
            Kind::Unplanned => Action::Promote {
                candidate: self.candidate.clone(),
                flush: self.flush,
            },
            Kind::Switchover => Action::Switchover {
                candidate: self.candidate.clone(),
                old_master: self.old_master.clone(),
            },
        }
    }

    fn abort(&mut self, why: String) -> Vec<Action> {
        self.phase = Phase::Aborted;
        let ev = match self.kind {
            Kind::Switchover => EventKind::AbortSwitchover,
            Kind::Unplanned => EventKind::AbortSlaveTimeout,
        };
        vec![
            Action::Event(ev, Detail::MasterAnd(why.clone())),
            Action::Finished(Outcome::Aborted(why)),
        ]
    }

    /// Up to `parallel_syncs` re-points in flight; `beside_promotion`
    /// while the promotion is not confirmed yet.
    fn send_repoints(&mut self, now: Instant, beside_promotion: bool) -> Vec<Action> {
        let mut out = Vec::new();
        while self.in_flight.len() < self.parallel_syncs {
            let Some(r) = self.todo.pop_front() else {
                break;
            };
            self.in_flight.insert(r.clone(), now + self.reconf_timeout);
            if beside_promotion {
                self.sent_early.insert(r.clone());
            }
            out.push(Action::Repoint {
                replica: r,
                master: self.candidate.clone(),
                beside_promotion,
            });
        }
        out
    }

    fn next_repoints(&mut self, now: Instant) -> Vec<Action> {
        let mut out = self.send_repoints(now, false);
        if self.todo.is_empty() && self.in_flight.is_empty() {
            self.phase = Phase::Done;
            out.push(Action::Event(EventKind::FailoverEnd, Detail::Master));
            out.push(Action::Finished(Outcome::Completed));
        }
        out
    }

    /// Feed an input at `now`.
    pub fn step(&mut self, now: Instant, input: Input) -> Vec<Action> {
        if self.is_finished() {
            return Vec::new();
        }
        match (self.phase, input) {
            (Phase::Fencing, Input::Fenced(Ok(())))
                if crate::mutation::planted(crate::mutation::Mutation::PublishBeforePromotion) =>
            {
                self.phase = Phase::Publishing;
                vec![
                    self.promote_action(),
                    Action::Publish {
                        master: self.candidate.clone(),
                    },
                ]
            }
            (Phase::Fencing, Input::Fenced(Ok(()))) => {
                self.phase = Phase::Promoting;
                let mut out = vec![
                    Action::Event(EventKind::FailoverStateSendSlaveofNoone, Detail::Master),
                    self.promote_action(),
                ];
                if self.early_repoints {
                    out.extend(self.send_repoints(now, true));
                }
                out
            }
            (Phase::Fencing, Input::Fenced(Err(e))) => {
                // The runner already retried until the deadline (or a
                // backend holds a newer epoch): promoting now could leave
                // two masters in routing.
                self.abort(format!("fencing the old master failed: {e}"))
            }
            (Phase::Promoting, Input::Promoted(Ok(()))) => {
                self.phase = Phase::Publishing;
                vec![
                    Action::Event(
                        EventKind::PromotedSlave,
                        Detail::Replica(self.candidate.clone()),
                    ),
                    Action::Publish {
                        master: self.candidate.clone(),
                    },
                ]
            }
            (Phase::Promoting, Input::Promoted(Err(PromoteError::CandidateRestarted(e)))) => {
                self.abort(format!("the candidate restarted: {e}"))
            }
            (Phase::Fencing | Phase::Promoting, Input::Superseded(epoch)) if epoch > self.epoch => {
                // A leader whose promotion has not been confirmed yet
                // steps down: the others' newer leader promotes (and
                // re-points) on its own, and a retry of this one reaching
                // its candidate afterwards made it a second master and
                // re-pointed the newer master to it (the simulation with
                // operations, seeds 674 and 807: a leader cut off from
                // everything retried its promotion every 200 ms until
                // `failover_timeout`). Once promoted, it publishes: the
                // backends refuse its epoch if the newer one came first.
                let why = format!("a newer election began (epoch {epoch})");
                self.phase = Phase::Aborted;
                vec![
                    // Sentinel's name for a leader that lost its election.
                    Action::Event(EventKind::AbortNotElected, Detail::MasterAnd(why.clone())),
                    Action::Finished(Outcome::Aborted(why)),
                ]
            }
            (Phase::Fencing | Phase::Promoting, Input::Stalled) => {
                // As for a newer election: the stall may have hidden one,
                // which promoted and published while this process did not
                // run; the results queued meanwhile (a fence confirmed)
                // then led this one on to promote its own candidate and
                // re-point the newer master to it (the simulation with
                // every fault, seed 4346: a leader stalled 3 s after its
                // fence). Sentinel's failover does not run in TILT either.
                let why = "this daemon stalled before its promotion (TILT)".to_string();
                self.phase = Phase::Aborted;
                vec![
                    Action::Event(EventKind::AbortNotElected, Detail::MasterAnd(why.clone())),
                    Action::Finished(Outcome::Aborted(why)),
                ]
            }
            (Phase::Promoting, Input::MasterDown) if self.kind == Kind::Switchover => {
                // The old master died or came back with less during the
                // handover: it will never hand over (a restarted server
                // has forgotten its FAILOVER), and retrying it until the
                // failover timeout let its replicas copy an emptied master
                // once the sync hold ended (the simulation with switchovers,
                // seed 45). It is fenced already: promote the candidate as
                // an unplanned failover does. What it acknowledged and the
                // candidate had not copied is lost with it either way.
                self.kind = Kind::Unplanned;
                self.flush = self.flush_if_unplanned;
                self.retry_at = None;
                vec![
                    Action::Event(EventKind::FailoverStateSendSlaveofNoone, Detail::Master),
                    self.promote_action(),
                ]
            }
            (Phase::Promoting, Input::Promoted(Err(PromoteError::SwitchoverTimedOut(e))))
                if self.kind == Kind::Switchover =>
            {
                self.abort(format!("switchover timed out: {e}"))
            }
            (Phase::Promoting, Input::Promoted(Err(PromoteError::OldMasterNotMaster(e))))
                if self.kind == Kind::Switchover =>
            {
                // The group fails a master reporting `role:slave` over
                // (invariant 11), with a fresh election and view (the
                // simulation with switchovers, seed 4824: retried for
                // `failover_timeout` while every peer stood back).
                self.abort(format!("the old master can no longer hand over: {e}"))
            }
            (Phase::Promoting, Input::Promoted(Err(e))) => {
                if now + PROMOTE_RETRY >= self.deadline {
                    let what = match e {
                        PromoteError::Flush(m) => format!("flush failed: {m}"),
                        PromoteError::Promotion(m)
                        | PromoteError::SwitchoverTimedOut(m)
                        | PromoteError::CandidateRestarted(m)
                        | PromoteError::OldMasterNotMaster(m) => {
                            format!("promotion failed: {m}")
                        }
                    };
                    self.abort(what)
                } else {
                    self.retry_at = Some(now + PROMOTE_RETRY);
                    Vec::new()
                }
            }
            (Phase::Publishing, Input::Published(result)) => {
                // Publication is not undone: the new master is persisted and
                // at least announced on the API. A backend that did not
                // confirm keeps being retried by the discovery runner.
                let mut out = vec![Action::Event(
                    EventKind::FailoverStateReconfSlaves,
                    Detail::Master,
                )];
                if let Err(e) = result {
                    out.push(Action::Event(
                        EventKind::PublishIncomplete,
                        Detail::MasterAnd(e.to_string()),
                    ));
                }
                self.phase = Phase::Reconfiguring;
                self.reconf_deadline = Some(now + self.reconf_timeout.max(Duration::from_secs(1)));
                // The re-points sent beside the promotion get their whole
                // time from now, as if sent now.
                for t in self.in_flight.values_mut() {
                    *t = now + self.reconf_timeout;
                }
                out.extend(self.next_repoints(now));
                out
            }
            (phase, Input::RepointSent(addr, Err(_))) if self.sent_early.remove(&addr) => {
                // A re-point sent beside the promotion that failed (the
                // candidate was not promoting yet, or it failed): nothing
                // changed on the replica; it is sent again after
                // publication, as every other one.
                self.in_flight.remove(&addr);
                self.todo.push_front(addr);
                if phase == Phase::Reconfiguring {
                    self.next_repoints(now)
                } else {
                    Vec::new()
                }
            }
            (_, Input::RepointSent(addr, Ok(()))) if self.sent_early.remove(&addr) => Vec::new(),
            (Phase::Reconfiguring, Input::RepointSent(addr, Err(e))) => {
                // Count it as done: the group task fixes wrong replicas
                // later (+fix-slave-config), as Sentinel does.
                self.in_flight.remove(&addr);
                let mut out = vec![Action::Event(
                    EventKind::SlaveReconfFailed,
                    Detail::MasterAnd(format!("{addr} {e}")),
                )];
                out.extend(self.next_repoints(now));
                out
            }
            (Phase::Reconfiguring, Input::RepointSent(_, Ok(()))) => Vec::new(),
            (Phase::Reconfiguring, Input::MasterDown) => {
                // Re-pointing replicas at a dead master helps nobody, and a
                // failover that runs holds the next one back: end it now
                // (as at its reconfiguration timeout), so that the daemons
                // can fail the new master over at once. Before, a master
                // that died or came back empty while its replicas were being
                // re-pointed waited up to the reconfiguration timeout, and
                // its replicas copied it meanwhile (the group simulation).
                self.todo.clear();
                self.in_flight.clear();
                self.phase = Phase::Done;
                vec![
                    Action::Event(EventKind::FailoverEndForTimeout, Detail::Master),
                    Action::Finished(Outcome::CompletedWithTimeout),
                ]
            }
            (Phase::Reconfiguring, Input::ReplicaSynced(addr)) => {
                if self.in_flight.remove(&addr).is_some() {
                    let mut out = vec![Action::Event(
                        EventKind::SlaveReconfDone,
                        Detail::Replica(addr.clone()),
                    )];
                    out.extend(self.next_repoints(now));
                    out
                } else {
                    // Already following the new master (e.g. it re-pointed
                    // itself): nothing to send.
                    if let Some(pos) = self.todo.iter().position(|a| *a == addr) {
                        self.todo.remove(pos);
                    }
                    if self.todo.is_empty() && self.in_flight.is_empty() {
                        self.next_repoints(now)
                    } else {
                        Vec::new()
                    }
                }
            }
            (_, Input::Tick) => self.tick(now),
            _ => Vec::new(),
        }
    }

    fn tick(&mut self, now: Instant) -> Vec<Action> {
        match self.phase {
            Phase::Fencing if now >= self.deadline => {
                self.abort("fencing the old master did not complete in failover_timeout".into())
            }
            Phase::Promoting => {
                if let Some(at) = self.retry_at
                    && now >= at
                {
                    self.retry_at = None;
                    return vec![self.promote_action()];
                }
                if now >= self.deadline && self.retry_at.is_some() {
                    return self.abort("promotion did not succeed in failover_timeout".into());
                }
                Vec::new()
            }
            Phase::Reconfiguring => {
                let mut out = Vec::new();
                let expired: Vec<Addr> = self
                    .in_flight
                    .iter()
                    .filter(|(_, t)| now >= **t)
                    .map(|(a, _)| a.clone())
                    .collect();
                for a in expired {
                    self.in_flight.remove(&a);
                    out.push(Action::Event(
                        EventKind::SlaveReconfSentTimeout,
                        Detail::Replica(a.clone()),
                    ));
                }
                if !out.is_empty() {
                    out.extend(self.next_repoints(now));
                }
                if !self.is_finished()
                    && self
                        .reconf_deadline
                        .is_some_and(|d| now >= d + self.reconf_timeout * 2)
                {
                    // Sentinel's +failover-end-for-timeout: send the rest
                    // best-effort and finish.
                    for r in self
                        .todo
                        .drain(..)
                        .chain(std::mem::take(&mut self.in_flight).into_keys())
                    {
                        out.push(Action::Repoint {
                            replica: r,
                            master: self.candidate.clone(),
                            beside_promotion: false,
                        });
                    }
                    self.phase = Phase::Done;
                    out.push(Action::Event(
                        EventKind::FailoverEndForTimeout,
                        Detail::Master,
                    ));
                    out.push(Action::Finished(Outcome::CompletedWithTimeout));
                }
                out
            }
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn a(p: u16) -> Addr {
        Addr::new("127.0.0.1", p)
    }

    /// Whether `acts` end the failover as aborted.
    fn aborted(acts: &[Action]) -> bool {
        acts.iter()
            .any(|x| matches!(x, Action::Finished(Outcome::Aborted(_))))
    }

    fn start(kind: Kind, flush: bool, replicas: Vec<Addr>, ps: u32) -> (Failover, Vec<Action>) {
        start_on(Flavour::Redis, kind, flush, replicas, ps)
    }

    fn start_on(
        flavour: Flavour,
        kind: Kind,
        flush: bool,
        replicas: Vec<Addr>,
        ps: u32,
    ) -> (Failover, Vec<Action>) {
        Failover::start(
            Instant::now(),
            7,
            kind,
            a(1),
            a(2),
            flush,
            replicas,
            ps,
            Duration::from_secs(5),
            flavour,
        )
    }

    fn repoints(actions: &[Action]) -> Vec<(Addr, bool)> {
        actions
            .iter()
            .filter_map(|x| match x {
                Action::Repoint {
                    replica,
                    beside_promotion,
                    ..
                } => Some((replica.clone(), *beside_promotion)),
                _ => None,
            })
            .collect()
    }

    fn only(actions: &[Action], f: impl Fn(&Action) -> bool) -> Vec<&Action> {
        actions.iter().filter(|x| f(x)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn gated_order_fence_promote_publish_repoint() {
        let (mut f, acts) = start(Kind::Unplanned, true, vec![a(2), a(3), a(4)], 1);
        assert!(acts.contains(&Action::Fence { old_master: a(1) }));
        assert!(
            !acts
                .iter()
                .any(|x| matches!(x, Action::Promote { .. } | Action::Publish { .. }))
        );
        // Nothing is promoted before the fence is confirmed.
        assert!(f.step(Instant::now(), Input::Tick).is_empty());
        let acts = f.step(Instant::now(), Input::Fenced(Ok(())));
        assert!(acts.contains(&Action::Promote {
            candidate: a(2),
            flush: true
        }));
        assert!(!acts.iter().any(|x| matches!(x, Action::Publish { .. })));
        let acts = f.step(Instant::now(), Input::Promoted(Ok(())));
        assert!(acts.contains(&Action::Publish { master: a(2) }));
        let acts = f.step(Instant::now(), Input::Published(Ok(())));
        // parallel_syncs = 1: one re-point at a time, candidate excluded.
        let reps = only(&acts, |x| matches!(x, Action::Repoint { .. }));
        assert_eq!(
            reps,
            vec![&Action::Repoint {
                replica: a(3),
                master: a(2),
                beside_promotion: false,
            }]
        );
        let acts = f.step(Instant::now(), Input::ReplicaSynced(a(3)));
        let reps = only(&acts, |x| matches!(x, Action::Repoint { .. }));
        assert_eq!(
            reps,
            vec![&Action::Repoint {
                replica: a(4),
                master: a(2),
                beside_promotion: false,
            }]
        );
        let acts = f.step(Instant::now(), Input::ReplicaSynced(a(4)));
        assert!(acts.contains(&Action::Finished(Outcome::Completed)));
        assert_eq!(f.phase(), Phase::Done);
    }

    #[tokio::test(start_paused = true)]
    async fn parallel_syncs_bounds_in_flight() {
        let (mut f, _) = start(Kind::Unplanned, false, vec![a(3), a(4), a(5)], 2);
        f.step(Instant::now(), Input::Fenced(Ok(())));
        f.step(Instant::now(), Input::Promoted(Ok(())));
        let acts = f.step(Instant::now(), Input::Published(Ok(())));
        assert_eq!(
            only(&acts, |x| matches!(x, Action::Repoint { .. })).len(),
            2
        );
    }

    #[tokio::test(start_paused = true)]
    async fn failed_flush_is_retried_then_aborted_without_publication() {
        let began = Instant::now();
        let (mut f, _) = start(Kind::Unplanned, true, vec![], 1);
        f.step(Instant::now(), Input::Fenced(Ok(())));
        let mut promotes = 1;
        let mut published = false;
        for _ in 0..200 {
            let acts = f.step(
                Instant::now(),
                Input::Promoted(Err(PromoteError::Flush("ERR unknown command".into()))),
            );
            published |= acts.iter().any(|x| matches!(x, Action::Publish { .. }));
            if f.is_finished() {
                assert!(acts.iter().any(|x| matches!(x, Action::Finished(Outcome::Aborted(m)) if m.contains("flush failed"))));
                break;
            }
            advance(PROMOTE_RETRY).await;
            let acts = f.step(Instant::now(), Input::Tick);
            published |= acts.iter().any(|x| matches!(x, Action::Publish { .. }));
            promotes += acts
                .iter()
                .filter(|x| matches!(x, Action::Promote { .. }))
                .count();
        }
        assert!(!published, "a failed flush must never lead to publication");
        assert_eq!(f.phase(), Phase::Aborted);
        assert!(promotes > 5, "retried within failover_timeout ({promotes})");
        assert!(Instant::now() - began <= Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn fencing_that_never_confirms_aborts_at_the_deadline() {
        let (mut f, _) = start(Kind::Unplanned, false, vec![], 1);
        advance(Duration::from_secs(4)).await;
        assert!(f.step(Instant::now(), Input::Tick).is_empty());
        advance(Duration::from_secs(2)).await;
        let acts = f.step(Instant::now(), Input::Tick);
        assert!(aborted(&acts), "{acts:?}");
        assert!(!acts.iter().any(|x| matches!(x, Action::Promote { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn switchover_never_flushes_and_aborts_cleanly_on_timeout() {
        let (mut f, _) = start(Kind::Switchover, true, vec![], 1);
        assert!(!f.flush);
        let acts = f.step(Instant::now(), Input::Fenced(Ok(())));
        assert!(acts.contains(&Action::Switchover {
            candidate: a(2),
            old_master: a(1)
        }));
        let acts = f.step(
            Instant::now(),
            Input::Promoted(Err(PromoteError::SwitchoverTimedOut(
                "old master serves again".into(),
            ))),
        );
        assert!(aborted(&acts), "{acts:?}");
        assert!(!acts.iter().any(|x| matches!(x, Action::Publish { .. })));
    }

    #[tokio::test(start_paused = true)]
    async fn a_switchover_whose_old_master_is_a_replica_now_aborts_at_once() {
        let refusal =
            "FAILOVER on 127.0.0.1:1: ERR FAILOVER is not valid when server is a replica.";
        let e = PromoteError::from_failover_refusal(refusal.into());
        assert!(matches!(e, PromoteError::OldMasterNotMaster(_)), "{e:?}");
        let (mut f, _) = start(Kind::Switchover, false, vec![], 1);
        f.step(Instant::now(), Input::Fenced(Ok(())));
        let acts = f.step(Instant::now(), Input::Promoted(Err(e)));
        assert!(aborted(&acts), "{acts:?}");
        // Any other refusal is retried, as before.
        let other = PromoteError::from_failover_refusal(
            "FAILOVER on 127.0.0.1:1: ERR FAILOVER already in progress.".into(),
        );
        assert!(matches!(other, PromoteError::Promotion(_)), "{other:?}");
        let (mut f, _) = start(Kind::Switchover, false, vec![], 1);
        f.step(Instant::now(), Input::Fenced(Ok(())));
        assert!(!aborted(
            &f.step(Instant::now(), Input::Promoted(Err(other)))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_candidate_that_restarted_is_not_promoted_and_the_failover_aborts_at_once() {
        let (mut f, _) = start(Kind::Unplanned, false, vec![a(3)], 1);
        f.step(Instant::now(), Input::Fenced(Ok(())));
        let acts = f.step(
            Instant::now(),
            Input::Promoted(Err(PromoteError::CandidateRestarted(
                "run_id a -> b".into(),
            ))),
        );
        assert!(aborted(&acts), "{acts:?}");
        assert!(
            !acts
                .iter()
                .any(|x| matches!(x, Action::Publish { .. } | Action::Promote { .. }))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_switchover_whose_old_master_goes_down_promotes_the_candidate_as_unplanned() {
        let (mut f, _) = start(Kind::Switchover, true, vec![], 1);
        f.step(Instant::now(), Input::Fenced(Ok(())));
        // FAILOVER refused (the old master restarted and is loading, say):
        // retried, as long as the old master is there to hand over.
        f.step(
            Instant::now(),
            Input::Promoted(Err(PromoteError::Promotion("LOADING".into()))),
        );
        let acts = f.step(Instant::now(), Input::MasterDown);
        assert!(
            acts.contains(&Action::Promote {
                candidate: a(2),
                flush: true
            }),
            "{acts:?}"
        );
        // The late answer of the FAILOVER path no longer aborts it.
        let acts = f.step(
            Instant::now(),
            Input::Promoted(Err(PromoteError::SwitchoverTimedOut("gone".into()))),
        );
        assert!(!aborted(&acts), "{acts:?}");
        let acts = f.step(Instant::now(), Input::Promoted(Ok(())));
        assert!(acts.contains(&Action::Publish { master: a(2) }), "{acts:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_stalled_before_its_promotion_steps_down_and_one_after_goes_on() {
        // Fencing, or promoting: a stall ends it, whatever the kind.
        for kind in [Kind::Unplanned, Kind::Switchover] {
            let (mut f, _) = start(kind, false, vec![a(3)], 1);
            let acts = f.step(Instant::now(), Input::Stalled);
            assert!(aborted(&acts), "{kind:?} fencing: {acts:?}");
            let (mut f, _) = start(kind, false, vec![a(3)], 1);
            f.step(Instant::now(), Input::Fenced(Ok(())));
            let acts = f.step(Instant::now(), Input::Stalled);
            assert!(aborted(&acts), "{kind:?} promoting: {acts:?}");
            assert!(
                acts.iter()
                    .any(|x| matches!(x, Action::Event(EventKind::AbortNotElected, _))),
                "{acts:?}"
            );
        }
        // Promoted already: it publishes, and the backends arbitrate.
        let (mut f, _) = start(Kind::Unplanned, false, vec![a(3)], 1);
        f.step(Instant::now(), Input::Fenced(Ok(())));
        f.step(Instant::now(), Input::Promoted(Ok(())));
        assert!(f.step(Instant::now(), Input::Stalled).is_empty());
        assert_eq!(f.phase(), Phase::Publishing);
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_not_promoted_yet_steps_down_for_a_newer_election() {
        // Retrying its promotion: a newer epoch ends it, an older or the
        // same one does not.
        let (mut f, _) = start(Kind::Unplanned, false, vec![a(3)], 1);
        f.step(Instant::now(), Input::Fenced(Ok(())));
        f.step(
            Instant::now(),
            Input::Promoted(Err(PromoteError::Promotion("unreachable".into()))),
        );
        // (The failover's epoch is 7.)
        assert!(f.step(Instant::now(), Input::Superseded(7)).is_empty());
        let acts = f.step(Instant::now(), Input::Superseded(8));
        assert!(aborted(&acts), "{acts:?}");
        assert!(
            acts.iter()
                .any(|x| matches!(x, Action::Event(EventKind::AbortNotElected, _))),
            "{acts:?}"
        );
        assert_eq!(f.phase(), Phase::Aborted);
        // Promoted already: it publishes, and the backends arbitrate.
        let (mut f, _) = start(Kind::Unplanned, false, vec![a(3)], 1);
        f.step(Instant::now(), Input::Fenced(Ok(())));
        let acts = f.step(Instant::now(), Input::Promoted(Ok(())));
        assert!(acts.contains(&Action::Publish { master: a(2) }), "{acts:?}");
        assert!(f.step(Instant::now(), Input::Superseded(8)).is_empty());
        assert_eq!(f.phase(), Phase::Publishing);
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_never_syncs_does_not_block_the_end() {
        let (mut f, _) = start(Kind::Unplanned, false, vec![a(3)], 1);
        f.step(Instant::now(), Input::Fenced(Ok(())));
        f.step(Instant::now(), Input::Promoted(Ok(())));
        f.step(Instant::now(), Input::Published(Ok(())));
        let mut finished = false;
        for _ in 0..100 {
            advance(Duration::from_millis(500)).await;
            let acts = f.step(Instant::now(), Input::Tick);
            if acts.iter().any(|x| matches!(x, Action::Finished(_))) {
                finished = true;
                break;
            }
        }
        assert!(finished);
        assert_eq!(f.phase(), Phase::Done);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_aborts_after_publication() {
        let (mut f, _) = start(Kind::Unplanned, false, vec![a(3)], 1);
        f.step(Instant::now(), Input::Fenced(Ok(())));
        f.step(Instant::now(), Input::Promoted(Ok(())));
        let down = RunnerError {
            group: "g".into(),
            op: crate::discovery::runner::OpKind::Publish,
            epoch: 7,
            failures: Vec::new(),
        };
        let acts = f.step(Instant::now(), Input::Published(Err(down)));
        assert!(acts.iter().any(|x| matches!(
            x,
            Action::Event(EventKind::PublishIncomplete, Detail::MasterAnd(_))
        )));
        assert!(!aborted(&acts), "{acts:?}");
        assert_eq!(f.phase(), Phase::Reconfiguring);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_master_down_while_its_replicas_are_re_pointed_ends_the_failover() {
        let (mut f, _) = start(Kind::Unplanned, false, vec![a(3), a(4)], 1);
        // Before the publication the new master's SDOWN means nothing here.
        assert!(f.step(Instant::now(), Input::MasterDown).is_empty());
        f.step(Instant::now(), Input::Fenced(Ok(())));
        assert!(f.step(Instant::now(), Input::MasterDown).is_empty());
        f.step(Instant::now(), Input::Promoted(Ok(())));
        f.step(Instant::now(), Input::Published(Ok(())));
        assert_eq!(f.phase(), Phase::Reconfiguring);
        let acts = f.step(Instant::now(), Input::MasterDown);
        assert!(acts.contains(&Action::Finished(Outcome::CompletedWithTimeout)));
        assert!(!acts.iter().any(|x| matches!(x, Action::Repoint { .. })));
        assert_eq!(f.phase(), Phase::Done);
    }

    #[tokio::test(start_paused = true)]
    async fn dragonfly_repoints_beside_the_promotion_after_the_fence_within_parallel_syncs() {
        let (mut f, acts) = start_on(
            Flavour::Dragonfly,
            Kind::Unplanned,
            false,
            vec![a(2), a(3), a(4)],
            1,
        );
        // Nothing before the fence is confirmed.
        assert!(repoints(&acts).is_empty());
        assert!(repoints(&f.step(Instant::now(), Input::Tick)).is_empty());
        let acts = f.step(Instant::now(), Input::Fenced(Ok(())));
        assert!(acts.contains(&Action::Promote {
            candidate: a(2),
            flush: false
        }));
        // parallel_syncs = 1: one replica beside the promotion, never the
        // candidate, and nothing published yet.
        assert_eq!(repoints(&acts), vec![(a(3), true)]);
        assert!(!acts.iter().any(|x| matches!(x, Action::Publish { .. })));
        assert!(
            f.step(Instant::now(), Input::RepointSent(a(3), Ok(())))
                .is_empty()
        );
        let acts = f.step(Instant::now(), Input::Promoted(Ok(())));
        assert!(acts.contains(&Action::Publish { master: a(2) }));
        assert!(repoints(&acts).is_empty());
        // After publication: a(3) is still in flight, so a(4) waits for it.
        let acts = f.step(Instant::now(), Input::Published(Ok(())));
        assert!(repoints(&acts).is_empty(), "{acts:?}");
        let acts = f.step(Instant::now(), Input::ReplicaSynced(a(3)));
        assert_eq!(repoints(&acts), vec![(a(4), false)]);
        let acts = f.step(Instant::now(), Input::ReplicaSynced(a(4)));
        assert!(acts.contains(&Action::Finished(Outcome::Completed)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_repoint_beside_the_promotion_that_fails_is_sent_again_after_publication() {
        let (mut f, _) = start_on(Flavour::Dragonfly, Kind::Unplanned, false, vec![a(3)], 1);
        let acts = f.step(Instant::now(), Input::Fenced(Ok(())));
        assert_eq!(repoints(&acts), vec![(a(3), true)]);
        let refused = CommandFailed("ERR could not greet master Bad message".into());
        assert!(
            f.step(
                Instant::now(),
                Input::RepointSent(a(3), Err(refused.clone()))
            )
            .is_empty()
        );
        f.step(Instant::now(), Input::Promoted(Ok(())));
        let acts = f.step(Instant::now(), Input::Published(Ok(())));
        assert_eq!(repoints(&acts), vec![(a(3), false)]);
        // A second failure is an ordinary one: reported, and the end.
        let acts = f.step(Instant::now(), Input::RepointSent(a(3), Err(refused)));
        assert!(
            acts.iter()
                .any(|x| matches!(x, Action::Event(EventKind::SlaveReconfFailed, _)))
        );
        assert!(acts.contains(&Action::Finished(Outcome::Completed)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_promotion_never_publishes_even_with_replicas_repointed_beside_it() {
        let (mut f, _) = start_on(Flavour::Dragonfly, Kind::Unplanned, false, vec![a(3)], 1);
        let acts = f.step(Instant::now(), Input::Fenced(Ok(())));
        assert_eq!(repoints(&acts), vec![(a(3), true)]);
        let mut published = false;
        for _ in 0..100 {
            let acts = f.step(
                Instant::now(),
                Input::Promoted(Err(PromoteError::Promotion("timed out".into()))),
            );
            published |= acts.iter().any(|x| matches!(x, Action::Publish { .. }));
            if f.is_finished() {
                break;
            }
            advance(PROMOTE_RETRY).await;
            let acts = f.step(Instant::now(), Input::Tick);
            published |= acts.iter().any(|x| matches!(x, Action::Publish { .. }));
            // Retrying the promotion sends no second re-point.
            assert!(repoints(&acts).is_empty());
        }
        assert!(!published);
        assert_eq!(f.phase(), Phase::Aborted);
    }

    #[tokio::test(start_paused = true)]
    async fn only_an_unplanned_dragonfly_failover_without_flush_repoints_beside_the_promotion() {
        for (flavour, kind, flush, early) in [
            (Flavour::Dragonfly, Kind::Unplanned, false, true),
            (Flavour::Dragonfly, Kind::Unplanned, true, false),
            (Flavour::Dragonfly, Kind::Switchover, false, false),
            (Flavour::Redis, Kind::Unplanned, false, false),
            (Flavour::Valkey, Kind::Unplanned, false, false),
        ] {
            let (mut f, _) = start_on(flavour, kind, flush, vec![a(3)], 1);
            let acts = f.step(Instant::now(), Input::Fenced(Ok(())));
            assert_eq!(
                !repoints(&acts).is_empty(),
                early,
                "{flavour:?} {kind:?} flush={flush}"
            );
        }
    }
}

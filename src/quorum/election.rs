//! ODOWN and the election (failover steps 2–4 of ARCHITECTURE.md), as a pure
//! machine: observations, peer answers and persistence results in, actions
//! out. The group task carries the actions out (asks the peers, persists
//! the epoch, starts the failover machine, emits events) and feeds the
//! results back; the machine never touches a socket, a file or a clock.
//!
//! ```text
//!             ODOWN, back-off over                 random delay over
//!  Watching ───────────────────────▶ Delay ──────────────────────────▶ Starting
//!     ▲  ▲                             │ ODOWN gone                      │ epoch persisted
//!     │  └─────────────────────────────┘                                 ▼
//!     │        (failover completed)        won (majority and quorum)  Electing
//!     ├──────────────────────────── FailingOver ◀────────────────────────┤
//!     │                                  │ aborted                       │ lost, split, timed out,
//!     │            back-off over         ▼                               │ no replica, voted for another
//!     └─────────────────────────────  Backoff ◀──────────────────────────┘
//! ```
//!
//! - **ODOWN** (step 2): this daemon sees the master down and at least
//!   `quorum` daemons (self included) said so in answers no older than
//!   [`Settings::answer_ttl`]. It is tracked beside the stage: it comes and
//!   goes in any stage and only starts an election from `Watching`.
//! - **Election** (step 3): a new epoch, persisted before any vote request
//!   goes out ([`Action::PersistNewEpoch`]); won with a majority of all
//!   configured daemons and at least `quorum` votes. A delay by rank
//!   before starting (a step per daemon ahead, plus a little at random)
//!   and a random retry after a split keep the daemons from colliding; a loss or a vote for another daemon backs off for
//!   `failover_timeout` (Sentinel's rule).
//! - **Selection** (step 4) is asked of the group through [`Replicas`] when
//!   the election starts and again when it is won, so the replica promoted
//!   is the best one on the freshest view; a replica that a previous leader
//!   of this failover intended to promote goes first.
//!
//! The voter's side is in [`crate::quorum::vote`]: [`may_vote`] (a stale
//! asker gets no vote) and [`cast_vote`] (one vote per epoch), which the
//! state store applies to the persisted record. The in-process simulation in the tests runs three
//! and five of these machines over a faulty network.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::addr::Addr;
use crate::events::{Detail, EventKind};
use crate::failover::machine::Kind;
use crate::failover::{FailoverError, NoGoodReplica};
use crate::quorum::peers::{IsDownQuery, IsDownReply};
use crate::quorum::vote::Vote;

/// What the machine needs to know of the group and the quorum.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This daemon's id (votes name daemons by id).
    pub id: String,
    /// Configured daemons, this one included.
    pub daemons: usize,
    /// The group's `quorum`.
    pub quorum: usize,
    /// The master's PING period (`down_after / 4`, bounded).
    pub ping_period: Duration,
    /// `down_after`.
    pub down_after: Duration,
    /// `failover_timeout`.
    pub failover_timeout: Duration,
}

impl Settings {
    /// A majority of all configured daemons.
    pub fn majority(&self) -> usize {
        self.daemons / 2 + 1
    }

    /// Votes a candidate needs: a majority and at least `quorum`.
    pub fn votes_needed(&self) -> usize {
        self.majority().max(self.quorum)
    }

    /// How long a peer's "down" answer counts: three probe periods, at
    /// least 1 s.
    pub fn answer_ttl(&self) -> Duration {
        (self.ping_period * 3).max(Duration::from_secs(1))
    }

    /// How often peers are asked while the master is SDOWN.
    fn ask_period(&self) -> Duration {
        (self.ping_period / 2).clamp(Duration::from_millis(20), Duration::from_millis(500))
    }

    /// How long an election may take before it counts as lost.
    fn election_timeout(&self) -> Duration {
        (self.down_after * 2)
            .clamp(Duration::from_secs(1), Duration::from_secs(10))
            .min(self.failover_timeout)
    }

    /// The step between two daemons' starts by rank: long enough for the
    /// first one's vote request to reach the next before it starts.
    fn start_step(&self) -> Duration {
        (self.ping_period / 4).clamp(Duration::from_millis(25), Duration::from_millis(75))
    }

    /// The delay before starting an election for the daemon of `rank`
    /// among those that reach each other: a step per rank, plus a random
    /// part of half a step (against a tie between daemons that disagree
    /// on the ranks, in a partition). With a random delay alone, two of
    /// three daemons started within one round trip of each other about
    /// once in six failovers on a loaded host, and their vote split.
    fn start_delay(&self, rank: usize, rng: &mut StdRng) -> Duration {
        let step = self.start_step();
        step * u32::try_from(rank).unwrap_or(u32::MAX) + rand_up_to(rng, step / 2)
    }

    /// A wake-up this long past the start is a stall of the process.
    fn stall(&self) -> Duration {
        self.start_step() * 2
    }

    /// The spread of the quick retry after a split vote.
    fn split_spread(&self) -> Duration {
        (self.ping_period * 2).max(Duration::from_millis(300))
    }

    /// The wait before looking for a candidate again, when none was
    /// suitable before the election: nothing was started (no epoch, no
    /// vote asked), so there is no other leader to leave time for, and a
    /// replica that becomes suitable (one that reconnects, or the
    /// replicas of a master found restarted with less, held only for a
    /// pause) must not wait `failover_timeout` (Sentinel's wait).
    fn no_candidate_retry(&self) -> Duration {
        self.ping_period.max(Duration::from_millis(50))
    }

    /// The random part of a back-off, wide so that two daemons whose
    /// elections split do not collide again on the retry.
    fn backoff_spread(&self) -> Duration {
        self.ping_period.max(Duration::from_secs(1))
    }
}

/// What one peer last answered to `IS-DOWN`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerAnswer {
    /// It sees the master down.
    pub down: bool,
    /// When the answer arrived (None: none, or forgotten after a stall).
    pub answered_at: Option<Instant>,
    /// The highest epoch of a question it answered.
    pub answered_epoch: u64,
    /// Its vote, as it reported it.
    pub leader: Option<String>,
    /// The epoch of that vote.
    pub leader_epoch: u64,
}

/// An election this daemon runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ballot {
    /// Its epoch.
    pub epoch: u64,
    /// When it started (also the failover's start, for its duration).
    pub started: Instant,
    /// The replica this daemon will promote if it wins.
    pub candidate: Addr,
    /// Unplanned failover or planned switchover.
    pub kind: Kind,
}

/// Where the election is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// Nothing to do but watch (ODOWN may hold, back-off over).
    Watching,
    /// No election before `until` (after a loss, an abort, a vote for another).
    Backoff {
        /// The earliest next attempt.
        until: Instant,
    },
    /// The random delay before starting, against split votes.
    Delay {
        /// When the election starts (if ODOWN still holds).
        until: Instant,
        /// The delay was drawn again after a wake-up long past `until`.
        redrawn: bool,
    },
    /// The new epoch is being persisted; the candidate is chosen.
    Starting {
        /// Unplanned or planned.
        kind: Kind,
        /// The replica to promote.
        candidate: Addr,
        /// When it began.
        since: Instant,
    },
    /// Vote requests are out.
    Electing(Ballot),
    /// Won: the failover machine runs.
    FailingOver {
        /// The epoch won.
        epoch: u64,
        /// Unplanned or planned.
        kind: Kind,
    },
}

/// The election's result, for the metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElectionResult {
    /// Won.
    Won,
    /// Timed out, or nobody can win any more with the votes out.
    Lost,
    /// Every daemon answered and no candidate has enough votes.
    Split,
}

impl ElectionResult {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            ElectionResult::Won => "won",
            ElectionResult::Lost => "lost",
            ElectionResult::Split => "split",
        }
    }
}

/// A question to every peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    /// A vote request in this epoch for this daemon, which will promote
    /// `promote`; None: only whether the master is down (current epoch).
    pub vote: Option<(u64, Addr)>,
}

/// What the group must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send `PICKET IS-DOWN` to every peer; answers come back through
    /// [`Election::on_answer`].
    Ask(Ask),
    /// Persist a new epoch with this daemon's own vote in it; the result
    /// comes back through [`Election::on_epoch`].
    PersistNewEpoch,
    /// The election is won: run the failover machine for it. The
    /// candidate was checked again on the freshest view.
    StartFailover(Ballot),
    /// Publish an event.
    Event(EventKind, Detail),
    /// An election ended (metric).
    Ended(ElectionResult),
    /// The answer to a pending switchover request.
    Switchover(Result<(), FailoverError>),
}

/// The group's replicas, as selection sees them.
pub trait Replicas {
    /// The best replica to promote (only `to` when given).
    fn select(&self, to: Option<&Addr>) -> Result<Addr, NoGoodReplica>;
    /// Whether `addr` could be promoted now.
    fn eligible(&self, addr: &Addr) -> bool;
    /// As [`Replicas::select`] among the servers that report `role:slave`
    /// only: a switchover's `FAILOVER TO` hands over to a replica, and a
    /// master is ranked first for an unplanned failover (one an earlier
    /// leader promoted), which a stray master left by an unplanned
    /// failover also looks like (the simulation with switchovers, seed
    /// 12157: the switchover retried `FAILOVER TO` it until its old master
    /// looked down, then promoted it and lost what the group's master
    /// had acknowledged).
    fn select_replica(&self, to: Option<&Addr>) -> Result<Addr, NoGoodReplica> {
        self.select(to)
    }
    /// Whether `addr` reports `role:slave` (see [`Replicas::select_replica`]).
    fn reports_replica(&self, _addr: &Addr) -> bool {
        true
    }
}

/// What the group observes at an instant.
pub struct Observation<'a> {
    /// Now.
    pub now: Instant,
    /// This daemon sees the master down (SDOWN, or `role:slave` for too long).
    pub master_sdown: bool,
    /// Stall protection is active: nothing is decided.
    pub tilt: bool,
    /// The group's config epoch.
    pub config_epoch: u64,
    /// Its replicas.
    pub replicas: &'a dyn Replicas,
    /// This daemon's place (0: first) among the daemons that reach each
    /// other, ordered alike by all of them (by address).
    pub rank: usize,
    /// A promotion this election did not start may still take effect, so
    /// no election starts here meanwhile: a peer's recent hello says a
    /// leader is failing the master over in an epoch newer than the
    /// config (its own failover, or a leader it voted for). Sentinel's voters
    /// stand back `failover_timeout`; a daemon that restarted since, or
    /// was not asked, stood back from nothing and elected a second leader
    /// while the first, cut off from everyone, still retried its
    /// promotion, which then succeeded and re-pointed the second one's
    /// master (the simulation, seed 855 with operations and a Service).
    /// Or a promotion, or a re-point beside it, of this daemon's own
    /// failover that is over has not answered (`Group::commands_out`).
    pub promotion_out: bool,
}

/// The ODOWN detector and election of one group.
#[derive(Debug)]
pub struct Election {
    settings: Settings,
    stage: Stage,
    peers: Vec<PeerAnswer>,
    odown_since: Option<Instant>,
    last_ask: Option<Instant>,
    /// A replica a leader intends to promote in a newer epoch than the
    /// group's config (its own, or one a vote request named), and when
    /// this daemon learnt of it.
    intended: Option<(u64, Addr, Instant)>,
    /// The epoch and leader of the last vote this daemon granted to
    /// another daemon, and when (not restored at start-up: when it was
    /// cast is not on record).
    voted: Option<(u64, String, Instant)>,
    /// `-failover-abort-no-good-slave` was reported for this ODOWN and
    /// not followed by a start: the retries stay quiet until one starts.
    no_candidate_reported: bool,
    rng: StdRng,
}

fn rand_up_to(rng: &mut StdRng, max: Duration) -> Duration {
    let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rng.random_range(0..=ms))
}

impl Election {
    /// A machine for `peers` peers (daemons − 1). `seed` makes its random
    /// delays reproducible (tests, the simulation); None seeds from the OS.
    pub fn new(settings: Settings, peers: usize, seed: Option<u64>) -> Election {
        Election {
            settings,
            stage: Stage::Watching,
            peers: vec![PeerAnswer::default(); peers],
            odown_since: None,
            last_ask: None,
            intended: None,
            voted: None,
            no_candidate_reported: false,
            rng: match seed {
                Some(s) => StdRng::seed_from_u64(s),
                None => StdRng::from_os_rng(),
            },
        }
    }

    /// The settings.
    #[cfg(test)]
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The current stage.
    pub fn stage(&self) -> &Stage {
        &self.stage
    }

    /// The peers' last answers (config order).
    pub fn peers(&self) -> &[PeerAnswer] {
        &self.peers
    }

    /// When ODOWN began, while it holds.
    pub fn odown_since(&self) -> Option<Instant> {
        self.odown_since
    }

    /// Whether an election or a failover runs (nothing else may
    /// reconfigure the group meanwhile).
    pub fn busy(&self) -> bool {
        matches!(
            self.stage,
            Stage::Starting { .. } | Stage::Electing(_) | Stage::FailingOver { .. }
        )
    }

    /// The end of the back-off, while one holds.
    pub fn backoff_until(&self, now: Instant) -> Option<Instant> {
        match self.stage {
            Stage::Backoff { until } if now < until => Some(until),
            _ => None,
        }
    }

    /// Whether the last look for a candidate, before an election, found
    /// no eligible replica (and none has started since).
    pub fn no_candidate(&self) -> bool {
        self.no_candidate_reported
    }

    /// When the machine wants to be ticked next, besides the group's
    /// regular tick (the end of the pre-election delay, exactly: rounded
    /// to a tick, every daemon's delay ended on the same tick).
    pub fn deadline(&self) -> Option<Instant> {
        match self.stage {
            Stage::Delay { until, .. } => Some(until),
            _ => None,
        }
    }

    /// At start-up: the replica the leader this daemon last voted for
    /// said it would promote in `epoch` (persisted with the vote), so that
    /// a daemon restarted just after its vote does not take that replica,
    /// turning master, for an out-of-place one to demote, nor lets a peer
    /// do so (it is announced for `failover_timeout` from now: when the
    /// vote was cast is not on record).
    pub fn restore_intended(&mut self, now: Instant, epoch: u64, replica: Addr) {
        self.intended = Some((epoch, replica, now));
    }

    /// A daemon asked for votes in `epoch` to promote `replica`, whether
    /// or not this one voted for it: its config may reach this daemon
    /// after the promotion, and the replica, a master by then, must not be
    /// taken for a stray meanwhile (the simulation, seed 2108: a daemon
    /// whose peers had just restarted demoted it on an older hello).
    pub fn note_asked(&mut self, now: Instant, epoch: u64, replica: Addr) {
        if self.intended.as_ref().is_none_or(|(e, ..)| *e < epoch) {
            self.intended = Some((epoch, replica, now));
        }
    }

    /// The replica a leader of a newer epoch than `config_epoch` intends
    /// to promote: it must be neither demoted nor re-pointed.
    pub fn intended(&self, config_epoch: u64) -> Option<&Addr> {
        self.intention(config_epoch).map(|(_, a)| a)
    }

    /// [`Election::intended`] with the epoch it is intended in.
    pub fn intention(&self, config_epoch: u64) -> Option<(u64, &Addr)> {
        self.intended
            .as_ref()
            .filter(|(e, ..)| *e > config_epoch)
            .map(|(e, a, _)| (*e, a))
    }

    /// The intention this daemon announces to its peers: one learnt
    /// within `failover_timeout`, the time a leader has to promote and
    /// publish. Announced longer, an election lost or aborted before any
    /// promotion (two candidates splitting the votes) kept every daemon
    /// from re-pointing the replica it named until the next failover (the
    /// simulation with the network's faults, seed 152).
    pub fn announced_intention(&self, now: Instant, config_epoch: u64) -> Option<(u64, &Addr)> {
        let (.., learnt) = self.intended.as_ref()?;
        if now.saturating_duration_since(*learnt) >= self.settings.failover_timeout {
            return None;
        }
        self.intention(config_epoch)
    }

    /// Daemons (self included) that see the master down now.
    pub fn down_votes(&self, now: Instant, master_sdown: bool) -> usize {
        let ttl = self.settings.answer_ttl();
        usize::from(master_sdown)
            + self
                .peers
                .iter()
                .filter(|p| {
                    p.down
                        && p.answered_at
                            .is_some_and(|t| now.saturating_duration_since(t) <= ttl)
                })
                .count()
    }

    /// Whether the peer at `idx` said recently that it sees the master down.
    pub fn peer_sees_down(&self, idx: usize, now: Instant) -> bool {
        let ttl = self.settings.answer_ttl();
        self.peers.get(idx).is_some_and(|p| {
            p.down
                && p.answered_at
                    .is_some_and(|t| now.saturating_duration_since(t) <= ttl)
        })
    }

    /// The master has just gone down: ask the peers at the next tick
    /// instead of waiting for the ask period.
    pub fn master_went_down(&mut self) {
        self.last_ask = None;
    }

    /// Time passed (the group's tick, or [`Election::deadline`]).
    pub fn tick(&mut self, o: &Observation<'_>) -> Vec<Action> {
        let mut out = Vec::new();
        // A switchover's leader asks too: its fallback to an unplanned
        // promotion waits for ODOWN when only silence shows the old
        // master gone (`Group::switchover_master_gone`).
        let failing_over = matches!(
            self.stage,
            Stage::FailingOver {
                kind: Kind::Unplanned,
                ..
            }
        );
        if o.master_sdown && !o.tilt && !failing_over {
            let due = self
                .last_ask
                .is_none_or(|t| o.now.saturating_duration_since(t) >= self.settings.ask_period());
            if due {
                self.last_ask = Some(o.now);
                out.push(Action::Ask(Ask { vote: None }));
            }
        }
        self.update_odown(o, &mut out);
        self.drive(o, &mut out);
        out
    }

    /// A peer answered a question asked in `asked_epoch`.
    pub fn on_answer(
        &mut self,
        o: &Observation<'_>,
        peer: usize,
        asked_epoch: u64,
        at: Instant,
        reply: &IsDownReply,
    ) -> Vec<Action> {
        let Some(p) = self.peers.get_mut(peer) else {
            return Vec::new();
        };
        p.down = reply.down;
        p.answered_at = Some(at);
        p.answered_epoch = p.answered_epoch.max(asked_epoch);
        // An answer without a vote in an older epoch must not hide a vote
        // seen before (answers arrive out of order).
        if reply.leader.is_some() || reply.leader_epoch >= p.leader_epoch {
            p.leader = reply.leader.clone();
            p.leader_epoch = reply.leader_epoch;
        }
        let mut out = Vec::new();
        self.update_odown(o, &mut out);
        self.drive(o, &mut out);
        out
    }

    /// A planned switchover was asked for (`SENTINEL FAILOVER`).
    pub fn request_switchover(&mut self, o: &Observation<'_>, to: Option<&Addr>) -> Vec<Action> {
        if self.busy() {
            return vec![Action::Switchover(Err(FailoverError::InProgress))];
        }
        // Another leader's failover may still promote: this daemon voted
        // for it, or a peer's hello says one runs past the config. A
        // switchover in a newer epoch started meanwhile (the simulation
        // with switchovers, seed 242: a leader cut off from everything
        // while it retried its switchover's promotion) was published, and
        // then the first leader, back, promoted its candidate and
        // re-pointed the switchover's new master to it, losing the writes
        // that master had acknowledged. The unplanned path waits for the
        // same (`promotion_out`, the back-off after a vote).
        if o.promotion_out || self.standing_back_for(o.now, o.config_epoch).is_some() {
            return vec![Action::Switchover(Err(FailoverError::AnotherLeader))];
        }
        if o.master_sdown {
            return vec![Action::Switchover(Err(FailoverError::MasterDown))];
        }
        self.start(o, Kind::Switchover, to)
    }

    /// The new epoch of [`Action::PersistNewEpoch`] is durable (or not).
    pub fn on_epoch(&mut self, o: &Observation<'_>, result: Result<u64, String>) -> Vec<Action> {
        let Stage::Starting {
            kind, candidate, ..
        } = &self.stage
        else {
            // Abandoned meanwhile (a vote for another daemon, a newer
            // config): the epoch and our own vote in it are harmless.
            return Vec::new();
        };
        let (kind, candidate) = (*kind, candidate.clone());
        let mut out = Vec::new();
        match result {
            Ok(epoch) => {
                for p in self.peers.iter_mut() {
                    p.leader = None;
                }
                self.stage = Stage::Electing(Ballot {
                    epoch,
                    started: o.now,
                    candidate: candidate.clone(),
                    kind,
                });
                out.push(Action::Event(
                    EventKind::NewEpoch,
                    Detail::Text(epoch.to_string()),
                ));
                out.push(Action::Event(EventKind::TryFailover, Detail::Master));
                out.push(Action::Ask(Ask {
                    vote: Some((epoch, candidate)),
                }));
                // Alone (or with a quorum of one) the own vote may suffice.
                self.drive(o, &mut out);
            }
            Err(e) => {
                self.back_off(o.now);
                if kind == Kind::Switchover {
                    out.push(Action::Switchover(Err(FailoverError::Persist(e))));
                }
            }
        }
        out
    }

    /// The new epoch was not taken: this daemon voted for another daemon
    /// between deciding to start and the write (the vote's own result
    /// makes it stand back too; this covers the order in which the two
    /// results arrive).
    pub fn on_epoch_superseded(&mut self, now: Instant) -> Vec<Action> {
        let mut out = Vec::new();
        if let Stage::Starting { kind, .. } = self.stage {
            if kind == Kind::Switchover {
                out.push(Action::Switchover(Err(FailoverError::AnotherLeader)));
            }
            self.back_off(now);
        }
        out
    }

    /// This daemon's vote for `q` is durable: `vote` is the vote on
    /// record. A vote granted to another daemon makes this one stand back
    /// (Sentinel: no own attempt for `failover_timeout`). Returns whether
    /// the vote went to the asker.
    pub fn on_vote_cast(
        &mut self,
        now: Instant,
        q: &IsDownQuery,
        vote: &Vote,
        out: &mut Vec<Action>,
    ) -> bool {
        let Some(candidate) = q.candidate.as_deref() else {
            return false;
        };
        let granted = vote.epoch == q.epoch
            && vote.leader.as_deref() == Some(candidate)
            && candidate != self.settings.id;
        if !granted {
            return false;
        }
        out.push(Action::Event(
            EventKind::VoteForLeader,
            Detail::Text(format!("{candidate} {}", q.epoch)),
        ));
        match &self.stage {
            Stage::FailingOver { .. } => {}
            Stage::Starting { kind, .. } | Stage::Electing(Ballot { kind, .. }) => {
                if *kind == Kind::Switchover {
                    out.push(Action::Switchover(Err(FailoverError::AnotherLeader)));
                }
                self.back_off(now);
            }
            _ => self.back_off(now),
        }
        if let Some(p) = &q.promote {
            self.intended = Some((q.epoch, p.clone(), now));
        }
        self.voted = Some((q.epoch, candidate.to_string(), now));
        true
    }

    /// The epoch of the leader this daemon stands back for, announced to
    /// its peers: one it voted for within `failover_timeout`, in an epoch
    /// newer than `config_epoch`. Only a granted vote counts: a daemon
    /// merely asked (it voted for itself or another) does not know that
    /// leader can win, and two candidates of a split election that
    /// announced each other held the third daemon back for a whole
    /// `failover_timeout` (the simulation with the network's faults, seed
    /// 2942). The leader's id comes with it: a peer that hears that
    /// leader say it no longer fails over need not stand back.
    pub fn standing_back_for(&self, now: Instant, config_epoch: u64) -> Option<(u64, &str)> {
        let (epoch, leader, at) = self.voted.as_ref()?;
        (*epoch > config_epoch
            && now.saturating_duration_since(*at) < self.settings.failover_timeout)
            .then_some((*epoch, leader.as_str()))
    }

    /// The failover ended; after an abort the next attempt waits.
    pub fn on_failover_end(&mut self, now: Instant, completed: bool) {
        if completed {
            self.stage = Stage::Watching;
        } else {
            self.back_off(now);
        }
    }

    /// The group adopted a config (its own publication or a peer's) in
    /// `epoch`: the old master's ODOWN is over without a `-odown`, and an
    /// intention of that epoch or an older one is fulfilled.
    ///
    /// A back-off is cut short here too, to `down_after` from now. It
    /// stood this daemon back while another leader (or its own aborted
    /// attempt) might still be failing the old master over; a published
    /// config means that failover is over, and whatever fails next is a
    /// new master, failed over in a new epoch. Sentinel keeps waiting out
    /// `failover_timeout`: a new master that dies (or restarts empty)
    /// within it was left down for up to 10 s, its replicas held by
    /// nobody. What is left, `down_after`, gives this daemon's view of the
    /// new master (read again at the adoption) time to catch up before it
    /// could find it down on what it read of it as a replica. The vote's
    /// epoch, not the wait, keeps two leaders apart.
    pub fn on_master_changed(&mut self, now: Instant, epoch: u64) {
        self.odown_since = None;
        self.no_candidate_reported = false;
        if let Stage::Backoff { until } = self.stage {
            self.stage = Stage::Backoff {
                until: until.min(now + self.settings.down_after),
            };
        }
        self.on_master_kept(epoch);
    }

    /// The group adopted a config in `epoch` that names the master it
    /// already had (a failover aborted after its fence, whose leader
    /// routes the backends to the kept master again with the fence's
    /// epoch). Only an intention of that epoch or an older one ends: the
    /// master's ODOWN, if any, goes on, and so does a back-off, since no
    /// failover ended with a new master.
    pub fn on_master_kept(&mut self, epoch: u64) {
        if self.intended.as_ref().is_some_and(|(e, ..)| *e <= epoch) {
            self.intended = None;
        }
    }

    /// A peer's newer config was adopted: this daemon's own election or
    /// failover is moot.
    pub fn abandon(&mut self) -> Vec<Action> {
        let mut out = Vec::new();
        match &self.stage {
            Stage::Starting { kind, .. } | Stage::Electing(Ballot { kind, .. }) => {
                if *kind == Kind::Switchover {
                    out.push(Action::Switchover(Err(FailoverError::NewerConfig)));
                }
                self.stage = Stage::Watching;
            }
            Stage::FailingOver { .. } => self.stage = Stage::Watching,
            _ => {}
        }
        out
    }

    /// The process stalled: what the peers said before is stale.
    pub fn on_stall(&mut self) {
        for p in self.peers.iter_mut() {
            p.answered_at = None;
        }
    }

    /// `SENTINEL RESET`: forget every peer's answer.
    pub fn reset(&mut self) {
        for p in self.peers.iter_mut() {
            *p = PeerAnswer::default();
        }
    }

    fn update_odown(&mut self, o: &Observation<'_>, out: &mut Vec<Action>) {
        let votes = self.down_votes(o.now, o.master_sdown);
        let odown = !o.tilt && o.master_sdown && votes >= self.settings.quorum;
        match (odown, self.odown_since) {
            (true, None) => {
                self.odown_since = Some(o.now);
                out.push(Action::Event(
                    EventKind::Odown,
                    Detail::MasterAnd(format!("#quorum {votes}/{}", self.settings.quorum)),
                ));
            }
            (false, Some(_)) => {
                self.odown_since = None;
                self.no_candidate_reported = false;
                out.push(Action::Event(EventKind::OdownCleared, Detail::Master));
            }
            _ => {}
        }
    }

    fn back_off(&mut self, now: Instant) {
        let jitter = rand_up_to(&mut self.rng, self.settings.backoff_spread());
        self.stage = Stage::Backoff {
            until: now + self.settings.failover_timeout + jitter,
        };
    }

    fn votes_for_me(&self, epoch: u64) -> usize {
        1 + self
            .peers
            .iter()
            .filter(|p| {
                let in_epoch =
                    if crate::mutation::planted(crate::mutation::Mutation::CountOldEpochVotes) {
                        p.leader_epoch <= epoch
                    } else {
                        p.leader_epoch == epoch
                    };
                in_epoch && p.leader.as_deref() == Some(self.settings.id.as_str())
            })
            .count()
    }

    /// Whether the election in `epoch` can no longer be won by anybody:
    /// every peer answered it with a vote in it and no daemon holds enough
    /// votes. Then nobody fails over, and retrying soon is safe. (A peer
    /// that refused to vote, e.g. for a stale view, is not a split.)
    fn split(&self, epoch: u64) -> bool {
        if self
            .peers
            .iter()
            .any(|p| p.answered_epoch < epoch || p.leader_epoch != epoch || p.leader.is_none())
        {
            return false;
        }
        let mut tally: Vec<(&str, usize)> = vec![(self.settings.id.as_str(), 1)];
        for l in self.peers.iter().filter_map(|p| p.leader.as_deref()) {
            match tally.iter_mut().find(|(id, _)| *id == l) {
                Some((_, n)) => *n += 1,
                None => tally.push((l, 1)),
            }
        }
        tally.iter().all(|(_, n)| *n < self.settings.votes_needed())
    }

    fn drive(&mut self, o: &Observation<'_>, out: &mut Vec<Action>) {
        match &self.stage {
            Stage::FailingOver { .. } | Stage::Starting { .. } => {}
            Stage::Electing(b) => {
                let b = b.clone();
                // In TILT the votes, and the view they were asked on, are
                // from before the stall: winning on them would act on that
                // view (guarantee 9). The election is given up, as a
                // leader that stalled during its failover steps down (the
                // simulation, `--isolation --net --ops`, seed 2551: a
                // daemon stalled 2.2 s after asking won on the votes it
                // found queued, and promoted a replica at an epoch older
                // than the config another daemon had published meanwhile).
                if !o.tilt && self.votes_for_me(b.epoch) >= self.settings.votes_needed() {
                    self.won(o, b, out);
                    return;
                }
                let split = !o.tilt && self.split(b.epoch);
                if split
                    || o.tilt
                    || o.now.saturating_duration_since(b.started)
                        >= self.settings.election_timeout()
                {
                    out.push(Action::Event(EventKind::AbortNotElected, Detail::Master));
                    if split {
                        // Nobody won: retry after a short random delay
                        // instead of a whole failover_timeout.
                        out.push(Action::Ended(ElectionResult::Split));
                        let d = rand_up_to(&mut self.rng, self.settings.split_spread());
                        self.stage = Stage::Backoff { until: o.now + d };
                    } else {
                        out.push(Action::Ended(ElectionResult::Lost));
                        self.back_off(o.now);
                    }
                    if b.kind == Kind::Switchover {
                        out.push(Action::Switchover(Err(FailoverError::NotElected)));
                    }
                }
            }
            Stage::Watching | Stage::Backoff { .. } | Stage::Delay { .. } => {
                let waiting = matches!(self.stage, Stage::Backoff { until } if o.now < until)
                    || o.promotion_out;
                if o.tilt || self.odown_since.is_none() || waiting {
                    if matches!(self.stage, Stage::Delay { .. }) {
                        self.stage = Stage::Watching;
                    }
                    return;
                }
                match self.stage {
                    // Woken long after the delay ended: the process stalled
                    // (an overloaded host, a pause), and every daemon of
                    // that host woke with it; starting now would start them
                    // together and split the vote. Draw the delay again,
                    // once.
                    Stage::Delay {
                        until,
                        redrawn: false,
                    } if o.now.saturating_duration_since(until) > self.settings.stall() => {
                        self.draw_delay(o, true, out);
                    }
                    Stage::Delay { until, .. } if o.now >= until => {
                        out.extend(self.start(o, Kind::Unplanned, None));
                    }
                    Stage::Delay { .. } => {}
                    _ => self.draw_delay(o, false, out),
                }
            }
        }
    }

    /// Wait a random part of the start delay before starting (at once
    /// when it draws zero).
    fn draw_delay(&mut self, o: &Observation<'_>, redrawn: bool, out: &mut Vec<Action>) {
        let d = self.settings.start_delay(o.rank, &mut self.rng);
        self.stage = Stage::Delay {
            until: o.now + d,
            redrawn,
        };
        if d.is_zero() {
            out.extend(self.start(o, Kind::Unplanned, None));
        }
    }

    fn choose(
        &self,
        o: &Observation<'_>,
        to: Option<&Addr>,
        kind: Kind,
    ) -> Result<Addr, NoGoodReplica> {
        let planned = kind == Kind::Switchover;
        // A replica a previous leader of this failover intended to promote
        // goes first, so that a leader that died half-way is not followed
        // by the promotion of a second replica.
        if to.is_none()
            && let Some(a) = self.intended(o.config_epoch)
            && o.replicas.eligible(a)
            && (!planned || o.replicas.reports_replica(a))
        {
            return Ok(a.clone());
        }
        if planned {
            o.replicas.select_replica(to)
        } else {
            o.replicas.select(to)
        }
    }

    fn start(&mut self, o: &Observation<'_>, kind: Kind, to: Option<&Addr>) -> Vec<Action> {
        match self.choose(o, to, kind) {
            Ok(candidate) => {
                self.no_candidate_reported = false;
                self.stage = Stage::Starting {
                    kind,
                    candidate,
                    since: o.now,
                };
                vec![Action::PersistNewEpoch]
            }
            Err(e) => {
                let mut out = Vec::new();
                if kind == Kind::Unplanned {
                    if !self.no_candidate_reported {
                        out.push(Action::Event(EventKind::AbortNoGoodSlave, Detail::Master));
                        self.no_candidate_reported = true;
                    }
                    self.stage = Stage::Backoff {
                        until: o.now + self.settings.no_candidate_retry(),
                    };
                } else {
                    out.push(Action::Switchover(Err(e.into())));
                }
                out
            }
        }
    }

    fn won(&mut self, o: &Observation<'_>, b: Ballot, out: &mut Vec<Action>) {
        out.push(Action::Ended(ElectionResult::Won));
        out.push(Action::Event(EventKind::ElectedLeader, Detail::Master));
        // Re-check the candidate with the freshest view.
        let candidate = if b.kind == Kind::Unplanned {
            match o
                .replicas
                .select(Some(&b.candidate))
                .or_else(|_| self.choose(o, None, Kind::Unplanned))
            {
                Ok(c) => c,
                Err(_) => {
                    out.push(Action::Event(EventKind::AbortNoGoodSlave, Detail::Master));
                    self.back_off(o.now);
                    return;
                }
            }
        } else {
            out.push(Action::Switchover(Ok(())));
            b.candidate.clone()
        };
        self.intended = Some((b.epoch, candidate.clone(), o.now));
        self.stage = Stage::FailingOver {
            epoch: b.epoch,
            kind: b.kind,
        };
        out.push(Action::StartFailover(Ballot { candidate, ..b }));
    }
}

#[cfg(test)]
mod tests;

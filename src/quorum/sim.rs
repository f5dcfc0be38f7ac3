//! An in-process simulation of three and five daemons' election machines
//! over an in-memory network that drops, delays, duplicates, reorders and
//! partitions messages, in virtual time (as raft-rs's test harness does).
//!
//! Each simulated daemon is what the group task is around the machine: the
//! persisted record (current epoch, vote) updated with the same rules as
//! the state store ([`cast_vote`], [`new_epoch`]), the voter's check
//! ([`may_vote`]), and the adoption of a newer config from a hello. The
//! master is dead from the start; a winner "fails over" after a while and
//! announces its config, which every daemon adopts when the hello reaches it.
//!
//! Checked on every schedule:
//! - at most one winner per epoch, and the winner holds the votes of a
//!   majority and of `quorum` daemons in their persisted records;
//! - one vote per daemon and epoch; epochs never go back;
//! - after the last partition heals (and drops stop), every daemon follows
//!   one winner within a bound.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::election::{Action, Election, Observation, Replicas, Settings};
use super::peers::{IsDownQuery, IsDownReply};
use super::vote::{Vote, VoteRecord, cast_vote, may_vote, new_epoch};
use crate::addr::Addr;
use crate::failover::NoGoodReplica;

/// The faults of one schedule.
#[derive(Debug, Clone)]
struct Faults {
    drop: f64,
    duplicate: f64,
    max_delay_ms: u64,
    persist_ms: u64,
    /// (start ms, end ms, side of each daemon).
    partitions: Vec<(u64, u64, Vec<u8>)>,
}

#[derive(Debug, Clone)]
enum Msg {
    Ask(IsDownQuery),
    Answer {
        asked_epoch: u64,
        reply: IsDownReply,
    },
    Config {
        epoch: u64,
    },
}

#[derive(Debug, Clone)]
enum Ev {
    Deliver { from: usize, to: usize, msg: Msg },
    Tick(usize),
    Persisted(usize, u64),
    FailoverDone(usize, u64),
    Hello(usize),
}

struct Node {
    machine: Election,
    current_epoch: u64,
    record: VoteRecord,
    config_epoch: u64,
    master_sdown: bool,
    /// The machine's deadline a tick is scheduled for.
    deadline: Option<Instant>,
}

struct OneReplica(Addr);

impl Replicas for OneReplica {
    fn select(&self, _to: Option<&Addr>) -> Result<Addr, NoGoodReplica> {
        Ok(self.0.clone())
    }
    fn eligible(&self, _addr: &Addr) -> bool {
        true
    }
}

fn master_of(config_epoch: u64) -> Addr {
    Addr::new(
        "10.0.0.1",
        6000 + u16::try_from(config_epoch % 1000).unwrap_or(0),
    )
}

fn id(i: usize) -> String {
    format!("d{i}")
}

/// What a schedule found.
#[derive(Debug, Default)]
pub(super) struct Outcome {
    pub(super) winners: BTreeMap<u64, usize>,
    pub(super) elections: u64,
    pub(super) messages: u64,
    pub(super) converged_ms: Option<u64>,
}

struct Sim {
    base: Instant,
    now_ms: u64,
    seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64, usize)>>,
    events: Vec<Option<Ev>>,
    nodes: Vec<Node>,
    rng: StdRng,
    faults: Faults,
    quorum: usize,
    /// (epoch, voter) → the candidate on record.
    votes: BTreeMap<(u64, usize), String>,
    out: Outcome,
}

impl Sim {
    fn at(&self) -> Instant {
        self.base + Duration::from_millis(self.now_ms)
    }

    fn schedule(&mut self, delay_ms: u64, ev: Ev) {
        self.seq += 1;
        let idx = self.events.len();
        self.events.push(Some(ev));
        self.queue
            .push(Reverse((self.now_ms + delay_ms, self.seq, idx)));
    }

    fn cut(&self, a: usize, b: usize) -> bool {
        self.faults
            .partitions
            .iter()
            .any(|(s, e, side)| (*s..*e).contains(&self.now_ms) && side[a] != side[b])
    }

    fn healed_at(&self) -> u64 {
        self.faults
            .partitions
            .iter()
            .map(|(_, e, _)| *e)
            .max()
            .unwrap_or(0)
    }

    fn send(&mut self, from: usize, to: usize, msg: Msg) {
        self.out.messages += 1;
        if self.cut(from, to) {
            return;
        }
        let lossy = self.now_ms < self.healed_at();
        if lossy && self.rng.random_bool(self.faults.drop) {
            return;
        }
        let copies = if self.rng.random_bool(self.faults.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let d = self.rng.random_range(0..=self.faults.max_delay_ms);
            self.schedule(
                d,
                Ev::Deliver {
                    from,
                    to,
                    msg: msg.clone(),
                },
            );
        }
    }

    fn peer_index(me: usize, other: usize) -> usize {
        if other < me { other } else { other - 1 }
    }

    fn check_epochs(&self, i: usize, before: (u64, u64)) {
        let n = &self.nodes[i];
        assert!(
            n.current_epoch >= before.0 && n.record.vote_epoch >= before.1,
            "daemon {i}: epoch went back from {before:?} to ({}, {})",
            n.current_epoch,
            n.record.vote_epoch
        );
    }

    fn record_vote(&mut self, voter: usize, epoch: u64, for_whom: Option<&str>) {
        let Some(c) = for_whom else { return };
        let prev = self.votes.insert((epoch, voter), c.to_string());
        if let Some(p) = prev {
            assert_eq!(p, c, "daemon {voter} voted twice in epoch {epoch}");
        }
    }

    fn run_actions(&mut self, i: usize, actions: Vec<Action>) {
        for a in actions {
            match a {
                Action::Ask(ask) => {
                    let n = &self.nodes[i];
                    let q = IsDownQuery {
                        group: "g".into(),
                        master: master_of(n.config_epoch),
                        config_epoch: n.config_epoch,
                        epoch: ask.vote.as_ref().map_or(n.current_epoch, |(e, _)| *e),
                        candidate: ask.vote.as_ref().map(|_| id(i)),
                        promote: ask.vote.map(|(_, p)| p),
                    };
                    for to in 0..self.nodes.len() {
                        if to != i {
                            self.send(i, to, Msg::Ask(q.clone()));
                        }
                    }
                }
                Action::PersistNewEpoch => {
                    let d = self.rng.random_range(0..=self.faults.persist_ms);
                    let seen = self.nodes[i].record.vote_epoch;
                    self.schedule(d, Ev::Persisted(i, seen));
                }
                Action::StartFailover(b) => {
                    if let Some(w) = self.out.winners.insert(b.epoch, i) {
                        panic!("epoch {} won by daemon {w} and by daemon {i}", b.epoch);
                    }
                    let votes: Vec<usize> = self
                        .votes
                        .iter()
                        .filter(|((e, _), c)| *e == b.epoch && **c == id(i))
                        .map(|((_, v), _)| *v)
                        .collect();
                    let majority = self.nodes.len() / 2 + 1;
                    assert!(
                        votes.len() >= majority.max(self.quorum),
                        "daemon {i} won epoch {} with the persisted votes of {votes:?} only",
                        b.epoch
                    );
                    let d = self.rng.random_range(50..=400);
                    self.schedule(d, Ev::FailoverDone(i, b.epoch));
                }
                Action::Event(..) | Action::Ended(_) | Action::Switchover(_) => {}
            }
        }
        let deadline = self.nodes[i].machine.deadline();
        if let Some(d) = deadline
            && self.nodes[i].deadline != deadline
        {
            self.nodes[i].deadline = deadline;
            let ms = u64::try_from(d.saturating_duration_since(self.at()).as_millis()).unwrap_or(0);
            self.schedule(ms, Ev::Tick(i));
        }
    }

    fn with_obs<R>(&mut self, i: usize, f: impl FnOnce(&mut Election, &Observation<'_>) -> R) -> R {
        let now = self.at();
        let n = &mut self.nodes[i];
        let replica = OneReplica(Addr::new("10.0.0.2", 6379));
        let o = Observation {
            now,
            master_sdown: n.master_sdown,
            tilt: false,
            config_epoch: n.config_epoch,
            replicas: &replica,
            rank: i,
            promotion_out: false,
        };
        f(&mut n.machine, &o)
    }

    fn adopt(&mut self, i: usize, epoch: u64) -> Vec<Action> {
        let now = self.at();
        let n = &mut self.nodes[i];
        if epoch <= n.config_epoch {
            return Vec::new();
        }
        n.config_epoch = epoch;
        n.master_sdown = false;
        n.current_epoch = n.current_epoch.max(epoch);
        let out = n.machine.abandon();
        n.machine.on_master_changed(now, epoch);
        out
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Tick(i) => {
                let acts = self.with_obs(i, |m, o| m.tick(o));
                self.run_actions(i, acts);
            }
            Ev::Hello(i) => {
                let epoch = self.nodes[i].config_epoch;
                if epoch > 0 {
                    for to in 0..self.nodes.len() {
                        if to != i {
                            self.send(i, to, Msg::Config { epoch });
                        }
                    }
                }
                self.schedule(1000, Ev::Hello(i));
            }
            Ev::Persisted(i, seen) if self.nodes[i].record.vote_epoch > seen => {
                // Voted for another daemon meanwhile: the store refuses.
                let now = self.at();
                let acts = self.nodes[i].machine.on_epoch_superseded(now);
                self.run_actions(i, acts);
            }
            Ev::Persisted(i, _) => {
                let n = &mut self.nodes[i];
                let before = (n.current_epoch, n.record.vote_epoch);
                let epoch = new_epoch(&mut n.current_epoch, &mut n.record, &id(i));
                self.check_epochs(i, before);
                self.record_vote(i, epoch, Some(&id(i)));
                self.out.elections += 1;
                let acts = self.with_obs(i, |m, o| m.on_epoch(o, Ok(epoch)));
                self.run_actions(i, acts);
            }
            Ev::FailoverDone(i, epoch) => {
                let mut acts = self.adopt(i, epoch);
                let now = self.at();
                self.nodes[i].machine.on_failover_end(now, true);
                acts.extend(self.with_obs(i, |m, o| m.tick(o)));
                self.run_actions(i, acts);
                for to in 0..self.nodes.len() {
                    if to != i {
                        self.send(i, to, Msg::Config { epoch });
                    }
                }
            }
            Ev::Deliver { from, to, msg } => self.deliver(from, to, msg),
        }
    }

    fn deliver(&mut self, from: usize, to: usize, msg: Msg) {
        match msg {
            Msg::Ask(q) => {
                let n = &mut self.nodes[to];
                let down = n.master_sdown && q.master == master_of(n.config_epoch);
                let before = (n.current_epoch, n.record.vote_epoch);
                let mut acts = Vec::new();
                let vote = if may_vote(&q, &master_of(n.config_epoch), n.config_epoch, false) {
                    let cand = q.candidate.clone().unwrap_or_default();
                    let (v, _) = cast_vote(&mut n.current_epoch, &mut n.record, q.epoch, &cand);
                    let now = self.base + Duration::from_millis(self.now_ms);
                    n.machine.on_vote_cast(now, &q, &v, &mut acts);
                    v
                } else {
                    n.current_epoch = n.current_epoch.max(q.epoch);
                    Vote {
                        leader: n.record.voted_for.clone(),
                        epoch: n.record.vote_epoch,
                    }
                };
                self.check_epochs(to, before);
                let rec = self.nodes[to].record.clone();
                self.record_vote(to, rec.vote_epoch, rec.voted_for.as_deref());
                self.run_actions(to, acts);
                let reply = IsDownReply {
                    down,
                    leader: vote.leader,
                    leader_epoch: vote.epoch,
                };
                self.send(
                    to,
                    from,
                    Msg::Answer {
                        asked_epoch: q.epoch,
                        reply,
                    },
                );
            }
            Msg::Answer { asked_epoch, reply } => {
                let peer = Self::peer_index(to, from);
                let now = self.at();
                let acts = self.with_obs(to, |m, o| m.on_answer(o, peer, asked_epoch, now, &reply));
                self.run_actions(to, acts);
            }
            Msg::Config { epoch } => {
                let acts = self.adopt(to, epoch);
                self.run_actions(to, acts);
            }
        }
    }

    fn converged(&self) -> bool {
        let first = self.nodes[0].config_epoch;
        first > 0
            && self
                .nodes
                .iter()
                .all(|n| n.config_epoch == first && !n.master_sdown)
    }
}

/// Run one seeded schedule with `daemons` daemons and `quorum`; panics on
/// a violated property.
pub(super) fn run(seed: u64, daemons: usize, quorum: usize) -> Outcome {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut partitions = Vec::new();
    for _ in 0..rng.random_range(0..=2) {
        let start = rng.random_range(0..3000);
        let len = rng.random_range(200..4000);
        let side = (0..daemons).map(|_| rng.random_range(0..2u8)).collect();
        partitions.push((start, start + len, side));
    }
    let faults = Faults {
        drop: rng.random_range(0.0..0.3),
        duplicate: rng.random_range(0.0..0.2),
        max_delay_ms: rng.random_range(0..150),
        persist_ms: rng.random_range(0..20),
        partitions,
    };
    let base = Instant::now();
    let nodes = (0..daemons)
        .map(|i| Node {
            machine: Election::new(
                Settings {
                    id: id(i),
                    daemons,
                    quorum,
                    ping_period: Duration::from_millis(250),
                    down_after: Duration::from_secs(1),
                    failover_timeout: Duration::from_secs(3),
                },
                daemons - 1,
                Some(seed.wrapping_mul(31).wrapping_add(i as u64)),
            ),
            current_epoch: 0,
            record: VoteRecord::default(),
            config_epoch: 0,
            master_sdown: true,
            deadline: None,
        })
        .collect();
    let mut sim = Sim {
        base,
        now_ms: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        events: Vec::new(),
        nodes,
        rng,
        faults,
        quorum,
        votes: BTreeMap::new(),
        out: Outcome::default(),
    };
    for i in 0..daemons {
        let offset = sim.rng.random_range(0..50);
        sim.schedule(offset, Ev::Tick(i));
        sim.schedule(offset + 500, Ev::Hello(i));
    }
    let healed = sim.healed_at();
    // The bound for liveness: after the heal, a lost election backs off
    // 3–4 s; a few rounds are allowed.
    let bound = healed + 30_000;
    let mut next_tick = vec![0u64; daemons];
    while let Some(Reverse((t, _, idx))) = sim.queue.pop() {
        if t > bound {
            break;
        }
        sim.now_ms = t;
        let Some(ev) = sim.events.get_mut(idx).and_then(Option::take) else {
            continue;
        };
        if let Ev::Tick(i) = ev {
            // The group's regular tick every 50 ms (deadline ticks come on top).
            if t >= next_tick[i] {
                next_tick[i] = t + 50;
                sim.schedule(50, Ev::Tick(i));
            }
        }
        sim.step(ev);
        if t >= healed && sim.converged() {
            sim.out.converged_ms = Some(t);
            break;
        }
    }
    let winners = sim.out.winners.len();
    assert!(
        sim.out.converged_ms.is_some(),
        "seed {seed}: no convergence within 30 s of the heal at {healed} ms ({winners} winners, {} elections, faults {:?})",
        sim.out.elections,
        sim.faults
    );
    sim.out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeds per configuration in `cargo test`; `PICKET_SIM_SCHEDULES`
    /// raises it for a long run.
    fn schedules(default: u64) -> u64 {
        std::env::var("PICKET_SIM_SCHEDULES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    }

    fn many(daemons: usize, quorum: usize, n: u64) {
        let start = std::time::Instant::now();
        let (mut elections, mut epochs, mut messages, mut several) = (0, 0, 0, 0);
        for seed in 0..n {
            let out = run(seed, daemons, quorum);
            elections += out.elections;
            epochs += out.winners.len() as u64;
            messages += out.messages;
            if out.winners.len() > 1 {
                several += 1;
            }
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{daemons} daemons, quorum {quorum}: {n} schedules in {secs:.2} s ({:.0}/s); \
             {elections} elections, {epochs} won, {several} schedules with more than one winner, {messages} messages",
            n as f64 / secs
        );
    }

    #[test]
    fn three_daemons_elect_at_most_one_leader_per_epoch() {
        many(3, 2, schedules(2000));
    }

    #[test]
    fn five_daemons_elect_at_most_one_leader_per_epoch() {
        many(5, 3, schedules(1000));
    }

    #[test]
    fn five_daemons_with_quorum_two_still_need_a_majority() {
        many(5, 2, schedules(500));
    }
}

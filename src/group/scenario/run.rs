//! One seeded schedule from start to settling, as `picket-sim` runs it
//! (`src/bin/picket-sim.rs`): the simulation's entry point outside the
//! tests.

use super::Sim;
use super::net::Net;
pub use super::net::NetFaults;

/// One seeded schedule: the seed fixes everything else.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The seed.
    pub seed: u64,
    /// How many daemons (quorum: a majority).
    pub daemons: usize,
    /// How many faults, one every 0.3 to 1.5 virtual s after 2 s of calm;
    /// then everything heals and the group has 15 s to settle.
    pub faults: u64,
    /// The network's faults (None: every message arrives at once, as in
    /// the tests' fixed seeds).
    pub net: Option<NetFaults>,
    /// Planned switchovers, busy scripts and restarts that load their data
    /// too (`ops.rs`; off: a seed recorded without them replays).
    pub ops: bool,
    /// A Kubernetes Service gates the group, its endpoint controller
    /// lagging and stalling (`service.rs`; off: recorded seeds replay).
    pub service: bool,
    /// No server fault: the schedule's faults are switchovers and the
    /// daemons' own (crashes, restarts, isolation, and the network's
    /// faults between them), and simulated clients' acknowledged writes
    /// must all survive (invariant 7, `clients.rs`). Not with the
    /// network's server cuts: a server whose replies are lost is down for
    /// the daemons that hear nothing, and its failover may lose writes.
    pub switchovers: bool,
    /// The servers are Dragonfly's, not Redis' (`dragonfly.rs`; off:
    /// recorded seeds replay).
    pub dragonfly: bool,
    /// With `dragonfly`: the replicas run with
    /// `--break_replication_on_master_restart=true`.
    pub break_replication: bool,
    /// Isolation fencing configured, and masters' replication links cut
    /// now and then (`fence.rs`, invariant 15; off: recorded seeds
    /// replay).
    pub isolation: bool,
}

/// What a schedule gave.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The trace's hash: the same run gives the same one.
    pub trace_hash: u64,
    /// How long the schedule lasted in virtual time.
    pub virtual_ms: u64,
    /// The invariants broken, in order (empty: none).
    pub violations: Vec<String>,
    /// The trace: `(virtual ms, daemon, work or fault)`, daemon = the
    /// number of daemons for faults.
    pub trace: Vec<(u64, usize, String)>,
}

/// Whether a violation is of a kind still open with the simulated
/// network's faults (`--net`): a server that came back with less copied by
/// its replicas (invariant 19), or a group that does not settle after the
/// faults heal (the daemons name different masters, or a server does not
/// follow the one they agree on). Both hold without them (every seed
/// swept). With them, the checker counts invariant 19 only while a
/// majority can watch the server (one-way cuts, stalls and lost replies
/// included), and still finds seeds of both kinds (about 5 % of seeds of
/// three daemons, docs/reliability.md, "Simulation"), not yet told apart
/// from the checker's own limits. Invariant 20 (the routed master made a
/// replica) too: a daemon restarted with an older config that adopts a
/// peer's config whose master was down moments before can demote the
/// master a third daemon has just published (seed 289 of `--net
/// --server-cuts`), found once in 300, and a daemon back with its master
/// that demotes the master the others published meanwhile (seeds 39, 125
/// and 224 of `--ops --net --server-cuts`); with a gating Service, the Service
/// then routes to the demoted server (a replica). Every other invariant (one master per
/// epoch, epochs, fence, publication, the backend's routing, votes,
/// leaders, selection) is never known open.
pub fn known_open_with_net(violation: &str) -> bool {
    known_open(violation)
        || violation.contains(" ms: invariant 19: ")
        || violation.starts_with("not settled ")
        || (violation.starts_with("settled on ") && violation.ends_with(" do not follow it"))
}

/// Whether a violation is of a kind still open with or without the
/// network's faults: invariant 20 (the routed master made a replica by a
/// daemon that hears its publisher), and with a gating Service the
/// Service then routing to that demoted server. Its known causes are
/// fixed (a daemon back from a cut demoting the master published
/// meanwhile, a stale leader's retried promotion: docs/reliability.md,
/// "Simulation"); none was seen without the network in 6,000 schedules of
/// the ninth session, but it stays printed as KNOWN OPEN rather than fail
/// CI's fresh seeds until more sweeps say so. Every other violation fails
/// a run without the network.
pub fn known_open(violation: &str) -> bool {
    violation.contains(", the master clients are routed to at epoch ")
        || violation.contains(", which is a replica")
}

impl Run {
    /// Faults for a schedule of about `secs` virtual seconds: 2 s of calm,
    /// 0.9 s per fault on average, 15 s to settle.
    pub fn faults_for_virtual_secs(secs: u64) -> u64 {
        (secs.saturating_sub(17) * 10).div_ceil(9)
    }

    /// The command that replays this schedule.
    pub fn replay_command(&self) -> String {
        let mut cmd = format!(
            "picket-sim --seed {} --daemons {} --faults {}",
            self.seed, self.daemons, self.faults
        );
        if let Some(n) = &self.net {
            cmd += &format!(
                " --net --delay-ms {} --duplicate {}",
                n.delay_ms, n.duplicate
            );
            if !n.one_way_cuts {
                cmd += " --no-one-way-cuts";
            }
            if !n.stalls {
                cmd += " --no-stalls";
            }
            if n.server_cuts {
                cmd += " --server-cuts";
            }
        }
        if self.ops {
            cmd += " --ops";
        }
        if self.service {
            cmd += " --service";
        }
        if self.switchovers {
            cmd += " --switchovers";
        }
        if self.dragonfly {
            cmd += " --dragonfly";
        }
        if self.break_replication {
            cmd += " --break-replication";
        }
        if self.isolation {
            cmd += " --isolation";
        }
        cmd
    }
}

/// Run one schedule: the group healthy for 2 s, then the faults, then
/// healing and 15 s to settle; the invariants are checked after every
/// step (`Sim::violations`).
pub async fn run(r: &Run) -> Outcome {
    let quorum = r.daemons / 2 + 1;
    let mut sim = if r.isolation {
        let mut sim = Sim::with_group(r.daemons, quorum, r.seed, super::fence::FENCED);
        sim.fencing = Some((1, 1));
        sim
    } else {
        Sim::new(r.daemons, quorum, r.seed)
    };
    sim.net = Net::new(r.net, r.seed);
    if r.dragonfly {
        for s in &mut sim.servers.0 {
            s.dragonfly = true;
            s.break_replication = r.break_replication;
        }
    }
    sim.ops = r.ops;
    sim.planned = r.switchovers;
    sim.clients.checked = r.switchovers && !r.net.is_some_and(|n| n.server_cuts);
    if r.service {
        sim.service = Some(super::service::Service::new(r.seed, super::addr(7000)));
    }
    sim.run_for(2_000).await;
    sim.chaos(r.faults).await;
    Outcome {
        trace_hash: sim.trace_hash(),
        virtual_ms: sim.ms,
        violations: std::mem::take(&mut sim.violations),
        trace: std::mem::take(&mut sim.trace),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The network's faults happen, keep the invariants on a few seeds,
    /// and leave a run as replayable as one without them.
    #[tokio::test]
    async fn the_simulated_network_replays_and_keeps_the_invariants() {
        let base = Run {
            seed: 1,
            daemons: 3,
            faults: 12,
            net: Some(NetFaults::all()),
            ops: false,
            service: false,
            switchovers: false,
            dragonfly: false,
            break_replication: false,
            isolation: false,
        };
        let mut kinds = std::collections::BTreeSet::new();
        for seed in [1, 2] {
            let r = Run {
                seed,
                ..base.clone()
            };
            let a = run(&r).await;
            assert!(
                a.violations.is_empty(),
                "{}: {:#?}\n{:#?}",
                r.replay_command(),
                a.violations,
                a.trace
            );
            for (_, _, w) in &a.trace {
                if w.contains("not heard by") {
                    kinds.insert("one-way cut");
                }
                if w.contains("stalled until") {
                    kinds.insert("stall");
                }
            }
            if seed == 1 {
                let b = run(&r).await;
                assert_eq!(a.trace_hash, b.trace_hash, "{}", r.replay_command());
            }
        }
        assert_eq!(kinds.len(), 2, "both kinds of network fault ran: {kinds:?}");
    }

    /// Seeds that broke an invariant before a fix, each replayed with
    /// the faults it was found with (docs/reliability.md, "Simulation").
    #[tokio::test]
    async fn the_seeds_fixed_since_the_operations_and_the_service_keep_every_invariant() {
        let cuts = Some(NetFaults {
            server_cuts: true,
            ..NetFaults::all()
        });
        for (seed, net, ops, service) in [
            // A switchover whose old master came back with less.
            (45, None, true, false),
            (117, None, true, false),
            // A fence waiting for a stalled endpoint controller.
            (13, None, false, true),
            (56, None, false, true),
            // Voters standing back after their leader died.
            (292, None, false, true),
            (752, cuts, false, false),
            // Every daemon restarted before it saw the master's run id.
            (133, None, false, true),
            (909, cuts, false, false),
            // A stale leader's retried promotion of a candidate that had
            // restarted empty, then its re-point of the newer master.
            (188, None, true, true),
            // A daemon back from a cut demoted the master published
            // meanwhile, at its first INFO after the cut.
            (594, None, false, false),
            (628, None, false, false),
            // A leader cut off from everything retried its promotion
            // after a newer election had begun, and re-pointed the newer
            // master to its candidate.
            (674, None, true, true),
            (807, None, true, true),
            (290, cuts, true, true),
            // Leaders that stepped down for a newer election that came to
            // nothing: the master routed again at the fence's epoch.
            (544, None, true, true),
            // A daemon asked to vote for a promotion it did not vote for
            // demoted the promoted replica on an older peer's hello.
            (2108, None, false, false),
            // A master restarted behind a stray master of its own history:
            // judged behind it and failed over to it, not kept and the
            // stray emptied; and a master that reloaded its data does not
            // make every replica of its history a copy of it.
            (1345, None, true, true),
            (97, None, true, true),
            // A daemon back from an isolation demoted the master published
            // meanwhile, on the hello of a voter that had not had its
            // config yet; and the promotion announced in hellos ends with
            // failover_timeout, or a split election keeps its replica from
            // being re-pointed (152).
            (728, cuts, true, true),
            (624, cuts, true, true),
            (152, cuts, true, true),
            // An aborted switchover routed its kept master again, which
            // another daemon's newer config had made a replica meanwhile:
            // the Service routed clients to a replica.
            (2501, cuts, true, true),
            // A switchover's leader killed after its `FAILOVER`, which the
            // server completed: restarted, it announced the epoch it led
            // with the old master, and the peers routed that replica
            // (2248); announced only once that server answers as a master,
            // not once this daemon publishes it, or the fence holds for
            // good (422, 1032).
            (2248, cuts, true, true),
            (422, cuts, true, true),
            (1032, cuts, true, true),
            // A daemon that had not voted started a second election while
            // the first leader still retried its promotion, which then
            // re-pointed the second one's master (855); standing back for
            // a peer's vote, not for what a peer was merely asked (2942)
            // nor for a vote restored at a restart (3252).
            (855, None, true, true),
            (2942, cuts, true, true),
            (3252, cuts, true, true),
            // The replica a leader promoted restarted empty while the
            // leader was cut off before its config spread: the two others
            // took it for a replica that restarted, and the replica
            // re-pointed to it copied it.
            (3865, None, false, false),
            // Judged so, a master back empty was failed over by the two
            // daemons that had its config while a third, just restarted
            // on an older one, demoted it on a voter's confirmation.
            (3765, cuts, true, true),
            // A voter's stand-back held the third daemon back after the
            // leader it named had aborted and said so (3434).
            (3434, cuts, true, true),
            // The replica a split election named, back as a master, was
            // spared for good by every daemon that took part (3960); so
            // was the replica a daemon's own election named, overtaken at
            // once by a peer's older config, never re-pointed to the
            // master that config kept (929).
            (3960, cuts, true, true),
            (929, None, true, true),
            // A daemon stalled during its failover routed the kept master
            // on an INFO from before its stall, a replica by then (109);
            // read again before it is routed, but routed when the read
            // says master, judged down or not (2407: left fenced).
            (109, cuts, true, true),
            (2407, None, true, true),
            // A failover abandoned for a peer's config naming the kept
            // master, or aborted, 10 ms after its last `FAILOVER`, which
            // then handed over: clients routed to a replica (6066, 3557).
            (6066, cuts, true, true),
            (3557, None, true, true),
            // A server demoted while its `FAILOVER` waited (Redis refuses
            // that) handed over later (6249); an endpoint controller
            // stalled in the time to settle (6546).
            (6249, cuts, true, true),
            (6546, cuts, true, true),
            // A daemon stalled 0.8 s while its master was down demoted,
            // as the master came back, the stray master the others had
            // just published at a newer epoch, on hellos from before
            // their election: hellos count only from after the master
            // turned sane again (30569).
            (30569, cuts, true, true),
        ] {
            replays_clean(Run {
                seed,
                daemons: 3,
                faults: 20,
                net,
                ops,
                service,
                switchovers: false,
                dragonfly: false,
                break_replication: false,
                isolation: false,
            })
            .await;
        }
    }

    /// `r` keeps every invariant.
    async fn replays_clean(r: Run) {
        let out = run(&r).await;
        assert!(
            out.violations.is_empty(),
            "{}: {:#?}",
            r.replay_command(),
            out.violations
        );
    }

    /// Seeds found with switchovers and no server fault, or beside them,
    /// replayed with the faults they were found with (docs/reliability.md,
    /// "Simulation", the thirteenth session).
    #[tokio::test]
    async fn the_seeds_fixed_since_the_clients_keep_every_invariant() {
        let cuts = Some(NetFaults {
            server_cuts: true,
            ..NetFaults::all()
        });
        for (seed, net, switchovers) in [
            // A switchover started while another daemon's failover could
            // still promote (242); a switchover's outcome lost while its
            // leader was stalled (907).
            (242, Some(NetFaults::all()), true),
            (907, Some(NetFaults::all()), true),
            // A switchover's leader restarted just after its `FAILOVER`
            // went out published its kept master before the server
            // handed over (2353).
            (2353, Some(NetFaults::all()), true),
            // A switchover of a master already handed over, retried until
            // `failover_timeout` (2796).
            (2796, Some(NetFaults::all()), true),
            // A switchover whose old master became a replica meanwhile,
            // retried until `failover_timeout` (4824).
            (4824, Some(NetFaults::all()), true),
            // A switchover's `FAILOVER` retried by a leader that did not
            // hear of two newer switchovers reached its old master, handed
            // over and back since (6131, known open in the thirteenth
            // session).
            (6131, Some(NetFaults::all()), true),
            // A switchover chose a stray master, left by an unplanned
            // failover, for its candidate (12157).
            (12157, Some(NetFaults::all()), true),
            // The same loss with every fault (6876); a leader stalled
            // after its fence promoted on waking (4346).
            (6876, cuts, false),
            (4346, cuts, false),
            // A master judged back with less refused the judgement's
            // pause while a script ran; its replica copied it before the
            // renewal (7826, open since the eleventh session).
            (7826, cuts, false),
            // A daemon back from a stall re-pointed the master published
            // meanwhile to the dead old one, on an INFO held from before
            // (9867, found once the servers drew a new replication id at
            // each promotion).
            (9867, cuts, false),
            // A daemon back with an old config demoted the newer master
            // on a stale peer's hello (11353); a master back empty judged
            // only once a replica still loading was read (11764).
            (11353, cuts, false),
            (11764, cuts, false),
            // A switchover's candidate that followed another master
            // (20198); a daemon restarted after judging its master back
            // empty, which found the new process on record (21783).
            (20198, cuts, false),
            (21783, cuts, false),
            // A switchover's leader back from its own isolation took the
            // old master's silence for its death and promoted the
            // candidate unplanned (22407).
            (22407, Some(NetFaults::all()), true),
        ] {
            replays_clean(Run {
                seed,
                daemons: 3,
                faults: 20,
                net,
                ops: !switchovers,
                service: true,
                switchovers,
                dragonfly: false,
                break_replication: false,
                isolation: false,
            })
            .await;
        }
    }

    /// Seeds found on Dragonfly with `--break_replication_on_master_restart`:
    /// with every fault, a candidate restarted with less, chosen on the
    /// INFO of its previous process, copied through the re-point sent
    /// beside its promotion (346, 1389); two leaders a round apart, the
    /// older one's re-point beside its promotion made the newer master a
    /// replica (45 without the network's faults, 2503 with them); a
    /// failover given up while its promotion and the re-points beside it
    /// were still out, after which the same daemon elected and published
    /// the replica one of them then made a replica (669, 1042), or
    /// published the adopted master at its fence's epoch before one of
    /// them made it a replica (534, 1138).
    #[tokio::test]
    async fn the_dragonfly_seeds_fixed_since_keep_every_invariant() {
        let cuts = Some(NetFaults {
            server_cuts: true,
            ..NetFaults::all()
        });
        for (seed, net) in [
            (346, cuts),
            (1389, cuts),
            (45, None),
            (2503, cuts),
            (669, None),
            (1042, None),
            (534, None),
            (1138, None),
        ] {
            replays_clean(Run {
                seed,
                daemons: 3,
                faults: 20,
                net,
                ops: true,
                service: true,
                switchovers: false,
                dragonfly: true,
                break_replication: true,
                isolation: false,
            })
            .await;
        }
    }

    /// Seeds found on Dragonfly with `--break_replication_on_master_restart`
    /// and no other fault kind (1884679, 1885280): the master restarted
    /// empty, and its failover's leader and a voter were killed after the
    /// promotion went out, before the publication; restarted, the leader
    /// published the kept master at its fence's epoch, and no daemon
    /// judging that master's restart counted the promoted replica (a
    /// Dragonfly master with a new replication id), so the master was kept
    /// and the promoted replica demoted to it and emptied (invariant 19).
    /// The replica a leader was promoting now counts (`judge_reboot`).
    #[tokio::test]
    async fn the_dragonfly_restarted_leader_seeds_keep_every_invariant() {
        for seed in [1884679, 1885280] {
            replays_clean(Run {
                seed,
                daemons: 3,
                faults: 20,
                net: None,
                ops: false,
                service: false,
                switchovers: false,
                dragonfly: true,
                break_replication: true,
                isolation: false,
            })
            .await;
        }
    }

    /// Isolation fencing's seeds (invariant 15), each fixed in picket:
    /// 1877, a daemon out of TILT lowered a fence the others had raised
    /// (`FenceState::found`); 3620 and 3640, peers that had not read the
    /// old master since its re-point did not count it as a replica
    /// (`isolation::replica_sight`); 2551 (invariant 20), a daemon
    /// stalled after asking for votes won on those it found queued, in
    /// TILT, and failed over at an epoch older than the config published
    /// meanwhile (`quorum::election`, `drive`).
    #[tokio::test]
    async fn the_isolation_seeds_fixed_since_keep_every_invariant() {
        for (seed, ops) in [(1877, false), (3620, true), (3640, true), (2551, true)] {
            replays_clean(Run {
                seed,
                daemons: 3,
                faults: 20,
                net: Some(NetFaults::all()),
                ops,
                service: false,
                switchovers: false,
                dragonfly: false,
                break_replication: false,
                isolation: true,
            })
            .await;
        }
    }

    #[test]
    fn a_replay_command_names_every_setting() {
        let r = Run {
            seed: 7,
            daemons: 5,
            faults: 48,
            net: Some(NetFaults {
                stalls: false,
                ..NetFaults::all()
            }),
            ops: true,
            service: true,
            switchovers: true,
            dragonfly: true,
            break_replication: true,
            isolation: true,
        };
        assert_eq!(
            r.replay_command(),
            "picket-sim --seed 7 --daemons 5 --faults 48 --net --delay-ms 40 --duplicate 0.02 \
             --no-stalls --ops --service --switchovers --dragonfly --break-replication --isolation"
        );
        assert_eq!(Run::faults_for_virtual_secs(60), 48);
    }
}

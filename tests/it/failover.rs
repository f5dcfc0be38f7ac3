//! Failover with three picket daemons (quorum 2) against real redis-server
//! processes: kill -9 of the master, replica selection, re-pointing,
//! demotion of the returning old master, flush-before-advertise, quorum
//! loss, durable votes, planned switchovers (Redis and a Dragonfly stub)
//! and a leader that dies half-way (`SENTINEL SIMULATE-FAILURE`).
//!
//! The decisions alone (a partitioned daemon, a replica promoted while
//! the master is down, the leader's successors) are the simulation's
//! (`src/group/scenario.rs`, tests of the same names): their
//! process-level forms here were removed once it covered them.
//!
//! The tests of this file run one at a time (they share two cores with the
//! daemons they start; running them together would make the daemons stall
//! and enter TILT), and every wait is bounded.

use picket_harness::dragonfly_stub;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use picket::addr::Addr;
use picket_harness::*;
use serde_json::Value;

const GROUP: &str = "cache";
/// Bound on a whole failover (detection, election, promotion, agreement of
/// every daemon) on a loaded machine; the usual figure is 2–3 s.
const FAILOVER_BOUND: Duration = Duration::from_secs(30);

fn addr_of(s: &RedisServer) -> Addr {
    Addr::new(s.ip(), s.port())
}

fn sock(a: &Value) -> Option<SocketAddr> {
    a.as_str()?.parse().ok()
}

/// A topology and three daemons watching it, converged.
struct Setup {
    topo: Topology,
    cluster: PicketCluster,
}

fn setup_with(topo: Topology, quorum: u32, extra: &str) -> Setup {
    setup_planned(ClusterPlan::new(3), topo, quorum, extra)
}

fn setup_planned(plan: ClusterPlan, topo: Topology, quorum: u32, extra: &str) -> Setup {
    let groups = group_toml(GROUP, topo.master.addr(), quorum, extra);
    let cluster = plan.start(&groups);
    let n = 1 + topo.replicas.len();
    cluster.wait_converged(&[0, 1, 2], GROUP, n, Duration::from_secs(20));
    Setup { topo, cluster }
}

fn setup(replicas: usize, extra: &str) -> Setup {
    setup_with(Topology::master_with_replicas(replicas), 2, extra)
}

/// [`PicketCluster::wait_agreed_new_master`] for [`GROUP`].
#[track_caller]
fn wait_agreed_new_master(
    cluster: &PicketCluster,
    which: &[usize],
    old: SocketAddr,
    timeout: Duration,
) -> (SocketAddr, u64) {
    cluster.wait_agreed_new_master(GROUP, which, old, timeout)
}

/// The daemons that led a completed failover, by `last_failover.outcome`.
fn leaders(cluster: &PicketCluster, which: &[usize]) -> Vec<usize> {
    which
        .iter()
        .copied()
        .filter(|&i| {
            cluster.nodes[i].group(GROUP)["last_failover"]["outcome"]
                .as_str()
                .is_some_and(|o| o.starts_with("completed"))
        })
        .collect()
}

/// Wait until exactly one of the three daemons has completed the failover;
/// its index.
#[track_caller]
fn finished_leader(cluster: &PicketCluster) -> usize {
    wait_for("the leader to finish", Duration::from_secs(15), || {
        leaders(cluster, &[0, 1, 2]).len() == 1
    });
    leaders(cluster, &[0, 1, 2])[0]
}

/// `+promoted-slave` events across every daemon's log (all starts).
fn promotions(cluster: &PicketCluster) -> Vec<LoggedEvent> {
    cluster
        .nodes
        .iter()
        .flat_map(|n| n.events())
        .filter(|e| e.event == "+promoted-slave")
        .collect()
}

fn role(s: &RedisServer) -> Option<String> {
    s.info_field("replication", "role")
}

/// Wait until the picket view of every daemon shows `priority` for `addr`
/// (INFO is read once a second; selection must not use a stale one).
#[track_caller]
fn wait_priority_seen(cluster: &PicketCluster, addr: SocketAddr, priority: u64) {
    for n in &cluster.nodes {
        wait_for(
            &format!("{} to read priority {priority} of {addr}", n.id),
            Duration::from_secs(10),
            || {
                n.group(GROUP)["instances"].as_array().is_some_and(|a| {
                    a.iter().any(|i| {
                        sock(&i["addr"]) == Some(addr) && i["priority"].as_u64() == Some(priority)
                    })
                })
            },
        );
    }
}

/// Restart `old` (empty, as after an OOM kill) with a client connected the
/// moment it accepts connections, and wait until picket has made it a
/// replica of `new_master`. Returns the time from that first connection to
/// `role:slave` of `new_master`, and the early client's last write result
/// (an `Err` once its connection was closed, within 3 s of the demotion).
fn restart_and_time_demotion(
    old: &mut RedisServer,
    new_master: SocketAddr,
) -> (Duration, Result<Reply, String>) {
    let (mut client, answered) = old.restart_with_early_client();
    let mut demoted = None;
    let deadline = answered + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(info) = old.info("replication")
            && info_value(&info, "role").as_deref() == Some("slave")
            && info_value(&info, "master_host") == Some(new_master.ip().to_string())
            && info_value(&info, "master_port") == Some(new_master.port().to_string())
        {
            demoted = Some(answered.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = demoted.unwrap_or_else(|| panic!("{} was not demoted within 20 s", old.addr()));
    // REPLICAOF and CLIENT KILL are two commands: the client may still
    // get an answer in between, but it must be cut off right after.
    let mut last = Ok(Reply::Nil);
    let cut_by = Instant::now() + Duration::from_secs(3);
    while Instant::now() < cut_by {
        last = client.cmd(&["SET", "written-to-the-old-master", "x"]);
        if last.is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (took, last)
}

// ---------------------------------------------------------------------------
// 1. kill -9 of the master

#[test]
fn kill9_master_promotes_the_priority_replica_once_repoints_and_demotes_the_old_master() {
    let s = setup(2, "");
    let mut topo = s.topo;
    let cluster = s.cluster;
    // The replica that would win without priorities (lower address, equal
    // offsets) is not the one given priority 10.
    let (a, b) = (&topo.replicas[0], &topo.replicas[1]);
    let (tiebreak_winner, favoured) = if addr_of(a) < addr_of(b) {
        (0, 1)
    } else {
        (1, 0)
    };
    let favoured_addr = topo.replicas[favoured].addr();
    assert!(
        topo.replicas[favoured]
            .cmd(&["CONFIG", "SET", "replica-priority", "10"])
            .unwrap()
            .is_ok()
    );
    wait_priority_seen(&cluster, favoured_addr, 10);
    topo.master.set_keys("k", 100);
    let old = topo.master.addr();

    topo.master.kill9();
    let killed = Instant::now();
    let (new_master, epoch) = wait_agreed_new_master(&cluster, &[0, 1, 2], old, FAILOVER_BOUND);
    println!(
        "failover agreed by all three daemons {:?} after the kill",
        killed.elapsed()
    );
    assert_eq!(
        new_master,
        favoured_addr,
        "the priority-10 replica must win over {}\n{}",
        topo.replicas[tiebreak_winner].addr(),
        cluster.logs()
    );
    assert!(epoch > 0);
    assert_eq!(role(&topo.replicas[favoured]).as_deref(), Some("master"));
    // Every daemon answers the new master on the Sentinel API.
    for n in &cluster.nodes {
        assert_eq!(n.master_addr(GROUP), Some(new_master), "{}", n.id);
    }
    // The other replica follows the new master.
    let other = &topo.replicas[tiebreak_winner];
    wait_for(
        "the other replica re-pointed",
        Duration::from_secs(15),
        || replica_linked_to(other, new_master),
    );
    // Exactly one promotion, by exactly one leader.
    finished_leader(&cluster);
    let promoted = promotions(&cluster);
    assert_eq!(promoted.len(), 1, "{promoted:?}\n{}", cluster.logs());
    assert!(
        promoted[0].message.contains(&favoured_addr.to_string()),
        "{promoted:?}"
    );
    for n in &cluster.nodes {
        let g = n.group(GROUP);
        assert_eq!(g["last_failover"]["epoch"].as_u64(), Some(epoch), "{g}");
        assert_eq!(sock(&g["last_failover"]["to"]), Some(new_master), "{g}");
    }

    // The old master comes back empty and is demoted at once; a client
    // that connected right away cannot write to it.
    let (took, next) = restart_and_time_demotion(&mut topo.master, new_master);
    println!(
        "old master demoted {took:?} after it answered again; its early client then got {next:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "demotion took {took:?}\n{}",
        cluster.logs()
    );
    // The client was connected before picket's CLIENT KILL: it is cut off.
    assert!(
        next.is_err(),
        "a client of the old master that connected before the demotion must be disconnected, got {next:?}"
    );
    wait_for(
        "the old master synced from the new one",
        Duration::from_secs(15),
        || replica_linked_to(&topo.master, new_master),
    );
    // Nothing was flushed: the data is still there, also on the old master.
    assert_eq!(
        topo.replicas[favoured].cmd(&["DBSIZE"]).unwrap().as_int(),
        Some(100)
    );
    wait_for(
        "the old master has the data again",
        Duration::from_secs(10),
        || topo.master.dbsize() == Some(100),
    );
    // No second failover happened meanwhile.
    for n in &cluster.nodes {
        assert_eq!(
            n.group(GROUP)["config_epoch"].as_u64(),
            Some(epoch),
            "{}",
            n.id
        );
    }
    assert_eq!(promotions(&cluster).len(), 1);
    assert!(
        cluster
            .nodes
            .iter()
            .map(|n| n.count_event("+convert-to-slave"))
            .sum::<usize>()
            >= 1
    );
}

#[test]
fn kill9_master_with_equal_priorities_promotes_the_replica_with_the_higher_offset() {
    let s = setup(2, "");
    let mut topo = s.topo;
    let cluster = s.cluster;
    // The replica left behind is the one that would win the address
    // tie-break, so only the offset can make the other one win.
    let (lagging, ahead) = if addr_of(&topo.replicas[0]) < addr_of(&topo.replicas[1]) {
        (0, 1)
    } else {
        (1, 0)
    };
    let lag_addr = topo.replicas[lagging].addr();
    let ahead_addr = topo.replicas[ahead].addr();
    assert!(topo.master.cmd(&["SET", "before", "1"]).unwrap().is_ok());
    topo.wait_replicas_up(READY_TIMEOUT);

    // Freeze one replica while 16 MiB are written: far more than the
    // socket buffers between it and the master can hold, so it cannot
    // catch up from them after the master is gone.
    topo.replicas[lagging].sigstop();
    let stopped = Instant::now();
    let value = "x".repeat(64 * 1024);
    let mut conn = RespConn::connect(topo.master.addr(), CMD_TIMEOUT).unwrap();
    for i in 0..256 {
        assert!(
            conn.cmd(&["SET", &format!("big{i}"), &value])
                .unwrap()
                .is_ok()
        );
    }
    let master_offset = topo
        .master
        .info_field("replication", "master_repl_offset")
        .and_then(|o| o.parse::<i64>().ok())
        .unwrap();
    wait_for(
        "the other replica to catch up",
        Duration::from_secs(5),
        || {
            topo.replicas[ahead]
                .info_field("replication", "slave_repl_offset")
                .and_then(|o| o.parse::<i64>().ok())
                .is_some_and(|o| o >= master_offset)
        },
    );
    topo.master.kill9();
    topo.replicas[lagging].sigcont();
    println!("replica {lag_addr} was frozen for {:?}", stopped.elapsed());

    // Both offsets as the servers report them, once the lagging one has
    // read what its socket still held.
    let offset_of = |r: &RedisServer| {
        r.info_field("replication", "slave_repl_offset")
            .and_then(|o| o.parse::<i64>().ok())
    };
    wait_for(
        "the lagging replica to see its master gone",
        Duration::from_secs(5),
        || {
            topo.replicas[lagging]
                .info_field("replication", "master_link_status")
                .as_deref()
                == Some("down")
        },
    );
    let lag_offset = offset_of(&topo.replicas[lagging]).unwrap();
    assert!(
        lag_offset < master_offset,
        "the frozen replica caught up anyway ({lag_offset} vs {master_offset}): the test proves nothing"
    );

    let (new_master, _) =
        wait_agreed_new_master(&cluster, &[0, 1, 2], topo.master.addr(), FAILOVER_BOUND);
    assert_eq!(
        new_master,
        ahead_addr,
        "offsets {master_offset} ({ahead_addr}) vs {lag_offset} ({lag_addr})\n{}",
        cluster.logs()
    );
    // The premise: the lagging replica was a valid candidate (never SDOWN),
    // so it lost on its offset alone.
    for n in &cluster.nodes {
        let sdown = n
            .events()
            .into_iter()
            .filter(|e| e.event == "+sdown" && e.message.contains(&format!("slave {lag_addr} ")))
            .count();
        assert_eq!(
            sdown, 0,
            "{} saw {lag_addr} down: the machine was too slow",
            n.id
        );
    }
    wait_for(
        "the lagging replica re-pointed",
        Duration::from_secs(15),
        || replica_linked_to(&topo.replicas[lagging], new_master),
    );
}

// ---------------------------------------------------------------------------
// 2. flush_on_failover and traffic gating

const MEMORY: &str = "[[group.discovery]]\ntype = \"memory\"\n";

/// The memory backend's history of one daemon: `(op, epoch, address)`.
fn recorded(n: &PicketNode) -> Vec<(String, u64, SocketAddr)> {
    n.group(GROUP)["recorded"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| {
                    let op = r["op"].as_str()?.to_owned();
                    let addr = if op == "fence" {
                        sock(&r["old_master"])?
                    } else {
                        sock(&r["master"])?
                    };
                    Some((op, r["epoch"].as_u64()?, addr))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Invariant 5 on one daemon's history: in every epoch, a publish never
/// comes before the fence of that epoch.
#[track_caller]
fn assert_fence_never_after_publish(n: &PicketNode) {
    let h = recorded(n);
    for (i, (op, epoch, _)) in h.iter().enumerate() {
        if op == "fence" {
            assert!(
                !h[..i].iter().any(|(o, e, _)| o == "publish" && e == epoch),
                "{}: a publish of epoch {epoch} came before its fence: {h:?}",
                n.id
            );
        }
    }
}

#[test]
fn flush_on_failover_advertises_an_empty_master_only_after_fencing_the_old_one() {
    let s = setup(2, &format!("flush_on_failover = true\n{MEMORY}"));
    let mut topo = s.topo;
    let cluster = s.cluster;
    topo.fill(100, Duration::from_secs(10));
    let old = topo.master.addr();
    topo.master.kill9();
    let (new_master, epoch) = wait_agreed_new_master(&cluster, &[0, 1, 2], old, FAILOVER_BOUND);
    let promoted = topo
        .replicas
        .iter()
        .position(|r| r.addr() == new_master)
        .expect("a replica was promoted");
    assert_eq!(
        topo.replicas[promoted].cmd(&["DBSIZE"]).unwrap().as_int(),
        Some(0),
        "the new master must be empty"
    );
    for r in &topo.replicas {
        wait_for("every replica empty", Duration::from_secs(15), || {
            r.dbsize() == Some(0)
        });
    }
    let leader = &cluster.nodes[finished_leader(&cluster)];
    let h = recorded(leader);
    let fence = h
        .iter()
        .position(|r| *r == ("fence".to_string(), epoch, old))
        .unwrap_or_else(|| panic!("no fence of {old} in epoch {epoch}: {h:?}"));
    let publish = h
        .iter()
        .position(|r| *r == ("publish".to_string(), epoch, new_master))
        .unwrap_or_else(|| panic!("no publish of {new_master} in epoch {epoch}: {h:?}"));
    assert!(fence < publish, "{h:?}");
    for n in &cluster.nodes {
        assert_fence_never_after_publish(n);
        // Every daemon ends advertising the new master in its backend.
        wait_for(
            &format!("{} to publish the new master", n.id),
            Duration::from_secs(10),
            || {
                recorded(n)
                    .last()
                    .is_some_and(|r| *r == ("publish".to_string(), epoch, new_master))
            },
        );
    }

    // The returning old master ends empty too.
    topo.master.restart();
    wait_for("the old master synced", Duration::from_secs(15), || {
        replica_linked_to(&topo.master, new_master)
    });
    // The demotion ends with `CLIENT KILL TYPE normal`, which may reset a
    // connection of ours opened beside it: read until an answer comes.
    // The 100 keys it held before the kill would stay if it had not synced.
    wait_for("the old master empty", Duration::from_secs(10), || {
        topo.master.dbsize() == Some(0)
    });
}

#[test]
fn a_failed_flush_publishes_nothing_and_aborts_the_failover() {
    // FLUSHALL is disabled on every server: the promotion's MULTI/EXEC is
    // discarded, so the replica is not even promoted.
    let topo = Topology::master_with_replicas_opts(
        2,
        RedisOpts::default().args(&["--rename-command", "FLUSHALL", ""]),
    );
    let s = setup_with(topo, 2, &format!("flush_on_failover = true\n{MEMORY}"));
    let mut topo = s.topo;
    let cluster = s.cluster;
    topo.fill(10, Duration::from_secs(10));
    let old = topo.master.addr();
    topo.master.kill9();

    // Until a leader gives up, nothing but the old master is ever
    // advertised and no replica serves as a master.
    let deadline = Instant::now() + FAILOVER_BOUND;
    let aborted = loop {
        assert!(
            Instant::now() < deadline,
            "no failover aborted\n{}",
            cluster.logs()
        );
        for n in &cluster.nodes {
            if let Some(m) = n.master_addr(GROUP) {
                assert_eq!(m, old, "{} advertised {m}\n{}", n.id, cluster.logs());
            }
        }
        for r in &topo.replicas {
            assert_ne!(
                role(r).as_deref(),
                Some("master"),
                "{} was promoted",
                r.addr()
            );
        }
        if let Some(i) = (0..3).find(|&i| {
            cluster.nodes[i].group(GROUP)["last_failover"]["outcome"]
                .as_str()
                .is_some_and(|o| o.starts_with("aborted"))
        }) {
            break i;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let g = cluster.nodes[aborted].group(GROUP);
    let outcome = g["last_failover"]["outcome"].as_str().unwrap_or_default();
    assert!(
        outcome.contains("flush failed") && outcome.contains("unknown command"),
        "{outcome}"
    );
    let epoch = g["last_failover"]["epoch"].as_u64().unwrap();
    let h = recorded(&cluster.nodes[aborted]);
    assert!(
        h.contains(&("fence".to_string(), epoch, old)),
        "the old master was fenced first: {h:?}"
    );
    // The abort routes the backend to the master the group keeps again, at
    // the fence's epoch: left fenced, clients would have no master even
    // once the old one is back.
    wait_for(
        "the kept master published again at the fence's epoch",
        Duration::from_secs(10),
        || {
            let h = recorded(&cluster.nodes[aborted]);
            let fenced = h
                .iter()
                .position(|r| *r == ("fence".to_string(), epoch, old));
            let again = h
                .iter()
                .rposition(|r| *r == ("publish".to_string(), epoch, old));
            matches!((fenced, again), (Some(f), Some(p)) if p > f)
        },
    );
    // Every epoch a config names is 0 or one of an aborted attempt's
    // fences (a later attempt may abort too; its fence is recorded before
    // the config is read), and always the old master.
    let configs: Vec<_> = cluster.nodes.iter().map(|n| n.group(GROUP)).collect();
    let fenced: Vec<u64> = cluster
        .nodes
        .iter()
        .flat_map(recorded)
        .filter(|(op, _, _)| op == "fence")
        .map(|(_, e, _)| e)
        .collect();
    for (n, g) in cluster.nodes.iter().zip(&configs) {
        let h = recorded(n);
        assert!(
            h.iter().all(|(op, _, a)| op != "publish" || *a == old),
            "{} published a replica: {h:?}",
            n.id
        );
        assert_eq!(sock(&g["master"]), Some(old), "{g}");
        let e = g["config_epoch"].as_u64().unwrap_or(u64::MAX);
        assert!(e == 0 || fenced.contains(&e), "{e} not in {fenced:?}: {g}");
    }
    for r in &topo.replicas {
        assert_eq!(role(r).as_deref(), Some("slave"));
        assert_eq!(
            r.cmd(&["DBSIZE"]).unwrap().as_int(),
            Some(10),
            "data untouched"
        );
    }
}

// ---------------------------------------------------------------------------
// 3. no quorum

#[test]
fn without_a_reachable_quorum_nothing_fails_over_and_the_status_says_why() {
    let s = setup(2, "");
    let mut topo = s.topo;
    let mut cluster = s.cluster;
    cluster.nodes[1].process.kill9();
    cluster.nodes[2].process.kill9();
    let old = topo.master.addr();
    topo.master.kill9();
    let n = &cluster.nodes[0];
    wait_for(
        "the reason to name the quorum",
        Duration::from_secs(15),
        || {
            n.group(GROUP)["reason"]
                .as_str()
                .is_some_and(|r| r.contains("quorum 2") && r.contains("1 of 3 daemons reachable"))
        },
    );
    // Several down_after periods later, still nothing.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let g = n.group(GROUP);
        assert_eq!(g["master_sdown"], true, "{g}");
        assert_eq!(g["master_odown"], false, "{g}");
        assert_ne!(g["status"], "failover", "{g}");
        assert_eq!(sock(&g["master"]), Some(old), "{g}");
        assert!(
            g["reason"].as_str().is_some_and(|r| r.contains("quorum")),
            "{g}"
        );
        for r in &topo.replicas {
            assert_eq!(role(r).as_deref(), Some("slave"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let m = n.metrics().unwrap();
    assert_eq!(
        metric_value(&m, "picket_group_quorum_reachable", &[("group", GROUP)]),
        Some(0.0),
        "{m}"
    );
    assert_eq!(n.count_event("+odown"), 0);
    assert_eq!(n.count_event("+try-failover"), 0);
    assert_eq!(n.master_addr(GROUP), Some(old));
}

// ---------------------------------------------------------------------------
// 4. votes survive a restart

fn is_down(
    n: &PicketNode,
    master: SocketAddr,
    cfg_epoch: u64,
    epoch: u64,
    candidate: &str,
) -> Reply {
    n.cmd(&[
        "PICKET",
        "IS-DOWN",
        GROUP,
        &master.to_string(),
        &cfg_epoch.to_string(),
        &epoch.to_string(),
        candidate,
    ])
    .unwrap_or_else(|e| panic!("IS-DOWN on {}: {e}", n.id))
}

fn restart_node(n: &mut PicketNode) {
    n.process.restart();
    wait_for(&format!("{} ready again", n.id), READY_TIMEOUT, || {
        n.is_ready()
    });
}

#[test]
fn a_vote_survives_kill9_and_restart() {
    let s = setup(2, "");
    let mut topo = s.topo;
    let mut cluster = s.cluster;
    let old = topo.master.addr();
    topo.master.kill9();
    let (new_master, epoch) = wait_agreed_new_master(&cluster, &[0, 1, 2], old, FAILOVER_BOUND);
    let leader = finished_leader(&cluster);
    let leader_id = cluster.nodes[leader].id.clone();
    // A daemon that voted for the leader in that epoch.
    let voter = (0..3)
        .find(|&i| {
            let g = cluster.nodes[i].group(GROUP);
            i != leader
                && g["voted_epoch"].as_u64() == Some(epoch)
                && g["voted_leader"] == leader_id.as_str()
        })
        .unwrap_or_else(|| {
            panic!(
                "nobody voted for {leader_id} in {epoch}\n{}",
                cluster.logs()
            )
        });
    let n = &mut cluster.nodes[voter];
    n.process.kill9();
    restart_node(n);
    // Another candidate asking for the same epoch gets the earlier vote.
    let r = is_down(n, new_master, epoch, epoch, "intruder");
    assert_eq!(r, vote_reply(&leader_id, epoch), "{}", n.logs());
    // A vote given through the raw command is just as durable.
    let later = epoch + 10;
    let r = is_down(n, new_master, epoch, later, "intruder");
    assert_eq!(r, vote_reply("intruder", later), "{}", n.logs());
    n.process.kill9();
    restart_node(n);
    let r = is_down(n, new_master, epoch, later, "someone-else");
    assert_eq!(r, vote_reply("intruder", later), "{}", n.logs());
    // And no vote for an epoch it has moved past.
    let r = is_down(n, new_master, epoch, epoch, "someone-else");
    assert_eq!(r, vote_reply("intruder", later), "{}", n.logs());
}

/// A daemon's answer to `SENTINEL is-master-down-by-addr` (master up as it
/// sees it): the leader it voted for and the epoch of that vote.
fn vote_reply(leader: &str, epoch: u64) -> Reply {
    Reply::Array(vec![
        Reply::Int(0),
        Reply::Bulk(leader.as_bytes().to_vec()),
        Reply::Int(epoch as i64),
    ])
}

// ---------------------------------------------------------------------------
// 6. planned switchover under writes (Redis)

/// `picket-writer` writing through the daemons' Sentinel API; killed by
/// PID when dropped.
struct Writer {
    child: Option<std::process::Child>,
    dir: tempfile::TempDir,
}

impl Writer {
    fn start(sentinels: &[SocketAddr], prefix: &str) -> Writer {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = std::process::Command::new(workspace_bin("picket-writer"));
        for s in sentinels {
            cmd.arg("--sentinel").arg(s.to_string());
        }
        let child = cmd
            .args(["--group", GROUP, "--interval", "5ms", "--timeout", "1s"])
            .args(["--prefix", prefix])
            .arg("--acked-file")
            .arg(dir.path().join("acked"))
            .arg("--json")
            .arg(dir.path().join("summary.json"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        Writer {
            child: Some(child),
            dir,
        }
    }

    /// SIGINT, wait (bounded) and return the acknowledged sequence numbers
    /// and the summary.
    fn finish(&mut self) -> (Vec<u64>, Value) {
        let mut child = self.child.take().unwrap();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("picket-writer did not stop on SIGINT");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let acked = std::fs::read_to_string(self.dir.path().join("acked"))
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        let summary = serde_json::from_str(
            &std::fs::read_to_string(self.dir.path().join("summary.json")).unwrap(),
        )
        .unwrap();
        (acked, summary)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn dbsize(s: &RedisServer) -> i64 {
    s.dbsize().unwrap_or(-1)
}

#[test]
fn planned_switchover_under_writes_loses_no_acknowledged_write_and_flushes_nothing() {
    // flush_on_failover must not apply to a planned switchover.
    let s = setup(2, &format!("flush_on_failover = true\n{MEMORY}"));
    let topo = s.topo;
    let cluster = s.cluster;
    topo.master.set_keys("pre", 50);
    let old = topo.master.addr();
    let mut writer = Writer::start(&[cluster.nodes[0].resp, cluster.nodes[1].resp], "w");
    wait_for("the writer to write", Duration::from_secs(10), || {
        dbsize(&topo.master) >= 50 + 50
    });

    let out = picket_failover(&cluster);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        cluster.logs()
    );
    assert!(stdout.contains("switchover of cache started"), "{stdout}");
    let (new_master, epoch) = wait_agreed_new_master(&cluster, &[0, 1, 2], old, FAILOVER_BOUND);
    let promoted = topo
        .replicas
        .iter()
        .find(|r| r.addr() == new_master)
        .expect("a replica took over");
    // Writes go on against the new master.
    let before = dbsize(promoted);
    wait_for("writes on the new master", Duration::from_secs(15), || {
        dbsize(promoted) >= before + 50
    });
    let (acked, summary) = writer.finish();
    assert!(acked.len() > 100, "{summary}");
    let mut conn = RespConn::connect(new_master, CMD_TIMEOUT).unwrap();
    let lost: Vec<u64> = acked
        .iter()
        .copied()
        .filter(|seq| {
            conn.cmd(&["GET", &format!("w:{seq}")]).unwrap().as_str()
                != Some(seq.to_string().as_str())
        })
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost, e.g. {:?}; writer: {summary}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    // Nothing was flushed: the keys from before the switchover are there.
    for i in 0..50 {
        assert_eq!(
            conn.cmd(&["GET", &format!("pre{i}")]).unwrap().as_str(),
            Some("v")
        );
    }
    assert!(dbsize(promoted) >= 50 + acked.len() as i64);
    let masters = summary["masters"].as_array().unwrap();
    assert!(
        masters.iter().any(|m| sock(m) == Some(new_master)),
        "{summary}"
    );
    // The old master follows the new one (FAILOVER made it a replica), so
    // does the other replica; the leader fenced before publishing.
    wait_for("the old master follows", Duration::from_secs(15), || {
        replica_linked_to(&topo.master, new_master)
    });
    let other = topo
        .replicas
        .iter()
        .find(|r| r.addr() != new_master)
        .unwrap();
    wait_for("the other replica follows", Duration::from_secs(15), || {
        replica_linked_to(other, new_master)
    });
    let leader = &cluster.nodes[finished_leader(&cluster)];
    let h = recorded(leader);
    let fence = h
        .iter()
        .position(|r| *r == ("fence".to_string(), epoch, old));
    let publish = h
        .iter()
        .position(|r| *r == ("publish".to_string(), epoch, new_master));
    assert!(
        matches!((fence, publish), (Some(f), Some(p)) if f < p),
        "{h:?}"
    );
    for n in &cluster.nodes {
        assert_fence_never_after_publish(n);
    }
    assert_eq!(promotions(&cluster).len(), 1);
}

/// `picket failover GROUP` against the first daemon.
fn picket_failover(cluster: &PicketCluster) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_picket"))
        .args([
            "failover",
            GROUP,
            "--addr",
            &cluster.nodes[0].resp.to_string(),
        ])
        .output()
        .unwrap()
}

/// Wait until node 0 reads the replicas of `master` slowly (INFO older than
/// 3 s) while it still reads the master every second.
#[track_caller]
fn wait_replicas_read_slowly(cluster: &PicketCluster, master: SocketAddr) {
    let mut last = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(40);
    while Instant::now() < deadline {
        let g = cluster.nodes[0].group(GROUP);
        let instances = g["instances"].as_array().cloned().unwrap_or_default();
        let age = |i: &Value| i["info_age_ms"].as_u64();
        let master_fresh = instances
            .iter()
            .any(|i| sock(&i["addr"]) == Some(master) && age(i).is_some_and(|a| a < 2500));
        let replicas: Vec<&Value> = instances
            .iter()
            .filter(|i| sock(&i["addr"]) != Some(master))
            .collect();
        if master_fresh
            && !replicas.is_empty()
            && replicas.iter().all(|i| age(i).is_some_and(|a| a > 3000))
        {
            return;
        }
        last = g;
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("the replicas of {master} were not read slowly: {last:#}");
}

#[test]
fn healthy_replicas_are_read_slowly_and_failovers_still_select_on_fresh_info() {
    let s = setup(2, MEMORY);
    let mut topo = s.topo;
    let cluster = s.cluster;
    let old = topo.master.addr();
    // Settled replicas: INFO every 10 s, the master every second.
    wait_replicas_read_slowly(&cluster, old);

    // A switchover now: selection refuses INFO older than a few PING
    // periods, so the replicas are read first.
    let out = picket_failover(&cluster);
    assert!(
        out.status.success(),
        "{}{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        cluster.logs()
    );
    let (second, _) = wait_agreed_new_master(&cluster, &[0, 1, 2], old, FAILOVER_BOUND);

    // Settled again, then the new master dies: the replicas are read as
    // soon as it falls silent, and the failover selects one at once.
    wait_replicas_read_slowly(&cluster, second);
    let dying = topo
        .replicas
        .iter_mut()
        .find(|r| r.addr() == second)
        .expect("a replica took over");
    dying.kill9();
    let (third, _) = wait_agreed_new_master(&cluster, &[0, 1, 2], second, FAILOVER_BOUND);
    assert_ne!(third, second);
    for n in &cluster.nodes {
        assert_eq!(
            n.count_event("-failover-abort-no-good-slave"),
            0,
            "{}",
            n.logs()
        );
    }
}

// ---------------------------------------------------------------------------
// 7. planned switchover on Dragonfly (stub)

#[test]
fn dragonfly_switchover_uses_repltakeover_without_flushing_and_publishes_the_new_master() {
    let world = dragonfly_stub::StubWorld::new();
    let master = world.start_master(&next_loopback_ip());
    let replica = world.start_replica(&next_loopback_ip(), master.addr());
    for i in 0..20 {
        assert!(
            redis_cmd(master.addr(), &["SET", &format!("k{i}"), "v"])
                .unwrap()
                .is_ok()
        );
    }
    assert_eq!(replica.dbsize(), 20);
    let groups = group_toml(
        GROUP,
        master.addr(),
        2,
        &format!("flush_on_failover = true\n{MEMORY}"),
    );
    let cluster = ClusterPlan::new(3).start(&groups);
    cluster.wait_converged(&[0, 1, 2], GROUP, 2, Duration::from_secs(20));
    for n in &cluster.nodes {
        let g = n.group(GROUP);
        assert!(
            g["instances"]
                .as_array()
                .unwrap()
                .iter()
                .all(|i| i["flavour"] == "dragonfly"),
            "{g}"
        );
    }

    let r = cluster.nodes[1]
        .cmd(&["PICKET", "FAILOVER", GROUP])
        .unwrap();
    assert!(r.is_ok(), "{r:?}\n{}", cluster.logs());
    let (new_master, epoch) =
        wait_agreed_new_master(&cluster, &[0, 1, 2], master.addr(), FAILOVER_BOUND);
    assert_eq!(new_master, replica.addr());
    assert_eq!(replica.master(), None, "the replica serves as master");
    assert!(
        replica.received(&["REPLTAKEOVER"]),
        "{:?}",
        replica.commands()
    );
    for stub in [&master, &replica] {
        assert!(!stub.received(&["FAILOVER"]), "{:?}", stub.commands());
        assert!(!stub.received(&["FLUSHALL"]), "{:?}", stub.commands());
    }
    assert_eq!(replica.dbsize(), 20, "no flush on a switchover");
    // The old master exited by itself, as Dragonfly does.
    assert!(!master.is_running());
    for n in &cluster.nodes {
        assert_eq!(n.master_addr(GROUP), Some(new_master), "{}", n.id);
    }
    let leader = &cluster.nodes[finished_leader(&cluster)];
    let h = recorded(leader);
    let fence = h
        .iter()
        .position(|r| *r == ("fence".to_string(), epoch, master.addr()));
    let publish = h
        .iter()
        .position(|r| *r == ("publish".to_string(), epoch, new_master));
    assert!(
        matches!((fence, publish), (Some(f), Some(p)) if f < p),
        "{h:?}"
    );

    // The old master's absence starts nothing; several down_after later the
    // config is the same.
    wait_for("the old master seen down", Duration::from_secs(10), || {
        cluster.nodes.iter().all(|n| {
            n.group(GROUP)["instances"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|i| sock(&i["addr"]) == Some(master.addr()) && i["sdown"] == true)
            })
        })
    });
    let calm_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < calm_until {
        for n in &cluster.nodes {
            let g = n.group(GROUP);
            assert_eq!(g["config_epoch"].as_u64(), Some(epoch), "{g}");
            assert_eq!(g["failover"], Value::Null, "{g}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    // A supervisor restarts it (empty, as a master): it is demoted with
    // Dragonfly's commands.
    master.restart_empty_master();
    wait_for(
        "the restarted old master demoted",
        Duration::from_secs(10),
        || master.master() == Some(new_master),
    );
    let laddr = master.addr().to_string();
    wait_for(
        "its clients killed by LADDR",
        Duration::from_secs(5),
        || master.received(&["CLIENT", "KILL", "LADDR", &laddr]),
    );
    assert!(!master.received(&["CLIENT", "KILL", "TYPE"]));
    assert_eq!(master.dbsize(), 20, "it synced from the new master");
}

// ---------------------------------------------------------------------------
// 8. the leader dies right after promoting: the decisions are the
// simulation's test of the same name; this one checks them through
// `SENTINEL SIMULATE-FAILURE` on real processes, the daemon's exit 99.

#[test]
fn a_leader_killed_after_its_promotion_is_succeeded_without_a_second_promotion() {
    let s = setup_planned(
        ClusterPlan::new(3).with_fault_injection(),
        Topology::master_with_replicas(2),
        2,
        "",
    );
    let mut topo = s.topo;
    let mut cluster = s.cluster;
    for n in &cluster.nodes {
        n.simulate_failure("crash-after-promotion");
    }
    let old = topo.master.addr();
    topo.master.kill9();
    // Whoever leads promotes a replica, then exits 99.
    let deadline = Instant::now() + FAILOVER_BOUND;
    let (crashed, status) = 'wait: loop {
        for (i, n) in cluster.nodes.iter_mut().enumerate() {
            if let Some(status) = n.process.try_exit_status() {
                break 'wait (i, status);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader crashed\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(99), "{}", cluster.nodes[crashed].logs());
    let leader_log = cluster.nodes[crashed].process.stderr();
    assert!(
        leader_log.contains("simulated failure: exiting after the promotion"),
        "{leader_log}"
    );
    let survivors: Vec<usize> = (0..3).filter(|&i| i != crashed).collect();
    for &i in &survivors {
        cluster.nodes[i].simulate_failure("none");
    }
    let promoted: Vec<SocketAddr> = topo
        .replicas
        .iter()
        .filter(|r| role(r).as_deref() == Some("master"))
        .map(RedisServer::addr)
        .collect();
    assert_eq!(
        promoted.len(),
        1,
        "exactly one replica was promoted: {promoted:?}"
    );
    let first = promoted[0];
    let other = topo.replicas.iter().find(|r| r.addr() != first).unwrap();

    // The survivors finish the failover with the same replica; the other
    // one never serves as a master meanwhile.
    let (new_master, epoch) = cluster.wait_agreed_new_master_checking(
        GROUP,
        &survivors,
        old,
        FAILOVER_BOUND + Duration::from_secs(10),
        || {
            assert_ne!(
                role(other).as_deref(),
                Some("master"),
                "a second replica was promoted\n{}",
                cluster.logs()
            )
        },
    );
    assert_eq!(new_master, first, "{}", cluster.logs());
    assert!(epoch > 0);
    wait_for(
        "the other replica follows it",
        Duration::from_secs(15),
        || replica_linked_to(other, first),
    );
    for e in promotions(&cluster) {
        assert!(e.message.contains(&first.to_string()), "{e:?}");
    }
    wait_for("a survivor to complete", Duration::from_secs(15), || {
        leaders(&cluster, &survivors).len() == 1
    });
}

// ---------------------------------------------------------------------------
// Measurement (not a pass/fail test): cargo test --test it failover:: -- --ignored --nocapture

/// Write through the Sentinel API: resolve the master on `node`, SET on it.
fn write_through(node: &PicketNode, key: &str) -> bool {
    let Some(m) = node.master_addr(GROUP) else {
        return false;
    };
    RespConn::connect(m, Duration::from_millis(200))
        .and_then(|mut c| c.cmd(&["SET", key, "1"]))
        .is_ok_and(|r| r.is_ok())
}

fn median_max(v: &[Duration]) -> (Duration, Duration) {
    let mut s = v.to_vec();
    s.sort();
    (s[s.len() / 2], s[s.len() - 1])
}

#[test]
#[ignore = "measurement: run with --ignored --nocapture"]
fn measure_failover_and_demotion_times() {
    let s = setup(2, "");
    let cluster = s.cluster;
    let topo = s.topo;
    let mut servers: Vec<RedisServer> = std::iter::once(topo.master).chain(topo.replicas).collect();
    let mut to_writes = Vec::new();
    let mut demotions = Vec::new();
    for round in 0..5 {
        let master = cluster.nodes[0].master_addr(GROUP).unwrap();
        let idx = servers.iter().position(|s| s.addr() == master).unwrap();
        assert!(write_through(&cluster.nodes[0], "before"));
        servers[idx].kill9();
        let killed = Instant::now();
        let deadline = killed + FAILOVER_BOUND;
        loop {
            if cluster.nodes[0].master_addr(GROUP) != Some(master)
                && write_through(&cluster.nodes[0], &format!("after{round}"))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "round {round}: no writable new master"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let to_write = killed.elapsed();
        let (new_master, _) = wait_agreed_new_master(&cluster, &[0, 1, 2], master, FAILOVER_BOUND);
        let (demotion, _) = restart_and_time_demotion(&mut servers[idx], new_master);
        println!(
            "round {round}: kill -9 of {master} -> writes accepted by {new_master} after {to_write:?}; \
             old master demoted {demotion:?} after it answered again"
        );
        to_writes.push(to_write);
        demotions.push(demotion);
        for s in servers.iter().filter(|s| s.addr() != new_master) {
            wait_for("replicas linked", Duration::from_secs(15), || {
                replica_linked_to(s, new_master)
            });
        }
        cluster.wait_converged(&[0, 1, 2], GROUP, 3, Duration::from_secs(20));
    }
    let (m1, x1) = median_max(&to_writes);
    let (m2, x2) = median_max(&demotions);
    println!("kill -9 to writable new master (down_after 1s): median {m1:?}, max {x1:?}");
    println!("old master answering to demoted: median {m2:?}, max {x2:?}");
}

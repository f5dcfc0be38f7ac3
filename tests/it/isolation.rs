//! Isolation fencing (`[group.isolation_fencing]`, issue 18) against real
//! redis-server processes and three picket daemons:
//!
//! - a fenced group stays writable when both replicas die and the master is
//!   healthy (the fence is lowered), and is fenced again when they return;
//! - a master isolated from the daemons and its replicas, with a client of
//!   its own, stops acknowledging writes within the lag; after the heal the
//!   new master carries the fence and the demoted one does not;
//! - a master whose replicas are cut off from it but still seen by the
//!   daemons keeps its fence (it refuses writes rather than being lowered).
//!
//! - on Dragonfly, which has no such setting, picket sends nothing and says
//!   so in `/v1/status`.
//!
//! The partitions are iptables rules of the test's own
//! (`picket-harness` `partition`): they need root, which CI has; elsewhere
//! those two tests say so and pass without checking.

use picket_harness::dragonfly_stub;

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use picket_harness::partition::Partition;
use picket_harness::*;

const GROUP: &str = "cache";
/// `max_lag` of the tests' fence, in seconds.
const LAG: u64 = 1;
/// A cut-off Redis master stops acknowledging within `max_lag` plus the
/// whole-second rounding of its lag and its once-a-second refresh of the
/// count of good replicas; measured 1.1–1.9 s with a lag of 1 s.
const FENCE_BOUND: Duration = Duration::from_millis(LAG * 1000 + 2500);

fn fenced_group(master: SocketAddr) -> String {
    group_toml(
        GROUP,
        master,
        2,
        &format!("\n[group.isolation_fencing]\nmin_replicas = 1\nmax_lag = \"{LAG}s\"\n"),
    )
}

fn set_ok(server: SocketAddr, key: &str) -> Result<(), String> {
    match redis_cmd(server, &["SET", key, "1"]) {
        Ok(r) if r.is_ok() => Ok(()),
        Ok(r) => Err(format!("{r:?}")),
        Err(e) => Err(e),
    }
}

/// Every daemon reports the fence `in_force` on `master`.
fn wait_fence(cluster: &PicketCluster, master: SocketAddr, want: u64, timeout: Duration) {
    wait_for(
        &format!("every daemon to keep min-replicas-to-write {want} on {master}"),
        timeout,
        || {
            cluster.nodes.iter().all(|n| {
                let f = &n.group(GROUP)["isolation_fence"];
                f["target"].as_u64() == Some(want)
                    && f["in_force"].as_u64() == Some(want)
                    && f["confirmed_on"].as_str() == Some(master.to_string().as_str())
            }) && min_replicas_to_write(master) == Some(want as i64)
        },
    );
}

/// A server whose outgoing connections (replication) leave from its own
/// address, so that a partition can single them out; a replica notices a
/// silent link within 2 s (`repl-timeout`) instead of 60.
fn redis_with_own_source(replica_of: Option<SocketAddr>) -> RedisServer {
    let ip = next_loopback_ip();
    let mut opts = RedisOpts::default().args(&["--bind-source-addr", &ip, "--repl-timeout", "2"]);
    if let Some(m) = replica_of {
        opts = opts.replica_of(m);
    }
    RedisServer::start(&ip, free_port(&ip), opts)
}

fn root_or_skip(what: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    eprintln!("{what}: skipped, partitions need root (iptables)");
    false
}

#[test]
fn a_fenced_group_stays_writable_when_both_replicas_die() {
    let mut topo = Topology::master_with_replicas(2);
    let m = topo.master.addr();
    let cluster = ClusterPlan::new(3).start(&fenced_group(m));
    cluster.wait_converged(&[0, 1, 2], GROUP, 3, Duration::from_secs(30));
    wait_fence(&cluster, m, 1, Duration::from_secs(20));
    set_ok(m, "before").unwrap();
    assert_eq!(
        metric_value(
            &cluster.nodes[0].metrics().unwrap(),
            "picket_isolation_fence_lowered",
            &[("group", GROUP)]
        ),
        Some(0.0)
    );

    // Both replicas die; the master is healthy. The master itself soon
    // refuses writes (no replica acknowledges), until the daemons agree that
    // no replica is up and lower the fence.
    let killed = Instant::now();
    for r in topo.replicas.iter_mut() {
        r.kill9();
    }
    let mut first_refusal = None;
    let mut writable_since: Option<Instant> = None;
    let mut seq = 0;
    let deadline = killed + Duration::from_secs(25);
    // Writable means: every write of the last 5 s acknowledged.
    while writable_since.is_none_or(|t| t.elapsed() < Duration::from_secs(5)) {
        assert!(
            Instant::now() < deadline,
            "the master did not stay writable for 5 s within 25 s of both replicas dying \
             (first refusal {first_refusal:?} after the kill)\n{}",
            cluster.logs()
        );
        seq += 1;
        match set_ok(m, &format!("k:{seq}")) {
            Ok(()) => {
                writable_since.get_or_insert_with(Instant::now);
            }
            Err(e) => {
                first_refusal.get_or_insert((killed.elapsed(), e));
                writable_since = None;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let since = writable_since.unwrap();
    eprintln!(
        "writable again {:?} after the kill (first refusal: {first_refusal:?}); {seq} writes",
        since.duration_since(killed)
    );
    assert_eq!(min_replicas_to_write(m), Some(0));
    for n in &cluster.nodes {
        let f = &n.group(GROUP)["isolation_fence"];
        assert_eq!(f["lowered"], true, "{}: {f}", n.id);
        assert_eq!(f["target"], 0, "{}: {f}", n.id);
    }
    assert!(
        cluster
            .nodes
            .iter()
            .any(|n| n.count_event("-isolation-fence") > 0),
        "no -isolation-fence event\n{}",
        cluster.logs()
    );
    assert_eq!(
        metric_value(
            &cluster.nodes[0].metrics().unwrap(),
            "picket_isolation_fence_lowered",
            &[("group", GROUP)]
        ),
        Some(1.0)
    );

    // The replicas come back (empty, with their replicaof): once they have
    // synchronised the fence is raised again, and the master still takes
    // writes (through them).
    for r in topo.replicas.iter_mut() {
        r.restart();
    }
    topo.wait_replicas_up(Duration::from_secs(20));
    wait_fence(&cluster, m, 1, Duration::from_secs(20));
    assert!(
        cluster
            .nodes
            .iter()
            .any(|n| n.count_event("+isolation-fence") > 0)
    );
    wait_for(
        "a write through the restored fence",
        Duration::from_secs(10),
        || set_ok(m, "after").is_ok(),
    );
    // Never touched: a failover would have been a bug here.
    assert!(
        cluster
            .nodes
            .iter()
            .all(|n| n.group(GROUP)["config_epoch"] == 0),
        "{}",
        cluster.logs()
    );
}

#[test]
fn an_isolated_master_stops_acknowledging_writes_within_the_lag() {
    if !root_or_skip("an_isolated_master_stops_acknowledging_writes_within_the_lag") {
        return;
    }
    let topo = Topology::master_with_replicas(2);
    let m = topo.master.addr();
    let plan = ClusterPlan::new(3);
    let daemons = plan.resp.clone();
    let cluster = plan.start(&fenced_group(m));
    cluster.wait_converged(&[0, 1, 2], GROUP, 3, Duration::from_secs(30));
    wait_fence(&cluster, m, 1, Duration::from_secs(20));

    let source: IpAddr = next_loopback_ip().parse().unwrap();
    let client = SideClient::start(m, source, "iso");
    wait_for(
        "the side client's first writes",
        Duration::from_secs(10),
        || client.acked().len() >= 20,
    );

    // The master and the client on one side; the daemons and the replicas
    // on the other.
    let part = Partition::new().unwrap_or_else(|e| panic!("iptables: {e}"));
    part.isolate(m, &[source], &daemons).unwrap();
    let cut = Instant::now();
    std::thread::sleep(Duration::from_secs(8));
    let (new_master, _) =
        cluster.wait_agreed_new_master(GROUP, &[0, 1, 2], m, Duration::from_secs(10));
    let acked_after = client.acked_after(cut);
    let last_ack = acked_after.last().map(|(_, t)| t.duration_since(cut));
    let first_refusal = client.first_refusal_after(cut);
    part.heal().unwrap();
    eprintln!(
        "isolated master: {} writes acknowledged after the cut, the last {last_ack:?} after it; \
         first refusal {first_refusal:?}",
        acked_after.len()
    );
    // The client's path to the master worked across the cut (so the
    // refusals are the fence's, not the network's) ...
    assert!(
        !acked_after.is_empty(),
        "no write acknowledged after the cut: the client was cut off too"
    );
    assert!(
        first_refusal
            .as_ref()
            .is_some_and(|(e, _)| e.contains("NOREPLICAS")),
        "the isolated master never refused a write: {first_refusal:?}"
    );
    // ... and the master stopped acknowledging within the lag.
    assert!(
        last_ack.is_some_and(|t| t <= FENCE_BOUND),
        "the isolated master acknowledged writes until {last_ack:?} after the cut (bound {FENCE_BOUND:?})"
    );

    // After the heal: the old master is demoted and follows the new one,
    // which carries the fence; the demoted one does not.
    wait_for(
        "the old master demoted and linked",
        Duration::from_secs(20),
        || replica_linked_to(&topo.master, new_master),
    );
    wait_fence(&cluster, new_master, 1, Duration::from_secs(20));
    wait_for(
        "the demoted master's fence cleared",
        Duration::from_secs(10),
        || min_replicas_to_write(m) == Some(0),
    );
    drop(client);
    // What the isolated master acknowledged after the cut is gone (it was
    // never replicated): the bound is on how much that can be.
    let lost = acked_after
        .iter()
        .filter(|(seq, _)| {
            redis_cmd(new_master, &["EXISTS", &format!("iso:{seq}")])
                .ok()
                .and_then(|r| r.as_int())
                == Some(0)
        })
        .count();
    eprintln!(
        "acknowledged by the isolated master and lost: {lost} of {}",
        acked_after.len()
    );
    assert!(cluster.nodes.iter().any(|n| n.count_event("-isolation-fence") > 0 || n.count_event("+isolation-fence") > 0));
}

#[test]
fn replicas_cut_off_from_the_master_but_seen_by_the_daemons_keep_the_fence() {
    if !root_or_skip("replicas_cut_off_from_the_master_but_seen_by_the_daemons_keep_the_fence") {
        return;
    }
    let master = redis_with_own_source(None);
    let m = master.addr();
    let replicas: Vec<RedisServer> = (0..2).map(|_| redis_with_own_source(Some(m))).collect();
    let topo = Topology { master, replicas };
    topo.wait_replicas_up(READY_TIMEOUT);
    let cluster = ClusterPlan::new(3).start(&fenced_group(m));
    cluster.wait_converged(&[0, 1, 2], GROUP, 3, Duration::from_secs(30));
    wait_fence(&cluster, m, 1, Duration::from_secs(20));

    // The replicas lose their link to the master; the daemons still see
    // both. Lowering the fence now would let a master that is cut off from
    // every replica take writes that a failover could discard.
    let part = Partition::new().unwrap_or_else(|e| panic!("iptables: {e}"));
    let sources: Vec<IpAddr> = topo
        .replicas
        .iter()
        .map(|r| r.ip().parse().unwrap())
        .collect();
    let lowered = |c: &PicketCluster| -> usize {
        c.nodes
            .iter()
            .map(|n| n.count_event("-isolation-fence"))
            .sum()
    };
    // Lowerings before the cut are not this test's subject; one was seen
    // once in a loaded CI run, while the daemons were starting.
    let lowered_before = lowered(&cluster);
    if lowered_before > 0 {
        eprintln!(
            "{lowered_before} -isolation-fence before the cut:\n{}",
            cluster.logs()
        );
    }
    part.cut(m, &sources).unwrap();
    let cut = Instant::now();
    wait_for(
        "the master to refuse writes",
        FENCE_BOUND + Duration::from_secs(2),
        || set_ok(m, "x").is_err_and(|e| e.contains("NOREPLICAS")),
    );
    eprintln!(
        "the master refused writes {:?} after its replicas were cut off",
        cut.elapsed()
    );
    // The replicas notice: they answer the daemons but report their link
    // down (what a lowering on "no replica linked" would act on).
    wait_for(
        "every daemon to see both replicas up and unlinked",
        Duration::from_secs(15),
        || {
            cluster.nodes.iter().all(|n| {
                let g = n.group(GROUP);
                g["instances"].as_array().is_some_and(|is| {
                    is.iter()
                        .filter(|i| i["is_master"] == false)
                        .all(|i| i["up"] == true && i["master_link_up"] == false)
                })
            })
        },
    );
    // It keeps refusing while the cut lasts, and nobody lowers the fence.
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        assert!(
            set_ok(m, "y").is_err(),
            "the master took a write while cut off from its replicas\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(min_replicas_to_write(m), Some(1));
    for n in &cluster.nodes {
        let f = &n.group(GROUP)["isolation_fence"];
        assert_eq!(f["lowered"], false, "{}: {f}", n.id);
    }
    assert_eq!(
        lowered(&cluster),
        lowered_before,
        "the fence was lowered while the replicas were cut off\n{}",
        cluster.logs()
    );

    part.heal().unwrap();
    wait_for(
        "writes again after the heal",
        Duration::from_secs(30),
        || set_ok(m, "z").is_ok(),
    );
}

#[test]
fn a_dragonfly_group_is_reported_unfenced_and_left_alone() {
    let world = dragonfly_stub::StubWorld::new();
    let master = world.start_master(&next_loopback_ip());
    let replica = world.start_replica(&next_loopback_ip(), master.addr());
    let cluster = ClusterPlan::new(3).start(&fenced_group(master.addr()));
    cluster.wait_converged(&[0, 1, 2], GROUP, 2, Duration::from_secs(20));
    wait_for(
        "every daemon to report the group unfenced",
        Duration::from_secs(10),
        || {
            cluster.nodes.iter().all(|n| {
                let f = &n.group(GROUP)["isolation_fence"];
                f["in_force"].is_null()
                    && f["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("Dragonfly has no min-replicas-to-write"))
            })
        },
    );
    // A few more seconds of ticks and checks: still nothing sent.
    std::thread::sleep(Duration::from_secs(3));
    for stub in [&master, &replica] {
        assert!(
            !stub.received(&["CONFIG"]),
            "picket sent CONFIG to a Dragonfly server: {:?}",
            stub.commands()
        );
    }
}

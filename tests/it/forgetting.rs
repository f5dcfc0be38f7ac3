//! Static groups forget replicas that are gone (`forget_after`), so that
//! Sentinel's `SENTINEL RESET` ritual is never needed, and never forget a
//! server last seen as a master (it must be demoted if it comes back).
//! Real redis-server processes, one daemon.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use picket_harness::*;

const GROUP: &str = "cache";

fn listed(node: &PicketNode, addr: SocketAddr) -> bool {
    node.instance_addrs(GROUP).contains(&addr.to_string())
}

fn has_series(node: &PicketNode, addr: SocketAddr) -> bool {
    node.metrics()
        .map(|m| {
            metric_value(
                &m,
                "picket_instance_up",
                &[("group", GROUP), ("server", &addr.to_string())],
            )
            .is_some()
        })
        .unwrap_or(true)
}

fn start(master: SocketAddr, forget_after: &str) -> PicketCluster {
    let extra = format!("forget_after = \"{forget_after}\"\n");
    ClusterPlan::new(1).start(&group_toml(GROUP, master, 1, &extra))
}

#[test]
fn a_replica_gone_for_forget_after_is_forgotten_and_taken_in_again_when_it_returns() {
    require_redis_server();
    let mut topo = Topology::master_with_replicas(2);
    topo.wait_replicas_up(READY_TIMEOUT);
    let cluster = start(topo.master.addr(), "3s");
    let node = &cluster.nodes[0];
    let gone = topo.replicas[0].addr();
    let kept = topo.replicas[1].addr();
    wait_for("both replicas known", READY_TIMEOUT, || {
        listed(node, gone) && listed(node, kept) && has_series(node, gone)
    });

    topo.replicas[0].kill9();
    let killed = Instant::now();
    // SDOWN after down_after (1 s), then forgotten once down for
    // forget_after (3 s) and no longer listed by the master.
    wait_for(
        "the dead replica forgotten",
        Duration::from_secs(20),
        || !listed(node, gone),
    );
    let took = killed.elapsed();
    assert!(
        took >= Duration::from_secs(2),
        "forgotten after {took:?}, before forget_after\n{}",
        node.logs()
    );
    assert!(listed(node, kept), "the live replica stays");
    // Its series left /metrics, so "instance down" alerts stop.
    assert!(
        !has_series(node, gone),
        "{}",
        node.metrics().unwrap_or_default()
    );
    let replicas = node.cmd(&["SENTINEL", "replicas", GROUP]).unwrap();
    assert!(
        !format!("{replicas:?}").contains(&format!("\"{}\"", gone.port())),
        "SENTINEL replicas still lists it: {replicas:?}"
    );

    // Back, replicating from the master again: the master lists it and it
    // is known again, with its series.
    topo.replicas[0].restart();
    wait_for(
        "the returning replica known again",
        Duration::from_secs(20),
        || listed(node, gone) && has_series(node, gone),
    );
}

#[test]
fn an_old_master_is_never_forgotten_and_is_demoted_when_it_returns() {
    require_redis_server();
    let mut topo = Topology::master_with_replicas(1);
    topo.wait_replicas_up(READY_TIMEOUT);
    let old = topo.master.addr();
    let cluster = start(old, "2s");
    let node = &cluster.nodes[0];
    wait_for("the replica known", READY_TIMEOUT, || {
        listed(node, topo.replicas[0].addr())
    });
    topo.master.kill9();
    let (new, _) = cluster.wait_agreed_new_master(GROUP, &[0], old, Duration::from_secs(20));
    assert_eq!(new, topo.replicas[0].addr());
    // Down and unlisted for well over forget_after: still known.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        assert!(
            listed(node, old),
            "the old master was forgotten\n{}",
            node.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    topo.master.restart();
    wait_for("the old master demoted", Duration::from_secs(20), || {
        topo.master.info_field("replication", "role").as_deref() == Some("slave")
    });
}

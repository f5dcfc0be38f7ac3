//! A master busy with a long script answers `-BUSY` to every PING: it is
//! alive. Like Redis Sentinel, picket sends it one `SCRIPT KILL` once it
//! is SDOWN, and fails it over only if it still does not answer validly
//! `down_after` later — or at once when the script has written and cannot
//! be killed (`-UNKILLABLE`). Real redis-server processes, three daemons.

use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use picket_harness::*;

const GROUP: &str = "cache";

/// A script that runs for `secs` seconds (measured with `TIME`), after
/// writing a key first when `write` (which makes it unkillable).
fn script(write: bool) -> String {
    format!(
        "{} local t = redis.call('TIME') \
         local s = tonumber(t[1]) + tonumber(t[2]) / 1e6 \
         while true do \
           local n = redis.call('TIME') \
           if tonumber(n[1]) + tonumber(n[2]) / 1e6 - s > tonumber(ARGV[1]) then break end \
         end \
         return 'done'",
        if write {
            "redis.call('SET', 'busy-script', '1')"
        } else {
            ""
        }
    )
}

/// Run the script on its own connection; the thread returns its reply.
fn run_script(addr: SocketAddr, write: bool, secs: u32) -> JoinHandle<Result<Reply, String>> {
    let text = script(write);
    std::thread::spawn(move || {
        let mut c = RespConn::connect(addr, Duration::from_secs(30))?;
        c.cmd(&["EVAL", &text, "0", &secs.to_string()])
    })
}

fn setup() -> (Topology, PicketCluster) {
    let topo = Topology::master_with_replicas(2);
    // -BUSY after 100 ms of script instead of Redis' 5 s, so that the
    // master answers -BUSY well before down_after (1 s).
    assert!(
        topo.master
            .cmd(&["CONFIG", "SET", "lua-time-limit", "100"])
            .unwrap()
            .is_ok()
    );
    let groups = group_toml(GROUP, topo.master.addr(), 2, "");
    let cluster = ClusterPlan::new(3).start(&groups);
    cluster.wait_converged(&[0, 1, 2], GROUP, 3, Duration::from_secs(20));
    (topo, cluster)
}

fn script_kills(cluster: &PicketCluster) -> usize {
    cluster
        .nodes
        .iter()
        .flat_map(|n| n.events())
        .filter(|e| e.event == "+script-kill")
        .count()
}

#[test]
fn a_busy_script_is_killed_and_the_master_is_not_failed_over() {
    let (topo, cluster) = setup();
    let master = topo.master.addr();
    let started = Instant::now();
    let run = run_script(master, false, 3);
    let reply = run.join().expect("script thread");
    let took = started.elapsed();
    // Killed early, not run to the end.
    let text = format!("{reply:?}");
    assert!(
        text.contains("SCRIPT KILL") || text.contains("killed"),
        "the script was not killed: {text}\n{}",
        cluster.logs()
    );
    assert!(
        took < Duration::from_secs(3),
        "{took:?}\n{}",
        cluster.logs()
    );
    assert!(script_kills(&cluster) >= 1, "{}", cluster.logs());
    // The master answers again: no daemon fails it over, for well beyond
    // down_after and a failover's duration.
    let window = Instant::now() + Duration::from_secs(5);
    while Instant::now() < window {
        for n in &cluster.nodes {
            let g = n.group(GROUP);
            assert_eq!(
                g["config_epoch"].as_u64(),
                Some(0),
                "{} failed the busy master over\n{}",
                n.id,
                cluster.logs()
            );
            assert_eq!(n.master_addr(GROUP), Some(master));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        topo.master.info_field("replication", "role").as_deref(),
        Some("master")
    );
}

#[test]
fn a_script_that_has_written_cannot_be_killed_and_the_master_is_failed_over() {
    let (topo, cluster) = setup();
    let master = topo.master.addr();
    let run = run_script(master, true, 6);
    let (new_master, epoch) =
        cluster.wait_agreed_new_master(GROUP, &[0, 1, 2], master, Duration::from_secs(30));
    assert_ne!(new_master, master);
    assert!(epoch > 0);
    // It was tried first.
    assert!(script_kills(&cluster) >= 1, "{}", cluster.logs());
    let reply = run.join().expect("script thread");
    assert!(
        format!("{reply:?}").contains("done"),
        "an unkillable script runs to its end: {reply:?}"
    );
}

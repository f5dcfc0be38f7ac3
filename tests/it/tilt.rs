//! Stall protection: a daemon stopped (SIGSTOP) for longer than
//! `down_after` must not count the stall as instance downtime, and must not
//! fail over a healthy master when it resumes.

use std::time::Duration;

use picket_harness::{PicketProcess, Topology, free_port, wait_for};

fn status(addr: &str) -> Option<serde_json::Value> {
    let (_, body) = picket_harness::http_get(addr.parse().ok()?, "/v1/status").ok()?;
    serde_json::from_str(&body).ok()
}

#[test]
fn a_stalled_daemon_does_not_fail_over_a_healthy_master() {
    picket_harness::require_redis_server();
    let topo = Topology::master_with_replicas(1);
    let http = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let resp = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    // One daemon and quorum 1: without stall protection, the stall alone
    // would be enough for it to fail the master over on resume.
    let config = |dir: &std::path::Path| {
        format!(
            r#"
[daemon]
listen = "{resp}"
http_listen = "{http}"
data_dir = "{}"

[[group]]
name = "cache"
master = "{}"
quorum = 1
down_after = "1s"
failover_timeout = "5s"
"#,
            dir.join("data").display(),
            topo.master.addr()
        )
    };
    let picket = PicketProcess::start_with(config, &[], &[]);
    wait_for(
        "both instances up in /v1/status",
        Duration::from_secs(15),
        || {
            status(&http).is_some_and(|s| {
                let inst = &s["groups"][0]["instances"];
                inst.as_array().is_some_and(|a| {
                    a.len() == 2 && a.iter().all(|i| i["up"] == true && i["role"] != "unknown")
                })
            })
        },
    );

    picket.sigstop();
    std::thread::sleep(Duration::from_secs(3));
    picket.sigcont();

    wait_for(
        "the stall is detected (+tilt)",
        Duration::from_secs(10),
        || picket.logs().contains("+tilt"),
    );
    // Give a failover every chance to happen: well past down_after and the
    // TILT period (3 × down_after, at least 3 s).
    std::thread::sleep(Duration::from_secs(5));
    let s = status(&http).expect("status after the stall");
    let logs = picket.logs();
    assert_eq!(
        s["groups"][0]["config_epoch"], 0,
        "no failover may happen\n{logs}"
    );
    assert_eq!(
        s["groups"][0]["master"],
        topo.master.addr().to_string(),
        "{logs}"
    );
    assert!(
        !logs.contains("+sdown"),
        "the stall was counted as downtime:\n{logs}"
    );
    assert!(!logs.contains("+try-failover"), "{logs}");
    assert!(
        logs.contains("-tilt"),
        "TILT ends after its period:\n{logs}"
    );
    assert_eq!(
        topo.master.info_field("replication", "role").as_deref(),
        Some("master")
    );
}

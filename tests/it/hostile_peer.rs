//! A configured peer that lies or talks nonsense cannot move the master:
//! a hello announcing a higher config epoch for an instance that is not a
//! master is not adopted, a second vote request in one epoch gets the
//! first vote, malformed peer commands get errors, and the daemon stays up.

use std::net::SocketAddr;
use std::time::Duration;

use picket_harness::{PicketProcess, Reply, RespConn, Topology, free_port, wait_for};

fn status(addr: &str) -> Option<serde_json::Value> {
    let (_, body) = picket_harness::http_get(addr.parse().ok()?, "/v1/status").ok()?;
    serde_json::from_str(&body).ok()
}

#[test]
fn a_lying_peer_cannot_move_the_master() {
    picket_harness::require_redis_server();
    let topo = Topology::master_with_replicas(1);
    let http = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let resp: SocketAddr = format!("127.0.0.1:{}", free_port("127.0.0.1"))
        .parse()
        .unwrap();
    // The "peer" is this test: nothing listens on its address, it only talks.
    let liar = format!("127.0.0.1:{}", free_port("127.0.0.1"));
    let config = |dir: &std::path::Path| {
        format!(
            r#"
[daemon]
listen = "{resp}"
http_listen = "{http}"
data_dir = "{}"
peers = ["{liar}"]

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
    wait_for("picket knows the replica", Duration::from_secs(15), || {
        status(&http).is_some_and(|s| {
            s["groups"][0]["instances"]
                .as_array()
                .is_some_and(|a| a.len() == 2 && a.iter().all(|i| i["role"] != "unknown"))
        })
    });
    let replica = topo.replicas[0].addr().to_string();
    let mut c = RespConn::connect(resp, Duration::from_secs(2)).expect("connect to picket");

    // A higher epoch naming the replica as master.
    let lie = serde_json::json!({
        "id": "liar", "addr": liar, "current_epoch": 50,
        "groups": [{"name": "cache", "master": replica, "config_epoch": 50, "sdown": false}]
    })
    .to_string();
    let r = c.cmd(&["PICKET", "HELLO", &lie]).expect("hello answered");
    assert!(
        matches!(r, Reply::Bulk(_)),
        "a peer's hello is answered with ours: {r:?}"
    );

    // Malformed messages: errors, never a crash.
    for bad in [
        vec!["PICKET", "HELLO", "{not json"],
        vec!["PICKET", "HELLO"],
        vec!["PICKET", "IS-DOWN", "cache"],
        vec!["PICKET", "IS-DOWN", "cache", "nohost", "1", "1", "*"],
        vec!["PICKET", "IS-DOWN", "cache", "127.0.0.1:1", "-4", "1", "*"],
        vec![
            "PICKET",
            "IS-DOWN",
            "nosuchgroup",
            "127.0.0.1:1",
            "0",
            "1",
            "*",
        ],
        vec!["PICKET", "NOPE"],
    ] {
        let r = c.cmd(&bad).expect("answered");
        assert!(r.as_error().is_some(), "{bad:?} must be refused, got {r:?}");
    }
    // A peer asking for a vote twice in one epoch, for two candidates, and
    // again in an older epoch: this daemon votes once, and every answer
    // names that one vote.
    let master = topo.master.addr().to_string();
    for (candidate, epoch) in [("liar", "70"), ("another", "70"), ("another", "69")] {
        let r = c
            .cmd(&["PICKET", "IS-DOWN", "cache", &master, "0", epoch, candidate])
            .expect("answered");
        let Reply::Array(a) = &r else {
            panic!("IS-DOWN for {candidate} at {epoch}: {r:?}")
        };
        assert_eq!(
            (
                a.get(1).and_then(Reply::as_str),
                a.get(2).and_then(Reply::as_int)
            ),
            (Some("liar"), Some(70)),
            "asked for {candidate} at {epoch}: {r:?}"
        );
    }

    // An unknown daemon's hello is refused: membership is static.
    let stranger = serde_json::json!({
        "id": "stranger", "addr": "127.0.0.1:1", "current_epoch": 60,
        "groups": [{"name": "cache", "master": replica, "config_epoch": 60, "sdown": false}]
    })
    .to_string();
    let r = c.cmd(&["PICKET", "HELLO", &stranger]).expect("answered");
    assert!(
        r.as_error().is_some_and(|e| e.contains("unknown peer")),
        "{r:?}"
    );

    // Several seconds for a (wrong) adoption to happen.
    std::thread::sleep(Duration::from_secs(3));
    let s = status(&http).expect("status");
    let logs = picket.logs();
    assert_eq!(
        s["groups"][0]["master"],
        topo.master.addr().to_string(),
        "{logs}"
    );
    assert_eq!(s["groups"][0]["config_epoch"], 0, "{logs}");
    assert!(
        logs.contains("does not report role:master; not adopting"),
        "the refusal is logged:\n{logs}"
    );
    assert_eq!(
        topo.replicas[0]
            .info_field("replication", "role")
            .as_deref(),
        Some("slave"),
        "nothing was promoted"
    );
    assert!(
        picket_harness::http_get(http.parse().unwrap(), "/healthz")
            .is_ok_and(|(code, b)| code == 200 && b.starts_with("ok"))
    );
}

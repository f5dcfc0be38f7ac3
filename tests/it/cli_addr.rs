//! One address for the CLI, and the load balancers' check, against one
//! daemon watching a real master and replica:
//!
//! - `picket status --addr` given the RESP port says which port it needs
//!   and why (it used to answer "invalid HTTP version parsed"); given the
//!   HTTP port it prints the table;
//! - `picket failover --addr` given the HTTP port finds the RESP port in
//!   `/v1/status` and switches over;
//! - `/v1/lb/<group>/<server>` answers 200 for the master only, 503 with
//!   the reason for the replica, 404 for an unknown group, and follows the
//!   switchover.

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::time::Duration;

use picket_harness::*;

const GROUP: &str = "cache";

fn picket(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_picket"))
        .args(args)
        .env_remove("PICKET_PASSWORD")
        .env_remove("PICKET_USER")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn lb(http: SocketAddr, group: &str, server: SocketAddr) -> (u16, String) {
    http_get(http, &format!("/v1/lb/{group}/{server}")).unwrap()
}

#[test]
fn the_cli_takes_either_port_and_the_lb_check_follows_the_master() {
    let topo = Topology::master_with_replicas(1);
    let (m, r) = (topo.master.addr(), topo.replicas[0].addr());
    let plan = ClusterPlan::new(1);
    let (resp, http) = (plan.resp[0], plan.http[0]);
    let cluster = plan.start(&group_toml(GROUP, m, 1, ""));
    cluster.wait_converged(&[0], GROUP, 2, Duration::from_secs(20));

    // The check: 200 for the master only.
    wait_for(
        "the check to pass for the master",
        Duration::from_secs(10),
        || lb(http, GROUP, m).0 == 200,
    );
    let (code, body) = lb(http, GROUP, m);
    assert_eq!(
        (code, body.as_str()),
        (200, format!("master {m} config epoch 0\n").as_str())
    );
    let (code, body) = lb(http, GROUP, r);
    assert_eq!(code, 503, "{body}");
    assert!(
        body.starts_with("replica: the master is") && body.contains(&m.to_string()),
        "{body}"
    );
    let (code, body) = lb(http, "nope", m);
    assert_eq!(code, 404, "{body}");
    assert!(body.starts_with("unknown-group"), "{body}");

    // status: the RESP port is refused with the reason; a data server's
    // RESP port too; the HTTP port works.
    for wrong in [resp, m] {
        let out = picket(&["status", "--addr", &wrong.to_string()]);
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        assert!(
            t.contains("RESP port")
                && t.contains("http_listen")
                && !t.contains("invalid HTTP version"),
            "{t}"
        );
    }
    let out = picket(&["status", "--addr", &http.to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(GROUP),
        "{}",
        text(&out)
    );

    // failover: the HTTP port leads to the RESP one.
    let out = picket(&["failover", GROUP, "--addr", &http.to_string()]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains(&format!("using the RESP port {resp}")), "{t}");
    let (new_master, epoch) =
        cluster.wait_agreed_new_master(GROUP, &[0], m, Duration::from_secs(30));
    assert_eq!(new_master, r);
    wait_for(
        "the check to follow the switchover",
        Duration::from_secs(10),
        || lb(http, GROUP, r).0 == 200 && lb(http, GROUP, m).0 == 503,
    );
    assert_eq!(
        lb(http, GROUP, r).1,
        format!("master {r} config epoch {epoch}\n")
    );
    // And the RESP port is still what failover takes directly.
    let out = picket(&["failover", "nope", "--addr", &resp.to_string()]);
    let t = text(&out);
    assert!(!out.status.success() && t.contains("No such master"), "{t}");
}

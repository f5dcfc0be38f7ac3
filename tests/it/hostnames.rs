//! Data servers named by host name, as in docker-compose: one server is one
//! instance under its configured name through a failover and the old
//! master's return; clients are told IPs unless `announce_hostnames`; a
//! name that moves to another address is followed; a name that does not
//! resolve is an instance down with that reason.
//!
//! Names are resolved from a hosts file of the test's own, bind-mounted
//! over `/etc/hosts` in a private mount namespace of the daemon's process
//! (`unshare --mount`, plus a user namespace when not run as root): the
//! machine's `/etc/hosts` is never touched. The file is rewritten in place
//! (same inode), so the daemon sees each change at its next lookup.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use picket_harness::*;

const GROUP: &str = "cache";

/// A single daemon (quorum 1) whose `/etc/hosts` is `hosts`.
fn daemon(hosts: &Path, master: &str, extra: &str) -> (PicketProcess, SocketAddr, SocketAddr) {
    let ip = next_loopback_ip();
    let resp: SocketAddr = format!("{ip}:{}", free_port(&ip)).parse().unwrap();
    let http: SocketAddr = format!("{ip}:{}", free_port(&ip)).parse().unwrap();
    let wrapper = private_mount_wrapper(
        "mount --bind \"$0\" /etc/hosts && exec \"$@\"",
        &hosts.display().to_string(),
    );
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let master = master.to_string();
    let extra = extra.to_string();
    let p = PicketProcess::start_wrapped(
        move |dir| {
            format!(
                "[daemon]\nid = \"picket-names\"\nlisten = \"{resp}\"\nhttp_listen = \"{http}\"\n\
                 data_dir = \"{}\"\nlog_format = \"json\"\n\n[[group]]\nname = \"{GROUP}\"\n\
                 master = \"{master}\"\nquorum = 1\ndown_after = \"1s\"\nfailover_timeout = \"5s\"\n{extra}",
                dir.join("data").display()
            )
        },
        &wrapper,
        &[],
        &[],
    );
    (p, resp, http)
}

fn write_hosts(path: &Path, entries: &[(&str, &str)]) {
    let mut text = String::from("127.0.0.1 localhost\n");
    for (ip, name) in entries {
        text.push_str(&format!("{ip} {name}\n"));
    }
    // In place: a bind mount follows the inode, not the name.
    std::fs::write(path, text).unwrap();
}

fn group(http: SocketAddr) -> serde_json::Value {
    http_get(http, "/v1/status")
        .ok()
        .filter(|(code, _)| *code == 200)
        .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
        .and_then(|s| {
            s["groups"]
                .as_array()?
                .iter()
                .find(|g| g["name"] == GROUP)
                .cloned()
        })
        .unwrap_or(serde_json::Value::Null)
}

fn instances(g: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = g["instances"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["addr"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn master_addr(resp: SocketAddr) -> Option<String> {
    match redis_cmd(resp, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", GROUP]).ok()? {
        Reply::Array(v) if v.len() == 2 => Some(format!("{}:{}", v[0].as_str()?, v[1].as_str()?)),
        _ => None,
    }
}

#[test]
fn a_named_master_is_one_server_through_a_failover_and_its_return() {
    require_redis_server();
    let mut topo = Topology::master_with_replicas(1);
    let old = topo.master.addr();
    let replica = topo.replicas[0].addr();
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    write_hosts(&hosts, &[(&old.ip().to_string(), "redis-a")]);
    let named = format!("redis-a:{}", old.port());
    let (p, resp, http) = daemon(&hosts, &named, "");

    // Clients get the IP the name resolves to (Sentinel's default).
    wait_for(
        "the master resolved and its replica listed",
        Duration::from_secs(20),
        || {
            let g = group(http);
            instances(&g) == {
                let mut v = vec![named.clone(), replica.to_string()];
                v.sort();
                v
            } && master_addr(resp).as_deref() == Some(old.to_string().as_str())
        },
    );

    topo.master.kill9();
    wait_for("the replica promoted", Duration::from_secs(30), || {
        master_addr(resp).as_deref() == Some(replica.to_string().as_str())
    });
    // The new master lists its replicas by IP; the old master comes back
    // on the same address and is demoted: it must stay one instance, under
    // its configured name.
    topo.master.restart();
    wait_for(
        "the old master demoted, following the new one",
        Duration::from_secs(20),
        || replica_linked_to(&topo.master, replica),
    );
    wait_for(
        "the new master lists the old one",
        Duration::from_secs(10),
        || {
            topo.replicas[0]
                .info("replication")
                .is_ok_and(|i| i.contains(&format!("port={}", old.port())))
        },
    );
    // Give the daemon the chance to list the IP as a second instance.
    let seen_once = |g: &serde_json::Value| {
        let v = instances(g);
        v.len() == 2 && v.contains(&named) && v.contains(&replica.to_string())
    };
    for _ in 0..10 {
        let g = group(http);
        assert!(
            seen_once(&g),
            "one server, one instance: {:?}\n{}",
            instances(&g),
            p.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let g = group(http);
    let old_entry = g["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["addr"] == named.as_str()).cloned())
        .unwrap();
    assert_eq!(old_entry["ip"], old.ip().to_string(), "{old_entry}");
    assert_eq!(old_entry["role"], "replica", "{old_entry}");
}

#[test]
fn a_name_that_moves_is_followed_and_one_that_does_not_resolve_is_down_with_the_reason() {
    require_redis_server();
    let topo = Topology::master_with_replicas(0);
    let first = topo.master.addr();
    // A second server on the same port of another address: where the name
    // will point next.
    let other_ip = next_loopback_ip();
    let second = RedisServer::start(&other_ip, first.port(), RedisOpts::default());
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    write_hosts(&hosts, &[(&first.ip().to_string(), "redis-a")]);
    let named = format!("redis-a:{}", first.port());
    let (p, resp, http) = daemon(&hosts, &named, "announce_hostnames = false\n");
    wait_for("the name resolved", Duration::from_secs(20), || {
        master_addr(resp).as_deref() == Some(first.to_string().as_str())
    });

    // The container is recreated on another address: the probe reconnects
    // to the name's new IP once the old connection breaks.
    write_hosts(&hosts, &[(&other_ip, "redis-a")]);
    drop(topo);
    wait_for(
        "the name followed to its new address",
        Duration::from_secs(20),
        || master_addr(resp).as_deref() == Some(second.addr().to_string().as_str()),
    );
    let g = group(http);
    assert_eq!(instances(&g), vec![named.clone()], "{g}");

    // The name stops resolving: the instance is down, and says why.
    write_hosts(&hosts, &[]);
    drop(second);
    wait_for(
        "the unresolvable name reported",
        Duration::from_secs(20),
        || {
            let g = group(http);
            g["instances"].as_array().is_some_and(|a| {
                a.iter().any(|i| {
                    i["addr"] == named.as_str()
                        && i["up"] == false
                        && i["last_error"]
                            .as_str()
                            .is_some_and(|e| e.contains("redis-a"))
                })
            })
        },
    );
    // The daemon itself goes on answering.
    assert!(redis_cmd(resp, &["PING"]).is_ok(), "{}", p.logs());
}

#[test]
fn a_replica_told_the_masters_name_is_re_pointed_at_its_ip() {
    // A replica that follows its master by name resolves the name itself
    // at each reconnect, on its main thread: when the name is gone with
    // the master's container, it stalls. picket tells servers IPs.
    require_redis_server();
    let master = RedisServer::start("127.0.0.1", 0, RedisOpts::default());
    let port = master.addr().port().to_string();
    let replica = RedisServer::start_fresh(RedisOpts::default());
    assert!(
        replica
            .cmd(&["REPLICAOF", "localhost", &port])
            .unwrap()
            .is_ok()
    );
    let follows = |host: &str| {
        replica.info("replication").is_ok_and(|i| {
            i.contains(&format!("master_host:{host}\r\n")) && i.contains("master_link_status:up")
        })
    };
    wait_for(
        "the replica linked by name",
        Duration::from_secs(20),
        || follows("localhost"),
    );
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    write_hosts(&hosts, &[]);
    let (p, _resp, http) = daemon(&hosts, &format!("localhost:{port}"), "");
    wait_for(
        "the replica re-pointed at the master's IP",
        Duration::from_secs(20),
        || follows("127.0.0.1"),
    );
    let g = group(http);
    let mut want = vec![format!("localhost:{port}"), replica.addr().to_string()];
    want.sort();
    assert_eq!(instances(&g), want, "{g}\n{}", p.logs());
}

#[test]
fn two_names_for_one_server_are_one_instance() {
    // The old master comes back and, as a replica, announces another name
    // (replica-announce-ip) that resolves to the same address as the name
    // it is configured under.
    require_redis_server();
    let mut master =
        RedisServer::start_fresh(RedisOpts::default().args(&["--replica-announce-ip", "redis-a2"]));
    let old = master.addr();
    let replica = RedisServer::start_fresh(
        RedisOpts::default()
            .replica_of(old)
            .args(&["--replica-announce-ip", "redis-b"]),
    );
    wait_for("the replica linked", Duration::from_secs(20), || {
        replica_linked_to(&replica, old)
    });
    let dir = tempfile::tempdir().unwrap();
    let hosts = dir.path().join("hosts");
    let (a, b) = (old.ip().to_string(), replica.addr().ip().to_string());
    write_hosts(
        &hosts,
        &[(&a, "redis-a"), (&a, "redis-a2"), (&b, "redis-b")],
    );
    let named = format!("redis-a:{}", old.port());
    let replica_named = format!("redis-b:{}", replica.addr().port());
    let (p, resp, http) = daemon(&hosts, &named, "");
    let mut want = vec![named.clone(), replica_named.clone()];
    want.sort();
    wait_for(
        "both servers listed by name",
        Duration::from_secs(20),
        || instances(&group(http)) == want,
    );
    master.kill9();
    wait_for("the replica promoted", Duration::from_secs(30), || {
        master_addr(resp).as_deref() == Some(replica.addr().to_string().as_str())
    });
    master.restart();
    wait_for(
        "the new master lists the old one as redis-a2",
        Duration::from_secs(20),
        || {
            replica
                .info("replication")
                .is_ok_and(|i| i.contains("ip=redis-a2") && i.contains("state=online"))
        },
    );
    // The second name is an instance until its first probe resolves it
    // (one round trip), then an alias of the first, for good.
    wait_for(
        "the second name merged into the first",
        Duration::from_secs(10),
        || p.stderr().contains("one server under two names") && instances(&group(http)) == want,
    );
    for _ in 0..10 {
        let g = group(http);
        assert_eq!(
            instances(&g),
            want,
            "one server, one instance\n{}",
            p.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

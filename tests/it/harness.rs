//! Tests of the integration-test harness itself, against real redis-server
//! processes. A missing redis-server fails these tests (it is required).

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use picket_harness::*;

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn refuses_connections(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err()
}

#[test]
fn redis_server_is_installed() {
    require_redis_server();
}

#[test]
fn start_answers_and_drop_kills_the_process() {
    let server = RedisServer::start_fresh(RedisOpts::default());
    let addr = server.addr();
    let pid = server.pid().expect("running");
    assert!(addr.ip().is_loopback());
    assert!(process_exists(pid));

    assert_eq!(
        redis_cmd(addr, &["PING"]).unwrap(),
        Reply::Status("PONG".into())
    );
    assert!(redis_cmd(addr, &["SET", "k", "v"]).unwrap().is_ok());
    assert_eq!(redis_cmd(addr, &["GET", "k"]).unwrap().as_str(), Some("v"));
    assert_eq!(redis_cmd(addr, &["DBSIZE"]).unwrap().as_int(), Some(1));
    let info = server.info("server").unwrap();
    assert_eq!(info_value(&info, "process_id"), Some(pid.to_string()));
    assert_eq!(info_value(&info, "tcp_port"), Some(addr.port().to_string()));
    // Nothing is written to disk and the server runs in its own directory.
    assert_eq!(
        server.cmd(&["CONFIG", "GET", "save"]).unwrap(),
        Reply::Array(vec![Reply::Bulk(b"save".to_vec()), Reply::Bulk(Vec::new())])
    );
    assert!(server.dir().join("redis.log").exists());
    let dir = server.dir().to_path_buf();

    drop(server);
    assert!(!process_exists(pid), "pid {pid} still exists after drop");
    assert!(refuses_connections(addr));
    assert!(!dir.exists(), "temp dir {dir:?} not removed");
}

#[test]
fn resp_helper_decodes_every_reply_type() {
    let server = RedisServer::start_fresh(RedisOpts::default());
    let addr = server.addr();
    assert_eq!(redis_cmd(addr, &["GET", "missing"]).unwrap(), Reply::Nil);
    assert_eq!(redis_cmd(addr, &["INCR", "n"]).unwrap(), Reply::Int(1));
    let err = redis_cmd(addr, &["NO-SUCH-COMMAND"]).unwrap();
    assert!(
        err.as_error().is_some_and(|e| e.starts_with("ERR")),
        "{err:?}"
    );
    assert!(err.clone().into_result().is_err());
    assert!(matches!(
        redis_cmd(addr, &["INFO"]).unwrap(),
        Reply::Bulk(_)
    ));
    // Binary-safe and larger than one read: a 100 KiB value.
    let big = "x".repeat(100 * 1024);
    assert!(redis_cmd(addr, &["SET", "big", &big]).unwrap().is_ok());
    assert_eq!(
        redis_cmd(addr, &["GET", "big"])
            .unwrap()
            .as_str()
            .map(str::len),
        Some(big.len())
    );
    // Several commands on one connection.
    let mut conn = RespConn::connect(addr, CMD_TIMEOUT).unwrap();
    for i in 0..10 {
        let r = conn.cmd(&["ECHO", &i.to_string()]).unwrap();
        assert_eq!(r.as_str(), Some(i.to_string().as_str()));
    }
}

#[test]
fn resp_helper_reports_transport_errors() {
    let ip = next_loopback_ip();
    let port = free_port(&ip);
    let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
    let started = Instant::now();
    let err = redis_cmd(addr, &["PING"]).unwrap_err();
    assert!(err.contains("connect"), "{err}");
    assert!(started.elapsed() < CMD_TIMEOUT + Duration::from_secs(1));
}

#[test]
fn kill9_then_restart_same_address_empty_dataset() {
    let mut server = RedisServer::start_fresh(RedisOpts::default());
    let addr = server.addr();
    let first_pid = server.pid().unwrap();
    assert!(server.cmd(&["SET", "k", "v"]).unwrap().is_ok());

    let status = server.kill9().expect("was running");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    assert_eq!(server.pid(), None);
    assert!(!server.is_running());
    assert!(!process_exists(first_pid));
    assert!(refuses_connections(addr));
    assert_eq!(server.kill9(), None, "second kill9 is a no-op");

    server.restart();
    let second_pid = server.pid().unwrap();
    assert_ne!(first_pid, second_pid);
    assert_eq!(server.addr(), addr);
    assert_eq!(server.cmd(&["PING"]).unwrap(), Reply::Status("PONG".into()));
    // No persistence: the restarted server is empty, like an OOM-killed one.
    assert_eq!(server.cmd(&["DBSIZE"]).unwrap().as_int(), Some(0));
    // The log of both runs is kept in the same directory.
    assert!(
        server.log().matches("Ready to accept connections").count() >= 2,
        "{}",
        server.log()
    );

    // restart() of a live server replaces the process.
    server.restart();
    assert_ne!(server.pid().unwrap(), second_pid);
    assert!(!process_exists(second_pid));
}

#[test]
fn sigstop_freezes_and_sigcont_resumes() {
    let server = RedisServer::start_fresh(RedisOpts::default());
    server.sigstop();
    let mut conn = RespConn::connect(server.addr(), Duration::from_millis(300)).unwrap();
    // The kernel still accepts the connection, but nobody answers.
    let err = conn.cmd(&["PING"]).unwrap_err();
    assert!(err.contains("read"), "{err}");
    server.sigcont();
    wait_for("PING after SIGCONT", READY_TIMEOUT, || {
        server
            .cmd(&["PING"])
            .is_ok_and(|r| r == Reply::Status("PONG".into()))
    });
}

#[test]
fn explicit_port_already_taken_fails_with_log() {
    let first = RedisServer::start_fresh(RedisOpts::default());
    let err = RedisServer::try_start(&first.ip(), first.port(), RedisOpts::default())
        .expect_err("second server on the same address must not start");
    assert!(err.contains("already in use"), "{err}");
    // The first one is unaffected.
    assert_eq!(first.cmd(&["PING"]).unwrap(), Reply::Status("PONG".into()));
}

#[test]
fn loopback_addresses_and_ports_are_distinct() {
    let ips: Vec<String> = (0..300).map(|_| next_loopback_ip()).collect();
    let mut unique = ips.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ips.len());
    for ip in &ips {
        let parsed: std::net::Ipv4Addr = ip.parse().unwrap();
        assert!(parsed.is_loopback());
        assert!(!matches!(parsed.octets()[3], 0 | 255), "{ip}");
    }
    let port = free_port(&ips[0]);
    assert_ne!(port, 0);
    // The port is really free: it can be bound.
    std::net::TcpListener::bind((ips[0].as_str(), port)).unwrap();
}

#[test]
fn topology_with_two_replicas_links_up() {
    let topo = Topology::master_with_replicas(2);
    let master = topo.master.addr();
    let ips: Vec<_> = topo.all().map(|s| s.addr().ip()).collect();
    assert_eq!(ips.len(), 3);
    assert!(
        ips[0] != ips[1] && ips[1] != ips[2] && ips[0] != ips[2],
        "{ips:?}"
    );

    for r in &topo.replicas {
        let info = r.info("replication").unwrap();
        assert_eq!(
            info_value(&info, "role").as_deref(),
            Some("slave"),
            "{info}"
        );
        assert_eq!(
            info_value(&info, "master_host"),
            Some(master.ip().to_string())
        );
        assert_eq!(
            info_value(&info, "master_port"),
            Some(master.port().to_string())
        );
        assert_eq!(
            info_value(&info, "master_link_status").as_deref(),
            Some("up")
        );
    }
    // The master lists both replicas under their own addresses.
    let info = topo.master.info("replication").unwrap();
    assert_eq!(info_value(&info, "role").as_deref(), Some("master"));
    assert_eq!(
        info_value(&info, "connected_slaves").as_deref(),
        Some("2"),
        "{info}"
    );
    for r in &topo.replicas {
        let needle = format!("ip={},port={},", r.ip(), r.port());
        assert!(info.contains(&needle), "{needle} not in\n{info}");
    }

    // Writes flow to the replicas, which refuse writes themselves.
    assert!(topo.master.cmd(&["SET", "k", "v"]).unwrap().is_ok());
    for r in &topo.replicas {
        wait_for(
            &format!("k replicated to {}", r.addr()),
            READY_TIMEOUT,
            || r.cmd(&["GET", "k"]).is_ok_and(|v| v.as_str() == Some("v")),
        );
        let err = r.cmd(&["SET", "k", "w"]).unwrap();
        assert!(
            err.as_error().is_some_and(|e| e.starts_with("READONLY")),
            "{err:?}"
        );
    }
}

#[test]
fn topology_links_go_down_when_master_is_killed_and_recover_on_restart() {
    let mut topo = Topology::master_with_replicas(1);
    let master = topo.master.addr();
    topo.master.kill9();
    let replica = &topo.replicas[0];
    wait_for("replica notices the dead master", READY_TIMEOUT, || {
        replica
            .info_field("replication", "master_link_status")
            .as_deref()
            == Some("down")
    });
    assert!(!replica_linked_to(replica, master));
    topo.master.restart();
    topo.wait_replicas_up(READY_TIMEOUT);
    assert!(replica_linked_to(&topo.replicas[0], master));
}

#[test]
fn password_protected_topology() {
    let topo = Topology::master_with_replicas_opts(1, RedisOpts::default().password("s3cret"));
    for s in topo.all() {
        let denied = redis_cmd(s.addr(), &["PING"]).unwrap();
        assert!(
            denied.as_error().is_some_and(|e| e.starts_with("NOAUTH")),
            "{denied:?}"
        );
        assert_eq!(
            redis_cmd_auth(s.addr(), Some("s3cret"), &["PING"]).unwrap(),
            Reply::Status("PONG".into())
        );
        assert!(redis_cmd_auth(s.addr(), Some("wrong"), &["PING"]).is_err());
    }
    assert!(replica_linked_to(&topo.replicas[0], topo.master.addr()));
}

#[test]
fn replicaof_at_runtime_and_extra_args() {
    let a = RedisServer::start_fresh(RedisOpts::default());
    let b = RedisServer::start_fresh(RedisOpts::default().args(&["--replica-priority", "42"]));
    let (ip, port) = (a.ip(), a.port().to_string());
    assert!(b.cmd(&["REPLICAOF", &ip, &port]).unwrap().is_ok());
    wait_for("b links to a", READY_TIMEOUT, || {
        replica_linked_to(&b, a.addr())
    });
    assert!(b.cmd(&["REPLICAOF", "NO", "ONE"]).unwrap().is_ok());
    assert_eq!(
        b.info_field("replication", "role").as_deref(),
        Some("master")
    );
}

#[test]
fn wait_for_returns_once_the_condition_holds() {
    let mut calls = 0;
    let started = Instant::now();
    wait_for("third call", Duration::from_secs(5), || {
        calls += 1;
        calls >= 3
    });
    assert_eq!(calls, 3);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
#[should_panic(expected = "waiting for something that never happens")]
fn wait_for_panics_with_its_description_on_timeout() {
    wait_for(
        "something that never happens",
        Duration::from_millis(100),
        || false,
    );
}

#[test]
fn wait_for_gives_up_within_its_bound() {
    let started = Instant::now();
    let result =
        std::panic::catch_unwind(|| wait_for("never", Duration::from_millis(200), || false));
    assert!(result.is_err());
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
}

#[tokio::test]
async fn wait_for_async_polls_without_blocking() {
    let mut calls = 0;
    wait_for_async("second call", Duration::from_secs(5), || {
        calls += 1;
        calls >= 2
    })
    .await;
    assert_eq!(calls, 2);
}

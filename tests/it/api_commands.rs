//! The connection commands and the SENTINEL subcommands that change state,
//! against a picket daemon watching a real Redis master and replica:
//! CLIENT (SETNAME, SETINFO, LIST, INFO, KILL), QUIT, RESET, RESP3 pushes,
//! SENTINEL FAILOVER (a planned switchover), IS-MASTER-DOWN-BY-ADDR votes,
//! SIMULATE-FAILURE flags in INFO.

use picket_harness::api_util;

use std::net::SocketAddr;
use std::time::Duration;

use api_util::*;
use picket_harness::*;

const NAME: &str = "mymaster";

fn master_of(d: SocketAddr) -> String {
    match redis_cmd(d, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", NAME]).unwrap() {
        Reply::Array(v) => format!("{}:{}", v[0].as_str().unwrap(), v[1].as_str().unwrap()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn client_commands_quit_and_reset() {
    let redis = RedisServer::start_fresh(RedisOpts::default());
    let d = start_cluster(redis.addr(), &ClusterOpts::default()).remove(0);
    let a = d.resp;

    let mut c = RawConn::connect(a, CMD_TIMEOUT);
    assert_eq!(c.cmd(&["CLIENT", "SETNAME", "tester"]), "+OK\r\n");
    assert_eq!(c.cmd(&["CLIENT", "GETNAME"]), "$6\r\ntester\r\n");
    assert_eq!(
        c.cmd(&["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]),
        "+OK\r\n"
    );
    assert_eq!(c.cmd(&["CLIENT", "SETINFO", "lib-ver", "8.1.0"]), "+OK\r\n");
    assert!(
        c.cmd(&["CLIENT", "SETINFO", "nope", "x"])
            .starts_with("-ERR Unrecognized option")
    );
    let id: u64 = c.cmd(&["CLIENT", "ID"])[1..].trim().parse().unwrap();
    let info = c.cmd(&["CLIENT", "INFO"]);
    for needle in [
        format!("id={id} "),
        "name=tester ".into(),
        "lib-name=redis-py".into(),
        "lib-ver=8.1.0".into(),
        "cmd=client|info".into(),
        "resp=2".into(),
    ] {
        assert!(info.contains(&needle), "{needle} not in {info}");
    }

    let mut sub = RawConn::connect(a, CMD_TIMEOUT);
    sub.cmd(&["HELLO", "3"]);
    assert!(sub.cmd(&["SUBSCRIBE", "+sdown"]).starts_with(">3\r\n"));
    // RESP3 allows any command while subscribed.
    assert!(sub.cmd(&["SENTINEL", "MASTERS"]).starts_with("*1\r\n%"));
    // The start-up PING's connection may still be listed for a moment
    // after the harness closed it (picket sees the EOF asynchronously), so
    // wait for the list to settle on the two connections of this test.
    let mut list = String::new();
    wait_for(
        "CLIENT LIST to show this test's two clients",
        Duration::from_secs(5),
        || {
            list = c.cmd(&["CLIENT", "LIST"]);
            list.lines().filter(|l| l.starts_with("id=")).count() == 2
        },
    );
    assert!(
        list.contains("name=tester ") && list.contains("sub=1 "),
        "{list}"
    );
    let pubsub = c.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]);
    assert!(
        pubsub.contains("sub=1 ") && pubsub.contains("resp=3"),
        "{pubsub}"
    );
    assert!(!pubsub.contains("name=tester"), "{pubsub}");
    // Kill the subscriber by type; the caller survives (SKIPME yes).
    assert_eq!(c.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]), ":1\r\n");
    assert!(sub.closed_within(Duration::from_secs(5)));

    // By id, and by address (the old form).
    let mut victim = RawConn::connect(a, CMD_TIMEOUT);
    let vid = victim.cmd(&["CLIENT", "ID"])[1..].trim().to_string();
    assert_eq!(c.cmd(&["CLIENT", "KILL", "ID", &vid]), ":1\r\n");
    assert!(victim.closed_within(Duration::from_secs(5)));
    let mut victim = RawConn::connect(a, CMD_TIMEOUT);
    let vinfo = victim.cmd(&["CLIENT", "INFO"]);
    let vaddr = vinfo
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("addr="))
        .unwrap()
        .to_string();
    assert_eq!(c.cmd(&["CLIENT", "KILL", &vaddr]), "+OK\r\n");
    assert!(victim.closed_within(Duration::from_secs(5)));
    assert_eq!(
        c.cmd(&["CLIENT", "KILL", &vaddr]),
        "-ERR No such client\r\n"
    );

    // RESET leaves subscribed mode and RESP3.
    let mut r = RawConn::connect(a, CMD_TIMEOUT);
    r.cmd(&["SUBSCRIBE", "x"]);
    assert!(r.cmd(&["ROLE"]).starts_with("-ERR Can't execute 'role'"));
    assert_eq!(r.cmd(&["RESET"]), "+RESET\r\n");
    assert!(r.cmd(&["ROLE"]).starts_with("*2\r\n$8\r\nsentinel\r\n"));

    // QUIT answers, then closes.
    assert_eq!(c.cmd(&["QUIT"]), "+OK\r\n");
    assert!(c.closed_within(Duration::from_secs(5)));
}

/// Without `enable_fault_injection`, neither form of SIMULATE-FAILURE arms
/// anything: a client cannot make a production daemon exit.
#[test]
fn fault_injection_is_off_by_default() {
    let redis = RedisServer::start_fresh(RedisOpts::default());
    let d = start_cluster(redis.addr(), &ClusterOpts::default()).remove(0);
    let a = d.resp;
    let flags = || {
        let info = redis_cmd(a, &["INFO", "sentinel"]).unwrap();
        info_value(info.as_str().unwrap(), "sentinel_simulate_failure_flags").unwrap()
    };
    for args in [
        &["SENTINEL", "SIMULATE-FAILURE", "crash-after-election"][..],
        &["PICKET", "SIMULATE-FAILURE", "crash-after-promotion"][..],
    ] {
        let r = redis_cmd(a, args).unwrap();
        assert!(
            r.as_error()
                .is_some_and(|e| e.contains("fault injection is disabled")
                    && e.contains("enable_fault_injection")),
            "{args:?}: {r:?}"
        );
        assert_eq!(flags(), "0", "{args:?} armed a crash");
    }
    // HELP still lists the modes, as Sentinel's does.
    assert_eq!(
        redis_cmd(a, &["SENTINEL", "SIMULATE-FAILURE", "HELP"]).unwrap(),
        Reply::Array(vec![
            Reply::Bulk(b"crash-after-election".to_vec()),
            Reply::Bulk(b"crash-after-promotion".to_vec())
        ])
    );
}

#[test]
fn sentinel_failover_votes_and_simulated_failures() {
    let topo = Topology::master_with_replicas(1);
    let d = start_cluster(
        topo.master.addr(),
        &ClusterOpts {
            daemon_extra: "enable_fault_injection = true\n".into(),
            ..Default::default()
        },
    )
    .remove(0);
    let a = d.resp;
    let old = topo.master.addr().to_string();
    let replica = topo.replicas[0].addr().to_string();
    wait_for("picket sees the replica", Duration::from_secs(20), || {
        matches!(redis_cmd(a, &["SENTINEL", "REPLICAS", NAME]),
            Ok(Reply::Array(v)) if v.len() == 1 && field(&v[0], "master-link-status").as_deref() == Some("ok"))
    });

    // A RESP3 subscriber gets +switch-master as a push frame.
    let mut sub = RawConn::connect(a, Duration::from_secs(30));
    sub.cmd(&["HELLO", "3"]);
    sub.cmd(&["SUBSCRIBE", "+switch-master"]);

    assert_eq!(
        redis_cmd(a, &["SENTINEL", "FAILOVER", "nope"]).unwrap(),
        Reply::Error("ERR No such master with that name".into())
    );
    assert!(
        redis_cmd(a, &["SENTINEL", "FAILOVER", NAME])
            .unwrap()
            .is_ok()
    );
    wait_for("the switchover completes", Duration::from_secs(30), || {
        master_of(a) == replica
    });
    let msg = String::from_utf8(sub.read().unwrap()).unwrap();
    let payload = format!(
        "{NAME} {} {}",
        old.replace(':', " "),
        replica.replace(':', " ")
    );
    assert_eq!(
        msg,
        format!(
            ">3\r\n$7\r\nmessage\r\n$14\r\n+switch-master\r\n${}\r\n{payload}\r\n",
            payload.len()
        )
    );
    wait_for(
        "the old master follows the new one",
        Duration::from_secs(30),
        || replica_linked_to(&topo.master, topo.replicas[0].addr()),
    );

    // Sentinel-style vote requests by address: the vote is granted and
    // remembered; a second candidate in the same epoch gets the first one.
    let (ip, port) = replica.rsplit_once(':').unwrap();
    let ask = |cand: &str, epoch: &str| {
        redis_cmd(
            a,
            &["SENTINEL", "IS-MASTER-DOWN-BY-ADDR", ip, port, epoch, cand],
        )
        .unwrap()
    };
    let first = ask("candidate-a", "1000");
    assert_eq!(
        first,
        Reply::Array(vec![
            Reply::Int(0),
            Reply::Bulk(b"candidate-a".to_vec()),
            Reply::Int(1000)
        ])
    );
    assert_eq!(ask("candidate-b", "1000"), first);
    assert_eq!(
        redis_cmd(
            a,
            &["SENTINEL", "IS-PRIMARY-DOWN-BY-ADDR", ip, port, "0", "*"]
        )
        .unwrap(),
        first
    );
    // An address no group has: not down, no vote.
    assert_eq!(
        redis_cmd(
            a,
            &[
                "SENTINEL",
                "IS-MASTER-DOWN-BY-ADDR",
                "127.9.9.9",
                "1",
                "0",
                "*"
            ]
        )
        .unwrap(),
        Reply::Array(vec![
            Reply::Int(0),
            Reply::Bulk(b"*".to_vec()),
            Reply::Int(0)
        ])
    );

    // SIMULATE-FAILURE sets the flags INFO reports (no failover follows).
    let flags = || {
        let info = redis_cmd(a, &["INFO", "sentinel"]).unwrap();
        info_value(info.as_str().unwrap(), "sentinel_simulate_failure_flags").unwrap()
    };
    assert_eq!(flags(), "0");
    assert!(
        redis_cmd(a, &["SENTINEL", "SIMULATE-FAILURE", "crash-after-election"])
            .unwrap()
            .is_ok()
    );
    assert_eq!(flags(), "1");
    assert!(
        redis_cmd(
            a,
            &[
                "SENTINEL",
                "SIMULATE-FAILURE",
                "CRASH-AFTER-PROMOTION",
                "crash-after-election"
            ]
        )
        .unwrap()
        .is_ok()
    );
    assert_eq!(flags(), "3");
    assert!(
        redis_cmd(a, &["SENTINEL", "SIMULATE-FAILURE", "bogus"])
            .unwrap()
            .as_error()
            .is_some()
    );
    assert_eq!(flags(), "3", "a bad argument changes nothing");
    assert!(
        redis_cmd(
            a,
            &["SENTINEL", "SIMULATE-FAILURE", "crash-after-promotion"]
        )
        .unwrap()
        .is_ok()
    );
    assert_eq!(flags(), "2");

    // Valkey aliases (once the switchover has ended).
    wait_for("the switchover ends", Duration::from_secs(30), || {
        field(
            &redis_cmd(a, &["SENTINEL", "MASTER", NAME]).unwrap(),
            "flags",
        )
        .as_deref()
            == Some("master")
    });
    let m = redis_cmd(a, &["SENTINEL", "PRIMARY", NAME]).unwrap();
    assert_eq!(field(&m, "ip").unwrap(), ip);
    assert_eq!(field(&m, "flags").unwrap(), "master");
    assert!(
        matches!(redis_cmd(a, &["SENTINEL", "PRIMARIES"]).unwrap(), Reply::Array(v) if v.len() == 1)
    );
    assert_eq!(
        redis_cmd(a, &["SENTINEL", "GET-PRIMARY-ADDR-BY-NAME", NAME]).unwrap(),
        Reply::Array(vec![
            Reply::Bulk(ip.as_bytes().to_vec()),
            Reply::Bulk(port.as_bytes().to_vec())
        ])
    );
    assert!(
        redis_cmd(a, &["SENTINEL", "MYID"])
            .unwrap()
            .as_str()
            .is_some_and(|s| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())),
        "SENTINEL MYID is a 40-hex run id as in Sentinel, not the daemon's name"
    );
    let help = redis_cmd(a, &["SENTINEL", "HELP"]).unwrap();
    assert!(
        matches!(&help, Reply::Array(v) if v[0].as_str().is_some_and(|l| l.starts_with("SENTINEL <subcommand>")))
    );
}

#[test]
fn a_restarted_daemon_never_answers_noquorum_while_its_peers_are_up() {
    let topo = Topology::master_with_replicas(1);
    let mut d = start_cluster(
        topo.master.addr(),
        &ClusterOpts {
            daemons: 3,
            quorum: 2,
            ..Default::default()
        },
    );
    let ckquorum = |a: SocketAddr| redis_cmd(a, &["SENTINEL", "CKQUORUM", NAME]);
    for x in &d {
        wait_for(
            "CKQUORUM OK before the restart",
            Duration::from_secs(20),
            || ckquorum(x.resp).is_ok_and(|r| r.as_str().is_some_and(|s| s.starts_with("OK"))),
        );
    }
    let a = d[0].resp;
    d[0].proc.restart();
    // From the first accepted connection on, every answer counts.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut conn = loop {
        if let Ok(c) = RespConn::connect(a, Duration::from_millis(200)) {
            break c;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the restarted daemon never accepted a connection"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let (mut answers, mut oks) = (0, 0);
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        let r = conn.cmd(&["SENTINEL", "CKQUORUM", NAME]).unwrap();
        let text = r
            .as_str()
            .or_else(|| r.as_error())
            .unwrap_or_default()
            .to_string();
        assert!(
            !text.contains("NOQUORUM"),
            "answer {answers} after the restart: {text}"
        );
        answers += 1;
        oks += usize::from(text.starts_with("OK"));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(answers > 20 && oks > 0, "{answers} answers, {oks} OK");
}

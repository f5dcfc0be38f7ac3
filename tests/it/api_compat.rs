//! picket's Sentinel API side by side with a real `redis-sentinel` watching
//! the same Redis topology: `redis-cli` replies must have the same shapes
//! (types, nesting, field names and their order, flags vocabulary) in RESP2
//! and RESP3; values may differ. Pub/sub confirmations are compared byte
//! for byte.

use picket_harness::api_util;

use std::net::SocketAddr;
use std::time::Duration;

use api_util::*;
use picket_harness::*;

const NAME: &str = "mymaster";

struct Setup {
    topo: Topology,
    real: Vec<RealSentinel>,
    picket: Vec<Daemon>,
}

fn stable(addr: SocketAddr, flags: &str) -> bool {
    let Ok(m) = redis_cmd(addr, &["SENTINEL", "MASTER", NAME]) else {
        return false;
    };
    if !matches!(m, Reply::Array(_)) {
        return false;
    }
    let sentinels_ok = redis_cmd(addr, &["SENTINEL", "SENTINELS", NAME]).is_ok_and(|s| {
        matches!(&s, Reply::Array(v) if v.len() == 1 && field(&v[0], "flags").as_deref() == Some(flags))
    });
    let replicas_ok = redis_cmd(addr, &["SENTINEL", "REPLICAS", NAME]).is_ok_and(|s| {
        matches!(&s, Reply::Array(v) if v.len() == 2
            && v.iter().all(|r| field(r, "flags").as_deref() == Some("slave")
                && field(r, "master-link-status").as_deref() == Some("ok")))
    });
    field(&m, "num-slaves").as_deref() == Some("2")
        && field(&m, "num-other-sentinels").as_deref() == Some("1")
        && field(&m, "flags").as_deref() == Some("master")
        && sentinels_ok
        && replicas_ok
}

fn setup() -> Setup {
    let topo = Topology::master_with_replicas(2);
    let master = topo.master.addr();
    let real = vec![
        RealSentinel::start(NAME, master),
        RealSentinel::start(NAME, master),
    ];
    let picket = start_cluster(
        master,
        &ClusterOpts {
            daemons: 2,
            ..Default::default()
        },
    );
    for s in &real {
        wait_for(
            &format!("redis-sentinel {} sees both replicas and its peer", s.addr),
            Duration::from_secs(30),
            || stable(s.addr, "sentinel"),
        );
    }
    for d in &picket {
        wait_for(
            &format!("picket {} sees both replicas and its peer", d.resp),
            Duration::from_secs(30),
            || stable(d.resp, "sentinel"),
        );
    }
    Setup { topo, real, picket }
}

/// The commands whose reply shapes must match.
fn commands(master: SocketAddr) -> Vec<Vec<String>> {
    let ip = master.ip().to_string();
    let port = master.port().to_string();
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        v(&["PING"]),
        v(&["PING", "hello"]),
        v(&["PING", "a", "b"]),
        v(&["ROLE"]),
        v(&["SENTINEL", "MASTERS"]),
        v(&["SENTINEL", "MASTER", NAME]),
        v(&["SENTINEL", "MASTER", "nope"]),
        v(&["SENTINEL", "MASTER"]),
        v(&["SENTINEL", "REPLICAS", NAME]),
        v(&["SENTINEL", "SLAVES", NAME]),
        v(&["SENTINEL", "REPLICAS", "nope"]),
        v(&["SENTINEL", "SENTINELS", NAME]),
        v(&["SENTINEL", "SENTINELS", "nope"]),
        v(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", NAME]),
        v(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "nope"]),
        v(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME"]),
        v(&["SENTINEL", "CKQUORUM", NAME]),
        v(&["SENTINEL", "CKQUORUM", "nope"]),
        v(&["SENTINEL", "MYID"]),
        vec![
            "SENTINEL".into(),
            "IS-MASTER-DOWN-BY-ADDR".into(),
            ip.clone(),
            port.clone(),
            "0".into(),
            "*".into(),
        ],
        v(&[
            "SENTINEL",
            "IS-MASTER-DOWN-BY-ADDR",
            "127.9.9.9",
            "1",
            "0",
            "*",
        ]),
        vec![
            "SENTINEL".into(),
            "IS-MASTER-DOWN-BY-ADDR".into(),
            ip,
            "x".into(),
            "0".into(),
            "*".into(),
        ],
        v(&["SENTINEL", "IS-MASTER-DOWN-BY-ADDR", "1"]),
        v(&["SENTINEL", "SIMULATE-FAILURE", "HELP"]),
        v(&["SENTINEL", "SIMULATE-FAILURE", "nope"]),
        v(&["SENTINEL", "SIMULATE-FAILURE"]),
        v(&["SENTINEL", "RESET", "no-such-*"]),
        v(&["SENTINEL", "FAILOVER", "nope"]),
        v(&["SENTINEL", "NOPE"]),
        v(&["SENTINEL"]),
        v(&["CLIENT", "ID"]),
        v(&["CLIENT", "GETNAME"]),
        v(&["CLIENT", "SETNAME", "x"]),
        v(&["CLIENT", "SETNAME", "a b"]),
        v(&["CLIENT", "NOPE"]),
        v(&["CLIENT", "KILL", "127.9.9.9:1"]),
        v(&["CLIENT", "KILL", "ADDR", "127.9.9.9:1"]),
        v(&["COMMAND", "COUNT"]),
        v(&["COMMAND", "INFO", "ping", "nope"]),
        v(&["COMMAND", "INFO", "subscribe"]),
        v(&["COMMAND", "DOCS", "nope"]),
        v(&["HELLO", "3"]),
        v(&["HELLO", "2"]),
        v(&["HELLO", "4"]),
        v(&["AUTH", "x"]),
        v(&["AUTH", "a", "b"]),
        v(&["SET", "a", "b"]),
        v(&["REPLICAOF", "no", "one"]),
    ]
}

fn compare_all(s: &Setup, resp3: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let extra: Vec<&str> = if resp3 {
        vec!["-3", "--no-raw"]
    } else {
        vec!["--no-raw"]
    };
    for cmd in commands(s.topo.master.addr()) {
        let args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let real = cli(s.real[0].addr, &extra, &args);
        let ours = cli(s.picket[0].resp, &extra, &args);
        let (rs, os) = (shape(&real), shape(&ours));
        if rs != os {
            problems.push(format!(
                "RESP{} {args:?}:\n--- redis-sentinel ---\n{real}\n--- picket ---\n{ours}",
                if resp3 { 3 } else { 2 }
            ));
        }
        assert!(
            !ours.trim().is_empty() || real.trim().is_empty(),
            "{args:?}: picket gave nothing"
        );
    }
    problems
}

#[test]
fn reply_shapes_match_redis_sentinel() {
    let s = setup();
    let mut problems = compare_all(&s, false);
    problems.extend(compare_all(&s, true));
    assert!(
        problems.is_empty(),
        "{} shape differences:\n{}",
        problems.len(),
        problems.join("\n\n")
    );

    // Field names and their order, flags: the same in every map.
    for what in ["MASTERS", "REPLICAS", "SENTINELS"] {
        let args: Vec<&str> = if what == "MASTERS" {
            vec!["SENTINEL", what]
        } else {
            vec!["SENTINEL", what, NAME]
        };
        let real = redis_cmd(s.real[0].addr, &args).unwrap();
        let ours = redis_cmd(s.picket[0].resp, &args).unwrap();
        let (Reply::Array(real), Reply::Array(ours)) = (real, ours) else {
            panic!("{what}: not arrays")
        };
        assert_eq!(real.len(), ours.len(), "{what}: number of entries");
        for (r, o) in real.iter().zip(&ours) {
            let rk: Vec<String> = pairs(r).into_iter().map(|(k, _)| k).collect();
            let ok: Vec<String> = pairs(o).into_iter().map(|(k, _)| k).collect();
            assert_eq!(rk, ok, "{what}: field names and order");
            let (rf, of) = (field(r, "flags").unwrap(), field(o, "flags").unwrap());
            check_flags(&rf);
            check_flags(&of);
            assert_eq!(rf, of, "{what}: flags in the same state");
            // Numbers are bulk strings holding integers on both.
            for (k, v) in pairs(o) {
                if matches!(
                    k.as_str(),
                    "port"
                        | "quorum"
                        | "num-slaves"
                        | "num-other-sentinels"
                        | "config-epoch"
                        | "down-after-milliseconds"
                        | "last-ok-ping-reply"
                        | "slave-repl-offset"
                ) {
                    assert!(
                        v.parse::<i64>().is_ok(),
                        "{what}: {k}={v:?} is not a number"
                    );
                }
            }
        }
    }
    // The same replicas (order aside) and the same master address.
    let addrs = |a: SocketAddr| {
        let Reply::Array(v) = redis_cmd(a, &["SENTINEL", "REPLICAS", NAME]).unwrap() else {
            panic!()
        };
        let mut names: Vec<String> = v.iter().map(|r| field(r, "name").unwrap()).collect();
        names.sort();
        names
    };
    assert_eq!(addrs(s.real[0].addr), addrs(s.picket[0].resp));
    assert_eq!(
        redis_cmd(
            s.real[0].addr,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", NAME]
        )
        .unwrap(),
        redis_cmd(
            s.picket[0].resp,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", NAME]
        )
        .unwrap()
    );
    // Peers see each other by id: picket's sentinel entry names the other daemon.
    let Reply::Array(peers) =
        redis_cmd(s.picket[0].resp, &["SENTINEL", "SENTINELS", NAME]).unwrap()
    else {
        panic!()
    };
    let myid_1 = redis_cmd(s.picket[1].resp, &["SENTINEL", "MYID"]).unwrap();
    assert_eq!(field(&peers[0], "runid").as_deref(), myid_1.as_str());
    assert_eq!(
        field(&peers[0], "port").unwrap(),
        s.picket[1].resp.port().to_string()
    );
}

/// The keys of an INFO text, per section.
fn info_keys(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            if l.starts_with('#') {
                l.to_string()
            } else {
                let (k, v) = l.split_once(':').unwrap_or((l, ""));
                if k.starts_with("master") && v.contains("name=") {
                    // masterN:name=..,status=..: keep the sub-keys.
                    let sub: Vec<&str> = v
                        .split(',')
                        .map(|kv| kv.split('=').next().unwrap())
                        .collect();
                    format!("{k}:{}", sub.join(","))
                } else {
                    k.to_string()
                }
            }
        })
        .collect()
}

#[test]
fn info_role_and_pubsub_match_redis_sentinel() {
    let s = setup();
    let real = s.real[0].addr;
    let ours = s.picket[0].resp;
    let info = |a: SocketAddr, section: &[&str]| {
        let mut args = vec!["INFO"];
        args.extend_from_slice(section);
        redis_cmd(a, &args).unwrap().as_str().unwrap().to_string()
    };
    // The Sentinel section: same keys in the same order, same values where
    // the state is the same.
    let (rs, os) = (info(real, &["sentinel"]), info(ours, &["sentinel"]));
    assert_eq!(info_keys(&rs), info_keys(&os), "{rs}\n{os}");
    for key in [
        "sentinel_masters",
        "sentinel_tilt",
        "sentinel_tilt_since_seconds",
    ] {
        assert_eq!(info_value(&rs, key), info_value(&os, key), "{key}");
    }
    let m = |t: &str| info_value(t, "master0").unwrap();
    assert_eq!(m(&rs), m(&os), "master0 line");
    // Sections: the same headers for every selector.
    for sel in [
        vec![],
        vec!["all"],
        vec!["server", "sentinel"],
        vec!["nope"],
        vec!["clients"],
    ] {
        let headers = |t: &str| {
            t.lines()
                .filter(|l| l.starts_with('#'))
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            headers(&info(real, &sel)),
            headers(&info(ours, &sel)),
            "INFO {sel:?}"
        );
    }
    let server = info(ours, &["server"]);
    assert_eq!(
        info_value(&server, "redis_mode").as_deref(),
        Some("sentinel")
    );
    assert_eq!(
        info_value(&server, "tcp_port"),
        Some(ours.port().to_string())
    );
    assert_eq!(info_value(&server, "run_id").map(|r| r.len()), Some(40));
    // Every key of real Sentinel's server and clients sections that
    // clients might read is there too.
    for key in [
        "redis_version",
        "redis_mode",
        "process_id",
        "run_id",
        "tcp_port",
        "uptime_in_seconds",
    ] {
        assert!(
            info_value(&server, key).is_some(),
            "INFO server lacks {key}"
        );
    }
    assert!(
        info_value(&info(ours, &["clients"]), "connected_clients")
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n >= 1)
    );

    // Pub/sub confirmations and subscribed-mode errors, byte for byte.
    let script: Vec<Vec<&str>> = vec![
        vec!["UNSUBSCRIBE"],
        vec!["SUBSCRIBE", "+switch-master", "+sdown"],
        vec!["PING"],
        vec!["PING", "x"],
        vec!["ROLE"],
        vec!["SENTINEL", "MASTERS"],
        vec!["PSUBSCRIBE", "*"],
        vec!["UNSUBSCRIBE", "+sdown", "nope"],
        vec!["PUNSUBSCRIBE"],
        vec!["UNSUBSCRIBE"],
        vec!["PING"],
    ];
    let run = |a: SocketAddr, hello3: bool| {
        let mut c = RawConn::connect(a, CMD_TIMEOUT);
        let mut out = Vec::new();
        if hello3 {
            c.cmd(&["HELLO", "3"]);
        }
        for cmd in &script {
            // Commands with several confirmations: one per channel.
            let replies = match cmd[0] {
                "SUBSCRIBE" | "PSUBSCRIBE" => cmd.len() - 1,
                "UNSUBSCRIBE" if cmd.len() > 1 => cmd.len() - 1,
                _ => 1,
            };
            let mut r = c.cmd_n(cmd, replies);
            if cmd[0] == "SENTINEL" && !r[0].starts_with('-') {
                // Only the type matters (the values differ).
                r = r.into_iter().map(|x| x[..1].to_string()).collect();
            }
            out.push(format!("{cmd:?} -> {r:?}"));
        }
        out
    };
    for hello3 in [false, true] {
        assert_eq!(run(real, hello3), run(ours, hello3), "RESP3: {hello3}");
    }

    // A real event: +reset-master, delivered to a pattern subscriber as a
    // RESP2 pmessage and as a RESP3 push, with Sentinel's payload.
    let mut got = Vec::new();
    for a in [real, ours] {
        let mut subs = Vec::new();
        for hello3 in [false, true] {
            let mut c = RawConn::connect(a, CMD_TIMEOUT);
            if hello3 {
                c.cmd(&["HELLO", "3"]);
            }
            c.cmd(&["PSUBSCRIBE", "+reset-*"]);
            subs.push(c);
        }
        assert_eq!(
            redis_cmd(a, &["SENTINEL", "RESET", NAME]).unwrap(),
            Reply::Int(1)
        );
        got.push(
            subs.iter_mut()
                .map(|c| String::from_utf8_lossy(&c.read().unwrap()).into_owned())
                .collect::<Vec<_>>(),
        );
    }
    let m = s.topo.master.addr();
    let payload = format!("master {NAME} {} {}", m.ip(), m.port());
    assert_eq!(
        got[1][0],
        format!(
            "*4\r\n$8\r\npmessage\r\n$8\r\n+reset-*\r\n$13\r\n+reset-master\r\n${}\r\n{payload}\r\n",
            payload.len()
        )
    );
    assert!(got[1][1].starts_with(">4\r\n"), "{:?}", got[1][1]);
    assert_eq!(got[0], got[1], "redis-sentinel vs picket");
}

/// The `SENTINEL REPLICAS` entry of `addr` at `at`, once listed.
fn replica_entry(at: SocketAddr, addr: SocketAddr) -> Option<Reply> {
    let Ok(Reply::Array(v)) = redis_cmd(at, &["SENTINEL", "REPLICAS", NAME]) else {
        return None;
    };
    v.into_iter().find(|r| {
        field(r, "ip").as_deref() == Some(addr.ip().to_string().as_str())
            && field(r, "port").as_deref() == Some(addr.port().to_string().as_str())
    })
}

fn master_of(at: SocketAddr) -> Option<SocketAddr> {
    match redis_cmd(at, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", NAME]).ok()? {
        Reply::Array(v) if v.len() == 2 => format!("{}:{}", v[0].as_str()?, v[1].as_str()?)
            .parse()
            .ok(),
        _ => None,
    }
}

#[test]
fn a_dead_old_master_after_a_failover_and_the_ids_look_as_in_redis_sentinel() {
    // Two topologies, one watched by two redis-sentinels and one by two
    // picket daemons, both failed over by a kill -9 of their master.
    let mut real_topo = Topology::master_with_replicas(1);
    let mut our_topo = Topology::master_with_replicas(1);
    let (real_old, our_old) = (real_topo.master.addr(), our_topo.master.addr());
    let real = [
        RealSentinel::start(NAME, real_old),
        RealSentinel::start(NAME, real_old),
    ];
    let picket = start_cluster(
        our_old,
        &ClusterOpts {
            daemons: 2,
            ..Default::default()
        },
    );
    let (ra, oa) = (real[0].addr, picket[0].resp);
    let peer_listed = |at: SocketAddr| matches!(redis_cmd(at, &["SENTINEL", "SENTINELS", NAME]), Ok(Reply::Array(v)) if v.len() == 1);
    for at in [ra, oa] {
        wait_for(
            &format!("{at} sees its replica and its peer"),
            Duration::from_secs(30),
            || {
                peer_listed(at)
                    && replica_entry(at, real_topo.replicas[0].addr())
                        .or_else(|| replica_entry(at, our_topo.replicas[0].addr()))
                        .is_some()
            },
        );
    }

    // The ids: 40 hex digits on both sides, in MYID and in the peer list.
    let hex40 = |s: &str| s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit());
    for at in [ra, oa] {
        let myid = redis_cmd(at, &["SENTINEL", "MYID"]).unwrap();
        assert!(myid.as_str().is_some_and(hex40), "{at}: MYID {myid:?}");
        let Reply::Array(peers) = redis_cmd(at, &["SENTINEL", "SENTINELS", NAME]).unwrap() else {
            panic!("{at}: SENTINEL SENTINELS is not an array");
        };
        let runid = field(&peers[0], "runid").unwrap_or_default();
        assert!(hex40(&runid), "{at}: peer runid {runid:?}");
    }

    real_topo.master.kill9();
    our_topo.master.kill9();
    for (at, old) in [(ra, real_old), (oa, our_old)] {
        wait_for(
            &format!("{at} failed over"),
            Duration::from_secs(40),
            || master_of(at).is_some_and(|m| m != old),
        );
        wait_for(
            &format!("{at} lists the old master {old} as a replica, down"),
            Duration::from_secs(20),
            || {
                replica_entry(at, old)
                    .and_then(|r| field(&r, "flags"))
                    .is_some_and(|f| f.contains("s_down"))
            },
        );
    }
    // Sentinel converts the dead old master into a replica entry of the
    // new master: these fields say so, whatever it last reported itself.
    let real_entry = replica_entry(ra, real_old).unwrap();
    let our_entry = replica_entry(oa, our_old).unwrap();
    let keys = |r: &Reply| pairs(r).into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(keys(&real_entry), keys(&our_entry), "field names and order");
    for key in [
        "flags",
        "role-reported",
        "master-link-status",
        "master-host",
        "master-port",
        "slave-priority",
        "slave-repl-offset",
        "replica-announced",
    ] {
        assert_eq!(
            field(&real_entry, key),
            field(&our_entry, key),
            "{key} of the converted old master\nredis-sentinel: {real_entry:?}\npicket: {our_entry:?}"
        );
    }
}

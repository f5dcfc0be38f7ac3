//! Pipelined requests and the listen backlog on a real picket process:
//! every request of a pipeline answered, in order, whether the pipeline
//! comes in one write, cut in the middle of a request, or larger than the
//! output budget while the client does not read; redis-py's pipelines
//! (RESP2 and RESP3) get their replies in order; `daemon.tcp_backlog`
//! reaches the listening socket (as `ss` shows it).

use picket_harness::api_util;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use api_util::*;
use picket_harness::*;

const NAME: &str = "mymaster";

fn daemon(master: SocketAddr, extra: &str) -> Daemon {
    let opts = ClusterOpts {
        group: NAME.into(),
        daemon_extra: extra.into(),
        ..Default::default()
    };
    start_cluster(master, &opts).remove(0)
}

/// Read exactly `n` bytes (or fail after 30 s).
fn read_exact_within(s: &mut TcpStream, n: usize) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut out = vec![0u8; n];
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = 0;
    while got < n {
        assert!(Instant::now() < deadline, "only {got} of {n} bytes in 30 s");
        match s.read(&mut out[got..]) {
            Ok(0) => panic!("closed after {got} of {n} bytes"),
            Ok(k) => got += k,
            Err(e) => panic!("read after {got} of {n} bytes: {e}"),
        }
    }
    out
}

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let redis = RedisServer::start_fresh(RedisOpts::default());
    let d = daemon(redis.addr(), "");
    let master = redis.addr();
    let addr_reply = format!(
        "*2\r\n{}{}",
        bulk(&master.ip().to_string()),
        bulk(&master.port().to_string())
    );
    // 3,000 requests of four kinds, all in one write.
    let mut req = Vec::new();
    let mut want = String::new();
    for i in 0..3000 {
        match i % 4 {
            0 => {
                let m = format!("m{i}");
                req.extend(encode_cmd(&["PING", &m]));
                want.push_str(&bulk(&m));
            }
            1 => {
                req.extend(encode_cmd(&["SENTINEL", "get-master-addr-by-name", NAME]));
                want.push_str(&addr_reply);
            }
            2 => {
                req.extend(encode_cmd(&[
                    "sentinel",
                    "GET-MASTER-ADDR-BY-NAME",
                    "nosuch",
                ]));
                want.push_str("*-1\r\n");
            }
            _ => {
                let n = format!("n{i}");
                req.extend(encode_cmd(&["CLIENT", "SETNAME", &n]));
                req.extend(encode_cmd(&["CLIENT", "GETNAME"]));
                want.push_str("+OK\r\n");
                want.push_str(&bulk(&n));
            }
        }
    }
    let mut s = TcpStream::connect(d.resp).unwrap();
    s.write_all(&req).unwrap();
    let got = read_exact_within(&mut s, want.len());
    assert_eq!(String::from_utf8_lossy(&got), want);

    // Cut inside a request: what is complete is answered at once, the
    // rest when it arrives.
    let two = [encode_cmd(&["PING", "a"]), encode_cmd(&["PING", "bb"])].concat();
    let cut = two.len() - 5;
    s.write_all(&two[..cut]).unwrap();
    assert_eq!(read_exact_within(&mut s, 7), b"$1\r\na\r\n");
    s.write_all(&two[cut..]).unwrap();
    assert_eq!(read_exact_within(&mut s, 8), b"$2\r\nbb\r\n");
    // Nothing more was sent.
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut extra = [0u8; 16];
    assert!(s.read(&mut extra).is_err(), "an extra reply");
}

#[test]
fn a_pipeline_larger_than_the_output_budget_is_answered_while_not_read() {
    let redis = RedisServer::start_fresh(RedisOpts::default());
    let d = daemon(redis.addr(), "");
    let mut probe = RawConn::connect(d.resp, CMD_TIMEOUT);
    let one = probe.cmd(&["INFO"]).len();
    // Far more reply bytes than the 8 MiB a connection may hold unsent:
    // the daemon stops reading, the client writes everything, then reads.
    let n = (24 * 1024 * 1024) / one + 1;
    let req = encode_cmd(&["INFO"]).repeat(n);
    let mut s = TcpStream::connect(d.resp).unwrap();
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&req).map(|()| n));
    // Every reply is a bulk string of about `one` bytes: count them.
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    let mut replies = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while replies < n {
        assert!(Instant::now() < deadline, "{replies} of {n} replies");
        let k = s.read(&mut chunk).expect("read");
        assert!(k > 0, "closed after {replies} of {n} replies");
        buf.extend_from_slice(&chunk[..k]);
        // Consume complete bulk strings.
        while let Some(lf) = buf.iter().position(|&b| b == b'\n') {
            assert_eq!(buf[0], b'$', "not a bulk string");
            let len: usize = std::str::from_utf8(&buf[1..lf - 1])
                .unwrap()
                .parse()
                .unwrap();
            if buf.len() < lf + 1 + len + 2 {
                break;
            }
            assert!(buf[lf + 1..].starts_with(b"# Server"));
            buf.drain(..lf + 1 + len + 2);
            replies += 1;
        }
    }
    assert_eq!(writer.join().unwrap().unwrap(), n);
    assert!(buf.is_empty());
    // Still served afterwards.
    assert_eq!(probe.cmd(&["PING"]), "+PONG\r\n");
}

#[test]
fn redis_py_pipelines_get_their_replies_in_order() {
    let check = Command::new("python3")
        .args(["-c", "import redis"])
        .output()
        .unwrap_or_else(|e| panic!("python3 is needed for this test: {e}"));
    assert!(
        check.status.success(),
        "the redis package for python3 is needed (pip install redis)"
    );
    let redis = RedisServer::start_fresh(RedisOpts::default());
    let d = daemon(redis.addr(), "");
    let script = r#"
import sys, redis
host, port, master = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for proto in (2, 3):
    r = redis.Redis(host=host, port=port, protocol=proto, decode_responses=True)
    p = r.pipeline(transaction=False)
    n = 500
    for i in range(n):
        p.client_setname(f"c{i}")
        p.client_getname()
        p.sentinel_get_master_addr_by_name("mymaster" if i % 2 else "nosuch")
    res = p.execute()
    assert len(res) == 3 * n, len(res)
    for i in range(n):
        ok, name, addr = res[3 * i : 3 * i + 3]
        assert ok is True, (i, ok)
        assert name == f"c{i}", (i, name)
        if i % 2:
            assert f"{addr[0]}:{addr[1]}" == master, (i, addr)
        else:
            assert addr is None, (i, addr)
    print(f"resp{proto} ok {len(res)}")
"#;
    let out = Command::new("python3")
        .args([
            "-c",
            script,
            &d.resp.ip().to_string(),
            &d.resp.port().to_string(),
            &redis.addr().to_string(),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, "resp2 ok 1500\nresp3 ok 1500\n");
}

/// The accept queue length of the socket listening on `addr`, as `ss`
/// shows it (Send-Q of a listening socket).
fn backlog(addr: SocketAddr) -> u32 {
    let out = Command::new("ss")
        .args(["-ltnH", &format!("sport = :{}", addr.port())])
        .output()
        .unwrap_or_else(|e| panic!("ss (iproute2) is needed for this test: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains(&addr.to_string()))
        .unwrap_or_else(|| panic!("{addr} not listed by ss: {text}"));
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[test]
fn the_listen_backlog_is_configured() {
    let redis = RedisServer::start_fresh(RedisOpts::default());
    let default = daemon(redis.addr(), "");
    // 4096, as far as the kernel allows.
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096);
    assert_eq!(backlog(default.resp), somaxconn.min(4096));
    let set = daemon(redis.addr(), "tcp_backlog = 300\n");
    assert_eq!(backlog(set.resp), 300);
    // The HTTP listener keeps the standard library's.
    assert_eq!(backlog(set.http), 128);
}

#[test]
fn one_connection_sees_the_new_master_after_a_switchover() {
    // The address is kept encoded per connection while the group's view
    // is unchanged: a switchover must still show on the same connection.
    let topo = Topology::master_with_replicas(1);
    let d = daemon(topo.master.addr(), "");
    let mut c = RawConn::connect(d.resp, CMD_TIMEOUT);
    let ask = ["SENTINEL", "get-master-addr-by-name", NAME];
    let addr_reply = |a: SocketAddr| {
        format!(
            "*2\r\n{}{}",
            bulk(&a.ip().to_string()),
            bulk(&a.port().to_string())
        )
    };
    assert_eq!(c.cmd(&ask), addr_reply(topo.master.addr()));
    assert_eq!(c.cmd(&ask), addr_reply(topo.master.addr()));
    // Twice, pipelined, for the unknown name in between.
    let both = [
        encode_cmd(&ask),
        encode_cmd(&["SENTINEL", "get-master-addr-by-name", "x"]),
    ]
    .concat();
    c.send_raw(&both).unwrap();
    let mut next = || String::from_utf8_lossy(&c.read().unwrap()).into_owned();
    assert_eq!(next(), addr_reply(topo.master.addr()));
    assert_eq!(next(), "*-1\r\n");
    let replica = topo.replicas[0].addr();
    wait_for(
        "picket to know the replica",
        Duration::from_secs(20),
        || {
            redis_cmd(d.resp, &["SENTINEL", "REPLICAS", NAME])
                .is_ok_and(|r| matches!(r, Reply::Array(v) if !v.is_empty()))
        },
    );
    wait_for("the switchover to start", Duration::from_secs(20), || {
        redis_cmd(d.resp, &["SENTINEL", "FAILOVER", NAME]).is_ok_and(|r| r.is_ok())
    });
    wait_for(
        "the same connection to show the new master",
        Duration::from_secs(30),
        || c.cmd(&ask) == addr_reply(replica),
    );
}

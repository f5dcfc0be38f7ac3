//! Clients that do not speak Sentinel, writing through a real HAProxy
//! (Debian's `haproxy` package) in front of a group three picket daemons
//! manage: the shipped configuration (`deploy/haproxy/haproxy.cfg`, picket's
//! `/v1/lb/...` check, every daemon a checker) side by side, in the same
//! run, with the usual `tcp-check expect string role:master` one.
//!
//! One client per front end writes every 10 ms on one connection at a time
//! (reconnecting on error):
//!
//! 1. `kill -9` of the master, then its return: the longest write gap, and
//!    the writes the returning old master acknowledged (lost).
//! 2. the master cut off from the daemons and its replicas for 20 s but
//!    still reachable from HAProxy (iptables, as tests/it/isolation.rs): the
//!    writes acknowledged after the new master was published that the
//!    final master does not hold (acknowledged by the isolated one).
//!
//! The figures are printed (`FIGURE`); the assertions hold picket's check to
//! its promises with bounds generous enough for a loaded machine: a gap
//! within `down_after` + 500 ms, no write lost to the returning master, at
//! most one check interval of writes to the isolated master after the
//! publication (measured: none), far fewer than the usual check's.
//!
//! A second test has HAProxy check a TLS `http_listen` (`check-ssl`) and
//! follow a planned switchover without losing a write.

use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use picket_harness::partition::Partition;
use picket_harness::*;

const GROUP: &str = "cache";

/// A real HAProxy, stopped by PID when dropped.
struct Haproxy {
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl Haproxy {
    fn start(cfg: &str) -> Haproxy {
        let dir = tempfile::Builder::new()
            .prefix("picket-haproxy-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("haproxy.cfg");
        fs::write(&path, cfg).unwrap();
        let check = Command::new("haproxy")
            .args(["-c", "-f"])
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("haproxy (apt-get install haproxy): {e}"));
        assert!(
            check.status.success(),
            "haproxy -c: {}\n{cfg}",
            String::from_utf8_lossy(&check.stderr)
        );
        let log = fs::File::create(dir.path().join("haproxy.log")).unwrap();
        let child = Command::new("haproxy")
            .args(["-db", "-f"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Haproxy {
            child: Some(child),
            _dir: dir,
        }
    }
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Writes `<prefix><i> = i` every 10 ms through `front`, one connection
/// at a time, reconnecting after any error; records each acknowledgement.
struct PacedWriter {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<(u64, Instant)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    prefix: &'static str,
}

impl PacedWriter {
    fn start(front: SocketAddr, prefix: &'static str) -> PacedWriter {
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
        let (s, a) = (stop.clone(), acked.clone());
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(240);
            let mut conn: Option<RespConn> = None;
            let mut i = 0u64;
            while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                let next = Instant::now() + Duration::from_millis(10);
                if conn.is_none() {
                    conn = RespConn::connect(front, Duration::from_millis(500)).ok();
                }
                if let Some(c) = conn.as_mut() {
                    let key = format!("{prefix}{i}");
                    match c.cmd(&["SET", &key, &i.to_string()]) {
                        Ok(r) if r.is_ok() => {
                            a.lock().unwrap().push((i, Instant::now()));
                            i += 1;
                        }
                        _ => conn = None,
                    }
                }
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        PacedWriter {
            stop,
            acked,
            thread: Some(thread),
            prefix,
        }
    }

    fn acked(&self) -> Vec<(u64, Instant)> {
        self.acked.lock().unwrap().clone()
    }

    fn finish(mut self) -> Vec<(u64, Instant)> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.acked()
    }
}

/// The longest time between two acknowledgements within `[from, to]`
/// (the first one after `from` counted from `from`).
fn longest_gap(acked: &[(u64, Instant)], from: Instant, to: Instant) -> Duration {
    let mut last = from;
    let mut gap = Duration::ZERO;
    for (_, t) in acked.iter().filter(|(_, t)| *t >= from && *t <= to) {
        gap = gap.max(t.duration_since(last));
        last = *t;
    }
    gap.max(to.saturating_duration_since(last))
}

/// The acknowledged writes (of those after `since`) that `master` lacks.
fn lost(master: SocketAddr, prefix: &str, acked: &[(u64, Instant)], since: Instant) -> usize {
    let mut conn = RespConn::connect(master, CMD_TIMEOUT).unwrap();
    acked
        .iter()
        .filter(|(_, t)| *t >= since)
        .filter(|(i, _)| {
            conn.cmd(&["GET", &format!("{prefix}{i}")])
                .ok()
                .and_then(|r| r.as_str().map(str::to_string))
                != Some(i.to_string())
        })
        .count()
}

/// The shipped configuration, with the test's addresses: `servers` for
/// 10.1.0.5/6/7:6379, the daemons' HTTP addresses for 10.0.0.1/2/3:9479,
/// connections to the servers from `source`.
fn picket_backend(
    front: SocketAddr,
    servers: &[SocketAddr],
    http: &[SocketAddr],
    source: IpAddr,
) -> String {
    let mut cfg = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/haproxy/haproxy.cfg"
    ))
    .unwrap();
    for (i, s) in servers.iter().enumerate() {
        cfg = cfg.replace(&format!("10.1.0.{}:6379", 5 + i), &s.to_string());
    }
    for (i, h) in http.iter().enumerate() {
        cfg = cfg.replace(
            &format!("addr 10.0.0.{} port 9479", 1 + i),
            &format!("addr {} port {}", h.ip(), h.port()),
        );
    }
    cfg = cfg.replace("bind :6379", &format!("bind {front}")).replace(
        "default-server ",
        &format!("default-server source {source} "),
    );
    assert!(
        cfg.lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .all(|l| !l.contains("10.1.0.") && !l.contains("10.0.0.")),
        "an example address is left:\n{cfg}"
    );
    cfg
}

/// The usual front end: a `tcp-check` that expects `role:master`, as
/// measured in the issue (inter 1s fall 1 rise 1).
fn tcp_check_backend(front: SocketAddr, servers: &[SocketAddr], source: IpAddr) -> String {
    let mut cfg = format!(
        "\nfrontend usual_write\n    bind {front}\n    default_backend usual_master\n\n\
         backend usual_master\n    balance first\n    option tcp-check\n    tcp-check connect\n\
         \x20   tcp-check send PING\\r\\n\n    tcp-check expect string +PONG\n\
         \x20   tcp-check send info\\ replication\\r\\n\n    tcp-check expect string role:master\n\
         \x20   tcp-check send QUIT\\r\\n\n    tcp-check expect string +OK\n\
         \x20   default-server source {source} inter 1s fall 1 rise 1 on-marked-down shutdown-sessions\n"
    );
    for (i, s) in servers.iter().enumerate() {
        cfg.push_str(&format!("    server s{i} {s} check\n"));
    }
    cfg
}

/// The first time any daemon names a master other than `old`, polled
/// every 5 ms until `deadline`.
fn wait_published(cluster: &PicketCluster, old: SocketAddr, deadline: Instant) -> Option<Instant> {
    while Instant::now() < deadline {
        for n in &cluster.nodes {
            if n.master_addr(GROUP).is_some_and(|m| m != old) {
                return Some(Instant::now());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// CPU time (user + system, in clock ticks of 10 ms) each daemon uses
/// over `window`.
fn cpu_ticks(cluster: &PicketCluster, window: Duration) -> Vec<u64> {
    let cpu = |pid: u32| -> Option<u64> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let after = stat.rsplit_once(')')?.1;
        let f: Vec<&str> = after.split_whitespace().collect();
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    };
    let pids: Vec<u32> = cluster
        .nodes
        .iter()
        .filter_map(|n| n.process.pid())
        .collect();
    let before: Vec<Option<u64>> = pids.iter().map(|p| cpu(*p)).collect();
    std::thread::sleep(window);
    pids.iter()
        .zip(&before)
        .filter_map(|(p, b)| Some(cpu(*p)?.saturating_sub((*b)?)))
        .collect()
}

/// Poll every daemon's check for `server` every 5 ms for `span` from
/// `from`: when each first answered something else than 200.
fn watch_lb(
    http: &[SocketAddr],
    server: SocketAddr,
    from: Instant,
    span: Duration,
) -> std::thread::JoinHandle<Vec<Option<Duration>>> {
    let http = http.to_vec();
    std::thread::spawn(move || {
        let mut failed: Vec<Option<Duration>> = vec![None; http.len()];
        while from.elapsed() < span && failed.iter().any(Option::is_none) {
            for (i, h) in http.iter().enumerate() {
                if failed[i].is_none()
                    && http_get(*h, &format!("/v1/lb/{GROUP}/{server}"))
                        .is_ok_and(|(c, _)| c != 200)
                {
                    failed[i] = Some(from.elapsed());
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        failed
    })
}

fn server_mut(topo: &mut Topology, addr: SocketAddr) -> &mut RedisServer {
    if topo.master.addr() == addr {
        return &mut topo.master;
    }
    topo.replicas
        .iter_mut()
        .find(|r| r.addr() == addr)
        .expect("a server of the topology")
}

#[test]
fn writes_through_haproxy_follow_picket_across_a_kill_and_an_isolation() {
    let mut topo = Topology::master_with_replicas(2);
    let servers: Vec<SocketAddr> = topo.all().map(RedisServer::addr).collect();
    let m0 = topo.master.addr();
    let plan = ClusterPlan::new(3);
    let daemons_resp = plan.resp.clone();
    let http = plan.http.clone();
    let cluster = plan.start(&group_toml(GROUP, m0, 2, ""));
    cluster.wait_converged(&[0, 1, 2], GROUP, 3, Duration::from_secs(30));

    let front_ip = next_loopback_ip();
    let front_picket: SocketAddr = format!("{front_ip}:{}", free_port(&front_ip))
        .parse()
        .unwrap();
    let mut front_usual: SocketAddr = format!("{front_ip}:{}", free_port(&front_ip))
        .parse()
        .unwrap();
    while front_usual == front_picket {
        front_usual = format!("{front_ip}:{}", free_port(&front_ip))
            .parse()
            .unwrap();
    }
    let source: IpAddr = next_loopback_ip().parse().unwrap();
    let cfg = format!(
        "{}{}",
        picket_backend(front_picket, &servers, &http, source),
        tcp_check_backend(front_usual, &servers, source)
    );
    let idle = cpu_ticks(&cluster, Duration::from_secs(5));
    let _haproxy = Haproxy::start(&cfg);

    let w_picket = PacedWriter::start(front_picket, "p:");
    let w_usual = PacedWriter::start(front_usual, "u:");
    wait_for(
        "writes through both front ends",
        Duration::from_secs(20),
        || w_picket.acked().len() >= 50 && w_usual.acked().len() >= 50,
    );

    // The checks' cost: each daemon answers 3 lines x 10 checks/s of
    // HAProxy's picket back end (30 requests/s), besides its own work.
    let with_checks = cpu_ticks(&cluster, Duration::from_secs(5));
    eprintln!(
        "FIGURE CPU ticks (10 ms) of each daemon over 5 s: {idle:?} before HAProxy, {with_checks:?} while it checks every 100 ms (30 checks/s per daemon)"
    );

    // 1. kill -9 of the master, then its return.
    let killed = Instant::now();
    let watch = watch_lb(&http, m0, killed, Duration::from_secs(3));
    topo.master.kill9();
    let published_kill = wait_published(&cluster, m0, killed + Duration::from_secs(30))
        .map(|t| t.duration_since(killed));
    let (m1, _) = cluster.wait_agreed_new_master(GROUP, &[0, 1, 2], m0, Duration::from_secs(30));
    wait_for(
        "writes through both front ends after the failover",
        Duration::from_secs(20),
        || {
            [&w_picket, &w_usual].iter().all(|w| {
                w.acked()
                    .last()
                    .is_some_and(|(_, t)| *t > killed + Duration::from_secs(1))
            })
        },
    );
    let lb_kill = watch.join().unwrap();
    let returned = Instant::now();
    topo.master.restart();
    wait_for(
        "the old master to be demoted and replicate the new one",
        Duration::from_secs(30),
        || replica_linked_to(&topo.master, m1),
    );
    std::thread::sleep(Duration::from_secs(2));
    let settled = Instant::now();
    let gap_picket = longest_gap(&w_picket.acked(), killed, returned);
    let gap_usual = longest_gap(&w_usual.acked(), killed, returned);
    let lost_return_picket = lost(m1, w_picket.prefix, &w_picket.acked(), returned);
    let lost_return_usual = lost(m1, w_usual.prefix, &w_usual.acked(), returned);
    eprintln!(
        "FIGURE kill -9: picket's check failed for the old master after {lb_kill:?} (each daemon); new master published {published_kill:?} after the kill; longest write gap picket check {gap_picket:?}, tcp-check role:master {gap_usual:?}; \
         writes lost to the returning old master: picket {lost_return_picket}, tcp-check {lost_return_usual}"
    );
    assert!(
        gap_picket <= Duration::from_millis(1500),
        "longest gap through picket's check {gap_picket:?}: the target is down_after + 500 ms"
    );
    assert_eq!(
        lost_return_picket, 0,
        "writes lost to the returning old master"
    );
    let _ = settled;

    // 2. The master cut off from the daemons and its replicas for 20 s,
    // still reachable from HAProxy.
    if !nix::unistd::geteuid().is_root() {
        eprintln!("isolation part skipped: partitions need root (iptables)");
        return;
    }
    cluster.wait_converged(&[0, 1, 2], GROUP, 3, Duration::from_secs(30));
    let part = Partition::new().unwrap_or_else(|e| panic!("iptables: {e}"));
    part.isolate(m1, &[source], &daemons_resp).unwrap();
    let cut = Instant::now();
    let watch = watch_lb(&http, m1, cut, Duration::from_secs(3));
    let published = wait_published(&cluster, m1, cut + Duration::from_secs(20));
    std::thread::sleep((cut + Duration::from_secs(20)).saturating_duration_since(Instant::now()));
    part.heal().unwrap();
    let lb_iso = watch.join().unwrap();
    let published = published.unwrap_or_else(|| {
        panic!(
            "no new master published within 20 s of the isolation\n{}",
            cluster.logs()
        )
    });
    let (m2, _) = cluster.wait_agreed_new_master(GROUP, &[0, 1, 2], m1, Duration::from_secs(30));
    wait_for(
        "the isolated master to be demoted and replicate the new one",
        Duration::from_secs(30),
        || replica_linked_to(server_mut(&mut topo, m1), m2),
    );
    std::thread::sleep(Duration::from_secs(2));
    let (acked_picket, acked_usual) = (w_picket.finish(), w_usual.finish());
    let after_pub_picket = lost(m2, "p:", &acked_picket, published);
    let after_pub_usual = lost(m2, "u:", &acked_usual, published);
    let after_cut_picket = lost(m2, "p:", &acked_picket, cut);
    let after_cut_usual = lost(m2, "u:", &acked_usual, cut);
    let gap_iso_picket = longest_gap(&acked_picket, cut, cut + Duration::from_secs(20));
    eprintln!(
        "FIGURE isolation 20 s: picket's check failed for the isolated master after {lb_iso:?} (each daemon); new master published {:?} after the cut; writes acknowledged by the isolated \
         master after the publication: picket check {after_pub_picket}, tcp-check role:master {after_pub_usual}; \
         since the cut: picket {after_cut_picket}, tcp-check {after_cut_usual}; longest gap through picket's check {gap_iso_picket:?}",
        published.duration_since(cut)
    );
    // Measured 0 (docs/haproxy.md). The daemons stop answering 200 for
    // the isolated master before the publication, but by a margin of the
    // order of HAProxy's check interval: the test holds the structural
    // bound, one interval of writes (10), not the measured figure.
    assert!(
        after_pub_picket <= 10,
        "{after_pub_picket} writes acknowledged through picket's check by the isolated master after the publication"
    );
    // The usual check cannot tell: the comparison shows the difference.
    assert!(
        after_pub_usual > after_pub_picket,
        "the tcp-check configuration lost {after_pub_usual}: the isolation did not reach HAProxy as intended"
    );
}

/// HAProxy checking picket's answer on a TLS `http_listen`
/// (`check-ssl verify required ca-file`, as docs/haproxy.md says): writes
/// reach the master, and follow a switchover.
#[test]
fn haproxy_checks_a_tls_http_listen() {
    use picket_harness::tls::{TestCa, Validity};
    let topo = Topology::master_with_replicas(1);
    let (m, r) = (topo.master.addr(), topo.replicas[0].addr());
    let dir = tempfile::Builder::new()
        .prefix("picket-haproxy-tls-")
        .tempdir()
        .unwrap();
    let ca = TestCa::new("picket-test-ca");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let ip = next_loopback_ip();
    let resp: SocketAddr = format!("{ip}:{}", free_port(&ip)).parse().unwrap();
    let mut https: SocketAddr = format!("{ip}:{}", free_port(&ip)).parse().unwrap();
    while https == resp {
        https = format!("{ip}:{}", free_port(&ip)).parse().unwrap();
    }
    let server = ca.issue_files(dir.path(), "server", &[&ip], Validity::Now);
    let config = format!(
        "[daemon]\nid = \"picket-tls-lb\"\nlisten = \"{resp}\"\nhttp_listen = \"{https}\"\n\
         data_dir = \"{}\"\n\n[daemon.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n\
         ca_file = \"{}\"\nauth_clients = \"no\"\nhttp = true\n\n{}",
        dir.path().join("data").display(),
        server.cert.display(),
        server.key.display(),
        ca_file.display(),
        group_toml(GROUP, m, 1, "")
    );
    let picket = PicketProcess::start_with(|_| config, &[], &[("RUST_LOG", "info")]);
    let front_ip = next_loopback_ip();
    let front: SocketAddr = format!("{front_ip}:{}", free_port(&front_ip))
        .parse()
        .unwrap();
    let mut cfg = format!(
        "global\n    log stderr format raw local0 notice\ndefaults\n    mode tcp\n    timeout connect 1s\n\
         \x20   timeout client 1h\n    timeout server 1h\n    timeout check 500ms\n\
         frontend write\n    bind {front}\n    default_backend master\n\
         backend master\n    balance first\n    option httpchk\n\
         \x20   http-check send meth GET uri-lf /v1/lb/{GROUP}/%[srv_name,field(2,_)] ver HTTP/1.1 hdr Host picket\n\
         \x20   http-check expect status 200\n\
         \x20   default-server inter 100ms fall 1 rise 1 on-marked-down shutdown-sessions check-ssl verify required ca-file {}\n",
        ca_file.display()
    );
    for s in [m, r] {
        cfg.push_str(&format!(
            "    server p1_{s} {s} check addr {} port {}\n",
            https.ip(),
            https.port()
        ));
    }
    let _haproxy = Haproxy::start(&cfg);
    let w = PacedWriter::start(front, "t:");
    wait_for(
        "writes through HAProxy checking over TLS",
        Duration::from_secs(20),
        || w.acked().len() >= 20,
    );
    // A switchover: the writes follow it.
    let out = Command::new(env!("CARGO_BIN_EXE_picket"))
        .args([
            "failover",
            GROUP,
            "--addr",
            &resp.to_string(),
            "--tls",
            "--cacert",
        ])
        .arg(&ca_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}\n{}", picket.logs());
    let switched = Instant::now();
    wait_for(
        "writes after the switchover",
        Duration::from_secs(20),
        || w.acked().iter().filter(|(_, t)| *t > switched).count() >= 20,
    );
    let acked = w.finish();
    assert_eq!(
        lost(r, "t:", &acked, switched),
        0,
        "every write after the switchover is on the new master"
    );
    assert_eq!(
        lost(r, "t:", &acked, acked[0].1),
        0,
        "and the ones before it"
    );
}

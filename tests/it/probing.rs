//! Probing and the daemon's surface, with one picket process against real
//! redis-server processes: what `/v1/status` and `/metrics` report, SDOWN
//! timing, authentication errors, `check-config`, start-up refusal of a bad
//! config, SIGTERM, and `picket status`.

use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::time::{Duration, Instant};

use picket_harness::*;
use serde_json::Value;

const GROUP: &str = "cache";
const PICKET: &str = env!("CARGO_BIN_EXE_picket");

fn sock(a: &Value) -> Option<SocketAddr> {
    a.as_str()?.parse().ok()
}

/// One daemon (quorum 1, no peers) watching `topo`, with every instance
/// known and read.
fn watch(topo: &Topology, extra: &str) -> PicketCluster {
    let cluster = ClusterPlan::new(1).start(&group_toml(GROUP, topo.master.addr(), 1, extra));
    cluster.wait_converged(
        &[0],
        GROUP,
        1 + topo.replicas.len(),
        Duration::from_secs(20),
    );
    cluster
}

/// The view of the instance at `addr`.
fn instance(n: &PicketNode, addr: SocketAddr) -> Value {
    n.group(GROUP)["instances"]
        .as_array()
        .and_then(|a| a.iter().find(|i| sock(&i["addr"]) == Some(addr)).cloned())
        .unwrap_or(Value::Null)
}

fn int_field(s: &RedisServer, key: &str) -> Option<i64> {
    s.info_field("replication", key)?.parse().ok()
}

/// Whether picket's view of `s` matches what `s` itself reports now.
fn view_matches_info(n: &PicketNode, s: &RedisServer, master: SocketAddr) -> Result<(), String> {
    let v = instance(n, s.addr());
    let info = s.info("default")?;
    let field = |k: &str| info_value(&info, k);
    let is_master = s.addr() == master;
    let mismatch = |what: &str| Err(format!("{what}: view {v} vs INFO of {}", s.addr()));
    if v["is_master"] != is_master {
        return mismatch("is_master");
    }
    let (role, offset) = if is_master {
        ("master", field("master_repl_offset"))
    } else {
        ("replica", field("slave_repl_offset"))
    };
    if v["role"] != role {
        return mismatch("role");
    }
    if v["offset"].as_i64() != offset.and_then(|o| o.parse().ok()) {
        return mismatch("offset");
    }
    if v["flavour"] != "redis" || v["version"].as_str() != field("redis_version").as_deref() {
        return mismatch("flavour/version");
    }
    if v["run_id"].as_str() != field("run_id").as_deref() {
        return mismatch("run_id");
    }
    if v["up"] != true || v["sdown"] != false || v["connected"] != true {
        return mismatch("liveness");
    }
    if !is_master {
        let follows = v["master_host"].as_str() == Some(master.ip().to_string().as_str())
            && v["master_port"].as_u64() == Some(u64::from(master.port()))
            && v["master_link_up"] == true;
        if !follows {
            return mismatch("master link");
        }
        if v["priority"].as_u64() != field("slave_priority").and_then(|p| p.parse().ok()) {
            return mismatch("priority");
        }
    }
    Ok(())
}

#[test]
fn status_reports_the_master_and_both_replicas_with_their_roles_and_offsets() {
    let topo = Topology::master_with_replicas(2);
    let cluster = watch(&topo, "");
    let n = &cluster.nodes[0];
    let master = topo.master.addr();
    let g = n.group(GROUP);
    assert_eq!(sock(&g["master"]), Some(master), "{g}");
    assert_eq!(g["status"], "ok", "{g}");
    assert_eq!(g["instances"].as_array().map(Vec::len), Some(3), "{g}");
    assert_eq!(g["instances"][0]["is_master"], true, "master first: {g}");
    // Offsets move with every write; after each burst the view catches up
    // with what the servers report (INFO is read once a second).
    for round in 0..2 {
        topo.master.set_keys(&format!("r{round}k"), 200);
        topo.wait_replicas_up(READY_TIMEOUT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(e) = topo.all().try_for_each(|s| view_matches_info(n, s, master)) {
            assert!(Instant::now() < deadline, "round {round}: {e}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // The offsets really moved between the rounds and are not zero.
    let off = instance(n, master)["offset"].as_i64().unwrap();
    assert_eq!(Some(off), int_field(&topo.master, "master_repl_offset"));
    assert!(off > 200 * 20, "{off}");
}

/// A healthy master's INFO, read every second, is its replication
/// section between full reads ten seconds apart, and what only the full
/// read tells (run id, version) stays in the view.
#[test]
fn a_healthy_master_is_read_by_its_replication_section_between_full_reads() {
    use std::io::{BufRead, BufReader, Write};
    let topo = Topology::master_with_replicas(1);
    let cluster = watch(&topo, "");
    let n = &cluster.nodes[0];
    let master = topo.master.addr();
    let mut mon = std::net::TcpStream::connect(master).expect("connect to the master");
    mon.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    mon.write_all(b"MONITOR\r\n").unwrap();
    let mut lines = BufReader::new(mon);
    let (mut light, mut full_after_light) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(25);
    let mut line = String::new();
    while full_after_light == 0 && Instant::now() < deadline {
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) => panic!("MONITOR connection closed"),
            Ok(_) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                continue;
            }
            Err(e) => panic!("MONITOR: {e}"),
        }
        let l = line.trim_end();
        if l.ends_with(r#""INFO" "replication""#) || l.ends_with(r#""info" "replication""#) {
            light += 1;
        } else if (l.ends_with(r#""INFO""#) || l.ends_with(r#""info""#)) && light >= 3 {
            full_after_light += 1;
        }
    }
    assert!(light >= 3, "{light} INFO replication reads seen");
    assert_eq!(
        full_after_light, 1,
        "no full INFO within 25 s after {light} light reads"
    );
    // About nine light reads per full one (1 s and 10 s periods).
    assert!(light <= 15, "{light} light reads before a full one");
    let run_id = topo.master.info_field("server", "run_id");
    let v = instance(n, master);
    assert_eq!(v["run_id"].as_str(), run_id.as_deref(), "{v}");
    assert!(v["version"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
}

#[test]
fn a_killed_replica_is_sdown_once_refused_a_frozen_one_after_down_after() {
    let mut topo = Topology::master_with_replicas(2);
    let cluster = watch(&topo, "");
    let n = &cluster.nodes[0];
    let addr = topo.replicas[0].addr();
    let inst = addr.to_string();
    let up_metric = || {
        n.metrics().ok().and_then(|m| {
            metric_value(
                &m,
                "picket_instance_up",
                &[("group", GROUP), ("server", &inst)],
            )
        })
    };
    wait_for("picket_instance_up 1", Duration::from_secs(5), || {
        up_metric() == Some(1.0)
    });
    let sdown_after = |target: SocketAddr, from: Instant| {
        let mut went_down = None;
        while from.elapsed() < Duration::from_secs(5) {
            if instance(n, target)["sdown"] == true {
                went_down = Some(from.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        went_down.unwrap_or_else(|| panic!("{target} not SDOWN 5 s after the fault\n{}", n.logs()))
    };

    // Frozen (SIGSTOP): its sockets stay open, nothing answers: silence.
    let frozen = topo.replicas[1].addr();
    topo.replicas[1].sigstop();
    let took = sdown_after(frozen, Instant::now());
    topo.replicas[1].sigcont();
    println!("SDOWN {took:?} after SIGSTOP (down_after 1s)");
    // The last reply came at most one probe period (250 ms) before the
    // stop, so SDOWN cannot be seen earlier than ~0.75 s after it.
    assert!(
        took >= Duration::from_millis(700),
        "SDOWN after only {took:?}"
    );
    assert_eq!(instance(n, frozen)["sdown_reason"], "silence");
    wait_for("the frozen replica back up", Duration::from_secs(5), || {
        instance(n, frozen)["sdown"] == false
    });

    // Killed: the kernel refuses its port at once; down after
    // down_after_refused (100 ms), not down_after.
    topo.replicas[0].kill9();
    let took = sdown_after(addr, Instant::now());
    println!("SDOWN {took:?} after kill -9 (down_after 1s, down_after_refused 100ms)");
    assert!(
        took >= Duration::from_millis(90),
        "SDOWN after only {took:?}"
    );
    assert!(
        took < Duration::from_millis(700),
        "SDOWN after {took:?}: the refusals were not used\n{}",
        n.logs()
    );
    assert_eq!(instance(n, addr)["sdown_reason"], "refused");
    let v = instance(n, addr);
    assert_eq!(v["up"], false, "{v}");
    assert!(v["sdown_ms"].is_u64(), "{v}");
    assert!(v["last_error"].is_string(), "{v}");
    wait_for("picket_instance_up 0", Duration::from_secs(5), || {
        up_metric() == Some(0.0)
    });
    // The others are unaffected.
    assert_eq!(instance(n, topo.master.addr())["sdown"], false);
    assert_eq!(instance(n, topo.replicas[1].addr())["sdown"], false);
    assert_eq!(n.group(GROUP)["status"], "ok");

    topo.replicas[0].restart();
    let restarted = Instant::now();
    wait_for("the replica back up", Duration::from_secs(5), || {
        let v = instance(n, addr);
        v["sdown"] == false && v["up"] == true && v["last_error"].is_null()
    });
    println!("up again {:?} after it answered", restarted.elapsed());
    wait_for("picket_instance_up 1 again", Duration::from_secs(5), || {
        up_metric() == Some(1.0)
    });
    let events: Vec<String> = n
        .events()
        .into_iter()
        .filter(|e| e.message.contains(&format!("slave {addr} ")))
        .map(|e| e.event)
        .collect();
    let down = events.iter().position(|e| e == "+sdown");
    let up = events.iter().position(|e| e == "-sdown");
    assert!(
        matches!((down, up), (Some(d), Some(u)) if d < u),
        "{events:?}"
    );
}

#[test]
fn a_wrong_password_is_a_clear_per_instance_error_and_the_daemon_keeps_running() {
    let topo = Topology::master_with_replicas_opts(1, RedisOpts::default().password("right-one"));
    let secrets = tempfile::tempdir().unwrap();
    let pw = secrets.path().join("password");
    std::fs::write(&pw, "wrong-one\n").unwrap();
    let extra = format!("password_file = \"{}\"\n", pw.display());
    let mut cluster = ClusterPlan::new(1).start(&group_toml(GROUP, topo.master.addr(), 1, &extra));
    let n = &cluster.nodes[0];
    wait_for(
        "an authentication error in the status",
        Duration::from_secs(10),
        || {
            instance(n, topo.master.addr())["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("WRONGPASS") || e.contains("invalid"))
        },
    );
    let v = instance(n, topo.master.addr());
    assert_eq!(v["connected"], false, "{v}");
    // Still serving, seconds later.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert!(cluster.nodes[0].process.try_exit_status().is_none());
        std::thread::sleep(Duration::from_millis(100));
    }
    let n = &cluster.nodes[0];
    assert_eq!(
        http_get(n.http, "/healthz").unwrap(),
        (200, "ok\n".to_string())
    );
    assert_eq!(n.master_addr(GROUP), Some(topo.master.addr()));
    // The password itself never shows up.
    let status = http_get(n.http, "/v1/status").unwrap().1;
    assert!(!status.contains("wrong-one"), "{status}");
    assert!(!n.process.logs().contains("wrong-one"));
    cluster.nodes[0].process.stop();
}

// ---------------------------------------------------------------------------
// The command line

/// A config file in its own directory.
fn config_file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("picket.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn daemon_table(listen: SocketAddr, http: SocketAddr, data: &std::path::Path) -> String {
    format!(
        "[daemon]\nid = \"solo\"\nlisten = \"{listen}\"\nhttp_listen = \"{http}\"\ndata_dir = \"{}\"\n\n",
        data.display()
    )
}

fn free_addr(ip: &str) -> SocketAddr {
    format!("{ip}:{}", free_port(ip)).parse().unwrap()
}

/// Two distinct free addresses on `ip` (both held while choosing).
fn two_free_addrs(ip: &str) -> (SocketAddr, SocketAddr) {
    let a = TcpListener::bind((ip, 0)).unwrap();
    let b = TcpListener::bind((ip, 0)).unwrap();
    (a.local_addr().unwrap(), b.local_addr().unwrap())
}

#[test]
fn check_config_prints_a_summary_or_file_line_key_reason() {
    let (listen, http) = two_free_addrs(&next_loopback_ip());
    let data = tempfile::tempdir().unwrap();
    let good = format!(
        "{}{}",
        daemon_table(listen, http, data.path()),
        group_toml(GROUP, "127.0.0.2:6379".parse().unwrap(), 1, "")
    );
    let (_d, path) = config_file(&good);
    let out = Command::new(PICKET)
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("daemon solo"), "{stdout}");
    assert!(
        stdout.contains("group cache: master 127.0.0.2:6379, quorum 1 of 1, down_after 1s"),
        "{stdout}"
    );

    // quorum 3 on line 11 of a single daemon's config.
    let bad = good.replace("quorum = 1", "quorum = 3");
    let line = bad.lines().position(|l| l == "quorum = 3").unwrap() + 1;
    let (_d, path) = config_file(&bad);
    let out = Command::new(PICKET)
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    let expected = format!("{}:{line}: group[0].quorum: ", path.display());
    assert!(
        stderr.starts_with(&expected),
        "{stderr:?} does not start with {expected:?}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn run_refuses_a_bad_config_before_binding_any_port() {
    let (listen, http) = two_free_addrs(&next_loopback_ip());
    let data = tempfile::tempdir().unwrap();
    let bad = format!(
        "{}{}",
        daemon_table(listen, http, data.path()),
        group_toml(GROUP, "127.0.0.2:6379".parse().unwrap(), 7, "")
    );
    let (_d, path) = config_file(&bad);
    let run = |path: &std::path::Path| {
        let started = Instant::now();
        let out = Command::new(PICKET)
            .args(["run", "--config"])
            .arg(path)
            .output()
            .unwrap();
        (out, started.elapsed())
    };
    let (out, took) = run(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains(": group[0].quorum: "), "{stderr}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // Both ports are free, and nothing was created in data_dir.
    drop(TcpListener::bind(listen).unwrap());
    drop(TcpListener::bind(http).unwrap());
    assert_eq!(std::fs::read_dir(data.path()).unwrap().count(), 0);
    // With the ports taken by someone else, the answer is still the config
    // error (exit 64), not a bind failure: validation comes first.
    let _l1 = TcpListener::bind(listen).unwrap();
    let _l2 = TcpListener::bind(http).unwrap();
    let (out, _) = run(&path);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(!stderr.contains("cannot listen"), "{stderr}");
}

#[test]
fn sigterm_stops_run_within_a_bounded_time_and_frees_its_ports() {
    let topo = Topology::master_with_replicas(1);
    let mut cluster = watch(&topo, "");
    let node = &mut cluster.nodes[0];
    node.process.sigterm();
    let sent = Instant::now();
    let status = node
        .process
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| {
            panic!(
                "picket run still running 10 s after SIGTERM\n{}",
                node.logs()
            )
        });
    let took = sent.elapsed();
    println!("picket run exited {took:?} after SIGTERM");
    assert!(status.success(), "{status:?}\n{}", node.logs());
    assert!(took < Duration::from_secs(6), "{took:?}");
    assert!(node.process.stderr().contains("SIGTERM received"));
    drop(TcpListener::bind(node.resp).unwrap());
    drop(TcpListener::bind(node.http).unwrap());
}

#[test]
fn status_command_prints_the_group_master_and_instances() {
    let topo = Topology::master_with_replicas(2);
    let cluster = watch(&topo, "");
    let n = &cluster.nodes[0];
    let out = Command::new(PICKET)
        .args(["status", "--addr", &n.http.to_string()])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(table.starts_with("daemon picket-0  announce "), "{table}");
    let header = format!(
        "group {GROUP}  master {}  config-epoch 0  status ok  quorum 1/1 daemons",
        topo.master.addr()
    );
    assert!(table.contains(&header), "{table}");
    assert!(table.contains("INSTANCE"), "{table}");
    let row = |addr: SocketAddr| {
        table
            .lines()
            .find(|l| l.trim_start().starts_with(&addr.to_string()))
            .unwrap_or_else(|| panic!("no row for {addr} in\n{table}"))
            .to_owned()
    };
    let m = row(topo.master.addr());
    assert!(
        m.contains("master*") && m.contains(" up ") && m.contains("redis"),
        "{m}"
    );
    for r in &topo.replicas {
        let line = row(r.addr());
        assert!(line.contains("replica ") && line.contains(" up "), "{line}");
        assert!(
            line.contains(&format!("replicates {} link up", topo.master.addr())),
            "{line}"
        );
    }
    // --json is the status document itself.
    let out = Command::new(PICKET)
        .args(["status", "--json", "--addr", &n.http.to_string()])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["groups"][0]["name"], GROUP);
    // An unreachable daemon is an error, not an empty table.
    let out = Command::new(PICKET)
        .args([
            "status",
            "--addr",
            &free_addr(&next_loopback_ip()).to_string(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach"));
}

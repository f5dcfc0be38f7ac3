//! redis-py's `redis.sentinel.Sentinel` against three picket daemons, in
//! RESP3 (redis-py's default) and RESP2, across kill -9 failovers of the
//! master: discovery before and after, writes through `master_for` that
//! keep going (gap and errors by kind are printed), and `+switch-master`
//! in Sentinel's exact format on every protocol.
//!
//! Needs `python3` with the `redis` package (`pip install redis`). The
//! number of failovers is `PICKET_FAILOVER_ROUNDS` (default 5). Run with
//! `--nocapture` to see the measured figures.

use picket_harness::api_util;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use api_util::*;
use picket_harness::*;

const NAME: &str = "mymaster";

/// The Python driver, killed by PID when dropped.
struct Py {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Py {
    fn start(sentinels: &str) -> Py {
        let check = Command::new("python3")
            .args(["-c", "import redis"])
            .output()
            .unwrap_or_else(|e| panic!("python3 is needed for this test: {e}"));
        assert!(
            check.status.success(),
            "the redis package for python3 is needed for this test (pip install redis): {}",
            String::from_utf8_lossy(&check.stderr)
        );
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/sentinel_failover.py"
        );
        let mut child = Command::new("python3")
            .args(["-B", script, "--sentinels", sentinels, "--service", NAME])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Py {
            child,
            stdin,
            lines,
        }
    }

    fn line(&self, timeout: Duration) -> String {
        self.lines.recv_timeout(timeout).unwrap_or_else(|e| {
            panic!("no answer from the redis-py driver within {timeout:?}: {e}")
        })
    }

    fn ask(&mut self, cmd: &str, timeout: Duration) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.line(timeout)
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn master_of(d: SocketAddr) -> Option<String> {
    match redis_cmd(d, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", NAME]).ok()? {
        Reply::Array(v) if v.len() == 2 => Some(format!("{}:{}", v[0].as_str()?, v[1].as_str()?)),
        _ => None,
    }
}

/// Every daemon advertises `master` and lists exactly `replicas`, all up.
fn settled(daemons: &[Daemon], master: &str, replicas: &[String]) -> bool {
    daemons.iter().all(|d| {
        if master_of(d.resp).as_deref() != Some(master) {
            return false;
        }
        let Ok(Reply::Array(rs)) = redis_cmd(d.resp, &["SENTINEL", "REPLICAS", NAME]) else {
            return false;
        };
        let mut names: Vec<String> = rs
            .iter()
            .filter(|r| field(r, "flags").as_deref() == Some("slave"))
            .filter(|r| field(r, "master-link-status").as_deref() == Some("ok"))
            .map(|r| field(r, "name").unwrap_or_default())
            .collect();
        names.sort();
        let Ok(m) = redis_cmd(d.resp, &["SENTINEL", "MASTER", NAME]) else {
            return false;
        };
        names == replicas
            && rs.len() == replicas.len()
            && field(&m, "flags").as_deref() == Some("master")
            && field(&m, "num-other-sentinels").as_deref() == Some("2")
    })
}

#[test]
fn redis_py_follows_kill9_failovers() {
    let rounds: usize = std::env::var("PICKET_FAILOVER_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let topo = Topology::master_with_replicas(2);
    let daemons = start_cluster(
        topo.master.addr(),
        &ClusterOpts {
            daemons: 3,
            quorum: 2,
            down_after: "1s".into(),
            failover_timeout: "10s".into(),
            ..Default::default()
        },
    );
    let Topology { master, replicas } = topo;
    let mut servers: Vec<RedisServer> = std::iter::once(master).chain(replicas).collect();
    let sentinels: Vec<String> = daemons.iter().map(|d| d.resp.to_string()).collect();

    let mut py = Py::start(&sentinels.join(","));
    let ready = py.line(Duration::from_secs(30));
    assert!(ready.starts_with("ready"), "{ready}");
    println!("{ready}");

    for round in 1..=rounds {
        let current = master_of(daemons[0].resp).expect("a master is advertised");
        let mut others: Vec<String> = servers
            .iter()
            .map(|s| s.addr().to_string())
            .filter(|a| *a != current)
            .collect();
        others.sort();
        wait_for(
            &format!("round {round}: every daemon settled on {current} with {others:?}"),
            Duration::from_secs(60),
            || settled(&daemons, &current, &others),
        );
        let answer = py.ask(
            &format!("check {current} {}", others.join(",")),
            Duration::from_secs(30),
        );
        assert_eq!(answer, "ok", "round {round}: discovery before the kill");
        assert_eq!(
            py.ask(&format!("round-start {round}"), Duration::from_secs(5)),
            "ok"
        );

        let victim = servers
            .iter_mut()
            .find(|s| s.addr().to_string() == current)
            .expect("the master is one of ours");
        victim.kill9();
        let mut new = String::new();
        wait_for(
            &format!("round {round}: every daemon advertises a new master"),
            Duration::from_secs(30),
            || {
                let m: Vec<Option<String>> = daemons.iter().map(|d| master_of(d.resp)).collect();
                match &m[0] {
                    Some(a) if *a != current && m.iter().all(|x| x.as_ref() == Some(a)) => {
                        new = a.clone();
                        true
                    }
                    _ => false,
                }
            },
        );
        let answer = py.ask(
            &format!("round-end {round} {current} {new}"),
            Duration::from_secs(30),
        );
        println!("{answer}");
        assert!(answer.starts_with("round "), "round {round}: {answer}");
        let r: serde_json::Value = serde_json::from_str(&answer["round ".len()..]).unwrap();
        assert_eq!(
            r["switch_master"].as_str().unwrap(),
            format!(
                "{NAME} {} {}",
                current.replace(':', " "),
                new.replace(':', " ")
            )
        );
        for (proto, w) in r["writers"].as_object().unwrap() {
            let gap = w["max_gap_ms"].as_u64().unwrap();
            // A generous bound: the figure itself is what is reported.
            assert!(gap < 15_000, "{proto}: writes stopped for {gap} ms");
        }

        // The old master comes back empty and must be turned into a replica
        // of the new one before the next round.
        let victim = servers
            .iter_mut()
            .find(|s| s.addr().to_string() == current)
            .unwrap();
        victim.restart();
        let new_addr: SocketAddr = new.parse().unwrap();
        let back = servers
            .iter()
            .find(|s| s.addr().to_string() == current)
            .unwrap();
        wait_for(
            &format!("round {round}: {current} demoted to a replica of {new}"),
            Duration::from_secs(30),
            || replica_linked_to(back, new_addr),
        );
        // Every replica follows the new master.
        for s in servers.iter().filter(|s| s.addr() != new_addr) {
            wait_for(
                &format!("round {round}: {} follows {new}", s.addr()),
                Duration::from_secs(30),
                || replica_linked_to(s, new_addr),
            );
        }
    }
    let summary = py.ask("quit", Duration::from_secs(30));
    println!("{summary}");
    assert!(summary.starts_with("summary "), "{summary}");
    let s: serde_json::Value = serde_json::from_str(&summary["summary ".len()..]).unwrap();
    assert_eq!(s["rounds"].as_u64(), Some(rounds as u64));
    for d in &daemons {
        let (code, body) = http_get(d.http, "/healthz").unwrap();
        assert_eq!(code, 200, "{body}");
    }
}

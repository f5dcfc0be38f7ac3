//! A full disk under `data_dir`: one of three daemons has its data directory
//! on a 64 KiB tmpfs, which the test fills; the master is then killed.
//!
//! What must hold: the two healthy daemons fail over as usual; the daemon
//! with the full disk neither votes nor leads (a vote it cannot persist
//! could be cast twice after a restart), stays up and answering, serves the
//! new master from memory instead of the dead one, says why on `/readyz`,
//! `/v1/status`, the log and `picket_state_writable`, never corrupts its
//! state file, and persists the new config once space is freed.
//!
//! The tmpfs lives in a private mount namespace of the daemon's own process
//! (`unshare --mount`, plus a user namespace when not run as root), so the
//! machine's mounts are never touched and the mount disappears with the
//! process; the test reaches it through `/proc/<pid>/root`.

use std::fs;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use picket_harness::*;
use serde_json::Value;

const GROUP: &str = "cache";

/// `data_dir` as the daemon's own process sees it.
fn inside(pid: u32, data_dir: &Path) -> PathBuf {
    let rel = data_dir.strip_prefix("/").unwrap_or(data_dir);
    Path::new(&format!("/proc/{pid}/root")).join(rel)
}

/// Write to `path` until the file system refuses; the error must be "no
/// space", and at most 256 KiB (four times the tmpfs) may be accepted.
fn fill(path: &Path) {
    let mut f = fs::File::create(path).unwrap_or_else(|e| panic!("create {path:?}: {e}"));
    let chunk = [0x5au8; 4096];
    for _ in 0..64 {
        if let Err(e) = f.write_all(&chunk).and_then(|_| f.sync_all()) {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::StorageFull,
                "filling {path:?}: {e}"
            );
            return;
        }
    }
    panic!("{path:?} accepted 256 KiB: it is not on the 64 KiB tmpfs");
}

fn sock(v: &Value) -> Option<SocketAddr> {
    v.as_str()?.parse().ok()
}

fn state_file(pid: u32, data_dir: &Path) -> Value {
    let path = inside(pid, data_dir).join("state.json");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?} is not JSON ({e}): {text}"))
}

#[test]
fn a_daemon_with_a_full_disk_neither_votes_nor_leads_and_serves_the_new_master() {
    require_redis_server();
    let topo = Topology::master_with_replicas(2);
    let old = topo.master.addr();
    let groups = group_toml(GROUP, old, 2, "");
    let plan = ClusterPlan::new(3);
    let data = tempfile::Builder::new()
        .prefix("picket-full-disk-")
        .tempdir()
        .unwrap_or_else(|e| panic!("tempdir: {e}"));
    let data_dir = data.path().to_path_buf();
    let data_arg = data_dir.display().to_string();
    let wrapper = private_mount_wrapper(
        "mount -t tmpfs -o size=64k picket-full-disk \"$0\" && exec \"$@\"",
        &data_arg,
    );
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let resp = plan.resp.clone();
    let peer = move |_: usize, j: usize| resp[j].to_string();
    let nodes = (0..3)
        .map(|i| {
            if i == 0 {
                plan.spawn_node(0, &groups, &peer, Some(&data_dir), &wrapper)
            } else {
                plan.spawn_node(i, &groups, &peer, None, &[])
            }
        })
        .collect();
    let cluster = PicketCluster { nodes };
    cluster.wait_ready(Duration::from_secs(20));
    cluster.wait_converged(&[0, 1, 2], GROUP, 3, Duration::from_secs(20));
    let full = &cluster.nodes[0];
    let pid = full
        .process
        .pid()
        .unwrap_or_else(|| panic!("picket-0 is not running\n{}", full.logs()));
    let before = state_file(pid, &data_dir);
    assert_eq!(before["daemon_id"], "picket-0", "{before}");

    let filler = inside(pid, &data_dir).join("filler");
    fill(&filler);
    let mut topo = topo;
    topo.master.kill9();

    // The two healthy daemons fail over; the full one follows in memory.
    let (new_master, epoch) =
        cluster.wait_agreed_new_master(GROUP, &[0, 1, 2], old, Duration::from_secs(30));
    assert_eq!(
        full.master_addr(GROUP),
        Some(new_master),
        "the full daemon's Sentinel API must give the new master\n{}",
        full.logs()
    );
    let promoted = topo
        .replicas
        .iter()
        .find(|r| r.addr() == new_master)
        .unwrap_or_else(|| panic!("{new_master} is not one of the replicas"));
    assert_eq!(
        promoted.info_field("replication", "role").as_deref(),
        Some("master")
    );

    // It never took part: no vote, no election won, no promotion.
    for event in ["+vote-for-leader", "+elected-leader", "+promoted-slave"] {
        assert_eq!(
            full.count_event(event),
            0,
            "picket-0 logged {event} with a full disk\n{}",
            full.logs()
        );
    }
    let promotions: usize = cluster
        .nodes
        .iter()
        .map(|n| n.count_event("+promoted-slave"))
        .sum();
    assert_eq!(promotions, 1, "{}", cluster.logs());

    // Up, reported, and its state file intact with the last durable config.
    assert_eq!(
        http_get(full.http, "/healthz").map(|(c, _)| c),
        Ok(200),
        "{}",
        full.logs()
    );
    let (code, body) = http_get(full.http, "/readyz").unwrap_or_else(|e| panic!("/readyz: {e}"));
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("state not writable"), "{body}");
    assert!(body.contains("No space left on device"), "{body}");
    let status = full.status().unwrap_or_else(|e| panic!("status: {e}"));
    assert!(
        status["state_error"]
            .as_str()
            .is_some_and(|e| e.contains("No space left on device")),
        "{status}"
    );
    let metrics = full.metrics().unwrap_or_else(|e| panic!("metrics: {e}"));
    assert_eq!(
        metric_value(&metrics, "picket_state_writable", &[]),
        Some(0.0)
    );
    assert!(
        metric_value(&metrics, "picket_state_write_errors_total", &[]).is_some_and(|v| v >= 1.0)
    );
    let log = full.process.stderr();
    assert!(
        log.contains("cannot write the state file"),
        "the log must say why\n{log}"
    );
    let during = state_file(pid, &data_dir);
    assert_eq!(during["groups"], before["groups"], "{during}");
    assert!(
        !inside(pid, &data_dir).join("state.json.tmp").exists(),
        "a failed write left its temporary file behind"
    );
    for n in &cluster.nodes[1..] {
        assert!(n.is_ready(), "{} is not ready\n{}", n.id, n.logs());
    }

    // Space again: the daemon persists the config it served from memory.
    fs::remove_file(&filler).unwrap_or_else(|e| panic!("remove {filler:?}: {e}"));
    wait_for(
        "picket-0 ready again with its config persisted",
        Duration::from_secs(15),
        || {
            let st = state_file(pid, &data_dir);
            full.is_ready()
                && st["groups"][GROUP]["config_epoch"].as_u64() == Some(epoch)
                && sock(&st["groups"][GROUP]["master"]).is_some()
        },
    );
    let after = state_file(pid, &data_dir);
    assert_eq!(
        sock(&after["groups"][GROUP]["master"]),
        Some(new_master),
        "{after}"
    );
    let metrics = full.metrics().unwrap_or_else(|e| panic!("metrics: {e}"));
    assert_eq!(
        metric_value(&metrics, "picket_state_writable", &[]),
        Some(1.0)
    );
    let status = full.status().unwrap_or_else(|e| panic!("status: {e}"));
    assert!(status.get("state_error").is_none(), "{status}");
    let log = full.process.stderr();
    assert!(log.contains("the state file is writable again"), "{log}");
}

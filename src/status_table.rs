//! The human-readable table `picket status` prints from `/v1/status`.

use std::fmt::Write;

use serde_json::Value;

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(x) => x.clone(),
        other => other.to_string(),
    }
}

fn age(v: &Value) -> String {
    match v.as_u64() {
        Some(ms) if ms < 10_000 => format!("{ms}ms"),
        Some(ms) => format!("{}s", ms / 1000),
        None => "-".into(),
    }
}

/// Render the status document as text tables.
pub fn render(v: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "daemon {}  announce {}  epoch {}{}",
        s(&v["id"]),
        s(&v["announce"]),
        s(&v["current_epoch"]),
        if v["tilt"].as_bool() == Some(true) {
            "  TILT"
        } else {
            ""
        }
    );
    if let Some(e) = v["state_error"].as_str() {
        let _ = writeln!(out, "STATE NOT WRITABLE (no votes, no elections): {e}");
    }
    let empty = Vec::new();
    for g in v["groups"].as_array().unwrap_or(&empty) {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "group {}  master {}  config-epoch {}  status {}  quorum {}/{} daemons",
            s(&g["name"]),
            s(&g["master"]),
            s(&g["config_epoch"]),
            s(&g["status"]),
            s(&g["quorum"]),
            s(&g["daemons"]),
        );
        if let Some(r) = g["reason"].as_str() {
            let _ = writeln!(out, "  reason: {r}");
        }
        if let Some(f) = g["failover"].as_object() {
            let _ = writeln!(
                out,
                "  {} in progress: epoch {} state {} candidate {}",
                s(&f["kind"]),
                s(&f.get("epoch").cloned().unwrap_or_default()),
                s(&f.get("state").cloned().unwrap_or_default()),
                s(&f.get("candidate").cloned().unwrap_or_default())
            );
        }
        if let Some(l) = g["last_failover"].as_object() {
            let _ = writeln!(
                out,
                "  last failover: epoch {} {} -> {} ({})",
                s(&l.get("epoch").cloned().unwrap_or_default()),
                s(&l.get("from").cloned().unwrap_or_default()),
                s(&l.get("to").cloned().unwrap_or_default()),
                s(&l.get("outcome").cloned().unwrap_or_default())
            );
        }
        if let Some(f) = g["isolation_fence"].as_object() {
            let get = |k: &str| s(&f.get(k).cloned().unwrap_or_default());
            let _ = writeln!(
                out,
                "  isolation fence: min-replicas-to-write {} (configured {}, max-lag {}s){}, in force {}{}",
                get("target"),
                get("min_replicas"),
                get("max_lag_secs"),
                if f.get("lowered").and_then(Value::as_bool) == Some(true) {
                    " LOWERED"
                } else {
                    ""
                },
                get("in_force"),
                f.get("reason")
                    .and_then(Value::as_str)
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(
            out,
            "  {:<22} {:<8} {:<8} {:<10} {:>12} {:>9} {:>9}  NOTE",
            "INSTANCE", "ROLE", "STATE", "FLAVOUR", "OFFSET", "LAST-OK", "INFO-AGE"
        );
        for i in g["instances"].as_array().unwrap_or(&empty) {
            let state = if i["sdown"].as_bool() == Some(true) {
                "DOWN"
            } else {
                "up"
            };
            let role = format!(
                "{}{}",
                s(&i["role"]),
                if i["is_master"].as_bool() == Some(true) {
                    "*"
                } else {
                    ""
                }
            );
            let note = i["last_error"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(
                    || match (i["master_host"].as_str(), i["master_port"].as_u64()) {
                        (Some(h), Some(p)) => format!(
                            "replicates {h}:{p} link {}",
                            if i["master_link_up"].as_bool() == Some(true) {
                                "up"
                            } else {
                                "down"
                            }
                        ),
                        _ => String::new(),
                    },
                );
            let _ = writeln!(
                out,
                "  {:<22} {:<8} {:<8} {:<10} {:>12} {:>9} {:>9}  {}",
                s(&i["addr"]),
                role,
                state,
                s(&i["flavour"]),
                s(&i["offset"]),
                age(&i["last_ok_ping_ms"]),
                age(&i["info_age_ms"]),
                note
            );
        }
        let peers = g["peers"].as_array().unwrap_or(&empty);
        if !peers.is_empty() {
            let _ = writeln!(
                out,
                "  {:<22} {:<10} {:>9} {:>12}  SEES-MASTER-DOWN",
                "PEER", "REACHABLE", "LAST", "CONFIG-EPOCH"
            );
            for p in peers {
                let _ = writeln!(
                    out,
                    "  {:<22} {:<10} {:>9} {:>12}  {}",
                    s(&p["addr"]),
                    if p["reachable"].as_bool() == Some(true) {
                        "yes"
                    } else {
                        "NO"
                    },
                    age(&p["last_hello_ms"]),
                    s(&p["config_epoch"]),
                    if p["sees_master_down"].as_bool() == Some(true) {
                        "yes"
                    } else {
                        "no"
                    }
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_groups_instances_and_peers() {
        let v: Value = serde_json::json!({
            "id": "abc", "announce": "127.0.0.1:26379", "current_epoch": 3, "tilt": false,
            "groups": [{
                "name": "cache", "master": "127.0.0.2:6379", "config_epoch": 2, "status": "ok",
                "quorum": 2, "daemons": 3, "reason": null, "failover": null, "last_failover": null,
                "instances": [
                    {"addr": "127.0.0.2:6379", "role": "master", "is_master": true, "sdown": false,
                     "flavour": "redis", "offset": 100, "last_ok_ping_ms": 12, "info_age_ms": 300},
                    {"addr": "127.0.0.3:6379", "role": "replica", "is_master": false, "sdown": true,
                     "flavour": "redis", "offset": 90, "last_ok_ping_ms": 12000, "info_age_ms": 15000,
                     "last_error": "connection refused"}
                ],
                "peers": [{"addr": "127.0.0.1:26380", "reachable": true, "last_hello_ms": 200,
                           "config_epoch": 2, "sees_master_down": false}]
            }]
        });
        let t = render(&v);
        assert!(
            t.contains("group cache  master 127.0.0.2:6379  config-epoch 2  status ok"),
            "{t}"
        );
        assert!(t.contains("master*"), "{t}");
        assert!(t.contains("DOWN"), "{t}");
        assert!(t.contains("connection refused"), "{t}");
        assert!(t.contains("127.0.0.1:26380"), "{t}");
        assert!(t.contains("12s"), "{t}");
        assert!(!t.contains("isolation fence"), "{t}");
    }

    #[test]
    fn renders_the_isolation_fence() {
        let v: Value = serde_json::json!({
            "id": "abc", "groups": [{
                "name": "cache", "isolation_fence": {
                    "min_replicas": 1, "max_lag_secs": 1, "target": 0, "lowered": true,
                    "in_force": 0, "reason": "lowered: at least 2 daemons see the master up and at most 0 replicas up"
                }
            }]
        });
        let t = render(&v);
        assert!(
            t.contains("isolation fence: min-replicas-to-write 0 (configured 1, max-lag 1s) LOWERED, in force 0 (lowered: at least 2"),
            "{t}"
        );
    }
}

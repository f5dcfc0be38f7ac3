//! A fresh daemon's /metrics already has every series the alert rules
//! (docs/prometheus/picket-alerts.yml) and the dashboard
//! (docs/grafana/picket.json) read, for every label set the configuration
//! makes known, the counters at 0. Without that, `increase()` of a counter
//! that first appears with the value 1 (the first failover) stays 0 and
//! the alert never fires; panels show "no data" instead of 0.
//!
//! The daemon has two groups (one with a `file`, a `webhook`, an `exec`
//! and a `memory` backend, one with none) and one configured peer that is
//! not running.

use picket_harness::obs_support;

use std::collections::BTreeSet;
use std::time::Duration;

use obs_support::{all_queries, base_name, picket_names, selectors};
use picket_harness::{
    ClusterPlan, PicketNode, RedisServer, Topology, free_port, group_toml, metric_value,
    next_loopback_ip,
};

// The label values docs/metrics.md promises, written out here rather than
// taken from src/metrics.rs so that a value dropped there is noticed.
const FAILOVER_RESULTS: &[&str] = &["completed", "completed_with_timeout", "aborted"];
const ELECTION_RESULTS: &[&str] = &["won", "lost", "split"];
const API_REASONS: &[&str] = &[
    "max_clients",
    "slow_subscriber",
    "reply_too_large",
    "too_many_args",
    "frame_too_large",
    "protocol",
    "io",
];
const WRITE_RESULTS: &[&str] = &["ok", "stale", "transient", "permanent"];
const PROBE_KINDS: &[&str] = &["refused", "connect", "timeout", "io", "closed"];
const SDOWN_REASONS: &[&str] = &["silence", "refused", "reboot"];
const SYNC_HOLD_RESULTS: &[&str] = &["held", "released", "refused"];

/// One expected series: name, labels, and whether it must be 0 on a fresh
/// daemon (counters of events that cannot have happened yet).
struct Expected {
    name: &'static str,
    labels: Vec<(&'static str, String)>,
    zero: bool,
}

fn series(name: &'static str, labels: &[(&'static str, &str)], zero: bool) -> Expected {
    Expected {
        name,
        labels: labels.iter().map(|(k, v)| (*k, (*v).to_string())).collect(),
        zero,
    }
}

/// `_bucket{le="+Inf"}`, `_sum` and `_count` of a histogram.
fn histogram(
    out: &mut Vec<Expected>,
    base: &'static str,
    labels: &[(&'static str, &str)],
    zero: bool,
) {
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let mut with_le = labels.to_vec();
    with_le.push(("le", "+Inf"));
    out.push(series(leak(format!("{base}_bucket")), &with_le, zero));
    out.push(series(leak(format!("{base}_sum")), labels, zero));
    out.push(series(leak(format!("{base}_count")), labels, zero));
}

fn expected(groups: &[(&str, Vec<String>)], backends: &[&str], peer: &str) -> Vec<Expected> {
    let mut out = vec![
        series("picket_current_epoch", &[], false),
        series("picket_tilt", &[], true),
        series("picket_tilt_total", &[], true),
        series("picket_state_writable", &[], false),
        series("picket_state_write_errors_total", &[], true),
        series("picket_api_clients", &[], false),
        series("picket_peer_up", &[("peer", peer)], true),
        series("picket_api_auth_failures_total", &[], true),
    ];
    for r in API_REASONS {
        out.push(series("picket_api_rejected_total", &[("reason", r)], true));
    }
    for (g, servers) in groups {
        let g = *g;
        for name in ["picket_group_config_epoch", "picket_group_quorum_reachable"] {
            out.push(series(name, &[("group", g)], false));
        }
        for name in ["picket_group_master_sdown", "picket_group_master_odown"] {
            out.push(series(name, &[("group", g)], true));
        }
        for name in ["picket_votes_granted_total", "picket_demotions_total"] {
            out.push(series(name, &[("group", g)], true));
        }
        for r in SDOWN_REASONS {
            out.push(series(
                "picket_sdown_total",
                &[("group", g), ("reason", r)],
                true,
            ));
        }
        for r in SYNC_HOLD_RESULTS {
            out.push(series(
                "picket_sync_holds_total",
                &[("group", g), ("result", r)],
                true,
            ));
        }
        for r in FAILOVER_RESULTS {
            out.push(series(
                "picket_failovers_total",
                &[("group", g), ("result", r)],
                true,
            ));
        }
        for r in ELECTION_RESULTS {
            out.push(series(
                "picket_elections_total",
                &[("group", g), ("result", r)],
                true,
            ));
        }
        histogram(
            &mut out,
            "picket_failover_duration_seconds",
            &[("group", g)],
            true,
        );
        if g == "cache" {
            // The only group with isolation fencing.
            out.push(series(
                "picket_isolation_fence_min_replicas",
                &[("group", g)],
                false,
            ));
            out.push(series(
                "picket_isolation_fence_lowered",
                &[("group", g)],
                true,
            ));
            out.push(series(
                "picket_isolation_fence_errors_total",
                &[("group", g)],
                true,
            ));
            for c in ["raised", "lowered", "cleared"] {
                out.push(series(
                    "picket_isolation_fence_changes_total",
                    &[("group", g), ("change", c)],
                    true,
                ));
            }
        }
        out.push(series(
            "picket_group_master",
            &[("group", g), ("server", &servers[0])],
            false,
        ));
        for s in servers {
            let gs = [("group", g), ("server", s.as_str())];
            out.push(series("picket_instance_up", &gs, false));
            out.push(series("picket_instance_info_age_seconds", &gs, false));
            for role in ["master", "replica"] {
                out.push(series(
                    "picket_instance_role",
                    &[("group", g), ("server", s), ("role", role)],
                    false,
                ));
            }
            for k in PROBE_KINDS {
                out.push(series(
                    "picket_probe_errors_total",
                    &[("group", g), ("server", s), ("kind", k)],
                    true,
                ));
            }
            out.push(series("picket_instance_reboots_total", &gs, true));
            histogram(&mut out, "picket_probe_duration_seconds", &gs, false);
        }
    }
    for b in backends {
        for r in WRITE_RESULTS {
            // Not necessarily 0: adopting the master at start-up publishes.
            out.push(series(
                "picket_discovery_writes_total",
                &[("backend", b), ("result", r)],
                false,
            ));
        }
        histogram(
            &mut out,
            "picket_discovery_write_duration_seconds",
            &[("backend", b)],
            false,
        );
    }
    out
}

fn missing<'a>(text: &str, want: &'a [Expected]) -> Vec<&'a Expected> {
    want.iter()
        .filter(|e| {
            let labels: Vec<(&str, &str)> =
                e.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
            metric_value(text, e.name, &labels).is_none()
        })
        .collect()
}

fn describe(e: &Expected) -> String {
    let labels: Vec<String> = e.labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    format!("{}{{{}}}", e.name, labels.join(","))
}

#[test]
fn a_fresh_daemon_exports_every_series_the_rules_and_the_dashboard_read() {
    let topo = Topology::master_with_replicas(1);
    let sessions = RedisServer::start_fresh(Default::default());
    let dir = tempfile::tempdir().unwrap();
    // Nobody listens there: webhook writes fail (transient), never block.
    let ip = next_loopback_ip();
    let hook = format!("http://{ip}:{}/hook", free_port(&ip));
    let backends = format!(
        "[[group.discovery]]\ntype = \"file\"\npath = \"{}/cache.json\"\n\n\
         [[group.discovery]]\ntype = \"webhook\"\nurl = \"{hook}\"\n\n\
         [[group.discovery]]\ntype = \"exec\"\ncommand = [\"/bin/true\"]\n\n\
         [[group.discovery]]\ntype = \"memory\"\n\n\
         [group.isolation_fencing]\nmin_replicas = 1\n",
        dir.path().display()
    );
    let groups = format!(
        "{}{}",
        group_toml("cache", topo.master.addr(), 1, &backends),
        group_toml("sessions", sessions.addr(), 1, "")
    );
    // Two daemons planned, one started: the other is a configured peer
    // that never answers.
    let plan = ClusterPlan::new(2);
    let resp = plan.resp.clone();
    let node: PicketNode = plan.spawn_node(0, &groups, &|_, j| resp[j].to_string(), None, &[]);
    picket_harness::wait_for("the daemon ready", picket_harness::READY_TIMEOUT, || {
        node.is_ready()
    });

    let want = expected(
        &[
            (
                "cache",
                vec![
                    topo.master.addr().to_string(),
                    topo.replicas[0].addr().to_string(),
                ],
            ),
            ("sessions", vec![sessions.addr().to_string()]),
        ],
        &["file", "webhook", "exec", "memory"],
        &plan.resp[1].to_string(),
    );

    // The gauges of what the daemon observes (role, INFO age, quorum) need
    // its first tick and INFO reply; everything else is there at once.
    let mut text = String::new();
    let mut absent = Vec::new();
    let seen = std::time::Instant::now();
    while seen.elapsed() < Duration::from_secs(15) {
        text = node.metrics().unwrap_or_default();
        absent = missing(&text, &want);
        if absent.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let absent: Vec<String> = absent.into_iter().map(describe).collect();
    assert!(
        absent.is_empty(),
        "series missing from a fresh daemon's /metrics: {absent:#?}\n{text}\n{}",
        node.logs()
    );

    // Nothing happened yet: the event counters are at 0 (a counter that
    // starts at 0 is what makes the first event visible to increase()).
    for e in want.iter().filter(|e| e.zero) {
        let labels: Vec<(&str, &str)> = e.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let v = metric_value(&text, e.name, &labels);
        assert_eq!(v, Some(0.0), "{} on a fresh daemon", describe(e));
    }

    // Every metric a rule or a panel reads is among the expected ones, and
    // every label value a query matches on is one that is registered.
    let mut names: BTreeSet<&str> = want.iter().map(|e| base_name(e.name)).collect();
    // Labelled by the refused command and the user: no value exists before
    // the first refusal, so a panel's rate() is simply empty until then;
    // tests/it/auth.rs checks it counts each refusal.
    names.insert("picket_api_refused_total");
    // Registered only for a Kubernetes backend in pod-labels mode whose
    // Service is named (this daemon has none); the waits it records are
    // checked through the backend's gate status in tests/it/kubernetes.rs.
    names.insert("picket_discovery_gate_wait_seconds");
    // Set only for a group with a pod-labels backend that skips the Service
    // gate (this daemon has none); tests/it/discovery_e2e.rs checks the
    // series of such a group.
    names.insert("picket_discovery_gate_skipped");
    for (from, expr) in all_queries() {
        for n in picket_names(&expr) {
            assert!(
                names.contains(base_name(&n)),
                "{from}: {n} is not checked here; add its series to expected()"
            );
        }
        for (n, matchers) in selectors(&expr) {
            for (k, v) in matchers {
                let known: &[&str] = match k.as_str() {
                    "result" if n.starts_with("picket_failovers") => FAILOVER_RESULTS,
                    "result" if n.starts_with("picket_elections") => ELECTION_RESULTS,
                    "result" if n.starts_with("picket_sync_holds") => SYNC_HOLD_RESULTS,
                    "result" => WRITE_RESULTS,
                    "reason" if n.starts_with("picket_sdown") => SDOWN_REASONS,
                    "reason" => API_REASONS,
                    "kind" => PROBE_KINDS,
                    _ => continue,
                };
                for alt in v.split('|') {
                    assert!(
                        known.contains(&alt),
                        "{from}: {n}{{{k}={alt:?}}} is never registered"
                    );
                }
            }
        }
    }
    drop(node);
}

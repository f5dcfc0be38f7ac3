//! The observability files under docs/ stay true to the code:
//! docs/metrics.md lists exactly the metrics the source defines, the
//! Grafana dashboard is valid JSON whose every query uses existing metrics,
//! and the Prometheus alert rules have the expected shape, use existing
//! metrics and pass `promtool check rules` and their unit tests
//! (`promtool test rules`).

use picket_harness::obs_support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use obs_support::{ROOT, Rule, alert_rules, exprs, picket_names, read};

/// The metric names the source defines: the string constants of
/// src/metrics.rs and of the discovery runner, with whether each is a
/// histogram (exported as `_bucket`, `_sum`, `_count`): their doc comments
/// start with the metric type.
fn defined_metrics() -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    for file in ["src/metrics.rs", "src/discovery/runner.rs"] {
        let mut doc = String::new();
        for line in read(file).lines() {
            let line = line.trim();
            if let Some(d) = line.strip_prefix("///") {
                if doc.is_empty() {
                    doc = d.trim().to_string();
                }
                continue;
            }
            if line.starts_with("pub const ") && line.contains(": &str = \"picket_") {
                let name = line
                    .split('"')
                    .nth(1)
                    .unwrap_or_else(|| panic!("{file}: {line}"));
                let kind = doc.split([' ', '`', ':']).next().unwrap_or("");
                assert!(
                    ["Gauge", "Counter", "Histogram"].contains(&kind),
                    "{file}: the doc of {name} does not start with its type: {doc:?}"
                );
                out.insert(name.to_string(), kind == "Histogram");
            }
            doc.clear();
        }
    }
    assert!(
        out.len() >= 20,
        "found only {} metric constants: {out:?}",
        out.len()
    );
    out
}

/// Whether `name` (as written in a query) is a series picket exports.
fn exported(name: &str, defined: &BTreeMap<String, bool>) -> bool {
    if defined.contains_key(name) {
        return true;
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| {
        name.strip_suffix(suffix)
            .is_some_and(|base| defined.get(base) == Some(&true))
    })
}

#[test]
fn the_metric_names_are_found_in_the_source() {
    let defined = defined_metrics();
    for name in [
        "picket_group_quorum_reachable",
        "picket_tilt",
        "picket_peer_up",
        "picket_failovers_total",
        "picket_discovery_writes_total",
    ] {
        assert!(defined.contains_key(name), "{name} not found: {defined:?}");
    }
    assert_eq!(defined.get("picket_failover_duration_seconds"), Some(&true));
    assert_eq!(defined.get("picket_probe_duration_seconds"), Some(&true));
    assert_eq!(
        defined.get("picket_discovery_write_duration_seconds"),
        Some(&true)
    );
    assert_eq!(
        defined.get("picket_instance_info_age_seconds"),
        Some(&false),
        "a gauge"
    );
}

#[test]
fn docs_metrics_md_lists_exactly_the_defined_metrics() {
    let defined = defined_metrics();
    let doc = read("docs/metrics.md");
    // The tables: one row per metric, its name in the first cell.
    let rows: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("picket_"))
        .map(str::to_string)
        .collect();
    let want: BTreeSet<String> = defined.keys().cloned().collect();
    let missing: Vec<_> = want.difference(&rows).collect();
    let unknown: Vec<_> = rows.difference(&want).collect();
    assert!(missing.is_empty(), "not documented: {missing:?}");
    assert!(
        unknown.is_empty(),
        "documented but not defined: {unknown:?}"
    );
    // And no prose or example query names a metric that does not exist.
    for name in picket_names(&doc) {
        assert!(exported(&name, &defined), "docs/metrics.md mentions {name}");
    }
}

#[test]
fn alert_rules_have_the_expected_shape_and_use_existing_metrics() {
    let defined = defined_metrics();
    let rules = alert_rules();
    let by_name: BTreeMap<&str, &Rule> = rules.iter().map(|r| (r.alert.as_str(), r)).collect();
    assert_eq!(by_name.len(), rules.len(), "alert names are unique");
    // The alerts the operations guide promises, on the metric each watches.
    let required = [
        ("PicketFailover", "picket_failovers_total"),
        ("PicketQuorumLost", "picket_group_quorum_reachable == 0"),
        ("PicketDaemonDown", "up{job=\"picket\"} == 0"),
        (
            "PicketDiscoveryWriteFailing",
            "picket_discovery_writes_total",
        ),
        ("PicketStallProtection", "picket_tilt == 1"),
        ("PicketPeerDown", "picket_peer_up == 0"),
        ("PicketStateNotWritable", "picket_state_writable == 0"),
    ];
    for (alert, needle) in required {
        let rule = by_name
            .get(alert)
            .unwrap_or_else(|| panic!("no alert {alert}"));
        assert!(rule.expr.contains(needle), "{alert}: {}", rule.expr);
    }
    for r in &rules {
        assert!(
            ["critical", "warning", "info"].contains(&r.labels["severity"].as_str()),
            "{}: severity {:?}",
            r.alert,
            r.labels.get("severity")
        );
        for key in ["summary", "description"] {
            assert!(
                r.annotations.get(key).is_some_and(|s| !s.trim().is_empty()),
                "{}: no {key}",
                r.alert
            );
        }
        if let Some(f) = &r.for_ {
            assert!(humantime::parse_duration(f).is_ok(), "{}: for {f}", r.alert);
        }
        for name in picket_names(&r.expr) {
            assert!(
                exported(&name, &defined),
                "{}: unknown metric {name}",
                r.alert
            );
        }
    }
}

fn promtool() -> Command {
    let probe = Command::new("promtool").arg("--version").output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "promtool is needed to check docs/prometheus (Debian: apt-get install -y --no-install-recommends prometheus)"
    );
    let mut c = Command::new("promtool");
    c.current_dir(Path::new(ROOT).join("docs/prometheus"));
    c
}

#[test]
fn promtool_accepts_the_rules_and_their_unit_tests_pass() {
    let check = promtool()
        .args(["check", "rules", "picket-alerts.yml"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(check.status.success(), "promtool check rules:\n{text}");
    let n = alert_rules().len();
    assert!(
        text.contains(&format!("SUCCESS: {n} rules found")),
        "{text}"
    );

    let test = promtool()
        .args(["test", "rules", "picket-alerts.test.yml"])
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
    // Every alert has at least one unit test.
    let tests = read("docs/prometheus/picket-alerts.test.yml");
    for r in alert_rules() {
        assert!(
            tests.contains(&format!("alertname: {}\n", r.alert)),
            "no unit test for {}",
            r.alert
        );
    }
}

#[test]
fn the_grafana_dashboard_is_valid_and_queries_existing_metrics() {
    let defined = defined_metrics();
    let dash: serde_json::Value =
        serde_json::from_str(&read("docs/grafana/picket.json")).expect("valid JSON");
    assert_eq!(dash["title"], "picket");
    let panels = dash["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().expect("panel id")),
            "duplicate id"
        );
        let grid = &p["gridPos"];
        for k in ["h", "w", "x", "y"] {
            assert!(grid[k].is_u64(), "{}: gridPos.{k}", p["title"]);
        }
        if p["type"] != "row" {
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{}: no query", p["title"]);
        }
    }
    let mut all = Vec::new();
    exprs(&dash, "", &mut all);
    let mut used = BTreeSet::new();
    for (title, e) in &all {
        let names = picket_names(e);
        assert!(
            !names.is_empty() || e.contains("up{"),
            "{title}: {e} uses no picket metric"
        );
        for n in names {
            assert!(exported(&n, &defined), "{title}: unknown metric {n} in {e}");
            used.insert(
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| n.strip_suffix(s).filter(|b| defined.contains_key(*b)))
                    .unwrap_or(&n)
                    .to_string(),
            );
        }
    }
    // The dashboard shows every metric.
    let unused: Vec<_> = defined.keys().filter(|k| !used.contains(*k)).collect();
    assert!(unused.is_empty(), "metrics without a panel: {unused:?}");
}

#[test]
fn name_extraction_sees_whole_identifiers_only() {
    let names = picket_names("rate(picket_a_total[5m]) + xpicket_b + picket_c_bucket{le=\"1\"}");
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["picket_a_total", "picket_c_bucket"]
    );
}

/// Every key of a TOML table, recursively (`group.discovery.timeout` is
/// reported as `timeout`).
fn toml_keys(v: &toml::Value, out: &mut BTreeSet<String>) {
    match v {
        toml::Value::Table(t) => {
            for (k, val) in t {
                out.insert(k.clone());
                toml_keys(val, out);
            }
        }
        toml::Value::Array(a) => a.iter().for_each(|x| toml_keys(x, out)),
        _ => {}
    }
}

#[test]
fn the_configuration_reference_documents_every_key_of_the_example() {
    let example: toml::Value = toml::from_str(&read("config/picket.toml")).unwrap();
    let mut keys = BTreeSet::new();
    toml_keys(&example, &mut keys);
    assert!(keys.len() > 40, "{keys:?}");
    let doc = read("docs/configuration.md");
    for k in &keys {
        // Keys as `key`, tables as their header (`[daemon]`, `[[group.discovery]]`).
        assert!(
            doc.contains(&format!("`{k}`")) || doc.contains(&format!("{k}]")),
            "docs/configuration.md lacks `{k}`"
        );
    }
    // Both default ports and the state directory match the systemd unit and
    // the image.
    for s in [
        "`\"0.0.0.0:26379\"`",
        "`\"0.0.0.0:9479\"`",
        "`\"/var/lib/picket\"`",
    ] {
        assert!(doc.contains(s), "{s}");
    }
}

#[test]
fn relative_links_in_the_operations_docs_resolve() {
    for file in [
        "docs/operations.md",
        "docs/configuration.md",
        "docs/metrics.md",
    ] {
        let text = read(file);
        let dir = Path::new(ROOT).join(file);
        let dir = dir.parent().unwrap();
        let mut n = 0;
        for part in text.split("](").skip(1) {
            let target = part.split(')').next().unwrap_or("");
            if target.starts_with("http") || target.starts_with('#') || target.is_empty() {
                continue;
            }
            let path = target.split('#').next().unwrap();
            assert!(dir.join(path).exists(), "{file}: broken link {target}");
            n += 1;
        }
        assert!(n > 0, "{file}: no relative link checked");
    }
}

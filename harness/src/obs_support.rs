//! The observability files under docs/ as data, for the tests that check
//! them against the source (ops_docs), a fresh daemon's /metrics
//! (metrics_startup) and a real Prometheus (prometheus): the metric names
//! in a query, the alert rules, the dashboard's queries.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Deserialize;

/// The repository root.
pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// A file of the repository, by path relative to its root.
pub fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every `picket_...` identifier in `text`.
pub fn picket_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(pos) = text[i..].find("picket_") {
        let start = i + pos;
        let boundary = start == 0 || {
            let c = bytes[start - 1];
            !(c.is_ascii_alphanumeric() || c == b'_')
        };
        let mut end = start + "picket_".len();
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if boundary && end > start + "picket_".len() {
            out.insert(text[start..end].to_string());
        }
        i = end;
    }
    out
}

/// `name` without a histogram's series suffix (`_bucket`, `_sum`, `_count`)
/// when it has one.
pub fn base_name(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

/// The label matchers written right after each `picket_...` name in
/// `expr`: `(name, [(label, value)])`, values as written (a regex for
/// `=~`).
pub fn selectors(expr: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    for name in picket_names(expr) {
        for (pos, _) in expr.match_indices(name.as_str()) {
            let after = &expr[pos + name.len()..];
            let next = after.chars().next();
            if next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue; // a longer name
            }
            let mut matchers = Vec::new();
            if let Some(body) = after.strip_prefix('{').and_then(|b| b.split('}').next()) {
                for m in body.split(',') {
                    let Some((k, v)) = m.split_once('=') else {
                        continue;
                    };
                    let k = k.trim().trim_end_matches(['!', '~']).trim();
                    let v = v.trim_start_matches(['~']).trim().trim_matches('"');
                    matchers.push((k.to_string(), v.to_string()));
                }
            }
            out.push((name.clone(), matchers));
        }
    }
    out
}

/// `docs/prometheus/picket-alerts.yml`.
#[derive(Debug, Deserialize)]
pub struct RuleFile {
    /// Its rule groups (one: `picket`).
    pub groups: Vec<RuleGroup>,
}

/// A rule group.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleGroup {
    /// Its name.
    pub name: String,
    /// Its alerts.
    pub rules: Vec<Rule>,
}

/// An alerting rule.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// `alert`.
    pub alert: String,
    /// `expr`.
    pub expr: String,
    /// `for`.
    #[serde(rename = "for")]
    pub for_: Option<String>,
    /// `labels`.
    pub labels: BTreeMap<String, String>,
    /// `annotations`.
    pub annotations: BTreeMap<String, String>,
}

/// Every alert of the rules file, in file order.
pub fn alert_rules() -> Vec<Rule> {
    let file: RuleFile = serde_saphyr::from_str(&read("docs/prometheus/picket-alerts.yml"))
        .unwrap_or_else(|e| panic!("picket-alerts.yml: {e}"));
    assert_eq!(file.groups.len(), 1);
    assert_eq!(file.groups[0].name, "picket");
    file.groups.into_iter().flat_map(|g| g.rules).collect()
}

/// Every `expr` in a JSON document, with the title of its panel.
pub fn exprs(v: &serde_json::Value, title: &str, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(m) => {
            let title = m.get("title").and_then(|t| t.as_str()).unwrap_or(title);
            for (k, val) in m {
                if k == "expr"
                    && let Some(e) = val.as_str()
                {
                    out.push((title.to_string(), e.to_string()));
                } else {
                    exprs(val, title, out);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| exprs(x, title, out)),
        _ => {}
    }
}

/// `docs/grafana/picket.json`.
pub fn dashboard() -> serde_json::Value {
    serde_json::from_str(&read("docs/grafana/picket.json")).expect("valid JSON")
}

/// Every query of the dashboard, with its panel's title.
pub fn dashboard_exprs() -> Vec<(String, String)> {
    let mut all = Vec::new();
    exprs(&dashboard(), "", &mut all);
    all
}

/// Every query of the rules and the dashboard, with where it is from.
pub fn all_queries() -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = alert_rules()
        .into_iter()
        .map(|r| (format!("alert {}", r.alert), r.expr))
        .collect();
    out.extend(
        dashboard_exprs()
            .into_iter()
            .map(|(t, e)| (format!("panel {t}"), e)),
    );
    out
}

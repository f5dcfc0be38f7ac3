//! Every metric name in one place, with its help text. Names are prefixed
//! `picket_`; counters end in `_total`, durations in `_seconds`.
//!
//! A counter that first appears with the value 1 is invisible to
//! `increase()` and `rate()` (there is no earlier sample to compare with),
//! so an alert on the first failover would never fire. Every series an
//! alert rule or a dashboard panel reads is therefore registered with 0 as
//! soon as its labels are known: the daemon-wide ones at [`install`], a
//! group's at [`register_group`], an instance's at [`register_instance`].

use metrics::SharedString;
use metrics::{describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Gauge `{group,server}`: 1 when this daemon does not see the instance SDOWN.
pub const INSTANCE_UP: &str = "picket_instance_up";
/// Gauge `{group,server,role}`: 1 for the role the instance reports.
pub const INSTANCE_ROLE: &str = "picket_instance_role";
/// Gauge `{group,server}`: seconds since the last INFO reply.
pub const INFO_AGE: &str = "picket_instance_info_age_seconds";
/// Histogram `{group,server}`: PING/INFO round-trip time.
pub const PROBE_DURATION: &str = "picket_probe_duration_seconds";
/// Counter `{group,server,kind}`: failed probes by kind.
pub const PROBE_ERRORS: &str = "picket_probe_errors_total";
/// Gauge `{group,server}`: 1 for the instance this daemon advertises as master.
pub const GROUP_MASTER: &str = "picket_group_master";
/// Gauge `{group}`: the group's config epoch.
pub const CONFIG_EPOCH: &str = "picket_group_config_epoch";
/// Gauge: this daemon's current epoch.
pub const CURRENT_EPOCH: &str = "picket_current_epoch";
/// Gauge `{group}`: 1 while the master is SDOWN for this daemon.
pub const MASTER_SDOWN: &str = "picket_group_master_sdown";
/// Counter `{group,reason}`: instances this daemon saw go SDOWN, by
/// reason (`silence`, `refused`, `reboot`).
pub const SDOWN_TOTAL: &str = "picket_sdown_total";
/// Counter `{group,server}`: restarts of the instance this daemon saw
/// (`+reboot`).
pub const INSTANCE_REBOOTS: &str = "picket_instance_reboots_total";
/// Counter `{group,result}`: sync holds on a master reconnected to after
/// it was lost (`probe::hold`): `held` (put on), `released` (set back),
/// `refused` (the server refused CONFIG; a release that failed too).
pub const SYNC_HOLDS: &str = "picket_sync_holds_total";
/// The results of [`SYNC_HOLDS`].
pub const SYNC_HOLD_RESULTS: &[&str] = &["held", "released", "refused"];
/// The reasons of [`SDOWN_TOTAL`].
pub const SDOWN_REASONS: &[&str] = &["silence", "refused", "reboot"];
/// Gauge `{group}`: 1 while the master is ODOWN.
pub const MASTER_ODOWN: &str = "picket_group_master_odown";
/// Gauge `{group}`: 1 when enough daemons are reachable to fail over.
pub const QUORUM_REACHABLE: &str = "picket_group_quorum_reachable";
/// Counter `{group,result}`: failovers by result (completed, aborted, ...).
pub const FAILOVERS: &str = "picket_failovers_total";
/// Histogram `{group}`: from the start of the election to publication.
pub const FAILOVER_DURATION: &str = "picket_failover_duration_seconds";
/// Counter `{group,result}`: elections this daemon started, by result.
pub const ELECTIONS: &str = "picket_elections_total";
/// Counter `{group}`: votes this daemon granted.
pub const VOTES_GRANTED: &str = "picket_votes_granted_total";
/// Gauge `{peer}`: 1 when the peer answered recently.
pub const PEER_UP: &str = "picket_peer_up";
/// Counter `{group}`: returning old masters demoted.
pub const DEMOTIONS: &str = "picket_demotions_total";
/// Gauge `{group}`: the `min-replicas-to-write` this daemon keeps on the
/// master (isolation fencing): the configured value, or less while lowered.
pub const FENCE_MIN_REPLICAS: &str = "picket_isolation_fence_min_replicas";
/// Gauge `{group}`: 1 while the isolation fence is lowered below the
/// configured `min_replicas` (too few replicas up for the daemons).
pub const FENCE_LOWERED: &str = "picket_isolation_fence_lowered";
/// Counter `{group,change}`: changes this daemon made to the isolation
/// fence of a server (`raised`, `lowered` on the master; `cleared` on a
/// replica).
pub const FENCE_CHANGES: &str = "picket_isolation_fence_changes_total";
/// Counter `{group}`: failed attempts to read or set the isolation fence.
pub const FENCE_ERRORS: &str = "picket_isolation_fence_errors_total";
/// Gauge: 1 while stall protection (TILT) is active.
pub const TILT: &str = "picket_tilt";
/// Counter: stalls of the daemon's own timer detected.
pub const TILTS: &str = "picket_tilt_total";
/// Gauge: connected clients on the RESP listener.
pub const API_CLIENTS: &str = "picket_api_clients";
/// Counter `{reason}`: client connections refused or closed for a limit.
pub const API_REJECTED: &str = "picket_api_rejected_total";
/// Counter `{command,user}`: commands refused for want of a permission
/// (`NOPERM`).
pub const API_REFUSED: &str = "picket_api_refused_total";
/// Counter: failed `AUTH` attempts (wrong user or password).
pub const API_AUTH_FAILURES: &str = "picket_api_auth_failures_total";
/// Counter `{backend,result}`: discovery writes.
pub const DISCOVERY_WRITES: &str = "picket_discovery_writes_total";
/// Histogram `{backend}`: discovery write latency.
pub const DISCOVERY_WRITE_DURATION: &str = "picket_discovery_write_duration_seconds";
/// Histogram: how long a Kubernetes fence or publication waited for the
/// Service's EndpointSlices (`backend`, `gate` = fence|publish, `result` =
/// ok|timeout|error); only for pod-labels backends with `service`.
pub const DISCOVERY_GATE_WAIT: &str = "picket_discovery_gate_wait_seconds";
/// Gauge `{group}`: how many of the group's pod-labels backends run with
/// `skip_service_gate = true` (their fence is not verified on the
/// Service); only for groups that have any.
pub const DISCOVERY_GATE_SKIPPED: &str = "picket_discovery_gate_skipped";

/// Gauge: 1 while `data_dir/state.json` can be written, 0 after a write
/// failed (the daemon then neither votes nor starts elections).
pub const STATE_WRITABLE: &str = "picket_state_writable";
/// Counter: failed writes of the state file.
pub const STATE_WRITE_ERRORS: &str = "picket_state_write_errors_total";

/// The label naming a data server (`host:port`). Not `instance`: that is
/// Prometheus' own target label, and the collision renamed ours to
/// `exported_instance` in every query.
pub const SERVER_LABEL: &str = "server";

/// Values of `result` of [`FAILOVERS`] (set in the group task).
pub const FAILOVER_RESULTS: &[&str] = &["completed", "completed_with_timeout", "aborted"];
/// Values of `result` of [`ELECTIONS`] (set in the group task).
pub const ELECTION_RESULTS: &[&str] = &["won", "lost", "split"];
/// Values of `reason` of [`API_REJECTED`] (the listener, the connection
/// handler and `RequestError::reason`).
pub const API_REJECTED_REASONS: &[&str] = &[
    "max_clients",
    "slow_subscriber",
    "reply_too_large",
    "too_many_args",
    "frame_too_large",
    "protocol",
    "io",
];
/// Values of `result` of [`DISCOVERY_WRITES`] (`WriteResult::label`).
pub const DISCOVERY_RESULTS: &[&str] = &["ok", "stale", "transient", "permanent"];
/// Values of `kind` of [`PROBE_ERRORS`] registered for every instance: the
/// ways a connection to a server that went away fails. The other kinds
/// (`protocol`, `tls`, the server's error classes, ...) are rare and appear
/// at their first occurrence; registering all of them for every instance
/// would add 17 series per instance.
pub const PROBE_CONNECTION_ERRORS: &[&str] = &["refused", "connect", "timeout", "io", "closed"];

/// Buckets for every `_seconds` histogram: from 100 µs to 30 s.
pub const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// Describe every metric (help texts) on the installed recorder.
pub fn describe() {
    describe_gauge!(
        INSTANCE_UP,
        "1 when this daemon does not see the instance down (SDOWN)"
    );
    describe_gauge!(INSTANCE_ROLE, "1 for the role the instance last reported");
    describe_gauge!(
        INFO_AGE,
        "Seconds since the last INFO reply of the instance"
    );
    describe_histogram!(PROBE_DURATION, "Round-trip time of PING and INFO probes");
    describe_counter!(PROBE_ERRORS, "Failed probes, by kind of failure");
    describe_gauge!(
        GROUP_MASTER,
        "1 for the instance this daemon advertises as master"
    );
    describe_gauge!(CONFIG_EPOCH, "Config epoch of the group's current master");
    describe_gauge!(CURRENT_EPOCH, "This daemon's current epoch");
    describe_gauge!(MASTER_SDOWN, "1 while this daemon sees the master down");
    describe_gauge!(MASTER_ODOWN, "1 while the quorum sees the master down");
    describe_counter!(
        SDOWN_TOTAL,
        "Instances this daemon saw go down (SDOWN), by reason: silence for down_after, connections refused for down_after_refused, a master restarted with less than its replicas"
    );
    describe_counter!(
        INSTANCE_REBOOTS,
        "Restarts of the instance this daemon saw (+reboot)"
    );
    describe_counter!(
        SYNC_HOLDS,
        "Holds of full copies from a master reconnected to after it was lost, by result: held, released, refused"
    );
    describe_gauge!(
        QUORUM_REACHABLE,
        "1 when enough daemons are reachable to authorise a failover"
    );
    describe_counter!(FAILOVERS, "Failovers led by this daemon, by result");
    describe_histogram!(
        FAILOVER_DURATION,
        "Time from the election to the publication of the new master"
    );
    describe_counter!(ELECTIONS, "Elections started by this daemon, by result");
    describe_counter!(VOTES_GRANTED, "Votes this daemon granted to a candidate");
    describe_gauge!(PEER_UP, "1 when the peer daemon answered recently");
    describe_counter!(DEMOTIONS, "Returning old masters demoted");
    describe_gauge!(
        FENCE_MIN_REPLICAS,
        "The min-replicas-to-write this daemon keeps on the master (isolation fencing)"
    );
    describe_gauge!(
        FENCE_LOWERED,
        "1 while the isolation fence is lowered below min_replicas (too few replicas up)"
    );
    describe_counter!(
        FENCE_CHANGES,
        "Changes this daemon made to the isolation fence of a server, by change"
    );
    describe_counter!(
        FENCE_ERRORS,
        "Failed attempts to read or set the isolation fence"
    );
    describe_gauge!(TILT, "1 while stall protection (TILT) is active");
    describe_counter!(TILTS, "Stalls of the daemon's own timer detected");
    describe_gauge!(
        STATE_WRITABLE,
        "1 while the state file can be written; 0 after a write failed (no votes, no elections)"
    );
    describe_counter!(STATE_WRITE_ERRORS, "Failed writes of the state file");
    describe_gauge!(API_CLIENTS, "Connected clients on the RESP listener");
    describe_counter!(
        API_REJECTED,
        "Client connections refused or closed for a limit"
    );
    describe_counter!(
        API_REFUSED,
        "Commands refused for want of a permission (NOPERM), by command and user"
    );
    describe_counter!(
        API_AUTH_FAILURES,
        "Failed AUTH attempts on the RESP listener"
    );
    describe_counter!(
        DISCOVERY_WRITES,
        "Writes to service-discovery backends, by result"
    );
    describe_histogram!(
        DISCOVERY_WRITE_DURATION,
        "Latency of writes to service-discovery backends"
    );
    describe_histogram!(
        DISCOVERY_GATE_WAIT,
        "Time a fence or publication waited for the Service's EndpointSlices"
    );
    describe_gauge!(
        DISCOVERY_GATE_SKIPPED,
        "Kubernetes pod-labels backends whose fence is not verified on the Service (skip_service_gate)"
    );
}

/// Install the Prometheus recorder for this process and describe the metrics.
///
/// Returns `None` when a recorder is already installed (tests running
/// several daemons in one process); metrics are then not rendered.
pub fn install() -> Option<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
        .ok()?
        .install_recorder()
        .ok()?;
    describe();
    register_daemon();
    Some(handle)
}

/// Register the daemon-wide series with 0: stall protection, the state
/// file's write errors, the API's clients and rejections by reason.
/// [`STATE_WRITABLE`] and [`CURRENT_EPOCH`] are set when the state is
/// opened, [`PEER_UP`] by the peer table.
pub fn register_daemon() {
    metrics::gauge!(TILT).set(0.0);
    metrics::counter!(TILTS).increment(0);
    metrics::counter!(STATE_WRITE_ERRORS).increment(0);
    metrics::gauge!(API_CLIENTS).increment(0.0);
    metrics::counter!(API_AUTH_FAILURES).increment(0);
    for reason in API_REJECTED_REASONS {
        metrics::counter!(API_REJECTED, "reason" => *reason).increment(0);
    }
}

/// Register a group's series when its task starts (and again when a
/// reload restarts it): the failover, election, vote and demotion counters
/// for every result, SDOWN and ODOWN (a starting group has seen neither),
/// the failover-duration histogram and, for each kind in `backends`, the
/// discovery write counters for every result and their latency histogram.
///
/// A histogram registered without a sample is rendered by
/// metrics-exporter-prometheus with every bucket at 0, so the quantile
/// panels have a series before the first failover. [`QUORUM_REACHABLE`],
/// [`CONFIG_EPOCH`] and [`GROUP_MASTER`] are left to the group task, which
/// sets their true value at start.
pub fn register_group<'a>(group: &str, backends: impl IntoIterator<Item = &'a str>) {
    let g = label(group);
    for result in FAILOVER_RESULTS {
        metrics::counter!(FAILOVERS, "group" => g.clone(), "result" => *result).increment(0);
    }
    for result in ELECTION_RESULTS {
        metrics::counter!(ELECTIONS, "group" => g.clone(), "result" => *result).increment(0);
    }
    metrics::counter!(VOTES_GRANTED, "group" => g.clone()).increment(0);
    metrics::counter!(DEMOTIONS, "group" => g.clone()).increment(0);
    metrics::gauge!(MASTER_SDOWN, "group" => g.clone()).set(0.0);
    metrics::gauge!(MASTER_ODOWN, "group" => g.clone()).set(0.0);
    for reason in SDOWN_REASONS {
        metrics::counter!(SDOWN_TOTAL, "group" => g.clone(), "reason" => *reason).increment(0);
    }
    for result in SYNC_HOLD_RESULTS {
        metrics::counter!(SYNC_HOLDS, "group" => g.clone(), "result" => *result).increment(0);
    }
    let _ = metrics::histogram!(FAILOVER_DURATION, "group" => g);
    for kind in backends {
        let kind = kind.to_string();
        for result in DISCOVERY_RESULTS {
            metrics::counter!(DISCOVERY_WRITES, "backend" => kind.clone(), "result" => *result)
                .increment(0);
        }
        let _ = metrics::histogram!(DISCOVERY_WRITE_DURATION, "backend" => kind);
    }
}

/// Values of the `gate` label of [`DISCOVERY_GATE_WAIT`] (the waits of
/// `discovery::kubernetes::gate`; kept here with the metric so that the
/// metrics do not depend on the backend that records them).
pub const GATE_KINDS: &[&str] = &["fence", "publish"];
/// Values of the `result` label of [`DISCOVERY_GATE_WAIT`].
pub const GATE_RESULTS: &[&str] = &["ok", "timeout", "error"];

/// Register the Service-gate histograms of a backend `kind` that has one
/// (pod-labels with `service`), for every gate and result, so that the
/// panels have series before the first failover.
pub fn register_gate(kind: &str) {
    for gate in GATE_KINDS {
        for result in GATE_RESULTS {
            let _ = metrics::histogram!(DISCOVERY_GATE_WAIT, "backend" => kind.to_string(),
                "gate" => *gate, "result" => *result);
        }
    }
}

/// Set [`DISCOVERY_GATE_SKIPPED`] for `group` when it has such backends
/// (`skipped`): a group without any has no series, so that the gauge does
/// not appear for configurations it says nothing about.
pub fn register_gate_skipped(group: &str, skipped: usize) {
    if skipped > 0 {
        metrics::gauge!(DISCOVERY_GATE_SKIPPED, "group" => label(group)).set(skipped as f64);
    }
}

/// Register an instance's probe series when its probe starts: the
/// round-trip histogram and the connection-failure counters
/// ([`PROBE_CONNECTION_ERRORS`]). `picket_instance_up` is set by the group
/// task, which owns the instance's state.
pub fn register_instance(group: &SharedString, server: &SharedString) {
    let _ = metrics::histogram!(PROBE_DURATION, "group" => group.clone(), SERVER_LABEL => server.clone());
    for kind in PROBE_CONNECTION_ERRORS {
        metrics::counter!(PROBE_ERRORS, "group" => group.clone(), SERVER_LABEL => server.clone(), "kind" => *kind)
            .increment(0);
    }
    metrics::counter!(INSTANCE_REBOOTS, "group" => group.clone(), SERVER_LABEL => server.clone())
        .increment(0);
}

/// A label value to be shared by many series (a group's name, an
/// instance's address): the registry keeps a reference to it instead of
/// a copy per series, and a look-up with it allocates nothing. With a
/// thousand instances and seventeen thousand series the copies were a
/// few MiB.
pub fn label(value: &str) -> SharedString {
    SharedString::from_shared(std::sync::Arc::from(value))
}

/// The (group, server) pairs of forgotten instances, whose series
/// [`render`] leaves out: metrics-exporter-prometheus cannot delete a
/// series, and a forgotten server's `picket_instance_up 0` would keep an
/// "instance down" alert firing for as long as the process lives.
static FORGOTTEN: std::sync::LazyLock<
    std::sync::Mutex<std::collections::BTreeSet<(String, String)>>,
> = std::sync::LazyLock::new(Default::default);

fn forgotten() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<(String, String)>> {
    FORGOTTEN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The instance `server` of `group` is forgotten: its series leave the
/// exposition.
pub fn forget_instance_series(group: &str, server: &str) {
    forgotten().insert((group.to_string(), server.to_string()));
}

/// The instance is known again (its series come back, with their values).
pub fn revive_instance_series(group: &str, server: &str) {
    let mut f = forgotten();
    if !f.is_empty() {
        f.remove(&(group.to_string(), server.to_string()));
    }
}

/// The Prometheus exposition without the series of forgotten instances.
pub fn render(handle: &PrometheusHandle) -> String {
    let text = handle.render();
    let gone = forgotten().clone();
    if gone.is_empty() {
        return text;
    }
    without_series_of(&text, &gone)
}

/// `text` without the sample lines whose `group` and `server` labels are
/// one of `gone`.
fn without_series_of(text: &str, gone: &std::collections::BTreeSet<(String, String)>) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let drop = !line.starts_with('#')
            && line_labels(line).is_some_and(|labels| {
                let get = |k: &str| {
                    labels
                        .iter()
                        .find(|(n, _)| *n == k)
                        .map(|(_, v)| v.as_str())
                };
                match (get("group"), get(SERVER_LABEL)) {
                    (Some(g), Some(s)) => gone.contains(&(g.to_string(), s.to_string())),
                    _ => false,
                }
            });
        if !drop {
            out.push_str(line);
        }
    }
    out
}

/// The labels of a sample line `name{k="v",...} value`, unescaped.
fn line_labels(line: &str) -> Option<Vec<(&str, String)>> {
    let start = line.find('{')?;
    let mut rest = &line[start + 1..];
    let mut labels = Vec::new();
    loop {
        rest = rest.trim_start_matches(',');
        if rest.starts_with('}') {
            return Some(labels);
        }
        let eq = rest.find("=\"")?;
        let name = &rest[..eq];
        let mut value = String::new();
        let mut chars = rest[eq + 2..].char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.push((name, value));
        rest = &rest[eq + 2 + end + 1..];
    }
}

#[cfg(test)]
mod render_tests {
    use super::*;

    #[test]
    fn the_series_of_a_forgotten_instance_leave_the_exposition() {
        let text = "# HELP picket_instance_up up\n# TYPE picket_instance_up gauge\n\
            picket_instance_up{group=\"cache\",server=\"10.0.0.1:6379\"} 0\n\
            picket_instance_up{group=\"cache\",server=\"10.0.0.10:6379\"} 1\n\
            picket_instance_up{group=\"other\",server=\"10.0.0.1:6379\"} 1\n\
            picket_probe_errors_total{group=\"cache\",server=\"10.0.0.1:6379\",kind=\"refused\"} 3\n\
            picket_group_config_epoch{group=\"cache\"} 2\n";
        let gone = [("cache".to_string(), "10.0.0.1:6379".to_string())]
            .into_iter()
            .collect();
        let out = without_series_of(text, &gone);
        assert!(!out.contains("server=\"10.0.0.1:6379\"} 0"), "{out}");
        assert!(!out.contains("kind=\"refused\""), "{out}");
        assert!(out.contains("server=\"10.0.0.10:6379\"} 1"), "{out}");
        assert!(
            out.contains("group=\"other\",server=\"10.0.0.1:6379\""),
            "{out}"
        );
        assert!(
            out.contains("picket_group_config_epoch{group=\"cache\"} 2"),
            "{out}"
        );
        assert!(out.starts_with("# HELP picket_instance_up up\n"), "{out}");
    }

    #[test]
    fn labels_are_read_with_their_escapes() {
        let l = line_labels("m{a=\"x\\\"y\",b=\"\\\\\"} 1\n").unwrap();
        assert_eq!(l, vec![("a", "x\"y".to_string()), ("b", "\\".to_string())]);
        assert_eq!(line_labels("m 1\n"), None);
    }
}

//! The alert rules and the dashboard on a real Prometheus server (Debian's
//! `prometheus` package), scraping three real picket daemons every second
//! with docs/prometheus/picket-alerts.yml loaded, through real faults:
//!
//! 1. `kill -9` of the master of group `cache` (a master and two replicas):
//!    a quick failover. `PicketFailover` and `PicketInstanceDown` fire,
//!    and `PicketServerRestarted` once the old master is back,
//!    `PicketMasterDown` does not; the old master returns, is demoted, and
//!    `PicketInstanceDown` resolves; `PicketFailover` resolves once its
//!    window has passed. The group's webhook backend points at a port
//!    nobody listens on: `PicketDiscoveryWriteFailing`.
//! 2. At the same time, `kill -9` of the master of group `stuck`, whose only
//!    replica refuses FLUSHALL while `flush_on_failover` is on: every
//!    failover is aborted, the master stays ODOWN: `PicketFailoverAborted`
//!    and `PicketMasterDown`.
//!    At the same time, `kill -9` of the only replica of group `fenced`
//!    (isolation fencing): its master stays up, the fence is lowered so
//!    that it stays writable: `PicketIsolationFenceLowered`.
//! 3. Daemon 0's state file cannot be written (a directory where its
//!    temporary file goes): `PicketStateNotWritable`, resolved when the
//!    directory is removed.
//! 4. Daemons 1 and 2 are frozen (SIGSTOP): `PicketDaemonDown`,
//!    `PicketPeerDown` and `PicketQuorumLost` from daemon 0; continued
//!    (SIGCONT), they enter stall protection: `PicketStallProtection` and
//!    `PicketStalled`.
//!
//! Every alert of the rules file is seen firing; every dashboard query
//! returns data, and the ones the scenario feeds return what it did.
//!
//! The rules are loaded with shorter durations so that the test takes
//! about two minutes instead of an hour, and nothing else changed (checked
//! by [`rules_for_the_test`]): every `for: 1m` becomes `for: 10s` (still
//! far longer than the ODOWN of a quick failover, which must not page),
//! every range `[10m]` and `[15m]` becomes `[1m]` (so that `PicketFailover`
//! resolves within the test). The expressions are otherwise identical: the
//! point is that they fire on really scraped series, which `promtool test
//! rules` cannot show (its synthetic series start at 0, real counters did
//! not).

use picket_harness::obs_support;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use obs_support::{RuleFile, alert_rules, dashboard_exprs, read};
use picket_harness::{
    ClusterPlan, PicketCluster, RedisOpts, RedisServer, RespConn, Topology, free_port, group_toml,
    http_get, next_loopback_ip, replica_linked_to, wait_for,
};

/// `for:` of every rule in the test, instead of `1m`.
const TEST_FOR: &str = "10s";
/// Every range window of the rules in the test, instead of 10m and 15m.
const TEST_WINDOW: &str = "1m";

/// The rules file with [`TEST_FOR`] and [`TEST_WINDOW`], after checking
/// that this changes the durations and nothing else.
fn rules_for_the_test() -> String {
    let original = read("docs/prometheus/picket-alerts.yml");
    let rewrite_expr = |e: &str| {
        e.replace("[10m]", &format!("[{TEST_WINDOW}]"))
            .replace("[15m]", &format!("[{TEST_WINDOW}]"))
    };
    let text = rewrite_expr(&original).replace("for: 1m\n", &format!("for: {TEST_FOR}\n"));
    let before = alert_rules();
    for r in &before {
        assert!(
            r.for_.as_deref().is_none_or(|f| f == "1m"),
            "{}: for {:?}: teach rules_for_the_test this duration",
            r.alert,
            r.for_
        );
        for window in r.expr.split('[').skip(1) {
            let window = window.split(']').next().unwrap_or("");
            assert!(
                ["10m", "15m"].contains(&window),
                "{}: range [{window}]: teach rules_for_the_test this window",
                r.alert
            );
        }
    }
    let after: RuleFile = serde_saphyr::from_str(&text).expect("rewritten rules parse");
    let after: Vec<_> = after.groups.into_iter().flat_map(|g| g.rules).collect();
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a.alert, b.alert);
        assert_eq!(
            a.expr,
            rewrite_expr(&b.expr),
            "{}: only windows change",
            b.alert
        );
        assert_eq!(a.for_, b.for_.as_ref().map(|_| TEST_FOR.to_string()));
        assert_eq!(a.labels, b.labels);
        assert_eq!(a.annotations, b.annotations);
    }
    text
}

/// Percent-encoding of a query-string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server on 127.0.0.1, in its own temporary directory,
/// killed by PID when dropped.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(targets: &[SocketAddr], rules: &str) -> Prometheus {
        let probe = Command::new("prometheus").arg("--version").output();
        assert!(
            probe.is_ok_and(|o| o.status.success()),
            "the prometheus server is needed (Debian: apt-get install -y --no-install-recommends prometheus; scripts/install-deps does it)"
        );
        let dir = tempfile::Builder::new()
            .prefix("picket-prometheus-")
            .tempdir()
            .unwrap();
        std::fs::write(dir.path().join("rules.yml"), rules).unwrap();
        let targets: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: picket\n    static_configs:\n      - targets: [{}]\n",
            dir.path().join("rules.yml").display(),
            targets.join(", ")
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let log_path = dir.path().join("prometheus.log");
        let mut last = String::new();
        // The port may be taken between the probe and the bind: retry.
        for _ in 0..5 {
            let addr: SocketAddr = format!("127.0.0.1:{}", free_port("127.0.0.1"))
                .parse()
                .unwrap();
            let log = std::fs::File::create(&log_path).unwrap();
            let mut child = Command::new("prometheus")
                .arg(format!(
                    "--config.file={}",
                    dir.path().join("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("spawn prometheus");
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if http_get(addr, "/-/ready").is_ok_and(|(c, _)| c == 200) {
                    return Prometheus { child, addr, dir };
                }
                if child.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
            last = std::fs::read_to_string(&log_path).unwrap_or_default();
        }
        panic!("prometheus did not start:\n{last}");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The `data` of a successful API answer.
    fn api(&self, path: &str) -> Result<serde_json::Value, String> {
        let (code, body) = http_get(self.addr, path)?;
        let v: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("{path}: {e}: {body}"))?;
        if code != 200 || v["status"] != "success" {
            return Err(format!("{path}: HTTP {code}: {body}"));
        }
        Ok(v["data"].clone())
    }

    /// The result vector of an instant query.
    fn query(&self, q: &str) -> Vec<serde_json::Value> {
        match self.api(&format!("/api/v1/query?query={}", encode(q))) {
            Ok(d) => d["result"].as_array().cloned().unwrap_or_default(),
            Err(e) => panic!("query {q}: {e}"),
        }
    }

    /// The result matrix of a range query over the last `span`, one point
    /// a second: what a dashboard panel (or annotation) of that time range
    /// shows.
    fn query_range(&self, q: &str, span: Duration) -> Vec<serde_json::Value> {
        let end = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = end - span.as_secs_f64();
        let path = format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
            encode(q)
        );
        match self.api(&path) {
            Ok(d) => d["result"].as_array().cloned().unwrap_or_default(),
            Err(e) => panic!("query_range {q}: {e}"),
        }
    }

    /// The active alerts (pending or firing), from /api/v1/alerts.
    fn alerts(&self) -> Vec<serde_json::Value> {
        self.api("/api/v1/alerts")
            .map(|d| d["alerts"].as_array().cloned().unwrap_or_default())
            .unwrap_or_default()
    }

    /// Whether the alert `name` with `labels` is active (pending or firing).
    fn active(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.alerts().iter().any(|a| {
            a["labels"]["alertname"] == name && labels.iter().all(|(k, v)| a["labels"][*k] == *v)
        })
    }

    /// Whether the alert fired at any time in the last 10 minutes (the
    /// `ALERTS` series Prometheus records at every evaluation), so that an
    /// alert of a few seconds is not missed between two polls.
    fn fired(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        let mut sel = format!("alertname=\"{name}\",alertstate=\"firing\"");
        for (k, v) in labels {
            sel.push_str(&format!(",{k}=\"{v}\""));
        }
        !self
            .query(&format!("count_over_time(ALERTS{{{sel}}}[10m])"))
            .is_empty()
    }

    #[track_caller]
    fn wait_fired(&self, name: &str, labels: &[(&str, &str)], timeout: Duration, t0: Instant) {
        let started = Instant::now();
        let ok = poll(timeout, || self.fired(name, labels));
        assert!(
            ok,
            "{name} {labels:?} did not fire within {timeout:?}; active alerts: {:#?}",
            self.alerts()
        );
        eprintln!(
            "[{:6.1} s] {name} {labels:?} fired (waited {:.1} s)",
            t0.elapsed().as_secs_f64(),
            started.elapsed().as_secs_f64()
        );
    }

    #[track_caller]
    fn wait_resolved(&self, name: &str, labels: &[(&str, &str)], timeout: Duration, t0: Instant) {
        let ok = poll(timeout, || !self.active(name, labels));
        assert!(
            ok,
            "{name} {labels:?} did not resolve within {timeout:?}; active alerts: {:#?}",
            self.alerts()
        );
        eprintln!(
            "[{:6.1} s] {name} {labels:?} resolved",
            t0.elapsed().as_secs_f64()
        );
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Poll `cond` every 200 ms for at most `timeout`; whether it held.
fn poll(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The value of a sample of a query result.
fn value(sample: &serde_json::Value) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Whether some sample of `result` has every label of `labels` and a value
/// above 0.
fn some_positive(result: &[serde_json::Value], labels: &[(&str, &str)]) -> bool {
    result
        .iter()
        .any(|s| labels.iter().all(|(k, v)| s["metric"][*k] == *v) && value(s) > 0.0)
}

#[test]
fn the_alerts_fire_and_resolve_on_a_real_prometheus_through_real_failures() {
    let t0 = Instant::now();
    let rules = rules_for_the_test();

    let mut cache = Topology::master_with_replicas(2);
    let mut fenced = Topology::master_with_replicas(1);
    let mut stuck_master = RedisServer::start_fresh(RedisOpts::default());
    let stuck_replica =
        RedisServer::start_fresh(RedisOpts::default().replica_of(stuck_master.addr()).args(&[
            "--rename-command",
            "FLUSHALL",
            "",
        ]));
    wait_for(
        "the stuck group's replica linked",
        picket_harness::READY_TIMEOUT,
        || replica_linked_to(&stuck_replica, stuck_master.addr()),
    );
    // A webhook nobody answers: every write fails (transient).
    let hook_ip = next_loopback_ip();
    let hook = format!("http://{hook_ip}:{}/picket", free_port(&hook_ip));
    let groups = format!(
        "{}[[group]]\nname = \"stuck\"\nmaster = \"{}\"\nquorum = 2\ndown_after = \"1s\"\n\
         failover_timeout = \"3s\"\nflush_on_failover = true\n\n",
        group_toml(
            "cache",
            cache.master.addr(),
            2,
            &format!(
                "[[group.discovery]]\ntype = \"webhook\"\nurl = \"{hook}\"\ntimeout = \"1s\"\n"
            ),
        ),
        stuck_master.addr()
    ) + &group_toml(
        "fenced",
        fenced.master.addr(),
        2,
        "[group.isolation_fencing]\nmin_replicas = 1\n",
    );
    // The daemons share a password (peers send it) and have a read-only
    // client credential: the dashboard's refusals panel needs one refused
    // command to show (the counter is labelled by command and user, so it
    // only exists from then on).
    let users_dir = tempfile::tempdir().unwrap();
    let (shared_pw, app_pw) = (
        users_dir.path().join("shared"),
        users_dir.path().join("app"),
    );
    std::fs::write(&shared_pw, "shared-pw").unwrap();
    std::fs::write(&app_pw, "app-pw").unwrap();
    let mut plan = ClusterPlan::new(3);
    for extra in &mut plan.daemon_extra {
        extra.push_str(&format!(
            "password_file = \"{}\"\n\n[[daemon.user]]\nname = \"app\"\nrole = \"client\"\n\
             password_file = \"{}\"\n",
            shared_pw.display(),
            app_pw.display()
        ));
    }
    let http = plan.http.clone();
    let resp0 = plan.resp[0];
    let mut cluster: PicketCluster = plan.start(&groups);
    cluster.wait_converged(&[0, 1, 2], "cache", 3, Duration::from_secs(20));
    cluster.wait_converged(&[0, 1, 2], "stuck", 2, Duration::from_secs(20));
    cluster.wait_converged(&[0, 1, 2], "fenced", 2, Duration::from_secs(20));
    let inst: Vec<String> = http.iter().map(|h| h.to_string()).collect();

    let prom = Prometheus::start(&http, &rules);
    let t_prom = Instant::now();
    // A few scrapes of every daemon before anything happens: the samples
    // that increase() compares the first event with.
    let scraped = poll(Duration::from_secs(30), || {
        let r = prom.query("count_over_time(up{job=\"picket\"}[1m]) >= 3");
        r.len() == 3 && prom.query("up{job=\"picket\"} == 1").len() == 3
    });
    assert!(
        scraped,
        "Prometheus did not scrape the daemons:\n{}",
        prom.log()
    );
    eprintln!(
        "[{:6.1} s] Prometheus {} scrapes {:?}",
        t0.elapsed().as_secs_f64(),
        prom.addr,
        inst
    );
    let secs = Duration::from_secs;

    let mut app = RespConn::connect(resp0, secs(5)).unwrap();
    assert!(app.cmd(&["AUTH", "app", "app-pw"]).unwrap().is_ok());
    let refused = app.cmd(&["SENTINEL", "FAILOVER", "cache"]).unwrap();
    assert!(
        refused.as_error().is_some_and(|e| e.starts_with("NOPERM")),
        "a client credential runs no FAILOVER: {refused:?}"
    );

    // 1 and 2: kill -9 both masters.
    let old = cache.master.addr();
    let old_s = old.to_string();
    cache.master.kill9();
    stuck_master.kill9();
    fenced.replicas[0].kill9();
    let t_kill = Instant::now();
    let (new_master, _) = cluster.wait_agreed_new_master("cache", &[0, 1, 2], old, secs(30));
    eprintln!(
        "[{:6.1} s] cache failed over to {new_master} in {:.1} s",
        t0.elapsed().as_secs_f64(),
        t_kill.elapsed().as_secs_f64()
    );
    prom.wait_fired("PicketFailover", &[("group", "cache")], secs(30), t0);
    prom.wait_fired(
        "PicketInstanceDown",
        &[("group", "cache"), ("server", &old_s)],
        secs(40),
        t0,
    );
    prom.wait_fired("PicketFailoverAborted", &[("group", "stuck")], secs(40), t0);
    // ODOWN needs the peers' answers within a second: on a machine whose
    // cores a build saturates, an answer late now and then restarts the
    // rule's `for` (one CI run: pending from 57 s, past a 40 s wait).
    prom.wait_fired("PicketMasterDown", &[("group", "stuck")], secs(70), t0);
    prom.wait_fired(
        "PicketIsolationFenceLowered",
        &[("group", "fenced")],
        secs(40),
        t0,
    );
    prom.wait_fired(
        "PicketDiscoveryWriteFailing",
        &[("backend", "webhook")],
        secs(30),
        t0,
    );
    // The old master returns as a master (a new process); picket demotes it.
    cache.master.restart();
    wait_for("the old master demoted", secs(20), || {
        replica_linked_to(&cache.master, new_master)
    });
    prom.wait_fired(
        "PicketServerRestarted",
        &[("group", "cache"), ("server", &old_s)],
        secs(30),
        t0,
    );
    prom.wait_resolved(
        "PicketInstanceDown",
        &[("group", "cache"), ("server", &old_s)],
        secs(30),
        t0,
    );

    // 3: daemon 0 cannot write its state file: its temporary file's path
    // is a directory. The stuck group's elections (every failover_timeout)
    // keep writing epochs and votes.
    let tmp = cluster.nodes[0]
        .process
        .dir()
        .join("data")
        .join("state.json.tmp");
    std::fs::create_dir(&tmp).unwrap();
    prom.wait_fired(
        "PicketStateNotWritable",
        &[("instance", &inst[0])],
        secs(60),
        t0,
    );
    std::fs::remove_dir(&tmp).unwrap();
    prom.wait_resolved(
        "PicketStateNotWritable",
        &[("instance", &inst[0])],
        secs(40),
        t0,
    );

    // 4: freeze daemons 1 and 2, then let them go.
    cluster.nodes[1].process.sigstop();
    cluster.nodes[2].process.sigstop();
    let frozen = Instant::now();
    for i in [1, 2] {
        prom.wait_fired("PicketDaemonDown", &[("instance", &inst[i])], secs(40), t0);
    }
    prom.wait_fired(
        "PicketQuorumLost",
        &[("instance", &inst[0]), ("group", "cache")],
        secs(30),
        t0,
    );
    prom.wait_fired("PicketPeerDown", &[("instance", &inst[0])], secs(30), t0);
    cluster.nodes[1].process.sigcont();
    cluster.nodes[2].process.sigcont();
    eprintln!(
        "[{:6.1} s] daemons 1 and 2 continued after {:.1} s",
        t0.elapsed().as_secs_f64(),
        frozen.elapsed().as_secs_f64()
    );
    prom.wait_fired("PicketStallProtection", &[], secs(30), t0);
    prom.wait_fired("PicketStalled", &[], secs(30), t0);
    for i in [1, 2] {
        prom.wait_resolved("PicketDaemonDown", &[("instance", &inst[i])], secs(30), t0);
    }

    // The failover alert ends when its window has passed.
    prom.wait_resolved("PicketFailover", &[("group", "cache")], secs(90), t0);

    // The ODOWN of a quick failover must not page: not one evaluation in
    // the whole test (a minute after the failover, a gauge stuck at 1
    // would have fired long ago).
    assert!(
        !prom.fired("PicketMasterDown", &[("group", "cache")]),
        "PicketMasterDown fired for a quick failover: {:#?}",
        prom.alerts()
    );

    // Every alert of the rules file was seen firing.
    let names: BTreeSet<String> = alert_rules().into_iter().map(|r| r.alert).collect();
    let not_fired: Vec<&String> = names.iter().filter(|n| !prom.fired(n, &[])).collect();
    assert!(not_fired.is_empty(), "never fired: {not_fired:?}");

    // Every dashboard query (panels and the failover annotation) returns
    // data over the time range of the scenario, as Grafana would show it;
    // those the scenario fed return what it did.
    let span = t_prom.elapsed();
    let mut empty = Vec::new();
    for (title, expr) in dashboard_exprs() {
        // Only with a Kubernetes backend in pod-labels mode, which this
        // scenario has not: the gate's waits (with a named Service;
        // tests/it/kubernetes.rs checks them through the backend's gate
        // status) and the backends that skip it (tests/it/discovery_e2e.rs
        // checks the series).
        if expr.contains("picket_discovery_gate_wait_seconds")
            || expr.contains("picket_discovery_gate_skipped")
        {
            continue;
        }
        let q = expr.replace("$job", "picket").replace("$group", ".+");
        let result = prom.query_range(&q, span);
        if result.is_empty() {
            empty.push(format!("{title}: {q}"));
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard queries without data: {empty:#?}"
    );
    let produced: &[(&str, &[(&str, &str)])] = &[
        (
            "sum by (group, result) (increase(picket_failovers_total[1h]))",
            &[("group", "cache"), ("result", "completed")],
        ),
        (
            "sum by (group, result) (increase(picket_failovers_total[1h]))",
            &[("group", "stuck"), ("result", "aborted")],
        ),
        (
            "sum by (group, result) (increase(picket_elections_total[1h]))",
            &[("group", "cache"), ("result", "won")],
        ),
        (
            "sum by (group) (increase(picket_votes_granted_total[1h]))",
            &[("group", "cache")],
        ),
        (
            "sum by (group) (increase(picket_demotions_total[1h]))",
            &[("group", "cache")],
        ),
        (
            "histogram_quantile(0.99, sum by (le, group) (rate(picket_failover_duration_seconds_bucket[1h])))",
            &[("group", "cache")],
        ),
        ("increase(picket_tilt_total[1h])", &[("instance", &inst[1])]),
        (
            "increase(picket_state_write_errors_total[1h])",
            &[("instance", &inst[0])],
        ),
        (
            "sum by (backend, result) (increase(picket_discovery_writes_total[1h]))",
            &[("backend", "webhook"), ("result", "transient")],
        ),
        (
            "sum by (group, server, kind) (increase(picket_probe_errors_total[1h]))",
            &[("group", "cache"), ("server", &old_s)],
        ),
        (
            "histogram_quantile(0.99, sum by (le, backend) (rate(picket_discovery_write_duration_seconds_bucket[1h])))",
            &[("backend", "webhook")],
        ),
    ];
    for (q, labels) in produced {
        let result = prom.query(q);
        assert!(
            some_positive(&result, labels),
            "{q}: no sample {labels:?} above 0: {result:#?}"
        );
    }
    // The dashboard's variables: the job and both groups.
    let groups_seen: BTreeSet<String> = prom
        .query("picket_group_config_epoch{job=\"picket\"}")
        .iter()
        .filter_map(|s| s["metric"]["group"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        groups_seen,
        BTreeSet::from([
            "cache".to_string(),
            "fenced".to_string(),
            "stuck".to_string()
        ])
    );

    eprintln!(
        "[{:6.1} s] done; alerts seen firing: {names:?}",
        t0.elapsed().as_secs_f64()
    );
    drop(prom);
    drop(stuck_replica);
    cluster.nodes.clear();
}

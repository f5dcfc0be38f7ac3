//! Loading and validating `picket.toml`: exact key paths, line numbers and
//! reasons for bad files; good files, including the shipped example.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use picket::config::{
    Config, ConfigErrors, DiscoveryConfig, KubernetesMode, LogFormat, load, load_str,
};

/// A temporary directory holding a readable `secret` file and a `subdir`
/// directory, for the `*_file` checks; `{dir}` in a config is replaced by it.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("secret"), "s3cret\n").unwrap();
        // A certificate and its key, for [daemon.tls] (its files must hold PEM).
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
        fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
        fs::create_dir(dir.path().join("subdir")).unwrap();
        Fixture { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Write `text` (its first newline dropped, `{dir}` substituted) as a
    /// config file and load it.
    fn load(&self, text: &str) -> Result<Config, ConfigErrors> {
        let text = text.strip_prefix('\n').unwrap_or(text);
        let text = text.replace("{dir}", self.path().to_str().unwrap());
        let file = self.path().join("picket.toml");
        fs::write(&file, text).unwrap();
        load(&file)
    }
}

/// The bad configs, one file each under `tests/it/config/bad/`: each has
/// exactly one problem (the rest of it is valid), named by its last line,
/// `# expect: <key> at line <n>: <part of the reason>`, which comes after
/// the config so that the config's own line numbers are the ones a user
/// sees. `{dir}` stands for the [`Fixture`]'s directory.
const BAD_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/config/bad");

/// One bad config and the problem it must be reported with.
struct Bad {
    file: String,
    toml: String,
    key: String,
    line: usize,
    reason: String,
}

fn bad_configs() -> Vec<Bad> {
    let mut files: Vec<_> = fs::read_dir(BAD_DIR)
        .unwrap_or_else(|e| panic!("{BAD_DIR}: {e}"))
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            let toml = fs::read_to_string(&path).unwrap();
            let expect = toml
                .lines()
                .last()
                .and_then(|l| l.strip_prefix("# expect: "))
                .unwrap_or_else(|| panic!("{file}: the last line is not `# expect: ...`"));
            let (key, rest) = expect
                .split_once(" at line ")
                .unwrap_or_else(|| panic!("{file}: no ` at line ` in {expect:?}"));
            let (line, reason) = rest
                .split_once(": ")
                .unwrap_or_else(|| panic!("{file}: no `: ` after the line in {expect:?}"));
            Bad {
                key: key.to_string(),
                line: line
                    .parse()
                    .unwrap_or_else(|e| panic!("{file}: line {line:?}: {e}")),
                reason: reason.to_string(),
                toml: toml.clone(),
                file,
            }
        })
        .collect()
}

#[test]
fn every_bad_config_names_its_key_line_and_reason() {
    let cases = bad_configs();
    assert!(
        cases.len() >= 72,
        "only {} bad configs under {BAD_DIR}",
        cases.len()
    );
    let fx = Fixture::new();
    let mut failures = Vec::new();
    for case in &cases {
        let problems = match fx.load(&case.toml) {
            Ok(_) => {
                failures.push(format!("{}: loaded without problems", case.file));
                continue;
            }
            Err(e) => e.problems().to_vec(),
        };
        let ok = problems.len() == 1
            && problems[0].key == case.key
            && problems[0].line == Some(case.line)
            && problems[0].reason.contains(&case.reason);
        if !ok {
            failures.push(format!(
                "{}: expected one problem {}:{} containing {:?}, got {problems:?}",
                case.file, case.key, case.line, case.reason
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn display_is_one_path_line_key_reason_per_problem() {
    let fx = Fixture::new();
    let err = fx
        .load(
            r#"
[daemon]
peers = ["127.0.0.2:26379", "127.0.0.3:26379"]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 5
"#,
        )
        .unwrap_err();
    let file = fx.path().join("picket.toml");
    assert_eq!(err.path(), file);
    assert_eq!(
        err.to_string(),
        format!(
            "{}:7: group[0].quorum: must be between 1 and 3 (the number of daemons)",
            file.display()
        )
    );
}

#[test]
fn all_problems_are_reported_in_file_order() {
    let fx = Fixture::new();
    let err = fx
        .load(
            r#"
[daemon]
listen = "nope"
peers = ["127.0.0.2:26379", "127.0.0.2:26379"]

[[group]]
name = "a b"
master = "127.0.0.5"
quorum = 9
down_after = "0s"

[[group.discovery]]
type = "webhook"
url = "hooks.example"
"#,
        )
        .unwrap_err();
    let got: Vec<(Option<usize>, &str)> = err
        .problems()
        .iter()
        .map(|p| (p.line, p.key.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some(2), "daemon.listen"),
            (Some(3), "daemon.peers[1]"),
            (Some(6), "group[0].name"),
            (Some(7), "group[0].master"),
            (Some(8), "group[0].quorum"),
            (Some(9), "group[0].down_after"),
            (Some(13), "group[0].discovery[0].url"),
        ]
    );
    assert_eq!(err.to_string().lines().count(), 7);
}

#[test]
fn minimal_config_from_the_design_loads() {
    let fx = Fixture::new();
    fs::write(fx.path().join("kubeconfig"), "apiVersion: v1\n").unwrap();
    let config = fx
        .load(
            r#"
[daemon]
id = "picket-a"                 # optional; generated once and persisted in data_dir
listen = "0.0.0.0:26379"        # RESP: Sentinel-compatible API and the peer protocol
announce = "10.0.0.1:26379"     # optional; the address peers and clients should use
http_listen = "0.0.0.0:9479"    # /metrics /healthz /readyz /v1/status
data_dir = "/var/lib/picket"
password_file = "{dir}/secret"   # AUTH required on `listen` when set
log_format = "text"             # or "json"
peers = ["10.0.0.2:26379", "10.0.0.3:26379"]   # the other daemons (a key of [daemon])

[[group]]
name = "cache"
master = "10.1.0.5:6379"        # the initial master; replicas are discovered from INFO
quorum = 2
down_after = "1s"
failover_timeout = "30s"
parallel_syncs = 1
flush_on_failover = false

[[group.discovery]]
type = "kubernetes"
kubeconfig = "{dir}/kubeconfig"   # omitted: in-cluster service account
context = "prod"                        # omitted: current-context
namespace = "cache"
mode = "pod-labels"                     # or "endpointslice"
pod_selector = "app=cache"              # pod-labels: which pods; matched to instances by pod IP
role_label = "role"                     # pod-labels: key; values master_value / replica_value
service = "cache"                       # endpointslice: the selector-less Service
required = true

[[group.discovery]]
type = "exec"
command = ["/usr/local/bin/reconfigure", "--flag"]   # argv; Sentinel's 7 arguments appended
timeout = "5s"

[[group.discovery]]
type = "webhook"
url = "https://hooks.example/picket"
timeout = "2s"

[[group.discovery]]
type = "file"
path = "{dir}/cache.json"
"#,
        )
        .unwrap();
    assert_eq!(config.daemon.id.as_deref(), Some("picket-a"));
    assert_eq!(config.daemon.announce_addr(), "10.0.0.1:26379");
    assert_eq!(config.daemon.peers.len(), 2);
    assert_eq!(config.groups.len(), 1);
    let g = &config.groups[0];
    assert_eq!(g.down_after, Duration::from_secs(1));
    assert_eq!(g.failover_timeout, Duration::from_secs(30));
    assert_eq!(g.discovery.len(), 4);
    match &g.discovery[0] {
        DiscoveryConfig::Kubernetes(k) => {
            assert_eq!(k.mode, KubernetesMode::PodLabels);
            assert_eq!(k.pod_selector.as_deref(), Some("app=cache"));
            assert_eq!(k.timeout, Duration::from_secs(2), "default timeout");
        }
        other => panic!("expected kubernetes, got {other:?}"),
    }
    let summary = config.summary();
    assert!(
        summary.contains("daemon picket-a: listen 0.0.0.0:26379"),
        "{summary}"
    );
    assert!(
        summary.contains("peers (2): 10.0.0.2:26379, 10.0.0.3:26379"),
        "{summary}"
    );
    assert!(
        summary.contains(
            "group cache: master 10.1.0.5:6379, quorum 2 of 3, down_after 1s, \
             failover_timeout 30s, flush_on_failover no, \
             discovery: kubernetes (pod-labels), exec, webhook, file"
        ),
        "{summary}"
    );
}

#[test]
fn a_daemon_without_groups_is_valid_and_gets_defaults() {
    let fx = Fixture::new();
    let config = fx.load("[daemon]\n").unwrap();
    assert!(config.groups.is_empty());
    assert_eq!(config.daemon.listen, "0.0.0.0:26379");
    assert_eq!(config.daemon.http_listen, "0.0.0.0:9479");
    assert_eq!(config.daemon.data_dir, PathBuf::from("/var/lib/picket"));
    assert_eq!(config.daemon.log_format, LogFormat::Text);
    assert_eq!(config.daemon.max_clients, 10_000);
    let summary = config.summary();
    assert!(
        summary.contains("(id generated on first start"),
        "{summary}"
    );
    assert!(summary.contains("peers: none"), "{summary}");
    assert!(
        summary.contains(
            "security: listen in plaintext; default user: no AUTH needed, role all; users: 0"
        ),
        "{summary}"
    );
    assert!(summary.contains("groups: none"), "{summary}");
}

#[test]
fn durations_accept_milliseconds_and_seconds() {
    let fx = Fixture::new();
    let config = fx
        .load(
            r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
down_after = "250ms"
failover_timeout = "1s"

[[group.discovery]]
type = "exec"
command = ["/bin/true"]
timeout = "1m 30s"
"#,
        )
        .unwrap();
    let g = &config.groups[0];
    assert_eq!(g.down_after, Duration::from_millis(250));
    assert_eq!(g.failover_timeout, Duration::from_secs(1));
    assert_eq!(g.parallel_syncs, 1, "default");
    match &g.discovery[0] {
        DiscoveryConfig::Exec(e) => assert_eq!(e.timeout, Duration::from_secs(90)),
        other => panic!("expected exec, got {other:?}"),
    }
}

#[test]
fn unreadable_file_is_one_problem_without_a_line() {
    let fx = Fixture::new();
    let missing = fx.path().join("absent.toml");
    let err = load(&missing).unwrap_err();
    assert_eq!(err.problems().len(), 1);
    assert_eq!(err.problems()[0].line, None);
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("{}: cannot read", missing.display())),
        "{shown}"
    );
}

#[test]
fn load_str_names_the_given_path() {
    let err = load_str(Path::new("/etc/picket.toml"), "[daemon]\nmax_clients = 0\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "/etc/picket.toml:2: daemon.max_clients: must be at least 1"
    );
}

// ---------------------------------------------------------------------------
// The shipped example.

fn example_text() -> String {
    fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/picket.toml")).unwrap()
}

/// Keys whose value names a file (or, for `path`, a file to create).
const FILE_KEYS: &[&str] = &[
    "password_file",
    "ca_file",
    "cert_file",
    "key_file",
    "token_file",
    "hmac_key_file",
    "kubeconfig",
    "path",
];

/// Point every file-naming key of the example at a file in `dir`, keeping
/// every line where it is.
fn rewrite_file_keys(text: &str, dir: &Path) -> (String, usize) {
    let mut rewritten = 0;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            let key = line.split('=').next().unwrap_or("").trim();
            if line.contains('=') && !line.trim_start().starts_with('#') && FILE_KEYS.contains(&key)
            {
                rewritten += 1;
                let target = match key {
                    "path" => format!("out{rewritten}.json"),
                    // [daemon.tls] files must hold PEM (checked at load).
                    "cert_file" | "ca_file" => "cert.pem".to_string(),
                    "key_file" => "key.pem".to_string(),
                    _ => "secret".to_string(),
                };
                format!("{key} = \"{}\"", dir.join(target).display())
            } else {
                line.to_string()
            }
        })
        .collect();
    (lines.join("\n"), rewritten)
}

#[test]
fn example_config_validates_once_its_files_exist() {
    let fx = Fixture::new();
    let (text, rewritten) = rewrite_file_keys(&example_text(), fx.path());
    assert!(
        rewritten >= FILE_KEYS.len(),
        "only {rewritten} file keys found"
    );
    let file = fx.path().join("picket.toml");
    fs::write(&file, text).unwrap();
    let config = load(&file).unwrap_or_else(|e| panic!("{e}"));
    assert!(!config.groups.is_empty());
    let summary = config.summary();
    assert!(
        summary.contains(
            "security: TLS on listen (client certificates: optional), to the peers, \
             plaintext on 0.0.0.0:26380, HTTPS; default user: password, role client; \
             users: 2; peers logged in as picket-peer"
        ),
        "{summary}"
    );
}

#[test]
fn example_config_problems_are_only_its_missing_files() {
    let text = example_text();
    match load_str(Path::new("picket.toml"), &text) {
        Ok(_) => {} // every file it names happens to exist here
        Err(e) => {
            for p in e.problems() {
                let last = p.key.rsplit('.').next().unwrap_or("");
                assert!(FILE_KEYS.contains(&last), "unexpected problem: {e}");
            }
        }
    }
}

/// Every key of the schema, as `daemon.id`, `group.tls.ca_file`,
/// `group.discovery.exec.timeout`: found by serializing a config in which
/// every optional value is set and every discovery type is present, so a
/// field added to the schema must be added to the example too.
#[test]
fn example_config_has_every_key() {
    use picket::config::{
        AuthClients, DaemonConfig, ExecConfig, FileConfig, GroupConfig, IsolationFencingConfig,
        KubernetesConfig, ListenTlsConfig, MembersConfig, PortRef, Role, TlsConfig, UserConfig,
        WebhookConfig,
    };
    let p = || Some(PathBuf::from("/x"));
    let s = || Some("x".to_string());
    let d = Duration::from_secs(1);
    let full = Config {
        daemon: DaemonConfig {
            id: s(),
            listen: "x".into(),
            announce: s(),
            http_listen: "x".into(),
            data_dir: "/x".into(),
            password_file: p(),
            log_format: LogFormat::Json,
            peers: vec![picket::addr::Addr::new("x", 1)],
            max_clients: 1,
            tcp_backlog: 1,
            enable_fault_injection: true,
            default_role: Role::Client,
            peer_user: s(),
            tls: Some(ListenTlsConfig {
                cert_file: "/x".into(),
                key_file: "/x".into(),
                ca_file: p(),
                auth_clients: AuthClients::Optional,
                peers: true,
                verify_peer_name: true,
                plaintext_listen: s(),
                http: true,
                plaintext_http_listen: s(),
            }),
            users: vec![UserConfig {
                name: "x".into(),
                role: Role::Peer,
                password_file: "/x".into(),
            }],
        },
        groups: vec![GroupConfig {
            name: "x".into(),
            master: picket::addr::Addr::new("x", 1),
            quorum: 1,
            down_after: d,
            down_after_refused: Some(d),
            failover_timeout: d,
            parallel_syncs: 1,
            flush_on_failover: true,
            announce_hostnames: false,
            username: s(),
            password_file: p(),
            tls: Some(TlsConfig {
                ca_file: p(),
                cert_file: p(),
                key_file: p(),
                server_name: s(),
            }),
            admin_port: Some(1),
            isolation_fencing: Some(IsolationFencingConfig {
                min_replicas: 2,
                max_lag: d,
            }),
            discovery: vec![
                DiscoveryConfig::Kubernetes(KubernetesConfig {
                    kubeconfig: p(),
                    context: s(),
                    namespace: "x".into(),
                    mode: KubernetesMode::PodLabels,
                    pod_selector: s(),
                    role_label: "x".into(),
                    master_value: "x".into(),
                    replica_value: "x".into(),
                    service: s(),
                    port_name: "x".into(),
                    required: true,
                    timeout: d,
                    service_gate_timeout: d,
                    skip_service_gate: true,
                }),
                DiscoveryConfig::Exec(ExecConfig {
                    command: vec!["x".into()],
                    timeout: d,
                    required: true,
                    on_fence: false,
                }),
                DiscoveryConfig::Webhook(WebhookConfig {
                    url: "x".into(),
                    timeout: d,
                    token_file: p(),
                    hmac_key_file: p(),
                    ca_file: p(),
                    required: true,
                }),
                DiscoveryConfig::File(FileConfig {
                    path: "/x".into(),
                    required: true,
                }),
            ],
            members: Some(MembersConfig {
                kubeconfig: p(),
                context: s(),
                namespace: s(),
                pod_selector: s(),
                port: PortRef::Number(1),
                handover_on_delete: true,
                timeout: d,
            }),
            forget_after: d,
        }],
    };
    let schema = key_set(&toml::Value::try_from(&full).unwrap());
    let example = key_set(&toml::from_str::<toml::Value>(&example_text()).unwrap());
    let missing: Vec<&String> = schema.difference(&example).collect();
    assert!(
        missing.is_empty(),
        "keys missing from config/picket.toml: {missing:?}"
    );
    assert!(
        schema.len() > 40,
        "schema walk found only {} keys",
        schema.len()
    );
}

/// Dotted key names without array indices; discovery entries are keyed by
/// their type.
fn key_set(value: &toml::Value) -> std::collections::BTreeSet<String> {
    fn walk(v: &toml::Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
        match v {
            toml::Value::Table(t) => {
                let prefix = match (prefix.ends_with("discovery"), t.get("type")) {
                    (true, Some(toml::Value::String(kind))) => format!("{prefix}.{kind}"),
                    _ => prefix.to_string(),
                };
                for (k, v) in t {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    out.insert(key.clone());
                    walk(v, &key, out);
                }
            }
            toml::Value::Array(items) => items.iter().for_each(|i| walk(i, prefix, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(value, "", &mut out);
    out
}

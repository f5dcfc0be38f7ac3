//! picket against a real Kubernetes control plane: etcd, kube-apiserver and
//! kube-controller-manager (its endpoint-slice controllers), when their
//! binaries are named by environment variables:
//!
//! ```text
//! PICKET_KUBE_APISERVER=/path/kube-apiserver \
//! PICKET_KUBE_CONTROLLER_MANAGER=/path/kube-controller-manager \
//! PICKET_ETCD=/usr/bin/etcd \
//! cargo nextest run --test it --run-ignored only --no-capture kube_real::
//! ```
//!
//! The test is ignored unless asked for (`--run-ignored`, or `--ignored`
//! with cargo test): without a control plane it cannot run, and a test
//! that returned at once would pass without checking anything. Asked for
//! without the binaries, it fails saying which is missing. CI runs the fake
//! API server instead (tests/it/kube_members.rs, tests/it/discovery_e2e.rs).
//! Nothing here builds those binaries.
//!
//! Everything runs inside a network namespace of the test's own: the data
//! servers on 198.18.x.y (a real API server refuses loopback addresses in a
//! Service's endpoints), the control plane on 127.0.0.1. There is no
//! kubelet: pods are bound to a Node object and their status (IP, Ready) is
//! written through the status subresource, as a kubelet would; the
//! endpoint-slice controller then keeps the Services' slices. picket
//! authenticates as user `picket` with exactly the Role of
//! docs/kubernetes.md.
//!
//! What it checks and measures, with three picket daemons (pod-labels with
//! the Service named, members from the pods, and endpointslice on a
//! selector-less Service, all at once):
//! - 5 kill -9 failovers: a watch of each Service never sees two addresses
//!   and never the old master after the new one was promoted; kill → old
//!   master out of the Service, → promoted, → new master in the Service;
//!   a Service selecting `role=replica` never loses a replica it listed
//!   after the promotion while every daemon publishes the failover's
//!   epoch (issue 27: the daemons that adopted the epoch from the leader
//!   took the label off both replicas for 1.3 s), and how long the replica
//!   that was not failed over was out of it;
//! - a replica pod replaced by a pod with another IP;
//! - a rolling restart of the three pods under writes through the Service
//!   (to its ready endpoint, as kube-proxy routes): no acknowledged write
//!   lost, the longest write gap.

use picket_harness::writes;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use picket_harness::*;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::{Value, json};
use writes::{Writer, longest_gap, lost_writes};

const NS: &str = "cache";
const GROUP: &str = "cache";
const ADMIN_TOKEN: &str = "admin-token-for-the-test";
const PICKET_TOKEN: &str = "picket-token-for-the-test";

/// The binaries, or why the test cannot run.
fn binaries() -> Result<(PathBuf, PathBuf, PathBuf), String> {
    let get = |var: &str| -> Result<PathBuf, String> {
        let p = std::env::var_os(var).ok_or_else(|| format!("{var} is not set"))?;
        let p = PathBuf::from(p);
        if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{var}={} is not a file", p.display()))
        }
    };
    let apiserver = get("PICKET_KUBE_APISERVER")?;
    let cm = get("PICKET_KUBE_CONTROLLER_MANAGER")?;
    let etcd = match get("PICKET_ETCD") {
        Ok(p) => p,
        Err(_) if Path::new("/usr/bin/etcd").is_file() => PathBuf::from("/usr/bin/etcd"),
        Err(e) => return Err(format!("{e}, and /usr/bin/etcd does not exist")),
    };
    Ok((apiserver, cm, etcd))
}

/// A process stopped (SIGKILL) and reaped when dropped.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn start(name: &'static str, bin: &Path, args: &[String], dir: &Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({}): {e}", bin.display()));
        Proc { name, child, log }
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(30);
        format!("--- {} ---\n{}", self.name, lines[from..].join("\n"))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CA and a serving certificate for 127.0.0.1, PEM: (ca, cert, key).
fn serving_cert() -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "test-kube-ca");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    p.distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = p.signed_by(&key, &issuer).unwrap();
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

fn kubeconfig(dir: &Path, name: &str, server: &str, ca: &str, token: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: real\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context:\n    cluster: real\n    user: u\n",
            B64.encode(ca)
        ),
    )
    .unwrap();
    path
}

/// The control plane, the admin client and the runtime it runs on.
struct ControlPlane {
    url: String,
    ca: String,
    http: reqwest::Client,
    rt: tokio::runtime::Runtime,
    audit: PathBuf,
    // Dropped last to first: the controller manager, the API server, etcd.
    procs: Vec<Proc>,
}

impl ControlPlane {
    fn start(dir: &Path) -> ControlPlane {
        let (apiserver, cm, etcd) = binaries().expect("checked by the caller");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (ca, cert, key) = serving_cert();
        let w = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let cert_file = w("apiserver.pem", &cert);
        let key_file = w("apiserver.key", &key);
        let sa = KeyPair::generate().unwrap();
        let sa_key = w("sa.key", &sa.serialize_pem());
        let sa_pub = w("sa.pub", &sa.public_key_pem());
        // Every request's verb, user and response code, for the count of
        // picket's writes and conflicts.
        let audit_policy = w(
            "audit-policy.yaml",
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
        );
        let tokens = w(
            "tokens.csv",
            &format!(
                "{ADMIN_TOKEN},admin,admin-uid,system:masters\n{PICKET_TOKEN},picket,picket-uid\n"
            ),
        );
        let etcd_client = free_port("127.0.0.1");
        let etcd_peer = free_port("127.0.0.1");
        let api_port = free_port("127.0.0.1");
        let mut procs = vec![Proc::start(
            "etcd",
            &etcd,
            &[
                "--name=test".into(),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
                format!("--initial-cluster=test=http://127.0.0.1:{etcd_peer}"),
            ],
            dir,
        )];
        procs.push(Proc::start(
            "kube-apiserver",
            &apiserver,
            &[
                format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                // The `kubernetes` Service's endpoints refuse a loopback
                // address: no reconciler for them.
                "--endpoint-reconciler-type=none".into(),
                format!("--secure-port={api_port}"),
                format!("--tls-cert-file={cert_file}"),
                format!("--tls-private-key-file={key_file}"),
                format!("--cert-dir={}", dir.join("certs").display()),
                format!("--token-auth-file={tokens}"),
                "--authorization-mode=RBAC".into(),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                "--service-account-issuer=https://kubernetes.default.svc".into(),
                format!("--service-account-key-file={sa_pub}"),
                format!("--service-account-signing-key-file={sa_key}"),
                "--disable-admission-plugins=ServiceAccount".into(),
                format!("--audit-policy-file={audit_policy}"),
                format!("--audit-log-path={}", dir.join("audit.log").display()),
                "--allow-privileged=false".into(),
            ],
            dir,
        ));
        let url = format!("https://127.0.0.1:{api_port}");
        let http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let mut cp = ControlPlane {
            url,
            ca,
            http,
            rt,
            audit: dir.join("audit.log"),
            procs,
        };
        cp.wait_ready();
        let admin = kubeconfig(dir, "admin.kubeconfig", &cp.url, &cp.ca, ADMIN_TOKEN);
        cp.procs.push(Proc::start(
            "kube-controller-manager",
            &cm,
            &[
                format!("--kubeconfig={}", admin.display()),
                "--controllers=endpointslice,endpoint,endpointslicemirroring".into(),
                "--leader-elect=false".into(),
                "--use-service-account-credentials=false".into(),
                format!("--service-account-private-key-file={sa_key}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port("127.0.0.1")),
            ],
            dir,
        ));
        cp
    }

    /// picket's writes (user `picket`, verbs other than get, list and
    /// watch) in the audit log so far: (verb, response code) per request.
    fn picket_writes(&self) -> Vec<(String, u64)> {
        self.picket_write_events()
            .into_iter()
            .map(|(v, c, _)| (v, c))
            .collect()
    }

    /// As [`picket_writes`](Self::picket_writes), with each request's URI
    /// and time.
    fn picket_write_events(&self) -> Vec<(String, u64, String)> {
        std::fs::read_to_string(&self.audit)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["user"]["username"] == "picket" && e["stage"] == "ResponseComplete")
            .filter_map(|e| {
                let verb = e["verb"].as_str()?.to_string();
                let code = e["responseStatus"]["code"].as_u64()?;
                let what = format!(
                    "{} {} by {}",
                    e["requestReceivedTimestamp"].as_str().unwrap_or(""),
                    e["requestURI"].as_str().unwrap_or(""),
                    e["userAgent"].as_str().unwrap_or("")
                );
                (!["get", "list", "watch"].contains(&verb.as_str())).then_some((verb, code, what))
            })
            .collect()
    }

    fn logs(&self) -> String {
        self.procs
            .iter()
            .map(Proc::tail)
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let req = self
                .http
                .get(format!("{}/readyz", self.url))
                .bearer_auth(ADMIN_TOKEN);
            let ok = self
                .rt
                .block_on(async { req.send().await })
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return;
            }
            for p in &self.procs {
                let exited = std::process::Command::new("kill")
                    .args(["-0", &p.child.id().to_string()])
                    .status()
                    .is_ok_and(|s| !s.success());
                assert!(!exited, "{} exited\n{}", p.name, self.logs());
            }
            assert!(
                Instant::now() < deadline,
                "the API server is not ready after 60 s\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// An admin request; panics on an unexpected status.
    fn call(&self, method: reqwest::Method, path: &str, body: Option<(&str, Value)>) -> Value {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.url))
            .bearer_auth(ADMIN_TOKEN);
        if let Some((ct, b)) = body {
            req = req
                .header("content-type", ct)
                .body(serde_json::to_vec(&b).unwrap());
        }
        let (code, v) = self.rt.block_on(async {
            let r = req.send().await.unwrap();
            let code = r.status();
            (code, r.json::<Value>().await.unwrap_or(Value::Null))
        });
        assert!(code.is_success(), "{method} {path}: {code}: {v}");
        v
    }

    fn create(&self, path: &str, body: Value) -> Value {
        self.call(
            reqwest::Method::POST,
            path,
            Some(("application/json", body)),
        )
    }

    fn pod(&self, name: &str) -> Option<Value> {
        let req = self
            .http
            .get(format!("{}/api/v1/namespaces/{NS}/pods/{name}", self.url))
            .bearer_auth(ADMIN_TOKEN);
        self.rt.block_on(async {
            let r = req.send().await.ok()?;
            if !r.status().is_success() {
                return None;
            }
            r.json::<Value>().await.ok()
        })
    }

    fn role(&self, pod: &str) -> Option<String> {
        self.pod(pod)?["metadata"]["labels"]["role"]
            .as_str()
            .map(str::to_string)
    }

    /// A pod of the group on the node, then its status as the kubelet
    /// would write it: running, its IP, Ready.
    fn add_pod(&self, name: &str, server: &RedisServer) {
        self.create(
            &format!("/api/v1/namespaces/{NS}/pods"),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": "cache"}},
                "spec": {
                    "nodeName": "node-1",
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "redis", "image": "redis:7",
                        "ports": [{"name": "redis", "containerPort": server.port()}]}],
                },
            }),
        );
        let ip = server.ip();
        self.call(
            reqwest::Method::PATCH,
            &format!("/api/v1/namespaces/{NS}/pods/{name}/status"),
            Some((
                "application/merge-patch+json",
                json!({"status": {
                    "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                    "hostIP": "127.0.0.1",
                    "conditions": [
                        {"type": "PodScheduled", "status": "True"},
                        {"type": "Initialized", "status": "True"},
                        {"type": "ContainersReady", "status": "True"},
                        {"type": "Ready", "status": "True"},
                    ],
                }}),
            )),
        );
    }

    /// DELETE a pod with a grace period: with no kubelet to finish it, it
    /// stays with its deletionTimestamp until deleted with grace 0.
    fn delete_pod(&self, name: &str, grace: u64) {
        self.call(
            reqwest::Method::DELETE,
            &format!("/api/v1/namespaces/{NS}/pods/{name}?gracePeriodSeconds={grace}"),
            None,
        );
    }

    fn wait_pod_gone(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.pod(name).is_some() {
            assert!(Instant::now() < deadline, "pod {name} not gone");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Namespace, node, the picket Role of docs/kubernetes.md bound to
    /// user `picket`, the Service selecting the master's label, one
    /// selecting the replicas' (reads) and the selector-less Service
    /// picket's endpointslice backend owns.
    fn set_up_cluster(&self) {
        self.create("/api/v1/namespaces", json!({"metadata": {"name": NS}}));
        self.create(
            "/api/v1/nodes",
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"}}),
        );
        self.create(
            &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles"),
            json!({
                "metadata": {"name": "picket"},
                "rules": [
                    {"apiGroups": [""], "resources": ["pods"],
                     "verbs": ["get", "list", "watch", "patch"]},
                    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                     "verbs": ["get", "list", "watch", "create", "patch"]},
                ],
            }),
        );
        self.create(
            &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings"),
            json!({
                "metadata": {"name": "picket"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "picket"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "picket"}],
            }),
        );
        for (name, role) in [("cache", "master"), ("cache-read", "replica")] {
            self.create(
                &format!("/api/v1/namespaces/{NS}/services"),
                json!({
                    "metadata": {"name": name},
                    "spec": {"selector": {"app": "cache", "role": role},
                             "ports": [{"name": "redis", "port": 6379, "targetPort": "redis"}]},
                }),
            );
        }
        self.create(
            &format!("/api/v1/namespaces/{NS}/services"),
            json!({
                "metadata": {"name": "cache-es"},
                "spec": {"ports": [{"name": "redis", "port": 6379}]},
            }),
        );
    }
}

/// What a watch of the namespace's EndpointSlices showed: per Service, the
/// ready addresses of all its slices after each event.
#[derive(Default)]
struct SliceWatch {
    seen: Mutex<Vec<(Instant, String, Vec<String>)>>,
}

impl SliceWatch {
    fn start(cp: &ControlPlane) -> Arc<SliceWatch> {
        let w = Arc::new(SliceWatch::default());
        let (w2, http, url) = (w.clone(), cp.http.clone(), cp.url.clone());
        cp.rt.spawn(async move {
            let mut slices: std::collections::BTreeMap<String, (String, Vec<String>)> =
                Default::default();
            let mut rv = "0".to_string();
            loop {
                let r = http
                    .get(format!(
                        "{url}/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
                    ))
                    .query(&[
                        ("watch", "1"),
                        ("resourceVersion", rv.as_str()),
                        ("allowWatchBookmarks", "true"),
                    ])
                    .bearer_auth(ADMIN_TOKEN)
                    .timeout(Duration::from_secs(600))
                    .send()
                    .await;
                let Ok(mut r) = r else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let mut buf = Vec::new();
                while let Ok(Some(chunk)) = r.chunk().await {
                    buf.extend_from_slice(&chunk);
                    while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = buf.drain(..=i).collect();
                        let Ok(ev) = serde_json::from_slice::<Value>(&line) else {
                            continue;
                        };
                        let o = &ev["object"];
                        if let Some(v) = o["metadata"]["resourceVersion"].as_str() {
                            rv = v.to_string();
                        }
                        let Some(name) = o["metadata"]["name"].as_str() else {
                            continue;
                        };
                        let service = o["metadata"]["labels"]["kubernetes.io/service-name"]
                            .as_str()
                            .unwrap_or("")
                            .to_string();
                        match ev["type"].as_str() {
                            Some("ADDED") | Some("MODIFIED") => {
                                let ready: Vec<String> = o["endpoints"]
                                    .as_array()
                                    .into_iter()
                                    .flatten()
                                    .filter(|e| e["conditions"]["ready"] != false)
                                    .flat_map(|e| {
                                        e["addresses"]
                                            .as_array()
                                            .into_iter()
                                            .flatten()
                                            .filter_map(|a| a.as_str().map(str::to_string))
                                    })
                                    .collect();
                                slices.insert(name.to_string(), (service.clone(), ready));
                            }
                            Some("DELETED") => {
                                slices.remove(name);
                            }
                            _ => continue,
                        }
                        let mut union: Vec<String> = slices
                            .values()
                            .filter(|(s, _)| *s == service)
                            .flat_map(|(_, a)| a.clone())
                            .collect();
                        union.sort();
                        union.dedup();
                        w2.seen
                            .lock()
                            .unwrap()
                            .push((Instant::now(), service, union));
                    }
                }
            }
        });
        w
    }

    fn now(&self, service: &str) -> Option<Vec<String>> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(_, s, _)| s == service)
            .map(|(_, _, a)| a.clone())
    }

    fn since(&self, t: Instant, service: &str) -> Vec<(Instant, Vec<String>)> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, s, _)| *at >= t && s == service)
            .map(|(at, _, a)| (*at, a.clone()))
            .collect()
    }
}

fn role_of(s: &RedisServer) -> Option<String> {
    s.info_field("replication", "role")
}

/// The IPs of the servers other than `master`, sorted (as [`SliceWatch`]
/// lists a Service's addresses).
fn replica_ips(servers: &[RedisServer], master: usize) -> Vec<String> {
    let mut ips: Vec<String> = (0..servers.len())
        .filter(|i| *i != master)
        .map(|i| servers[i].ip())
        .collect();
    ips.sort();
    ips
}

fn instances(node: &PicketNode) -> Vec<String> {
    node.instance_addrs(GROUP)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn stats(v: &[f64]) -> String {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return "n/a".into();
    }
    format!(
        "median {:.0} ms, max {:.0} ms (n={})",
        s[s.len() / 2],
        s[s.len() - 1],
        s.len()
    )
}

fn failed(what: &str, cluster: &PicketCluster, cp: &ControlPlane) -> ! {
    panic!("{what}\n{}\n{}", cluster.logs(), cp.logs());
}

#[test]
#[ignore = "needs a real kube-apiserver and kube-controller-manager: PICKET_KUBE_APISERVER, PICKET_KUBE_CONTROLLER_MANAGER (and PICKET_ETCD); run with --run-ignored"]
fn a_real_control_plane_sees_gated_failovers_replaced_pods_and_a_rolling_restart() {
    if let Err(why) = binaries() {
        panic!(
            "kube_real: {why}. It runs against a real kube-apiserver and \
             kube-controller-manager named by PICKET_KUBE_APISERVER and \
             PICKET_KUBE_CONTROLLER_MANAGER (and etcd, PICKET_ETCD or /usr/bin/etcd)"
        );
    }
    require_redis_server();
    if let Err(e) = enter_own_netns() {
        panic!("kube_real needs a network namespace of its own (run as root): {e}");
    }
    picket::tls::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let cp = ControlPlane::start(dir.path());
    cp.set_up_cluster();

    let topo = Topology::master_with_replicas(2);
    topo.wait_replicas_up(READY_TIMEOUT);
    let Topology { master, replicas } = topo;
    let mut servers = vec![master];
    servers.extend(replicas);
    for (i, s) in servers.iter().enumerate() {
        cp.add_pod(&format!("cache-{i}"), s);
    }
    let watch = SliceWatch::start(&cp);
    let kc = kubeconfig(
        dir.path(),
        "picket.kubeconfig",
        &cp.url,
        &cp.ca,
        PICKET_TOKEN,
    );
    let groups = format!(
        r#"[[group]]
name = "{GROUP}"
master = "{master}"
quorum = 2
down_after = "1s"
failover_timeout = "5s"

[group.members]
port = "redis"

[[group.discovery]]
type = "kubernetes"
kubeconfig = "{kc}"
namespace = "{NS}"
mode = "pod-labels"
pod_selector = "app=cache"
service = "cache"

[[group.discovery]]
type = "kubernetes"
kubeconfig = "{kc}"
namespace = "{NS}"
mode = "endpointslice"
service = "cache-es"
"#,
        master = servers[0].addr(),
        kc = kc.display(),
    );
    let cluster = ClusterPlan::new(3).start(&groups);
    let fail = |what: &str| failed(what, &cluster, &cp);
    let wait = |what: &str, secs: u64, cond: &mut dyn FnMut() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !cond() {
            if Instant::now() >= deadline {
                failed(
                    &format!("timed out after {secs} s waiting for {what}"),
                    &cluster,
                    &cp,
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let only = |s: &RedisServer| Some(vec![s.ip()]);
    wait("the Services to route to the first master", 30, &mut || {
        watch.now("cache") == only(&servers[0]) && watch.now("cache-es") == only(&servers[0])
    });
    wait("every daemon to know the three pods", 20, &mut || {
        cluster.nodes.iter().all(|n| instances(n).len() == 3)
    });

    // Kill -9 failovers.
    let mut out_ms = [Vec::new(), Vec::new()];
    let mut in_ms = [Vec::new(), Vec::new()];
    let mut promoted_ms = Vec::new();
    let mut read_out_ms = Vec::new();
    let services = ["cache", "cache-es"];
    let mut master_idx = 0usize;
    let writes_before = cp.picket_writes().len();
    let mut last_promotion: Option<Instant> = None;
    for round in 0..5 {
        // A group fails over again only failover_timeout (5 s) after its
        // last failover, as Sentinel: wait that out, or the next kill
        // measures the pause.
        if let Some(t) = last_promotion {
            let resume = t + Duration::from_millis(5500);
            while Instant::now() < resume {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let readers = replica_ips(&servers, master_idx);
        wait(
            "every replica linked and in the read Service",
            30,
            &mut || {
                servers
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != master_idx)
                    .all(|(_, s)| replica_linked_to(s, servers[master_idx].addr()))
                    && watch.now("cache-read").as_ref() == Some(&readers)
            },
        );
        let old_ip = servers[master_idx].ip();
        let t_kill = Instant::now();
        servers[master_idx].kill9();
        // The promotion, seen on the servers themselves.
        let mut promoted = None;
        wait("a replica promoted", 20, &mut || {
            promoted = servers
                .iter()
                .enumerate()
                .find(|(i, s)| *i != master_idx && role_of(s).as_deref() == Some("master"))
                .map(|(i, _)| i);
            promoted.is_some()
        });
        let t_promoted = Instant::now();
        last_promotion = Some(t_promoted);
        let new_idx = promoted.unwrap_or_else(|| fail("no promotion"));
        let new_ip = servers[new_idx].ip();
        wait("both Services on the new master", 20, &mut || {
            services
                .iter()
                .all(|s| watch.now(s) == Some(vec![new_ip.clone()]))
        });
        promoted_ms.push(ms(t_promoted - t_kill));
        for (k, svc) in services.iter().enumerate() {
            let seen = watch.since(t_kill, svc);
            for (at, a) in &seen {
                assert!(a.len() <= 1, "round {round}: {svc} listed {a:?}");
                if *at >= t_promoted {
                    assert!(
                        !a.contains(&old_ip),
                        "round {round}: {svc} listed the old master after the promotion"
                    );
                }
            }
            let out = seen
                .iter()
                .find(|(_, a)| !a.contains(&old_ip))
                .map(|(at, _)| *at);
            let inn = seen
                .iter()
                .find(|(_, a)| a.contains(&new_ip))
                .map(|(at, _)| *at);
            if let (Some(o), Some(i)) = (out, inn) {
                assert!(
                    i.saturating_duration_since(t_promoted) < Duration::from_secs(3),
                    "round {round}: {svc} got the new master {:?} after its promotion",
                    i.saturating_duration_since(t_promoted)
                );
                out_ms[k].push(ms(o - t_kill));
                in_ms[k].push(ms(i - t_kill));
                eprintln!(
                    "round {round} {svc}: kill → old out {:.0} ms, → promoted {:.0} ms, → new in {:.0} ms",
                    ms(o - t_kill),
                    ms(t_promoted - t_kill),
                    ms(i - t_kill)
                );
            }
        }
        // The killed server comes back on its pod (a container restart:
        // same pod, same IP) and is demoted.
        servers[master_idx].restart();
        let new_addr = servers[new_idx].addr();
        wait("the old master demoted", 30, &mut || {
            replica_linked_to(&servers[master_idx], new_addr)
        });
        // The read Service: every daemon has published the failover's
        // epoch (the others after the leader, a rank step apart), and it
        // lists both replicas. No replica it listed after the promotion
        // left it since: each stayed linked to the new master.
        let epoch = cluster.nodes[0].group(GROUP)["config_epoch"].clone();
        wait("every daemon's publication of the epoch", 20, &mut || {
            cluster.nodes.iter().all(|n| {
                let g = n.group(GROUP);
                g["config_epoch"] == epoch
                    && g["discovery"].as_array().is_some_and(|bs| {
                        bs.iter()
                            .all(|b| b["last_epoch"] == epoch && b["last_result"] == "ok")
                    })
            })
        });
        let readers = replica_ips(&servers, new_idx);
        wait("the read Service to list both replicas", 20, &mut || {
            watch.now("cache-read").as_ref() == Some(&readers)
        });
        let kept_ip = servers[3 - new_idx - master_idx].ip();
        let seen = watch.since(t_kill, "cache-read");
        // After the promotion the failover's publication takes the label
        // off the replicas not linked to the new master yet (the new
        // master's pod leaves as it gets the master label), and the
        // re-publications label them as they link: once the Service has
        // gained a replica, it loses none.
        let (mut listed, mut gained): (Option<Vec<String>>, bool) = (None, false);
        for (at, a) in &seen {
            if *at >= t_promoted {
                let now: Vec<String> = a.iter().filter(|ip| **ip != new_ip).cloned().collect();
                if let Some(before) = &listed {
                    gained |= now.iter().any(|ip| !before.contains(ip));
                    if let Some(gone) = before.iter().find(|ip| !now.contains(ip))
                        && gained
                    {
                        fail(&format!(
                            "round {round}: the read Service dropped replica {gone} after the \
                             failover's publication had labelled replicas: {:?}",
                            seen.iter()
                                .map(|(t, a)| (ms(t.saturating_duration_since(t_kill)), a))
                                .collect::<Vec<_>>()
                        ));
                    }
                }
                listed = Some(now);
            }
        }
        // How long the replica not failed over was out of the Service
        // since the kill (it was in it before: see "every replica linked").
        let (mut out, mut gone_at, mut times) = (Duration::ZERO, None::<Instant>, 0);
        for (at, a) in &seen {
            match (a.contains(&kept_ip), gone_at) {
                (true, Some(since)) => {
                    out += at.saturating_duration_since(since);
                    gone_at = None;
                }
                (false, None) => {
                    gone_at = Some(*at);
                    times += 1;
                }
                _ => {}
            }
        }
        read_out_ms.push(ms(out));
        eprintln!(
            "round {round} cache-read: the replica not failed over out of it for {:.0} ms \
             ({times} time(s))",
            ms(out)
        );
        master_idx = new_idx;
    }
    for (verb, code, what) in cp.picket_write_events().split_off(writes_before) {
        if code == 409 {
            eprintln!("  409 on {verb}: {what}");
        }
    }
    let writes = cp.picket_writes().split_off(writes_before);
    let patches = writes.iter().filter(|(v, _)| v == "patch").count();
    let conflicts = writes.iter().filter(|(_, c)| *c == 409).count();
    eprintln!(
        "real control plane, 5 kill -9 failovers: kill → promoted {}; picket's writes: {} ({patches} PATCH, {conflicts} answered 409) for 5 failovers",
        stats(&promoted_ms),
        writes.len()
    );
    eprintln!(
        "  cache-read (role=replica): the replica not failed over out of it {}",
        stats(&read_out_ms)
    );
    for (k, svc) in services.iter().enumerate() {
        let gap: Vec<f64> = in_ms[k]
            .iter()
            .zip(&promoted_ms)
            .map(|(i, p)| i - p)
            .collect();
        eprintln!(
            "  {svc}: kill → old master out {}; kill → new master in {}; promotion → new master in {}",
            stats(&out_ms[k]),
            stats(&in_ms[k]),
            stats(&gap)
        );
    }

    // A replica pod replaced by a pod with another IP.
    let r = (0..3).find(|i| *i != master_idx).unwrap();
    let pod = format!("cache-{r}");
    let old_addr = servers[r].addr().to_string();
    servers[r].kill9();
    cp.delete_pod(&pod, 0);
    cp.wait_pod_gone(&pod);
    let fresh = RedisServer::start_fresh(RedisOpts::default());
    cp.add_pod(&pod, &fresh);
    let t0 = Instant::now();
    let new_addr = fresh.addr().to_string();
    let master_addr = servers[master_idx].addr();
    wait(
        "the replaced pod attached, labelled and the old IP forgotten",
        30,
        &mut || {
            replica_linked_to(&fresh, master_addr)
                && cp.role(&pod).as_deref() == Some("replica")
                && cluster.nodes.iter().all(|n| {
                    let i = instances(n);
                    i.contains(&new_addr) && !i.contains(&old_addr)
                })
        },
    );
    eprintln!(
        "real control plane: replaced replica pod a labelled replica and the old IP forgotten on every daemon after {:?}",
        t0.elapsed()
    );
    servers[r] = fresh;

    // A rolling restart under writes, as a StatefulSet does it.
    wait("every replica linked before the roll", 30, &mut || {
        servers
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != master_idx)
            .all(|(_, s)| replica_linked_to(s, servers[master_idx].addr()))
    });
    // The writes go through the Service that selects role=master: to its
    // ready endpoint, as kube-proxy would route them.
    let ports: Arc<Mutex<std::collections::HashMap<String, u16>>> = Arc::new(Mutex::new(
        servers.iter().map(|s| (s.ip(), s.port())).collect(),
    ));
    let writer = {
        let (watch, ports) = (watch.clone(), ports.clone());
        Writer::start_resolving(move || {
            let ready = watch.now("cache")?;
            let ip = ready.first()?;
            let port = *ports.lock().unwrap().get(ip)?;
            format!("{ip}:{port}").parse().ok()
        })
    };
    wait("writes flow", 10, &mut || writer.count() >= 200);
    let t_roll = Instant::now();
    for i in [2usize, 1, 0] {
        let pod = format!("cache-{i}");
        let addr = servers[i].addr();
        cp.delete_pod(&pod, 30);
        wait(
            &format!("{pod}'s server no longer the master"),
            20,
            &mut || {
                cluster
                    .nodes
                    .iter()
                    .all(|n| n.master_addr(GROUP).is_some_and(|m| m != addr))
            },
        );
        servers[i].kill9();
        cp.delete_pod(&pod, 0);
        cp.wait_pod_gone(&pod);
        let fresh = RedisServer::start_fresh(RedisOpts::default());
        ports.lock().unwrap().insert(fresh.ip(), fresh.port());
        cp.add_pod(&pod, &fresh);
        wait(&format!("the new {pod} replicating"), 30, &mut || {
            cluster.nodes[0]
                .master_addr(GROUP)
                .is_some_and(|m| replica_linked_to(&fresh, m))
        });
        servers[i] = fresh;
    }
    let rolled = t_roll.elapsed();
    let before = writer.count();
    wait("writes flow after the roll", 10, &mut || {
        writer.count() >= before + 200
    });
    let acked = writer.finish();
    let master = cluster.nodes[0]
        .master_addr(GROUP)
        .unwrap_or_else(|| failed("no master", &cluster, &cp));
    let lost = lost_writes(master, &acked);
    eprintln!(
        "real control plane: rolling restart of 3 pods in {rolled:?}: {} writes, {} lost, longest write gap {:?}",
        acked.len(),
        lost.len(),
        longest_gap(&acked)
    );
    assert!(lost.is_empty(), "{} acknowledged writes lost", lost.len());
    drop(cluster);
    drop(cp);
}

//! End-to-end tests of service discovery: three picket daemons (real
//! processes), a real redis-server master and two replicas on their own
//! 198.18.x.y addresses in a network namespace of the test's own (a real
//! API server, and picket, refuse loopback addresses in an EndpointSlice;
//! needs root), the fake Kubernetes API server (in this process,
//! HTTPS with its own CA), a webhook receiver (in this process), and every
//! daemon configured with five backends: Kubernetes `pod-labels`,
//! Kubernetes `endpointslice`, a file, a program (exec) and the webhook.
//!
//! The master is killed with SIGKILL and the tests check what each backend
//! saw, when, and in which order, against what the servers reported at that
//! moment: the fake API server and the webhook receiver look at the redis
//! servers (INFO role, DBSIZE) while a write is arriving, before it is
//! answered, so "the new master was labelled only after it was promoted
//! and flushed" is checked without any race.
//!
//! The tests run one at a time (each starts six processes; see
//! `.config/nextest.toml`), and the last one
//! (`publication_latency_after_promotion`, ignored by default) measures the
//! time from the promotion to each backend's write over several failovers:
//!
//! ```text
//! cargo test --test it discovery_e2e::publication_latency -- --ignored --nocapture
//! ```

use picket_harness::fake_kube;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use fake_kube::{DEFAULT_TOKEN, FakeKind, FakeKube, LoggedRequest};
use picket::addr::Addr;
use picket_harness::*;
use serde_json::{Value, json};
use tempfile::TempDir;

const NS: &str = "cache";
const GROUP: &str = "cache";
const SLICE: &str = "cache-picket";
const EPOCH_ANNOTATION: &str = "picket.io/epoch";
/// Keys written to the master before a failover, so that DBSIZE 0 on the
/// new master proves the flush happened.
const SEED_KEYS: usize = 20;
/// How long a failover (detection, election, fence, promotion, publication,
/// re-pointing) may take on a loaded machine.
const FAILOVER_WAIT: Duration = Duration::from_secs(40);
/// How long the start-up publication (every daemon publishes epoch 0 once
/// the master reports role:master and a majority confirms the config) may
/// take once the cluster is healthy.
const STARTUP_WAIT: Duration = Duration::from_secs(30);
/// The epoch a test seeds into backends, as if a failover unknown to these
/// daemons had been published.
const NEWER_EPOCH: u64 = 1000;

// ---------------------------------------------------------------------------
// Time

/// Converts the fake's `Instant`s to wall-clock time, so that they compare
/// with file mtimes, the exec program's clock and the poller's times.
#[derive(Clone, Copy)]
struct Clock {
    inst: Instant,
    sys: SystemTime,
}

impl Clock {
    fn now() -> Clock {
        Clock {
            inst: Instant::now(),
            sys: SystemTime::now(),
        }
    }

    fn wall(&self, at: Instant) -> SystemTime {
        if at >= self.inst {
            self.sys + (at - self.inst)
        } else {
            self.sys - (self.inst - at)
        }
    }
}

/// `b - a` in milliseconds (negative when `b` is earlier).
fn ms_between(a: SystemTime, b: SystemTime) -> f64 {
    match b.duration_since(a) {
        Ok(d) => d.as_secs_f64() * 1000.0,
        Err(e) => -e.duration().as_secs_f64() * 1000.0,
    }
}

/// A `YYYY-MM-DDTHH:MM:SS.fffZ` timestamp (picket's log lines) as a time.
fn parse_utc(ts: &str) -> Option<SystemTime> {
    let ts = ts.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<u64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let nanos: u64 = format!("{frac:0<9}")[..9].parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    Some(UNIX_EPOCH + Duration::new(days * 86_400 + hh * 3600 + mm * 60 + ss, nanos as u32))
}

/// The times of the log lines containing `needle`.
fn log_times(logs: &str, needle: &str) -> Vec<SystemTime> {
    logs.lines()
        .filter(|l| l.contains(needle))
        .filter_map(|l| l.split_whitespace().next().and_then(parse_utc))
        .collect()
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

// ---------------------------------------------------------------------------
// What the redis servers say

/// One server's answer at one moment.
#[derive(Debug, Clone, PartialEq)]
struct ServerState {
    addr: SocketAddr,
    /// `master`, `slave`, or None when unreachable.
    role: Option<String>,
    dbsize: Option<i64>,
}

/// INFO role and DBSIZE of every server, on fresh connections.
fn snapshot(addrs: &[SocketAddr]) -> Vec<ServerState> {
    addrs
        .iter()
        .map(|&addr| {
            let mut st = ServerState {
                addr,
                role: None,
                dbsize: None,
            };
            if let Ok(mut c) = RespConn::connect(addr, Duration::from_millis(500)) {
                if let Ok(Reply::Bulk(b)) = c.cmd(&["INFO", "replication"]) {
                    st.role = info_value(&String::from_utf8_lossy(&b), "role");
                }
                st.dbsize = c.cmd(&["DBSIZE"]).ok().and_then(|r| r.as_int());
            }
            st
        })
        .collect()
}

fn role_in(snap: &[ServerState], addr: SocketAddr) -> Option<&ServerState> {
    snap.iter().find(|s| s.addr == addr)
}

/// A role change seen by the [`Poller`] (or bracketed otherwise): the
/// change happened between `before` and `after`.
#[derive(Debug, Clone)]
struct RoleChange {
    addr: SocketAddr,
    to: String,
    /// When the last request that still saw the old role was sent.
    before: SystemTime,
    /// When the first reply with the new role was received.
    after: SystemTime,
}

impl RoleChange {
    /// The midpoint of the interval in which the change happened.
    fn estimate(&self) -> SystemTime {
        let half = self
            .after
            .duration_since(self.before)
            .unwrap_or_default()
            .div_f64(2.0);
        self.before + half
    }
}

/// Polls `INFO replication` of every server every 5 ms in a thread and
/// records each change of the reported role ("down" when unreachable).
struct Poller {
    stop: Arc<AtomicBool>,
    changes: Arc<Mutex<Vec<RoleChange>>>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    fn start(addrs: Vec<SocketAddr>) -> Poller {
        let stop = Arc::new(AtomicBool::new(false));
        let changes = Arc::new(Mutex::new(Vec::new()));
        let (s, c) = (stop.clone(), changes.clone());
        let thread = std::thread::spawn(move || {
            let mut conns: Vec<Option<RespConn>> = addrs.iter().map(|_| None).collect();
            // (role, when the request that saw it was sent)
            let mut last: Vec<Option<(String, SystemTime)>> = addrs.iter().map(|_| None).collect();
            while !s.load(Ordering::Relaxed) {
                for (i, &addr) in addrs.iter().enumerate() {
                    let sent = SystemTime::now();
                    if conns[i].is_none() {
                        conns[i] = RespConn::connect(addr, Duration::from_millis(200)).ok();
                    }
                    let role = match conns[i].as_mut().map(|c| c.cmd(&["INFO", "replication"])) {
                        Some(Ok(Reply::Bulk(b))) => {
                            info_value(&String::from_utf8_lossy(&b), "role")
                                .unwrap_or_else(|| "unknown".into())
                        }
                        _ => {
                            conns[i] = None;
                            "down".into()
                        }
                    };
                    let received = SystemTime::now();
                    match &last[i] {
                        Some((r, _)) if *r == role => {}
                        Some((_, prev_sent)) => {
                            c.lock().unwrap().push(RoleChange {
                                addr,
                                to: role.clone(),
                                before: *prev_sent,
                                after: received,
                            });
                        }
                        None => {}
                    }
                    last[i] = Some((role, sent));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Poller {
            stop,
            changes,
            thread: Some(thread),
        }
    }

    fn changes(&self) -> Vec<RoleChange> {
        self.changes.lock().unwrap().clone()
    }

    /// The first time `addr` was seen turning master after `since`.
    fn became_master(&self, addr: SocketAddr, since: SystemTime) -> Option<RoleChange> {
        self.changes()
            .into_iter()
            .find(|c| c.addr == addr && c.to == "master" && c.after >= since)
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---------------------------------------------------------------------------
// Webhook receiver

/// One request the webhook receiver got.
#[derive(Debug, Clone)]
struct Received {
    /// The daemon, from the URL path (`/hook/<id>`).
    daemon: String,
    at: SystemTime,
    body: Value,
    /// The servers as the request arrived (when snapshots are on).
    servers: Option<Vec<ServerState>>,
}

struct WebhookReceiver {
    base: String,
    received: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WebhookReceiver {
    async fn start(snapshot_of: Option<Vec<SocketAddr>>) -> WebhookReceiver {
        use axum::extract::Path as UrlPath;
        let received = Arc::new(Mutex::new(Vec::new()));
        let r = received.clone();
        let handler = move |UrlPath(daemon): UrlPath<String>, body: axum::body::Bytes| {
            let r = r.clone();
            let snap = snapshot_of.clone();
            async move {
                let at = SystemTime::now();
                let servers = match snap {
                    Some(addrs) => tokio::task::spawn_blocking(move || snapshot(&addrs))
                        .await
                        .ok(),
                    None => None,
                };
                r.lock().unwrap().push(Received {
                    daemon,
                    at,
                    body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                    servers,
                });
                (axum::http::StatusCode::OK, "{}")
            }
        };
        let app = axum::Router::new().route("/hook/{daemon}", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        WebhookReceiver {
            base: format!("http://{addr}/hook"),
            received,
            task,
        }
    }

    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------
// The exec program

/// Records each run in `$1/run-<ns>-<pid>`: the time it started, its
/// arguments after `$1` and the `PICKET_*` environment.
const RECORD_SCRIPT: &str = r#"#!/bin/sh
out=$1
shift
t=$(date +%s%N)
f="$out/run-$t-$$"
{
  echo "at=$t"
  for a in "$@"; do echo "arg=$a"; done
  echo "PICKET_GROUP=$PICKET_GROUP"
  echo "PICKET_EPOCH=$PICKET_EPOCH"
  echo "PICKET_EVENT=$PICKET_EVENT"
  echo "PICKET_ROLE=$PICKET_ROLE"
  echo "PICKET_OLD_MASTER=$PICKET_OLD_MASTER"
  echo "PICKET_NEW_MASTER=$PICKET_NEW_MASTER"
  echo "PICKET_REPLICAS=$PICKET_REPLICAS"
} > "$f.tmp" && mv "$f.tmp" "$f"
"#;

/// One run of the exec program.
#[derive(Debug, Clone)]
struct ExecRun {
    at: SystemTime,
    /// Everything but the `at=` line, in order.
    lines: Vec<String>,
}

fn exec_runs(dir: &Path) -> Vec<ExecRun> {
    let mut runs: Vec<ExecRun> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(Result::ok).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.starts_with("run-") && !name.ends_with(".tmp")
        })
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap();
            let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
            let at_ns: u64 = lines[0].strip_prefix("at=").unwrap().parse().unwrap();
            lines.remove(0);
            ExecRun {
                at: UNIX_EPOCH + Duration::from_nanos(at_ns),
                lines,
            }
        })
        .collect();
    runs.sort_by_key(|r| r.at);
    runs
}

// ---------------------------------------------------------------------------
// The environment

/// How a test sets the environment up.
#[derive(Clone)]
struct Opts {
    /// `required` of both Kubernetes backends.
    k8s_required: bool,
    /// `required` of the webhook (so that its fence gates the promotion).
    webhook_required: bool,
    flush_on_failover: bool,
    failover_timeout: &'static str,
    /// The token in the kubeconfig's token file.
    token: String,
    /// Whether the fake and the webhook receiver look at the servers on
    /// every write (off when measuring latencies).
    snapshots: bool,
    /// Backends that already hold [`NEWER_EPOCH`] when the daemons start.
    newer: Newer,
}

/// Which backends hold [`NEWER_EPOCH`] before the daemons start, so that
/// the start-up publication meets it as well as the failover's writes.
#[derive(Clone, Copy, Default)]
struct Newer {
    /// The `picket.io/epoch` annotation of the three pods.
    pods: bool,
    /// The `picket.io/epoch` annotation of the EndpointSlice.
    slice: bool,
    /// Every daemon's file (see [`newer_file`]).
    files: bool,
}

/// The content of a file published at [`NEWER_EPOCH`] by someone else.
fn newer_file() -> String {
    json!({"group": GROUP, "epoch": NEWER_EPOCH, "master": "127.0.0.1:1", "master_host": "127.0.0.1",
           "master_port": 1, "replicas": [], "reporter": "leader",
           "updated_at": "2030-01-01T00:00:00.000Z"})
    .to_string()
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            k8s_required: true,
            webhook_required: true,
            flush_on_failover: true,
            failover_timeout: "10s",
            token: DEFAULT_TOKEN.into(),
            snapshots: true,
            newer: Newer::default(),
        }
    }
}

/// One picket daemon and where its backends write.
struct Daemon {
    proc: PicketProcess,
    id: String,
    http: SocketAddr,
    file: PathBuf,
    exec_dir: PathBuf,
}

/// How a failover ended, as all three daemons agree.
#[derive(Debug, Clone)]
struct Converged {
    epoch: u64,
    master: SocketAddr,
    /// Index of the daemon that carried the failover out.
    leader: usize,
    statuses: Vec<Value>,
}

/// Where the start-up publication ended in each record: what a test
/// looks at after it belongs to the failover.
#[derive(Debug, Clone, Default)]
struct Mark {
    /// The id of the fake's last logged request.
    fake: u64,
    /// Requests the webhook receiver got.
    webhook: usize,
    /// Runs of each daemon's exec program.
    exec: Vec<usize>,
}

/// Everything a test runs; dropped in field order: the daemons first, the
/// runtime (which runs the fake and the webhook receiver) last.
struct Env {
    daemons: Vec<Daemon>,
    servers: Vec<RedisServer>,
    poller: Poller,
    webhook: WebhookReceiver,
    fake: FakeKube,
    /// Server snapshots the fake took as each write arrived, by request id.
    seen: Arc<Mutex<HashMap<u64, Vec<ServerState>>>>,
    http: reqwest::Client,
    clock: Clock,
    opts: Opts,
    /// The end of the start-up publication.
    mark: Mark,
    dir: TempDir,
    rt: tokio::runtime::Runtime,
}

/// `n` ports free on 127.0.0.1 right now, all different: [`free_port`]
/// releases each port at once, so two calls may return the same one, and
/// a daemon whose two ports coincide refuses to start.
fn distinct_free_ports(n: usize) -> Vec<u16> {
    let mut ports: Vec<u16> = Vec::with_capacity(n);
    for _ in 0..100 * n {
        if ports.len() == n {
            break;
        }
        let p = free_port("127.0.0.1");
        if !ports.contains(&p) {
            ports.push(p);
        }
    }
    assert_eq!(ports.len(), n, "no {n} distinct free ports: {ports:?}");
    ports
}

/// The pod name of server `i`.
fn pod(i: usize) -> String {
    format!("cache-{i}")
}

impl Env {
    fn start(opts: Opts) -> Env {
        // The servers get 198.18.x.y addresses in a network namespace of
        // this test's own: picket's endpointslice mode refuses loopback
        // addresses, as a real API server does. Everything this thread
        // starts from here on (the runtime, the servers, the daemons) is
        // in that namespace.
        if let Err(e) = enter_own_netns() {
            panic!("discovery_e2e needs a network namespace of its own (run as root): {e}");
        }
        picket::tls::install_crypto_provider();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::Builder::new()
            .prefix("picket-disc-e2e-")
            .tempdir()
            .unwrap();

        // A master and two replicas, each on its own loopback address (as
        // pods have their own IPs), with data the flush must remove.
        let topo = Topology::master_with_replicas(2);
        topo.fill(SEED_KEYS, READY_TIMEOUT);
        let Topology { master, replicas } = topo;
        let mut servers = vec![master];
        servers.extend(replicas);
        let addrs: Vec<SocketAddr> = servers.iter().map(RedisServer::addr).collect();

        // The cluster as it was before picket: pods labelled by hand (the
        // master has role=master), a pod of another app that must never be
        // touched, and the EndpointSlice holding the master.
        let fake = rt.block_on(FakeKube::start());
        for (i, s) in servers.iter().enumerate() {
            let role = if i == 0 { "master" } else { "replica" };
            fake.put_object(
                FakeKind::Pod,
                NS,
                json!({
                    "metadata": {"name": pod(i), "labels": {"app": "cache", "role": role}},
                    "spec": {"containers": [{"name": "redis", "ports": [{"containerPort": s.port()}]}]},
                    "status": {"phase": "Running", "podIP": s.ip()},
                }),
            );
        }
        fake.put_object(
            FakeKind::Pod,
            NS,
            json!({
                "metadata": {"name": "web-0", "labels": {"app": "web", "role": "master"}},
                "spec": {"containers": [{"name": "web", "ports": [{"containerPort": 80}]}]},
                "status": {"phase": "Running", "podIP": "127.0.0.1"},
            }),
        );
        fake.put_object(
            FakeKind::EndpointSlice,
            NS,
            json!({
                "metadata": {
                    "name": SLICE,
                    "labels": {
                        "kubernetes.io/service-name": "cache",
                        "endpointslice.kubernetes.io/managed-by": "picket.io",
                    },
                    "annotations": {EPOCH_ANNOTATION: "0"},
                },
                "addressType": "IPv4",
                "ports": [{"name": "redis", "port": servers[0].port(), "protocol": "TCP"}],
                "endpoints": [{
                    "addresses": [servers[0].ip()],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                }],
            }),
        );
        // Seeded before the daemons start, so that their start-up
        // publication meets the newer epoch too.
        let newer = NEWER_EPOCH.to_string();
        if opts.newer.pods {
            for i in 0..3 {
                fake.set_annotation(FakeKind::Pod, NS, &pod(i), EPOCH_ANNOTATION, &newer);
            }
        }
        if opts.newer.slice {
            fake.set_annotation(FakeKind::EndpointSlice, NS, SLICE, EPOCH_ANNOTATION, &newer);
        }
        let seen: Arc<Mutex<HashMap<u64, Vec<ServerState>>>> = Arc::default();
        if opts.snapshots {
            let seen = seen.clone();
            let addrs = addrs.clone();
            fake.set_hook(Some(Arc::new(move |req: &LoggedRequest| {
                if req.is_write() {
                    let snap = snapshot(&addrs);
                    seen.lock().unwrap().insert(req.id, snap);
                }
            })));
        }

        // The kubeconfig: the fake's CA, a token file the test can rewrite.
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, format!("{}\n", opts.token)).unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: fake\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: picket\n  user:\n    tokenFile: {}\ncontexts:\n- name: test\n  context:\n    cluster: fake\n    user: picket\n",
                fake.url(),
                B64.encode(fake.ca_pem()),
                token_file.display()
            ),
        )
        .unwrap();

        let webhook = rt.block_on(WebhookReceiver::start(
            opts.snapshots.then(|| addrs.clone()),
        ));
        let script = dir.path().join("record.sh");
        std::fs::write(&script, RECORD_SCRIPT).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();

        let ports = distinct_free_ports(6);
        let (resp, http) = (ports[..3].to_vec(), ports[3..].to_vec());
        let master = servers[0].addr();
        let daemons = (0..3)
            .map(|i| {
                let id = format!("picket-{i}");
                let peers: Vec<String> = (0..3)
                    .filter(|&j| j != i)
                    .map(|j| format!("\"127.0.0.1:{}\"", resp[j]))
                    .collect();
                let mut file = PathBuf::new();
                let mut exec_dir = PathBuf::new();
                let proc = PicketProcess::start_with(
                    |d| {
                        file = d.join("discovery.json");
                        exec_dir = d.join("exec");
                        std::fs::create_dir(&exec_dir).unwrap();
                        if opts.newer.files {
                            std::fs::write(&file, newer_file()).unwrap();
                        }
                        format!(
                            r#"[daemon]
id = "{id}"
listen = "127.0.0.1:{resp}"
http_listen = "127.0.0.1:{http}"
data_dir = "{data}"
peers = [{peers}]

[[group]]
name = "{GROUP}"
master = "{master}"
quorum = 2
down_after = "500ms"
failover_timeout = "{ft}"
flush_on_failover = {flush}

[[group.discovery]]
type = "kubernetes"
kubeconfig = "{kc}"
namespace = "{NS}"
mode = "pod-labels"
pod_selector = "app=cache"
# No Service selects the pods here: the fence is confirmed on the label
# write alone, which picket allows only when asked to (and warns).
skip_service_gate = true
required = {k8s_req}

[[group.discovery]]
type = "kubernetes"
kubeconfig = "{kc}"
namespace = "{NS}"
mode = "endpointslice"
service = "cache"
required = {k8s_req}

[[group.discovery]]
type = "file"
path = "{file}"

[[group.discovery]]
type = "exec"
command = ["{script}", "{exec_dir}"]

[[group.discovery]]
type = "webhook"
url = "{hook}/{id}"
required = {hook_req}
"#,
                            resp = resp[i],
                            http = http[i],
                            data = d.join("data").display(),
                            peers = peers.join(", "),
                            ft = opts.failover_timeout,
                            flush = opts.flush_on_failover,
                            kc = kubeconfig.display(),
                            k8s_req = opts.k8s_required,
                            file = file.display(),
                            script = script.display(),
                            exec_dir = exec_dir.display(),
                            hook = webhook.base,
                            hook_req = opts.webhook_required,
                        )
                    },
                    &[],
                    &[("RUST_LOG", "info")],
                );
                Daemon {
                    proc,
                    id,
                    http: format!("127.0.0.1:{}", http[i]).parse().unwrap(),
                    file,
                    exec_dir,
                }
            })
            .collect();

        let http_client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let mut env = Env {
            daemons,
            poller: Poller::start(addrs),
            servers,
            webhook,
            fake,
            seen,
            http: http_client,
            clock: Clock::now(),
            opts,
            mark: Mark::default(),
            dir,
            rt,
        };
        env.wait_healthy(master, 0, Duration::from_secs(30));
        env.wait_startup_publication();
        env
    }

    /// The result every daemon's start-up publication must get from the
    /// backend `b` (a status entry): refused where a newer epoch was
    /// seeded, permanent where the token is rejected, ok elsewhere.
    fn startup_result(&self, b: &Value) -> &'static str {
        let name = b["name"].as_str().unwrap_or_default();
        let newer = self.opts.newer;
        match b["kind"].as_str() {
            Some("kubernetes") if self.opts.token != DEFAULT_TOKEN => "permanent",
            Some("kubernetes") if name.contains("/pods ") && newer.pods => "stale",
            Some("kubernetes") if name.contains("/endpointslice ") && newer.slice => "stale",
            Some("file") if newer.files => "stale",
            _ => "ok",
        }
    }

    /// Wait (bounded) until every daemon's start-up publication (epoch 0,
    /// the configured master, reporter `observer`) got its final answer
    /// from all five backends, check what it left in each of them, and
    /// remember where it ended: the tests look at the failover's writes,
    /// which come after.
    #[track_caller]
    fn wait_startup_publication(&mut self) {
        let statuses = self.wait_statuses(
            "the start-up publication confirmed or refused by every backend",
            STARTUP_WAIT,
            |gs| {
                gs.iter().all(|g| {
                    g["discovery"].as_array().is_some_and(|bs| {
                        bs.len() == 5
                            && bs.iter().all(|b| {
                                b["last_op"] == "publish"
                                    && b["last_epoch"] == 0
                                    && b["retrying"] == false
                                    && ["ok", "stale", "permanent"]
                                        .contains(&b["last_result"].as_str().unwrap_or(""))
                            })
                    })
                })
            },
        );
        for (g, d) in statuses.iter().zip(&self.daemons) {
            for b in g["discovery"].as_array().unwrap() {
                if b["last_result"] != self.startup_result(b) {
                    self.fail(&format!(
                        "the start-up publication of {} got {} from {b}, expected {}",
                        d.id,
                        b["last_result"],
                        self.startup_result(b)
                    ));
                }
            }
        }
        self.check_startup_publication();
        self.mark = Mark {
            fake: self.fake.requests().iter().map(|r| r.id).max().unwrap_or(0),
            webhook: self.webhook.received().len(),
            exec: self
                .daemons
                .iter()
                .map(|d| exec_runs(&d.exec_dir).len())
                .collect(),
        };
    }

    /// What the start-up publication left in every backend: where it was
    /// accepted, the configured master (server 0) at epoch 0; where a
    /// newer epoch was seeded or the token is rejected, nothing written
    /// (reads only).
    #[track_caller]
    fn check_startup_publication(&self) {
        let master = self.servers[0].addr();
        let replicas = replicas_of(self, master);
        let k8s_ok = self.opts.token == DEFAULT_TOKEN;
        let pods_path = format!("/api/v1/namespaces/{NS}/pods/");
        let slice_path = format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices");
        let ws = self.fake.writes();
        if k8s_ok && !self.opts.newer.pods {
            for i in 0..3 {
                let want = if i == 0 { "master" } else { "replica" };
                assert_eq!(
                    self.pod_label(i, "role").as_deref(),
                    Some(want),
                    "{}",
                    pod(i)
                );
                assert_eq!(self.pod_epoch(i).as_deref(), Some("0"), "{}", pod(i));
            }
            // Never two pods labelled master, even at start-up.
            let pod_writes: Vec<Write> = writes_since(self, 0)
                .into_iter()
                .filter(|w| w.pod.is_some())
                .collect();
            replay_pod_labels(self, &pod_writes, initial_labels(), &pod(0));
        } else {
            let w: Vec<&LoggedRequest> = ws
                .iter()
                .filter(|r| r.path.starts_with(&pods_path))
                .collect();
            assert!(w.is_empty(), "pods written at start-up: {w:#?}");
        }
        let slice = self.slice();
        if k8s_ok && !self.opts.newer.slice {
            assert_eq!(slice["metadata"]["annotations"][EPOCH_ANNOTATION], "0");
            assert_eq!(
                slice["endpoints"],
                json!([{
                    "addresses": [self.servers[0].ip()],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                }])
            );
        } else {
            let w: Vec<&LoggedRequest> = ws
                .iter()
                .filter(|r| r.path.starts_with(&slice_path))
                .collect();
            assert!(w.is_empty(), "the slice written at start-up: {w:#?}");
        }
        assert!(
            ws.iter().all(|r| !r.path.ends_with("/web-0")),
            "another app's pod was written: {ws:#?}"
        );
        for d in &self.daemons {
            let text = std::fs::read_to_string(&d.file)
                .unwrap_or_else(|e| panic!("{}: {e}", d.file.display()));
            if self.opts.newer.files {
                assert_eq!(text, newer_file(), "file of {}", d.id);
                continue;
            }
            let mut doc: Value = serde_json::from_str(&text).unwrap();
            assert_rfc3339_utc(doc["updated_at"].as_str().unwrap());
            doc.as_object_mut().unwrap().remove("updated_at");
            assert_eq!(
                doc,
                json!({
                    "group": GROUP,
                    "epoch": 0,
                    "master": master.to_string(),
                    "master_host": master.ip().to_string(),
                    "master_port": master.port(),
                    "replicas": replicas,
                    "reporter": "observer",
                }),
                "start-up file of {}",
                d.id
            );
        }
        // Exec: one run per daemon; with no old master, `from` is the
        // master itself and PICKET_OLD_MASTER is empty.
        for d in &self.daemons {
            let runs = exec_runs(&d.exec_dir);
            assert_eq!(runs.len(), 1, "start-up runs of {}: {runs:?}", d.id);
            let expected: Vec<String> = [
                format!("arg={GROUP}"),
                "arg=observer".into(),
                "arg=start".into(),
                format!("arg={}", master.ip()),
                format!("arg={}", master.port()),
                format!("arg={}", master.ip()),
                format!("arg={}", master.port()),
                format!("PICKET_GROUP={GROUP}"),
                "PICKET_EPOCH=0".into(),
                "PICKET_EVENT=publish".into(),
                "PICKET_ROLE=observer".into(),
                "PICKET_OLD_MASTER=".into(),
                format!("PICKET_NEW_MASTER={master}"),
                format!("PICKET_REPLICAS={}", replicas.join(",")),
            ]
            .into();
            assert_eq!(runs[0].lines, expected, "start-up exec run of {}", d.id);
        }
        // Webhook: one publication per daemon, sent while the master
        // reported role:master.
        let got = self.webhook.received();
        assert_eq!(got.len(), 3, "start-up webhook requests: {got:#?}");
        for d in &self.daemons {
            let from: Vec<&Received> = got.iter().filter(|r| r.daemon == d.id).collect();
            assert_eq!(
                from.len(),
                1,
                "start-up webhook requests from {}: {got:#?}",
                d.id
            );
            let mut body = from[0].body.clone();
            assert_rfc3339_utc(body["timestamp"].as_str().unwrap());
            body.as_object_mut().unwrap().remove("timestamp");
            assert_eq!(
                body,
                json!({"group": GROUP, "epoch": 0, "event": "publish", "reporter": "observer",
                       "old_master": null, "master": master.to_string(),
                       "replicas": replicas}),
                "start-up webhook publication from {}",
                d.id
            );
            if let Some(snap) = &from[0].servers {
                let s = role_in(snap, master).unwrap();
                assert_eq!(s.role.as_deref(), Some("master"), "{snap:?}");
            }
        }
    }

    /// The fake's requests after the start-up publication.
    fn requests(&self) -> Vec<LoggedRequest> {
        self.fake
            .requests()
            .into_iter()
            .filter(|r| r.id > self.mark.fake)
            .collect()
    }

    /// The webhook requests after the start-up publication.
    fn received(&self) -> Vec<Received> {
        let mut all = self.webhook.received();
        let skip = self.mark.webhook.min(all.len());
        all.split_off(skip)
    }

    /// The runs of daemon `i`'s exec program after the start-up publication.
    fn exec_runs(&self, i: usize) -> Vec<ExecRun> {
        let mut runs = exec_runs(&self.daemons[i].exec_dir);
        let skip = self.mark.exec.get(i).copied().unwrap_or(0).min(runs.len());
        runs.split_off(skip)
    }

    fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(RedisServer::addr).collect()
    }

    fn index_of(&self, addr: SocketAddr) -> usize {
        self.servers
            .iter()
            .position(|s| s.addr() == addr)
            .unwrap_or_else(|| panic!("{addr} is not one of the servers"))
    }

    /// `/v1/status` of daemon `i`, None when it does not answer.
    fn status(&self, i: usize) -> Option<Value> {
        let url = format!("http://{}/v1/status", self.daemons[i].http);
        self.rt.block_on(async {
            let r = self.http.get(&url).send().await.ok()?;
            r.json::<Value>().await.ok()
        })
    }

    /// `/metrics` of daemon `i`, None when it does not answer.
    fn metrics(&self, i: usize) -> Option<String> {
        let url = format!("http://{}/metrics", self.daemons[i].http);
        self.rt.block_on(async {
            let r = self.http.get(&url).send().await.ok()?;
            r.text().await.ok()
        })
    }

    /// The group's part of every daemon's status (None for a daemon that
    /// does not answer).
    fn groups(&self) -> Vec<Option<Value>> {
        self.groups_of(&[0, 1, 2])
    }

    fn groups_of(&self, which: &[usize]) -> Vec<Option<Value>> {
        which
            .iter()
            .map(|&i| self.status(i).map(|s| s["groups"][0].clone()))
            .collect()
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for d in &self.daemons {
            out.push_str(&format!("===== {} =====\n{}\n", d.id, d.proc.logs()));
        }
        out
    }

    /// Panic with everything a reader needs to understand a failure.
    #[track_caller]
    fn fail(&self, what: &str) -> ! {
        panic!(
            "{what}\n--- statuses ---\n{:#?}\n--- fake API requests ---\n{}\n{}",
            self.groups(),
            self.fake
                .requests()
                .iter()
                .map(|r| format!(
                    "#{} {} {} {} -> {} {}",
                    r.id,
                    r.method,
                    r.path,
                    r.query.as_deref().unwrap_or(""),
                    r.status,
                    r.body
                ))
                .collect::<Vec<_>>()
                .join("\n"),
            self.logs()
        )
    }

    /// Poll the statuses of all daemons until `ok` holds for them.
    #[track_caller]
    fn wait_statuses(
        &self,
        what: &str,
        timeout: Duration,
        ok: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        self.wait_statuses_of(&[0, 1, 2], what, timeout, ok)
    }

    /// Wait until a daemon reports its last failover aborted with an
    /// outcome that starts with `prefix`; that daemon's group status.
    #[track_caller]
    fn wait_aborted(&self, what: &str, prefix: &str) -> Value {
        let aborted = |g: &Value| {
            g["last_failover"]["outcome"]
                .as_str()
                .is_some_and(|o| o.starts_with(prefix))
        };
        let gs = self.wait_statuses(what, FAILOVER_WAIT, |gs| gs.iter().any(aborted));
        gs.into_iter()
            .find(aborted)
            .unwrap_or_else(|| self.fail(&format!("{what}: no aborted failover")))
    }

    /// [`Env::wait_statuses`] for some of the daemons.
    #[track_caller]
    fn wait_statuses_of(
        &self,
        which: &[usize],
        what: &str,
        timeout: Duration,
        ok: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let groups = self.groups_of(which);
            if groups.iter().all(Option::is_some) {
                let groups: Vec<Value> = groups.into_iter().flatten().collect();
                if ok(&groups) {
                    return groups;
                }
            }
            if Instant::now() >= deadline {
                self.fail(&format!("timed out after {timeout:?} waiting for {what}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Wait until every daemon monitors `master` at `epoch` with all three
    /// servers up, its two peers reachable and no failover going on.
    #[track_caller]
    fn wait_healthy(&self, master: SocketAddr, epoch: u64, timeout: Duration) {
        let master = master.to_string();
        self.wait_statuses(
            &format!("every daemon healthy with master {master} at epoch {epoch}"),
            timeout,
            |gs| {
                gs.iter().all(|g| {
                    let instances = g["instances"].as_array().cloned().unwrap_or_default();
                    let peers = g["peers"].as_array().cloned().unwrap_or_default();
                    g["master"] == master.as_str()
                        && g["config_epoch"] == epoch
                        && g["status"] == "ok"
                        && g["failover"].is_null()
                        && instances.len() == 3
                        && instances
                            .iter()
                            .all(|i| i["up"] == true && !i["info_age_ms"].is_null())
                        && peers.len() == 2
                        && peers.iter().all(|p| p["reachable"] == true)
                })
            },
        );
    }

    /// SIGKILL the current master; returns when that happened.
    fn kill(&mut self, i: usize) -> SystemTime {
        let at = SystemTime::now();
        self.servers[i].kill9().expect("the master was running");
        at
    }

    /// Wait until all daemons agree on a configuration newer than
    /// `after_epoch`, no failover is going on, and every backend of every
    /// daemon confirmed that configuration.
    #[track_caller]
    fn wait_converged(&self, after_epoch: u64, timeout: Duration) -> Converged {
        let statuses = self.wait_statuses(
            &format!("a failover past epoch {after_epoch} confirmed by every backend"),
            timeout,
            |gs| {
                let epoch = gs[0]["config_epoch"].as_u64().unwrap_or(0);
                epoch > after_epoch
                    && gs.iter().all(|g| {
                        let backends = g["discovery"].as_array().cloned().unwrap_or_default();
                        g["config_epoch"] == epoch
                            && g["master"] == gs[0]["master"]
                            && g["failover"].is_null()
                            && backends.len() == 5
                            && backends.iter().all(|b| {
                                b["last_epoch"] == epoch
                                    && b["last_result"] == "ok"
                                    && b["retrying"] == false
                            })
                    })
                    && gs
                        .iter()
                        .filter(|g| {
                            g["last_failover"]["epoch"] == epoch
                                && g["last_failover"]["outcome"] == "completed"
                        })
                        .count()
                        == 1
            },
        );
        let epoch = statuses[0]["config_epoch"].as_u64().unwrap();
        let master: SocketAddr = statuses[0]["master"].as_str().unwrap().parse().unwrap();
        let leader = statuses
            .iter()
            .position(|g| g["last_failover"]["outcome"] == "completed")
            .unwrap();
        for (i, g) in statuses.iter().enumerate() {
            if i != leader {
                assert_eq!(g["last_failover"]["outcome"], "observed", "{g:#}");
            }
        }
        Converged {
            epoch,
            master,
            leader,
            statuses,
        }
    }

    /// Wait (bounded) until [`Env::k8s_published`]: a replica is labelled
    /// once it replicates from the new master, which follows the
    /// failover's publication by a re-publication.
    #[track_caller]
    fn wait_k8s_published(&self, master: usize, epoch: u64) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !self.k8s_published(master, epoch) {
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "the pods and the slice do not show {} at epoch {epoch}: labels {:?}\n{:#?}",
                    pod(master),
                    (0..3)
                        .map(|i| self.pod_label(i, "role"))
                        .collect::<Vec<_>>(),
                    self.fake.requests()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn pod_label(&self, i: usize, key: &str) -> Option<String> {
        self.fake.label(FakeKind::Pod, NS, &pod(i), key)
    }

    fn pod_epoch(&self, i: usize) -> Option<String> {
        self.fake.object(FakeKind::Pod, NS, &pod(i)).and_then(|p| {
            p["metadata"]["annotations"][EPOCH_ANNOTATION]
                .as_str()
                .map(str::to_string)
        })
    }

    fn slice(&self) -> Value {
        self.fake
            .object(FakeKind::EndpointSlice, NS, SLICE)
            .unwrap()
    }

    /// The pods and the slice say `master` (server index) is the master at `epoch`.
    /// Whether the pods and the slice show `master` at `epoch`: its pod
    /// labelled master, the pods of servers replicating from it labelled
    /// replica, every other pod (a dead old master) without a role.
    fn k8s_published(&self, master: usize, epoch: u64) -> bool {
        let e = epoch.to_string();
        let master_addr = self.servers[master].addr();
        (0..3).all(|i| {
            let want = if i == master {
                Some("master")
            } else if replica_linked_to(&self.servers[i], master_addr) {
                Some("replica")
            } else {
                None
            };
            self.pod_label(i, "role").as_deref() == want
                && self.pod_epoch(i).as_deref() == Some(e.as_str())
        }) && {
            let s = self.slice();
            s["metadata"]["annotations"][EPOCH_ANNOTATION] == e.as_str()
                && s["endpoints"]
                    == json!([{
                        "addresses": [self.servers[master].ip()],
                        "conditions": {"ready": true, "serving": true, "terminating": false},
                    }])
                && s["ports"]
                    == json!([{"name": "redis", "port": self.servers[master].port(), "protocol": "TCP"}])
        }
    }
}

// ---------------------------------------------------------------------------
// Reading the fake's request log

/// A write to a pod or the slice, as the fake received it.
#[derive(Debug, Clone)]
struct Write {
    req: LoggedRequest,
    /// The pod's name, or None for the slice.
    pod: Option<String>,
    /// The servers as the write arrived.
    servers: Option<Vec<ServerState>>,
}

impl Write {
    fn ok(&self) -> bool {
        (200..300).contains(&self.req.status)
    }
    fn epoch(&self) -> Option<String> {
        self.req.json()["metadata"]["annotations"][EPOCH_ANNOTATION]
            .as_str()
            .map(str::to_string)
    }
    /// For a pod write: `Some(Some(v))` sets the role, `Some(None)` removes it,
    /// None leaves it.
    fn role(&self) -> Option<Option<String>> {
        let body = self.req.json();
        let labels = body["metadata"]["labels"].as_object()?;
        let v = labels.get("role")?;
        Some(v.as_str().map(str::to_string))
    }
    /// For a slice write: the addresses of its endpoints.
    fn addresses(&self) -> Option<Vec<String>> {
        let body = self.req.json();
        let eps = body.get("endpoints")?.as_array()?.clone();
        Some(
            eps.iter()
                .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
                .filter_map(|a| a.as_str().map(str::to_string))
                .collect(),
        )
    }
}

/// The writes to the pods and the slice after the start-up publication.
fn writes(env: &Env) -> Vec<Write> {
    writes_since(env, env.mark.fake)
}

/// The writes to the pods and the slice after request `after` (0: all).
fn writes_since(env: &Env, after: u64) -> Vec<Write> {
    let seen = env.seen.lock().unwrap().clone();
    let pods = format!("/api/v1/namespaces/{NS}/pods/");
    let slice = format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices");
    let mut out: Vec<Write> = env
        .fake
        .writes()
        .into_iter()
        .filter(|r| r.id > after)
        .filter_map(|r| {
            let pod = if let Some(name) = r.path.strip_prefix(&pods) {
                Some(name.to_string())
            } else if r.path.starts_with(&slice) {
                None
            } else {
                return None;
            };
            Some(Write {
                servers: seen.get(&r.id).cloned(),
                pod,
                req: r,
            })
        })
        .collect();
    out.sort_by_key(|w| w.req.id);
    out
}

/// Replays the successful pod writes in order over `initial` labels and
/// checks that no two pods of the group ever held the master label; returns
/// the index (in `ws`) of the first write that gave another pod than `old`
/// the master label, and of the last write before it that removed `old`'s
/// (an aborted attempt's fence is followed by `old` labelled again, at that
/// attempt's epoch, and the next attempt fences it anew).
fn replay_pod_labels(
    env: &Env,
    ws: &[Write],
    initial: BTreeMap<String, Option<String>>,
    old: &str,
) -> (Option<usize>, Option<usize>) {
    let mut labels = initial;
    let (mut lost, mut gained) = (None, None);
    for (k, w) in ws.iter().enumerate() {
        let (Some(name), Some(role)) = (&w.pod, w.role()) else {
            continue;
        };
        if !w.ok() {
            continue;
        }
        assert!(
            name.starts_with("cache-"),
            "picket wrote to {name}, outside its selector: {w:?}"
        );
        let before = labels.get(name).cloned().flatten();
        labels.insert(name.clone(), role.clone());
        if name == old
            && before.as_deref() == Some("master")
            && role.as_deref() != Some("master")
            && gained.is_none()
        {
            lost = Some(k);
        }
        if name != old && role.as_deref() == Some("master") && before.as_deref() != Some("master") {
            gained.get_or_insert(k);
        }
        let masters: Vec<&String> = labels
            .iter()
            .filter(|(_, r)| r.as_deref() == Some("master"))
            .map(|(n, _)| n)
            .collect();
        if masters.len() > 1 {
            env.fail(&format!(
                "two pods labelled master at once after {w:?}: {masters:?}"
            ));
        }
    }
    (lost, gained)
}

fn initial_labels() -> BTreeMap<String, Option<String>> {
    (0..3)
        .map(|i| {
            (
                pod(i),
                Some(if i == 0 { "master" } else { "replica" }.to_string()),
            )
        })
        .collect()
}

/// Every live server still reports itself a replica (nothing promoted yet).
#[track_caller]
fn assert_nothing_promoted(snap: &[ServerState], what: &str) {
    for s in snap {
        assert_ne!(
            s.role.as_deref(),
            Some("master"),
            "{what}: {} already reports role:master: {snap:?}",
            s.addr
        );
    }
}

/// `new` reports role:master with an empty dataset (promoted and flushed).
#[track_caller]
fn assert_promoted_and_flushed(snap: &[ServerState], new: SocketAddr, what: &str) {
    let s = role_in(snap, new).unwrap();
    assert_eq!(s.role.as_deref(), Some("master"), "{what}: {snap:?}");
    assert_eq!(s.dbsize, Some(0), "{what}: not flushed yet: {snap:?}");
}

/// The gating checks shared by every failover that completed: the old
/// master's pod lost the master label before any pod gained it, the new
/// master got the label and the slice only once it was promoted and
/// flushed, never two masters in routing. With `fenced`, the fence itself
/// reached the API (label removed, slice emptied) while nothing was
/// promoted; without it (a best-effort backend whose fence was superseded
/// while the API was down) the publication alone must keep the order.
#[track_caller]
fn check_gated_k8s_writes(env: &Env, old: usize, c: &Converged, fenced: bool) {
    let ws = writes(env);
    let new = env.index_of(c.master);
    let epoch = c.epoch.to_string();
    let (lost, gained) = replay_pod_labels(env, &ws, initial_labels(), &pod(old));
    let (Some(lost), Some(gained)) = (lost, gained) else {
        env.fail(&format!(
            "no label change seen: lost {lost:?}, gained {gained:?}"
        ));
    };
    assert!(
        lost < gained,
        "the new master's pod was labelled (write #{}) before the old one lost the label (write #{})",
        ws[gained].req.id,
        ws[lost].req.id
    );
    let fence = &ws[lost];
    if fenced {
        assert_eq!(
            fence.role(),
            Some(None),
            "the fence removes the label: {fence:?}"
        );
    }
    if fence.epoch().as_deref() != Some(epoch.as_str()) {
        env.fail(&format!(
            "the old master's pod lost the label at another epoch than {epoch}: {fence:?}"
        ));
    }
    let label = &ws[gained];
    assert_eq!(label.pod.as_deref(), Some(pod(new).as_str()), "{label:?}");
    assert_eq!(label.epoch().as_deref(), Some(epoch.as_str()));
    if env.seen.lock().unwrap().is_empty() {
        return;
    }
    if fenced {
        assert_nothing_promoted(
            fence.servers.as_ref().unwrap(),
            "when the old master's pod was fenced",
        );
    }
    // Every write that gives the master label, not only the first: at the
    // failover's epoch, the new master's pod; at an older one, the kept
    // master's again after an aborted attempt (the old pod).
    for w in ws
        .iter()
        .filter(|w| w.ok() && w.role() == Some(Some("master".into())))
    {
        let older = w
            .epoch()
            .and_then(|e| e.parse::<u64>().ok())
            .is_some_and(|e| e < c.epoch);
        if older {
            assert_eq!(w.pod.as_deref(), Some(pod(old).as_str()), "{w:?}");
            continue;
        }
        assert_eq!(w.pod.as_deref(), Some(pod(new).as_str()), "{w:?}");
        assert_promoted_and_flushed(
            w.servers.as_ref().unwrap(),
            c.master,
            &format!("when {} got role=master (request #{})", pod(new), w.req.id),
        );
    }

    // The slice: emptied by the fence, then exactly the new master.
    let slice_writes: Vec<&Write> = ws.iter().filter(|w| w.pod.is_none() && w.ok()).collect();
    let first_new = slice_writes
        .iter()
        .position(|w| w.addresses() == Some(vec![c.master.ip().to_string()]))
        .unwrap_or_else(|| env.fail("no slice write with the new master"));
    let emptied = slice_writes.iter().position(|w| {
        w.addresses() == Some(vec![]) && w.epoch().as_deref() == Some(epoch.as_str())
    });
    let emptied = match (fenced, emptied) {
        (true, Some(k)) => {
            assert!(
                k < first_new,
                "the slice got the new master before it was emptied"
            );
            assert_nothing_promoted(
                slice_writes[k].servers.as_ref().unwrap(),
                "when the slice was emptied",
            );
            k
        }
        (true, None) => env.fail("the slice was never emptied"),
        (false, _) => first_new,
    };
    for w in &slice_writes {
        let a = w.addresses().unwrap_or_default();
        assert!(a.len() <= 1, "a slice with two endpoints: {w:?}");
        if a == vec![c.master.ip().to_string()] {
            assert_promoted_and_flushed(
                w.servers.as_ref().unwrap(),
                c.master,
                &format!("when the slice got the new master (request #{})", w.req.id),
            );
        }
    }
    for w in &slice_writes[emptied..] {
        assert_ne!(
            w.addresses(),
            Some(vec![env.servers[old].ip()]),
            "the old master came back into the slice: {w:?}"
        );
    }
}

/// `ip:port` of the servers other than `master`, in picket's (address) order.
fn replicas_of(env: &Env, master: SocketAddr) -> Vec<String> {
    let mut r: Vec<Addr> = env
        .addrs()
        .into_iter()
        .filter(|a| *a != master)
        .map(|a| a.to_string().parse().unwrap())
        .collect();
    r.sort();
    r.iter().map(Addr::to_string).collect()
}

fn assert_rfc3339_utc(ts: &str) {
    let b = ts.as_bytes();
    assert!(
        ts.len() >= 20
            && ts.ends_with('Z')
            && b[4] == b'-'
            && b[7] == b'-'
            && b[10] == b'T'
            && b[13] == b':'
            && b[16] == b':',
        "not RFC 3339 UTC: {ts:?}"
    );
}

// ---------------------------------------------------------------------------
// Tests

#[test]
fn log_timestamps_parse() {
    let t = parse_utc("2026-12-01T03:29:23.723915Z").unwrap();
    let d = t.duration_since(UNIX_EPOCH).unwrap();
    assert_eq!(d.as_secs(), 1_796_095_763);
    assert_eq!(d.subsec_micros(), 723_915);
    assert_eq!(
        parse_utc("2000-03-01T00:00:00Z").unwrap(),
        UNIX_EPOCH + Duration::from_secs(951_868_800)
    );
    assert!(parse_utc("2026-12-01 03:29:23Z").is_none());
}

/// The whole path once: kill -9 of the master, and what all five backends
/// of all three daemons show afterwards, in which order, and when.
#[test]
fn failover_publishes_to_every_backend_in_gated_order() {
    let mut env = Env::start(Opts::default());
    let old = env.servers[0].addr();
    env.kill(0);
    let c = env.wait_converged(0, FAILOVER_WAIT);
    let new = env.index_of(c.master);
    assert_ne!(new, 0);
    let other = 3 - new;

    // Kubernetes: the gated order, then the final state.
    check_gated_k8s_writes(&env, 0, &c, true);
    env.wait_k8s_published(new, c.epoch);
    // The figure of issue 13: writes of three daemons publishing one outcome.
    let after: Vec<LoggedRequest> = env.requests();
    let patches = after.iter().filter(|r| r.method == "PATCH").count();
    let conflicts = after.iter().filter(|r| r.status == 409).count();
    eprintln!(
        "writes per failover (3 daemons, pod-labels + endpointslice): {patches} PATCH, \
         {conflicts} answered 409, {} POST",
        after.iter().filter(|r| r.method == "POST").count()
    );
    let web = env.fake.object(FakeKind::Pod, NS, "web-0").unwrap();
    assert_eq!(web["metadata"]["labels"]["role"], "master");
    assert!(web["metadata"]["annotations"].is_null(), "{web}");
    assert!(
        env.fake
            .requests()
            .iter()
            .all(|r| !r.path.ends_with("/web-0"))
    );

    // Only a replica that replicates from the new master is published: the
    // dead old master is not, the other replica once it follows the new
    // master (the epoch's publication is then made again with it).
    let replicas = vec![env.servers[other].addr().to_string()];
    assert!(!replicas_of(&env, c.master).is_empty());
    let reporter = |i: usize| if i == c.leader { "leader" } else { "observer" };
    let listed = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|r| r.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };

    // File: each daemon's own file, exactly, once the replica is linked.
    for (i, d) in env.daemons.iter().enumerate() {
        let read = || -> Value {
            let text = std::fs::read_to_string(&d.file)
                .unwrap_or_else(|e| panic!("{}: {e}", d.file.display()));
            serde_json::from_str(&text).unwrap()
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while listed(&read()["replicas"]) != replicas && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut doc = read();
        assert_rfc3339_utc(doc["updated_at"].as_str().unwrap());
        doc.as_object_mut().unwrap().remove("updated_at");
        assert_eq!(
            doc,
            json!({
                "group": GROUP,
                "epoch": c.epoch,
                "master": c.master.to_string(),
                "master_host": c.master.ip().to_string(),
                "master_port": c.master.port(),
                "replicas": replicas,
                "reporter": reporter(i),
            }),
            "file of {}",
            d.id
        );
    }

    // Exec: one run per daemon after its start-up run (a change of the
    // linked replicas alone runs nothing), Sentinel's arguments and
    // picket's variables; the replicas are those linked at that moment.
    for (i, d) in env.daemons.iter().enumerate() {
        let runs = env.exec_runs(i);
        assert_eq!(runs.len(), 1, "runs of {}: {runs:?}", d.id);
        let at_run = runs[0]
            .lines
            .iter()
            .find_map(|l| l.strip_prefix("PICKET_REPLICAS="))
            .unwrap_or_else(|| panic!("no PICKET_REPLICAS: {runs:?}"))
            .to_string();
        assert!(
            at_run.is_empty() || at_run == replicas.join(","),
            "exec of {}: PICKET_REPLICAS={at_run}",
            d.id
        );
        let expected: Vec<String> = [
            format!("arg={GROUP}"),
            format!("arg={}", reporter(i)),
            "arg=start".into(),
            format!("arg={}", old.ip()),
            format!("arg={}", old.port()),
            format!("arg={}", c.master.ip()),
            format!("arg={}", c.master.port()),
            format!("PICKET_GROUP={GROUP}"),
            format!("PICKET_EPOCH={}", c.epoch),
            "PICKET_EVENT=publish".into(),
            format!("PICKET_ROLE={}", reporter(i)),
            format!("PICKET_OLD_MASTER={old}"),
            format!("PICKET_NEW_MASTER={}", c.master),
            format!("PICKET_REPLICAS={at_run}"),
        ]
        .into();
        assert_eq!(runs[0].lines, expected, "exec run of {}", d.id);
    }

    // Webhook (after the start-up publications): the leader's fence (while
    // nothing was promoted), then one publication per daemon (after the
    // promotion and the flush). The backends are written side by side: a
    // daemon's file above may show the replica before its webhook
    // publication of it has arrived.
    let last_lists_replicas = |got: &[Received], id: &str| {
        got.iter()
            .rfind(|r| r.daemon == id && r.body["event"] == "publish")
            .is_some_and(|p| listed(&p.body["replicas"]) == replicas)
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while !env
        .daemons
        .iter()
        .all(|d| last_lists_replicas(&env.received(), &d.id))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let got = env.received();
    let leader_id = env.daemons[c.leader].id.clone();
    let fences: Vec<&Received> = got.iter().filter(|r| r.body["event"] == "fence").collect();
    assert_eq!(fences.len(), 1, "{got:#?}");
    assert_eq!(fences[0].daemon, leader_id);
    let mut fence_body = fences[0].body.clone();
    assert_rfc3339_utc(fence_body["timestamp"].as_str().unwrap());
    fence_body.as_object_mut().unwrap().remove("timestamp");
    assert_eq!(
        fence_body,
        json!({"group": GROUP, "epoch": c.epoch, "event": "fence", "reporter": "leader",
               "old_master": old.to_string(), "master": null, "replicas": []})
    );
    assert_nothing_promoted(
        fences[0].servers.as_ref().unwrap(),
        "when the webhook got the fence",
    );
    for (i, d) in env.daemons.iter().enumerate() {
        let publishes: Vec<&Received> = got
            .iter()
            .filter(|r| r.daemon == d.id && r.body["event"] == "publish")
            .collect();
        // The epoch's publication, and one more once the replica linked
        // if it was not yet: the same outcome, the replicas of the moment.
        assert!(
            (1..=2).contains(&publishes.len()),
            "publications from {}: {got:#?}",
            d.id
        );
        for (k, p) in publishes.iter().enumerate() {
            let mut body = p.body.clone();
            assert_rfc3339_utc(body["timestamp"].as_str().unwrap());
            body.as_object_mut().unwrap().remove("timestamp");
            let at = listed(&body["replicas"]);
            let last = k + 1 == publishes.len();
            assert!(
                at == replicas || (!last && at.is_empty()),
                "webhook publication {k} from {}: {body:#}",
                d.id
            );
            assert_eq!(
                body,
                json!({"group": GROUP, "epoch": c.epoch, "event": "publish", "reporter": reporter(i),
                       "old_master": old.to_string(), "master": c.master.to_string(),
                       "replicas": at}),
                "webhook publication from {}",
                d.id
            );
        }
        assert_promoted_and_flushed(
            publishes[0].servers.as_ref().unwrap(),
            c.master,
            &format!("when the webhook got the publication from {}", d.id),
        );
        // The fence gated the promotion: it came before every publication.
        assert!(fences[0].at <= publishes[0].at);
    }

    // Status: every backend of every daemon confirmed the new epoch.
    for g in &c.statuses {
        let names: Vec<&str> = g["discovery"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["name"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), 5, "{names:?}");
        assert!(
            names.contains(&"kubernetes:cache/pods app=cache"),
            "{names:?}"
        );
        assert!(
            names.contains(&"kubernetes:cache/endpointslice cache-picket"),
            "{names:?}"
        );
    }
}

/// Issue 27, found on a real API server: every daemon publishes each
/// epoch, the leader first and the others a rank step apart after it. The
/// others published the replicas linked to the new master as they were
/// when they adopted the config (none re-pointed yet), seconds later: the
/// replica pod the leader had labelled at that epoch meanwhile lost its
/// label, and got it back only at their re-publication (1.3 s without a
/// replica for a Service selecting `role=replica`). Once a pod is labelled
/// a replica at the failover's epoch, no write at that epoch takes the
/// label off while its server stays linked to the new master.
#[test]
fn a_linked_replica_keeps_its_label_through_every_daemons_publication() {
    let mut env = Env::start(Opts::default());
    env.kill(0);
    // Every backend of every daemon confirmed the new epoch: each daemon
    // has made its publication of it.
    let c = env.wait_converged(0, FAILOVER_WAIT);
    let new = env.index_of(c.master);
    let other = 3 - new;
    env.wait_k8s_published(new, c.epoch);
    assert!(
        replica_linked_to(&env.servers[other], c.master),
        "{} does not replicate from the new master",
        pod(other)
    );
    let epoch = c.epoch.to_string();
    let ws = writes(&env);
    // The pod's role label over the writes since the kill.
    let mut role = Some("replica".to_string());
    let mut labelled_at_epoch = false;
    let mut unlabelled_since: Option<Instant> = None;
    let mut gaps = Vec::new();
    for w in ws
        .iter()
        .filter(|w| w.ok() && w.pod.as_deref() == Some(&pod(other)))
    {
        let Some(r) = w.role() else {
            continue;
        };
        let at_epoch = w.epoch().as_deref() == Some(epoch.as_str());
        if at_epoch && labelled_at_epoch && r.as_deref() != Some("replica") {
            env.fail(&format!(
                "{} lost the replica label at epoch {epoch} after it was labelled a replica \
                 at that epoch, while it replicated from the new master: {w:?}",
                pod(other)
            ));
        }
        if r.as_deref() == Some("replica") {
            if let Some(since) = unlabelled_since.take() {
                gaps.push(w.req.at.saturating_duration_since(since));
            }
            labelled_at_epoch |= at_epoch;
        } else if role.as_deref() == Some("replica") {
            unlabelled_since = Some(w.req.at);
        }
        role = r;
    }
    assert!(labelled_at_epoch, "{} never labelled a replica", pod(other));
    eprintln!(
        "{} without the replica label after the kill: {gaps:?}",
        pod(other)
    );
}

/// Without any failover, every daemon publishes the current config once
/// after it starts (epoch 0, the configured master, reporter `observer`),
/// so that the Service selects the master from the start; a backend that
/// already holds a newer epoch refuses that publication and is not written.
#[test]
fn startup_publication_labels_the_master_before_any_failover() {
    {
        let env = Env::start(Opts::default());
        let master = env.servers[0].addr();
        // Env::start waited for the publication and checked every backend;
        // the essentials once more, explicitly.
        assert_eq!(env.pod_label(0, "role").as_deref(), Some("master"));
        assert_eq!(env.pod_label(1, "role").as_deref(), Some("replica"));
        assert_eq!(env.pod_label(2, "role").as_deref(), Some("replica"));
        // The pods were seeded without an epoch: this one is picket's.
        for i in 0..3 {
            assert_eq!(env.pod_epoch(i).as_deref(), Some("0"), "{}", pod(i));
        }
        env.wait_k8s_published(0, 0);
        for d in &env.daemons {
            let doc: Value =
                serde_json::from_str(&std::fs::read_to_string(&d.file).unwrap()).unwrap();
            assert_eq!(doc["epoch"], 0, "{}", d.id);
            assert_eq!(doc["master"], master.to_string(), "{}", d.id);
            assert_eq!(doc["reporter"], "observer", "{}", d.id);
        }
        // Every start-up write to the pods and the slice came while the
        // master reported role:master; no failover took place.
        let ws = writes_since(&env, 0);
        assert!(ws.iter().any(|w| w.ok() && w.pod.is_some()), "{ws:#?}");
        for w in &ws {
            assert_eq!(w.epoch().as_deref(), Some("0"), "{w:?}");
            if let Some(snap) = &w.servers {
                let s = role_in(snap, master).unwrap();
                assert_eq!(s.role.as_deref(), Some("master"), "{w:?}");
            }
            if w.ok() && w.role() == Some(Some("master".into())) {
                assert_eq!(w.pod.as_deref(), Some(pod(0).as_str()), "{w:?}");
            }
            if let Some(a) = w.addresses() {
                assert!(a.is_empty() || a == vec![env.servers[0].ip()], "{w:?}");
            }
        }
        assert_eq!(env.poller.changes().len(), 0, "{:?}", env.poller.changes());
        for g in env.groups() {
            let g = g.unwrap();
            assert_eq!(g["config_epoch"], 0, "{g:#}");
            assert!(g["last_failover"].is_null(), "{g:#}");
            // The pod-labels backend skips the Service gate (no Service
            // here): said in the status, and only for that backend.
            for b in g["discovery"].as_array().unwrap() {
                if b["name"] == "kubernetes:cache/pods app=cache" {
                    let w = b["warning"].as_str().unwrap_or_default();
                    assert!(
                        w.contains("skip_service_gate") && w.contains("old master"),
                        "{b}"
                    );
                } else {
                    assert!(b.get("warning").is_none(), "{b}");
                }
            }
        }
        // ... in the metrics ...
        for i in 0..3 {
            let text = env.metrics(i).unwrap();
            let line = text
                .lines()
                .find(|l| l.starts_with("picket_discovery_gate_skipped{"))
                .unwrap_or_else(|| panic!("no picket_discovery_gate_skipped:\n{text}"));
            assert_eq!(line, "picket_discovery_gate_skipped{group=\"cache\"} 1");
        }
        // ... and in the log of each daemon.
        let logs = env.logs();
        assert_eq!(
            logs.matches("skip_service_gate: the fence is confirmed as soon as")
                .count(),
            3,
            "{logs}"
        );
    }
    // The slice and the files already hold a newer epoch: the start-up
    // publication labels the pods but leaves the slice and the files alone.
    let env = Env::start(Opts {
        newer: Newer {
            slice: true,
            files: true,
            ..Newer::default()
        },
        ..Opts::default()
    });
    assert!(!env.k8s_published(0, 0));
    assert_eq!(env.pod_label(0, "role").as_deref(), Some("master"));
    assert_eq!(env.pod_epoch(0).as_deref(), Some("0"));
    let slice_path = format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices");
    let slice_writes: Vec<LoggedRequest> = env
        .fake
        .writes()
        .into_iter()
        .filter(|r| r.path.starts_with(&slice_path))
        .collect();
    assert!(slice_writes.is_empty(), "{slice_writes:#?}");
    assert_eq!(
        env.slice()["metadata"]["annotations"][EPOCH_ANNOTATION],
        NEWER_EPOCH.to_string()
    );
    for (d, g) in env.daemons.iter().zip(env.groups()) {
        assert_eq!(std::fs::read_to_string(&d.file).unwrap(), newer_file());
        let g = g.unwrap();
        for b in g["discovery"].as_array().unwrap() {
            if b["kind"] == "file" || b["name"] == "kubernetes:cache/endpointslice cache-picket" {
                assert_eq!(b["last_result"], "stale", "{b}");
                let err = b["last_error"].as_str().unwrap();
                assert!(
                    err.contains(&format!(
                        "holds epoch {NEWER_EPOCH}, this write has epoch 0"
                    )),
                    "{err}"
                );
            }
        }
    }
}

/// A backend that holds a newer epoch than the failover's refuses the
/// start-up publication, the fence and the failover's publication; with
/// best-effort backends the failover still completes, and nothing in the
/// backends changes.
#[test]
fn newer_epoch_in_best_effort_backends_refuses_every_write() {
    // As if a newer failover (epoch 1000) had been published by daemons we
    // do not know about, before these daemons started: their start-up
    // publication was refused too (Env::start checks that it wrote nothing).
    let mut env = Env::start(Opts {
        k8s_required: false,
        webhook_required: false,
        newer: Newer {
            pods: true,
            slice: true,
            files: true,
        },
        ..Opts::default()
    });
    let newer = newer_file();
    let pods_before: Vec<Value> = (0..3)
        .map(|i| env.fake.object(FakeKind::Pod, NS, &pod(i)).unwrap())
        .collect();
    let slice_before = env.slice();
    let mtimes: Vec<SystemTime> = env
        .daemons
        .iter()
        .map(|d| std::fs::metadata(&d.file).unwrap().modified().unwrap())
        .collect();

    env.kill(0);
    // The failover completes (nothing here is required but the exec and
    // webhook backends, which accept); the stale backends answer `stale`.
    let gs = env.wait_statuses(
        "a completed failover with stale backends",
        FAILOVER_WAIT,
        |gs| {
            settled_epoch(gs, 0, |b, epoch| {
                !(b["kind"] == "kubernetes" || b["kind"] == "file")
                    || (b["last_result"] == "stale" && b["last_epoch"] == epoch)
            })
            .is_some()
        },
    );
    let epoch = gs[0]["config_epoch"].as_u64().unwrap();
    assert!(epoch < 1000);
    for g in &gs {
        for b in g["discovery"].as_array().unwrap() {
            if b["kind"] == "kubernetes" || b["kind"] == "file" {
                assert_eq!(b["retrying"], false, "a stale answer is final: {b}");
                let err = b["last_error"].as_str().unwrap();
                assert!(
                    err.contains(&format!("holds epoch 1000, this write has epoch {epoch}")),
                    "{err}"
                );
            }
        }
    }
    // Nothing was written, neither at start-up nor in the failover: no
    // write request at all, objects and files unchanged.
    let w = env.fake.writes();
    assert!(w.is_empty(), "writes despite a newer epoch: {w:#?}");
    for (i, before) in pods_before.iter().enumerate() {
        assert_eq!(
            &env.fake.object(FakeKind::Pod, NS, &pod(i)).unwrap(),
            before
        );
    }
    assert_eq!(env.slice(), slice_before);
    for (d, mtime) in env.daemons.iter().zip(&mtimes) {
        assert_eq!(std::fs::read_to_string(&d.file).unwrap(), newer);
        assert_eq!(
            std::fs::metadata(&d.file).unwrap().modified().unwrap(),
            *mtime
        );
    }
}

/// A daemon frozen (SIGSTOP) through a whole failover still holds the old
/// configuration (epoch 0, the dead master) when it resumes: it must adopt
/// the newer one and never write its own older view over the newer one.
/// It is frozen only after its start-up publication (epoch 0) landed, as a
/// daemon that stalls in the middle of its life would be.
#[test]
fn a_daemon_resuming_with_an_older_epoch_does_not_overwrite_anything() {
    let mut env = Env::start(Opts::default());
    let old = env.servers[0].addr();
    let frozen = 2;
    let startup_file = std::fs::read_to_string(&env.daemons[frozen].file).unwrap();
    env.daemons[frozen].proc.sigstop();
    env.kill(0);
    // The two others fail over (2 of 3 is both the quorum and a majority).
    let gs = env.wait_statuses_of(
        &[0, 1],
        "a failover by the two running daemons",
        FAILOVER_WAIT,
        |gs| {
            settled_epoch(gs, 0, |b, epoch| {
                b["last_epoch"] == epoch && b["last_result"] == "ok"
            })
            .is_some()
        },
    );
    let epoch = gs[0]["config_epoch"].as_u64().unwrap();
    let master: SocketAddr = gs[0]["master"].as_str().unwrap().parse().unwrap();
    let new = env.index_of(master);
    env.wait_k8s_published(new, epoch);
    assert_eq!(
        std::fs::read_to_string(&env.daemons[frozen].file).unwrap(),
        startup_file,
        "the frozen daemon's file changed while it was frozen"
    );

    let resumed = SystemTime::now();
    let resumed_at_request = env.fake.requests().iter().map(|r| r.id).max().unwrap_or(0);
    let resumed_at_hook = env.webhook.received().len();
    env.daemons[frozen].proc.sigcont();
    let c = env.wait_converged(0, FAILOVER_WAIT);
    assert_eq!((c.epoch, c.master), (epoch, master));
    assert_ne!(c.leader, frozen);
    let g = &c.statuses[frozen];
    assert_eq!(g["last_failover"]["outcome"], "observed", "{g:#}");
    check_gated_k8s_writes(&env, 0, &c, true);

    // Since the start-up publication, nothing was written with another
    // epoch than the failover's (in particular nothing at epoch 0 after
    // the resume), and the Kubernetes objects still show the new master.
    let e = epoch.to_string();
    for w in writes(&env).iter().filter(|w| w.ok()) {
        assert_eq!(w.epoch().as_deref(), Some(e.as_str()), "{w:?}");
    }
    assert!(
        writes_since(&env, resumed_at_request)
            .iter()
            .all(|w| w.epoch().as_deref() == Some(e.as_str())),
        "a write after the resume without the failover's epoch: {:#?}",
        writes_since(&env, resumed_at_request)
    );
    env.wait_k8s_published(new, epoch);
    // The resumed daemon published the newer configuration as an observer,
    // over its own start-up file.
    let d = &env.daemons[frozen];
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&d.file).unwrap()).unwrap();
    assert_eq!(doc["epoch"], epoch);
    assert_eq!(doc["master"], master.to_string());
    assert_eq!(doc["reporter"], "observer");
    let runs = env.exec_runs(frozen);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert!(runs[0].at >= resumed);
    assert!(
        runs[0].lines.contains(&"arg=observer".to_string()),
        "{runs:?}"
    );
    assert!(
        runs[0].lines.contains(&format!("PICKET_OLD_MASTER={old}")),
        "{runs:?}"
    );
    assert!(
        runs[0].lines.contains(&format!("PICKET_EPOCH={epoch}")),
        "{runs:?}"
    );
    assert!(
        runs[0]
            .lines
            .contains(&format!("PICKET_NEW_MASTER={master}")),
        "{runs:?}"
    );
    let from_frozen: Vec<Received> = env
        .received()
        .into_iter()
        .filter(|r| r.daemon == d.id)
        .collect();
    // One publication, and a re-publication if the replicas it names
    // linked to the new master only after the first (a loaded machine:
    // the first named none); each says the same of the master.
    assert!((1..=2).contains(&from_frozen.len()), "{from_frozen:#?}");
    for r in &from_frozen {
        assert_eq!(r.body["epoch"], epoch, "{from_frozen:#?}");
        assert_eq!(r.body["reporter"], "observer", "{from_frozen:#?}");
        assert_eq!(r.body["master"], master.to_string(), "{from_frozen:#?}");
    }
    // Everything any daemon sent to the webhook after the resume carries
    // the failover's epoch, and nothing ever named the old master as the
    // master at a higher epoch than the start-up's.
    let all = env.webhook.received();
    for r in &all[resumed_at_hook.min(all.len())..] {
        assert_eq!(r.body["epoch"], epoch, "after the resume: {r:#?}");
    }
    for r in all.iter().filter(|r| r.body["epoch"] != 0) {
        assert_ne!(r.body["master"], old.to_string(), "{r:#?}");
    }
    for (i, d) in env.daemons.iter().enumerate() {
        for run in exec_runs(&d.exec_dir) {
            if !run.lines.contains(&"PICKET_EPOCH=0".to_string()) {
                assert!(
                    !run.lines.contains(&format!("PICKET_NEW_MASTER={old}")),
                    "daemon {i} named the old master at a higher epoch: {run:?}"
                );
            }
        }
    }
}

/// A required backend that holds a newer epoch refuses the start-up
/// publication (Env::start checks that nothing was written to the slice)
/// and the fence: the failover stands down before promoting anything.
#[test]
fn newer_epoch_in_a_required_backend_stops_the_failover_before_promotion() {
    let mut env = Env::start(Opts {
        newer: Newer {
            slice: true,
            ..Newer::default()
        },
        ..Opts::default()
    });
    let slice_before = env.slice();
    let since = SystemTime::now();
    env.kill(0);
    let leader = &env.wait_aborted(
        "an aborted failover",
        "aborted: fencing the old master failed",
    );
    let outcome = leader["last_failover"]["outcome"].as_str().unwrap();
    assert!(outcome.contains("holds epoch 1000"), "{outcome}");
    let slice_status = leader["discovery"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "kubernetes:cache/endpointslice cache-picket")
        .unwrap();
    assert_eq!(slice_status["last_result"], "stale", "{slice_status}");
    // Nothing promoted, the slice untouched.
    for s in &env.servers[1..] {
        assert_eq!(
            s.info_field("replication", "role").as_deref(),
            Some("slave")
        );
    }
    assert!(
        env.poller
            .changes()
            .iter()
            .all(|c| c.to != "master" || c.after < since),
        "{:?}",
        env.poller.changes()
    );
    assert_eq!(env.slice(), slice_before);
    assert_eq!(
        env.slice()["metadata"]["annotations"][EPOCH_ANNOTATION],
        NEWER_EPOCH.to_string()
    );
    // Not at start-up, not in the failover.
    assert!(
        writes_since(&env, 0)
            .iter()
            .all(|w| w.pod.is_some() || !w.ok()),
        "the slice was written: {:#?}",
        writes_since(&env, 0)
    );
}

/// The config epoch every status in `gs` holds, when it is above `after`,
/// no failover is running and every backend of every status passes
/// `backend_ok` at that epoch.
fn settled_epoch(
    gs: &[Value],
    after: u64,
    backend_ok: impl Fn(&Value, u64) -> bool,
) -> Option<u64> {
    let epoch = gs.first()?["config_epoch"].as_u64()?;
    let settled = epoch > after
        && gs.iter().all(|g| {
            g["config_epoch"] == epoch
                && g["failover"].is_null()
                && g["discovery"]
                    .as_array()
                    .is_some_and(|bs| bs.iter().all(|b| backend_ok(b, epoch)))
        });
    settled.then_some(epoch)
}

/// Runs one failover with a fault armed on the fake just before the kill,
/// and checks that it completed in gated order anyway.
fn failover_through(arm: impl Fn(&FakeKube)) -> (Env, Converged) {
    let mut env = Env::start(Opts::default());
    // Env::start waited for the start-up publication: the faults hit the
    // failover's requests.
    arm(&env.fake);
    env.kill(0);
    let c = env.wait_converged(0, FAILOVER_WAIT);
    check_gated_k8s_writes(&env, 0, &c, true);
    let new = env.index_of(c.master);
    env.wait_k8s_published(new, c.epoch);
    (env, c)
}

/// Requests answered `code` after the start-up publication.
fn count_status(env: &Env, code: u16) -> usize {
    env.requests().iter().filter(|r| r.status == code).count()
}

#[test]
fn conflict_storm_during_a_failover() {
    // More conflicts than one write's five attempts: the runner retries too.
    let (env, _) = failover_through(|f| f.conflict_next_writes(8));
    assert_eq!(env.fake.faults_left(), (0, 0, 0));
    // Daemons publishing at the same moment may add real conflicts.
    assert!(count_status(&env, 409) >= 8);
}

#[test]
fn server_error_storm_during_a_failover() {
    let (env, _) = failover_through(|f| f.fail_next(6, 503));
    assert_eq!(env.fake.faults_left(), (0, 0, 0));
    assert_eq!(count_status(&env, 503), 6);
}

#[test]
fn throttling_storm_during_a_failover() {
    let (env, _) = failover_through(|f| f.throttle_next(3, 1));
    assert_eq!(env.fake.faults_left(), (0, 0, 0));
    assert_eq!(count_status(&env, 429), 3);
}

/// A daemon's group status: its last failover aborted (`outcome` starts
/// the reason) and, after it, every Kubernetes entry's last write was the
/// kept master's publication, with `result`.
fn republished_after_abort(g: &Value, outcome: &str, result: &str) -> bool {
    g["last_failover"]["outcome"]
        .as_str()
        .is_some_and(|o| o.starts_with(outcome))
        && g["discovery"].as_array().is_some_and(|bs| {
            bs.iter()
                .filter(|b| b["kind"] == "kubernetes")
                .all(|b| b["last_op"] == "publish" && b["last_result"] == result)
        })
}

/// A rejected credential is a permanent error: the fence fails at once, the
/// failover is aborted without promoting, and /v1/status says why. Once the
/// token file holds a valid token, the next attempt goes through.
#[test]
fn unauthorized_fence_aborts_with_a_clear_status_then_recovers() {
    let mut env = Env::start(Opts {
        token: "expired-token".into(),
        failover_timeout: "3s",
        ..Opts::default()
    });
    env.kill(0);
    env.wait_aborted(
        "a failover aborted by a 401",
        "aborted: fencing the old master failed",
    );
    // The aborted failover routes the backends to the master the group
    // keeps again, at the fence's epoch: that publication meets the same
    // 401, and the status says so.
    let republished = |g: &Value| {
        republished_after_abort(g, "aborted: fencing the old master failed", "permanent")
    };
    let leader = &env
        .wait_statuses(
            "the kept master published again after the abort",
            FAILOVER_WAIT,
            |gs| gs.iter().any(republished),
        )
        .into_iter()
        .find(republished)
        .unwrap_or_else(|| env.fail("no daemon published the kept master again"));
    for b in leader["discovery"].as_array().unwrap() {
        if b["kind"] != "kubernetes" {
            continue;
        }
        assert_eq!(b["last_op"], "publish", "{b}");
        assert_eq!(b["last_result"], "permanent", "{b}");
        assert_eq!(b["retrying"], false, "{b}");
        let err = b["last_error"].as_str().unwrap();
        assert!(
            err.starts_with("permanent: ")
                && err.contains(&format!("401 Unauthorized from {}/", env.fake.url()))
                && err.contains("check the token"),
            "{err}"
        );
        assert!(!err.contains("expired-token"), "the token leaked: {err}");
        eprintln!("status last_error after a 401: {err}");
    }
    for s in &env.servers[1..] {
        assert_eq!(
            s.info_field("replication", "role").as_deref(),
            Some("slave")
        );
    }
    assert!(
        env.fake.requests().iter().all(|r| r.status == 401),
        "only 401s so far, the start-up publication's included"
    );

    // Rotate the token: the next attempt re-reads it after its first 401.
    let fixed = SystemTime::now();
    std::fs::write(env.dir.path().join("token"), format!("{DEFAULT_TOKEN}\n")).unwrap();
    let c = env.wait_converged(0, FAILOVER_WAIT);
    let promoted = env
        .poller
        .became_master(c.master, fixed)
        .unwrap_or_else(|| {
            env.fail("the new master's promotion was not seen after the token was fixed")
        });
    assert!(
        promoted.before >= fixed,
        "promoted before the token was fixed: {promoted:?}"
    );
    assert!(
        env.poller
            .changes()
            .iter()
            .all(|c| c.to != "master" || c.after >= fixed)
    );
    let new = env.index_of(c.master);
    env.wait_k8s_published(new, c.epoch);
    check_gated_k8s_writes(&env, 0, &c, true);
}

/// The API server is down during the failover and the Kubernetes backends
/// are required: the fence cannot be confirmed, nothing is promoted, the
/// failover is aborted at failover_timeout; once the API is back, the next
/// attempt completes.
#[test]
fn api_down_with_required_backends_blocks_the_promotion() {
    let mut env = Env::start(Opts {
        failover_timeout: "4s",
        ..Opts::default()
    });
    env.fake.set_down(true);
    env.kill(0);
    let leader = &env.wait_aborted(
        "a failover aborted at failover_timeout",
        "aborted: fencing the old master",
    );
    let took = leader["last_failover"]["duration_ms"].as_u64().unwrap();
    assert!(
        (4000..6000).contains(&took),
        "aborted after {took} ms: {leader:#}"
    );
    eprintln!("with the API down, the failover was aborted after {took} ms");
    // The aborted failover routes the backends to the kept master again,
    // at the fence's epoch; with the API down, that write is retried.
    env.wait_statuses(
        "the kept master's publication retried after the abort",
        FAILOVER_WAIT,
        |gs| {
            gs.iter()
                .any(|g| republished_after_abort(g, "aborted: fencing the old master", "transient"))
        },
    );
    for s in &env.servers[1..] {
        assert_eq!(
            s.info_field("replication", "role").as_deref(),
            Some("slave")
        );
    }
    assert!(
        env.poller.changes().iter().all(|c| c.to != "master"),
        "{:?}",
        env.poller.changes()
    );
    assert!(
        env.requests().is_empty(),
        "the API was down: {:#?}",
        env.requests()
    );
    // The old master is still labelled: nothing could be fenced, and
    // nothing was promoted, so there is still at most one master.
    assert_eq!(env.pod_label(0, "role").as_deref(), Some("master"));

    let up = SystemTime::now();
    env.fake.set_down(false);
    let c = env.wait_converged(0, FAILOVER_WAIT);
    let promoted = env
        .poller
        .became_master(c.master, up)
        .unwrap_or_else(|| env.fail("no promotion seen after the API came back"));
    assert!(
        promoted.before >= up,
        "promoted while the API was down: {promoted:?}"
    );
    check_gated_k8s_writes(&env, 0, &c, true);
    env.wait_k8s_published(env.index_of(c.master), c.epoch);
}

/// The API server is down during the failover and the Kubernetes backends
/// are best-effort: the failover completes without them, they keep
/// retrying, and they converge once the API is back.
#[test]
fn api_down_with_best_effort_backends_converges_when_it_returns() {
    let mut env = Env::start(Opts {
        k8s_required: false,
        failover_timeout: "4s",
        ..Opts::default()
    });
    env.fake.set_down(true);
    let killed = env.kill(0);
    let gs = env.wait_statuses(
        "a failover completed without Kubernetes",
        FAILOVER_WAIT,
        |gs| {
            settled_epoch(gs, 0, |_, _| true).is_some()
                && gs
                    .iter()
                    .any(|g| g["last_failover"]["outcome"] == "completed")
        },
    );
    let epoch = gs[0]["config_epoch"].as_u64().unwrap();
    let master: SocketAddr = gs[0]["master"].as_str().unwrap().parse().unwrap();
    let promoted = env.poller.became_master(master, killed).unwrap();
    // Kubernetes still shows the old state (the start-up publication's)
    // and the backends keep retrying.
    assert!(env.requests().is_empty(), "{:#?}", env.requests());
    assert_eq!(env.pod_label(0, "role").as_deref(), Some("master"));
    // One attempt lasts the client's retry budget (10 s) against a closed port.
    env.wait_statuses(
        "the Kubernetes backends retrying",
        Duration::from_secs(30),
        |gs| {
            gs.iter().all(|g| {
                g["discovery"].as_array().is_some_and(|bs| {
                    bs.iter()
                        .filter(|b| b["kind"] == "kubernetes")
                        .all(|b| b["last_result"] == "transient" && b["retrying"] == true)
                })
            })
        },
    );

    let up = SystemTime::now();
    assert!(promoted.after <= up);
    env.fake.set_down(false);
    let c = env.wait_converged(0, Duration::from_secs(30));
    assert_eq!(c.epoch, epoch);
    let converged = SystemTime::now();
    check_gated_k8s_writes(&env, 0, &c, false);
    env.wait_k8s_published(env.index_of(master), epoch);
    eprintln!(
        "best-effort Kubernetes backends converged {:.0} ms after the API came back",
        ms_between(up, converged)
    );
}

// ---------------------------------------------------------------------------
// Measurement

/// The time from the promotion to each backend's write, over several
/// failovers. Prints a table and the medians.
#[test]
#[ignore = "measurement: run with --ignored --nocapture"]
fn publication_latency_after_promotion() {
    let rounds: usize = std::env::var("PICKET_E2E_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let mut env = Env::start(Opts {
        snapshots: false,
        flush_on_failover: false,
        ..Opts::default()
    });
    let names = ["pod-labels", "endpointslice", "file", "webhook", "exec"];
    let mut rows: Vec<[f64; 5]> = Vec::new();
    let mut detect: Vec<f64> = Vec::new();
    let mut master = 0usize;
    let mut epoch = 0u64;
    for round in 0..rounds {
        let killed = env.kill(master);
        let c = env.wait_converged(epoch, FAILOVER_WAIT);
        let new = env.index_of(c.master);
        let polled = env
            .poller
            .became_master(c.master, killed)
            .unwrap_or_else(|| env.fail("promotion not seen"));
        // Two brackets of the promotion: the poller's (last role:slave,
        // first role:master) and the leader's log (`promoting` just before
        // REPLICAOF NO ONE is sent, `+promoted-slave` once it answered and
        // INFO confirmed); the promotion lies in both.
        let leader = &env.daemons[c.leader];
        let logs = leader.proc.logs();
        let sending = log_times(
            &logs,
            &format!("promoting group={GROUP} candidate={}", c.master),
        )
        .into_iter()
        .rfind(|t| *t >= killed)
        .unwrap_or_else(|| env.fail("no `promoting` line in the leader's log"));
        let confirmed = log_times(&logs, &format!("+promoted-slave slave {}", c.master))
            .into_iter()
            .find(|t| *t >= sending)
            .unwrap_or_else(|| env.fail("no `+promoted-slave` line in the leader's log"));
        let promoted = RoleChange {
            addr: c.master,
            to: "master".into(),
            before: polled.before.max(sending),
            after: polled.after.min(confirmed),
        };
        assert!(
            promoted.before <= promoted.after,
            "the poller ({polled:?}) and the log ({sending:?}..{confirmed:?}) disagree"
        );
        let t_prom = promoted.estimate();
        let e = c.epoch.to_string();
        let clock = env.clock;
        let ws = writes(&env);
        let pod_write = ws
            .iter()
            .find(|w| {
                w.ok()
                    && w.pod.as_deref() == Some(pod(new).as_str())
                    && w.role() == Some(Some("master".into()))
                    && w.epoch().as_deref() == Some(e.as_str())
            })
            .unwrap_or_else(|| env.fail("no master label write"));
        let slice_write = ws
            .iter()
            .find(|w| {
                w.ok()
                    && w.pod.is_none()
                    && w.addresses() == Some(vec![c.master.ip().to_string()])
                    && w.epoch().as_deref() == Some(e.as_str())
            })
            .unwrap_or_else(|| env.fail("no slice write"));
        let file_doc: Value =
            serde_json::from_str(&std::fs::read_to_string(&leader.file).unwrap()).unwrap();
        assert_eq!(file_doc["epoch"], c.epoch);
        assert_eq!(file_doc["reporter"], "leader");
        let file_at = std::fs::metadata(&leader.file).unwrap().modified().unwrap();
        let hook_at = env
            .webhook
            .received()
            .into_iter()
            .find(|r| {
                r.daemon == leader.id && r.body["event"] == "publish" && r.body["epoch"] == c.epoch
            })
            .unwrap()
            .at;
        let exec_at = exec_runs(&leader.exec_dir)
            .into_iter()
            .find(|r| r.lines.contains(&format!("PICKET_EPOCH={}", c.epoch)))
            .unwrap()
            .at;
        let row = [
            ms_between(t_prom, clock.wall(pod_write.req.at)),
            ms_between(t_prom, clock.wall(slice_write.req.at)),
            ms_between(t_prom, file_at),
            ms_between(t_prom, hook_at),
            ms_between(t_prom, exec_at),
        ];
        let uncertainty = ms_between(promoted.before, promoted.after) / 2.0;
        detect.push(ms_between(killed, t_prom));
        eprintln!(
            "round {round}: epoch {} {} -> {} (leader {}), kill->promotion {:.0} ms, \
             promotion ±{uncertainty:.1} ms; {}",
            c.epoch,
            env.servers[master].addr(),
            c.master,
            leader.id,
            detect.last().unwrap(),
            names
                .iter()
                .zip(row)
                .map(|(n, v)| format!("{n} {v:.1} ms"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        rows.push(row);

        // Bring the killed server back (picket turns it into a replica)
        // and wait until the group is whole again.
        env.servers[master].restart();
        let m = c.master;
        let servers = &env.servers;
        wait_for(
            "all replicas linked to the new master",
            Duration::from_secs(30),
            || {
                servers
                    .iter()
                    .filter(|s| s.addr() != m)
                    .all(|s| replica_linked_to(s, m))
            },
        );
        env.wait_healthy(m, c.epoch, Duration::from_secs(30));
        master = new;
        epoch = c.epoch;
    }
    eprintln!("\nmedian over {rounds} failovers, from the promotion (ms):");
    for (k, n) in names.iter().enumerate() {
        let col: Vec<f64> = rows.iter().map(|r| r[k]).collect();
        let min = col.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = col.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        eprintln!(
            "  {n:<14} median {:>6.1}  min {min:>6.1}  max {max:>6.1}",
            median(&col)
        );
        assert!(min > -10.0, "{n} written before the promotion: {col:?}");
    }
    eprintln!("  kill -9 -> promotion median {:.0} ms", median(&detect));
}

//! A fake Kubernetes API server for picket's tests, faithful where picket
//! depends on the real one:
//!
//! - HTTPS with its own CA; bearer-token auth (401 `Unauthorized` Status for
//!   a missing or wrong token, 403 `Forbidden` for a token marked
//!   forbidden, or for one verb on one resource as RBAC answers a Role
//!   without it) and client-certificate auth verified against its CA;
//! - pods: list (with `labelSelector`: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
//!   `a notin (x)`, `a`, `!a`), get, patch, delete, and watch (`?watch=1`,
//!   see below);
//! - `discovery.k8s.io/v1` EndpointSlices: list, get, create (409
//!   `AlreadyExists`), patch;
//! - patches: merge (`application/merge-patch+json`), the only kind
//!   picket sends (another media type is 415, as the real server answers
//!   one it does not know; picket sends no PUT or JSON patch);
//! - a resourceVersion bumped on every write (one revision for the whole
//!   store, as etcd's); every write is an event in a bounded log (the last
//!   [`EVENT_LOG_LEN`]), which watches are served from; a stale
//!   `metadata.resourceVersion` in a patch body gives 409 `Conflict`;
//!   `addressType` of a slice is immutable (422);
//! - EndpointSlice validation as the real API server's: an address of an
//!   IPv4/IPv6 slice that is of the other family, a host name, loopback,
//!   link-local, link-local multicast or unspecified is refused with the
//!   real 422 `Invalid` Status (`details.causes` with the field path, e.g.
//!   `endpoints[0].addresses[0]`, and the apiserver's message); empty
//!   `endpoints`/`ports` read back as `null` and missing conditions as
//!   `{}`, as the real server returns them;
//! - faults: latency, slow requests, 429 with `Retry-After`, 5xx for the next
//!   N requests, "another writer" touching an object just before the next
//!   writes (so a conditional write meets a real 409), 200 answers whose
//!   body is garbage (truncated JSON, HTML, JSON of the wrong shape);
//! - the endpoint-slice controller, for Services added with
//!   [`FakeKube::add_service`]: their EndpointSlice follows the selected
//!   pods' labels, IPs and readiness after a configurable lag, or not at
//!   all while "stuck"; every change is recorded with its time;
//! - watches as kube-apiserver 1.28 serves them from its watch cache:
//!   HTTP 200, `Content-Type: application/json`, a chunked body of
//!   newline-terminated `{"type":...,"object":...}` events; with
//!   `resourceVersion` unset or `0` synthetic `ADDED` events for what exists
//!   first; events after `resourceVersion=R` in order, a change into or out
//!   of the `labelSelector` as `ADDED`/`DELETED`; `BOOKMARK`s every
//!   [`FakeKube::set_bookmark_period`] with `allowWatchBookmarks=true`; one
//!   `ERROR` event (410 `Expired` Status) for an `R` older than the log (see
//!   [`FakeKube::compact`]) and the end; the end after `timeoutSeconds`
//!   (default 300, at most [`MAX_WATCH_TIMEOUT`]), when the fake goes down
//!   or is dropped (the body ends cleanly); EndpointSlices can be watched
//!   the same way;
//! - a request log (method, path, query, content type, body, status, time;
//!   a watch shows as it starts);
//! - a hook run on every request as it arrives, before it is answered (a
//!   test can look at the world at the exact moment of a write);
//! - "down": the port is closed (connections refused) and open
//!   connections are cut, until it is brought up again on the same port.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;

/// The token every fake accepts unless told otherwise.
pub const DEFAULT_TOKEN: &str = "test-token";

/// How many events the fake keeps for watches to start from (older ones
/// are dropped, as a watch cache's window slides).
pub const EVENT_LOG_LEN: usize = 10_000;

/// The longest a watch lasts (`timeoutSeconds` is capped to it; the real
/// server's default is 300 s, i.e. 5 minutes, or more).
pub const MAX_WATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// Where an object lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FakeKind {
    /// v1 Pod.
    Pod,
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice,
}

impl FakeKind {
    fn list_kind(self) -> (&'static str, &'static str) {
        match self {
            FakeKind::Pod => ("PodList", "v1"),
            FakeKind::EndpointSlice => ("EndpointSliceList", "discovery.k8s.io/v1"),
        }
    }
    fn kind(self) -> (&'static str, &'static str) {
        match self {
            FakeKind::Pod => ("Pod", "v1"),
            FakeKind::EndpointSlice => ("EndpointSlice", "discovery.k8s.io/v1"),
        }
    }
    fn resource(self) -> &'static str {
        match self {
            FakeKind::Pod => "pods",
            FakeKind::EndpointSlice => "endpointslices.discovery.k8s.io",
        }
    }
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct LoggedRequest {
    /// Sequence number.
    pub id: u64,
    /// HTTP method.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Raw query string, if any.
    pub query: Option<String>,
    /// Content-Type header, if any.
    pub content_type: Option<String>,
    /// User-Agent header, if any.
    pub user_agent: Option<String>,
    /// The body as text.
    pub body: String,
    /// The status the fake answered; 0 while unanswered (or when the
    /// client gave up before the answer).
    pub status: u16,
    /// When the request arrived.
    pub at: Instant,
}

impl LoggedRequest {
    /// The body parsed as JSON (Null when empty or invalid).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
    /// Whether this is a write (not a GET).
    pub fn is_write(&self) -> bool {
        self.method != "GET"
    }
    /// Whether this is a watch (a GET with `watch=1` or `watch=true`).
    pub fn is_watch(&self) -> bool {
        self.method == "GET" && is_watch_query(self.query.as_deref())
    }
    /// Whether this is a LIST or WATCH of pods (a GET of
    /// `/api/v1/namespaces/{ns}/pods`).
    fn is_pod_collection(&self) -> bool {
        self.method == "GET"
            && matches!(
                self.path
                    .trim_matches('/')
                    .split('/')
                    .collect::<Vec<_>>()
                    .as_slice(),
                ["api", "v1", "namespaces", _, "pods"]
            )
    }
}

/// `watch=1`, `watch=true` (Go's `strconv.ParseBool` spellings).
fn is_watch_query(query: Option<&str>) -> bool {
    query_param(query, "watch").is_some_and(|v| parse_bool(&v))
}

fn parse_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// A function run on every request as it arrives, before it is answered.
pub type RequestHook = Arc<dyn Fn(&LoggedRequest) + Send + Sync>;

#[derive(Default)]
struct State {
    objects: BTreeMap<(FakeKind, String, String), Value>,
    revision: u64,
    tokens: HashSet<String>,
    forbidden: HashSet<String>,
    /// (token, verb, resource) a Role does not grant.
    denied: HashSet<(String, &'static str, &'static str)>,
    latency: Duration,
    slow_next: Vec<Duration>,
    fail_next: Vec<u16>,
    garbage_next: Vec<&'static str>,
    throttle_next: Vec<u64>,
    conflict_next_writes: usize,
    log: Vec<LoggedRequest>,
    next_log_id: u64,
    hook: Option<RequestHook>,
    services: Vec<FakeService>,
    controller_lag: Duration,
    controller_stuck: bool,
    controller_wake: Arc<tokio::sync::Notify>,
    slice_history: Vec<SliceChange>,
    /// Every write, oldest first (at most [`EVENT_LOG_LEN`]).
    events: VecDeque<Arc<WatchEvent>>,
    /// The revision before the oldest event kept: a watch from an older
    /// one gets 410 `Expired`.
    log_start_rv: u64,
    /// One queue per open watch; every event is pushed to each, in order,
    /// under the lock (this is what wakes the watches).
    watchers: Vec<mpsc::UnboundedSender<Arc<WatchEvent>>>,
    bookmark_period: Duration,
}

/// One write of the store, as the watch cache keeps it.
#[derive(Debug)]
struct WatchEvent {
    rv: u64,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    kind_of_event: &'static str,
    kind: FakeKind,
    ns: String,
    /// The object after the write (for `DELETED`: as it was, with the
    /// deletion's resourceVersion).
    object: Value,
    /// The object before the write (none for `ADDED`).
    prev: Option<Value>,
}

/// A Service with a selector, whose EndpointSlice the fake's controller keeps.
#[derive(Debug, Clone)]
struct FakeService {
    ns: String,
    name: String,
    selector: BTreeMap<String, String>,
    port: u16,
}

/// One write of the fake's endpoint-slice controller.
#[derive(Debug, Clone)]
pub struct SliceChange {
    /// When it was written.
    pub at: Instant,
    /// The Service.
    pub service: String,
    /// Every address the slice lists after the write.
    pub addresses: Vec<String>,
    /// The addresses listed as ready.
    pub ready: Vec<String>,
}

impl State {
    /// The one way to change the store: takes the next revision, stores
    /// `new` under (kind, ns, name) with it as `metadata.resourceVersion`
    /// (`None`: removes the object), logs the event (`ADDED`, `MODIFIED`
    /// or `DELETED`), hands it to every open watch and, for a pod, wakes
    /// the endpoint-slice controller. Returns the object stored or
    /// removed, with the new resourceVersion; `None` (and no revision) when
    /// there was nothing to remove.
    fn commit(
        &mut self,
        kind: FakeKind,
        ns: &str,
        name: &str,
        new: Option<Value>,
    ) -> Option<Value> {
        let key = (kind, ns.to_string(), name.to_string());
        if new.is_none() && !self.objects.contains_key(&key) {
            return None;
        }
        self.revision += 1;
        let rv = self.revision;
        let (kind_of_event, object, prev) = match new {
            Some(mut obj) => {
                obj["metadata"]["resourceVersion"] = json!(rv.to_string());
                let prev = self.objects.insert(key, obj.clone());
                let t = if prev.is_some() { "MODIFIED" } else { "ADDED" };
                (t, obj, prev)
            }
            None => {
                let prev = self.objects.remove(&key).unwrap();
                let mut obj = prev.clone();
                obj["metadata"]["resourceVersion"] = json!(rv.to_string());
                ("DELETED", obj, Some(prev))
            }
        };
        let event = Arc::new(WatchEvent {
            rv,
            kind_of_event,
            kind,
            ns: ns.to_string(),
            object: object.clone(),
            prev,
        });
        self.events.push_back(event.clone());
        while self.events.len() > EVENT_LOG_LEN {
            if let Some(old) = self.events.pop_front() {
                self.log_start_rv = old.rv;
            }
        }
        self.watchers.retain(|w| w.send(event.clone()).is_ok());
        if kind == FakeKind::Pod {
            self.controller_wake.notify_one();
        }
        Some(object)
    }

    /// A stored pod changed by `f` (a MODIFIED event); panics if there is none.
    fn modify_pod(&mut self, ns: &str, name: &str, f: impl FnOnce(&mut Value)) -> Value {
        let mut pod = self
            .objects
            .get(&(FakeKind::Pod, ns.to_string(), name.to_string()))
            .unwrap_or_else(|| panic!("no pod {ns}/{name}"))
            .clone();
        f(&mut pod);
        self.commit(FakeKind::Pod, ns, name, Some(pod)).unwrap()
    }
}

/// A running fake API server; stops when dropped.
pub struct FakeKube {
    url: String,
    ca_pem: String,
    issuer: Arc<Issuer<'static, KeyPair>>,
    state: Arc<Mutex<State>>,
    down: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    controller: tokio::task::JoinHandle<()>,
}

/// Resolves once `rx` holds `want`.
async fn until(rx: &mut tokio::sync::watch::Receiver<bool>, want: bool) {
    // An error means the sender is gone: the fake is being dropped.
    let _ = rx.wait_for(|v| *v == want).await;
}

impl Drop for FakeKube {
    fn drop(&mut self) {
        self.task.abort();
        self.controller.abort();
    }
}

/// A fresh self-signed CA (certificate PEM, issuer).
fn new_ca(cn: &str) -> (String, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), Issuer::new(params, key))
}

/// Listen on `addr` again after being down (the old socket may linger briefly).
async fn bind_again(addr: std::net::SocketAddr) -> Option<TcpListener> {
    for _ in 0..100 {
        if let Ok(l) = TcpListener::bind(addr).await {
            return Some(l);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The PEM of a CA that has nothing to do with any fake (for negative tests).
pub fn unrelated_ca_pem() -> String {
    new_ca("unrelated-ca").0
}

impl FakeKube {
    /// Start on 127.0.0.1:0 with a certificate for `127.0.0.1` and `localhost`.
    pub async fn start() -> FakeKube {
        Self::start_with_names(&["127.0.0.1", "localhost"]).await
    }

    /// Start with a server certificate for exactly `names` (DNS names or IPs).
    pub async fn start_with_names(names: &[&str]) -> FakeKube {
        picket::tls::install_crypto_provider();
        let (ca_pem, issuer) = new_ca("fake-kube-ca");
        let server_key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "fake-kube-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_cert = params.signed_by(&server_key, &issuer).unwrap();

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let client_verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .allow_unauthenticated()
        .build()
        .unwrap();
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(
                vec![server_cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
            )
            .unwrap();
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(cfg));

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            tokens: [DEFAULT_TOKEN.to_string()].into_iter().collect(),
            bookmark_period: Duration::from_secs(1),
            ..State::default()
        }));
        let (down, down_rx) = tokio::sync::watch::channel(false);
        let controller = tokio::spawn(run_controller(state.clone()));
        let st = state.clone();
        let task = tokio::spawn(async move {
            let mut listener = Some(listener);
            let mut rx = down_rx;
            loop {
                let l = match listener.take() {
                    Some(l) => l,
                    None => {
                        // Down: nothing listens, so connections are refused.
                        until(&mut rx, false).await;
                        match bind_again(addr).await {
                            Some(l) => l,
                            None => return,
                        }
                    }
                };
                loop {
                    let accepted = tokio::select! {
                        a = l.accept() => a,
                        _ = until(&mut rx, true) => break,
                    };
                    let Ok((tcp, _)) = accepted else {
                        continue;
                    };
                    // As kube-apiserver's connections (Go sets TCP_NODELAY
                    // on every TCP connection): a watch event is sent at
                    // once, not held back until the previous one is acked.
                    let _ = tcp.set_nodelay(true);
                    let acceptor = acceptor.clone();
                    let st = st.clone();
                    let mut conn_rx = rx.clone();
                    let handler_rx = rx.clone();
                    tokio::spawn(async move {
                        let tls = tokio::select! {
                            t = acceptor.accept(tcp) => match t {
                                Ok(t) => t,
                                Err(_) => return,
                            },
                            _ = until(&mut conn_rx, true) => return,
                        };
                        let has_cert = tls
                            .get_ref()
                            .1
                            .peer_certificates()
                            .is_some_and(|c| !c.is_empty());
                        // Whether the last request on this connection was a
                        // watch (HTTP/1.1: one request at a time).
                        let watching = Arc::new(AtomicBool::new(false));
                        let w = watching.clone();
                        let svc = hyper::service::service_fn(move |req| {
                            let st = st.clone();
                            let down = handler_rx.clone();
                            let w = w.clone();
                            async move { Ok::<_, Infallible>(handle(st, req, has_cert, down, w).await) }
                        });
                        let conn = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), svc);
                        tokio::pin!(conn);
                        tokio::select! {
                            _ = conn.as_mut() => return,
                            _ = until(&mut conn_rx, true) => {}
                        }
                        // Going down cuts open (keep-alive) connections too,
                        // but a watch ends its body cleanly first (its task
                        // sees "down" too), as a terminating API server's do.
                        if watching.load(Ordering::SeqCst) {
                            conn.as_mut().graceful_shutdown();
                            let _ = tokio::time::timeout(Duration::from_secs(1), conn).await;
                        }
                    });
                }
                // `l` is dropped here: the port closes.
            }
        });
        FakeKube {
            url: format!("https://{addr}"),
            ca_pem,
            issuer: Arc::new(issuer),
            state,
            down,
            task,
            controller,
        }
    }

    /// Take the API server down (`true`: the port is closed, open
    /// connections are cut) or bring it back up on the same port.
    pub fn set_down(&self, down: bool) {
        self.down.send_replace(down);
    }

    /// Run `hook` on every request as it arrives (after it is logged,
    /// before any latency or answer); `None` removes it. The hook runs on
    /// the server's task: it may block briefly.
    pub fn set_hook(&self, hook: Option<RequestHook>) {
        self.st().hook = hook;
    }

    /// Write a kubeconfig for this server (its CA) with `token` in a token
    /// file, both in `dir`; returns the kubeconfig's path.
    pub fn write_kubeconfig(&self, dir: &std::path::Path, token: &str) -> std::path::PathBuf {
        use base64::Engine as _;
        let token_file = dir.join("token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: fake\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: picket\n  user:\n    tokenFile: {}\ncontexts:\n- name: test\n  context:\n    cluster: fake\n    user: picket\n",
                self.url(),
                base64::engine::general_purpose::STANDARD.encode(self.ca_pem()),
                token_file.display()
            ),
        )
        .unwrap();
        path
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The PEM of the CA that signed the server certificate (and verifies client certificates).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A client certificate and key (PEM) signed by the fake's CA.
    pub fn issue_client_cert(&self, cn: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// Replace the set of accepted bearer tokens.
    pub fn set_tokens(&self, tokens: &[&str]) {
        self.st().tokens = tokens.iter().map(|s| s.to_string()).collect();
    }

    /// Answer 403 to this (otherwise valid) token.
    pub fn forbid_token(&self, token: &str) {
        let mut st = self.st();
        st.tokens.insert(token.to_string());
        st.forbidden.insert(token.to_string());
    }

    /// Answer 403 to this (otherwise valid) token for one `verb` (`get`,
    /// `list`, `watch`, `create`, `update`, `patch`, `delete`) on one
    /// `resource` (`pods`, `endpointslices`), as RBAC does for a Role
    /// that lacks it.
    pub fn deny(&self, token: &str, verb: &'static str, resource: &'static str) {
        let mut st = self.st();
        st.tokens.insert(token.to_string());
        st.denied.insert((token.to_string(), verb, resource));
    }

    /// Delay every request by `d`.
    pub fn set_latency(&self, d: Duration) {
        self.st().latency = d;
    }

    /// Delay each of the next `n` requests by `d` (on top of the latency).
    pub fn slow_next(&self, n: usize, d: Duration) {
        self.st().slow_next = vec![d; n];
    }

    /// Answer `code` (a 5xx) to the next `n` requests.
    pub fn fail_next(&self, n: usize, code: u16) {
        self.st().fail_next = vec![code; n];
    }

    /// Answer the next `n` requests `200 OK` with a body that is not what
    /// the request asks for, taking [`GARBAGE`] in turn (nothing is
    /// applied).
    pub fn garbage_next(&self, n: usize) {
        self.st().garbage_next = (0..n).map(|i| GARBAGE[i % GARBAGE.len()]).collect();
    }

    /// Answer 429 with `Retry-After: secs` to the next `n` requests.
    pub fn throttle_next(&self, n: usize, secs: u64) {
        self.st().throttle_next = vec![secs; n];
    }

    /// Before each of the next `n` PATCH requests to an existing object,
    /// act as another writer: touch the object (new resourceVersion).
    pub fn conflict_next_writes(&self, n: usize) {
        self.st().conflict_next_writes = n;
    }

    /// Injected faults not yet used: (5xx answers, 429 answers, conflicts).
    pub fn faults_left(&self) -> (usize, usize, usize) {
        let st = self.st();
        (
            st.fail_next.len(),
            st.throttle_next.len(),
            st.conflict_next_writes,
        )
    }

    /// Play the endpoint-slice controller for a Service with `selector`:
    /// its EndpointSlice `<name>-ctrl` (label
    /// `kubernetes.io/service-name=<name>`) lists every pod of `ns` whose
    /// labels match and that has a pod IP, ready when the pod is (its
    /// `Ready` condition; a Running pod without conditions counts as
    /// ready), [`FakeKube::set_controller_lag`] after each pod change.
    pub fn add_service(&self, ns: &str, name: &str, selector: &[(&str, &str)], port: u16) {
        let mut st = self.st();
        st.services.push(FakeService {
            ns: ns.to_string(),
            name: name.to_string(),
            selector: selector
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            port,
        });
        st.controller_wake.notify_one();
    }

    /// How long the controller takes to follow a pod change (a real one:
    /// 3–50 ms).
    pub fn set_controller_lag(&self, lag: Duration) {
        self.st().controller_lag = lag;
    }

    /// A stuck controller follows nothing until it is unstuck.
    pub fn set_controller_stuck(&self, stuck: bool) {
        let mut st = self.st();
        st.controller_stuck = stuck;
        st.controller_wake.notify_one();
    }

    /// Every write of the controller so far.
    pub fn slice_history(&self) -> Vec<SliceChange> {
        self.st().slice_history.clone()
    }

    /// Mark a pod ready or not (its `Ready` condition), as the kubelet would.
    pub fn set_pod_ready(&self, ns: &str, name: &str, ready: bool) {
        self.st().modify_pod(ns, name, |pod| {
            pod["status"]["conditions"] =
                json!([{"type": "Ready", "status": if ready { "True" } else { "False" }}]);
        });
    }

    /// Change a pod's IP (`status.podIP` and `status.podIPs`), a MODIFIED
    /// event; panics if there is no such pod.
    pub fn set_pod_ip(&self, ns: &str, name: &str, ip: &str) {
        self.st().modify_pod(ns, name, |pod| {
            pod["status"]["podIP"] = json!(ip);
            pod["status"]["podIPs"] = json!([{"ip": ip}]);
        });
    }

    /// What the API server does to a pod deleted with a grace period (the
    /// kubelet deletes it when its containers are gone: [`FakeKube::delete_pod`]):
    /// `metadata.deletionTimestamp` (RFC 3339, UTC: now plus the grace
    /// period, as the real server sets it) and
    /// `metadata.deletionGracePeriodSeconds`, a MODIFIED event; panics if
    /// there is no such pod.
    pub fn mark_pod_deleting(&self, ns: &str, name: &str, grace_secs: u64) {
        let at = std::time::SystemTime::now() + Duration::from_secs(grace_secs);
        let stamp = humantime::format_rfc3339_seconds(at).to_string();
        self.st().modify_pod(ns, name, |pod| {
            pod["metadata"]["deletionTimestamp"] = json!(stamp);
            pod["metadata"]["deletionGracePeriodSeconds"] = json!(grace_secs);
        });
    }

    /// Remove a pod now (a DELETED event; the object in it carries the
    /// deletion's resourceVersion). Returns it, or `None` if there was none.
    pub fn delete_pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.st().commit(FakeKind::Pod, ns, name, None)
    }

    /// Drop the whole event log, as an etcd compaction (or a watch cache
    /// whose window moved on) does: a watch from any revision before the
    /// current one gets 410 `Expired`. Open watches go on.
    pub fn compact(&self) {
        let mut st = self.st();
        st.events.clear();
        st.log_start_rv = st.revision;
    }

    /// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK
    /// (default 1 s; open watches take it after their next one).
    pub fn set_bookmark_period(&self, d: Duration) {
        self.st().bookmark_period = d;
    }

    /// The store's current revision (the resourceVersion of the last write).
    pub fn revision(&self) -> u64 {
        self.st().revision
    }

    /// The revision before the oldest event kept (see [`FakeKube::compact`]).
    pub fn log_start_rv(&self) -> u64 {
        self.st().log_start_rv
    }

    /// Every pod LIST request so far (a GET of `/api/v1/namespaces/{ns}/pods`
    /// without `watch`), whatever it was answered.
    pub fn pod_lists(&self) -> Vec<LoggedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.is_pod_collection() && !r.is_watch())
            .collect()
    }

    /// Every pod WATCH request so far (logged as it starts; `status` is 200
    /// once the stream is open, or the error it got).
    pub fn pod_watches(&self) -> Vec<LoggedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.is_pod_collection() && r.is_watch())
            .collect()
    }

    /// How many watch streams are open now.
    pub fn open_watches(&self) -> usize {
        self.st().watchers.iter().filter(|w| !w.is_closed()).count()
    }

    /// Seed a pod with an IP and labels; returns it.
    pub fn add_pod(&self, ns: &str, name: &str, ip: &str, labels: &[(&str, &str)]) -> Value {
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let pod = json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "server", "ports": [{"containerPort": 6379}]}]},
            "status": {"phase": "Running", "podIP": ip},
        });
        self.put_object(FakeKind::Pod, ns, pod)
    }

    /// Store (create or overwrite) an object as it is, with a new resourceVersion.
    pub fn put_object(&self, kind: FakeKind, ns: &str, mut obj: Value) -> Value {
        let mut st = self.st();
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let (k, api) = kind.kind();
        obj["kind"] = json!(k);
        obj["apiVersion"] = json!(api);
        obj["metadata"]["namespace"] = json!(ns);
        if obj["metadata"].get("uid").is_none() {
            obj["metadata"]["uid"] = json!(format!("uid-{name}"));
        }
        // A test must not seed what the real API server could not hold.
        if let Err(causes) = validate(kind, None, &obj) {
            panic!("the API server would refuse {name}: {causes:?}");
        }
        normalize(kind, &mut obj);
        st.commit(kind, ns, &name, Some(obj)).unwrap()
    }

    /// Set an annotation on a stored object (as another writer would), bumping its resourceVersion.
    pub fn set_annotation(&self, kind: FakeKind, ns: &str, name: &str, key: &str, value: &str) {
        let mut st = self.st();
        let mut obj = st
            .objects
            .get(&(kind, ns.to_string(), name.to_string()))
            .unwrap()
            .clone();
        obj["metadata"]["annotations"][key] = json!(value);
        st.commit(kind, ns, name, Some(obj));
    }

    /// A stored object.
    pub fn object(&self, kind: FakeKind, ns: &str, name: &str) -> Option<Value> {
        self.st()
            .objects
            .get(&(kind, ns.to_string(), name.to_string()))
            .cloned()
    }

    /// A label of a stored object.
    pub fn label(&self, kind: FakeKind, ns: &str, name: &str, key: &str) -> Option<String> {
        self.object(kind, ns, name)
            .and_then(|o| o["metadata"]["labels"][key].as_str().map(str::to_string))
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.st().log.clone()
    }

    /// Every write (non-GET) request so far.
    pub fn writes(&self) -> Vec<LoggedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.is_write())
            .collect()
    }

    /// Forget the request log.
    pub fn clear_requests(&self) {
        self.st().log.clear();
    }
}

// ---- the endpoint-slice controller ----

async fn run_controller(state: Arc<Mutex<State>>) {
    let wake = state
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .controller_wake
        .clone();
    loop {
        wake.notified().await;
        let lag = state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .controller_lag;
        if !lag.is_zero() {
            tokio::time::sleep(lag).await;
        }
        let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
        if !st.controller_stuck {
            reconcile(&mut st);
        }
    }
}

fn pod_ready(pod: &Value) -> bool {
    match pod["status"]["conditions"].as_array() {
        Some(cs) => cs
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True"),
        None => pod["status"]["phase"] == "Running",
    }
}

/// Make every Service's slice list the pods it selects now.
fn reconcile(st: &mut State) {
    let services = st.services.clone();
    for svc in services {
        let sel = Selector(
            svc.selector
                .iter()
                .map(|(k, v)| Req::Eq(k.clone(), v.clone()))
                .collect(),
        );
        let endpoints: Vec<Value> = st
            .objects
            .iter()
            .filter(|((k, n, _), _)| *k == FakeKind::Pod && *n == svc.ns)
            .map(|(_, p)| p)
            .filter(|p| sel.matches(&labels_of(p)) && p["status"]["podIP"].is_string())
            .map(|p| {
                let ready = pod_ready(p);
                let terminating = !p["metadata"]["deletionTimestamp"].is_null();
                json!({
                    "addresses": [p["status"]["podIP"]],
                    "conditions": {"ready": ready && !terminating, "serving": ready,
                                   "terminating": terminating},
                    "targetRef": {"kind": "Pod", "namespace": svc.ns,
                                  "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]},
                })
            })
            .collect();
        let name = format!("{}-ctrl", svc.name);
        let key = (FakeKind::EndpointSlice, svc.ns.clone(), name.clone());
        let mut slice = json!({
            "kind": "EndpointSlice",
            "apiVersion": "discovery.k8s.io/v1",
            "metadata": {
                "name": name, "namespace": svc.ns, "uid": format!("uid-{name}"),
                "labels": {
                    "kubernetes.io/service-name": svc.name,
                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "redis", "port": svc.port, "protocol": "TCP"}],
            "endpoints": endpoints,
        });
        normalize(FakeKind::EndpointSlice, &mut slice);
        if st.objects.get(&key).map(|o| &o["endpoints"]) == Some(&slice["endpoints"]) {
            continue;
        }
        let addrs = |ready_only: bool| -> Vec<String> {
            slice["endpoints"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| !ready_only || e["conditions"]["ready"] == true)
                .filter_map(|e| e["addresses"][0].as_str().map(str::to_string))
                .collect()
        };
        let change = SliceChange {
            at: Instant::now(),
            service: svc.name.clone(),
            addresses: addrs(false),
            ready: addrs(true),
        };
        st.slice_history.push(change);
        st.commit(FakeKind::EndpointSlice, &svc.ns, &name, Some(slice));
    }
}

// ---- request handling ----

type Resp = Response<BoxBody<Bytes, Infallible>>;

fn full(body: impl Into<Bytes>) -> BoxBody<Bytes, Infallible> {
    Full::new(body.into()).boxed()
}

/// The bodies of [`FakeKube::garbage_next`]: what a broken proxy, a
/// truncated transfer or a wrong server in front of the API could send.
pub const GARBAGE: &[&str] = &[
    "{\"kind\":\"EndpointSlice\",\"metadata\":{\"name\":",
    "<html><body><h1>502 Bad Gateway</h1></body></html>",
    "{\"kind\":\"PodList\",\"items\":\"not a list\"}",
    "[1,2,3]",
    "{\"metadata\":{\"resourceVersion\":17,\"annotations\":[\"x\"]},\"endpoints\":{}}",
    "\u{0}\u{1}\u{ff}garbage",
];

fn respond(code: u16, body: &Value) -> Resp {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap())
        .header("content-type", "application/json")
        .body(full(body.to_string()))
        .unwrap()
}

/// A `Status` body shaped like the real API server's.
pub fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn status(code: u16, reason: &str, message: &str) -> Resp {
    respond(code, &status_body(code, reason, message))
}

async fn handle(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
    has_cert: bool,
    down: tokio::sync::watch::Receiver<bool>,
    watching: Arc<AtomicBool>,
) -> Resp {
    watching.store(false, Ordering::SeqCst);
    let at = Instant::now();
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().map(str::to_string);
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let content_type = header("content-type");
    let user_agent = header("user-agent");
    let authorization = header("authorization");
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let body = String::from_utf8_lossy(&body).to_string();

    // Logged on arrival, so that a request the client abandons (timeout)
    // still shows.
    let (id, hook, entry) = {
        let mut st = state.lock().unwrap();
        st.next_log_id += 1;
        let id = st.next_log_id;
        let entry = LoggedRequest {
            id,
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            content_type: content_type.clone(),
            user_agent,
            body: body.clone(),
            status: 0,
            at,
        };
        st.log.push(entry.clone());
        (id, st.hook.clone(), entry)
    };
    if let Some(hook) = hook {
        hook(&entry);
    }
    let delay = {
        let mut st = state.lock().unwrap();
        let extra = if st.slow_next.is_empty() {
            Duration::ZERO
        } else {
            st.slow_next.remove(0)
        };
        st.latency + extra
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }

    let mut watch = None;
    let mut resp = {
        let mut st = state.lock().unwrap();
        route(
            &mut st,
            &method,
            &path,
            query.as_deref(),
            content_type.as_deref(),
            authorization.as_deref(),
            &body,
            has_cert,
            &mut watch,
        )
    };
    let mut st = state.lock().unwrap();
    if let Some(entry) = st.log.iter_mut().find(|r| r.id == id) {
        entry.status = resp.status().as_u16();
    }
    if method != "GET" && resp.status().is_success() && path.contains("/pods") {
        st.controller_wake.notify_one();
    }
    drop(st);
    if let Some(w) = watch {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run_watch(state, w, tx, down));
        *resp.body_mut() = WatchBody(rx).boxed();
        watching.store(true, Ordering::SeqCst);
    }
    resp
}

// ---- watches ----

/// A watch that passed every check, ready to stream.
struct WatchStart {
    kind: FakeKind,
    ns: String,
    selector: Selector,
    /// Lines to send first: the synthetic ADDED events, the retained events
    /// after the requested revision, or the one ERROR.
    backlog: Vec<Bytes>,
    /// The events that follow (none after an ERROR: the stream ends).
    events: Option<mpsc::UnboundedReceiver<Arc<WatchEvent>>>,
    bookmarks: bool,
    timeout: Duration,
}

/// The chunked body of a watch: one frame per event line.
struct WatchBody(mpsc::UnboundedReceiver<Bytes>);

impl hyper::body::Body for WatchBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|l| l.map(|l| Ok(Frame::data(l))))
    }
}

fn event_line(kind_of_event: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind_of_event, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// What a watch of (kind, ns, selector) sends for `ev`, as the watch
/// cache: a change into the selector is ADDED, out of it DELETED (with the
/// new object).
fn watch_line(ev: &WatchEvent, kind: FakeKind, ns: &str, selector: &Selector) -> Option<Bytes> {
    if ev.kind != kind || ev.ns != ns {
        return None;
    }
    let before = ev
        .prev
        .as_ref()
        .is_some_and(|p| selector.matches(&labels_of(p)));
    let after = ev.kind_of_event != "DELETED" && selector.matches(&labels_of(&ev.object));
    let t = match (before, after) {
        (false, true) => "ADDED",
        (true, true) => "MODIFIED",
        (true, false) => "DELETED",
        (false, false) => return None,
    };
    Some(event_line(t, &ev.object))
}

fn bookmark_line(kind: FakeKind, rv: u64) -> Bytes {
    let (k, api) = kind.kind();
    event_line(
        "BOOKMARK",
        &json!({"kind": k, "apiVersion": api, "metadata": {"resourceVersion": rv.to_string()}}),
    )
}

/// Parse the watch parameters and take what the watch starts from, under
/// the lock (so nothing falls between the backlog and the queue).
fn start_watch(
    st: &mut State,
    kind: FakeKind,
    ns: &str,
    selector: Selector,
    query: Option<&str>,
) -> Result<WatchStart, Box<Resp>> {
    let from = match query_param(query, "resourceVersion").as_deref() {
        None | Some("") | Some("0") => None,
        Some(s) => match s.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                return Err(Box::new(status(
                    400,
                    "BadRequest",
                    &format!(
                        "invalid resource version: strconv.ParseUint: parsing {s:?}: invalid syntax"
                    ),
                )));
            }
        },
    };
    let timeout = match query_param(query, "timeoutSeconds").as_deref() {
        None | Some("") | Some("0") => Duration::from_secs(300),
        Some(s) => match s.parse::<u64>() {
            Ok(n) => Duration::from_secs(n),
            Err(_) => {
                return Err(Box::new(status(
                    400,
                    "BadRequest",
                    &format!("invalid timeoutSeconds {s:?}"),
                )));
            }
        },
    }
    .min(MAX_WATCH_TIMEOUT);
    let bookmarks = query_param(query, "allowWatchBookmarks").is_some_and(|v| parse_bool(&v));
    let mut w = WatchStart {
        kind,
        ns: ns.to_string(),
        selector,
        backlog: Vec::new(),
        events: None,
        bookmarks,
        timeout,
    };
    match from {
        None => {
            w.backlog = st
                .objects
                .iter()
                .filter(|((k, n, _), o)| *k == kind && n == ns && w.selector.matches(&labels_of(o)))
                .map(|(_, o)| event_line("ADDED", o))
                .collect();
        }
        Some(rv) if rv < st.log_start_rv => {
            // The watch cache's message: the revision asked for, then the
            // oldest it can start from ("oldest event's - 1").
            let gone = status_body(
                410,
                "Expired",
                &format!("too old resource version: {rv} ({})", st.log_start_rv),
            );
            w.backlog = vec![event_line("ERROR", &gone)];
            return Ok(w);
        }
        Some(rv) => {
            w.backlog = st
                .events
                .iter()
                .filter(|e| e.rv > rv)
                .filter_map(|e| watch_line(e, kind, ns, &w.selector))
                .collect();
        }
    }
    let (tx, rx) = mpsc::unbounded_channel();
    st.watchers.push(tx);
    w.events = Some(rx);
    Ok(w)
}

/// Stream a watch into `out` until its timeout, the fake going down (or
/// away), or the client leaving.
async fn run_watch(
    state: Arc<Mutex<State>>,
    w: WatchStart,
    out: mpsc::UnboundedSender<Bytes>,
    mut down: tokio::sync::watch::Receiver<bool>,
) {
    for line in w.backlog {
        if out.send(line).is_err() {
            return;
        }
    }
    let Some(mut events) = w.events else {
        return;
    };
    let lock = || state.lock().unwrap_or_else(|e| e.into_inner());
    let deadline = tokio::time::Instant::now() + w.timeout;
    let mut next_bookmark = tokio::time::Instant::now() + lock().bookmark_period;
    loop {
        tokio::select! {
            ev = events.recv() => {
                let Some(ev) = ev else { return };
                if let Some(line) = watch_line(&ev, w.kind, &w.ns, &w.selector)
                    && out.send(line).is_err()
                {
                    return;
                }
            }
            _ = tokio::time::sleep_until(next_bookmark), if w.bookmarks => {
                // Under the lock nothing can be logged: once the queue is
                // drained, this watch has seen every event up to the
                // revision.
                let (pending, rv, period) = {
                    let st = lock();
                    let mut pending = Vec::new();
                    while let Ok(ev) = events.try_recv() {
                        pending.push(ev);
                    }
                    (pending, st.revision, st.bookmark_period)
                };
                let lines = pending
                    .iter()
                    .filter_map(|ev| watch_line(ev, w.kind, &w.ns, &w.selector))
                    .chain([bookmark_line(w.kind, rv)]);
                for line in lines {
                    if out.send(line).is_err() {
                        return;
                    }
                }
                next_bookmark = tokio::time::Instant::now() + period;
            }
            _ = tokio::time::sleep_until(deadline) => return,
            _ = until(&mut down, true) => return,
            _ = out.closed() => return,
        }
    }
}

/// The RBAC verb, resource and API group of a request, as the API
/// server's authorizer sees it.
fn rbac_attributes(
    method: &str,
    path: &str,
    query: Option<&str>,
) -> (&'static str, &'static str, &'static str) {
    let (resource, group) = if path.contains("/endpointslices") {
        ("endpointslices", "discovery.k8s.io")
    } else {
        ("pods", "")
    };
    let collection = path.ends_with("/pods") || path.ends_with("/endpointslices");
    let verb = match method {
        "GET" if is_watch_query(query) => "watch",
        "GET" if collection => "list",
        "GET" => "get",
        "POST" => "create",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    };
    (verb, resource, group)
}

#[allow(clippy::too_many_arguments)]
fn route(
    st: &mut State,
    method: &str,
    path: &str,
    query: Option<&str>,
    content_type: Option<&str>,
    authorization: Option<&str>,
    body: &str,
    has_cert: bool,
    watch: &mut Option<WatchStart>,
) -> Resp {
    if !st.throttle_next.is_empty() {
        let secs = st.throttle_next.remove(0);
        let mut r = status(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        );
        r.headers_mut()
            .insert("retry-after", secs.to_string().parse().unwrap());
        return r;
    }
    if !st.garbage_next.is_empty() {
        let body = st.garbage_next.remove(0);
        return Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(full(body))
            .unwrap();
    }
    if !st.fail_next.is_empty() {
        let code = st.fail_next.remove(0);
        let reason = match code {
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "InternalError",
        };
        return status(code, reason, "injected failure");
    }

    // Authentication, then authorization (only the forbidden list).
    let token = authorization
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(str::trim);
    match token {
        Some(t) if st.tokens.contains(t) => {
            let (verb, resource, group) = rbac_attributes(method, path, query);
            if st.denied.contains(&(t.to_string(), verb, resource)) {
                let group_name = if group.is_empty() {
                    resource.to_string()
                } else {
                    format!("{resource}.{group}")
                };
                return status(
                    403,
                    "Forbidden",
                    &format!(
                        "{group_name} is forbidden: User \"system:serviceaccount:test:picket\" \
                         cannot {verb} resource \"{resource}\" in API group \"{group}\" in \
                         the namespace \"{}\"",
                        path.split('/')
                            .skip_while(|seg| *seg != "namespaces")
                            .nth(1)
                            .unwrap_or_default()
                    ),
                );
            }
            if st.forbidden.contains(t) {
                return status(
                    403,
                    "Forbidden",
                    &format!(
                        "{} is forbidden: User \"system:serviceaccount:test:picket\" cannot {} \
                         resource in API group",
                        path,
                        method.to_lowercase()
                    ),
                );
            }
        }
        None if has_cert => {}
        _ => return status(401, "Unauthorized", "Unauthorized"),
    }

    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (kind, ns, name) = match segs.as_slice() {
        ["api", "v1", "namespaces", ns, "pods"] => (FakeKind::Pod, *ns, None),
        ["api", "v1", "namespaces", ns, "pods", name] => (FakeKind::Pod, *ns, Some(*name)),
        [
            "apis",
            "discovery.k8s.io",
            "v1",
            "namespaces",
            ns,
            "endpointslices",
        ] => (FakeKind::EndpointSlice, *ns, None),
        [
            "apis",
            "discovery.k8s.io",
            "v1",
            "namespaces",
            ns,
            "endpointslices",
            name,
        ] => (FakeKind::EndpointSlice, *ns, Some(*name)),
        _ => {
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
        }
    };
    let not_found = |name: &str| {
        status(
            404,
            "NotFound",
            &format!("{} \"{name}\" not found", kind.resource()),
        )
    };
    let key = |name: &str| (kind, ns.to_string(), name.to_string());

    match (method, name) {
        ("GET", None) => {
            let selector = match query_param(query, "labelSelector") {
                None => Selector::default(),
                Some(s) => match Selector::parse(&s) {
                    Ok(sel) => sel,
                    Err(e) => {
                        return status(
                            400,
                            "BadRequest",
                            &format!("unable to parse requirement: {e}"),
                        );
                    }
                },
            };
            if is_watch_query(query) {
                return match start_watch(st, kind, ns, selector, query) {
                    Ok(w) => {
                        *watch = Some(w);
                        // The body is the stream (see `handle`).
                        Response::builder()
                            .status(StatusCode::OK)
                            .header("content-type", "application/json")
                            .body(full(Bytes::new()))
                            .unwrap()
                    }
                    Err(r) => *r,
                };
            }
            // Without resourceVersion a consistent read; with it (and
            // resourceVersionMatch) the fake answers the same, which a
            // real server may too.
            let items: Vec<Value> = st
                .objects
                .iter()
                .filter(|((k, n, _), _)| *k == kind && n == ns)
                .map(|(_, o)| o)
                .filter(|o| selector.matches(&labels_of(o)))
                .cloned()
                .collect();
            let (lk, api) = kind.list_kind();
            respond(
                200,
                &json!({
                    "kind": lk, "apiVersion": api,
                    "metadata": {"resourceVersion": st.revision.to_string()},
                    "items": items,
                }),
            )
        }
        ("GET", Some(name)) => match st.objects.get(&key(name)) {
            Some(o) => respond(200, o),
            None => not_found(name),
        },
        ("POST", None) => {
            let Ok(mut obj) = serde_json::from_str::<Value>(body) else {
                return status(400, "BadRequest", "the request body is not JSON");
            };
            let Some(name) = obj["metadata"]["name"].as_str().map(str::to_string) else {
                return status(422, "Invalid", "metadata.name: Required value");
            };
            if st.objects.contains_key(&key(&name)) {
                return status(
                    409,
                    "AlreadyExists",
                    &format!("{} \"{name}\" already exists", kind.resource()),
                );
            }
            if let Err(causes) = validate(kind, None, &obj) {
                return respond(422, &invalid_body(kind, &name, &causes));
            }
            normalize(kind, &mut obj);
            let (k, api) = kind.kind();
            obj["kind"] = json!(k);
            obj["apiVersion"] = json!(api);
            obj["metadata"]["namespace"] = json!(ns);
            obj["metadata"]["uid"] = json!(format!("uid-{name}"));
            let obj = st.commit(kind, ns, &name, Some(obj)).unwrap();
            respond(201, &obj)
        }
        ("PATCH", Some(name)) => {
            if !st.objects.contains_key(&key(name)) {
                return not_found(name);
            }
            if st.conflict_next_writes > 0 {
                // Another writer gets in between picket's read and write.
                st.conflict_next_writes -= 1;
                let rv = (st.revision + 1).to_string();
                let mut o = st.objects[&key(name)].clone();
                o["metadata"]["annotations"]["fake.picket.io/touched"] = json!(rv);
                st.commit(kind, ns, name, Some(o));
            }
            let current = st.objects[&key(name)].clone();
            let Ok(input) = serde_json::from_str::<Value>(body) else {
                return status(400, "BadRequest", "the request body is not JSON");
            };
            let ct = content_type.unwrap_or("").split(';').next().unwrap_or("");
            if ct.trim() != "application/merge-patch+json" {
                return status(
                    415,
                    "UnsupportedMediaType",
                    &format!(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {ct:?})"
                    ),
                );
            }
            let mut updated = current.clone();
            merge_patch(&mut updated, &input);
            // The precondition: a resourceVersion in the result that is not
            // the stored one means the writer saw an older object.
            let cur_rv = current["metadata"]["resourceVersion"].clone();
            let new_rv = updated["metadata"]["resourceVersion"].clone();
            if !new_rv.is_null() && new_rv != cur_rv {
                return status(
                    409,
                    "Conflict",
                    &format!(
                        "Operation cannot be fulfilled on {} \"{name}\": the object has been \
                         modified; please apply your changes to the latest version and try again",
                        kind.resource()
                    ),
                );
            }
            if updated["metadata"]["name"].as_str() != Some(name) {
                return status(
                    400,
                    "BadRequest",
                    "the name of the object does not match the name on the URL",
                );
            }
            if let Err(causes) = validate(kind, Some(&current), &updated) {
                return respond(422, &invalid_body(kind, name, &causes));
            }
            normalize(kind, &mut updated);
            let (k, api) = kind.kind();
            updated["kind"] = json!(k);
            updated["apiVersion"] = json!(api);
            updated["metadata"]["namespace"] = json!(ns);
            updated["metadata"]["uid"] = current["metadata"]["uid"].clone();
            let updated = st.commit(kind, ns, name, Some(updated)).unwrap();
            respond(200, &updated)
        }
        // A pod without finalizers deleted at once (grace period 0, or one
        // the kubelet has already honoured): 200 with the object as it was
        // last, with the deletion's resourceVersion.
        ("DELETE", Some(name)) if kind == FakeKind::Pod => match st.commit(kind, ns, name, None) {
            Some(o) => respond(200, &o),
            None => not_found(name),
        },
        _ => status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        ),
    }
}

/// One field the fake's validation refuses, as a `details.causes` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueNotSupported`, ...
    pub reason: &'static str,
    /// The field path, e.g. `endpoints[0].addresses[0]`.
    pub field: String,
    /// `Invalid value: "127.0.0.1": may not be in the loopback range ...`.
    pub message: String,
}

fn invalid(field: String, value: &Value, why: &str) -> Cause {
    let shown = match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    };
    Cause {
        reason: "FieldValueInvalid",
        field,
        message: format!("Invalid value: {shown}: {why}"),
    }
}

/// The apiserver's `ValidateNonSpecialIP` (pkg/apis/core/validation), as
/// applied to the addresses of an IPv4 or IPv6 EndpointSlice, after the
/// address-family check.
fn validate_slice_address(address_type: &str, field: String, raw: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    let text = raw.as_str().unwrap_or_default();
    let parsed: Option<std::net::IpAddr> = text.parse().ok();
    let family_ok = matches!(
        (address_type, parsed),
        ("IPv4", Some(std::net::IpAddr::V4(_))) | ("IPv6", Some(std::net::IpAddr::V6(_)))
    );
    if !family_ok {
        let want = if address_type == "IPv4" {
            "must be a valid IPv4 address"
        } else {
            "must be a valid IPv6 address"
        };
        out.push(invalid(field.clone(), raw, want));
    }
    let Some(ip) = parsed else {
        out.push(invalid(field, raw, "must be a valid IP address"));
        return out;
    };
    if ip.is_unspecified() {
        out.push(invalid(
            field.clone(),
            raw,
            &format!("may not be unspecified ({text})"),
        ));
    }
    if ip.is_loopback() {
        out.push(invalid(
            field.clone(),
            raw,
            "may not be in the loopback range (127.0.0.0/8, ::1/128)",
        ));
    }
    let (link_local, ll_multicast) = match ip {
        std::net::IpAddr::V4(v4) => (v4.is_link_local(), v4.octets()[..3] == [224, 0, 0]),
        std::net::IpAddr::V6(v6) => {
            let s0 = v6.segments()[0];
            (s0 & 0xffc0 == 0xfe80, s0 & 0xff0f == 0xff02)
        }
    };
    if link_local {
        out.push(invalid(
            field.clone(),
            raw,
            "may not be in the link-local range (169.254.0.0/16, fe80::/10)",
        ));
    }
    if ll_multicast {
        out.push(invalid(
            field,
            raw,
            "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)",
        ));
    }
    out
}

fn validate(kind: FakeKind, old: Option<&Value>, new: &Value) -> Result<(), Vec<Cause>> {
    if kind != FakeKind::EndpointSlice {
        return Ok(());
    }
    let mut causes = Vec::new();
    let at = new["addressType"].as_str();
    if !matches!(at, Some("IPv4" | "IPv6" | "FQDN")) {
        causes.push(Cause {
            reason: "FieldValueNotSupported",
            field: "addressType".into(),
            message: format!(
                "Unsupported value: {}: supported values: \"FQDN\", \"IPv4\", \"IPv6\"",
                new["addressType"]
            ),
        });
    }
    if let Some(old) = old
        && old["addressType"] != new["addressType"]
    {
        causes.push(invalid(
            "addressType".into(),
            &new["addressType"],
            "field is immutable",
        ));
    }
    if let Some(labels) = new["metadata"]["labels"].as_object() {
        for (k, v) in labels {
            if !v.is_string() {
                causes.push(invalid(
                    format!("metadata.labels[{k}]"),
                    v,
                    "values must be strings",
                ));
            }
        }
    }
    if let Some(at @ ("IPv4" | "IPv6")) = at {
        for (i, ep) in new["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let addrs = ep["addresses"].as_array().cloned().unwrap_or_default();
            if addrs.is_empty() {
                causes.push(Cause {
                    reason: "FieldValueRequired",
                    field: format!("endpoints[{i}].addresses"),
                    message: "Required value: must contain at least 1 address".into(),
                });
            }
            for (j, a) in addrs.iter().enumerate() {
                causes.extend(validate_slice_address(
                    at,
                    format!("endpoints[{i}].addresses[{j}]"),
                    a,
                ));
            }
        }
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(causes)
    }
}

/// The 422 `Invalid` Status the real API server answers for `causes`.
pub fn invalid_body(kind: FakeKind, name: &str, causes: &[Cause]) -> Value {
    let (k, api) = kind.kind();
    let group = api.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
    let qualified = if group.is_empty() {
        k.to_string()
    } else {
        format!("{k}.{group}")
    };
    let each: Vec<String> = causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect();
    let joined = if each.len() == 1 {
        each[0].clone()
    } else {
        format!("[{}]", each.join(", "))
    };
    let mut body = status_body(
        422,
        "Invalid",
        &format!("{qualified} {name:?} is invalid: {joined}"),
    );
    body["details"] = json!({
        "name": name,
        "group": group,
        "kind": k,
        "causes": causes.iter().map(|c| json!({
            "reason": c.reason, "message": c.message, "field": c.field,
        })).collect::<Vec<_>>(),
    });
    body
}

/// What the real API server stores and returns for a slice: empty
/// `endpoints` and `ports` lists read back as `null` (the Go types have
/// no `omitempty`, and an empty list does not survive storage), missing
/// or null conditions as `{}`.
fn normalize(kind: FakeKind, obj: &mut Value) {
    if kind != FakeKind::EndpointSlice {
        return;
    }
    for list in ["endpoints", "ports"] {
        match obj.get(list) {
            Some(Value::Array(a)) if a.is_empty() => obj[list] = Value::Null,
            None => obj[list] = Value::Null,
            _ => {}
        }
    }
    if let Some(eps) = obj["endpoints"].as_array_mut() {
        for ep in eps {
            let mut c = ep
                .get("conditions")
                .cloned()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({}));
            if let Some(m) = c.as_object_mut() {
                m.retain(|_, v| !v.is_null());
            }
            ep["conditions"] = c;
        }
    }
}

fn labels_of(o: &Value) -> BTreeMap<String, String> {
    o["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (percent_decode(k) == name).then(|| percent_decode(v))
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}

/// RFC 7386: objects merge recursively, `null` deletes, everything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().unwrap();
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

// ---- label selectors ----

#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (all requirements must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(Vec<Req>);

impl Selector {
    /// Parse the `labelSelector` syntax.
    pub fn parse(s: &str) -> Result<Selector, String> {
        let mut parts = Vec::new();
        let (mut depth, mut start) = (0i32, 0usize);
        for (i, c) in s.char_indices() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    parts.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
            if depth < 0 {
                return Err(format!("unbalanced ')' in {s:?}"));
            }
        }
        if depth != 0 {
            return Err(format!("unbalanced '(' in {s:?}"));
        }
        parts.push(&s[start..]);
        let mut reqs = Vec::new();
        for p in parts {
            let p = p.trim();
            if p.is_empty() {
                if s.trim().is_empty() {
                    continue;
                }
                return Err(format!("empty requirement in {s:?}"));
            }
            reqs.push(parse_req(p)?);
        }
        Ok(Selector(reqs))
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => labels.get(k) == Some(v),
            Req::NotEq(k, v) => labels.get(k) != Some(v),
            Req::In(k, vs) => labels.get(k).is_some_and(|x| vs.contains(x)),
            Req::NotIn(k, vs) => labels.get(k).is_none_or(|x| !vs.contains(x)),
            Req::Exists(k) => labels.contains_key(k),
            Req::NotExists(k) => !labels.contains_key(k),
        })
    }
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn parse_req(p: &str) -> Result<Req, String> {
    let key_ok = |k: &str| {
        if valid_key(k) {
            Ok(k.to_string())
        } else {
            Err(format!("invalid label key {k:?}"))
        }
    };
    let val_ok = |v: &str| {
        let v = v.trim();
        if valid_value(v) {
            Ok(v.to_string())
        } else {
            Err(format!("invalid label value {v:?}"))
        }
    };
    if let Some(k) = p.strip_prefix('!') {
        return Ok(Req::NotExists(key_ok(k.trim())?));
    }
    if let Some((k, v)) = p.split_once("!=") {
        return Ok(Req::NotEq(key_ok(k.trim())?, val_ok(v)?));
    }
    if let Some((k, v)) = p.split_once("==") {
        return Ok(Req::Eq(key_ok(k.trim())?, val_ok(v)?));
    }
    if let Some((k, v)) = p.split_once('=') {
        return Ok(Req::Eq(key_ok(k.trim())?, val_ok(v)?));
    }
    let words: Vec<&str> = p.splitn(2, char::is_whitespace).collect();
    if words.len() == 2 {
        let key = key_ok(words[0])?;
        let rest = words[1].trim();
        let (op, set) = if let Some(r) = rest.strip_prefix("notin") {
            ("notin", r)
        } else if let Some(r) = rest.strip_prefix("in") {
            ("in", r)
        } else {
            return Err(format!("unknown operator in {p:?}"));
        };
        let set = set.trim();
        let inner = set
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| format!("expected (values) in {p:?}"))?;
        let values = inner
            .split(',')
            .map(val_ok)
            .collect::<Result<Vec<_>, _>>()?;
        if values.is_empty() || values.iter().any(String::is_empty) {
            return Err(format!("empty value set in {p:?}"));
        }
        return Ok(if op == "in" {
            Req::In(key, values)
        } else {
            Req::NotIn(key, values)
        });
    }
    Ok(Req::Exists(key_ok(p)?))
}

#[cfg(test)]
mod selector_tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selector_semantics() {
        let l = labels(&[("app", "cache"), ("role", "master"), ("tier", "a")]);
        let m = |s: &str| Selector::parse(s).unwrap().matches(&l);
        assert!(m("app=cache"));
        assert!(m("app==cache"));
        assert!(!m("app=web"));
        assert!(m("app!=web"));
        assert!(!m("app!=cache"));
        assert!(m("nolabel!=x"), "!= matches a missing label");
        assert!(m("role in (master, replica)"));
        assert!(!m("role in (replica)"));
        assert!(m("role notin (replica)"));
        assert!(m("missing notin (x)"));
        assert!(m("app"));
        assert!(!m("missing"));
        assert!(m("!missing"));
        assert!(!m("!app"));
        assert!(m("app=cache,role in (master,replica),!missing"));
        assert!(!m("app=cache,role=replica"));
        assert!(m(""), "empty selector matches all");
    }

    #[test]
    fn selector_errors() {
        for bad in [
            "app=(x",
            "role in master",
            "a b c",
            "=x",
            "app in ()",
            "app=cache,,x",
        ] {
            assert!(Selector::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn patches() {
        let mut doc = json!({"metadata":{"labels":{"a":"1","b":"2"}},"list":[1,2]});
        merge_patch(
            &mut doc,
            &json!({"metadata":{"labels":{"a":null,"c":"3"}},"list":[9]}),
        );
        assert_eq!(
            doc,
            json!({"metadata":{"labels":{"b":"2","c":"3"}},"list":[9]})
        );
    }

    #[test]
    fn query_decoding() {
        assert_eq!(
            query_param(
                Some("labelSelector=role+in+%28a%2Cb%29%2C%21x&limit=5"),
                "labelSelector"
            ),
            Some("role in (a,b),!x".to_string())
        );
    }
}

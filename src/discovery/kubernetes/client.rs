//! The Kubernetes client: picket's few calls (get, list by label
//! selector, create, patch, replace) on pods and `discovery.k8s.io/v1`
//! EndpointSlices, sent through kube-rs's [`kube::Client`], which owns the
//! connection: TLS (rustls on ring), the CA, `insecure-skip-tls-verify`,
//! `tls-server-name`, client certificates and the kubeconfig `proxy-url`
//! (HTTP CONNECT). The pod watch is kube-runtime's watcher (`members.rs`).
//!
//! Kept here, because kube-rs does not do it: every call has a budget, in
//! which transient failures (429, 5xx, timeouts, connection errors) are
//! retried with jittered exponential backoff, or after `Retry-After` when
//! the server sends one; a 401 makes a refreshable credential (token file,
//! exec plugin) be fetched again once, after which 401 and 403 are final;
//! an answer of the wrong shape (a proxy's page, a truncated body) is not
//! taken for an object; the errors name the request and say what to check.
//! Bearer tokens come from picket's own credentials (`kubeconfig.rs`): an
//! exec plugin is run with a deadline and never interactively, which kube
//! does not offer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER, USER_AGENT};
use http::{Method, StatusCode};
use http_body_util::BodyExt as _;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::Deserialize;
use serde_json::Value;
use tokio::time::Instant;

use super::kubeconfig::{ClientIdentity, ClusterConfig, CredentialError, Credentials};
use crate::discovery::DiscoveryError;

/// The object kinds picket reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `v1` Pod.
    Pod,
    /// `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice,
}

impl Kind {
    /// The collection path in a namespace.
    pub fn collection_path(self, namespace: &str) -> String {
        match self {
            Kind::Pod => format!("/api/v1/namespaces/{namespace}/pods"),
            Kind::EndpointSlice => {
                format!("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices")
            }
        }
    }

    /// The path of one object.
    pub fn object_path(self, namespace: &str, name: &str) -> String {
        format!("{}/{name}", self.collection_path(namespace))
    }
}

/// The body format of a PATCH.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// RFC 7386 JSON merge patch (`null` deletes a key, lists are replaced).
    Merge,
    /// RFC 6902 JSON patch (an op list; a failing `test` gives 422).
    Json,
    /// Kubernetes strategic merge patch (built-in types only).
    Strategic,
}

impl PatchType {
    /// The Content-Type header value.
    pub fn content_type(self) -> &'static str {
        match self {
            PatchType::Merge => "application/merge-patch+json",
            PatchType::Json => "application/json-patch+json",
            PatchType::Strategic => "application/strategic-merge-patch+json",
        }
    }
}

/// How long and how often one call may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total time one call may take, retries and waits included.
    pub budget: Duration,
    /// First backoff; doubled after every failure.
    pub initial_backoff: Duration,
    /// Largest backoff (a `Retry-After` may ask for more, within the budget).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            budget: Duration::from_secs(10),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// An error answer of the API server, decoded from its `Status` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP method of the request.
    pub method: String,
    /// Full URL of the request.
    pub url: String,
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason` (`Conflict`, `NotFound`, `AlreadyExists`, ...), or the HTTP reason phrase.
    pub reason: String,
    /// `Status.message`, or the start of a non-Status body.
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code {
            401 => write!(
                f,
                "401 Unauthorized from {}: check the token (or client certificate / exec plugin) \
                 picket authenticates with{}",
                self.url,
                suffix(&self.message)
            ),
            403 => write!(
                f,
                "403 Forbidden from {} ({}): the identity picket uses lacks an RBAC permission \
                 (see the Role in docs/kubernetes.md){}",
                self.url,
                self.method,
                suffix(&self.message)
            ),
            _ => write!(
                f,
                "{} {}: {} {}{}",
                self.method,
                self.url,
                self.code,
                self.reason,
                suffix(&self.message)
            ),
        }
    }
}

fn suffix(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// Why a call failed.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ClientError {
    /// The server answered with an error status.
    #[error("{0}")]
    Api(ApiError),
    /// No answer (connection refused, reset, timeout).
    #[error("{method} {url}: {message}")]
    Transport {
        /// HTTP method.
        method: String,
        /// URL.
        url: String,
        /// What happened.
        message: String,
        /// Whether it was the per-request timeout.
        timeout: bool,
    },
    /// The TLS handshake failed (untrusted or mismatching server certificate, rejected client certificate).
    #[error("{url}: TLS: {message}")]
    Tls {
        /// URL.
        url: String,
        /// The TLS error.
        message: String,
    },
    /// The API server URL is not an `http(s)://host[:port]` URL.
    #[error("invalid API server URL {0:?}")]
    InvalidServer(String),
    /// The TLS material of the configuration is unusable.
    #[error("TLS setup: {0}")]
    TlsSetup(String),
    /// A 2xx answer whose body is not the expected JSON.
    #[error("{method} {url}: undecodable response: {message}")]
    Decode {
        /// HTTP method.
        method: String,
        /// URL.
        url: String,
        /// The decoder's message.
        message: String,
    },
    /// No credential could be obtained.
    #[error("credentials: {0}")]
    Credentials(#[from] CredentialError),
}

impl ClientError {
    /// The HTTP status code, for API errors.
    pub fn code(&self) -> Option<u16> {
        match self {
            ClientError::Api(a) => Some(a.code),
            _ => None,
        }
    }

    /// 404.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// 409 from a stale resourceVersion (not from a create of an existing name).
    pub fn is_conflict(&self) -> bool {
        matches!(self, ClientError::Api(a) if a.code == 409 && a.reason != "AlreadyExists")
    }

    /// 409 `AlreadyExists` from a create.
    pub fn is_already_exists(&self) -> bool {
        matches!(self, ClientError::Api(a) if a.code == 409 && a.reason == "AlreadyExists")
    }

    /// Whether waiting and trying again may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Api(a) => matches!(a.code, 408 | 409 | 429) || a.code >= 500,
            ClientError::Transport { .. } | ClientError::Decode { .. } => true,
            // An exec plugin or token file may well work on the next try.
            ClientError::Credentials(_) => true,
            ClientError::Tls { .. } | ClientError::TlsSetup(_) | ClientError::InvalidServer(_) => {
                false
            }
        }
    }
}

impl From<ClientError> for DiscoveryError {
    fn from(e: ClientError) -> Self {
        if e.is_transient() {
            DiscoveryError::Transient(e.to_string())
        } else {
            DiscoveryError::Permanent(e.to_string())
        }
    }
}

/// The Kubernetes client. Clones share connections and credentials.
#[derive(Clone)]
pub struct KubeClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("server", &self.inner.server)
            .field("timeout", &self.inner.timeout)
            .field("retry", &self.inner.retry)
            .finish_non_exhaustive()
    }
}

struct Inner {
    server: String,
    cluster: ClusterConfig,
    creds: Credentials,
    timeout: Duration,
    retry: RetryPolicy,
    /// The client built with the kubeconfig's own identity (if any).
    base: kube::Client,
    /// The client for the identity an exec plugin returned last.
    exec: Mutex<Option<(ClientIdentity, kube::Client)>>,
}

/// One answer: its status, `Retry-After`, and its body.
struct Answer {
    status: StatusCode,
    retry_after: Option<Duration>,
    body: bytes::Bytes,
}

impl KubeClient {
    /// A client for `cluster`, with `timeout` for each request.
    ///
    /// Fails when the CA or client certificate cannot be used, so that a
    /// bad configuration shows at start-up rather than at the first failover.
    pub fn new(cluster: ClusterConfig, timeout: Duration) -> Result<Self, ClientError> {
        let base = build_kube(&cluster, cluster.client_identity.as_ref(), timeout)?;
        Ok(KubeClient {
            inner: Arc::new(Inner {
                server: cluster.server.clone(),
                creds: Credentials::new(&cluster),
                cluster,
                timeout,
                retry: RetryPolicy::default(),
                base,
                exec: Mutex::new(None),
            }),
        })
    }

    /// The same client with another retry policy (call before cloning).
    pub fn with_retry(self, retry: RetryPolicy) -> Self {
        let inner = match Arc::try_unwrap(self.inner) {
            Ok(mut i) => {
                i.retry = retry;
                i
            }
            Err(shared) => Inner {
                server: shared.server.clone(),
                cluster: shared.cluster.clone(),
                creds: Credentials::new(&shared.cluster),
                timeout: shared.timeout,
                retry,
                base: shared.base.clone(),
                exec: Mutex::new(None),
            },
        };
        KubeClient {
            inner: Arc::new(inner),
        }
    }

    /// The API server's base URL.
    pub fn server(&self) -> &str {
        &self.inner.server
    }

    /// A kube-rs client for a watch lasting `watch_timeout` (the pod
    /// watcher, which kube-runtime drives): the credential of now built
    /// in, and a read timeout a little longer than the watch, so that a
    /// connection that died silently is noticed.
    pub async fn watch_client(&self, watch_timeout: Duration) -> Result<kube::Client, ClientError> {
        let auth = self.inner.creds.current().await?;
        build(
            &self.inner.cluster,
            auth.identity
                .as_ref()
                .or(self.inner.cluster.client_identity.as_ref()),
            self.inner.timeout,
            Some(watch_timeout + self.inner.timeout),
            auth.token.as_ref().map(|t| t.expose()),
        )
    }

    /// Forget the current credential after a 401 (the watcher's), so that
    /// the next request fetches a new one; whether there is one to fetch.
    pub async fn reauthenticate(&self) -> bool {
        if self.inner.creds.refreshable() {
            self.inner.creds.invalidate().await;
            true
        } else {
            false
        }
    }

    /// GET one object.
    pub async fn get(&self, kind: Kind, ns: &str, name: &str) -> Result<Value, ClientError> {
        let path = kind.object_path(ns, name);
        self.send(Method::GET, &path, &[], None, Expect::Object(Some(name)))
            .await
    }

    /// GET one object; `None` when it does not exist.
    pub async fn get_opt(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
    ) -> Result<Option<Value>, ClientError> {
        match self.get(kind, ns, name).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// LIST the objects of a namespace, optionally by label selector; returns `items`.
    pub async fn list(
        &self,
        kind: Kind,
        ns: &str,
        label_selector: Option<&str>,
    ) -> Result<Vec<Value>, ClientError> {
        let path = kind.collection_path(ns);
        let query: Vec<(&str, &str)> = label_selector
            .map(|s| ("labelSelector", s))
            .into_iter()
            .collect();
        let url = format!("{}{}", self.inner.server, path);
        let list = self
            .send(Method::GET, &path, &query, None, Expect::List)
            .await?;
        list_items(list).map_err(|message| ClientError::Decode {
            method: "GET".into(),
            url,
            message,
        })
    }

    /// POST a new object.
    pub async fn create(&self, kind: Kind, ns: &str, body: &Value) -> Result<Value, ClientError> {
        let path = kind.collection_path(ns);
        let bytes = (
            "application/json",
            serde_json::to_vec(body).unwrap_or_default(),
        );
        let name = body_name(body);
        self.send(Method::POST, &path, &[], Some(bytes), Expect::Object(name))
            .await
    }

    /// PATCH an object; put `metadata.resourceVersion` in a merge patch to make it conditional.
    pub async fn patch(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        patch_type: PatchType,
        body: &Value,
    ) -> Result<Value, ClientError> {
        let path = kind.object_path(ns, name);
        let body = (
            patch_type.content_type(),
            serde_json::to_vec(body).unwrap_or_default(),
        );
        self.send(
            Method::PATCH,
            &path,
            &[],
            Some(body),
            Expect::Object(Some(name)),
        )
        .await
    }

    /// PUT a whole object (conditional when it carries `metadata.resourceVersion`).
    pub async fn replace(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        body: &Value,
    ) -> Result<Value, ClientError> {
        let path = kind.object_path(ns, name);
        let body = (
            "application/json",
            serde_json::to_vec(body).unwrap_or_default(),
        );
        self.send(
            Method::PUT,
            &path,
            &[],
            Some(body),
            Expect::Object(Some(name)),
        )
        .await
    }

    fn client_for(&self, identity: Option<&ClientIdentity>) -> Result<kube::Client, ClientError> {
        let Some(id) = identity else {
            return Ok(self.inner.base.clone());
        };
        let mut g = self.inner.exec.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((cached_id, client)) = g.as_ref()
            && cached_id == id
        {
            return Ok(client.clone());
        }
        let client = build_kube(&self.inner.cluster, Some(id), self.inner.timeout)?;
        *g = Some((id.clone(), client.clone()));
        Ok(client)
    }

    /// One request with the current credential, its answer read whole
    /// within the timeout.
    async fn exchange(
        &self,
        method: &Method,
        path_and_query: &str,
        body: Option<&(&'static str, Vec<u8>)>,
    ) -> Result<Answer, kube::Error> {
        let auth = self
            .inner
            .creds
            .current()
            .await
            .map_err(|e| kube::Error::Service(Box::new(e)))?;
        let client = self
            .client_for(auth.identity.as_ref())
            .map_err(|e| kube::Error::Service(Box::new(e)))?;
        let mut req = http::Request::builder()
            .method(method.clone())
            .uri(path_and_query)
            .header(ACCEPT, "application/json");
        if let Some(token) = &auth.token {
            let mut v =
                HeaderValue::from_str(&format!("Bearer {}", token.expose())).map_err(|_| {
                    kube::Error::Service(Box::new(CredentialError::TokenFile {
                        path: "<token>".into(),
                        message: "the token contains characters not allowed in a header".into(),
                    }))
                })?;
            v.set_sensitive(true);
            req = req.header(AUTHORIZATION, v);
        }
        let bytes = match body {
            Some((ct, b)) => {
                req = req.header(CONTENT_TYPE, *ct);
                b.clone()
            }
            None => Vec::new(),
        };
        let req = req
            .body(kube::client::Body::from(bytes))
            .map_err(kube::Error::HttpError)?;
        let answer = async {
            let resp = client.send(req).await?;
            let status = resp.status();
            if let Some(w) = resp.headers().get("warning") {
                tracing::debug!(path = %path_and_query, warning = ?w, "API server warning");
            }
            let retry_after = resp
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = resp.into_body().collect().await?.to_bytes();
            Ok(Answer {
                status,
                retry_after,
                body,
            })
        };
        match tokio::time::timeout(self.inner.timeout, answer).await {
            Ok(r) => r,
            Err(_) => Err(kube::Error::Service(Box::new(TimedOut(self.inner.timeout)))),
        }
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<(&'static str, Vec<u8>)>,
        expect: Expect<'_>,
    ) -> Result<Value, ClientError> {
        let url = format!("{}{}", self.inner.server, path);
        let path_and_query = if query.is_empty() {
            path.to_string()
        } else {
            let mut q = form_urlencoded_pairs(query);
            q.insert(0, '?');
            format!("{path}{q}")
        };
        let retry = self.inner.retry;
        let deadline = Instant::now() + retry.budget;
        let mut backoff = retry.initial_backoff;
        let mut reauthenticated = false;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let (err, retry_after) = match self
                .exchange(&method, &path_and_query, body.as_ref())
                .await
            {
                Ok(a) if a.status.is_success() => {
                    let decoded = if a.body.is_empty() {
                        Ok(Value::Null)
                    } else {
                        serde_json::from_slice(&a.body).map_err(|e| e.to_string())
                    };
                    match decoded.and_then(|v| expect.check(v)) {
                        Ok(v) => return Ok(v),
                        // A truncated transfer or a proxy's error page:
                        // worth another try. A write that did land is
                        // then refused by its resourceVersion
                        // precondition, and the caller re-reads.
                        Err(message) => (
                            ClientError::Decode {
                                method: method.to_string(),
                                url: url.clone(),
                                message,
                            },
                            None,
                        ),
                    }
                }
                Ok(a) => {
                    let text = String::from_utf8_lossy(&a.body);
                    let err = ClientError::Api(decode_status(&method, &url, a.status, &text));
                    if a.status == StatusCode::UNAUTHORIZED
                        && !reauthenticated
                        && self.inner.creds.refreshable()
                    {
                        // An expired token or exec credential: fetch a new one, once.
                        reauthenticated = true;
                        self.inner.creds.invalidate().await;
                        tracing::info!(url = %url, "401 from the API server; refreshing the credential");
                        continue;
                    }
                    let retryable = matches!(a.status.as_u16(), 429 | 500 | 502 | 503 | 504)
                        || (a.retry_after.is_some() && a.status.is_server_error());
                    if !retryable {
                        return Err(err);
                    }
                    (err, a.retry_after)
                }
                Err(e) => {
                    // No request was sent: no credential, or no client
                    // for the exec plugin's certificate.
                    if let Some(c) = credential_failure(&e) {
                        return Err(ClientError::Credentials(c));
                    }
                    if let Some(c) = chain(&e)
                        .into_iter()
                        .find_map(|c| c.downcast_ref::<ClientError>().cloned())
                    {
                        return Err(c);
                    }
                    if let Some(msg) = tls_failure(&e) {
                        return Err(ClientError::Tls {
                            url: url.clone(),
                            message: msg,
                        });
                    }
                    let timeout = timed_out(&e);
                    (
                        ClientError::Transport {
                            method: method.to_string(),
                            url: url.clone(),
                            message: error_chain(&e),
                            timeout,
                        },
                        None,
                    )
                }
            };

            let wait = match retry_after {
                Some(ra) => ra,
                None => jitter(backoff),
            };
            backoff = (backoff * 2).min(retry.max_backoff);
            if Instant::now() + wait > deadline {
                tracing::warn!(url = %url, attempts = attempt, error = %err,
                    "giving up: the retry budget is spent");
                return Err(err);
            }
            tracing::debug!(url = %url, attempt, wait = ?wait, error = %err, "retrying");
            tokio::time::sleep(wait).await;
        }
    }
}

/// A request that took longer than the client's timeout.
#[derive(Debug, thiserror::Error)]
#[error("no complete answer within {0:?}")]
struct TimedOut(Duration);

/// `k=v&k=v`, percent-encoded as a query string.
fn form_urlencoded_pairs(query: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in query.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(&encode_component(k));
        out.push('=');
        out.push_str(&encode_component(v));
    }
    out
}

/// Percent-encode everything but the unreserved characters (RFC 3986).
fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Between half and all of `d`, so that daemons retrying together spread out.
fn jitter(d: Duration) -> Duration {
    let f: f64 = rand::random_range(0.5..=1.0);
    d.mul_f64(f)
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StatusBody {
    kind: Option<String>,
    reason: Option<String>,
    message: Option<String>,
}

/// The `items` of a LIST answer: none when absent or null, an error when
/// not a list. Public for the fuzz target `kube_json`.
pub fn list_items(mut list: Value) -> Result<Vec<Value>, String> {
    if !list.is_object() {
        return Err(format!(
            "a list answer is {}, not an object",
            json_type(&list)
        ));
    }
    match list.get_mut("items").map(Value::take) {
        Some(Value::Array(items)) => Ok(items),
        Some(Value::Null) | None => Ok(Vec::new()),
        Some(_) => Err("`items` is not a list".into()),
    }
}

/// What a successful answer must look like. A proxy's error page, a
/// truncated transfer or another server answering `200 OK` must not be
/// read as "the object has no labels" or "there are no pods": that could
/// turn into a wrong permanent error or a wrong write.
#[derive(Debug, Clone, Copy)]
enum Expect<'a> {
    /// One object, named so when the name is known.
    Object(Option<&'a str>),
    /// A list: an object with `items`, a list.
    List,
}

impl Expect<'_> {
    fn check(self, v: Value) -> Result<Value, String> {
        if !v.is_object() {
            return Err(format!("expected a JSON object, got {}", json_type(&v)));
        }
        match self {
            Expect::Object(Some(name)) => match v["metadata"]["name"].as_str() {
                Some(n) if n == name => Ok(v),
                Some(n) => Err(format!("the answer is object {n:?}, not {name:?}")),
                None => Err(format!(
                    "the answer has no metadata.name (expected {name:?})"
                )),
            },
            Expect::Object(None) => Ok(v),
            // The API server always sends `items` (`[]` when empty); an
            // object without it is not a list, not an empty one.
            Expect::List => match v.get("items") {
                Some(Value::Array(_) | Value::Null) => Ok(v),
                Some(other) => Err(format!("`items` is {}, not a list", json_type(other))),
                None => Err("the answer has no `items`: not a list".into()),
            },
        }
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `metadata.name` of an object to create (None with `generateName`).
fn body_name(body: &Value) -> Option<&str> {
    body["metadata"]["name"].as_str()
}

/// Decode the body of an error answer (normally a `Status` object) the way
/// the client does for a request `method url` answered with `code`; `None`
/// when `method` or `code` is not valid HTTP. Public for the fuzz target
/// `kube_json`; the client calls the same decoder.
pub fn decode_error_body(method: &str, url: &str, code: u16, text: &str) -> Option<ApiError> {
    let method = Method::from_bytes(method.as_bytes()).ok()?;
    let status = StatusCode::from_u16(code).ok()?;
    Some(decode_status(&method, url, status, text))
}

fn decode_status(method: &Method, url: &str, status: StatusCode, text: &str) -> ApiError {
    let parsed: Option<StatusBody> = serde_json::from_str(text).ok();
    let (reason, message) = match parsed {
        Some(s) if s.kind.as_deref() == Some("Status") => {
            (s.reason.unwrap_or_default(), s.message.unwrap_or_default())
        }
        _ => (String::new(), text.trim().chars().take(200).collect()),
    };
    let reason = if reason.is_empty() {
        status.canonical_reason().unwrap_or("").replace(' ', "")
    } else {
        reason
    };
    ApiError {
        method: method.to_string(),
        url: url.to_string(),
        code: status.as_u16(),
        reason,
        message,
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The sources of `e`, each once: a [`std::io::Error`]'s wrapped error
/// (its `source()` skips it) included.
fn chain<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut out = Vec::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        out.push(c);
        let mut inner: &(dyn std::error::Error + 'static) = c;
        while let Some(next) = inner
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            let next: &(dyn std::error::Error + 'static) = next;
            out.push(next);
            inner = next;
        }
        cur = c.source();
    }
    out
}

/// The rustls error behind a failed request, if that is what failed.
fn tls_failure(e: &kube::Error) -> Option<String> {
    chain(e)
        .into_iter()
        .find_map(|c| c.downcast_ref::<rustls::Error>().map(ToString::to_string))
}

/// A credential that could not be had (token file, exec plugin).
fn credential_failure(e: &kube::Error) -> Option<CredentialError> {
    chain(e)
        .into_iter()
        .find_map(|c| c.downcast_ref::<CredentialError>().cloned())
}

/// Whether the request ran out of time (ours, or the connector's).
fn timed_out(e: &kube::Error) -> bool {
    chain(e).into_iter().any(|c| {
        c.is::<TimedOut>()
            || c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    })
}

/// The kube-rs client for `cluster` with `identity` as client
/// certificate; picket adds the bearer token to each request itself.
fn build_kube(
    cluster: &ClusterConfig,
    identity: Option<&ClientIdentity>,
    timeout: Duration,
) -> Result<kube::Client, ClientError> {
    build(cluster, identity, timeout, None, None)
}

/// [`build_kube`] with a read timeout and a bearer token of its own.
fn build(
    cluster: &ClusterConfig,
    identity: Option<&ClientIdentity>,
    timeout: Duration,
    read_timeout: Option<Duration>,
    token: Option<&str>,
) -> Result<kube::Client, ClientError> {
    crate::tls::install_crypto_provider();
    let invalid = || ClientError::InvalidServer(cluster.server.clone());
    let uri: http::Uri = cluster.server.parse().map_err(|_| invalid())?;
    if !matches!(uri.scheme_str(), Some("https" | "http"))
        || uri.host().is_none_or(str::is_empty)
        || uri.query().is_some()
    {
        return Err(invalid());
    }
    let mut config = kube::Config::new(uri);
    if let Some(ns) = &cluster.namespace {
        config.default_namespace = ns.clone();
    }
    if !cluster.insecure_skip_tls_verify
        && let Some(pem) = &cluster.ca_pem
    {
        let mut roots = Vec::new();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| {
                ClientError::TlsSetup(format!("certificate authority: bad PEM: {e}"))
            })?;
            roots.push(cert.to_vec());
        }
        if roots.is_empty() {
            return Err(ClientError::TlsSetup(
                "certificate authority: no CERTIFICATE found in the PEM data".into(),
            ));
        }
        config.root_cert = Some(roots);
    }
    config.accept_invalid_certs = cluster.insecure_skip_tls_verify;
    config.tls_server_name = cluster.tls_server_name.clone();
    // Each call is bounded as a whole (the answer read within `timeout`);
    // a watch lasts as long as the server keeps it.
    config.connect_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    config.read_timeout = read_timeout;
    config.auth_info.token = token.map(|t| t.to_string().into());
    // Only the kubeconfig's proxy-url: an HTTPS_PROXY meant for other
    // traffic must not capture the API server.
    config.proxy_url = match &cluster.proxy_url {
        Some(p) => Some(
            p.parse()
                .map_err(|_| ClientError::TlsSetup(format!("proxy-url {p:?} is not a URL")))?,
        ),
        None => None,
    };
    // Names picket in the API server's audit log and in its metrics
    // (apiserver_request_total by client), as the webhook does.
    config.headers = vec![(
        USER_AGENT,
        HeaderValue::from_static(concat!("picket/", env!("CARGO_PKG_VERSION"))),
    )];
    if let Some(id) = identity {
        let certs = CertificateDer::pem_slice_iter(&id.cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ClientError::TlsSetup(format!("client certificate: bad PEM: {e}")))?;
        if certs.is_empty() {
            return Err(ClientError::TlsSetup(
                "client certificate: no CERTIFICATE found in the PEM data".into(),
            ));
        }
        rustls::pki_types::PrivateKeyDer::from_pem_slice(&id.key_pem).map_err(|e| {
            ClientError::TlsSetup(format!("client key: no usable private key: {e}"))
        })?;
        config.auth_info.client_certificate_data = Some(B64.encode(&id.cert_pem));
        config.auth_info.client_key_data = Some(B64.encode(&id.key_pem).into());
    }
    // kube-rs's client spawns its connection pool's task: outside a Tokio
    // runtime it would panic.
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ClientError::TlsSetup(
            "the Kubernetes client must be built inside the Tokio runtime".into(),
        ));
    }
    let client = kube::Client::try_from(config).map_err(|e| {
        ClientError::TlsSetup(format!("client certificate or CA: {}", error_chain(&e)))
    })?;
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_of_the_wrong_shape_are_refused() {
        let pod = serde_json::json!({"kind": "Pod", "metadata": {"name": "cache-0"}});
        assert!(Expect::Object(Some("cache-0")).check(pod.clone()).is_ok());
        assert!(Expect::Object(None).check(pod.clone()).is_ok());
        let e = Expect::Object(Some("cache-1"))
            .check(pod.clone())
            .unwrap_err();
        assert!(e.contains("\"cache-0\", not \"cache-1\""), "{e}");
        let e = Expect::Object(Some("cache-0"))
            .check(serde_json::json!({"metadata": {}}))
            .unwrap_err();
        assert!(e.contains("no metadata.name"), "{e}");
        for v in [Value::Null, serde_json::json!([1]), serde_json::json!("x")] {
            assert!(Expect::Object(None).check(v.clone()).is_err(), "{v}");
            assert!(Expect::List.check(v.clone()).is_err(), "{v}");
        }
        assert!(Expect::List.check(serde_json::json!({"items": []})).is_ok());
        assert!(
            Expect::List
                .check(serde_json::json!({"items": null}))
                .is_ok()
        );
        assert!(Expect::List.check(pod).is_err(), "an object is not a list");
        let e = Expect::List
            .check(serde_json::json!({"items": "x"}))
            .unwrap_err();
        assert!(e.contains("a string, not a list"), "{e}");
        assert!(list_items(serde_json::json!([1, 2])).is_err());
    }

    #[test]
    fn status_bodies_are_decoded() {
        let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"the object has been modified","reason":"Conflict","code":409}"#;
        let e = decode_status(&Method::PATCH, "https://h/x", StatusCode::CONFLICT, body);
        assert_eq!(e.reason, "Conflict");
        assert_eq!(e.message, "the object has been modified");
        let ce = ClientError::Api(e);
        assert!(ce.is_conflict() && !ce.is_already_exists() && ce.is_transient());

        let e = decode_status(
            &Method::GET,
            "https://h/x",
            StatusCode::BAD_GATEWAY,
            "<html>bad</html>",
        );
        assert_eq!(e.reason, "BadGateway");
        assert_eq!(e.message, "<html>bad</html>");

        let e = decode_status(&Method::GET, "https://h/api", StatusCode::UNAUTHORIZED, "");
        let msg = ClientError::Api(e).to_string();
        assert!(
            msg.starts_with("401 Unauthorized from https://h/api: check the token"),
            "{msg}"
        );
        let d: DiscoveryError = ClientError::Api(decode_status(
            &Method::GET,
            "https://h/api",
            StatusCode::FORBIDDEN,
            r#"{"kind":"Status","reason":"Forbidden","message":"pods is forbidden"}"#,
        ))
        .into();
        assert!(
            matches!(&d, DiscoveryError::Permanent(m) if m.contains("403 Forbidden") && m.contains("pods is forbidden")),
            "{d:?}"
        );
    }

    #[tokio::test]
    async fn bad_server_urls_and_tls_material_are_refused_up_front() {
        use super::super::kubeconfig::AuthConfig;
        let base = ClusterConfig {
            server: "https://127.0.0.1:6443".into(),
            ca_pem: None,
            insecure_skip_tls_verify: true,
            tls_server_name: None,
            client_identity: None,
            auth: AuthConfig::None,
            namespace: None,
            proxy_url: None,
        };
        let t = Duration::from_secs(1);
        assert!(KubeClient::new(base.clone(), t).is_ok());
        for bad in ["ftp://h", "127.0.0.1:6443", "https://", "https://h?x=1"] {
            let c = ClusterConfig {
                server: bad.into(),
                ..base.clone()
            };
            let e = KubeClient::new(c, t).unwrap_err();
            assert!(matches!(e, ClientError::InvalidServer(_)), "{bad}: {e}");
            assert!(!e.is_transient());
        }
        let c = ClusterConfig {
            insecure_skip_tls_verify: false,
            ca_pem: Some(b"not a pem".to_vec()),
            ..base.clone()
        };
        let e = KubeClient::new(c, t).unwrap_err();
        assert!(e.to_string().contains("certificate authority"), "{e}");
        let c = ClusterConfig {
            client_identity: Some(ClientIdentity {
                cert_pem: b"junk".to_vec(),
                key_pem: b"junk".to_vec(),
            }),
            ..base
        };
        let e = KubeClient::new(c, t).unwrap_err();
        assert!(e.to_string().contains("client certificate"), "{e}");
    }

    #[test]
    fn paths() {
        assert_eq!(
            Kind::Pod.object_path("ns", "p"),
            "/api/v1/namespaces/ns/pods/p"
        );
        assert_eq!(
            Kind::EndpointSlice.collection_path("ns"),
            "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"
        );
    }
}

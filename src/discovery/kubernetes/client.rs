//! A small Kubernetes REST client over reqwest: exactly the calls picket
//! makes (get, list by label selector, create, patch, replace) on pods and
//! `discovery.k8s.io/v1` EndpointSlices.
//!
//! Every call has a budget: transient failures (429, 5xx, timeouts,
//! connection errors) are retried with jittered exponential backoff, or
//! after `Retry-After` when the server sends one, until the budget would
//! be exceeded. A 401 makes a refreshable credential (token file, exec
//! plugin) be fetched again once; after that 401 and 403 are final.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
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
    base_http: reqwest::Client,
    /// The client for the identity an exec plugin returned last.
    exec_http: Mutex<Option<(ClientIdentity, reqwest::Client)>>,
}

impl KubeClient {
    /// A client for `cluster`, with `timeout` for each request.
    ///
    /// Fails when the CA or client certificate cannot be used, so that a
    /// bad configuration shows at start-up rather than at the first failover.
    pub fn new(cluster: ClusterConfig, timeout: Duration) -> Result<Self, ClientError> {
        crate::tls::install_crypto_provider();
        let url = reqwest::Url::parse(&cluster.server)
            .map_err(|_| ClientError::InvalidServer(cluster.server.clone()))?;
        if !matches!(url.scheme(), "https" | "http")
            || url.host_str().is_none()
            || url.query().is_some()
        {
            return Err(ClientError::InvalidServer(cluster.server.clone()));
        }
        let base_http = build_http(&cluster, cluster.client_identity.as_ref(), timeout)?;
        Ok(KubeClient {
            inner: Arc::new(Inner {
                server: cluster.server.clone(),
                creds: Credentials::new(&cluster),
                cluster,
                timeout,
                retry: RetryPolicy::default(),
                base_http,
                exec_http: Mutex::new(None),
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
                base_http: shared.base_http.clone(),
                exec_http: Mutex::new(None),
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
        Ok(self.list_versioned(kind, ns, label_selector).await?.0)
    }

    /// LIST as [`list`](Self::list), with the list's `resourceVersion`: a
    /// watch started from it sees every change after the list.
    pub async fn list_versioned(
        &self,
        kind: Kind,
        ns: &str,
        label_selector: Option<&str>,
    ) -> Result<(Vec<Value>, String), ClientError> {
        let path = kind.collection_path(ns);
        let query: Vec<(&str, &str)> = label_selector
            .map(|s| ("labelSelector", s))
            .into_iter()
            .collect();
        let url = format!("{}{}", self.inner.server, path);
        let list = self
            .send(Method::GET, &path, &query, None, Expect::List)
            .await?;
        let version = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let items = list_items(list).map_err(|message| ClientError::Decode {
            method: "GET".into(),
            url,
            message,
        })?;
        Ok((items, version))
    }

    /// Start a WATCH of the objects of a namespace (optionally by label
    /// selector) from `resource_version`, with bookmarks; the server ends
    /// it after `timeout`. One attempt (after a 401 with a refreshable
    /// credential, two): the caller re-lists or backs off, as it must
    /// anyway when the stream ends or a `410 Gone` says its version is
    /// too old.
    pub async fn watch(
        &self,
        kind: Kind,
        ns: &str,
        label_selector: Option<&str>,
        resource_version: &str,
        timeout: Duration,
    ) -> Result<WatchStream, ClientError> {
        let path = kind.collection_path(ns);
        let url = format!("{}{}", self.inner.server, path);
        let secs = timeout.as_secs().max(1).to_string();
        let mut query = vec![
            ("watch", "1"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", secs.as_str()),
        ];
        if let Some(s) = label_selector {
            query.push(("labelSelector", s));
        }
        let mut reauthenticated = false;
        loop {
            let req = self
                .request(Method::GET, &url)
                .await?
                .query(&query)
                // The client's timeout is one request's; a watch lasts as
                // long as the server keeps it, and a little more.
                .timeout(timeout + self.inner.timeout);
            let resp = req.send().await.map_err(|e| match tls_failure(&e) {
                Some(message) => ClientError::Tls {
                    url: url.clone(),
                    message,
                },
                None => ClientError::Transport {
                    method: "GET".into(),
                    url: url.clone(),
                    message: error_chain(&e),
                    timeout: e.is_timeout(),
                },
            })?;
            let status = resp.status();
            if status.is_success() {
                return Ok(WatchStream {
                    resp,
                    buf: Vec::new(),
                    url,
                });
            }
            let text = resp.text().await.unwrap_or_default();
            if status == StatusCode::UNAUTHORIZED
                && !reauthenticated
                && self.inner.creds.refreshable()
            {
                reauthenticated = true;
                self.inner.creds.invalidate().await;
                continue;
            }
            return Err(ClientError::Api(decode_status(
                &Method::GET,
                &url,
                status,
                &text,
            )));
        }
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

    fn http_for(&self, identity: Option<&ClientIdentity>) -> Result<reqwest::Client, ClientError> {
        let Some(id) = identity else {
            return Ok(self.inner.base_http.clone());
        };
        let mut g = self
            .inner
            .exec_http
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((cached_id, http)) = g.as_ref()
            && cached_id == id
        {
            return Ok(http.clone());
        }
        let http = build_http(&self.inner.cluster, Some(id), self.inner.timeout)?;
        *g = Some((id.clone(), http.clone()));
        Ok(http)
    }

    /// A request with the current credential.
    async fn request(
        &self,
        method: Method,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, ClientError> {
        let auth = self.inner.creds.current().await?;
        let http = self.http_for(auth.identity.as_ref())?;
        let mut req = http.request(method, url).header(ACCEPT, "application/json");
        if let Some(token) = &auth.token {
            let mut v =
                HeaderValue::from_str(&format!("Bearer {}", token.expose())).map_err(|_| {
                    ClientError::Credentials(CredentialError::TokenFile {
                        path: "<token>".into(),
                        message: "the token contains characters not allowed in a header".into(),
                    })
                })?;
            v.set_sensitive(true);
            req = req.header(AUTHORIZATION, v);
        }
        Ok(req)
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
        let retry = self.inner.retry;
        let deadline = Instant::now() + retry.budget;
        let mut backoff = retry.initial_backoff;
        let mut reauthenticated = false;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let mut req = self.request(method.clone(), &url).await?;
            if !query.is_empty() {
                req = req.query(query);
            }
            if let Some((ct, bytes)) = &body {
                req = req.header(CONTENT_TYPE, *ct).body(bytes.clone());
            }

            let (err, retry_after) = match req.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    if status.is_success() {
                        let bytes = resp.bytes().await.map_err(|e| ClientError::Transport {
                            method: method.to_string(),
                            url: url.clone(),
                            message: format!("reading the response: {e}"),
                            timeout: e.is_timeout(),
                        })?;
                        let decoded = if bytes.is_empty() {
                            Ok(Value::Null)
                        } else {
                            serde_json::from_slice(&bytes).map_err(|e| e.to_string())
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
                    } else {
                        if let Some(w) = resp.headers().get("warning") {
                            tracing::debug!(url = %url, warning = ?w, "API server warning");
                        }
                        let retry_after = resp
                            .headers()
                            .get(RETRY_AFTER)
                            .and_then(|v| v.to_str().ok())
                            .and_then(|v| v.trim().parse::<u64>().ok())
                            .map(Duration::from_secs);
                        let text = resp.text().await.unwrap_or_default();
                        let err = ClientError::Api(decode_status(&method, &url, status, &text));
                        if status == StatusCode::UNAUTHORIZED
                            && !reauthenticated
                            && self.inner.creds.refreshable()
                        {
                            // An expired token or exec credential: fetch a new one, once.
                            reauthenticated = true;
                            self.inner.creds.invalidate().await;
                            tracing::info!(url = %url, "401 from the API server; refreshing the credential");
                            continue;
                        }
                        let retryable = matches!(status.as_u16(), 429 | 500 | 502 | 503 | 504)
                            || (retry_after.is_some() && status.is_server_error());
                        if !retryable {
                            return Err(err);
                        }
                        (err, retry_after)
                    }
                }
                Err(e) => {
                    if let Some(msg) = tls_failure(&e) {
                        return Err(ClientError::Tls {
                            url: url.clone(),
                            message: msg,
                        });
                    }
                    let err = ClientError::Transport {
                        method: method.to_string(),
                        url: url.clone(),
                        message: error_chain(&e),
                        timeout: e.is_timeout(),
                    };
                    if !(e.is_timeout() || e.is_connect() || e.is_request() || e.is_body()) {
                        return Err(err);
                    }
                    (err, None)
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

/// One event of a watch.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// An object appeared (or now matches the selector).
    Added(Value),
    /// An object changed.
    Modified(Value),
    /// An object was deleted (or no longer matches the selector).
    Deleted(Value),
    /// Nothing changed up to this resourceVersion (a bookmark).
    Bookmark(String),
    /// The server ended the watch with a Status: `410` (`Expired`, `Gone`)
    /// means the version is too old and the caller must list again.
    Error(ApiError),
}

impl WatchEvent {
    /// The resourceVersion to resume from after this event, if it has one.
    pub fn resource_version(&self) -> Option<&str> {
        match self {
            WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o) => {
                o["metadata"]["resourceVersion"].as_str()
            }
            WatchEvent::Bookmark(v) => Some(v),
            WatchEvent::Error(_) => None,
        }
    }
}

/// A running watch: newline-separated JSON events.
#[derive(Debug)]
pub struct WatchStream {
    resp: reqwest::Response,
    buf: Vec<u8>,
    url: String,
}

impl WatchStream {
    /// The next event; `None` when the server ended the watch.
    pub async fn next(&mut self) -> Result<Option<WatchEvent>, ClientError> {
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return decode_watch_event(&self.url, &line).map(Some);
            }
            match self.resp.chunk().await {
                Ok(Some(chunk)) => {
                    if self.buf.len() + chunk.len() > MAX_WATCH_EVENT {
                        return Err(self.decode_error(format!(
                            "a watch event is longer than {MAX_WATCH_EVENT} bytes"
                        )));
                    }
                    self.buf.extend_from_slice(&chunk);
                }
                Ok(None) if self.buf.iter().all(u8::is_ascii_whitespace) => return Ok(None),
                Ok(None) => {
                    let line = std::mem::take(&mut self.buf);
                    return decode_watch_event(&self.url, &line).map(Some);
                }
                Err(e) => {
                    return Err(ClientError::Transport {
                        method: "GET".into(),
                        url: self.url.clone(),
                        message: format!("reading the watch: {}", error_chain(&e)),
                        timeout: e.is_timeout(),
                    });
                }
            }
        }
    }

    fn decode_error(&self, message: String) -> ClientError {
        ClientError::Decode {
            method: "GET".into(),
            url: self.url.clone(),
            message,
        }
    }
}

/// The longest watch event picket accepts (a pod is a few KiB; the API
/// server's own limit on an object is about 1.5 MiB).
const MAX_WATCH_EVENT: usize = 4 << 20;

/// Decode one line of a watch. Public for the fuzz target `kube_json`.
pub fn decode_watch_event(url: &str, line: &[u8]) -> Result<WatchEvent, ClientError> {
    let bad = |message: String| ClientError::Decode {
        method: "GET".into(),
        url: url.to_string(),
        message,
    };
    let mut v: Value =
        serde_json::from_slice(line).map_err(|e| bad(format!("a watch event: {e}")))?;
    let object = v.get_mut("object").map(Value::take).unwrap_or(Value::Null);
    if !object.is_object() {
        return Err(bad("a watch event without an object".into()));
    }
    match v["type"].as_str() {
        Some("ADDED") => Ok(WatchEvent::Added(object)),
        Some("MODIFIED") => Ok(WatchEvent::Modified(object)),
        Some("DELETED") => Ok(WatchEvent::Deleted(object)),
        Some("BOOKMARK") => match object["metadata"]["resourceVersion"].as_str() {
            Some(rv) => Ok(WatchEvent::Bookmark(rv.to_string())),
            None => Err(bad("a bookmark without a resourceVersion".into())),
        },
        Some("ERROR") => {
            let code = object["code"]
                .as_u64()
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(500);
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Ok(WatchEvent::Error(decode_status(
                &Method::GET,
                url,
                status,
                &object.to_string(),
            )))
        }
        other => Err(bad(format!("a watch event of type {other:?}"))),
    }
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

/// The rustls error behind a failed request, if that is what failed. The
/// connector nests it in `io::Error`s, whose `source()` skips the wrapped
/// error itself, so those are unwrapped by hand.
fn tls_failure(e: &reqwest::Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cur {
        let mut inner: &(dyn std::error::Error + 'static) = c;
        loop {
            if let Some(t) = inner.downcast_ref::<rustls::Error>() {
                return Some(t.to_string());
            }
            match inner
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
            {
                Some(next) => inner = next,
                None => break,
            }
        }
        cur = c.source();
    }
    None
}

fn build_http(
    cluster: &ClusterConfig,
    identity: Option<&ClientIdentity>,
    timeout: Duration,
) -> Result<reqwest::Client, ClientError> {
    crate::tls::install_crypto_provider();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ClientError::TlsSetup(e.to_string()))?;

    let verifier: Arc<dyn ServerCertVerifier> = if cluster.insecure_skip_tls_verify {
        Arc::new(AcceptAnyServerCert { provider })
    } else {
        let mut roots = rustls::RootCertStore::empty();
        if let Some(pem) = &cluster.ca_pem {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| {
                    ClientError::TlsSetup(format!("certificate authority: bad PEM: {e}"))
                })?;
                roots.add(cert).map_err(|e| {
                    ClientError::TlsSetup(format!("certificate authority: unusable: {e}"))
                })?;
            }
            if roots.is_empty() {
                return Err(ClientError::TlsSetup(
                    "certificate authority: no CERTIFICATE found in the PEM data".into(),
                ));
            }
        }
        let webpki =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| ClientError::TlsSetup(format!("certificate authority: {e}")))?;
        match &cluster.tls_server_name {
            None => webpki,
            Some(name) => {
                let name = ServerName::try_from(name.clone())
                    .map_err(|e| ClientError::TlsSetup(format!("tls-server-name {name:?}: {e}")))?;
                crate::tls::NameVerifier::new(webpki, crate::tls::NameCheck::As(name))
            }
        }
    };
    let builder = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut tls = match identity {
        None => builder.with_no_client_auth(),
        Some(id) => {
            let pem = id.combined_pem();
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ClientError::TlsSetup(format!("client certificate: bad PEM: {e}")))?;
            if certs.is_empty() {
                return Err(ClientError::TlsSetup(
                    "client certificate: no CERTIFICATE found in the PEM data".into(),
                ));
            }
            let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                ClientError::TlsSetup(format!("client key: no usable private key: {e}"))
            })?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| ClientError::TlsSetup(format!("client certificate: {e}")))?
        }
    };
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];

    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        // Names picket in the API server's audit log and in its metrics
        // (apiserver_request_total by client), as the webhook does.
        .user_agent(concat!("picket/", env!("CARGO_PKG_VERSION")))
        .timeout(timeout)
        .connect_timeout(timeout)
        // The API server is reached directly; an HTTPS_PROXY meant for
        // other traffic must not capture it (kubeconfig proxy-url is refused).
        .no_proxy()
        .build()
        .map_err(|e| ClientError::TlsSetup(error_chain(&e)))
}

/// kubeconfig `insecure-skip-tls-verify`: any certificate is accepted, but
/// the handshake signatures are still checked (the peer must hold the key of
/// the certificate it shows).
#[derive(Debug)]
struct AcceptAnyServerCert {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AcceptAnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
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

    #[test]
    fn bad_server_urls_and_tls_material_are_refused_up_front() {
        use super::super::kubeconfig::AuthConfig;
        let base = ClusterConfig {
            server: "https://127.0.0.1:6443".into(),
            ca_pem: None,
            insecure_skip_tls_verify: true,
            tls_server_name: None,
            client_identity: None,
            auth: AuthConfig::None,
            namespace: None,
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

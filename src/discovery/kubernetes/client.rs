//! The Kubernetes client: kube-rs's [`kube::Client`] and typed
//! [`Api`]s of k8s-openapi's objects (Pod, EndpointSlice), with what
//! picket needs around them and kube-rs does not do.
//!
//! kube-rs owns the connection (TLS on rustls with ring, the CA,
//! `insecure-skip-tls-verify`, `tls-server-name`, client certificates, the
//! kubeconfig's `proxy-url`), the bearer token (fixed, or a token file it
//! re-reads), the requests and the decoding into typed objects. Kept here:
//!
//! - the credential of an exec plugin (run by `kubeconfig.rs`, with a
//!   deadline), given to kube-rs as a fixed token or client certificate
//!   until it expires;
//! - a token file is read here, trimmed (kube-rs sends a trailing line
//!   break, which no header may carry), each minute and after a 401, the
//!   exec plugin run again after a 401 (kube-rs's client is then built
//!   anew), as client-go does;
//! - a layer of the client's tower stack reads every error answer itself,
//!   so that its `Retry-After` is kept and the error names the request
//!   (kube-rs keeps only the `Status` body);
//! - every call has a budget, in which transient failures (429, 5xx,
//!   timeouts, connection errors, undecodable answers) are retried with
//!   jittered exponential backoff, or after `Retry-After` when the server
//!   sends one (kube-rs retries nothing);
//! - an answer of the wrong shape (a proxy's page, a truncated body,
//!   another object) is not taken for an object.

use std::fmt::Debug;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use http::header::{HeaderValue, RETRY_AFTER, USER_AGENT};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt as _;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::client::{Body, ClientBuilder, DynBody};
use kube::runtime::reflector::Store;
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::time::Instant;
use tower::{BoxError, Layer, Service};

use super::kubeconfig::{ClusterConfig, CredentialError};
use crate::discovery::DiscoveryError;

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
    /// The answer's `Retry-After`, if any.
    pub retry_after: Option<Duration>,
}

impl std::error::Error for ApiError {}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (url, method, msg) = (&self.url, &self.method, suffix(&self.message));
        match self.code {
            401 => write!(
                f,
                "401 Unauthorized from {url}: check the token (or client certificate / exec \
                 plugin) picket authenticates with{msg}"
            ),
            403 => write!(
                f,
                "403 Forbidden from {url} ({method}): the identity picket uses lacks an RBAC \
                 permission (see the Role in docs/kubernetes.md){msg}"
            ),
            code => write!(f, "{method} {url}: {code} {}{msg}", self.reason),
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
    /// kube-rs could not build a client of the configuration (its CA,
    /// client certificate or token file is unusable).
    #[error("client setup: {0}")]
    Setup(String),
    /// A 2xx answer whose body is not the expected object.
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
            ClientError::Tls { .. } | ClientError::Setup(_) | ClientError::InvalidServer(_) => {
                false
            }
        }
    }

    /// What a failed kube-rs request `method url` was: the API server's
    /// answer (read by [`Errors`]), no credential, a TLS failure, an
    /// undecodable body or no answer.
    pub fn from_kube(e: &kube::Error, method: &str, url: &str) -> ClientError {
        let sources = chain(e);
        if let Some(a) = sources.iter().find_map(|c| c.downcast_ref::<ApiError>()) {
            return ClientError::Api(a.clone());
        }
        let (method, url) = (method.to_string(), url.to_string());
        if let Some(m) = sources.iter().find_map(|c| c.downcast_ref::<WrongShape>()) {
            return ClientError::Decode {
                method,
                url,
                message: m.0.clone(),
            };
        }
        if let kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) = e {
            return ClientError::Decode {
                method,
                url,
                message: error_chain(e),
            };
        }
        if let Some(tls) = sources
            .iter()
            .find_map(|c| c.downcast_ref::<rustls::Error>())
        {
            return ClientError::Tls {
                url,
                message: tls.to_string(),
            };
        }
        let timeout = sources.iter().any(|c| {
            c.is::<TimedOut>()
                || c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
        });
        ClientError::Transport {
            method,
            url,
            message: error_chain(e),
            timeout,
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
    retry: RetryPolicy,
}

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("server", &self.inner.server)
            .field("timeout", &self.inner.timeout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

struct Inner {
    server: String,
    cluster: ClusterConfig,
    timeout: Duration,
    /// The settings with the credential of now, and their client, until
    /// the credential expires or a 401 makes it be fetched again.
    current: tokio::sync::Mutex<Option<Current>>,
}

struct Current {
    config: kube::Config,
    client: kube::Client,
    expires: Option<SystemTime>,
}

/// Run an exec plugin again a little before the stated expiry, not at it.
const EXPIRY_MARGIN: Duration = Duration::from_secs(5);

/// How often a token file is read again even when no 401 forced it: bound
/// service-account tokens rotate (about hourly) and the kubelet rewrites
/// the file well before expiry.
pub const TOKEN_FILE_REFRESH: Duration = Duration::from_secs(60);

/// Read `config`'s token file into its token: kube-rs would send the
/// file as it is, and a trailing line break (as an editor leaves it) makes
/// every request fail (client-go trims it). When the file cannot be read,
/// the `last` token is kept (a rotation in progress must not take the
/// backend down). Until when the token is taken as it is.
fn read_token_file(
    config: &mut kube::Config,
    last: Option<&kube::Config>,
) -> Result<Option<SystemTime>, ClientError> {
    let Some(path) = config.auth_info.token_file.take() else {
        return Ok(None);
    };
    let user = &mut config.auth_info;
    match crate::config::read_secret(Path::new(&path)) {
        Ok(t) if !t.trim().is_empty() => user.token = Some(t.trim().to_string().into()),
        res => {
            let error = res.map_or_else(|e| e.to_string(), |_| "the file is empty".into());
            user.token = last.and_then(|l| l.auth_info.token.clone());
            if user.token.is_none() {
                return Err(ClientError::Setup(format!("token file {path}: {error}")));
            }
            tracing::warn!(
                path,
                error,
                "cannot read the token file again; keeping the last token"
            );
        }
    }
    Ok(Some(SystemTime::now() + TOKEN_FILE_REFRESH))
}

impl KubeClient {
    /// A client for `cluster`, with `timeout` for each request.
    ///
    /// Fails when the server URL, the CA, the client certificate or the
    /// token file cannot be used, so that a bad configuration shows at
    /// start-up rather than at the first failover (an exec plugin first
    /// runs at the first request).
    pub fn new(mut cluster: ClusterConfig, timeout: Duration) -> Result<Self, ClientError> {
        let config = &mut cluster.config;
        let server = config
            .cluster_url
            .to_string()
            .trim_end_matches('/')
            .to_string();
        let uri = &config.cluster_url;
        if !matches!(uri.scheme_str(), Some("https" | "http"))
            || uri.host().is_none_or(str::is_empty)
            || uri.query().is_some()
        {
            return Err(ClientError::InvalidServer(server));
        }
        // Each call is bounded as a whole (the answer read within
        // `timeout`); a watch lasts as long as the server keeps it.
        config.connect_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        config.read_timeout = None;
        // Names picket in the API server's audit log and in its metrics
        // (apiserver_request_total by client), as the webhook does.
        config.headers = vec![(
            USER_AGENT,
            HeaderValue::from_static(concat!("picket/", env!("CARGO_PKG_VERSION"))),
        )];
        // The exec plugin first runs at the first request.
        let current = match cluster.exec {
            Some(_) => None,
            None => {
                let mut config = config.clone();
                let expires = read_token_file(&mut config, None)?;
                let client = build(config.clone(), &server)?;
                Some(Current {
                    config,
                    client,
                    expires,
                })
            }
        };
        Ok(KubeClient {
            inner: Arc::new(Inner {
                server,
                cluster,
                timeout,
                current: tokio::sync::Mutex::new(current),
            }),
            retry: RetryPolicy::default(),
        })
    }

    /// The same client with another retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The API server's base URL.
    pub fn server(&self) -> &str {
        &self.inner.server
    }

    /// The typed objects of kind `K` in `namespace`.
    pub fn api<K>(&self, namespace: &str) -> Objects<K> {
        Objects {
            client: self.clone(),
            namespace: namespace.to_string(),
            _kind: std::marker::PhantomData,
        }
    }

    /// The settings and client of the credential of now: built again
    /// when an exec credential expired or after [`reauthenticate`](Self::reauthenticate).
    async fn current(&self) -> Result<(kube::Config, kube::Client), ClientError> {
        let mut g = self.inner.current.lock().await;
        if let Some(c) = g.as_ref()
            && c.expires
                .is_none_or(|e| SystemTime::now() + EXPIRY_MARGIN < e)
        {
            return Ok((c.config.clone(), c.client.clone()));
        }
        let mut config = self.inner.cluster.config.clone();
        let expires = match &self.inner.cluster.exec {
            None => read_token_file(&mut config, g.as_ref().map(|c| &c.config))?,
            Some(exec) => {
                let cred = exec.run().await?;
                let user = &mut config.auth_info;
                user.token = cred.token.map(Into::into);
                if let Some((cert, key)) = cred.identity {
                    user.client_certificate_data = Some(B64.encode(cert));
                    user.client_key_data = Some(B64.encode(key).into());
                }
                cred.expires
            }
        };
        let client = build(config.clone(), &self.inner.server)?;
        *g = Some(Current {
            config: config.clone(),
            client: client.clone(),
            expires,
        });
        Ok((config, client))
    }

    /// A kube-rs client for a watch lasting `watch_timeout` (kube-runtime's
    /// watcher drives it): the credential of now, and a read timeout a
    /// little longer than the watch, so that a connection that died
    /// silently is noticed.
    pub async fn watch_client(&self, watch_timeout: Duration) -> Result<kube::Client, ClientError> {
        let (mut config, _) = self.current().await?;
        config.read_timeout = Some(watch_timeout + self.inner.timeout);
        build(config, &self.inner.server)
    }

    /// The kube-rs client of now (a bounded watch, such as the Service
    /// gate's, needs no read timeout of its own).
    pub async fn kube_client(&self) -> Result<kube::Client, ClientError> {
        Ok(self.current().await?.1)
    }

    /// Forget the current credential after a 401, so that the next
    /// request reads the token file or runs the exec plugin again; whether
    /// there is one to read or run.
    pub async fn reauthenticate(&self) -> bool {
        let cluster = &self.inner.cluster;
        let refreshable = cluster.exec.is_some() || cluster.config.auth_info.token_file.is_some();
        if refreshable {
            *self.inner.current.lock().await = None;
        }
        refreshable
    }

    /// Run `op` (one kube-rs request, `method url` for the errors) within
    /// the timeout, again after transient failures within the retry budget.
    async fn call<T, F, Fut>(&self, method: &str, url: &str, op: F) -> Result<T, ClientError>
    where
        F: Fn(kube::Client) -> Fut,
        Fut: Future<Output = kube::Result<T>>,
    {
        let retry = self.retry;
        let deadline = Instant::now() + retry.budget;
        let mut backoff = retry.initial_backoff;
        let mut reauthenticated = false;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            // No credential (an exec plugin failed) is reported at once.
            let client = self.kube_client().await?;
            let err = match tokio::time::timeout(self.inner.timeout, op(client)).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) => ClientError::from_kube(&e, method, url),
                Err(_) => ClientError::from_kube(
                    &kube::Error::Service(Box::new(TimedOut(self.inner.timeout))),
                    method,
                    url,
                ),
            };
            match &err {
                ClientError::Api(a) if a.code == 401 && !reauthenticated => {
                    // An expired token or exec credential: fetch a new one, once.
                    reauthenticated = true;
                    if self.reauthenticate().await {
                        tracing::info!(url, "401 from the API server; refreshing the credential");
                        continue;
                    }
                    return Err(err);
                }
                ClientError::Api(a)
                    if matches!(a.code, 429 | 500 | 502 | 503 | 504)
                        || (a.retry_after.is_some() && a.code >= 500) => {}
                ClientError::Transport { .. } | ClientError::Decode { .. } => {}
                _ => return Err(err),
            }
            let retry_after = match &err {
                ClientError::Api(a) => a.retry_after,
                _ => None,
            };
            let wait = retry_after.unwrap_or_else(|| jitter(backoff));
            backoff = (backoff * 2).min(retry.max_backoff);
            if Instant::now() + wait > deadline {
                tracing::warn!(url, attempts = attempt, error = %err,
                    "giving up: the retry budget is spent");
                return Err(err);
            }
            tracing::debug!(url, attempt, wait = ?wait, error = %err, "retrying");
            tokio::time::sleep(wait).await;
        }
    }
}

/// The objects of one kind in one namespace: kube-rs's [`Api`] through
/// the retry budget, with the answers checked.
#[derive(Clone)]
pub struct Objects<K> {
    client: KubeClient,
    namespace: String,
    _kind: std::marker::PhantomData<fn() -> K>,
}

impl<K> std::fmt::Debug for Objects<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Objects")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl<K> Objects<K>
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug
        + Send
        + Sync
        + 'static,
{
    fn api(&self, client: kube::Client) -> Api<K> {
        Api::namespaced(client, &self.namespace)
    }

    /// The URL of the collection, or of the object `name`, for errors.
    fn url(&self, name: Option<&str>) -> String {
        let path = K::url_path(&(), Some(&self.namespace));
        match name {
            Some(n) => format!("{}{path}/{n}", self.client.server()),
            None => format!("{}{path}", self.client.server()),
        }
    }

    /// GET one object.
    pub async fn get(&self, name: &str) -> Result<K, ClientError> {
        self.client
            .call("GET", &self.url(Some(name)), |c| async move {
                named(self.api(c).get(name).await?, Some(name))
            })
            .await
    }

    /// GET one object; `None` when it does not exist.
    pub async fn get_opt(&self, name: &str) -> Result<Option<K>, ClientError> {
        match self.get(name).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// LIST the objects, optionally by label selector. The answer must be
    /// a list (`items` present): an object without it is not an empty one.
    pub async fn list(&self, label_selector: Option<&str>) -> Result<Vec<K>, ClientError> {
        let mut params = ListParams::default();
        if let Some(s) = label_selector {
            params = params.labels(s);
        }
        let params = &params;
        self.client
            .call("GET", &self.url(None), |c| async move {
                Ok(self.api(c).list(params).await?.items)
            })
            .await
    }

    /// POST a new object.
    pub async fn create(&self, obj: &K) -> Result<K, ClientError> {
        let name = obj.meta().name.as_deref();
        self.client
            .call("POST", &self.url(None), |c| async move {
                named(self.api(c).create(&PostParams::default(), obj).await?, name)
            })
            .await
    }

    /// PATCH `name` with a JSON merge patch (RFC 7386: `null` deletes a
    /// key, lists are replaced whole); a `metadata.resourceVersion` in it
    /// makes the write conditional (409 when the object changed since).
    pub async fn merge_patch<P: Serialize + Debug + Sync>(
        &self,
        name: &str,
        patch: &P,
    ) -> Result<K, ClientError> {
        self.client
            .call("PATCH", &self.url(Some(name)), |c| async move {
                let p = Patch::Merge(patch);
                named(
                    self.api(c).patch(name, &PatchParams::default(), &p).await?,
                    Some(name),
                )
            })
            .await
    }
}

/// `obj`, when it is the object named `name` (when known): a proxy's
/// answer or another object must not be taken for it.
fn named<K: kube::Resource>(obj: K, name: Option<&str>) -> kube::Result<K> {
    let wrong = match (name, obj.meta().name.as_deref()) {
        (Some(want), Some(n)) if n != want => format!("the answer is object {n:?}, not {want:?}"),
        (Some(want), None) => format!("the answer has no metadata.name (expected {want:?})"),
        _ => return Ok(obj),
    };
    Err(kube::Error::Service(Box::new(WrongShape(wrong))))
}

/// A 2xx answer that decoded but is not the object asked for.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct WrongShape(String);

/// A request that took longer than the client's timeout.
#[derive(Debug, thiserror::Error)]
#[error("no complete answer within {0:?}")]
struct TimedOut(Duration);

/// The outermost layer of every kube-rs client picket builds: see [`Errors`].
struct ErrorsLayer {
    server: Arc<str>,
}

impl<S> Layer<S> for ErrorsLayer {
    type Service = Errors<S>;

    fn layer(&self, inner: S) -> Errors<S> {
        Errors {
            inner,
            server: self.server.clone(),
        }
    }
}

/// Turns each error answer into an [`ApiError`] carrying the request, the
/// decoded `Status` and `Retry-After` (a 200, a watch's stream, passes as
/// it is).
struct Errors<S> {
    inner: S,
    server: Arc<str>,
}

type DynResponse = Response<Box<DynBody>>;

/// The service stack kube-rs builds from a [`kube::Config`].
type KubeStack = tower::util::BoxService<Request<Body>, DynResponse, BoxError>;

impl<S> Service<Request<Body>> for Errors<S>
where
    S: Service<Request<Body>, Response = DynResponse, Error = BoxError>,
    S::Future: Send + 'static,
{
    type Response = DynResponse;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<DynResponse, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let method = req.method().clone();
        let url = format!("{}{}", self.server, req.uri().path());
        let answer = self.inner.call(req);
        Box::pin(async move {
            let resp = answer.await?;
            let status = resp.status();
            if let Some(w) = resp.headers().get("warning") {
                tracing::debug!(url, warning = ?w, "API server warning");
            }
            if status.is_success() {
                return Ok(resp);
            }
            let retry_after = resp
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = resp.into_body().collect().await?.to_bytes();
            let mut error = decode_status(&method, &url, status, &String::from_utf8_lossy(&body));
            error.retry_after = retry_after;
            Err(Box::new(error) as BoxError)
        })
    }
}

/// What a failed list or watch of kube-runtime's watcher was, `url`
/// naming the collection.
pub fn watch_error(e: &watcher::Error, url: &str) -> ClientError {
    use watcher::Error as W;
    match e {
        W::InitialListFailed(k) => ClientError::from_kube(k, "LIST", url),
        W::WatchStartFailed(k) | W::WatchFailed(k) => ClientError::from_kube(k, "WATCH", url),
        // A `Status` in the stream (410 Expired: the watcher lists again).
        W::WatchError(r) => ClientError::Api(ApiError {
            method: "WATCH".into(),
            url: url.to_string(),
            code: r.code,
            reason: r.reason.clone(),
            message: r.message.clone(),
            retry_after: None,
        }),
        other => ClientError::Decode {
            method: "WATCH".into(),
            url: url.to_string(),
            message: other.to_string(),
        },
    }
}

/// kube-runtime's watcher of `api` (`config`: its selector, timeout)
/// into a reflector store, paused by `backoff` after each error: the
/// store, and a stream with an `Ok` each time the store holds a whole
/// list or a change since, and each error.
pub fn watch_store<K>(
    api: Api<K>,
    config: watcher::Config,
    backoff: watcher::ExponentialBackoff,
) -> (Store<K>, BoxStream<'static, Result<(), watcher::Error>>)
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let changes = reflector(writer, watcher(api, config))
        .backoff(backoff)
        .filter_map(|ev| {
            futures::future::ready(match ev {
                // The store shows the list once it is whole.
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
                Ok(_) => Some(Ok(())),
                Err(e) => Some(Err(e)),
            })
        })
        .boxed();
    (store, changes)
}

/// The backoff of kube-runtime's watcher after a failed list or watch:
/// from `first`, doubled up to `max`, jittered (up to twice as long);
/// back to `first` after any event.
pub fn watch_backoff(first: Duration, max: Duration) -> watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(first)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
        .into()
}

/// Between half and all of `d`, so that daemons retrying together spread out.
fn jitter(d: Duration) -> Duration {
    let f: f64 = rand::random_range(0.5..=1.0);
    d.mul_f64(f)
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

/// The fields of a `Status` body picket reports (kube-core's `Status`
/// needs `code` and `status`, which a proxy's or an old server's body may
/// lack).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct StatusBody {
    kind: Option<String>,
    reason: Option<String>,
    message: Option<String>,
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
        retry_after: None,
    }
}

pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
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

/// The kube-rs client of `config`, with picket's [`Errors`] layer
/// (`server` names the requests in its errors).
fn build(config: kube::Config, server: &str) -> Result<kube::Client, ClientError> {
    crate::tls::install_crypto_provider();
    // kube-rs's client spawns its connection pool's task: outside a Tokio
    // runtime it would panic.
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ClientError::Setup(
            "the Kubernetes client must be built inside the Tokio runtime".into(),
        ));
    }
    let stack = ClientBuilder::<KubeStack>::try_from(config)
        .map_err(|e| ClientError::Setup(error_chain(&e)))?;
    Ok(stack
        .with_layer(&ErrorsLayer {
            server: server.into(),
        })
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_of_the_wrong_shape_are_refused() {
        use k8s_openapi::api::core::v1::Pod;
        let pod: Pod = serde_json::from_value(serde_json::json!(
            {"kind": "Pod", "metadata": {"name": "cache-0"}}))
        .unwrap();
        assert!(named(pod.clone(), Some("cache-0")).is_ok());
        assert!(named(pod.clone(), None).is_ok());
        let e = named(pod, Some("cache-1")).unwrap_err();
        let e = ClientError::from_kube(&e, "GET", "https://h/x");
        assert!(matches!(&e, ClientError::Decode { .. }), "{e}");
        assert!(
            e.to_string().contains("\"cache-0\", not \"cache-1\""),
            "{e}"
        );
        let e = named(Pod::default(), Some("cache-0")).unwrap_err();
        assert!(error_chain(&e).contains("no metadata.name"), "{e}");
        // What kube-rs decodes an answer into refuses what is not one.
        for bad in ["null", "[1]", "\"x\"", r#"{"kind":"PodList","items":"x"}"#] {
            assert!(serde_json::from_str::<Pod>(bad).is_err(), "{bad}");
            assert!(
                serde_json::from_str::<kube::core::ObjectList<Pod>>(bad).is_err(),
                "{bad}"
            );
        }
        let no_items = r#"{"kind":"Pod","metadata":{"name":"p"}}"#;
        assert!(serde_json::from_str::<kube::core::ObjectList<Pod>>(no_items).is_err());
        let null_items = r#"{"apiVersion":"v1","kind":"PodList","metadata":{},"items":null}"#;
        let l: kube::core::ObjectList<Pod> = serde_json::from_str(null_items).unwrap();
        assert!(l.items.is_empty());
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
        let t = Duration::from_secs(1);
        let cluster = |server: &str, ca: Option<&[u8]>, id: Option<&str>| {
            let mut config = kube::Config::new(server.parse().unwrap());
            config.root_cert = ca.map(|c| vec![c.to_vec()]);
            config.auth_info.client_certificate_data = id.map(|s| B64.encode(s));
            config.auth_info.client_key_data = id.map(|s| B64.encode(s).into());
            ClusterConfig { config, exec: None }
        };
        assert!(KubeClient::new(cluster("https://127.0.0.1:6443", None, None), t).is_ok());
        for bad in ["ftp://h", "https://h?x=1", "/relative"] {
            let e = KubeClient::new(cluster(bad, None, None), t).unwrap_err();
            assert!(matches!(e, ClientError::InvalidServer(_)), "{bad}: {e}");
            assert!(!e.is_transient());
        }
        let e = KubeClient::new(cluster("https://h", Some(b"not DER"), None), t).unwrap_err();
        assert!(
            matches!(e, ClientError::Setup(_)) && !e.is_transient(),
            "{e}"
        );
        let junk = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let e = KubeClient::new(cluster("https://h", None, Some(junk)), t).unwrap_err();
        assert!(matches!(e, ClientError::Setup(_)), "{e}");
    }
}

//! The webhook backend: POST every fence and publication as JSON.
//!
//! Body (see `docs/discovery.md`):
//!
//! ```json
//! {"group":"cache","epoch":7,"event":"publish","reporter":"leader",
//!  "old_master":"10.1.0.5:6379","master":"10.1.0.6:6379",
//!  "replicas":["10.1.0.7:6379"],"timestamp":"2025-05-01T12:00:00.123Z"}
//! ```
//!
//! For a fence, `event` is `fence`, `old_master` the fenced master,
//! `master` is `null` and `replicas` empty. Optional headers:
//! `Authorization: Bearer <token>` (token file re-read at every write) and
//! `X-Picket-Signature: sha256=<hex HMAC-SHA256 of the body>` (key file
//! re-read at every write).
//!
//! Answers: 2xx is success. 409 with `{"epoch": N}` and N above ours means
//! the receiver holds a newer topology ([`DiscoveryError::Stale`]). Other
//! 4xx except 408 and 429 are permanent; 5xx, 408, 429, other 409s,
//! connection errors and timeouts are transient.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hmac::{KeyInit, Mac};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use reqwest::{Certificate, Client, StatusCode, Url};
use serde::Serialize;

use super::delivered::Delivered;
use super::{Backend, BoxFuture, DiscoveryError, Fence, Reporter, Topology};
use crate::addr::Addr;
use crate::config::{WebhookConfig, read_secret};

/// Header carrying the body's HMAC-SHA256 signature.
pub const SIGNATURE_HEADER: &str = "X-Picket-Signature";

/// How much of a response body is read (for the 409 epoch and error text).
const BODY_LIMIT: usize = 64 * 1024;
/// How much of a response body goes into an error message.
const ERROR_BODY_LIMIT: usize = 256;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The JSON body of every webhook request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WebhookBody {
    /// The group.
    pub group: String,
    /// The config epoch of this write.
    pub epoch: u64,
    /// `fence` or `publish`.
    pub event: &'static str,
    /// `leader` or `observer` (a fence always comes from the leader).
    pub reporter: Reporter,
    /// The master before this change (fence: the fenced master), if known.
    pub old_master: Option<Addr>,
    /// The new master; `null` for a fence.
    pub master: Option<Addr>,
    /// Known replicas (empty for a fence).
    pub replicas: Vec<Addr>,
    /// When the request was made (RFC 3339, UTC).
    pub timestamp: String,
}

impl WebhookBody {
    /// The body announcing a fence.
    pub fn fence(f: &Fence) -> Self {
        WebhookBody {
            group: f.group.clone(),
            epoch: f.epoch,
            event: "fence",
            reporter: Reporter::Leader,
            old_master: Some(f.old_master.clone()),
            master: None,
            replicas: Vec::new(),
            timestamp: super::file::now_rfc3339(),
        }
    }

    /// The body announcing a topology.
    pub fn publish(t: &Topology) -> Self {
        WebhookBody {
            group: t.group.clone(),
            epoch: t.epoch,
            event: "publish",
            reporter: t.reporter,
            old_master: t.old_master.clone(),
            master: Some(t.master.clone()),
            replicas: t.replicas.clone(),
            timestamp: super::file::now_rfc3339(),
        }
    }
}

/// POSTs fences and topologies to one URL.
pub struct WebhookBackend {
    url: Url,
    /// The URL without credentials or query, for logs and errors.
    shown: String,
    client: Client,
    timeout: Duration,
    token_file: Option<PathBuf>,
    hmac_key_file: Option<PathBuf>,
    required: bool,
    delivered: Delivered,
}

impl std::fmt::Debug for WebhookBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Not the full URL: its query may hold a secret.
        f.debug_struct("WebhookBackend")
            .field("url", &self.shown)
            .field("timeout", &self.timeout)
            .field("token_file", &self.token_file)
            .field("hmac_key_file", &self.hmac_key_file)
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

impl WebhookBackend {
    /// A backend for `cfg`. Fails on a URL that is not http(s) or a CA
    /// file that cannot be read or holds no certificate.
    pub fn new(cfg: &WebhookConfig) -> Result<Self, DiscoveryError> {
        let url = Url::parse(&cfg.url).map_err(|e| {
            DiscoveryError::Permanent(format!("webhook: invalid url {:?}: {e}", cfg.url))
        })?;
        if url.scheme() != "http" && url.scheme() != "https" {
            return Err(DiscoveryError::Permanent(format!(
                "webhook: url scheme must be http or https, not {:?}",
                url.scheme()
            )));
        }
        let shown = shown_url(&url);
        crate::tls::install_crypto_provider();
        let mut builder = Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout)
            // A webhook that redirects is misconfigured; following it
            // could carry the token somewhere unexpected.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("picket/", env!("CARGO_PKG_VERSION")));
        if let Some(ca) = &cfg.ca_file {
            builder = builder.tls_certs_only(load_ca(ca)?);
        }
        let client = builder.build().map_err(|e| {
            DiscoveryError::Permanent(format!("webhook {shown}: cannot build the client: {e}"))
        })?;
        Ok(WebhookBackend {
            url,
            shown,
            client,
            timeout: cfg.timeout,
            token_file: cfg.token_file.clone(),
            hmac_key_file: cfg.hmac_key_file.clone(),
            required: cfg.required,
            delivered: Delivered::default(),
        })
    }

    /// POST `body` once and classify the answer.
    pub async fn send(&self, body: &WebhookBody) -> Result<(), DiscoveryError> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| DiscoveryError::Permanent(format!("webhook: encode: {e}")))?;
        let mut req = self
            .client
            .post(self.url.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(path) = &self.token_file {
            let token = self.secret(path, "token")?;
            let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                // Never echo the token itself.
                DiscoveryError::Permanent(format!(
                    "webhook {}: token in {} is not a valid header value",
                    self.shown,
                    path.display()
                ))
            })?;
            value.set_sensitive(true);
            req = req.header(AUTHORIZATION, value);
        }
        if let Some(path) = &self.hmac_key_file {
            let key = self.secret(path, "hmac key")?;
            req = req.header(SIGNATURE_HEADER, signature(key.as_bytes(), &bytes)?);
        }
        let req = req.body(bytes);

        // reqwest's own timeout covers connect, request and body; this
        // outer one guarantees the bound whatever happens inside.
        let exchange = async {
            let resp = req.send().await?;
            let status = resp.status();
            let body = read_limited(resp).await?;
            Ok::<_, reqwest::Error>((status, body))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Err(_) => Err(self.timed_out()),
            Ok(Err(e)) if e.is_timeout() => Err(self.timed_out()),
            Ok(Err(e)) => Err(DiscoveryError::Transient(format!(
                "webhook {}: {}",
                self.shown,
                error_chain(&e)
            ))),
            Ok(Ok((status, resp_body))) => self.classify(status, &resp_body, body.epoch),
        }
    }

    fn timed_out(&self) -> DiscoveryError {
        DiscoveryError::Transient(format!(
            "webhook {}: timed out after {}",
            self.shown,
            humantime::format_duration(self.timeout)
        ))
    }

    fn secret(&self, path: &Path, what: &str) -> Result<String, DiscoveryError> {
        read_secret(path).map_err(|e| {
            DiscoveryError::Permanent(format!(
                "webhook {}: cannot read the {what} file {}: {e}",
                self.shown,
                path.display()
            ))
        })
    }

    fn classify(&self, status: StatusCode, body: &[u8], ours: u64) -> Result<(), DiscoveryError> {
        if status.is_success() {
            return Ok(());
        }
        if status == StatusCode::CONFLICT {
            #[derive(serde::Deserialize)]
            struct Conflict {
                epoch: u64,
            }
            if let Ok(c) = serde_json::from_slice::<Conflict>(body)
                && c.epoch > ours
            {
                return Err(DiscoveryError::Stale {
                    stored: c.epoch,
                    ours,
                });
            }
        }
        let text = String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_LIMIT)]);
        let msg = format!("webhook {}: HTTP {status}: {}", self.shown, text.trim());
        let transient = status.is_server_error()
            || status == StatusCode::REQUEST_TIMEOUT
            || status == StatusCode::TOO_MANY_REQUESTS
            || status == StatusCode::CONFLICT;
        if transient {
            Err(DiscoveryError::Transient(msg))
        } else {
            Err(DiscoveryError::Permanent(msg))
        }
    }
}

/// `sha256=<hex>` of HMAC-SHA256(key, body).
pub fn signature(key: &[u8], body: &[u8]) -> Result<String, DiscoveryError> {
    // HMAC takes keys of any length, so this error is not expected; it is
    // still an error rather than a request with a bogus signature.
    let mut mac = HmacSha256::new_from_slice(key)
        .map_err(|e| DiscoveryError::Permanent(format!("webhook: hmac key: {e}")))?;
    mac.update(body);
    Ok(format!(
        "sha256={}",
        hex::encode(mac.finalize().into_bytes())
    ))
}

fn load_ca(path: &Path) -> Result<Vec<Certificate>, DiscoveryError> {
    let pem = std::fs::read(path).map_err(|e| {
        DiscoveryError::Permanent(format!(
            "webhook: cannot read ca_file {}: {e}",
            path.display()
        ))
    })?;
    let certs = Certificate::from_pem_bundle(&pem).map_err(|e| {
        DiscoveryError::Permanent(format!("webhook: bad ca_file {}: {e}", path.display()))
    })?;
    if certs.is_empty() {
        return Err(DiscoveryError::Permanent(format!(
            "webhook: ca_file {} holds no certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// The URL as shown in logs: no user info, no query, no fragment (any of
/// them may hold a secret).
fn shown_url(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

/// Read at most [`BODY_LIMIT`] bytes of the response body.
async fn read_limited(mut resp: reqwest::Response) -> Result<Vec<u8>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = BODY_LIMIT - out.len();
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= BODY_LIMIT {
            break;
        }
    }
    Ok(out)
}

/// reqwest's top-level message ("error sending request") hides the cause.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

impl Backend for WebhookBackend {
    fn kind(&self) -> &'static str {
        "webhook"
    }

    fn name(&self) -> String {
        format!("webhook:{}", self.shown)
    }

    fn required(&self) -> bool {
        self.required
    }

    fn fence<'a>(&'a self, fence: &'a Fence) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        Box::pin(async move {
            self.delivered
                .fence_once(fence, || async move {
                    self.send(&WebhookBody::fence(fence)).await
                })
                .await
        })
    }

    fn publish<'a>(&'a self, t: &'a Topology) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        Box::pin(async move {
            self.delivered
                .publish_once(
                    t,
                    || async move { self.send(&WebhookBody::publish(t)).await },
                )
                .await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::body::Bytes;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode as AxStatus};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use serde_json::json;
    use tokio::net::{TcpListener, TcpStream};
    use tokio::time::Instant;

    use super::*;
    use crate::discovery::runner::DiscoveryRunner;

    /// What the test server answers to the next request.
    #[derive(Clone)]
    enum Reply {
        Status(u16, &'static str),
        /// Accept the request and never answer.
        Hang,
    }

    /// One request the test server received.
    #[derive(Clone)]
    struct Seen {
        headers: HeaderMap,
        body: Bytes,
    }

    #[derive(Clone, Default)]
    struct Hook {
        seen: Arc<Mutex<Vec<Seen>>>,
        replies: Arc<Mutex<VecDeque<Reply>>>,
    }

    impl Hook {
        fn reply(&self, r: Reply) {
            self.replies.lock().unwrap().push_back(r);
        }
        fn seen(&self) -> Vec<Seen> {
            self.seen.lock().unwrap().clone()
        }
    }

    async fn handle(State(h): State<Hook>, headers: HeaderMap, body: Bytes) -> Response {
        h.seen.lock().unwrap().push(Seen { headers, body });
        let reply = h.replies.lock().unwrap().pop_front();
        match reply.unwrap_or(Reply::Status(204, "")) {
            Reply::Status(code, body) => (AxStatus::from_u16(code).unwrap(), body).into_response(),
            Reply::Hang => std::future::pending().await,
        }
    }

    fn app(hook: &Hook) -> Router {
        Router::new()
            .route("/hook", post(handle))
            .with_state(hook.clone())
    }

    /// A plain HTTP test server on 127.0.0.1; it lives as long as the test's
    /// runtime.
    async fn serve(hook: &Hook) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(axum::serve(listener, app(hook)).into_future());
        addr
    }

    fn config(url: String) -> WebhookConfig {
        WebhookConfig {
            url,
            timeout: Duration::from_secs(5),
            token_file: None,
            hmac_key_file: None,
            ca_file: None,
            required: true,
        }
    }

    fn topo(epoch: u64) -> Topology {
        Topology {
            group: "cache".into(),
            epoch,
            master: "10.0.0.2:6379".parse().unwrap(),
            old_master: Some("10.0.0.1:6379".parse().unwrap()),
            replicas: vec!["10.0.0.3:6379".parse().unwrap()],
            reporter: Reporter::Leader,
        }
    }

    /// The body as JSON, after checking its timestamp is recent RFC 3339.
    fn body_without_time(body: &[u8]) -> serde_json::Value {
        let mut v: serde_json::Value = serde_json::from_slice(body).unwrap();
        let ts = v["timestamp"].as_str().unwrap().to_string();
        let t = humantime::parse_rfc3339(&ts).unwrap();
        let age = std::time::SystemTime::now().duration_since(t).unwrap();
        assert!(age < Duration::from_secs(60), "timestamp {ts}");
        v.as_object_mut().unwrap().remove("timestamp");
        v
    }

    #[tokio::test]
    async fn posts_the_documented_body_with_token_and_signature() {
        let hook = Hook::default();
        let addr = serve(&hook).await;
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        let key_file = dir.path().join("hmac");
        std::fs::write(&token_file, "s3cret-token\n").unwrap();
        std::fs::write(&key_file, "signing-key\n").unwrap();
        let mut cfg = config(format!("http://{addr}/hook"));
        cfg.token_file = Some(token_file.clone());
        cfg.hmac_key_file = Some(key_file);
        let b = WebhookBackend::new(&cfg).unwrap();
        b.publish(&topo(7)).await.unwrap();

        let seen = hook.seen();
        assert_eq!(seen.len(), 1);
        let req = &seen[0];
        assert_eq!(req.headers["content-type"], "application/json");
        assert_eq!(req.headers["authorization"], "Bearer s3cret-token");
        let body = body_without_time(&req.body);
        assert_eq!(body.as_object().unwrap().len(), 7);
        assert_eq!(
            body,
            json!({
                "group": "cache",
                "epoch": 7,
                "event": "publish",
                "reporter": "leader",
                "old_master": "10.0.0.1:6379",
                "master": "10.0.0.2:6379",
                "replicas": ["10.0.0.3:6379"],
            })
        );
        // Verify the signature independently, over the exact bytes received.
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"signing-key").unwrap();
        mac.update(&req.body);
        let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        assert_eq!(req.headers[SIGNATURE_HEADER], expected.as_str());
        assert_eq!(expected.len(), "sha256=".len() + 64);

        // The token is re-read at every write.
        std::fs::write(&token_file, "rotated\n").unwrap();
        b.publish(&topo(8)).await.unwrap();
        assert_eq!(hook.seen()[1].headers["authorization"], "Bearer rotated");
    }

    #[tokio::test]
    async fn fence_body_has_no_master() {
        let hook = Hook::default();
        let addr = serve(&hook).await;
        let b = WebhookBackend::new(&config(format!("http://{addr}/hook"))).unwrap();
        b.fence(&Fence {
            group: "cache".into(),
            epoch: 3,
            old_master: "10.0.0.1:6379".parse().unwrap(),
        })
        .await
        .unwrap();
        let seen = hook.seen();
        assert_eq!(seen.len(), 1);
        assert!(!seen[0].headers.contains_key("authorization"));
        assert!(!seen[0].headers.contains_key(SIGNATURE_HEADER));
        assert_eq!(
            body_without_time(&seen[0].body),
            json!({
                "group": "cache",
                "epoch": 3,
                "event": "fence",
                "reporter": "leader",
                "old_master": "10.0.0.1:6379",
                "master": null,
                "replicas": [],
            })
        );
    }

    #[tokio::test]
    async fn same_write_is_sent_once_and_lower_epochs_are_refused() {
        let hook = Hook::default();
        let addr = serve(&hook).await;
        let b = WebhookBackend::new(&config(format!("http://{addr}/hook"))).unwrap();
        b.publish(&topo(5)).await.unwrap();
        let mut observer = topo(5);
        observer.reporter = Reporter::Observer;
        b.publish(&observer).await.unwrap();
        assert_eq!(hook.seen().len(), 1);
        assert_eq!(
            b.publish(&topo(4)).await,
            Err(DiscoveryError::Stale { stored: 5, ours: 4 })
        );
        assert_eq!(hook.seen().len(), 1);
    }

    #[tokio::test]
    async fn answers_are_classified() {
        let hook = Hook::default();
        let addr = serve(&hook).await;
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "s3cret-token").unwrap();
        let mut cfg = config(format!("http://{addr}/hook?key=hidden"));
        cfg.token_file = Some(token_file);
        let b = WebhookBackend::new(&cfg).unwrap();
        let cases: Vec<(Reply, &str)> = vec![
            (Reply::Status(200, "ok"), "ok"),
            (Reply::Status(202, ""), "ok"),
            (Reply::Status(409, r#"{"epoch": 9}"#), "stale"),
            (Reply::Status(409, r#"{"epoch": 5}"#), "transient"),
            (Reply::Status(409, "conflict"), "transient"),
            (Reply::Status(500, "oops"), "transient"),
            (Reply::Status(503, ""), "transient"),
            (Reply::Status(408, ""), "transient"),
            (Reply::Status(429, ""), "transient"),
            (Reply::Status(400, "bad"), "permanent"),
            (Reply::Status(401, "who are you"), "permanent"),
            (Reply::Status(404, ""), "permanent"),
            (Reply::Status(302, ""), "permanent"),
        ];
        for (reply, want) in cases {
            hook.reply(reply);
            // `send` bypasses the idempotence record: every case is a request.
            let got = b.send(&WebhookBody::publish(&topo(5))).await;
            let label = match &got {
                Ok(()) => "ok",
                Err(e) => e.metric_label(),
            };
            assert_eq!(label, want, "{got:?}");
            if let Err(e) = &got {
                let text = e.to_string();
                assert!(!text.contains("s3cret"), "token leaked: {text}");
                assert!(!text.contains("hidden"), "query leaked: {text}");
            }
            if want == "stale" {
                assert_eq!(got, Err(DiscoveryError::Stale { stored: 9, ours: 5 }));
            }
        }
        assert_eq!(hook.seen().len(), 13);
        assert!(!format!("{b:?}").contains("hidden"));
        assert!(
            hook.seen()
                .iter()
                .all(|s| s.headers["authorization"] == "Bearer s3cret-token")
        );
    }

    #[tokio::test]
    async fn server_errors_are_retried_by_the_runner() {
        let hook = Hook::default();
        let addr = serve(&hook).await;
        hook.reply(Reply::Status(500, "down"));
        hook.reply(Reply::Status(503, "still down"));
        let b: Arc<dyn Backend> =
            Arc::new(WebhookBackend::new(&config(format!("http://{addr}/hook"))).unwrap());
        let r = DiscoveryRunner::new("cache", vec![b]);
        r.publish(topo(2), Duration::from_secs(20)).await.unwrap();
        assert_eq!(hook.seen().len(), 3);
        let st = &r.status()[0];
        assert_eq!((st.writes_failed, st.writes_ok), (2, 1));
        assert_eq!(st.kind, "webhook");
        assert_eq!(st.name, format!("webhook:http://{addr}/hook"));
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out() {
        let hook = Hook::default();
        let addr = serve(&hook).await;
        hook.reply(Reply::Hang);
        let mut cfg = config(format!("http://{addr}/hook"));
        cfg.timeout = Duration::from_millis(300);
        let b = WebhookBackend::new(&cfg).unwrap();
        let start = Instant::now();
        let err = b.publish(&topo(1)).await.unwrap_err();
        let took = Instant::now() - start;
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert!(
            matches!(&err, DiscoveryError::Transient(m) if m.ends_with("timed out after 300ms")),
            "{err:?}"
        );
        assert_eq!(hook.seen().len(), 1);
    }

    #[tokio::test]
    async fn an_unreachable_url_is_transient() {
        // Bind then drop: nothing listens on that loopback port any more.
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let b = WebhookBackend::new(&config(format!("http://{addr}/hook"))).unwrap();
        let err = b.publish(&topo(1)).await.unwrap_err();
        assert!(matches!(err, DiscoveryError::Transient(_)), "{err:?}");
    }

    #[tokio::test]
    async fn unreadable_secrets_and_bad_config_are_permanent() {
        let hook = Hook::default();
        let addr = serve(&hook).await;
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(format!("http://{addr}/hook"));
        cfg.token_file = Some(dir.path().join("missing"));
        let b = WebhookBackend::new(&cfg).unwrap();
        let err = b.publish(&topo(1)).await.unwrap_err();
        assert!(matches!(err, DiscoveryError::Permanent(_)), "{err:?}");
        assert!(hook.seen().is_empty());

        let bad = WebhookBackend::new(&config("ftp://127.0.0.1/x".into()));
        assert!(matches!(bad, Err(DiscoveryError::Permanent(_))));
        let mut cfg = config(format!("https://{addr}/hook"));
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate").unwrap();
        cfg.ca_file = Some(ca);
        assert!(matches!(
            WebhookBackend::new(&cfg),
            Err(DiscoveryError::Permanent(_))
        ));
    }

    // === HTTPS ===

    /// Accepts TLS connections for axum::serve.
    struct TlsListener {
        tcp: TcpListener,
        acceptor: tokio_rustls::TlsAcceptor,
    }

    impl axum::serve::Listener for TlsListener {
        type Io = tokio_rustls::server::TlsStream<TcpStream>;
        type Addr = SocketAddr;

        async fn accept(&mut self) -> (Self::Io, Self::Addr) {
            loop {
                let Ok((tcp, addr)) = self.tcp.accept().await else {
                    continue;
                };
                // A client that rejects our certificate fails here; keep
                // serving the others.
                let handshake = self.acceptor.accept(tcp);
                if let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(5), handshake).await {
                    return (tls, addr);
                }
            }
        }

        fn local_addr(&self) -> std::io::Result<Self::Addr> {
            self.tcp.local_addr()
        }
    }

    /// A CA (PEM) and an HTTPS test server on 127.0.0.1 with a certificate
    /// it signed.
    async fn serve_tls(hook: &Hook) -> (String, SocketAddr) {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

        crate::tls::install_crypto_provider();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "picket test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);

        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let cert = params.signed_by(&key, &issuer).unwrap();

        let chain = vec![CertificateDer::from(cert.der().to_vec())];
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let listener = TlsListener {
            tcp,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        };
        tokio::spawn(axum::serve(listener, app(hook)).into_future());
        (ca_cert.pem(), addr)
    }

    #[tokio::test]
    async fn https_with_a_custom_ca() {
        let hook = Hook::default();
        let (ca_pem, addr) = serve_tls(&hook).await;
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca_pem).unwrap();

        // Without the CA the server is not trusted: no request arrives.
        let untrusted = WebhookBackend::new(&config(format!("https://{addr}/hook"))).unwrap();
        let err = untrusted.publish(&topo(1)).await.unwrap_err();
        assert!(
            matches!(&err, DiscoveryError::Transient(m) if m.contains("certificate")),
            "{err:?}"
        );
        assert!(hook.seen().is_empty());

        let mut cfg = config(format!("https://{addr}/hook"));
        cfg.ca_file = Some(ca_file);
        let b = WebhookBackend::new(&cfg).unwrap();
        b.publish(&topo(1)).await.unwrap();
        let seen = hook.seen();
        assert_eq!(seen.len(), 1);
        assert_eq!(body_without_time(&seen[0].body)["master"], "10.0.0.2:6379");
    }
}

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
#[derive(Debug)]
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
            req = req.header(SIGNATURE_HEADER, signature(key.as_bytes(), &bytes));
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
            if let Ok(c) = serde_json::from_slice::<Conflict>(body) {
                if c.epoch > ours {
                    return Err(DiscoveryError::Stale {
                        stored: c.epoch,
                        ours,
                    });
                }
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
pub fn signature(key: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length; this cannot fail.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
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
            if !self.delivered.check_fence(fence)? {
                return Ok(());
            }
            self.send(&WebhookBody::fence(fence)).await?;
            self.delivered.record_fence(fence);
            Ok(())
        })
    }

    fn publish<'a>(&'a self, t: &'a Topology) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        Box::pin(async move {
            if !self.delivered.check_publish(t)? {
                return Ok(());
            }
            self.send(&WebhookBody::publish(t)).await?;
            self.delivered.record_publish(t);
            Ok(())
        })
    }
}

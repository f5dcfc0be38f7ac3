//! HTTP on `http_listen`: `/metrics` (Prometheus), `/healthz`, `/readyz`
//! and `/v1/status` (JSON: groups, instances, peers, epochs), over TLS when
//! `[daemon.tls] http = true`, with an optional plaintext listener for
//! the probes and `/metrics`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::daemon::Daemon;
use crate::group::view::GroupView;
use crate::metrics as m;
use crate::tls::Shared;

/// The body of `/v1/status`.
#[derive(Debug, Serialize)]
pub struct Status {
    /// This daemon's id.
    pub id: String,
    /// Its announced RESP address.
    pub announce: String,
    /// Its current epoch.
    pub current_epoch: u64,
    /// Stall protection active.
    pub tilt: bool,
    /// Why the state file cannot be written (absent while it can); the
    /// daemon neither votes nor starts elections meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_error: Option<String>,
    /// Seconds since start.
    pub uptime_secs: u64,
    /// Every group.
    pub groups: Vec<GroupView>,
}

/// Build the status document.
pub fn status(d: &Daemon) -> Status {
    let now = tokio::time::Instant::now();
    Status {
        id: d.ctx.id.clone(),
        announce: d.ctx.announce.clone(),
        current_epoch: d.ctx.state.current_epoch(),
        tilt: d.ctx.tilt.until().is_some_and(|u| now < u),
        state_error: d.ctx.state.write_error(),
        uptime_secs: now.saturating_duration_since(d.started).as_secs(),
        groups: d.views().iter().map(|v| (**v).clone()).collect(),
    }
}

async fn metrics_handler(State(d): State<Arc<Daemon>>) -> Response {
    match &d.metrics {
        Some(h) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            crate::metrics::render(h),
        )
            .into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "metrics recorder not installed\n",
        )
            .into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(d): State<Arc<Daemon>>) -> Response {
    if !d.ready.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response()
    } else if let Some(e) = d.ctx.state.write_error() {
        // Alive, and still serving the current master, but not a full
        // member of the quorum: it cannot vote.
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("state not writable: {e}\n"),
        )
            .into_response()
    } else {
        (StatusCode::OK, "ready\n").into_response()
    }
}

async fn status_handler(State(d): State<Arc<Daemon>>) -> Response {
    axum::Json(status(&d)).into_response()
}

/// Serve HTTP until `cancel`: every endpoint, over TLS when `tls` is set
/// (`[daemon.tls] http = true`; the configuration in force at each
/// handshake).
pub async fn serve(
    listener: TcpListener,
    daemon: Arc<Daemon>,
    tls: Option<Shared<rustls::ServerConfig>>,
    cancel: CancellationToken,
) {
    if let Some(h) = &daemon.metrics {
        // The recorder needs periodic upkeep when it is not run by its own
        // HTTP listener.
        let h = h.clone();
        let c = cancel.clone();
        tokio::spawn(async move {
            let mut t = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = c.cancelled() => return,
                    _ = t.tick() => h.run_upkeep(),
                }
            }
        });
    }
    let app = probes().route("/v1/status", get(status_handler));
    match tls {
        None => run(listener, app.with_state(daemon), cancel).await,
        Some(tls) => {
            let listener = TlsListener::spawn(listener, tls, cancel.clone());
            run(listener, app.with_state(daemon), cancel).await;
        }
    }
}

/// Serve `/metrics`, `/healthz` and `/readyz` in plaintext until `cancel`
/// (`plaintext_http_listen`, for scrapers and probes without TLS while
/// `http_listen` has it); `/v1/status` stays on the TLS listener.
pub async fn serve_plaintext_probes(
    listener: TcpListener,
    daemon: Arc<Daemon>,
    cancel: CancellationToken,
) {
    run(listener, probes().with_state(daemon), cancel).await;
}

fn probes() -> Router<Arc<Daemon>> {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

async fn run<L>(listener: L, app: Router, cancel: CancellationToken)
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "HTTP server failed");
    }
}

/// How many TLS handshakes of the HTTP listener may be under way at once;
/// more connections are closed (a client that never finishes its handshake
/// must not hold the others back).
const MAX_HANDSHAKES: usize = 64;
/// How long an HTTP client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The HTTP listener with TLS: a task accepts connections and runs their
/// handshakes concurrently; axum gets the finished ones.
struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: std::io::Result<SocketAddr>,
}

impl TlsListener {
    fn spawn(
        listener: TcpListener,
        tls: Shared<rustls::ServerConfig>,
        cancel: CancellationToken,
    ) -> TlsListener {
        let local = listener.local_addr();
        let (tx, rx) = tokio::sync::mpsc::channel(MAX_HANDSHAKES);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let (sock, peer) = tokio::select! {
                    _ = cancel.cancelled() => return,
                    a = listener.accept() => match a {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::warn!(error = %e, "HTTP accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    metrics::counter!(m::API_REJECTED, "reason" => "http_handshakes").increment(1);
                    continue;
                };
                let acceptor = tokio_rustls::TlsAcceptor::from(crate::tls::current(&tls));
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await {
                        Ok(Ok(stream)) => {
                            drop(permit);
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(client = %peer, "HTTPS handshake refused: {e}")
                        }
                        Err(_) => tracing::debug!(client = %peer, "HTTPS handshake timed out"),
                    }
                });
            }
        });
        TlsListener { rx, local }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The accept task ended (shutdown): graceful shutdown ends the
            // server meanwhile.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match &self.local {
            Ok(a) => Ok(*a),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}

//! HTTP on `http_listen`: `/metrics` (Prometheus), `/healthz`, `/readyz`
//! and `/v1/status` (JSON: groups, instances, peers, epochs).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::daemon::Daemon;
use crate::group::view::GroupView;

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
            h.render(),
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

/// Serve HTTP until `cancel`.
pub async fn serve(listener: TcpListener, daemon: Arc<Daemon>, cancel: CancellationToken) {
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
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/status", get(status_handler))
        .with_state(daemon);
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "HTTP server failed");
    }
}

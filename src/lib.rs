//! picket: an out-of-cluster, Sentinel-style high-availability daemon for
//! Dragonfly, Redis and Valkey.
//!
//! # Layout
//!
//! - [`config`]: the TOML schema and its validation.
//! - [`resp`]: RESP2 client and server codec with a frame-size cap.
//! - [`probe`]: one probing task per instance, INFO/ROLE parsing, SDOWN.
//! - [`quorum`]: peer links, votes, epochs, ODOWN, persisted state.
//! - [`failover`]: the failover state machine and replica selection.
//! - [`discovery`]: where the master is published (Kubernetes, exec, webhook, file).
//! - [`api`]: the Sentinel-compatible RESP API and its events.
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`, `/v1/status`, `/v1/lb/...`.
//! - [`import`]: `picket import` from a Sentinel deployment.
//! - [`metrics`]: every metric name in one place.
//! - [`reload`]: SIGHUP re-reads the configuration.
//! - [`service`]: systemd's notify protocol and watchdog.

pub mod addr;
pub mod api;
pub mod config;
mod context;
mod daemon;
pub mod discovery;
mod events;
mod failover;
mod group;
mod hello;
mod http;
pub mod import;
mod metrics;
mod mutation;
pub mod probe;
pub mod quorum;
pub mod reload;
pub mod resp;
pub mod service;
#[doc(hidden)]
pub mod sim;
pub mod status_table;
mod tilt;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::addr::Addr;
use crate::config::Config;
use crate::context::DaemonCtx;
use crate::daemon::Daemon;
use crate::events::Events;
use crate::quorum::peers::{PeerLink, peer_client_options};
use crate::quorum::state::{StateError, StateStore};
use crate::quorum::table::PeerTable;
use crate::tilt::Tilt;

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The persisted state cannot be used.
    #[error(transparent)]
    State(#[from] StateError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// A secret file could not be read.
    #[error("{path}: {source}")]
    Secret {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A certificate or key of `[daemon.tls]` cannot be used.
    #[error("daemon.tls: {0}")]
    Tls(tls::TlsError),
    /// A group could not be started.
    #[error("group {group}: {reason}")]
    Group {
        /// The group.
        group: String,
        /// Why.
        reason: String,
    },
}

/// How long shutdown may take before tasks are abandoned.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A daemon whose listeners are bound and whose tasks run.
pub struct Running {
    /// The daemon's shared state.
    pub daemon: Arc<Daemon>,
    /// The bound RESP address.
    pub resp_addr: std::net::SocketAddr,
    /// The bound HTTP address.
    pub http_addr: std::net::SocketAddr,
    /// The plaintext RESP listener of a migration to TLS, when open.
    pub plaintext_resp_addr: Option<std::net::SocketAddr>,
    /// The plaintext probe and metrics listener, when open.
    pub plaintext_http_addr: Option<std::net::SocketAddr>,
    /// The listener's certificates, reloaded on SIGHUP.
    pub tls: Option<Arc<tls::ListenerTls>>,
    cancel: CancellationToken,
    tasks: tokio_util::task::TaskTracker,
}

impl Running {
    /// Wait until `shutdown` is cancelled, then stop every task (bounded by
    /// [`SHUTDOWN_GRACE`]).
    pub async fn wait(self, shutdown: CancellationToken) {
        shutdown.cancelled().await;
        tracing::info!("shutting down");
        self.cancel.cancel();
        self.tasks.close();
        self.daemon.group_tasks.close();
        let all = async {
            self.tasks.wait().await;
            self.daemon.group_tasks.wait().await;
        };
        if tokio::time::timeout(SHUTDOWN_GRACE, all).await.is_err() {
            tracing::warn!("some tasks did not stop within {SHUTDOWN_GRACE:?}");
        }
    }
}

fn secret(path: &std::path::Path) -> Result<String, RunError> {
    config::read_secret(path).map_err(|source| RunError::Secret {
        path: path.display().to_string(),
        source,
    })
}

/// Bind `addr`; a RESP listener with the configured `tcp_backlog`.
async fn bind(
    addr: &str,
    backlog: Option<u32>,
) -> Result<(TcpListener, std::net::SocketAddr), RunError> {
    let err = |source| RunError::Bind {
        addr: addr.to_string(),
        source,
    };
    let l = match backlog {
        Some(b) => api::listener::bind(addr, b).await,
        None => TcpListener::bind(addr).await,
    }
    .map_err(err)?;
    let a = l.local_addr().map_err(err)?;
    Ok((l, a))
}

async fn bind_optional(
    addr: Option<&String>,
    backlog: Option<u32>,
) -> Result<Option<(TcpListener, std::net::SocketAddr)>, RunError> {
    match addr {
        Some(a) => Ok(Some(bind(a, backlog).await?)),
        None => Ok(None),
    }
}

/// Start the daemon with an already validated `config`: open the state,
/// read the secrets and certificates, bind the listeners, start probing
/// every group.
pub async fn start(config: Config) -> Result<Running, RunError> {
    tls::install_crypto_provider();
    let metrics = metrics::install();
    let d = &config.daemon;
    let password = d.password_file.as_deref().map(secret).transpose()?;
    let user_passwords = d
        .users
        .iter()
        .map(|u| secret(&u.password_file))
        .collect::<Result<Vec<_>, _>>()?;
    // Peers are authenticated to as the peer user, else as the default
    // user (one shared password, as before users existed).
    let (peer_username, peer_password) = match &d.peer_user {
        Some(name) => match d.users.iter().position(|u| &u.name == name) {
            Some(i) => (Some(name.clone()), Some(user_passwords[i].clone())),
            None => (None, password.clone()),
        },
        None => (None, password.clone()),
    };
    let users = api::acl::Users::new(d, password.clone(), user_passwords);
    let listener_tls = match &d.tls {
        Some(t) => Some(Arc::new(
            tls::ListenerTls::load(t, !d.peers.is_empty()).map_err(RunError::Tls)?,
        )),
        None => None,
    };
    let state = Arc::new(StateStore::open(&d.data_dir, d.id.as_deref())?);
    let (resp, resp_addr) = bind(&d.listen, Some(d.tcp_backlog)).await?;
    let (http, http_addr) = bind(&d.http_listen, None).await?;
    let tls_cfg = d.tls.as_ref();
    let plain_resp = bind_optional(
        tls_cfg.and_then(|t| t.plaintext_listen.as_ref()),
        Some(d.tcp_backlog),
    )
    .await?;
    let plain_http =
        bind_optional(tls_cfg.and_then(|t| t.plaintext_http_listen.as_ref()), None).await?;
    let cancel = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    let events = Events::new();
    let peer_timeout = Duration::from_millis(500);
    let peers: Vec<PeerLink> = config
        .daemon
        .peers
        .iter()
        .map(|p| {
            PeerLink::spawn(
                p.to_string(),
                peer_client_options(
                    peer_username.clone(),
                    peer_password.clone(),
                    listener_tls
                        .as_ref()
                        .and_then(|t| t.peers())
                        .map(|c| resp::client::TlsClient::shared(c, None)),
                    peer_timeout,
                ),
                cancel.clone(),
            )
        })
        .collect();
    let announce = match &config.daemon.announce {
        Some(a) => a.clone(),
        None => resp_addr.to_string(),
    };
    let id = state.daemon_id();
    ::metrics::gauge!(crate::metrics::CURRENT_EPOCH).set(state.current_epoch() as f64);
    let ctx = Arc::new(DaemonCtx {
        id: id.clone(),
        run_id: state.run_id(),
        announce,
        state,
        peer_table: PeerTable::new(
            &config
                .daemon
                .peers
                .iter()
                .map(Addr::to_string)
                .collect::<Vec<_>>(),
        ),
        peers,
        events: events.clone(),
        hello_now: tokio::sync::Notify::new(),
        tilt: Tilt::new(events),
        password,
        simulate_failure: Default::default(),
    });
    let max_clients = config.daemon.max_clients;
    let daemon = Arc::new(Daemon {
        ctx: ctx.clone(),
        groups: Default::default(),
        config: std::sync::RwLock::new(config.clone()),
        metrics,
        ready: Default::default(),
        started: tokio::time::Instant::now(),
        group_tasks: Default::default(),
    });
    for g in &config.groups {
        let handle = start_group(g, &ctx, &cancel, &daemon.group_tasks).map_err(|reason| {
            RunError::Group {
                group: g.name.clone(),
                reason,
            }
        })?;
        daemon
            .groups
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(g.name.clone(), handle);
    }
    let own = daemon.clone();
    tasks.spawn(hello::run(ctx.clone(), move || own.hello(), cancel.clone()));
    let api = Arc::new(api::Api::new(
        daemon.clone(),
        api::Limits::new(max_clients),
        resp_addr.port(),
        users,
    ));
    tasks.spawn(api::listener::serve_on_own_thread(
        api.clone(),
        resp,
        listener_tls.as_ref().map(|t| t.resp()),
        cancel.clone(),
    ));
    let plaintext_resp_addr = plain_resp.as_ref().map(|(_, a)| *a);
    if let Some((l, addr)) = plain_resp {
        tracing::warn!(%addr, "plaintext RESP listener open (daemon.tls.plaintext_listen): close it once the migration to TLS is done");
        tasks.spawn(api::listener::serve_on_own_thread(
            api,
            l,
            None,
            cancel.clone(),
        ));
    }
    tasks.spawn(http::serve(
        http,
        daemon.clone(),
        listener_tls.as_ref().and_then(|t| t.http()),
        cancel.clone(),
    ));
    let plaintext_http_addr = plain_http.as_ref().map(|(_, a)| *a);
    if let Some((l, _)) = plain_http {
        tasks.spawn(http::serve_plaintext_probes(
            l,
            daemon.clone(),
            cancel.clone(),
        ));
    }
    daemon
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    tracing::info!(%id, resp = %resp_addr, http = %http_addr, tls = listener_tls.is_some(), groups = config.groups.len(), peers = config.daemon.peers.len(), "picket started");
    Ok(Running {
        daemon,
        resp_addr,
        http_addr,
        plaintext_resp_addr,
        plaintext_http_addr,
        tls: listener_tls,
        cancel,
        tasks,
    })
}

/// Start the decision task of one group with its discovery backends, on
/// `tasks`.
pub fn start_group(
    g: &config::GroupConfig,
    ctx: &Arc<DaemonCtx>,
    cancel: &CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) -> Result<group::GroupHandle, String> {
    let built = discovery::build(g)?;
    metrics::register_group(&g.name, built.backends.iter().map(|b| b.kind()));
    for b in built.backends.iter().filter(|b| b.service_gate().is_some()) {
        metrics::register_gate(b.kind());
    }
    for b in &built.backends {
        if let Some(w) = b.warning() {
            tracing::warn!(group = %g.name, backend = %b.name(), "{w}");
        }
    }
    metrics::register_gate_skipped(
        &g.name,
        built
            .backends
            .iter()
            .filter(|b| b.warning().is_some())
            .count(),
    );
    let runner = Arc::new(discovery::runner::DiscoveryRunner::new(
        g.name.clone(),
        built.backends,
    ));
    group::spawn(
        g.clone(),
        ctx.clone(),
        runner,
        built.recorders,
        cancel,
        tasks,
    )
    .map_err(|e| e.to_string())
}

/// Run the daemon until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), RunError> {
    let running = start(config).await?;
    running.wait(shutdown).await;
    Ok(())
}

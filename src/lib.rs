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
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`, `/v1/status`.
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
mod http;
mod metrics;
pub mod probe;
pub mod quorum;
pub mod reload;
pub mod resp;
pub mod service;
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

/// Start the daemon with an already validated `config`: open the state,
/// bind the listeners, start probing every group.
pub async fn start(config: Config) -> Result<Running, RunError> {
    tls::install_crypto_provider();
    let metrics = metrics::install();
    let password = match &config.daemon.password_file {
        Some(p) => Some(config::read_secret(p).map_err(|source| RunError::Secret {
            path: p.display().to_string(),
            source,
        })?),
        None => None,
    };
    let state = Arc::new(StateStore::open(
        &config.daemon.data_dir,
        config.daemon.id.as_deref(),
    )?);
    let resp = TcpListener::bind(&config.daemon.listen)
        .await
        .map_err(|source| RunError::Bind {
            addr: config.daemon.listen.clone(),
            source,
        })?;
    let http = TcpListener::bind(&config.daemon.http_listen)
        .await
        .map_err(|source| RunError::Bind {
            addr: config.daemon.http_listen.clone(),
            source,
        })?;
    let resp_addr = resp.local_addr().map_err(|source| RunError::Bind {
        addr: config.daemon.listen.clone(),
        source,
    })?;
    let http_addr = http.local_addr().map_err(|source| RunError::Bind {
        addr: config.daemon.http_listen.clone(),
        source,
    })?;
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
                peer_client_options(password.clone(), peer_timeout),
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
    tasks.spawn(quorum::hello::run(
        ctx.clone(),
        move || own.hello(),
        cancel.clone(),
    ));
    tasks.spawn(api::serve(
        resp,
        daemon.clone(),
        max_clients,
        cancel.clone(),
    ));
    tasks.spawn(http::serve(http, daemon.clone(), cancel.clone()));
    daemon
        .ready
        .store(true, std::sync::atomic::Ordering::Release);
    tracing::info!(%id, resp = %resp_addr, http = %http_addr, groups = config.groups.len(), peers = config.daemon.peers.len(), "picket started");
    Ok(Running {
        daemon,
        resp_addr,
        http_addr,
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

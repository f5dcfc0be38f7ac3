//! Service discovery: where picket publishes which instance is the master.
//!
//! Every backend is told two things, always with the config epoch of the
//! decision (invariant 3): **fence** the old master (take it out of
//! routing, before the promotion) and **publish** the new topology (after
//! the promotion and the flush). A backend never lets a lower epoch replace
//! a higher one; it answers [`DiscoveryError::Stale`] instead.

mod delivered;
pub(crate) mod exec;
pub(crate) mod file;
pub mod kubernetes;
pub(crate) mod memory;
pub(crate) mod runner;
pub(crate) mod webhook;

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

use crate::addr::Addr;

/// A boxed future, so that backends can live in a `Vec<Box<dyn Backend>>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Take the old master out of routing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// The group.
    pub group: String,
    /// The epoch of the failover that fences it.
    pub epoch: u64,
    /// The master being removed from routing.
    pub old_master: Addr,
}

/// The topology to publish.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// The group.
    pub group: String,
    /// The config epoch in which `master` was chosen.
    pub epoch: u64,
    /// The master.
    pub master: Addr,
    /// The master before this change, if it changed.
    pub old_master: Option<Addr>,
    /// Known replicas (not including the master).
    pub replicas: Vec<Addr>,
    /// Whether this daemon carried out the failover (`leader`) or learned
    /// the outcome from a peer (`observer`), as in Sentinel's
    /// client-reconfig-script arguments.
    pub reporter: Reporter,
}

/// Who publishes a topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reporter {
    /// The daemon that won the election and promoted the master.
    Leader,
    /// A daemon that adopted the outcome from a peer (or at start-up).
    Observer,
}

impl Reporter {
    /// `leader` or `observer`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reporter::Leader => "leader",
            Reporter::Observer => "observer",
        }
    }
}

/// Why a backend write did not happen.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DiscoveryError {
    /// The backend already holds a higher epoch: this write must never win.
    #[error("refused: backend holds epoch {stored}, this write has epoch {ours}")]
    Stale {
        /// The epoch found in the backend.
        stored: u64,
        /// The epoch of the refused write.
        ours: u64,
    },
    /// Worth retrying (timeouts, 5xx, 429, conflicts, I/O).
    #[error("transient: {0}")]
    Transient(String),
    /// Not worth retrying without an operator (401, bad config).
    #[error("permanent: {0}")]
    Permanent(String),
}

impl DiscoveryError {
    /// Label for metrics (`result` of `picket_discovery_writes_total`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            DiscoveryError::Stale { .. } => "stale",
            DiscoveryError::Transient(_) => "transient",
            DiscoveryError::Permanent(_) => "permanent",
        }
    }
}

/// A service-discovery backend.
pub trait Backend: Send + Sync {
    /// Short kind for metrics and status (`kubernetes`, `file`, ...).
    fn kind(&self) -> &'static str;
    /// A name unique within the group (kind plus target), for status and logs.
    fn name(&self) -> String;
    /// Whether the failover must wait for this backend's confirmation.
    fn required(&self) -> bool;
    /// Remove `fence.old_master` from routing.
    fn fence<'a>(&'a self, fence: &'a Fence) -> BoxFuture<'a, Result<(), DiscoveryError>>;
    /// Publish `topology` as the current one.
    fn publish<'a>(&'a self, topology: &'a Topology) -> BoxFuture<'a, Result<(), DiscoveryError>>;
    /// The waits for routing to follow the writes, for backends that
    /// verify them (Kubernetes pod-labels with `service`).
    fn service_gate(&self) -> Option<kubernetes::gate::GateStatus> {
        None
    }
    /// Why this backend's writes do not give the guarantee its kind
    /// normally gives, when the configuration opted out of it (a
    /// pod-labels backend with `skip_service_gate`): logged at start, shown
    /// in `/v1/status` and counted in `picket_discovery_gate_skipped`.
    fn warning(&self) -> Option<&'static str> {
        None
    }
}

/// The backends of a group, plus handles on its recording backends.
pub struct Built {
    /// Every backend, in configuration order.
    pub backends: Vec<std::sync::Arc<dyn Backend>>,
    /// The `memory` backends, whose records `/v1/status` shows.
    pub recorders: Vec<memory::MemoryBackend>,
}

/// Build the backends configured for a group.
pub fn build(group: &crate::config::GroupConfig) -> Result<Built, String> {
    use crate::config::DiscoveryConfig;
    use std::sync::Arc;
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    let mut recorders = Vec::new();
    for (i, d) in group.discovery.iter().enumerate() {
        let err = |e: DiscoveryError| format!("discovery[{i}]: {e}");
        let b: Arc<dyn Backend> = match d {
            DiscoveryConfig::File(c) => Arc::new(file::FileBackend::new(c).map_err(err)?),
            DiscoveryConfig::Exec(c) => Arc::new(exec::ExecBackend::new(c).map_err(err)?),
            DiscoveryConfig::Webhook(c) => Arc::new(webhook::WebhookBackend::new(c).map_err(err)?),
            DiscoveryConfig::Kubernetes(c) => {
                Arc::new(kubernetes::KubernetesBackend::new(c).map_err(err)?)
            }
            DiscoveryConfig::Memory(c) => {
                let m = memory::MemoryBackend::with_required(c.required);
                recorders.push(m.clone());
                Arc::new(m)
            }
        };
        backends.push(b);
    }
    Ok(Built {
        backends,
        recorders,
    })
}

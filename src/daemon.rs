//! The running daemon, above its groups: the registry of group tasks,
//! the configuration in force and what the API and HTTP servers read. The
//! shared context the groups use lives below them ([`crate::context`]).

use std::sync::Arc;

use tokio::time::Instant;

use crate::context::DaemonCtx;
use crate::quorum::peers::Hello;

/// A running daemon: what the RESP API and the HTTP server read.
#[derive(Debug)]
pub struct Daemon {
    /// Shared context.
    pub ctx: Arc<DaemonCtx>,
    /// Group tasks by name.
    pub groups: std::sync::RwLock<std::collections::HashMap<String, crate::group::GroupHandle>>,
    /// The configuration in force.
    pub config: std::sync::RwLock<crate::config::Config>,
    /// Prometheus renderer (None when another recorder was installed).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Set once every listener is bound and every group started.
    pub ready: std::sync::atomic::AtomicBool,
    /// Start time, for uptime.
    pub started: Instant,
    /// The group tasks (each tracks its own effects).
    pub group_tasks: tokio_util::task::TaskTracker,
}

impl Daemon {
    /// A group's handle.
    pub fn group(&self, name: &str) -> Option<crate::group::GroupHandle> {
        self.groups
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Every group's current view, sorted by name.
    pub fn views(&self) -> Vec<Arc<crate::group::view::GroupView>> {
        let mut v: Vec<_> = self
            .groups
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|h| h.view.borrow().clone())
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// This daemon's hello.
    pub fn hello(&self) -> Hello {
        let groups = self.groups.read().unwrap_or_else(|e| e.into_inner());
        Hello {
            id: self.ctx.id.clone(),
            run_id: Some(self.ctx.run_id.clone()),
            addr: self.ctx.announce.clone(),
            current_epoch: self.ctx.state.current_epoch(),
            groups: crate::group::hello_groups(&groups),
        }
    }
}

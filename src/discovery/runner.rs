//! Runs a group's backends (placeholder until the full runner lands).

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::{Backend, DiscoveryError, Fence, Topology};

/// Why a required backend did not confirm.
#[derive(Debug, thiserror::Error)]
#[error("required backends did not confirm: {0:?}")]
pub struct RunnerError(pub Vec<(String, DiscoveryError)>);

/// Status of one backend.
#[derive(Debug, Clone, Serialize)]
pub struct BackendStatus {
    /// Backend name.
    pub name: String,
}

/// A group's backends.
pub struct DiscoveryRunner {
    backends: Vec<Arc<dyn Backend>>,
}

impl DiscoveryRunner {
    /// Wrap backends.
    pub fn new(backends: Vec<Arc<dyn Backend>>) -> Self {
        DiscoveryRunner { backends }
    }

    /// Fence in every backend.
    pub async fn fence(&self, fence: Fence, _deadline: Duration) -> Result<(), RunnerError> {
        let mut errs = Vec::new();
        for b in &self.backends {
            if let Err(e) = b.fence(&fence).await {
                if b.required() {
                    errs.push((b.name(), e));
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(RunnerError(errs))
        }
    }

    /// Publish to every backend.
    pub async fn publish(&self, t: Topology, _deadline: Duration) -> Result<(), RunnerError> {
        let mut errs = Vec::new();
        for b in &self.backends {
            if let Err(e) = b.publish(&t).await {
                if b.required() {
                    errs.push((b.name(), e));
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(RunnerError(errs))
        }
    }

    /// Per-backend status.
    pub fn status(&self) -> Vec<BackendStatus> {
        self.backends
            .iter()
            .map(|b| BackendStatus { name: b.name() })
            .collect()
    }
}

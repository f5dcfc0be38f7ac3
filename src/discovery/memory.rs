//! An in-memory backend that records every write, in order, for tests and
//! for `/v1/status`. It enforces the same epoch rule as the real backends.

use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::{Backend, BoxFuture, DiscoveryError, Fence, Topology};
use crate::addr::Addr;

/// One recorded write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Record {
    /// `fence` was called.
    Fence {
        /// Epoch of the fence.
        epoch: u64,
        /// The fenced master.
        old_master: Addr,
    },
    /// `publish` was called.
    Publish {
        /// Epoch of the topology.
        epoch: u64,
        /// The published master.
        master: Addr,
    },
}

#[derive(Debug, Default)]
struct Inner {
    epoch: u64,
    master: Option<Addr>,
    history: Vec<Record>,
}

/// The recording backend. Clones share the same record.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    inner: Arc<Mutex<Inner>>,
    required: bool,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBackend {
    /// A new, empty record (a required backend).
    pub fn new() -> Self {
        MemoryBackend {
            inner: Arc::default(),
            required: true,
        }
    }

    /// A new record with the given `required` flag.
    pub fn with_required(required: bool) -> Self {
        MemoryBackend {
            inner: Arc::default(),
            required,
        }
    }

    /// Every accepted write so far, in order.
    pub fn history(&self) -> Vec<Record> {
        self.lock().history.clone()
    }

    /// The currently advertised master and its epoch.
    pub fn current(&self) -> (u64, Option<Addr>) {
        let g = self.lock();
        (g.epoch, g.master.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock only means a test thread panicked while holding it;
        // the record itself is still consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Backend for MemoryBackend {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn name(&self) -> String {
        "memory".to_string()
    }

    fn required(&self) -> bool {
        self.required
    }

    fn fence<'a>(&'a self, fence: &'a Fence) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        Box::pin(async move {
            let mut g = self.lock();
            if g.epoch > fence.epoch {
                return Err(DiscoveryError::Stale {
                    stored: g.epoch,
                    ours: fence.epoch,
                });
            }
            g.epoch = fence.epoch;
            if g.master.as_ref() == Some(&fence.old_master) {
                g.master = None;
            }
            g.history.push(Record::Fence {
                epoch: fence.epoch,
                old_master: fence.old_master.clone(),
            });
            Ok(())
        })
    }

    fn publish<'a>(&'a self, t: &'a Topology) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        Box::pin(async move {
            let mut g = self.lock();
            if g.epoch > t.epoch {
                return Err(DiscoveryError::Stale {
                    stored: g.epoch,
                    ours: t.epoch,
                });
            }
            g.epoch = t.epoch;
            g.master = Some(t.master.clone());
            g.history.push(Record::Publish {
                epoch: t.epoch,
                master: t.master.clone(),
            });
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo(epoch: u64, port: u16) -> Topology {
        Topology {
            group: "g".into(),
            epoch,
            master: Addr::new("127.0.0.1", port),
            old_master: None,
            replicas: vec![],
            reporter: super::super::Reporter::Leader,
        }
    }

    #[tokio::test]
    async fn refuses_lower_epoch() {
        let b = MemoryBackend::new();
        b.publish(&topo(5, 1)).await.unwrap();
        let err = b.publish(&topo(4, 2)).await.unwrap_err();
        assert_eq!(err, DiscoveryError::Stale { stored: 5, ours: 4 });
        assert_eq!(b.current(), (5, Some(Addr::new("127.0.0.1", 1))));
        assert_eq!(b.history().len(), 1);
    }

    #[tokio::test]
    async fn fence_clears_the_old_master() {
        let b = MemoryBackend::new();
        b.publish(&topo(1, 1)).await.unwrap();
        b.fence(&Fence {
            group: "g".into(),
            epoch: 2,
            old_master: Addr::new("127.0.0.1", 1),
        })
        .await
        .unwrap();
        assert_eq!(b.current(), (2, None));
    }
}

//! What this process last delivered to a backend that keeps no state picket
//! can read back (exec, webhook).
//!
//! Such a backend cannot compare epochs before it writes, so the comparison
//! is made here, against the last write that succeeded: a lower epoch is
//! refused as [`DiscoveryError::Stale`], and a write equal to the last one
//! (same epoch, same routing) is not sent again. That makes `publish`
//! idempotent when the leader and then the same daemon as an observer
//! report one outcome. The record lives in memory: after a restart the
//! first write is sent again, which is why receivers must be idempotent
//! (the same contract as Sentinel's client-reconfig-script).

use std::future::Future;
use std::sync::Mutex;

use super::{DiscoveryError, Fence, Topology};
use crate::addr::Addr;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Last {
    Fence {
        epoch: u64,
        old_master: Addr,
    },
    Publish {
        epoch: u64,
        master: Addr,
        replicas: Vec<Addr>,
    },
}

impl Last {
    fn epoch(&self) -> u64 {
        match self {
            Last::Fence { epoch, .. } | Last::Publish { epoch, .. } => *epoch,
        }
    }

    /// Within one epoch a publication comes after the fence.
    fn order(&self) -> (u64, u8) {
        match self {
            Last::Fence { epoch, .. } => (*epoch, 0),
            Last::Publish { epoch, .. } => (*epoch, 1),
        }
    }
}

/// The last successful write to one backend.
#[derive(Debug, Default)]
pub(crate) struct Delivered {
    last: Mutex<Option<Last>>,
}

fn sorted(replicas: &[Addr]) -> Vec<Addr> {
    let mut r = replicas.to_vec();
    r.sort();
    r.dedup();
    r
}

impl Delivered {
    /// Send `fence` with `send` unless it (or the publication of its
    /// epoch) was delivered already; remember it once sent.
    pub(crate) async fn fence_once<F: Future<Output = Result<(), DiscoveryError>>>(
        &self,
        fence: &Fence,
        send: impl FnOnce() -> F,
    ) -> Result<(), DiscoveryError> {
        if self.check_fence(fence)? {
            send().await?;
            self.record_fence(fence);
        }
        Ok(())
    }

    /// Send `t` with `send` unless the same routing was delivered in its
    /// epoch already; remember it once sent.
    pub(crate) async fn publish_once<F: Future<Output = Result<(), DiscoveryError>>>(
        &self,
        t: &Topology,
        send: impl FnOnce() -> F,
    ) -> Result<(), DiscoveryError> {
        if self.check_publish(t)? {
            send().await?;
            self.record_publish(t);
        }
        Ok(())
    }

    fn get(&self) -> Option<Last> {
        // Poisoning only means a panic elsewhere; the value is a plain copy.
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, new: Last) {
        let mut g = self.last.lock().unwrap_or_else(|e| e.into_inner());
        // Never move backwards, even if two writes raced.
        if g.as_ref().is_none_or(|old| new.order() >= old.order()) {
            *g = Some(new);
        }
    }

    /// `Ok(true)`: send the fence. `Ok(false)`: already done (this fence, or
    /// the publication of the same epoch, which supersedes it).
    pub(crate) fn check_fence(&self, f: &Fence) -> Result<bool, DiscoveryError> {
        match self.get() {
            Some(last) if last.epoch() > f.epoch => Err(DiscoveryError::Stale {
                stored: last.epoch(),
                ours: f.epoch,
            }),
            Some(Last::Publish { epoch, .. }) if epoch == f.epoch => Ok(false),
            Some(Last::Fence { epoch, old_master }) if epoch == f.epoch => {
                Ok(old_master != f.old_master)
            }
            _ => Ok(true),
        }
    }

    /// `Ok(true)`: send the topology. `Ok(false)`: the same epoch and
    /// routing were already delivered.
    pub(crate) fn check_publish(&self, t: &Topology) -> Result<bool, DiscoveryError> {
        match self.get() {
            Some(last) if last.epoch() > t.epoch => Err(DiscoveryError::Stale {
                stored: last.epoch(),
                ours: t.epoch,
            }),
            Some(Last::Publish {
                epoch,
                master,
                replicas,
            }) if epoch == t.epoch => Ok(master != t.master || replicas != sorted(&t.replicas)),
            _ => Ok(true),
        }
    }

    /// Remember a fence that succeeded.
    pub(crate) fn record_fence(&self, f: &Fence) {
        self.set(Last::Fence {
            epoch: f.epoch,
            old_master: f.old_master.clone(),
        });
    }

    /// Remember a publication that succeeded.
    pub(crate) fn record_publish(&self, t: &Topology) {
        self.set(Last::Publish {
            epoch: t.epoch,
            master: t.master.clone(),
            replicas: sorted(&t.replicas),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::Reporter;

    fn topo(epoch: u64, port: u16, replicas: &[u16]) -> Topology {
        Topology {
            group: "g".into(),
            epoch,
            master: Addr::new("10.0.0.1", port),
            old_master: None,
            replicas: replicas.iter().map(|p| Addr::new("10.0.0.2", *p)).collect(),
            reporter: Reporter::Leader,
        }
    }

    fn fence(epoch: u64, port: u16) -> Fence {
        Fence {
            group: "g".into(),
            epoch,
            old_master: Addr::new("10.0.0.1", port),
        }
    }

    #[test]
    fn orders_by_epoch_then_fence_before_publish() {
        let d = Delivered::default();
        assert_eq!(d.check_publish(&topo(3, 1, &[])), Ok(true));
        assert_eq!(d.check_fence(&fence(3, 1)), Ok(true));
        d.record_fence(&fence(3, 1));
        assert_eq!(d.check_fence(&fence(3, 1)), Ok(false));
        assert_eq!(d.check_publish(&topo(3, 2, &[])), Ok(true));
        d.record_publish(&topo(3, 2, &[7, 6]));
        assert_eq!(d.check_publish(&topo(3, 2, &[6, 7])), Ok(false));
        assert_eq!(d.check_publish(&topo(3, 2, &[6])), Ok(true));
        assert_eq!(d.check_fence(&fence(3, 1)), Ok(false));
        assert_eq!(
            d.check_publish(&topo(2, 2, &[])),
            Err(DiscoveryError::Stale { stored: 3, ours: 2 })
        );
        assert_eq!(
            d.check_fence(&fence(2, 2)),
            Err(DiscoveryError::Stale { stored: 3, ours: 2 })
        );
        // A late record of an older write does not move the mark back.
        d.record_fence(&fence(3, 9));
        assert_eq!(d.check_publish(&topo(3, 2, &[6, 7])), Ok(false));
        assert_eq!(d.check_publish(&topo(4, 2, &[6, 7])), Ok(true));
    }
}

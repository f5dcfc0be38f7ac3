//! `pod-labels` mode: a role label on the group's pods, which a Service
//! selecting `role=master` turns into routing (the dragonfly-operator's
//! contract).
//!
//! Pods are found by namespace and label selector and matched to instances
//! by `status.podIP` (narrowed by container port when several pods share an
//! IP, as host-network pods do).
//!
//! Gating (invariant 5): a pod gains the master label only after every
//! other pod has lost it; a label change on two pods cannot be atomic, so
//! the order leaves at worst a moment with no master, never one with two.
//!
//! Fence **removes** the role label from the old master instead of setting
//! the replica value: a fenced master may still be a writable, diverging
//! master (e.g. behind a partition), and a "replica" Service must not send
//! reads to it either. The next `publish` labels it a replica again.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::client::{KubeClient, Objects};
use super::gate::ServiceGate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{
    CONFLICT_ATTEMPTS, EPOCH_ANNOTATION, check_epoch, label, object_name, resource_version,
};
use crate::addr::Addr;
use crate::discovery::{DiscoveryError, Fence, Topology};

/// Writes role labels on pods.
#[derive(Debug, Clone)]
pub struct PodLabelWriter {
    pods: Objects<Pod>,
    namespace: String,
    selector: String,
    role_label: String,
    master_value: String,
    replica_value: String,
    /// With `service` set: the waits for the Service's EndpointSlices.
    gate: Option<ServiceGate>,
}

/// What `publish` does when the label is already right on every pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Written,
    Unchanged,
}

impl PodLabelWriter {
    /// A writer for the pods of `namespace` matching `selector`.
    pub fn new(
        client: KubeClient,
        namespace: &str,
        selector: &str,
        role_label: &str,
        master_value: &str,
        replica_value: &str,
    ) -> Self {
        PodLabelWriter {
            pods: client.api(namespace),
            namespace: namespace.to_string(),
            selector: selector.to_string(),
            role_label: role_label.to_string(),
            master_value: master_value.to_string(),
            replica_value: replica_value.to_string(),
            gate: None,
        }
    }

    /// The same writer, confirming its writes on a Service's EndpointSlices.
    pub fn with_gate(mut self, gate: ServiceGate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// The Service gate, when `service` is set.
    pub fn gate(&self) -> Option<&ServiceGate> {
        self.gate.as_ref()
    }

    /// The fence is done once the Service no longer routes to the old master.
    async fn fence_gate(&self, fence: &Fence) -> Result<(), DiscoveryError> {
        match &self.gate {
            Some(g) => g.wait_gone(fence.epoch, &fence.old_master.host).await,
            None => Ok(()),
        }
    }

    async fn list(&self) -> Result<Vec<Pod>, DiscoveryError> {
        Ok(self.pods.list(Some(&self.selector)).await?)
    }

    /// Take the old master's pod out of routing (remove its role label).
    pub async fn fence(&self, fence: &Fence) -> Result<(), DiscoveryError> {
        let pods = self.list().await?;
        let targets = match pods_of(&pods, &fence.old_master) {
            Ok(t) => t,
            Err(NoMatch::None) => {
                // A deleted pod routes nothing; there is nothing to fence.
                tracing::warn!(group = %fence.group, epoch = fence.epoch,
                    old_master = %fence.old_master, selector = %self.selector,
                    "fence: no pod has the old master's IP; nothing to unlabel");
                return self.fence_gate(fence).await;
            }
            Err(NoMatch::Ambiguous(names)) => {
                return Err(self.ambiguous(&fence.old_master, &names));
            }
        };
        for p in &targets {
            check_epoch(&p.metadata, fence.epoch)?;
        }
        for p in targets {
            let name = object_name(&p.metadata);
            // Done when the label is gone, or when a write of this very
            // epoch already made the pod a replica (a retried fence must
            // not undo that epoch's publish).
            let master = self.master_value.as_str();
            let out = self
                .write(name, fence.epoch, None, true, |pod, stored| {
                    stored == Some(fence.epoch) && label(pod, &self.role_label) != Some(master)
                })
                .await?;
            if out == Outcome::Written {
                tracing::info!(group = %fence.group, epoch = fence.epoch, pod = %name,
                    label = %self.role_label, "fence: removed the role label of the old master");
            }
        }
        self.fence_gate(fence).await
    }

    /// Label the new master (after every other pod lost the master label)
    /// and the pods of the linked replicas as replicas; other pods of the
    /// group lose the role label.
    pub async fn publish(&self, t: &Topology) -> Result<(), DiscoveryError> {
        let mut pods = self.list().await?;
        // Refuse before writing anything when any pod of the group already
        // carries a newer config.
        for p in &pods {
            check_epoch(&p.metadata, t.epoch)?;
        }
        let master_name = match pods_of(&pods, &t.master) {
            Ok(m) => object_name(&m[0].metadata).to_string(),
            Err(NoMatch::None) => {
                return Err(DiscoveryError::Permanent(format!(
                    "kubernetes: no pod matching {:?} in namespace {:?} has the new master's \
                     IP {} (is the instance address a pod IP?)",
                    self.selector, self.namespace, t.master.host
                )));
            }
            Err(NoMatch::Ambiguous(names)) => return Err(self.ambiguous(&t.master, &names)),
        };

        // The pods of the replicas linked to the master; every other pod
        // (an empty lone master, a dead old master, a server still
        // syncing) gets no role label: a replica Service must not send
        // reads to it.
        let replica_names: Vec<String> = t
            .replicas
            .iter()
            .filter_map(|r| pods_of(&pods, r).ok())
            .flatten()
            .map(|p| object_name(&p.metadata).to_string())
            .filter(|n| *n != master_name)
            .collect();

        // 1. Demote every other pod that routes as master. Re-list after, in
        //    case a slower writer labelled one in between.
        let mut rounds = 0;
        loop {
            let holders: Vec<String> = pods
                .iter()
                .filter(|p| {
                    label(&p.metadata, &self.role_label) == Some(self.master_value.as_str())
                })
                .map(|p| object_name(&p.metadata).to_string())
                .filter(|n| *n != master_name)
                .collect();
            if holders.is_empty() {
                break;
            }
            rounds += 1;
            if rounds > 3 {
                return Err(DiscoveryError::Transient(format!(
                    "kubernetes: pods {holders:?} keep getting the master label back; \
                     is another controller writing {:?}?",
                    self.role_label
                )));
            }
            for name in &holders {
                let value = replica_names
                    .contains(name)
                    .then_some(self.replica_value.as_str());
                self.write_value(name, t.epoch, value).await?;
                tracing::info!(group = %t.group, epoch = t.epoch, pod = %name,
                    "publish: pod lost the master label");
            }
            pods = self.list().await?;
        }

        // 2. Only now the new master.
        if self
            .write_label(&master_name, t.epoch, &self.master_value)
            .await?
            == Outcome::Written
        {
            tracing::info!(group = %t.group, epoch = t.epoch, pod = %master_name,
                master = %t.master, "publish: pod labelled master");
        }

        // 3. The linked replicas are replicas; the other pods have no role.
        let mut first_err = None;
        for p in &pods {
            let name = object_name(&p.metadata);
            if name == master_name {
                continue;
            }
            let value = replica_names
                .iter()
                .any(|r| r == name)
                .then_some(self.replica_value.as_str());
            if label(&p.metadata, &self.role_label) == value
                && (value.is_none() || super::stored_epoch(&p.metadata) == Some(t.epoch))
            {
                continue;
            }
            if let Err(e) = self.write_value(name, t.epoch, value).await {
                tracing::warn!(group = %t.group, epoch = t.epoch, pod = %name, error = %e,
                    "publish: cannot label pod as replica");
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        // Done once the Service routes to the new master.
        match &self.gate {
            Some(g) => g.wait_listed(t.epoch, &t.master.host).await,
            None => Ok(()),
        }
    }

    /// Set the role label to `value`, or remove it (`None`), at `epoch`
    /// (no write when already so).
    async fn write_value(
        &self,
        name: &str,
        epoch: u64,
        value: Option<&str>,
    ) -> Result<Outcome, DiscoveryError> {
        match value {
            Some(v) => self.write_label(name, epoch, v).await,
            None => {
                self.write(name, epoch, None, true, |pod, _| {
                    label(pod, &self.role_label).is_none()
                })
                .await
            }
        }
    }

    /// Set the role label to `value` at `epoch` (no write when already so).
    async fn write_label(
        &self,
        name: &str,
        epoch: u64,
        value: &str,
    ) -> Result<Outcome, DiscoveryError> {
        self.write(name, epoch, Some(value), false, |pod, stored| {
            stored == Some(epoch) && label(pod, &self.role_label) == Some(value)
        })
        .await
    }

    /// Read `name`, check the epoch, and unless `done(pod, stored epoch)`
    /// set (`Some`) or remove (`None`) the role label with the epoch
    /// annotation, conditional on the resourceVersion just read; a 409
    /// starts over from the read.
    async fn write(
        &self,
        name: &str,
        epoch: u64,
        value: Option<&str>,
        missing_ok: bool,
        done: impl Fn(&ObjectMeta, Option<u64>) -> bool,
    ) -> Result<Outcome, DiscoveryError> {
        let mut last = None;
        for _ in 0..CONFLICT_ATTEMPTS {
            let pod = match self.pods.get(name).await {
                Ok(p) => p,
                Err(e) if e.is_not_found() && missing_ok => return Ok(Outcome::Unchanged),
                Err(e) => return Err(e.into()),
            };
            let stored = check_epoch(&pod.metadata, epoch)?;
            if done(&pod.metadata, stored) {
                return Ok(Outcome::Unchanged);
            }
            // JSON, not a typed Pod: a merge patch removes a label with
            // `null`, which a typed Pod's label map cannot say.
            let body = json!({
                "metadata": {
                    "resourceVersion": resource_version(&pod.metadata),
                    "labels": { self.role_label.as_str(): value },
                    "annotations": { EPOCH_ANNOTATION: epoch.to_string() },
                }
            });
            match self.pods.merge_patch(name, &body).await {
                Ok(_) => return Ok(Outcome::Written),
                Err(e) if e.is_conflict() => {
                    tracing::debug!(pod = name, "409 Conflict; reading the pod again");
                    last = Some(e);
                }
                Err(e) if e.is_not_found() && missing_ok => return Ok(Outcome::Unchanged),
                Err(e) => return Err(e.into()),
            }
        }
        Err(DiscoveryError::Transient(format!(
            "kubernetes: pod {name}: still conflicting after {CONFLICT_ATTEMPTS} attempts: {}",
            last.map(|e| e.to_string()).unwrap_or_default()
        )))
    }

    fn ambiguous(&self, addr: &Addr, names: &[String]) -> DiscoveryError {
        DiscoveryError::Permanent(format!(
            "kubernetes: several pods matching {:?} have IP {} and none or several expose port \
             {}: {names:?}",
            self.selector, addr.host, addr.port
        ))
    }
}

enum NoMatch {
    None,
    Ambiguous(Vec<String>),
}

fn same_ip(a: &str, b: &str) -> bool {
    match (a.parse::<IpAddr>(), b.parse::<IpAddr>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

fn pod_ip(p: &Pod) -> Option<&str> {
    p.status.as_ref()?.pod_ip.as_deref()
}

/// The ports the pod's containers declare.
pub(crate) fn container_ports(
    p: &Pod,
) -> impl Iterator<Item = &k8s_openapi::api::core::v1::ContainerPort> {
    p.spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
}

fn exposes_port(p: &Pod, port: u16) -> bool {
    container_ports(p).any(|cp| cp.container_port == i32::from(port))
}

/// The name of the one pod among `pods` that is the instance `addr`, as
/// `publish` picks the master's pod; `Err` with the names of the pods that
/// share its IP when none or several match (empty when none has it).
/// Public for the fuzz target `kube_json`.
pub fn pod_name_of(pods: &[Pod], addr: &Addr) -> Result<String, Vec<String>> {
    match pods_of(pods, addr) {
        Ok(m) => Ok(m
            .first()
            .map(|p| object_name(&p.metadata).to_string())
            .unwrap_or_default()),
        Err(NoMatch::None) => Err(Vec::new()),
        Err(NoMatch::Ambiguous(names)) => Err(names),
    }
}

/// The pod(s) of an instance: by IP, then by container port when the IP is shared.
fn pods_of<'p>(pods: &'p [Pod], addr: &Addr) -> Result<Vec<&'p Pod>, NoMatch> {
    let by_ip: Vec<&Pod> = pods
        .iter()
        .filter(|p| pod_ip(p).is_some_and(|ip| same_ip(ip, &addr.host)))
        .collect();
    match by_ip.len() {
        0 => Err(NoMatch::None),
        1 => Ok(by_ip),
        _ => {
            let by_port: Vec<&Pod> = by_ip
                .iter()
                .copied()
                .filter(|p| exposes_port(p, addr.port))
                .collect();
            if by_port.len() == 1 {
                Ok(by_port)
            } else {
                Err(NoMatch::Ambiguous(
                    by_ip
                        .iter()
                        .map(|p| object_name(&p.metadata).to_string())
                        .collect(),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: &str, port: u16) -> Pod {
        serde_json::from_value(json!({"metadata":{"name":name},"status":{"podIP":ip},
               "spec":{"containers":[{"name":"c","ports":[{"containerPort":port}]}]}}))
        .unwrap()
    }

    #[test]
    fn matching_by_ip_then_port() {
        let pods = vec![
            pod("a", "10.0.0.1", 6379),
            pod("b", "10.0.0.2", 6379),
            pod("c", "10.0.0.2", 6380),
        ];
        let m = pods_of(&pods, &Addr::new("10.0.0.1", 1)).ok().unwrap();
        assert_eq!(object_name(&m[0].metadata), "a");
        let m = pods_of(&pods, &Addr::new("10.0.0.2", 6380)).ok().unwrap();
        assert_eq!(object_name(&m[0].metadata), "c");
        assert!(
            matches!(pods_of(&pods, &Addr::new("10.0.0.2", 1)), Err(NoMatch::Ambiguous(n)) if n.len() == 2)
        );
        assert!(matches!(
            pods_of(&pods, &Addr::new("10.0.0.9", 1)),
            Err(NoMatch::None)
        ));
        let v6 = vec![pod("d", "fd00::1", 1)];
        assert!(pods_of(&v6, &Addr::new("fd00:0::1", 1)).is_ok());
    }
}

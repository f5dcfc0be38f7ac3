//! The Kubernetes backend: publishes the master of a group through the
//! Kubernetes REST API, either as a role label on pods (`pod-labels`, the
//! dragonfly-operator's contract) or as the one endpoint of an
//! EndpointSlice picket owns (`endpointslice`, for a selector-less Service).
//!
//! Every object picket writes carries the config epoch in the
//! [`EPOCH_ANNOTATION`]; every write is conditional on the
//! `metadata.resourceVersion` picket read, after checking that the stored
//! epoch is not higher than its own (invariant 3). A 409 means someone
//! wrote in between: read again, check the epoch again, try again.
//!
//! `publish` is called by every daemon that learns a new config, so it
//! writes nothing when the objects already say what it would write.

pub mod client;
pub mod endpointslice;
pub mod gate;
pub mod kubeconfig;
pub mod members;
pub mod podlabels;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use self::client::KubeClient;
use self::endpointslice::EndpointSliceWriter;
use self::kubeconfig::ClusterConfig;
use self::podlabels::PodLabelWriter;
use super::{Backend, BoxFuture, DiscoveryError, Fence, Topology};
use crate::config::{KubernetesConfig, KubernetesMode};

/// The annotation holding the config epoch of the last write.
pub const EPOCH_ANNOTATION: &str = "picket.io/epoch";

/// How many times a write is re-read and retried after a 409 Conflict.
pub(crate) const CONFLICT_ATTEMPTS: usize = 5;

/// The Kubernetes discovery backend.
#[derive(Debug)]
pub struct KubernetesBackend {
    mode: Mode,
    required: bool,
    name: String,
    /// pod-labels with `skip_service_gate`: the fence is not verified.
    gate_skipped: bool,
}

/// What `/v1/status` and the log say of a pod-labels backend run with
/// `skip_service_gate = true`.
pub const GATE_SKIPPED_WARNING: &str = "skip_service_gate: the fence is confirmed as soon as \
     the label PATCH is accepted, not once the Service stops routing to the old master; a \
     failover can promote the new master while the Service still sends writes to the old one \
     (name the Service with `service` to close this)";

#[derive(Debug)]
enum Mode {
    PodLabels(PodLabelWriter),
    EndpointSlice(EndpointSliceWriter),
}

impl KubernetesBackend {
    /// Build the backend: read the kubeconfig (or the in-cluster service
    /// account) and check the mode's settings. Nothing is sent yet.
    pub fn new(cfg: &KubernetesConfig) -> Result<Self, DiscoveryError> {
        let cluster = ClusterConfig::load(cfg.kubeconfig.as_deref(), cfg.context.as_deref())
            .map_err(|e| DiscoveryError::Permanent(format!("kubernetes: {e}")))?;
        let client = KubeClient::new(cluster, cfg.timeout)?;
        Self::with_client(cfg, client)
    }

    /// Build the backend around an existing client (tests shorten its retry budget).
    pub fn with_client(cfg: &KubernetesConfig, client: KubeClient) -> Result<Self, DiscoveryError> {
        let bad = |m: String| DiscoveryError::Permanent(format!("kubernetes: {m}"));
        if cfg.namespace.trim().is_empty() {
            return Err(bad("`namespace` must not be empty".into()));
        }
        let (mode, target) = match cfg.mode {
            KubernetesMode::PodLabels => {
                let selector = cfg
                    .pod_selector
                    .as_deref()
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| bad("pod-labels mode needs `pod_selector`".into()))?;
                for (what, v) in [
                    ("role_label", &cfg.role_label),
                    ("master_value", &cfg.master_value),
                    ("replica_value", &cfg.replica_value),
                ] {
                    if v.trim().is_empty() {
                        return Err(bad(format!("`{what}` must not be empty")));
                    }
                }
                if cfg.master_value == cfg.replica_value {
                    return Err(bad("`master_value` and `replica_value` must differ".into()));
                }
                let mut w = PodLabelWriter::new(
                    client.clone(),
                    &cfg.namespace,
                    selector,
                    &cfg.role_label,
                    &cfg.master_value,
                    &cfg.replica_value,
                );
                match (cfg.service.is_some(), cfg.skip_service_gate) {
                    (false, false) => {
                        return Err(bad(format!("`service` {}", crate::config::NO_SERVICE_GATE)));
                    }
                    (true, true) => {
                        return Err(bad(
                            "`skip_service_gate` contradicts `service`: keep one of them".into(),
                        ));
                    }
                    _ => {}
                }
                if let Some(service) = cfg.service.as_deref().map(str::trim) {
                    if service.is_empty() {
                        return Err(bad("`service` must not be empty".into()));
                    }
                    if cfg.service_gate_timeout.is_zero() {
                        return Err(bad("`service_gate_timeout` must be greater than 0".into()));
                    }
                    w = w.with_gate(gate::ServiceGate::new(
                        client.clone(),
                        &cfg.namespace,
                        service,
                        cfg.service_gate_timeout,
                    ));
                }
                (Mode::PodLabels(w), format!("pods {selector}"))
            }
            KubernetesMode::Endpointslice => {
                if cfg.skip_service_gate {
                    return Err(bad(
                        "`skip_service_gate` only applies to pod-labels mode".into()
                    ));
                }
                let service = cfg
                    .service
                    .as_deref()
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| bad("endpointslice mode needs `service`".into()))?;
                if cfg.port_name.trim().is_empty() {
                    return Err(bad("`port_name` must not be empty".into()));
                }
                let w = EndpointSliceWriter::new(
                    client.clone(),
                    &cfg.namespace,
                    service,
                    &cfg.port_name,
                );
                let target = format!("endpointslice {}", w.slice_name());
                (Mode::EndpointSlice(w), target)
            }
        };
        let gate_skipped = cfg.mode == KubernetesMode::PodLabels && cfg.skip_service_gate;
        Ok(KubernetesBackend {
            name: format!("kubernetes:{}/{target}", cfg.namespace),
            gate_skipped,
            mode,
            required: cfg.required,
        })
    }
}

impl Backend for KubernetesBackend {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn required(&self) -> bool {
        self.required
    }

    fn fence<'a>(&'a self, fence: &'a Fence) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        Box::pin(async move {
            match &self.mode {
                Mode::PodLabels(w) => w.fence(fence).await,
                Mode::EndpointSlice(w) => w.fence(fence).await,
            }
        })
    }

    fn publish<'a>(&'a self, topology: &'a Topology) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        Box::pin(async move {
            match &self.mode {
                Mode::PodLabels(w) => w.publish(topology).await,
                Mode::EndpointSlice(w) => w.publish(topology).await,
            }
        })
    }

    fn warning(&self) -> Option<&'static str> {
        self.gate_skipped.then_some(GATE_SKIPPED_WARNING)
    }

    fn service_gate(&self) -> Option<gate::GateStatus> {
        match &self.mode {
            Mode::PodLabels(w) => w.gate().map(gate::ServiceGate::status),
            Mode::EndpointSlice(_) => None,
        }
    }
}

/// The epoch an object carries; `None` when it has none. An unparsable
/// value counts as none (it is not an epoch picket wrote), with a warning.
pub fn stored_epoch(meta: &ObjectMeta) -> Option<u64> {
    let raw = meta.annotations.as_ref()?.get(EPOCH_ANNOTATION)?;
    match raw.trim().parse() {
        Ok(e) => Some(e),
        Err(_) => {
            tracing::warn!(
                object = object_name(meta),
                value = %raw,
                "ignoring an unparsable {EPOCH_ANNOTATION} annotation"
            );
            None
        }
    }
}

/// `metadata.resourceVersion` (empty when absent).
pub fn resource_version(meta: &ObjectMeta) -> String {
    meta.resource_version.clone().unwrap_or_default()
}

/// `metadata.name` (empty when absent).
pub fn object_name(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

/// One label's value.
pub fn label<'m>(meta: &'m ObjectMeta, key: &str) -> Option<&'m str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// `Stale` when the object holds a higher epoch than `ours`.
pub fn check_epoch(meta: &ObjectMeta, ours: u64) -> Result<Option<u64>, DiscoveryError> {
    let stored = stored_epoch(meta);
    match stored {
        Some(s) if s > ours => Err(DiscoveryError::Stale { stored: s, ours }),
        _ => Ok(stored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(epoch: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some("p".into()),
            annotations: Some([(EPOCH_ANNOTATION.to_string(), epoch.to_string())].into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn epoch_annotation() {
        let o = meta("7");
        assert_eq!(stored_epoch(&o), Some(7));
        assert_eq!(check_epoch(&o, 7).unwrap(), Some(7));
        assert_eq!(
            check_epoch(&o, 6).unwrap_err(),
            DiscoveryError::Stale { stored: 7, ours: 6 }
        );
        assert_eq!(stored_epoch(&meta("x")), None);
        assert_eq!(stored_epoch(&ObjectMeta::default()), None);
    }
}

//! Gating verified on the Service (`pod-labels` mode with `service` set).
//!
//! A label PATCH being accepted does not take a pod out of routing: the
//! endpoint-slice controller drops it from the Service's EndpointSlices
//! some milliseconds later (3–50 ms on a real control plane). So the fence
//! is confirmed only once no EndpointSlice of the Service (label
//! `kubernetes.io/service-name=<service>`) lists the old master's IP, and
//! the publication only once one lists the new master's IP as ready. Each
//! wait watches the slices with kube-runtime's watcher (a LIST, then a
//! WATCH from its version: the change shows as soon as the controller
//! writes it) and is bounded by `service_gate_timeout`; when it passes the
//! write fails permanently (the fence of a required backend then aborts
//! the failover before the promotion).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt as _;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::watcher;
use serde::Serialize;
use tokio::time::Instant;

use super::client::{KubeClient, watch_backoff, watch_error, watch_store};
use super::endpointslice::SERVICE_NAME_LABEL;
use crate::discovery::DiscoveryError;
use crate::metrics as m;

/// The first wait after a failed list or watch of the slices; doubled up
/// to [`RETRY_MAX`]. Short: the whole wait is bounded by seconds.
const RETRY_FIRST: Duration = Duration::from_millis(10);
/// The longest wait after a failed list or watch of the slices.
const RETRY_MAX: Duration = Duration::from_millis(200);

/// Which wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GateKind {
    /// The old master left the Service.
    Fence,
    /// The new master is in the Service.
    Publish,
}

impl GateKind {
    /// `fence` or `publish` (the `gate` label of the metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            GateKind::Fence => "fence",
            GateKind::Publish => "publish",
        }
    }
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GateResult {
    /// The Service showed what was waited for.
    Ok,
    /// `service_gate_timeout` passed first.
    Timeout,
    /// Reading the slices failed for good (e.g. 403).
    Error,
}

impl GateResult {
    /// `ok`, `timeout` or `error` (the `result` label of the metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            GateResult::Ok => "ok",
            GateResult::Timeout => "timeout",
            GateResult::Error => "error",
        }
    }
}

/// The last wait of one kind, for `/v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GateWait {
    /// The epoch of the write that waited.
    pub epoch: u64,
    /// The IP waited on (the old master's for a fence, the new one's for a publication).
    pub address: String,
    /// How long the wait took, in milliseconds.
    pub waited_ms: u64,
    /// How it ended.
    pub result: GateResult,
    /// When it ended (unix seconds).
    pub at: u64,
}

/// The Service gate's state, for `/v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GateStatus {
    /// The Service whose EndpointSlices are watched.
    pub service: String,
    /// `service_gate_timeout`, in milliseconds.
    pub timeout_ms: u64,
    /// The last fence's wait.
    pub fence: Option<GateWait>,
    /// The last publication's wait.
    pub publish: Option<GateWait>,
}

/// Waits until the Service's EndpointSlices show the routing a write asked for.
#[derive(Debug, Clone)]
pub struct ServiceGate {
    client: KubeClient,
    namespace: String,
    service: String,
    timeout: Duration,
    status: Arc<Mutex<GateStatus>>,
}

impl ServiceGate {
    /// A gate on `service` in `namespace`, each wait bounded by `timeout`.
    pub fn new(client: KubeClient, namespace: &str, service: &str, timeout: Duration) -> Self {
        ServiceGate {
            client,
            namespace: namespace.to_string(),
            service: service.to_string(),
            timeout,
            status: Arc::new(Mutex::new(GateStatus {
                service: service.to_string(),
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                fence: None,
                publish: None,
            })),
        }
    }

    /// The last waits.
    pub fn status(&self) -> GateStatus {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Until no EndpointSlice of the Service lists `ip` (in any condition:
    /// a not-ready endpoint may still get traffic while terminating).
    pub async fn wait_gone(&self, epoch: u64, ip: &str) -> Result<(), DiscoveryError> {
        self.wait(GateKind::Fence, epoch, ip, |slices| {
            !slices.iter().any(|s| lists(s, ip, false))
        })
        .await
    }

    /// Until an EndpointSlice of the Service lists `ip` as ready.
    pub async fn wait_listed(&self, epoch: u64, ip: &str) -> Result<(), DiscoveryError> {
        self.wait(GateKind::Publish, epoch, ip, |slices| {
            slices.iter().any(|s| lists(s, ip, true))
        })
        .await
    }

    async fn wait(
        &self,
        kind: GateKind,
        epoch: u64,
        ip: &str,
        done: impl Fn(&[Arc<EndpointSlice>]) -> bool,
    ) -> Result<(), DiscoveryError> {
        let started = Instant::now();
        let mut last_error = None;
        let watched = tokio::time::timeout(self.timeout, self.watch(&done, &mut last_error)).await;
        let result = match watched {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err((GateResult::Error, message)),
            Err(_) => {
                let what = match kind {
                    GateKind::Fence => format!("still lists the old master {ip}"),
                    GateKind::Publish => format!("lists no ready endpoint {ip} (the new master)"),
                };
                Err((
                    GateResult::Timeout,
                    format!(
                        "the Service {}/{} {what} after service_gate_timeout {} (is the \
                         endpoint-slice controller running, and does the Service select the \
                         pods by the role label?){}",
                        self.namespace,
                        self.service,
                        humantime::format_duration(self.timeout),
                        last_error
                            .as_deref()
                            .map(|e| format!("; last error: {e}"))
                            .unwrap_or_default()
                    ),
                ))
            }
        };
        let took = started.elapsed();
        let outcome = match &result {
            Ok(()) => GateResult::Ok,
            Err((r, _)) => *r,
        };
        metrics::histogram!(m::DISCOVERY_GATE_WAIT, "backend" => "kubernetes",
            "gate" => kind.as_str(), "result" => outcome.as_str())
        .record(took.as_secs_f64());
        let wait = GateWait {
            epoch,
            address: ip.to_string(),
            waited_ms: u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            result: outcome,
            at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default(),
        };
        {
            let mut st = self.status.lock().unwrap_or_else(|e| e.into_inner());
            match kind {
                GateKind::Fence => st.fence = Some(wait),
                GateKind::Publish => st.publish = Some(wait),
            }
        }
        match result {
            Ok(()) => {
                tracing::info!(service = %self.service, gate = kind.as_str(), epoch, address = ip,
                    waited_ms = took.as_millis() as u64, "the Service shows the change");
                Ok(())
            }
            Err((_, message)) => Err(DiscoveryError::Permanent(format!("kubernetes: {message}"))),
        }
    }

    /// Watch the Service's slices until `done` holds for all of them;
    /// an error that waiting cannot cure (403) ends it. Transient errors
    /// are kept in `last_error` for the timeout's message.
    async fn watch(
        &self,
        done: &impl Fn(&[Arc<EndpointSlice>]) -> bool,
        last_error: &mut Option<String>,
    ) -> Result<(), String> {
        let selector = format!("{SERVICE_NAME_LABEL}={}", self.service);
        let url = format!(
            "{}/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices",
            self.client.server(),
            self.namespace
        );
        let mut backoff = watch_backoff(RETRY_FIRST, RETRY_MAX);
        let mut reauthenticated = false;
        loop {
            let client = match self.client.kube_client().await {
                Ok(c) => c,
                Err(e) if e.is_transient() => {
                    *last_error = Some(e.to_string());
                    tokio::time::sleep(backoff.next().unwrap_or(RETRY_MAX)).await;
                    continue;
                }
                Err(e) => return Err(e.to_string()),
            };
            let api: Api<EndpointSlice> = Api::namespaced(client, &self.namespace);
            let config = watcher::Config::default().labels(&selector);
            let (slices, mut changes) =
                watch_store(api, config, watch_backoff(RETRY_FIRST, RETRY_MAX));
            while let Some(change) = changes.next().await {
                let e = match change {
                    Ok(()) if done(&slices.state()) => return Ok(()),
                    Ok(()) => continue,
                    Err(e) => watch_error(&e, &url),
                };
                match e.code() {
                    // The watcher lists again by itself.
                    Some(410) => {}
                    Some(401) if !reauthenticated && self.client.reauthenticate().await => {
                        reauthenticated = true;
                    }
                    _ if e.is_transient() => *last_error = Some(e.to_string()),
                    _ => return Err(e.to_string()),
                }
            }
        }
    }
}

/// Whether `slice` has an endpoint with address `ip` (ready, when
/// `ready_only`; a missing `ready` counts as ready, as the API defines it).
pub fn lists(slice: &EndpointSlice, ip: &str, ready_only: bool) -> bool {
    let want: Option<std::net::IpAddr> = ip.parse().ok();
    slice.endpoints.iter().any(|ep| {
        let has = ep
            .addresses
            .iter()
            .any(|a| match (a.parse::<std::net::IpAddr>().ok(), want) {
                (Some(x), Some(y)) => x == y,
                _ => a == ip,
            });
        let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
        has && (!ready_only || ready)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The label values the metrics register before the first wait are
    /// the ones a wait records.
    #[test]
    fn label_values_are_the_registered_ones() {
        for k in [GateKind::Fence, GateKind::Publish] {
            assert!(m::GATE_KINDS.contains(&k.as_str()), "{}", k.as_str());
        }
        for r in [GateResult::Ok, GateResult::Timeout, GateResult::Error] {
            assert!(m::GATE_RESULTS.contains(&r.as_str()), "{}", r.as_str());
        }
        assert_eq!((m::GATE_KINDS.len(), m::GATE_RESULTS.len()), (2, 3));
    }

    #[test]
    fn listing() {
        let slice = |v: serde_json::Value| -> EndpointSlice { serde_json::from_value(v).unwrap() };
        let s = slice(json!({"addressType": "IPv4", "endpoints": [
            {"addresses": ["10.0.0.1"], "conditions": {"ready": false}},
            {"addresses": ["10.0.0.2"], "conditions": {}},
        ]}));
        assert!(lists(&s, "10.0.0.1", false));
        assert!(!lists(&s, "10.0.0.1", true), "not ready");
        assert!(
            lists(&s, "10.0.0.2", true),
            "no ready field counts as ready"
        );
        assert!(!lists(&s, "10.0.0.3", false));
        assert!(!lists(
            &slice(json!({"addressType": "IPv4", "endpoints": null})),
            "10.0.0.1",
            false
        ));
    }
}

//! Gating verified on the Service (`pod-labels` mode with `service` set).
//!
//! A label PATCH being accepted does not take a pod out of routing: the
//! endpoint-slice controller drops it from the Service's EndpointSlices
//! some milliseconds later (3–50 ms on a real control plane). So the fence
//! is confirmed only once no EndpointSlice of the Service (label
//! `kubernetes.io/service-name=<service>`) lists the old master's IP, and
//! the publication only once one lists the new master's IP as ready. Both
//! waits poll the slices and are bounded by `service_gate_timeout`; when it
//! passes the write fails permanently (the fence of a required backend
//! then aborts the failover before the promotion).

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::Value;
use tokio::time::Instant;

use super::client::{Kind, KubeClient};
use super::endpointslice::SERVICE_NAME_LABEL;
use crate::discovery::DiscoveryError;
use crate::metrics as m;

/// The first delay between two reads of the slices; doubled up to
/// [`POLL_MAX`]. Short, because the controller takes milliseconds.
const POLL_FIRST: Duration = Duration::from_millis(10);
/// The longest delay between two reads of the slices.
const POLL_MAX: Duration = Duration::from_millis(100);

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
        done: impl Fn(&[Value]) -> bool,
    ) -> Result<(), DiscoveryError> {
        let started = Instant::now();
        let deadline = started + self.timeout;
        let selector = format!("{SERVICE_NAME_LABEL}={}", self.service);
        let mut delay = POLL_FIRST;
        let mut last_error = None;
        let result = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // The client's own retry budget may be longer than the gate's.
            match tokio::time::timeout(
                left,
                self.client
                    .list(Kind::EndpointSlice, &self.namespace, Some(&selector)),
            )
            .await
            {
                Ok(Ok(slices)) if done(&slices) => break Ok(()),
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.is_transient() => last_error = Some(e.to_string()),
                Ok(Err(e)) => break Err((GateResult::Error, e.to_string())),
                Err(_) => {}
            }
            if Instant::now() >= deadline {
                let what = match kind {
                    GateKind::Fence => format!("still lists the old master {ip}"),
                    GateKind::Publish => format!("lists no ready endpoint {ip} (the new master)"),
                };
                break Err((
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
                ));
            }
            // The last read comes at the deadline itself.
            tokio::time::sleep(delay.min(deadline.saturating_duration_since(Instant::now()))).await;
            delay = (delay * 2).min(POLL_MAX);
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
}

/// Whether `slice` has an endpoint with address `ip` (ready, when
/// `ready_only`; a missing `ready` counts as ready, as the API defines it).
pub fn lists(slice: &Value, ip: &str, ready_only: bool) -> bool {
    let want: Option<std::net::IpAddr> = ip.parse().ok();
    slice
        .get("endpoints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|ep| {
            let has = ep
                .get("addresses")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .any(|a| match (a.parse::<std::net::IpAddr>().ok(), want) {
                    (Some(x), Some(y)) => x == y,
                    _ => a == ip,
                });
            let ready = ep
                .pointer("/conditions/ready")
                .and_then(Value::as_bool)
                .unwrap_or(true);
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
        let s = json!({"endpoints": [
            {"addresses": ["10.0.0.1"], "conditions": {"ready": false}},
            {"addresses": ["10.0.0.2"], "conditions": {}},
        ]});
        assert!(lists(&s, "10.0.0.1", false));
        assert!(!lists(&s, "10.0.0.1", true), "not ready");
        assert!(
            lists(&s, "10.0.0.2", true),
            "no ready field counts as ready"
        );
        assert!(!lists(&s, "10.0.0.3", false));
        assert!(!lists(&json!({"endpoints": null}), "10.0.0.1", false));
    }
}

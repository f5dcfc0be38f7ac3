//! A group's members from Kubernetes: the pods a label selector matches,
//! kept current by kube-runtime's watcher (a LIST, then WATCHes from its
//! resourceVersion with bookmarks; a `410 Gone` lists again) into
//! kube-runtime's reflector store, as client-go's reflector does. Errors
//! are reported with the pods as last seen, and the watcher tries again
//! after a jittered backoff.
//!
//! The watcher only reports what the pods are; the group's task decides
//! what to do with a new member, a gone one or a master whose pod is being
//! deleted (`group/members.rs`).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::client::{KubeClient, watch_backoff, watch_error, watch_store};
use super::kubeconfig::ClusterConfig;
use super::podlabels::container_ports;
use crate::addr::Addr;
use crate::config::{MembersConfig, PortRef};
use crate::discovery::DiscoveryError;

/// One pod of the group, as the watch last showed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The pod's name.
    pub pod: String,
    /// Its IP and data port.
    pub addr: Addr,
    /// Its `Ready` condition is true.
    pub ready: bool,
    /// It is being deleted (`metadata.deletionTimestamp` is set), with
    /// its grace period.
    pub deleting: Option<Duration>,
}

/// The group's pods with an IP and the data port, by pod name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    /// Every such pod.
    pub pods: Vec<Member>,
    /// Why the last LIST or WATCH failed, until one works again: the pods
    /// are then as last seen (a Role without `watch` shows here).
    pub error: Option<String>,
}

impl Members {
    /// The member at `addr`, if any.
    pub fn at(&self, addr: &Addr) -> Option<&Member> {
        self.pods.iter().find(|m| m.addr == *addr)
    }
}

/// The settings of one group's pod watch.
#[derive(Debug, Clone)]
pub struct PodWatch {
    group: String,
    client: KubeClient,
    namespace: String,
    selector: String,
    port: PortRef,
    watch_timeout: Duration,
}

/// How long one watch request lasts before the server ends it and the
/// watcher starts the next from its last version (client-go: 5-10 min).
const WATCH_TIMEOUT: Duration = Duration::from_secs(290);

/// The first and the longest wait after a failed LIST or WATCH.
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

impl PodWatch {
    /// Build the watch of `cfg` (already [`MembersConfig::resolved`]): read
    /// the kubeconfig or the in-cluster service account. Nothing is sent.
    pub fn new(group: &str, cfg: &MembersConfig) -> Result<PodWatch, DiscoveryError> {
        let bad = |m: String| DiscoveryError::Permanent(format!("kubernetes members: {m}"));
        let namespace = cfg
            .namespace
            .clone()
            .ok_or_else(|| bad("no namespace".into()))?;
        let selector = cfg
            .pod_selector
            .clone()
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| bad("no pod_selector".into()))?;
        let cluster = ClusterConfig::load(cfg.kubeconfig.as_deref(), cfg.context.as_deref())
            .map_err(|e| bad(e.to_string()))?;
        let client = KubeClient::new(cluster, cfg.timeout)?;
        Ok(PodWatch {
            group: group.to_string(),
            client,
            namespace,
            selector,
            port: cfg.port.clone(),
            watch_timeout: WATCH_TIMEOUT,
        })
    }

    /// The same watch with each WATCH request lasting `d` (tests: the
    /// next one starts from the last version, or lists again after a
    /// `410 Gone`).
    pub fn with_watch_timeout(mut self, d: Duration) -> PodWatch {
        self.watch_timeout = d;
        self
    }

    /// Report the members on `tx` until `cancel`: `None` until the first
    /// LIST succeeded, then every change.
    pub async fn run(self, tx: watch::Sender<Option<Arc<Members>>>, cancel: CancellationToken) {
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = self.watch_loop(&tx) => {}
        }
    }

    async fn watch_loop(&self, tx: &watch::Sender<Option<Arc<Members>>>) {
        let secs = u32::try_from(self.watch_timeout.as_secs().max(1)).unwrap_or(u32::MAX);
        let url = format!(
            "{}/api/v1/namespaces/{}/pods",
            self.client.server(),
            self.namespace
        );
        let mut backoff = watch_backoff(BACKOFF_FIRST, BACKOFF_MAX);
        loop {
            // A client for the identity of now (an exec plugin may return
            // another client certificate after a 401).
            let client = match self.client.watch_client(self.watch_timeout).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(group = %self.group, error = %e, "no credential for the pod watch; retrying");
                    report_error(tx, Some(e.to_string()));
                    tokio::time::sleep(backoff.next().unwrap_or(BACKOFF_MAX)).await;
                    continue;
                }
            };
            let api: Api<Pod> = Api::namespaced(client, &self.namespace);
            let config = watcher::Config::default()
                .labels(&self.selector)
                .timeout(secs);
            // The store holds the pods of the last complete list, kept
            // current by the watch's events.
            let (pods, mut changes) =
                watch_store(api, config, watch_backoff(BACKOFF_FIRST, BACKOFF_MAX));
            while let Some(change) = changes.next().await {
                let e = match change {
                    Ok(()) => {
                        self.report(tx, &pods.state());
                        continue;
                    }
                    Err(e) => watch_error(&e, &url),
                };
                if e.code() == Some(401) && self.client.reauthenticate().await {
                    tracing::info!(group = %self.group, "401 on the pod watch; refreshing the credential");
                    break;
                }
                if e.code() == Some(410) {
                    // The watcher lists again by itself.
                    tracing::info!(group = %self.group, "the pod watch's version is too old (410 Gone): listing again");
                    continue;
                }
                tracing::warn!(group = %self.group, error = %e, "the pod list or watch failed; retrying");
                report_error(tx, Some(e.to_string()));
            }
        }
    }

    /// Report the pods as they are now (a list or an event worked: no error).
    fn report(&self, tx: &watch::Sender<Option<Arc<Members>>>, pods: &[Arc<Pod>]) {
        let mut pods: Vec<Member> = pods
            .iter()
            .filter_map(|p| member_of(p, &self.port))
            .collect();
        // By pod name: the store keeps no order.
        pods.sort_by(|a, b| a.pod.cmp(&b.pod));
        let members = Members { pods, error: None };
        tx.send_if_modified(|cur| {
            if cur.as_deref() == Some(&members) {
                return false;
            }
            *cur = Some(Arc::new(members));
            true
        });
    }
}

/// Report why the list or watch failed, keeping the pods as last seen
/// (nothing is reported before the first list: there are no pods to keep).
fn report_error(tx: &watch::Sender<Option<Arc<Members>>>, error: Option<String>) {
    tx.send_if_modified(|cur| match cur {
        Some(m) if m.error != error => {
            *cur = Some(Arc::new(Members {
                pods: m.pods.clone(),
                error: error.clone(),
            }));
            true
        }
        _ => false,
    });
}

/// The member a pod is: it needs an IP and the data port (by number, or
/// the `containerPort` of the container port of that name).
pub fn member_of(pod: &Pod, port: &PortRef) -> Option<Member> {
    let name = pod.metadata.name.as_deref()?;
    let status = pod.status.as_ref()?;
    let ip = status.pod_ip.as_deref().filter(|s| !s.is_empty())?;
    let port = match port {
        PortRef::Number(n) => *n,
        PortRef::Name(want) => container_ports(pod)
            .find(|p| p.name.as_deref() == Some(want.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())?,
    };
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let deleting = pod.metadata.deletion_timestamp.as_ref().map(|_| {
        let grace = pod.metadata.deletion_grace_period_seconds;
        Duration::from_secs(grace.and_then(|s| u64::try_from(s).ok()).unwrap_or(30))
    });
    Some(Member {
        pod: name.to_string(),
        addr: Addr::new(ip.to_string(), port),
        ready,
        deleting,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pod_json(name: &str, ip: Option<&str>, ready: bool) -> Value {
        json!({
            "metadata": {"name": name},
            "spec": {"containers": [
                {"name": "sidecar", "ports": [{"name": "metrics", "containerPort": 9121}]},
                {"name": "server", "ports": [{"name": "redis", "containerPort": 6380},
                                             {"name": "admin", "containerPort": 9999}]},
            ]},
            "status": {
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            },
        })
    }

    fn pod(name: &str, ip: Option<&str>, ready: bool) -> Pod {
        serde_json::from_value(pod_json(name, ip, ready)).unwrap()
    }
    #[test]
    fn a_pod_is_a_member_by_its_ip_and_the_port_by_number_or_name() {
        let p = pod("cache-0", Some("10.1.2.3"), true);
        let m = member_of(&p, &PortRef::Name("redis".into())).unwrap();
        assert_eq!(m.addr, Addr::new("10.1.2.3", 6380));
        assert!(m.ready);
        assert_eq!(m.deleting, None);
        let m = member_of(&p, &PortRef::Number(7000)).unwrap();
        assert_eq!(m.addr.port, 7000);
        // No such port name, no IP yet: not a member.
        assert_eq!(member_of(&p, &PortRef::Name("nope".into())), None);
        assert_eq!(
            member_of(&pod("cache-1", None, false), &PortRef::Number(6379)),
            None
        );
        assert!(
            !member_of(
                &pod("cache-2", Some("10.1.2.4"), false),
                &PortRef::Number(6379)
            )
            .unwrap()
            .ready
        );
    }

    #[test]
    fn a_pod_being_deleted_carries_its_grace_period() {
        let mut p = pod_json("cache-0", Some("10.1.2.3"), true);
        p["metadata"]["deletionTimestamp"] = json!("2026-12-02T10:00:00Z");
        p["metadata"]["deletionGracePeriodSeconds"] = json!(45);
        let p: Pod = serde_json::from_value(p).unwrap();
        let m = member_of(&p, &PortRef::Number(6379)).unwrap();
        assert_eq!(m.deleting, Some(Duration::from_secs(45)));
    }
}

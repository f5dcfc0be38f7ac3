//! The Kubernetes backend against the fake API server of the test harness (harness/src/fake_kube.rs).

use picket_harness::fake_kube;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use fake_kube::{DEFAULT_TOKEN, FakeKind, FakeKube, GARBAGE, LoggedRequest, unrelated_ca_pem};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use picket::addr::Addr;
use picket::config::{KubernetesConfig, KubernetesMode};
use picket::discovery::kubernetes::client::{KubeClient, RetryPolicy};
use picket::discovery::kubernetes::gate::GateResult;
use picket::discovery::kubernetes::kubeconfig::ClusterConfig;
use picket::discovery::kubernetes::{EPOCH_ANNOTATION, KubernetesBackend};
use picket::discovery::{Backend, DiscoveryError, Fence, Reporter, Topology};
use serde_json::{Value, json};

const NS: &str = "cache";

fn cfg(kubeconfig: &Path, mode: KubernetesMode) -> KubernetesConfig {
    KubernetesConfig {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        context: None,
        namespace: NS.into(),
        mode,
        pod_selector: Some("app=cache".into()),
        role_label: "role".into(),
        master_value: "master".into(),
        replica_value: "replica".into(),
        // In pod-labels mode a Service turns on the gate (tests of it set
        // one); the others opt out of it explicitly.
        service: (mode == KubernetesMode::Endpointslice).then(|| "cache".into()),
        skip_service_gate: mode == KubernetesMode::PodLabels,
        port_name: "redis".into(),
        required: true,
        timeout: Duration::from_secs(2),
        service_gate_timeout: Duration::from_secs(3),
    }
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        budget: Duration::from_secs(5),
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
    }
}

/// A kubeconfig whose cluster is `cluster_yaml` (indented fields) and user `user_yaml`.
fn kubeconfig_with(dir: &Path, cluster_yaml: &str, user_yaml: &str) -> PathBuf {
    let text = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\nclusters:\n- name: fake\n  cluster:\n{cluster_yaml}\nusers:\n- name: picket\n  user:\n{user_yaml}\ncontexts:\n- name: test\n  context:\n    cluster: fake\n    user: picket\n    namespace: {NS}\n"
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}

fn ca_data(fake: &FakeKube) -> String {
    format!(
        "    server: {}\n    certificate-authority-data: {}",
        fake.url(),
        B64.encode(fake.ca_pem())
    )
}

fn token_kubeconfig(dir: &Path, fake: &FakeKube, token: &str) -> PathBuf {
    kubeconfig_with(dir, &ca_data(fake), &format!("    token: {token}"))
}

fn backend_from(path: &Path, mode: KubernetesMode) -> KubernetesBackend {
    let c = cfg(path, mode);
    let cluster = ClusterConfig::from_kubeconfig(path, None).unwrap();
    let client = KubeClient::new(cluster, c.timeout)
        .unwrap()
        .with_retry(fast_retry());
    KubernetesBackend::with_client(&c, client).unwrap()
}

fn seed_pods(fake: &FakeKube) {
    fake.add_pod(
        NS,
        "cache-0",
        "10.0.0.1",
        &[("app", "cache"), ("role", "master")],
    );
    fake.add_pod(
        NS,
        "cache-1",
        "10.0.0.2",
        &[("app", "cache"), ("role", "replica")],
    );
    fake.add_pod(
        NS,
        "cache-2",
        "10.0.0.3",
        &[("app", "cache"), ("role", "replica")],
    );
    // Not selected: must never be touched.
    fake.add_pod(
        NS,
        "web-0",
        "10.0.0.9",
        &[("app", "web"), ("role", "master")],
    );
}

fn topo(epoch: u64, master: &str, old: Option<&str>) -> Topology {
    Topology {
        group: "cache".into(),
        epoch,
        master: master.parse().unwrap(),
        old_master: old.map(|o| o.parse().unwrap()),
        // Every other seeded pod replicates from the master.
        replicas: ["10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"]
            .iter()
            .filter(|a| **a != master)
            .map(|a| a.parse().unwrap())
            .collect(),
        reporter: Reporter::Leader,
    }
}

fn fence(epoch: u64, old: &str) -> Fence {
    Fence {
        group: "cache".into(),
        epoch,
        old_master: old.parse::<Addr>().unwrap(),
    }
}

fn role(fake: &FakeKube, pod: &str) -> Option<String> {
    fake.label(FakeKind::Pod, NS, pod, "role")
}

fn epoch_of(obj: &Value) -> Option<&str> {
    obj["metadata"]["annotations"][EPOCH_ANNOTATION].as_str()
}

fn pod_name(r: &LoggedRequest) -> &str {
    r.path.rsplit('/').next().unwrap()
}

// ---- pod-labels ----

/// A fake API server (with the three pods of [`seed_pods`] when `seed`),
/// a token kubeconfig for it in a temporary directory, and a backend in
/// `mode` through it.
async fn fake_with_backend(
    mode: KubernetesMode,
    seed: bool,
) -> (FakeKube, tempfile::TempDir, KubernetesBackend) {
    let fake = FakeKube::start().await;
    if seed {
        seed_pods(&fake);
    }
    let dir = tempfile::tempdir().unwrap();
    let b = backend_from(&token_kubeconfig(dir.path(), &fake, DEFAULT_TOKEN), mode);
    (fake, dir, b)
}

/// `e` is a permanent error whose message holds every one of `parts`.
#[track_caller]
fn assert_permanent(e: &DiscoveryError, parts: &[&str]) {
    assert!(
        matches!(e, DiscoveryError::Permanent(m) if parts.iter().all(|p| m.contains(p))),
        "expected a permanent error naming {parts:?}: {e:?}"
    );
}

/// `e` is a transient error whose message holds every one of `parts`.
#[track_caller]
fn assert_transient(e: &DiscoveryError, parts: &[&str]) {
    assert!(
        matches!(e, DiscoveryError::Transient(m) if parts.iter().all(|p| m.contains(p))),
        "expected a transient error naming {parts:?}: {e:?}"
    );
}

#[tokio::test]
async fn pod_labels_fence_then_publish_in_gated_order() {
    let (fake, _dir, b) = fake_with_backend(KubernetesMode::PodLabels, true).await;
    assert_eq!(b.kind(), "kubernetes");
    assert!(b.required());

    let rv_before =
        fake.object(FakeKind::Pod, NS, "cache-0").unwrap()["metadata"]["resourceVersion"].clone();
    b.fence(&fence(5, "10.0.0.1:6379")).await.unwrap();
    assert_eq!(role(&fake, "cache-0"), None, "fence removes the role label");
    let writes = fake.writes();
    assert_eq!(writes.len(), 1, "{writes:?}");
    let w = &writes[0];
    assert_eq!(w.method, "PATCH");
    assert_eq!(w.path, "/api/v1/namespaces/cache/pods/cache-0");
    assert_eq!(
        w.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    let body = w.json();
    assert_eq!(
        body["metadata"]["resourceVersion"], rv_before,
        "precondition on what was read"
    );
    assert_eq!(body["metadata"]["labels"]["role"], Value::Null);
    assert_eq!(body["metadata"]["annotations"][EPOCH_ANNOTATION], "5");
    // The list used the selector.
    let list = fake
        .requests()
        .into_iter()
        .find(|r| r.path.ends_with("/pods"))
        .unwrap();
    assert!(
        list.query
            .as_deref()
            .unwrap()
            .split('&')
            .any(|p| p == "labelSelector=app%3Dcache"),
        "{list:?}"
    );

    fake.clear_requests();
    b.publish(&topo(5, "10.0.0.2:6379", Some("10.0.0.1:6379")))
        .await
        .unwrap();
    assert_eq!(role(&fake, "cache-1").as_deref(), Some("master"));
    assert_eq!(role(&fake, "cache-0").as_deref(), Some("replica"));
    assert_eq!(role(&fake, "cache-2").as_deref(), Some("replica"));
    assert_eq!(
        role(&fake, "web-0").as_deref(),
        Some("master"),
        "unselected pod untouched"
    );
    for p in ["cache-0", "cache-1", "cache-2"] {
        let o = fake.object(FakeKind::Pod, NS, p).unwrap();
        assert_eq!(epoch_of(&o), Some("5"), "{p}");
    }
    for w in fake.writes() {
        assert_eq!(
            w.content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        assert!(w.json()["metadata"]["resourceVersion"].is_string(), "{w:?}");
        assert_eq!(w.json()["metadata"]["annotations"][EPOCH_ANNOTATION], "5");
        assert_ne!(pod_name(&w), "web-0");
    }

    // Idempotent: a second publish (another daemon) writes nothing.
    fake.clear_requests();
    b.publish(&topo(5, "10.0.0.2:6379", None)).await.unwrap();
    assert!(fake.writes().is_empty(), "{:?}", fake.writes());
    // A retried fence of the same epoch does not undo that epoch's publish.
    b.fence(&fence(5, "10.0.0.1:6379")).await.unwrap();
    assert!(fake.writes().is_empty(), "{:?}", fake.writes());
    assert_eq!(role(&fake, "cache-0").as_deref(), Some("replica"));
}

#[tokio::test]
async fn pod_labels_publish_demotes_old_master_before_promoting() {
    let fake = FakeKube::start().await;
    seed_pods(&fake);
    // A second pod wrongly labelled master too.
    fake.add_pod(
        NS,
        "cache-3",
        "10.0.0.4",
        &[("app", "cache"), ("role", "master")],
    );
    let dir = tempfile::tempdir().unwrap();
    let b = backend_from(
        &token_kubeconfig(dir.path(), &fake, DEFAULT_TOKEN),
        KubernetesMode::PodLabels,
    );

    b.publish(&topo(7, "10.0.0.3:6379", Some("10.0.0.1:6379")))
        .await
        .unwrap();
    let writes = fake.writes();
    let gain = writes
        .iter()
        .position(|w| w.json()["metadata"]["labels"]["role"] == "master")
        .expect("a write gives the master label");
    assert_eq!(pod_name(&writes[gain]), "cache-2");
    let losses: Vec<usize> = writes
        .iter()
        .enumerate()
        .filter(|(_, w)| ["cache-0", "cache-3"].contains(&pod_name(w)))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(losses.len(), 2, "{writes:?}");
    assert!(
        losses.iter().all(|&i| i < gain),
        "old masters lose the label first: {writes:?}"
    );
    // Between the last loss and the gain, the pods were listed again (gating check).
    let reqs = fake.requests();
    let gain_at = reqs
        .iter()
        .position(|r| r.is_write() && r.json()["metadata"]["labels"]["role"] == "master")
        .unwrap();
    let last_loss_at = reqs
        .iter()
        .rposition(|r| r.is_write() && pod_name(r) == "cache-3")
        .unwrap();
    assert!(
        reqs[last_loss_at..gain_at]
            .iter()
            .any(|r| r.path.ends_with("/pods") && r.method == "GET")
    );
    let masters: Vec<String> = ["cache-0", "cache-1", "cache-2", "cache-3"]
        .into_iter()
        .filter(|p| role(&fake, p).as_deref() == Some("master"))
        .map(String::from)
        .collect();
    assert_eq!(masters, vec!["cache-2"]);
}

#[tokio::test]
async fn pod_labels_never_label_as_replica_a_pod_that_does_not_replicate_from_the_master() {
    let fake = FakeKube::start().await;
    seed_pods(&fake);
    // A rescheduled pod, back as an empty lone master, with no role yet;
    // and cache-2 is labelled replica but no longer replicates.
    fake.add_pod(NS, "cache-3", "10.0.0.4", &[("app", "cache")]);
    let dir = tempfile::tempdir().unwrap();
    let b = backend_from(
        &token_kubeconfig(dir.path(), &fake, DEFAULT_TOKEN),
        KubernetesMode::PodLabels,
    );
    let mut t = topo(3, "10.0.0.2:6379", Some("10.0.0.1:6379"));
    // Only cache-0 (the old master, now following) is linked.
    t.replicas = vec!["10.0.0.1:6379".parse().unwrap()];
    b.publish(&t).await.unwrap();
    assert_eq!(role(&fake, "cache-1").as_deref(), Some("master"));
    assert_eq!(role(&fake, "cache-0").as_deref(), Some("replica"));
    assert_eq!(role(&fake, "cache-2"), None, "not linked: no role");
    assert_eq!(
        role(&fake, "cache-3"),
        None,
        "a lone master is never a replica"
    );
    // Once attached it is published as a replica in the same epoch.
    t.replicas.push("10.0.0.4:6379".parse().unwrap());
    b.publish(&t).await.unwrap();
    assert_eq!(role(&fake, "cache-3").as_deref(), Some("replica"));
    // Publishing what the pods already say writes nothing.
    fake.clear_requests();
    b.publish(&t).await.unwrap();
    assert!(fake.writes().is_empty(), "{:?}", fake.writes());
}

#[tokio::test]
async fn pod_labels_stale_epoch_is_refused_without_writing() {
    let fake = FakeKube::start().await;
    seed_pods(&fake);
    fake.set_annotation(FakeKind::Pod, NS, "cache-2", EPOCH_ANNOTATION, "9");
    let dir = tempfile::tempdir().unwrap();
    let b = backend_from(
        &token_kubeconfig(dir.path(), &fake, DEFAULT_TOKEN),
        KubernetesMode::PodLabels,
    );

    let e = b
        .publish(&topo(5, "10.0.0.2:6379", None))
        .await
        .unwrap_err();
    assert_eq!(e, DiscoveryError::Stale { stored: 9, ours: 5 });
    fake.set_annotation(FakeKind::Pod, NS, "cache-0", EPOCH_ANNOTATION, "8");
    let e = b.fence(&fence(5, "10.0.0.1:6379")).await.unwrap_err();
    assert_eq!(e, DiscoveryError::Stale { stored: 8, ours: 5 });
    assert!(fake.writes().is_empty(), "{:?}", fake.writes());
    assert_eq!(role(&fake, "cache-0").as_deref(), Some("master"));

    // A higher epoch goes through.
    b.publish(&topo(9, "10.0.0.2:6379", None)).await.unwrap();
    assert_eq!(role(&fake, "cache-1").as_deref(), Some("master"));
}

#[tokio::test]
async fn pod_labels_conflict_rereads_and_retries() {
    let (fake, _dir, b) = fake_with_backend(KubernetesMode::PodLabels, true).await;
    fake.conflict_next_writes(2);
    b.fence(&fence(3, "10.0.0.1:6379")).await.unwrap();
    let reqs: Vec<(String, u16)> = fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/cache-0"))
        .map(|r| (r.method.clone(), r.status))
        .collect();
    let expect = [
        ("GET", 200),
        ("PATCH", 409),
        ("GET", 200),
        ("PATCH", 409),
        ("GET", 200),
        ("PATCH", 200),
    ];
    let expect: Vec<(String, u16)> = expect.iter().map(|(m, s)| (m.to_string(), *s)).collect();
    assert_eq!(reqs, expect);
    let pod = fake.object(FakeKind::Pod, NS, "cache-0").unwrap();
    assert_eq!(pod["metadata"]["labels"]["role"], Value::Null);
    assert_eq!(epoch_of(&pod), Some("3"));
    assert!(
        pod["metadata"]["annotations"]["fake.picket.io/touched"].is_string(),
        "the other writer's change survives"
    );
}

#[tokio::test]
async fn pod_labels_unknown_master_ip_is_a_clear_error() {
    let (fake, _dir, b) = fake_with_backend(KubernetesMode::PodLabels, true).await;
    let e = b
        .publish(&topo(2, "10.9.9.9:6379", None))
        .await
        .unwrap_err();
    assert_permanent(&e, &["10.9.9.9"]);
    assert!(fake.writes().is_empty());
    // Fencing a pod that no longer exists is not an error.
    b.fence(&fence(2, "10.9.9.9:6379")).await.unwrap();
}

// ---- endpointslice ----

fn slice(fake: &FakeKube) -> Value {
    fake.object(FakeKind::EndpointSlice, NS, "cache-picket")
        .unwrap()
}

#[tokio::test]
async fn endpointslice_create_update_fence() {
    let (fake, _dir, b) = fake_with_backend(KubernetesMode::Endpointslice, false).await;
    assert!(b.name().contains("cache-picket"), "{}", b.name());

    b.publish(&topo(3, "10.0.0.1:6379", None)).await.unwrap();
    let s = slice(&fake);
    assert_eq!(s["addressType"], "IPv4");
    assert_eq!(
        s["metadata"]["labels"]["kubernetes.io/service-name"],
        "cache"
    );
    assert_eq!(
        s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"],
        "picket.io"
    );
    assert_eq!(epoch_of(&s), Some("3"));
    assert_eq!(
        s["ports"],
        json!([{"name": "redis", "port": 6379, "protocol": "TCP"}])
    );
    assert_eq!(
        s["endpoints"],
        json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false}}])
    );
    let w = fake.writes();
    assert_eq!(w.len(), 1);
    assert_eq!(
        (w[0].method.as_str(), w[0].content_type.as_deref()),
        ("POST", Some("application/json"))
    );

    fake.clear_requests();
    let rv = s["metadata"]["resourceVersion"].clone();
    b.publish(&topo(4, "10.0.0.2:6380", Some("10.0.0.1:6379")))
        .await
        .unwrap();
    let s = slice(&fake);
    assert_eq!(
        s["endpoints"],
        json!([{"addresses": ["10.0.0.2"], "conditions": {"ready": true, "serving": true, "terminating": false}}])
    );
    assert_eq!(
        s["ports"],
        json!([{"name": "redis", "port": 6380, "protocol": "TCP"}])
    );
    assert_eq!(epoch_of(&s), Some("4"));
    let w = fake.writes();
    assert_eq!(w.len(), 1, "{w:?}");
    assert_eq!(w[0].method, "PATCH");
    assert_eq!(
        w[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(w[0].json()["metadata"]["resourceVersion"], rv);

    // Idempotent.
    fake.clear_requests();
    b.publish(&topo(4, "10.0.0.2:6380", None)).await.unwrap();
    assert!(fake.writes().is_empty());

    // A retried fence of epoch 4 must not undo epoch 4's master.
    b.fence(&fence(4, "10.0.0.1:6379")).await.unwrap();
    assert!(fake.writes().is_empty());
    assert_eq!(slice(&fake)["endpoints"][0]["addresses"][0], "10.0.0.2");

    b.fence(&fence(5, "10.0.0.2:6380")).await.unwrap();
    let s = slice(&fake);
    assert_eq!(
        s["endpoints"],
        Value::Null,
        "the real API returns an empty list as null"
    );
    assert_eq!(epoch_of(&s), Some("5"));
    fake.clear_requests();
    b.fence(&fence(5, "10.0.0.2:6380")).await.unwrap();
    assert!(fake.writes().is_empty(), "already fenced");
}

#[tokio::test]
async fn endpointslice_fence_creates_an_empty_slice() {
    let (fake, _dir, b) = fake_with_backend(KubernetesMode::Endpointslice, false).await;
    b.fence(&fence(2, "10.0.0.1:6379")).await.unwrap();
    let s = slice(&fake);
    assert_eq!(s["endpoints"], Value::Null);
    assert_eq!(epoch_of(&s), Some("2"));
}

#[tokio::test]
async fn endpointslice_stale_epoch_is_refused_without_writing() {
    let (fake, _dir, b) = fake_with_backend(KubernetesMode::Endpointslice, false).await;
    b.publish(&topo(3, "10.0.0.1:6379", None)).await.unwrap();
    fake.set_annotation(
        FakeKind::EndpointSlice,
        NS,
        "cache-picket",
        EPOCH_ANNOTATION,
        "10",
    );
    fake.clear_requests();
    let e = b
        .publish(&topo(4, "10.0.0.2:6379", None))
        .await
        .unwrap_err();
    assert_eq!(
        e,
        DiscoveryError::Stale {
            stored: 10,
            ours: 4
        }
    );
    let e = b.fence(&fence(4, "10.0.0.1:6379")).await.unwrap_err();
    assert_eq!(
        e,
        DiscoveryError::Stale {
            stored: 10,
            ours: 4
        }
    );
    assert!(fake.writes().is_empty());
    assert_eq!(slice(&fake)["endpoints"][0]["addresses"][0], "10.0.0.1");
}

#[tokio::test]
async fn endpointslice_conflict_rereads_and_retries() {
    let (fake, _dir, b) = fake_with_backend(KubernetesMode::Endpointslice, false).await;
    b.publish(&topo(3, "10.0.0.1:6379", None)).await.unwrap();
    fake.clear_requests();
    fake.conflict_next_writes(1);
    b.publish(&topo(4, "10.0.0.2:6379", None)).await.unwrap();
    let statuses: Vec<(String, u16)> = fake
        .requests()
        .iter()
        .map(|r| (r.method.clone(), r.status))
        .collect();
    assert_eq!(
        statuses,
        [("GET", 200), ("PATCH", 409), ("GET", 200), ("PATCH", 200)]
            .iter()
            .map(|(m, s)| (m.to_string(), *s))
            .collect::<Vec<_>>()
    );
    assert_eq!(slice(&fake)["endpoints"][0]["addresses"][0], "10.0.0.2");
}

#[tokio::test]
async fn endpointslice_wrong_address_type_is_permanent() {
    let fake = FakeKube::start().await;
    fake.put_object(
        FakeKind::EndpointSlice,
        NS,
        json!({"metadata": {"name": "cache-picket"}, "addressType": "IPv6", "endpoints": []}),
    );
    let dir = tempfile::tempdir().unwrap();
    let b = backend_from(
        &token_kubeconfig(dir.path(), &fake, DEFAULT_TOKEN),
        KubernetesMode::Endpointslice,
    );
    let e = b
        .publish(&topo(1, "10.0.0.1:6379", None))
        .await
        .unwrap_err();
    assert_permanent(&e, &["IPv6"]);
    // A name is resolved at write time; one that does not resolve is a
    // transient error naming it (retried), and nothing is written.
    let e = b
        .publish(&topo(1, "cache-0.example.invalid:6379", None))
        .await
        .unwrap_err();
    assert_transient(&e, &["cache-0.example.invalid"]);
    // A name that resolves is checked like an address: localhost is loopback.
    let e = b
        .publish(&topo(1, "localhost:6379", None))
        .await
        .unwrap_err();
    assert_permanent(&e, &["127.0.0.1", "loopback"]);
}

#[tokio::test]
async fn endpointslice_refuses_what_the_api_refuses_before_writing() {
    let (fake, _dir, b) = fake_with_backend(KubernetesMode::Endpointslice, false).await;
    for (host, why) in [
        ("127.0.0.2", "loopback"),
        ("169.254.10.1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.9", "multicast"),
    ] {
        let e = b
            .publish(&topo(1, &format!("{host}:6379"), None))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, DiscoveryError::Permanent(m) if m.contains(host) && m.contains(why)),
            "{host}: {e:?}"
        );
    }
    assert!(fake.requests().is_empty(), "{:#?}", fake.requests());
    // A fence writes no address: it still works.
    b.fence(&fence(1, "127.0.0.2:6379")).await.unwrap();
    assert_eq!(slice(&fake)["endpoints"], Value::Null);
}

/// POST a slice to the fake by hand; the status and the decoded body.
async fn raw_create_slice(fake: &FakeKube, body: &Value) -> (u16, Value) {
    let path = format!("/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices");
    raw(fake, reqwest::Method::POST, &path, "application/json", body).await
}

/// A request to the fake by hand; the status and the decoded body.
async fn raw(
    fake: &FakeKube,
    method: reqwest::Method,
    path: &str,
    content_type: &str,
    body: &Value,
) -> (u16, Value) {
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(fake.ca_pem().as_bytes()).unwrap())
        .no_proxy()
        .build()
        .unwrap();
    let r = http
        .request(method, format!("{}{path}", fake.url()))
        .bearer_auth(DEFAULT_TOKEN)
        .header("content-type", content_type)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap())
}

#[tokio::test]
async fn fake_refuses_special_addresses_with_the_real_status() {
    let fake = FakeKube::start().await;
    let body = |t: &str, a: &str| {
        json!({"metadata": {"name": "s"}, "addressType": t,
               "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": [a]}]})
    };
    let (code, st) = raw_create_slice(&fake, &body("IPv4", "127.0.0.1")).await;
    assert_eq!(code, 422, "{st}");
    assert_eq!(st["kind"], "Status");
    assert_eq!(st["reason"], "Invalid");
    assert_eq!(st["code"], 422);
    assert_eq!(
        st["message"],
        "EndpointSlice.discovery.k8s.io \"s\" is invalid: endpoints[1].addresses[0]: Invalid \
         value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)"
    );
    assert_eq!(
        st["details"],
        json!({"name": "s", "group": "discovery.k8s.io", "kind": "EndpointSlice", "causes": [{
            "reason": "FieldValueInvalid",
            "message": "Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)",
            "field": "endpoints[1].addresses[0]",
        }]})
    );
    for (t, a, want) in [
        (
            "IPv4",
            "169.254.0.1",
            "may not be in the link-local range (169.254.0.0/16, fe80::/10)",
        ),
        ("IPv4", "0.0.0.0", "may not be unspecified (0.0.0.0)"),
        (
            "IPv4",
            "224.0.0.251",
            "link-local multicast range (224.0.0.0/24, ff02::/10)",
        ),
        ("IPv4", "fd00::1", "must be a valid IPv4 address"),
        ("IPv4", "cache-0.example", "must be a valid IP address"),
        ("IPv6", "::1", "may not be in the loopback range"),
        ("IPv6", "fe80::2", "may not be in the link-local range"),
        ("IPv6", "10.0.0.1", "must be a valid IPv6 address"),
    ] {
        let (code, st) = raw_create_slice(&fake, &body(t, a)).await;
        assert_eq!(code, 422, "{a}: {st}");
        let causes = st["details"]["causes"].as_array().unwrap();
        assert!(
            causes
                .iter()
                .any(|c| c["field"] == "endpoints[1].addresses[0]"
                    && c["message"].as_str().unwrap().contains(want)),
            "{a}: {st}"
        );
    }
    assert!(fake.object(FakeKind::EndpointSlice, NS, "s").is_none());

    // Accepted ones read back as the real server returns them: an empty
    // list is null, missing conditions are {}.
    let (code, st) = raw_create_slice(
        &fake,
        &json!({"metadata": {"name": "s"}, "addressType": "IPv4",
                "endpoints": [{"addresses": ["198.18.0.1"]}], "ports": []}),
    )
    .await;
    assert_eq!(code, 201, "{st}");
    assert_eq!(st["endpoints"][0]["conditions"], json!({}));
    assert_eq!(st["ports"], Value::Null);
    let (code, st) = raw_create_slice(
        &fake,
        &json!({"metadata": {"name": "e"}, "addressType": "IPv6", "endpoints": []}),
    )
    .await;
    assert_eq!(code, 201, "{st}");
    assert_eq!(st["endpoints"], Value::Null);
}

// ---- retries, errors ----

#[tokio::test]
async fn server_error_storm_then_success() {
    let (fake, _dir, b) = fake_with_backend(KubernetesMode::Endpointslice, false).await;
    fake.fail_next(4, 503);
    b.publish(&topo(1, "10.0.0.1:6379", None)).await.unwrap();
    let st: Vec<u16> = fake.requests().iter().map(|r| r.status).collect();
    assert_eq!(&st[..5], &[503, 503, 503, 503, 404], "{st:?}");
    assert_eq!(st.last(), Some(&201));
    // Backoff: the retries were spaced, not immediate.
    let r = fake.requests();
    assert!(r[4].at.duration_since(r[0].at) >= Duration::from_millis(20 + 40 + 80) / 2);
}

/// A backend whose client gives up retrying after 500 ms.
fn backend_with_short_budget(path: &Path, mode: KubernetesMode) -> KubernetesBackend {
    let c = cfg(path, mode);
    let client = KubeClient::new(
        ClusterConfig::from_kubeconfig(path, None).unwrap(),
        c.timeout,
    )
    .unwrap()
    .with_retry(RetryPolicy {
        budget: Duration::from_millis(500),
        ..fast_retry()
    });
    KubernetesBackend::with_client(&c, client).unwrap()
}

/// Publishing `t` through `b` fails with a transient error that names
/// `needle`, after several attempts, within the short budget.
async fn assert_gives_up_within_budget(
    b: &KubernetesBackend,
    fake: &FakeKube,
    t: Topology,
    needle: &str,
) {
    let started = std::time::Instant::now();
    let e = b.publish(&t).await.unwrap_err();
    assert_transient(&e, &[needle]);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the budget bounds the call"
    );
    assert!(fake.requests().len() >= 3, "it retried");
}

#[tokio::test]
async fn server_errors_beyond_the_budget_are_transient() {
    let fake = FakeKube::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = token_kubeconfig(dir.path(), &fake, DEFAULT_TOKEN);
    let b = backend_with_short_budget(&path, KubernetesMode::Endpointslice);
    fake.fail_next(1000, 500);
    assert_gives_up_within_budget(&b, &fake, topo(1, "10.0.0.1:6379", None), "500").await;
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let (fake, _dir, b) = fake_with_backend(KubernetesMode::Endpointslice, false).await;
    fake.throttle_next(1, 1);
    b.publish(&topo(1, "10.0.0.1:6379", None)).await.unwrap();
    let r = fake.requests();
    assert_eq!(r[0].status, 429);
    let gap = r[1].at.duration_since(r[0].at);
    assert!(
        gap >= Duration::from_millis(950),
        "waited {gap:?}, Retry-After said 1 s"
    );
}

#[tokio::test]
async fn timeout_is_retried() {
    let fake = FakeKube::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = token_kubeconfig(dir.path(), &fake, DEFAULT_TOKEN);
    let c = cfg(&path, KubernetesMode::Endpointslice);
    let client = KubeClient::new(
        ClusterConfig::from_kubeconfig(&path, None).unwrap(),
        Duration::from_millis(300),
    )
    .unwrap()
    .with_retry(fast_retry());
    let b = KubernetesBackend::with_client(&c, client).unwrap();
    fake.slow_next(1, Duration::from_secs(3));
    b.publish(&topo(1, "10.0.0.1:6379", None)).await.unwrap();
    assert_eq!(slice(&fake)["endpoints"][0]["addresses"][0], "10.0.0.1");
    // The first GET was abandoned at the timeout and retried.
    let r = fake.requests();
    assert_eq!((r[0].method.as_str(), r[0].status), ("GET", 0), "{r:?}");
    assert_eq!((r[1].method.as_str(), r[1].status), ("GET", 404), "{r:?}");
    // The fake stamps a request when it has read it, a little after the
    // client started its 300 ms clock: the gap between two stamps can be a
    // few ms short of the timeout on a loaded machine.
    let gap = r[1].at.duration_since(r[0].at);
    assert!(
        gap >= Duration::from_millis(250) && gap < Duration::from_millis(2500),
        "{gap:?}"
    );
}

/// An API server (or a proxy in front of it) answering `200 OK` with bodies
/// that are not the JSON asked for: each is a retried error, the write lands
/// right once the garbage stops, and garbage without end is bounded by the
/// retry budget and named in the error, with nothing written meanwhile.
#[tokio::test]
async fn garbage_answers_are_retried_and_bounded() {
    for mode in [KubernetesMode::Endpointslice, KubernetesMode::PodLabels] {
        let fake = FakeKube::start().await;
        seed_pods(&fake);
        let dir = tempfile::tempdir().unwrap();
        let path = token_kubeconfig(dir.path(), &fake, DEFAULT_TOKEN);
        let b = backend_from(&path, mode);
        fake.garbage_next(GARBAGE.len());
        b.publish(&topo(3, "10.0.0.2:6379", Some("10.0.0.1:6379")))
            .await
            .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
        let served: Vec<u16> = fake.requests().iter().map(|r| r.status).collect();
        assert_eq!(
            served
                .iter()
                .take(GARBAGE.len())
                .filter(|s| **s == 200)
                .count(),
            GARBAGE.len(),
            "{mode:?}: every garbage answer was read: {served:?}"
        );
        match mode {
            KubernetesMode::Endpointslice => {
                let s = slice(&fake);
                assert_eq!(epoch_of(&s), Some("3"));
                assert_eq!(s["endpoints"][0]["addresses"], json!(["10.0.0.2"]));
            }
            KubernetesMode::PodLabels => {
                assert_eq!(role(&fake, "cache-1").as_deref(), Some("master"));
                assert_eq!(role(&fake, "cache-0").as_deref(), Some("replica"));
                assert_eq!(role(&fake, "cache-2").as_deref(), Some("replica"));
            }
        }

        // Garbage without end: a transient error within the budget.
        let b = backend_with_short_budget(&path, mode);
        fake.clear_requests();
        fake.garbage_next(100_000);
        assert_gives_up_within_budget(
            &b,
            &fake,
            topo(4, "10.0.0.3:6379", Some("10.0.0.2:6379")),
            "undecodable response",
        )
        .await;
        assert!(
            fake.writes().iter().all(|w| w.status == 200),
            "{mode:?}: only garbage was answered"
        );
        fake.garbage_next(0);
        match mode {
            KubernetesMode::Endpointslice => {
                assert_eq!(epoch_of(&slice(&fake)), Some("3"), "nothing applied")
            }
            KubernetesMode::PodLabels => {
                assert_eq!(
                    role(&fake, "cache-1").as_deref(),
                    Some("master"),
                    "nothing applied"
                )
            }
        }
    }
}

#[tokio::test]
async fn unauthorized_is_a_clear_permanent_error() {
    let fake = FakeKube::start().await;
    let dir = tempfile::tempdir().unwrap();
    let b = backend_from(
        &token_kubeconfig(dir.path(), &fake, "wrong-token"),
        KubernetesMode::Endpointslice,
    );
    let e = b
        .publish(&topo(1, "10.0.0.1:6379", None))
        .await
        .unwrap_err();
    let DiscoveryError::Permanent(m) = &e else {
        panic!("{e:?}")
    };
    assert!(
        m.contains(&format!("401 Unauthorized from {}", fake.url())),
        "{m}"
    );
    assert!(m.contains("check the token"), "{m}");
    assert!(!m.contains("wrong-token"), "the token never appears: {m}");
    assert_eq!(fake.requests().len(), 1, "a fixed token is not retried");
}

#[tokio::test]
async fn forbidden_is_a_clear_permanent_error() {
    let fake = FakeKube::start().await;
    fake.forbid_token("readonly");
    let dir = tempfile::tempdir().unwrap();
    let b = backend_from(
        &token_kubeconfig(dir.path(), &fake, "readonly"),
        KubernetesMode::PodLabels,
    );
    let e = b
        .publish(&topo(1, "10.0.0.1:6379", None))
        .await
        .unwrap_err();
    assert_permanent(&e, &["403 Forbidden", "RBAC"]);
}

// ---- the client API against the fake ----

#[tokio::test]
async fn client_api_semantics() {
    let fake = FakeKube::start().await;
    seed_pods(&fake);
    let dir = tempfile::tempdir().unwrap();
    let path = token_kubeconfig(dir.path(), &fake, DEFAULT_TOKEN);
    let client = KubeClient::new(
        ClusterConfig::from_kubeconfig(&path, None).unwrap(),
        Duration::from_secs(2),
    )
    .unwrap()
    .with_retry(fast_retry());

    let pods = client.api::<Pod>(NS);
    let names = |items: Vec<Pod>| -> Vec<String> {
        items
            .into_iter()
            .map(|p| p.metadata.name.unwrap_or_default())
            .collect()
    };
    let sel = pods.list(Some("app=cache,role in (master)")).await.unwrap();
    assert_eq!(names(sel), vec!["cache-0"]);
    let sel = pods.list(Some("role!=master")).await.unwrap();
    assert_eq!(names(sel), vec!["cache-1", "cache-2"]);
    assert_eq!(pods.list(None).await.unwrap().len(), 4);
    assert!(pods.get_opt("ghost").await.unwrap().is_none());

    // A merge patch conditional on the resourceVersion read lands; on a
    // stale one it is a 409 Conflict, not retried by the client.
    let read = pods.get("cache-0").await.unwrap();
    let rv = read.metadata.resource_version.clone().unwrap();
    let patched = pods
        .merge_patch(
            "cache-0",
            &json!({"metadata": {"resourceVersion": rv, "labels": {"role": "replica"}}}),
        )
        .await
        .unwrap();
    assert_eq!(patched.metadata.labels.as_ref().unwrap()["role"], "replica");
    assert_ne!(patched.metadata.resource_version.as_ref(), Some(&rv));
    fake.clear_requests();
    let e = pods
        .merge_patch(
            "cache-0",
            &json!({"metadata": {"resourceVersion": rv, "labels": {"role": null}}}),
        )
        .await
        .unwrap_err();
    assert!(e.is_conflict() && !e.is_already_exists(), "{e}");
    assert!(
        e.to_string().contains("the object has been modified"),
        "{e}"
    );
    assert_eq!(fake.requests().len(), 1, "a 409 is the caller's to handle");

    // Create, then AlreadyExists.
    let slices = client.api::<EndpointSlice>(NS);
    let body: EndpointSlice = serde_json::from_value(
        json!({"metadata": {"name": "s"}, "addressType": "IPv4", "endpoints": []}),
    )
    .unwrap();
    let created = slices.create(&body).await.unwrap();
    assert!(created.metadata.resource_version.is_some());
    let e = slices.create(&body).await.unwrap_err();
    assert!(e.is_already_exists() && !e.is_conflict(), "{e}");
    assert_eq!(slices.list(None).await.unwrap().len(), 1);
}

// ---- kubeconfig and in-cluster variants ----

async fn assert_works(path: &Path, fake: &FakeKube) {
    let b = backend_from(path, KubernetesMode::Endpointslice);
    b.publish(&topo(1, "10.0.0.1:6379", None)).await.unwrap();
    assert_eq!(slice(fake)["endpoints"][0]["addresses"][0], "10.0.0.1");
}

#[tokio::test]
async fn kubeconfig_token_file_and_ca_file() {
    let fake = FakeKube::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sec")).unwrap();
    std::fs::write(dir.path().join("sec/token"), format!("{DEFAULT_TOKEN}\n")).unwrap();
    std::fs::write(dir.path().join("ca.pem"), fake.ca_pem()).unwrap();
    let path = kubeconfig_with(
        dir.path(),
        &format!(
            "    server: {}\n    certificate-authority: ca.pem",
            fake.url()
        ),
        "    tokenFile: sec/token",
    );
    assert_works(&path, &fake).await;
}

#[tokio::test]
async fn kubeconfig_backend_new_reads_the_file() {
    let fake = FakeKube::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = token_kubeconfig(dir.path(), &fake, DEFAULT_TOKEN);
    let b = KubernetesBackend::new(&cfg(&path, KubernetesMode::Endpointslice)).unwrap();
    b.publish(&topo(1, "10.0.0.1:6379", None)).await.unwrap();
    assert_eq!(slice(&fake)["endpoints"][0]["addresses"][0], "10.0.0.1");

    let mut c = cfg(&path, KubernetesMode::PodLabels);
    c.pod_selector = None;
    let e = KubernetesBackend::new(&c).unwrap_err();
    assert_permanent(&e, &["pod_selector"]);
    let mut c = cfg(&path, KubernetesMode::Endpointslice);
    c.service = None;
    let e = KubernetesBackend::new(&c).unwrap_err();
    assert_permanent(&e, &["service"]);
    // pod-labels without `service` is refused unless the gate is skipped
    // explicitly; skipping it is a warning, never silent.
    let mut c = cfg(&path, KubernetesMode::PodLabels);
    c.skip_service_gate = false;
    let e = KubernetesBackend::new(&c).unwrap_err();
    assert_permanent(&e, &["`service` is required", "skip_service_gate = true"]);
    c.service = Some("cache-master".into());
    c.skip_service_gate = true;
    let e = KubernetesBackend::new(&c).unwrap_err();
    assert_permanent(&e, &["contradicts"]);
    c.skip_service_gate = false;
    let gated = KubernetesBackend::new(&c).unwrap();
    assert_eq!(gated.warning(), None);
    assert!(gated.service_gate().is_some());
    let skipped = KubernetesBackend::new(&cfg(&path, KubernetesMode::PodLabels)).unwrap();
    assert!(
        skipped
            .warning()
            .is_some_and(|w| w.contains("skip_service_gate") && w.contains("old master")),
        "{:?}",
        skipped.warning()
    );
    assert!(skipped.service_gate().is_none());
    let mut c = cfg(&path, KubernetesMode::Endpointslice);
    c.skip_service_gate = true;
    let e = KubernetesBackend::new(&c).unwrap_err();
    assert_permanent(&e, &["only applies to pod-labels"]);
    assert_eq!(
        b.warning(),
        None,
        "endpointslice mode needs no Service gate"
    );
    let mut c = cfg(&path, KubernetesMode::Endpointslice);
    c.kubeconfig = Some(dir.path().join("missing"));
    let e = KubernetesBackend::new(&c).unwrap_err();
    assert_permanent(&e, &["missing"]);
}

#[tokio::test]
async fn kubeconfig_client_certificate_data_and_files() {
    let fake = FakeKube::start().await;
    let (cert, key) = fake.issue_client_cert("picket");
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig_with(
        dir.path(),
        &ca_data(&fake),
        &format!(
            "    client-certificate-data: {}\n    client-key-data: {}",
            B64.encode(cert.trim_end()),
            B64.encode(&key)
        ),
    );
    assert_works(&path, &fake).await;

    // From files, relative to the kubeconfig; the cert has no trailing newline.
    let dir2 = tempfile::tempdir().unwrap();
    std::fs::write(dir2.path().join("c.pem"), cert.trim_end()).unwrap();
    std::fs::write(dir2.path().join("k.pem"), &key).unwrap();
    let path = kubeconfig_with(
        dir2.path(),
        &ca_data(&fake),
        "    client-certificate: c.pem\n    client-key: k.pem",
    );
    let b = backend_from(&path, KubernetesMode::Endpointslice);
    b.publish(&topo(2, "10.0.0.2:6379", None)).await.unwrap();
    assert_eq!(slice(&fake)["endpoints"][0]["addresses"][0], "10.0.0.2");

    // Without a token or certificate: 401.
    let dir3 = tempfile::tempdir().unwrap();
    let path = kubeconfig_with(dir3.path(), &ca_data(&fake), "    {}");
    let b = backend_from(&path, KubernetesMode::Endpointslice);
    let e = b
        .publish(&topo(3, "10.0.0.3:6379", None))
        .await
        .unwrap_err();
    assert_permanent(&e, &["401"]);
}

#[tokio::test]
async fn kubeconfig_wrong_ca_insecure_and_server_name() {
    let fake = FakeKube::start_with_names(&["kube.picket.test"]).await;
    let dir = tempfile::tempdir().unwrap();

    // The certificate has no 127.0.0.1 SAN: refused without tls-server-name.
    let path = token_kubeconfig(dir.path(), &fake, DEFAULT_TOKEN);
    let b = backend_from(&path, KubernetesMode::Endpointslice);
    let e = b
        .publish(&topo(1, "10.0.0.1:6379", None))
        .await
        .unwrap_err();
    assert_permanent(&e, &["TLS"]);
    assert!(fake.requests().is_empty());

    let path = kubeconfig_with(
        dir.path(),
        &format!("{}\n    tls-server-name: kube.picket.test", ca_data(&fake)),
        &format!("    token: {DEFAULT_TOKEN}"),
    );
    assert_works(&path, &fake).await;

    // A CA that did not sign the server certificate.
    let path = kubeconfig_with(
        dir.path(),
        &format!(
            "    server: {}\n    certificate-authority-data: {}\n    tls-server-name: kube.picket.test",
            fake.url(),
            B64.encode(unrelated_ca_pem())
        ),
        &format!("    token: {DEFAULT_TOKEN}"),
    );
    let b = backend_from(&path, KubernetesMode::Endpointslice);
    let e = b
        .publish(&topo(2, "10.0.0.2:6379", None))
        .await
        .unwrap_err();
    assert_permanent(&e, &["TLS"]);

    // insecure-skip-tls-verify: no CA at all.
    let path = kubeconfig_with(
        dir.path(),
        &format!(
            "    server: {}\n    insecure-skip-tls-verify: true",
            fake.url()
        ),
        &format!("    token: {DEFAULT_TOKEN}"),
    );
    let b = backend_from(&path, KubernetesMode::Endpointslice);
    b.publish(&topo(3, "10.0.0.3:6379", None)).await.unwrap();
    assert_eq!(slice(&fake)["endpoints"][0]["addresses"][0], "10.0.0.3");
}

const EXEC_SCRIPT: &str = r#"#!/bin/sh
n=$(( $(cat "$STATE/count" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$STATE/count"
printf '%s' "$KUBERNETES_EXEC_INFO" > "$STATE/info"
if [ "$MODE" = "expired" ]; then exp="2000-01-01T00:00:00Z"; else exp=$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ); fi
if [ "$MODE" = "slow" ]; then exec sleep 5; fi
if [ "$MODE" = "cert" ]; then
  printf '{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"clientCertificateData":"%s","clientKeyData":"%s"}}' "$(cat "$STATE/cert" | awk '{printf "%s\\n", $0}')" "$(cat "$STATE/key" | awk '{printf "%s\\n", $0}')"
  exit 0
fi
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"exec-token-%s","expirationTimestamp":"%s"}}' "$n" "$exp"
"#;

fn exec_kubeconfig(dir: &Path, fake: &FakeKube, mode: &str, api: &str) -> PathBuf {
    let script = dir.join("plugin.sh");
    std::fs::write(&script, EXEC_SCRIPT).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    kubeconfig_with(
        dir,
        &ca_data(fake),
        &format!(
            "    exec:\n      apiVersion: {api}\n      command: ./plugin.sh\n      interactiveMode: Never\n      provideClusterInfo: true\n      env:\n      - {{name: STATE, value: \"{}\"}}\n      - {{name: MODE, value: \"{mode}\"}}",
            dir.display()
        ),
    )
}

fn runs(dir: &Path) -> u32 {
    std::fs::read_to_string(dir.join("count"))
        .map(|s| s.trim().parse().unwrap())
        .unwrap_or(0)
}

#[tokio::test]
async fn exec_plugin_token_is_cached_and_rerun_on_401() {
    let fake = FakeKube::start().await;
    fake.set_tokens(&["exec-token-1"]);
    let dir = tempfile::tempdir().unwrap();
    let path = exec_kubeconfig(dir.path(), &fake, "ok", "client.authentication.k8s.io/v1");
    let b = backend_from(&path, KubernetesMode::Endpointslice);
    b.publish(&topo(1, "10.0.0.1:6379", None)).await.unwrap();
    b.publish(&topo(2, "10.0.0.2:6379", None)).await.unwrap();
    assert!(fake.requests().len() >= 4);
    assert_eq!(runs(dir.path()), 1, "cached until expirationTimestamp");
    let info: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("info")).unwrap()).unwrap();
    assert_eq!(info["kind"], "ExecCredential");
    assert_eq!(info["spec"]["interactive"], false);
    assert_eq!(info["spec"]["cluster"]["server"], fake.url());

    // The server stops accepting the token: 401 → the plugin runs again.
    fake.set_tokens(&["exec-token-2"]);
    b.publish(&topo(3, "10.0.0.3:6379", None)).await.unwrap();
    assert_eq!(runs(dir.path()), 2);
    assert_eq!(slice(&fake)["endpoints"][0]["addresses"][0], "10.0.0.3");
}

#[tokio::test]
async fn exec_plugin_expired_credential_is_not_cached() {
    let fake = FakeKube::start().await;
    fake.set_tokens(&[
        "exec-token-1",
        "exec-token-2",
        "exec-token-3",
        "exec-token-4",
        "exec-token-5",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = exec_kubeconfig(
        dir.path(),
        &fake,
        "expired",
        "client.authentication.k8s.io/v1",
    );
    let b = backend_from(&path, KubernetesMode::Endpointslice);
    b.publish(&topo(1, "10.0.0.1:6379", None)).await.unwrap();
    let n = fake.requests().len() as u32;
    assert_eq!(
        runs(dir.path()),
        n,
        "one run per request when the credential is expired"
    );
}

#[tokio::test]
async fn exec_plugin_client_certificate_and_timeout() {
    let fake = FakeKube::start().await;
    let (cert, key) = fake.issue_client_cert("exec-user");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cert"), cert.trim_end()).unwrap();
    std::fs::write(dir.path().join("key"), key.trim_end()).unwrap();
    let path = exec_kubeconfig(
        dir.path(),
        &fake,
        "cert",
        "client.authentication.k8s.io/v1beta1",
    );
    assert_works(&path, &fake).await;
    assert_eq!(runs(dir.path()), 1);

    let dir2 = tempfile::tempdir().unwrap();
    let path = exec_kubeconfig(
        dir2.path(),
        &fake,
        "slow",
        "client.authentication.k8s.io/v1",
    );
    let cluster = ClusterConfig::from_kubeconfig(&path, None)
        .unwrap()
        .with_exec_timeout(Duration::from_millis(300));
    let c = cfg(&path, KubernetesMode::Endpointslice);
    let client = KubeClient::new(cluster, c.timeout)
        .unwrap()
        .with_retry(fast_retry());
    let b = KubernetesBackend::with_client(&c, client).unwrap();
    let started = std::time::Instant::now();
    let e = b
        .publish(&topo(1, "10.0.0.1:6379", None))
        .await
        .unwrap_err();
    assert_transient(&e, &["timed out"]);
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// A token file (the service account's in a pod, read by kube-rs's
/// `Config::incluster` at fixed paths; here a kubeconfig's `tokenFile`, the
/// same kube-rs reader) is read again after a 401, not only each minute.
#[tokio::test]
async fn a_rotated_token_file_is_read_again_after_a_401() {
    let fake = FakeKube::start().await;
    fake.set_tokens(&["sa-token-1"]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "sa-token-1\n").unwrap();
    let path = kubeconfig_with(dir.path(), &ca_data(&fake), "    tokenFile: token");
    let b = backend_from(&path, KubernetesMode::Endpointslice);
    b.publish(&topo(1, "10.0.0.1:6379", None)).await.unwrap();

    // The kubelet rotates the token; the old one stops working.
    std::fs::write(dir.path().join("token"), "sa-token-2\n").unwrap();
    fake.set_tokens(&["sa-token-2"]);
    fake.clear_requests();
    b.publish(&topo(2, "10.0.0.2:6379", None)).await.unwrap();
    assert_eq!(
        fake.requests()[0].status,
        401,
        "the first try used the cached token"
    );
    assert_eq!(slice(&fake)["endpoints"][0]["addresses"][0], "10.0.0.2");

    // A file that is gone is a clear error at start-up.
    std::fs::remove_file(dir.path().join("token")).unwrap();
    let e = KubernetesBackend::new(&cfg(&path, KubernetesMode::Endpointslice)).unwrap_err();
    assert_permanent(&e, &["token"]);
}

// ---- gating verified on the Service (pod-labels with `service`) ----

const MASTER_SERVICE: &str = "cache-master";

fn gated_backend(fake: &FakeKube, dir: &Path, gate_timeout: Duration) -> KubernetesBackend {
    let path = token_kubeconfig(dir, fake, DEFAULT_TOKEN);
    let mut c = cfg(&path, KubernetesMode::PodLabels);
    c.service = Some(MASTER_SERVICE.into());
    c.skip_service_gate = false;
    c.service_gate_timeout = gate_timeout;
    let cluster = ClusterConfig::from_kubeconfig(&path, None).unwrap();
    let client = KubeClient::new(cluster, c.timeout)
        .unwrap()
        .with_retry(fast_retry());
    KubernetesBackend::with_client(&c, client).unwrap()
}

/// The addresses the controller's slice of the master Service lists (ready or not).
fn service_lists(fake: &FakeKube) -> Vec<String> {
    fake.object(
        FakeKind::EndpointSlice,
        NS,
        &format!("{MASTER_SERVICE}-ctrl"),
    )
    .map(|s| {
        s["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["addresses"][0].as_str().map(str::to_string))
            .collect()
    })
    .unwrap_or_default()
}

/// The fake's controller keeps the master Service's slice; it lists cache-0.
async fn with_master_service(fake: &FakeKube) {
    fake.add_service(
        NS,
        MASTER_SERVICE,
        &[("app", "cache"), ("role", "master")],
        6379,
    );
    wait_service(fake, &["10.0.0.1"]).await;
}

async fn wait_service(fake: &FakeKube, want: &[&str]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while service_lists(fake) != want {
        assert!(
            std::time::Instant::now() < deadline,
            "the Service lists {:?}, not {want:?}",
            service_lists(fake)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn pod_labels_fence_and_publish_wait_for_the_service() {
    for lag in [Duration::from_millis(20), Duration::from_millis(500)] {
        let fake = FakeKube::start().await;
        seed_pods(&fake);
        fake.set_controller_lag(lag);
        with_master_service(&fake).await;
        let dir = tempfile::tempdir().unwrap();
        let b = gated_backend(&fake, dir.path(), Duration::from_secs(5));

        let t0 = std::time::Instant::now();
        b.fence(&fence(2, "10.0.0.1:6379")).await.unwrap();
        let fenced_after = t0.elapsed();
        // Without the wait the fence returns as soon as the PATCH is
        // accepted, while the Service still routes to the old master.
        assert_eq!(service_lists(&fake), Vec::<String>::new(), "lag {lag:?}");
        assert!(
            fenced_after >= lag,
            "lag {lag:?}: fenced after {fenced_after:?}"
        );
        let gone_at = fake.slice_history().last().unwrap().at;
        assert!(gone_at <= std::time::Instant::now());
        // The wait watches the slices: one LIST, then (the controller not
        // done yet: surely so with the long lag) one WATCH from its
        // version that shows the change; no polling.
        let slice_reads: Vec<LoggedRequest> = fake
            .requests()
            .into_iter()
            .filter(|r| r.path.ends_with("/endpointslices"))
            .collect();
        let watches = slice_reads.iter().filter(|r| r.is_watch()).count();
        let lists = slice_reads.len() - watches;
        assert!(
            lists == 1 && watches <= 1 && (lag < Duration::from_millis(100) || watches == 1),
            "lag {lag:?}: {slice_reads:#?}"
        );

        b.publish(&topo(2, "10.0.0.2:6379", Some("10.0.0.1:6379")))
            .await
            .unwrap();
        assert_eq!(service_lists(&fake), vec!["10.0.0.2"], "lag {lag:?}");
        let h = fake.slice_history();
        assert!(
            h.iter().all(|c| c.addresses.len() <= 1),
            "two masters in the Service: {h:?}"
        );

        let st = b.service_gate().unwrap();
        assert_eq!(st.service, MASTER_SERVICE);
        let f = st.fence.unwrap();
        let p = st.publish.unwrap();
        assert_eq!(
            (f.epoch, f.result, f.address.as_str()),
            (2, GateResult::Ok, "10.0.0.1")
        );
        assert_eq!(
            (p.epoch, p.result, p.address.as_str()),
            (2, GateResult::Ok, "10.0.0.2")
        );
        assert!(f.waited_ms as u128 >= lag.as_millis() / 2, "{f:?}");
        eprintln!(
            "controller lag {lag:?}: fence waited {} ms, publish {} ms",
            f.waited_ms, p.waited_ms
        );

        // A retried publication of the same epoch finds it all in place:
        // one list of pods, the reads, one list of slices, no write.
        fake.clear_requests();
        b.publish(&topo(2, "10.0.0.2:6379", None)).await.unwrap();
        assert!(fake.writes().is_empty(), "{:#?}", fake.writes());
        let ua = format!("picket/{}", env!("CARGO_PKG_VERSION"));
        let reqs = fake.requests();
        assert!(!reqs.is_empty());
        for r in &reqs {
            assert_eq!(r.user_agent.as_deref(), Some(ua.as_str()), "{r:?}");
        }
    }
}

#[tokio::test]
async fn pod_labels_gate_times_out_on_a_stuck_controller() {
    let fake = FakeKube::start().await;
    seed_pods(&fake);
    with_master_service(&fake).await;
    fake.set_controller_stuck(true);
    let dir = tempfile::tempdir().unwrap();
    let timeout = Duration::from_millis(400);
    let b = gated_backend(&fake, dir.path(), timeout);

    let t0 = std::time::Instant::now();
    let e = b.fence(&fence(2, "10.0.0.1:6379")).await.unwrap_err();
    let took = t0.elapsed();
    assert_permanent(&e, &["still lists the old master 10.0.0.1", "400ms"]);
    assert!(took >= timeout && took < Duration::from_secs(3), "{took:?}");
    // The label was removed all the same: only the confirmation failed.
    assert_eq!(role(&fake, "cache-0"), None);
    let f = b.service_gate().unwrap().fence.unwrap();
    assert_eq!(f.result, GateResult::Timeout);

    let e = b
        .publish(&topo(2, "10.0.0.2:6379", Some("10.0.0.1:6379")))
        .await
        .unwrap_err();
    assert_permanent(&e, &["lists no ready endpoint 10.0.0.2"]);
    assert_eq!(role(&fake, "cache-1").as_deref(), Some("master"));
    assert_eq!(
        b.service_gate().unwrap().publish.unwrap().result,
        GateResult::Timeout
    );

    // Unstuck, the controller catches up and a retry confirms.
    fake.set_controller_stuck(false);
    b.publish(&topo(2, "10.0.0.2:6379", None)).await.unwrap();
    assert_eq!(service_lists(&fake), vec!["10.0.0.2"]);
}

/// A Role without endpointslices `watch` (written for an earlier picket):
/// the gate fails at once with the API server's 403, naming the verb and
/// the RBAC table, rather than waiting out its timeout.
#[tokio::test]
async fn pod_labels_gate_without_the_watch_verb_is_a_clear_permanent_error() {
    let fake = FakeKube::start().await;
    seed_pods(&fake);
    with_master_service(&fake).await;
    fake.deny(DEFAULT_TOKEN, "watch", "endpointslices");
    fake.set_controller_lag(Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let b = gated_backend(&fake, dir.path(), Duration::from_secs(5));
    let t0 = std::time::Instant::now();
    let e = b.fence(&fence(2, "10.0.0.1:6379")).await.unwrap_err();
    assert_permanent(
        &e,
        &[
            "403 Forbidden",
            "RBAC",
            "cannot watch",
            "in the namespace \"cache\"",
        ],
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(
        b.service_gate().unwrap().fence.unwrap().result,
        GateResult::Error
    );
}

// ---- deploy/kubernetes: the deployment a Dragonfly user applies ----

/// Every YAML document of `deploy/kubernetes/<file>`, parsed.
fn deploy_docs(file: &str) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/kubernetes")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The one object of `kind` named `name` among `docs`.
fn the<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "{kind} {name} in {docs:#?}");
    found[0]
}

/// The Role in the first YAML block of docs/kubernetes.md's "## RBAC".
fn documented_role() -> Value {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/kubernetes.md"))
            .unwrap();
    let section = &doc[doc.find("\n## RBAC\n").expect("an RBAC section")..];
    let start = section.find("```yaml\n").expect("a YAML block") + "```yaml\n".len();
    let block = &section[start..];
    let block = &block[..block.find("```").unwrap()];
    let docs: Vec<Value> = serde_saphyr::from_multiple(block).unwrap();
    the(&docs, "Role", "picket").clone()
}

#[test]
fn the_deployment_parses_its_role_is_the_documented_one_and_its_config_validates() {
    // Every file the kustomization names parses, and every object is
    // namespaced in `cache` (but the namespace itself).
    let kustomization = deploy_docs("kustomization.yaml");
    let files: Vec<&str> = kustomization[0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        [
            "namespace.yaml",
            "rbac.yaml",
            "services.yaml",
            "dragonfly.yaml"
        ]
    );
    let docs: Vec<Value> = files.iter().flat_map(|f| deploy_docs(f)).collect();
    for d in &docs {
        assert!(d["apiVersion"].is_string() && d["kind"].is_string(), "{d}");
        if d["kind"] != "Namespace" {
            assert_eq!(d["metadata"]["namespace"], NS, "{d}");
        }
    }
    assert_eq!(docs.len(), 8, "{docs:#?}");

    // The Role is exactly the documented one, bound to picket's identity.
    let role = the(&docs, "Role", "picket");
    assert_eq!(role["rules"], documented_role()["rules"]);
    assert_eq!(
        role["rules"],
        json!([
            {"apiGroups": [""], "resources": ["pods"],
             "verbs": ["get", "list", "watch", "patch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
             "verbs": ["get", "list", "watch", "create", "patch"]},
        ])
    );
    let binding = the(&docs, "RoleBinding", "picket");
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(binding["roleRef"]["name"], "picket");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "picket", "namespace": NS}])
    );
    the(&docs, "ServiceAccount", "picket");

    // Three Dragonfly pods: readiness probe, preStop hook, anti-affinity,
    // no persistence.
    let sts = the(&docs, "StatefulSet", "cache");
    let spec = &sts["spec"];
    assert_eq!(spec["replicas"], 3);
    assert!(spec.get("volumeClaimTemplates").is_none(), "{sts}");
    let pod = &spec["template"]["spec"];
    let pod_labels = &spec["template"]["metadata"]["labels"];
    assert_eq!(
        pod_labels,
        &json!({"app": "cache"}),
        "no role label at birth"
    );
    assert_eq!(spec["selector"]["matchLabels"], *pod_labels);
    assert!(pod.get("volumes").is_none(), "{pod}");
    let anti =
        &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(anti["labelSelector"]["matchLabels"], *pod_labels);
    let c = &pod["containers"][0];
    assert!(
        c["image"]
            .as_str()
            .unwrap()
            .contains("dragonflydb/dragonfly:v")
    );
    assert!(c["readinessProbe"]["exec"]["command"].is_array(), "{c}");
    assert_eq!(
        c["lifecycle"]["preStop"]["exec"]["command"],
        json!(["sleep", "5"])
    );
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > 5);
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--dbfilename="), "no snapshots: {args:?}");
    let port_named = |name: &str| {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
    };
    assert_eq!(port_named("redis"), Some(6379));

    // The master and replicas Services select the pods by picket's labels.
    let master_svc = the(&docs, "Service", "cache-master");
    let replicas_svc = the(&docs, "Service", "cache-replicas");
    assert!(the(&docs, "Service", "cache-pods")["spec"]["clusterIP"] == "None");

    // The picket configuration validates (as `picket check-config` does,
    // with its kubeconfig present) and matches the manifests.
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    std::fs::write(&kc, "apiVersion: v1\nkind: Config\n").unwrap();
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/picket.toml"),
    )
    .unwrap();
    assert!(text.contains("\"/etc/picket/kubeconfig\""));
    let text = text.replace("/etc/picket/kubeconfig", kc.to_str().unwrap());
    let config = picket::config::load_str(Path::new("picket.toml"), &text)
        .unwrap_or_else(|e| panic!("deploy/kubernetes/picket.toml: {e}"));
    let g = &config.groups[0];
    assert_eq!(
        g.admin_port.map(|p| p.to_string()),
        args.iter()
            .find_map(|a| a.strip_prefix("--admin_port="))
            .map(str::to_string)
    );
    assert_eq!(
        port_named("admin").map(|p| p as u16),
        g.admin_port,
        "the admin port is a container port"
    );
    let members = g.members.as_ref().expect("[group.members]");
    assert_eq!(members.port, picket::config::PortRef::Name("redis".into()));
    assert!(members.handover_on_delete);
    let [picket::config::DiscoveryConfig::Kubernetes(k)] = g.discovery.as_slice() else {
        panic!("one Kubernetes backend: {:?}", g.discovery);
    };
    assert_eq!(k.mode, KubernetesMode::PodLabels);
    assert_eq!(k.namespace, NS);
    assert!(k.required && !k.skip_service_gate);
    assert_eq!(k.service.as_deref(), Some("cache-master"));
    assert_eq!(k.pod_selector.as_deref(), Some("app=cache"));
    let mut want = pod_labels.clone();
    want[&k.role_label] = json!(k.master_value);
    assert_eq!(master_svc["spec"]["selector"], want);
    want[&k.role_label] = json!(k.replica_value);
    assert_eq!(replicas_svc["spec"]["selector"], want);
    for svc in [master_svc, replicas_svc] {
        assert_eq!(svc["spec"]["ports"][0]["targetPort"], "redis", "{svc}");
    }
}

// ---- kubeconfig proxy-url: through a local HTTP CONNECT proxy ----

/// A local HTTP CONNECT proxy: each CONNECT is tunnelled to its target
/// and its target recorded. Its address and the targets.
async fn connect_proxy() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let targets = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let targets = targets.clone();
            tokio::spawn(async move {
                // The request head, at most 8 KiB.
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                    if client.read_exact(&mut byte).await.is_err() {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let mut words = head.split_whitespace();
                let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) else {
                    let _ = client
                        .write_all(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                };
                targets.lock().unwrap().push(target.to_string());
                let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await else {
                    let _ = client
                        .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
                        .await;
                    return;
                };
                if client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await
                    .is_ok()
                {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    (addr, seen)
}

#[tokio::test]
async fn kubeconfig_proxy_url_goes_through_an_http_connect_proxy() {
    let fake = FakeKube::start().await;
    seed_pods(&fake);
    let (proxy, targets) = connect_proxy().await;
    let dir = tempfile::tempdir().unwrap();
    let path = kubeconfig_with(
        dir.path(),
        &format!("{}\n    proxy-url: http://{proxy}", ca_data(&fake)),
        &format!("    token: {DEFAULT_TOKEN}"),
    );
    let b = KubernetesBackend::new(&cfg(&path, KubernetesMode::PodLabels)).unwrap();
    b.publish(&topo(3, "10.0.0.2:6379", None)).await.unwrap();
    assert_eq!(role(&fake, "cache-1").as_deref(), Some("master"));
    assert_eq!(role(&fake, "cache-0").as_deref(), Some("replica"));
    // Every connection went through the proxy, to the API server, with
    // TLS to the API server inside the tunnel (the CA and the token are
    // the kubeconfig's).
    let fake_addr = fake.url().trim_start_matches("https://").to_string();
    let seen = targets.lock().unwrap().clone();
    assert!(!seen.is_empty(), "no CONNECT through the proxy");
    assert!(
        seen.iter().all(|t| *t == fake_addr),
        "{seen:?} vs {fake_addr}"
    );
    assert!(
        fake.requests().iter().all(|r| r.status < 400),
        "{:?}",
        fake.requests()
    );

    // The proxy is really in the path: with it gone, nothing reaches the
    // API server, and the write fails as a transient error.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    let path = kubeconfig_with(
        dir.path(),
        &format!("{}\n    proxy-url: http://{dead}", ca_data(&fake)),
        &format!("    token: {DEFAULT_TOKEN}"),
    );
    let before = fake.requests().len();
    let b = backend_with_short_budget(&path, KubernetesMode::PodLabels);
    let e = b
        .publish(&topo(4, "10.0.0.1:6379", None))
        .await
        .unwrap_err();
    assert!(matches!(e, DiscoveryError::Transient(_)), "{e:?}");
    assert_eq!(
        fake.requests().len(),
        before,
        "a request bypassed the proxy"
    );

    // Only an http:// proxy (HTTP CONNECT) is taken, and a wrong one is
    // refused up front, naming it.
    let path = kubeconfig_with(
        dir.path(),
        &format!("{}\n    proxy-url: socks5://{proxy}", ca_data(&fake)),
        &format!("    token: {DEFAULT_TOKEN}"),
    );
    let e = KubernetesBackend::new(&cfg(&path, KubernetesMode::PodLabels)).unwrap_err();
    assert_permanent(&e, &["proxy-url", "socks5"]);
}

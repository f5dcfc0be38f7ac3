//! What picket decodes from the Kubernetes side
//! (`picket::discovery::kubernetes`): error `Status` bodies (objects, lists
//! and watch events are decoded by k8s-openapi and kube-rs into typed
//! objects, which are then read here), the pod and EndpointSlice fields it
//! reads (a pod as a group member), exec
//! credential plugin output (`ExecCredential` JSON) and kubeconfig YAML
//! (kube-rs's reader, then picket's checks). None of it may panic.
//!
//! Input: the same bytes are read as each of those (JSON is also YAML),
//! and as the `expirationTimestamp` of an otherwise valid ExecCredential.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use picket::addr::Addr;
use picket::config::PortRef;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::ObjectList;
use picket::discovery::kubernetes::client::decode_error_body;
use picket::discovery::kubernetes::members::member_of;
use picket::discovery::kubernetes::endpointslice::{normalized_endpoints, normalized_ports};
use picket::discovery::kubernetes::kubeconfig::{ClusterConfig, decode_exec_credential};
use kube::config::Kubeconfig;
use picket::discovery::kubernetes::podlabels::pod_name_of;
use picket::discovery::kubernetes::{
    check_epoch, label, object_name, resource_version, stored_epoch,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn meta(m: &ObjectMeta) {
    let _ = stored_epoch(m);
    let _ = check_epoch(m, 7);
    let _ = resource_version(m);
    let _ = object_name(m);
    let _ = label(m, "role");
}

fn pod(p: &Pod) {
    meta(&p.metadata);
    let _ = member_of(p, &PortRef::Number(6379));
    let _ = member_of(p, &PortRef::Name("redis".into()));
}

fn slice(s: &EndpointSlice) {
    meta(&s.metadata);
    let _ = normalized_endpoints(s);
    let _ = normalized_ports(s);
}

fn text_of(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

fuzz_target!(|data: &[u8]| {
    // A successful answer: one object, or a list of them.
    if let Ok(p) = serde_json::from_slice::<Pod>(data) {
        pod(&p);
    }
    if let Ok(s) = serde_json::from_slice::<EndpointSlice>(data) {
        slice(&s);
    }
    if let Ok(list) = serde_json::from_slice::<ObjectList<Pod>>(data) {
        list.items.iter().for_each(pod);
        for addr in [Addr::new("10.0.0.1", 6379), Addr::new("fd00::1", 6379)] {
            let _ = pod_name_of(&list.items, &addr);
        }
    }

    // An error answer.
    let text = text_of(data);
    for code in [401, 403, 404, 409, 422, 500] {
        let e = decode_error_body("PATCH", "https://127.0.0.1:6443/api/v1/x", code, &text)
            .expect("a valid method and code");
        let _ = e.to_string();
    }

    // An exec plugin's output, and the input as the expiry of an
    // otherwise valid one (a timestamp is rarely reached by mutating JSON).
    let wrapped = serde_json::json!({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": "t", "expirationTimestamp": text},
    })
    .to_string();
    let _ = decode_exec_credential(wrapped.as_bytes(), "client.authentication.k8s.io/v1");
    for api in [
        "client.authentication.k8s.io/v1",
        "client.authentication.k8s.io/v1beta1",
    ] {
        if let Err(e) = decode_exec_credential(data, api) {
            let _ = e.to_string();
        }
    }

    // A kubeconfig (file paths in it name nothing, or are read as picket would).
    if let Ok(k) = Kubeconfig::from_yaml(&text) {
        match ClusterConfig::from_parsed(k, Path::new("fuzz.kubeconfig"), None) {
            Ok(c) => {
                let _ = format!("{c:?}");
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
});

//! `endpointslice` mode: picket owns one `discovery.k8s.io/v1` EndpointSlice
//! per group, `<service>-picket`, attached to a selector-less Service by the
//! `kubernetes.io/service-name` label. It holds exactly the master's
//! address after `publish` and no endpoint after `fence`.
//!
//! The address and the epoch annotation change in one conditional request,
//! so the Service never routes to two masters, and the switch from one
//! master to the next is a single write (unlike pod labels).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::client::{KubeClient, Objects};
use super::{CONFLICT_ATTEMPTS, EPOCH_ANNOTATION, check_epoch, label, resource_version};
use crate::discovery::{DiscoveryError, Fence, Topology};

/// The label linking a slice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming the slice's controller.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// picket's value of [`MANAGED_BY_LABEL`] (never the built-in controller's,
/// or the two would fight over the slice).
pub const MANAGED_BY: &str = "picket.io";

/// Writes the group's EndpointSlice.
#[derive(Debug, Clone)]
pub struct EndpointSliceWriter {
    slices: Objects<EndpointSlice>,
    namespace: String,
    service: String,
    port_name: String,
    name: String,
}

impl EndpointSliceWriter {
    /// A writer for the slice of `service` in `namespace`.
    pub fn new(client: KubeClient, namespace: &str, service: &str, port_name: &str) -> Self {
        EndpointSliceWriter {
            slices: client.api(namespace),
            namespace: namespace.to_string(),
            service: service.to_string(),
            port_name: port_name.to_string(),
            name: format!("{service}-picket"),
        }
    }

    /// The slice's name, `<service>-picket`.
    pub fn slice_name(&self) -> &str {
        &self.name
    }

    /// The slice as picket writes it, at `epoch`: its labels, the epoch
    /// annotation, IPv4, `endpoints` and the one port.
    fn slice(&self, epoch: u64, endpoints: Vec<Endpoint>, port: u16) -> EndpointSlice {
        let labels = [
            (SERVICE_NAME_LABEL, self.service.as_str()),
            (MANAGED_BY_LABEL, MANAGED_BY),
        ];
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                annotations: Some(BTreeMap::from([(
                    EPOCH_ANNOTATION.to_string(),
                    epoch.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            endpoints,
            ports: Some(vec![EndpointPort {
                name: Some(self.port_name.clone()),
                port: Some(i32::from(port)),
                protocol: Some("TCP".into()),
                app_protocol: None,
            }]),
        }
    }

    /// Empty the slice (no endpoint routes), unless a write of this epoch
    /// already replaced the old master.
    pub async fn fence(&self, fence: &Fence) -> Result<(), DiscoveryError> {
        // Only for telling an already fenced slice: the fence empties the
        // slice whether or not the old master's name still resolves.
        let old_ip: Option<Ipv4Addr> = resolve(&fence.old_master.host, fence.old_master.port)
            .await
            .ok()
            .and_then(|h| h.parse().ok());
        let want = self.slice(fence.epoch, Vec::new(), fence.old_master.port);
        let out = self
            .write(fence.epoch, want, |slice, stored| {
                let holds_old = slice.endpoints.iter().any(|ep| {
                    ep.addresses.iter().any(|a| {
                        a.parse::<Ipv4Addr>()
                            .ok()
                            .is_some_and(|ip| Some(ip) == old_ip)
                    })
                });
                // Same epoch: either already fenced, or the new master of
                // this very epoch is in (a retried fence must not undo it).
                stored == Some(fence.epoch) && (slice.endpoints.is_empty() || !holds_old)
            })
            .await?;
        if out {
            tracing::info!(group = %fence.group, epoch = fence.epoch, slice = %self.name,
                old_master = %fence.old_master, "fence: emptied the EndpointSlice");
        }
        Ok(())
    }

    /// Make the slice hold exactly the master's address.
    pub async fn publish(&self, t: &Topology) -> Result<(), DiscoveryError> {
        // Checked before any request: the API server would answer 422, and
        // a refusal found only at the first failover is found too late.
        let ip = slice_address(&resolve(&t.master.host, t.master.port).await?)?;
        let endpoints = vec![Endpoint {
            addresses: vec![ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            ..Endpoint::default()
        }];
        let want = self.slice(t.epoch, endpoints, t.master.port);
        let (want_endpoints, want_ports) = (normalized_endpoints(&want), normalized_ports(&want));
        let out = self
            .write(t.epoch, want, move |slice, stored| {
                stored == Some(t.epoch)
                    && normalized_endpoints(slice) == want_endpoints
                    && normalized_ports(slice) == want_ports
            })
            .await?;
        if out {
            tracing::info!(group = %t.group, epoch = t.epoch, slice = %self.name,
                master = %t.master, "publish: EndpointSlice points at the new master");
        }
        Ok(())
    }

    /// Create the slice as `want` (at `epoch`) or patch it conditionally to it;
    /// `done(slice, stored epoch)` says the existing slice needs no write.
    /// Returns whether it wrote.
    async fn write(
        &self,
        epoch: u64,
        mut want: EndpointSlice,
        done: impl Fn(&EndpointSlice, Option<u64>) -> bool,
    ) -> Result<bool, DiscoveryError> {
        let ns = &self.namespace;
        let mut last = None;
        for _ in 0..CONFLICT_ATTEMPTS {
            let Some(slice) = self.slices.get_opt(&self.name).await? else {
                want.metadata.resource_version = None;
                match self.slices.create(&want).await {
                    Ok(_) => return Ok(true),
                    Err(e) if e.is_already_exists() => {
                        last = Some(e);
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            let stored = check_epoch(&slice.metadata, epoch)?;
            if slice.address_type != "IPv4" {
                // addressType is immutable; only deleting the slice helps.
                return Err(DiscoveryError::Permanent(format!(
                    "kubernetes: EndpointSlice {ns}/{} has addressType {:?}, picket needs IPv4; \
                     delete it and picket will create it",
                    self.name, slice.address_type
                )));
            }
            let labelled = label(&slice.metadata, SERVICE_NAME_LABEL)
                == Some(self.service.as_str())
                && label(&slice.metadata, MANAGED_BY_LABEL) == Some(MANAGED_BY);
            if labelled && done(&slice, stored) {
                return Ok(false);
            }
            // The whole slice as a merge patch, conditional on the version
            // just read: endpoints and ports are atomic lists, replaced
            // whole; the labels and annotations are merged into the
            // slice's, and fields others own (ownerReferences) are left alone.
            want.metadata.resource_version = Some(resource_version(&slice.metadata));
            match self.slices.merge_patch(&self.name, &want).await {
                Ok(_) => return Ok(true),
                Err(e) if e.is_conflict() || e.is_not_found() => {
                    tracing::debug!(slice = %self.name, error = %e, "reading the slice again");
                    last = Some(e);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(DiscoveryError::Transient(format!(
            "kubernetes: EndpointSlice {ns}/{}: still conflicting after {CONFLICT_ATTEMPTS} \
             attempts: {}",
            self.name,
            last.map(|e| e.to_string()).unwrap_or_default()
        )))
    }
}

/// Why the API server refuses `ip` as an address of an IPv4 or IPv6
/// EndpointSlice, in its own words (`ValidateNonSpecialIP` of the
/// apiserver's validation); `None` when it accepts it.
pub fn refused_by_api(ip: IpAddr) -> Option<&'static str> {
    let unspecified = ip.is_unspecified();
    let loopback = ip.is_loopback();
    let (link_local, link_local_multicast) = match ip {
        IpAddr::V4(v4) => (
            v4.is_link_local(),
            // 224.0.0.0/24
            v4.octets()[..3] == [224, 0, 0],
        ),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            (
                // fe80::/10
                s[0] & 0xffc0 == 0xfe80,
                // ffX2::/16, as Go's IsLinkLocalMulticast
                s[0] & 0xff0f == 0xff02,
            )
        }
    };
    if unspecified {
        Some("may not be unspecified")
    } else if loopback {
        Some("may not be in the loopback range (127.0.0.0/8, ::1/128)")
    } else if link_local {
        Some("may not be in the link-local range (169.254.0.0/16, fe80::/10)")
    } else if link_local_multicast {
        Some("may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)")
    } else {
        None
    }
}

/// How long a host name's resolution may take at write time.
const RESOLVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// `host` as an address for the slice: itself when it is an IP, else the
/// first IPv4 address the name resolves to now (with `announce_hostnames`
/// a master known by name reaches this backend by name). A name that does
/// not resolve is a transient error naming it: the write is retried.
pub async fn resolve(host: &str, port: u16) -> Result<String, DiscoveryError> {
    if host.parse::<IpAddr>().is_ok() {
        return Ok(host.to_string());
    }
    let fail = |why: String| {
        DiscoveryError::Transient(format!(
            "kubernetes: endpointslice mode cannot resolve the master's name {host:?}: {why}"
        ))
    };
    let addrs = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, port)))
        .await
        .map_err(|_| fail(format!("no answer within {RESOLVE_TIMEOUT:?}")))?
        .map_err(|e| fail(e.to_string()))?;
    let mut v4 = addrs.filter(|a| a.is_ipv4());
    v4.next()
        .map(|a| a.ip().to_string())
        .ok_or_else(|| fail("it has no IPv4 address".into()))
}

/// The master's host as the address of picket's (IPv4) slice, or a
/// permanent error naming the address when the API server would refuse
/// it (a host name, an IPv6 address, loopback, link-local, unspecified)
/// or when it cannot be a server's address (multicast, broadcast).
pub fn slice_address(host: &str) -> Result<Ipv4Addr, DiscoveryError> {
    let refuse = |why: &str| {
        Err(DiscoveryError::Permanent(format!(
            "kubernetes: endpointslice mode cannot publish the master address {host:?}: {why}"
        )))
    };
    let ip: IpAddr = match host.parse() {
        Ok(ip) => ip,
        Err(_) => {
            return refuse(
                "not an IP address (the API server refuses host names in an IPv4 \
                 EndpointSlice)",
            );
        }
    };
    let IpAddr::V4(v4) = ip else {
        return refuse("picket's EndpointSlice is IPv4; an IPv6 master needs pod-labels mode");
    };
    if let Some(why) = refused_by_api(ip) {
        return refuse(&format!(
            "the API server refuses it in an EndpointSlice ({why}); publish the pod's or \
             node's address"
        ));
    }
    if v4.is_multicast() || v4.is_broadcast() {
        return refuse("a multicast or broadcast address is not a server's address");
    }
    Ok(v4)
}

/// The slice's endpoints reduced to the fields picket sets: addresses
/// and the three conditions (missing conditions are all unset).
pub fn normalized_endpoints(slice: &EndpointSlice) -> Vec<(Vec<String>, [Option<bool>; 3])> {
    slice
        .endpoints
        .iter()
        .map(|ep| {
            let c = ep.conditions.clone().unwrap_or_default();
            (ep.addresses.clone(), [c.ready, c.serving, c.terminating])
        })
        .collect()
}

/// The slice's ports reduced to the fields picket sets (a missing
/// protocol is TCP, as the API server defaults it).
pub fn normalized_ports(slice: &EndpointSlice) -> Vec<(Option<String>, Option<i32>, String)> {
    slice
        .ports
        .iter()
        .flatten()
        .map(|p| {
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            (p.name.clone(), p.port, protocol)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn names_are_resolved_at_write_time() {
        assert_eq!(resolve("10.0.0.1", 6379).await.unwrap(), "10.0.0.1");
        // A name is resolved, then checked like any address.
        let ip = resolve("localhost", 6379).await.unwrap();
        assert_eq!(ip, "127.0.0.1");
        assert!(
            matches!(slice_address(&ip), Err(DiscoveryError::Permanent(m)) if m.contains("loopback"))
        );
        match resolve("no-such-host.invalid", 6379).await {
            Err(DiscoveryError::Transient(m)) => assert!(m.contains("no-such-host.invalid"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn addresses_the_api_refuses() {
        for (host, want) in [
            ("127.0.0.1", "loopback"),
            ("127.3.4.5", "loopback"),
            ("169.254.1.1", "link-local range"),
            ("0.0.0.0", "unspecified"),
            ("224.0.0.5", "link-local multicast"),
            ("239.1.1.1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("cache-0.cache.svc", "host names"),
            ("fd00::1", "IPv6"),
        ] {
            match slice_address(host) {
                Err(DiscoveryError::Permanent(m)) => {
                    assert!(m.contains(want) && m.contains(host), "{host}: {m}");
                }
                other => panic!("{host}: {other:?}"),
            }
        }
        for ok in ["10.0.0.1", "198.18.0.7", "192.168.1.1", "100.64.0.1"] {
            assert_eq!(slice_address(ok).unwrap().to_string(), ok);
        }
        let v6 = |s: &str| refused_by_api(s.parse().unwrap());
        assert!(v6("::1").unwrap().contains("loopback"));
        assert!(v6("::").unwrap().contains("unspecified"));
        assert!(v6("fe80::1").unwrap().contains("link-local range"));
        assert!(v6("ff02::1").unwrap().contains("multicast"));
        assert_eq!(v6("fd00::1"), None);
        assert_eq!(v6("ff05::1"), None, "only link-local multicast is refused");
    }
}

//! The TOML configuration: schema, loading and validation.
//!
//! The names here are picket's public contract (docs/configuration.md
//! documents each); keep them stable. Every struct denies unknown
//! fields so that a typo is an error instead of a silently ignored key.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::addr::Addr;

/// Exit code for a configuration that cannot be used (sysexits EX_USAGE).
pub const EX_USAGE: i32 = 64;

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Settings of this daemon.
    pub daemon: DaemonConfig,
    /// The monitored groups (`[[group]]`).
    #[serde(default, rename = "group")]
    pub groups: Vec<GroupConfig>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[daemon]`: this daemon's identity, ports and peers.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Stable identity; when omitted one is generated once and persisted in `data_dir`.
    #[serde(default)]
    pub id: Option<String>,
    /// RESP listener: the Sentinel-compatible API and the peer protocol.
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Address peers and clients should use to reach this daemon (defaults to `listen`).
    #[serde(default)]
    pub announce: Option<String>,
    /// HTTP listener for `/metrics`, `/healthz`, `/readyz` and `/v1/status`.
    #[serde(default = "default_http_listen")]
    pub http_listen: String,
    /// Directory for the persisted state (epochs, votes, current masters).
    #[serde(default = "default_data_dir")]
    pub data_dir: PathBuf,
    /// File holding the password required on `listen` (and sent to peers).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// `text` or `json`.
    #[serde(default)]
    pub log_format: LogFormat,
    /// The other daemons of the quorum (`host:port` of their `listen`).
    #[serde(default, deserialize_with = "addrs_as_written")]
    pub peers: Vec<Addr>,
    /// Maximum number of simultaneous client connections on `listen`.
    #[serde(default = "default_max_clients")]
    pub max_clients: usize,
    /// Backlog of `listen`'s accept queue (Redis' `tcp-backlog`; the
    /// kernel caps it at `net.core.somaxconn`). 4096, not Redis' 511: the
    /// queue must hold the connections completed while the listener's
    /// thread waits for a core.
    #[serde(default = "default_tcp_backlog")]
    pub tcp_backlog: u32,
    /// Allow `SENTINEL SIMULATE-FAILURE` / `PICKET SIMULATE-FAILURE`, which
    /// make this daemon exit at chosen points of a failover (crash tests).
    #[serde(default)]
    pub enable_fault_injection: bool,
    /// What the `default` user may do: the one `AUTH <password>` (with
    /// `password_file`) or no `AUTH` at all (without it) logs in as.
    #[serde(default)]
    pub default_role: Role,
    /// The `[[daemon.user]]` this daemon authenticates to its peers as;
    /// without it, the `default` user's `password_file` is sent.
    #[serde(default)]
    pub peer_user: Option<String>,
    /// TLS on `listen`, to the peers and optionally on `http_listen`.
    #[serde(default)]
    pub tls: Option<ListenTlsConfig>,
    /// Users of the RESP listener (`[[daemon.user]]`, `AUTH user password`).
    #[serde(default, rename = "user")]
    pub users: Vec<UserConfig>,
}

/// What a user of the RESP listener may run.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Nothing: the user cannot log in (only for `default_role`).
    None,
    /// Read: where the master is, the instance tables, `INFO`, `ROLE`, events.
    Client,
    /// Read, and change: `FAILOVER`, `RESET`, `CLIENT KILL`, `SIMULATE-FAILURE`.
    Operator,
    /// Read, and the peer protocol (`PICKET IS-DOWN`, `PICKET HELLO`,
    /// `SENTINEL IS-MASTER-DOWN-BY-ADDR`): the other daemons.
    Peer,
    /// Everything (what one shared password gave before users existed).
    #[default]
    All,
}

impl Role {
    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Role::None => "none",
            Role::Client => "client",
            Role::Operator => "operator",
            Role::Peer => "peer",
            Role::All => "all",
        }
    }
}

/// `[[daemon.user]]`: one user of the RESP listener (a Redis ACL user).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// The name given to `AUTH <name> <password>`.
    pub name: String,
    /// What it may run: `client`, `operator`, `peer` or `all`.
    pub role: Role,
    /// File holding its password.
    pub password_file: PathBuf,
}

/// Whether clients of a TLS listener must present a certificate
/// (Redis' `tls-auth-clients`).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum AuthClients {
    /// A certificate signed by `ca_file` is required (Redis' default).
    #[default]
    Yes,
    /// A certificate is verified when one is presented.
    Optional,
    /// Certificates are not asked for.
    No,
}

/// `[daemon.tls]`: TLS on the RESP listener (Redis' `tls-port`,
/// `tls-cert-file`, ...), to the peers and optionally on HTTP.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ListenTlsConfig {
    /// PEM certificate chain of this daemon (served on `listen`, and shown
    /// to peers as a client certificate).
    pub cert_file: PathBuf,
    /// PEM private key of `cert_file`.
    pub key_file: PathBuf,
    /// PEM CA that signs client and peer certificates.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// `yes`, `optional` or `no`: whether clients must show a certificate.
    #[serde(default)]
    pub auth_clients: AuthClients,
    /// Connect to the peers with TLS (Sentinel's `tls-replication`).
    #[serde(default = "default_true")]
    pub peers: bool,
    /// Require each peer's certificate to name the host it is listed under
    /// in `daemon.peers`; when false any certificate of `ca_file` is
    /// accepted (as Redis does).
    #[serde(default = "default_true")]
    pub verify_peer_name: bool,
    /// A second RESP listener in plaintext, for a migration.
    #[serde(default)]
    pub plaintext_listen: Option<String>,
    /// Serve `http_listen` with TLS too.
    #[serde(default)]
    pub http: bool,
    /// With `http`: `/metrics`, `/healthz` and `/readyz` in plaintext here.
    #[serde(default)]
    pub plaintext_http_listen: Option<String>,
}

/// `[[group]]`: one master and its replicas.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// Name of the group (Sentinel's "master name").
    pub name: String,
    /// The initial master (`host:port`); replicas are discovered from its INFO.
    #[serde(deserialize_with = "addr_as_written")]
    pub master: Addr,
    /// Daemons (self included) that must see the master down before a failover.
    pub quorum: u32,
    /// How long without a valid reply before this daemon sees an instance down.
    #[serde(with = "humantime_serde", default = "default_down_after")]
    pub down_after: Duration,
    /// How long connections to an instance must be refused (its process
    /// gone on a host that answers) before this daemon sees it down without
    /// waiting for the rest of `down_after`. At most `down_after`; equal
    /// to it, refusals count only as silence. Unset: 100 ms, or
    /// `down_after` when that is shorter ([`GroupConfig::down_after_refused`]).
    #[serde(with = "humantime_serde::option", default)]
    pub down_after_refused: Option<Duration>,
    /// Deadline of a failover attempt; also the pause between two attempts.
    #[serde(with = "humantime_serde", default = "default_failover_timeout")]
    pub failover_timeout: Duration,
    /// How many replicas are re-pointed at the new master at the same time.
    #[serde(default = "default_parallel_syncs")]
    pub parallel_syncs: u32,
    /// FLUSHALL a promoted replica before it is advertised as master.
    #[serde(default)]
    pub flush_on_failover: bool,
    /// Give clients and servers host names as configured (Sentinel's
    /// `announce-hostnames`); by default they get the IP a name resolved
    /// to, as from Sentinel with `resolve-hostnames yes`.
    #[serde(default)]
    pub announce_hostnames: bool,
    /// ACL user for the data servers (with `password_file`).
    #[serde(default)]
    pub username: Option<String>,
    /// File holding the password of the data servers.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// TLS to the data servers.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Dragonfly: the admin port used for administrative commands, if any.
    #[serde(default)]
    pub admin_port: Option<u16>,
    /// Isolation fencing (`[group.isolation_fencing]`): picket manages
    /// `min-replicas-to-write` / `min-replicas-max-lag` on the master, so
    /// that a master cut off from its replicas stops acknowledging writes.
    /// Absent: picket never touches those settings.
    #[serde(default)]
    pub isolation_fencing: Option<IsolationFencingConfig>,
    /// Service-discovery backends (`[[group.discovery]]`).
    #[serde(default)]
    pub discovery: Vec<DiscoveryConfig>,
    /// Take the group's members from Kubernetes pods (`[group.members]`).
    /// Absent: the members are the master and the replicas it lists.
    #[serde(default)]
    pub members: Option<MembersConfig>,
    /// A replica that the master no longer lists and that has been down
    /// this long is forgotten (Sentinel keeps it until `SENTINEL RESET`).
    /// A server last seen as a master is never forgotten this way: if it
    /// came back it must be demoted.
    #[serde(with = "humantime_serde", default = "default_forget_after")]
    pub forget_after: Duration,
}

/// `[group.members]`: the group's servers are the pods a label selector
/// matches, kept current with a list and a watch of the Kubernetes API.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MembersConfig {
    /// kubeconfig path; omitted: the group's Kubernetes backend's, else
    /// the in-cluster service account.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context; omitted: the group's Kubernetes backend's, else
    /// current-context.
    #[serde(default)]
    pub context: Option<String>,
    /// Namespace of the pods; omitted: the group's Kubernetes backend's.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Label selector of the group's pods; omitted: the group's
    /// Kubernetes backend's `pod_selector`.
    #[serde(default)]
    pub pod_selector: Option<String>,
    /// The data port: a number, or the name of a container port.
    pub port: PortRef,
    /// When the master's pod is being deleted (rolling update, drain,
    /// eviction), hand over to the best replica with a planned switchover.
    #[serde(default = "default_true")]
    pub handover_on_delete: bool,
    /// Per-request timeout of the list (the watch lasts longer).
    #[serde(with = "humantime_serde", default = "default_k8s_timeout")]
    pub timeout: Duration,
}

/// A container port: its number, or its name in the pod spec.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum PortRef {
    /// `port = 6379`.
    Number(u16),
    /// `port = "redis"`: the `containerPort` of the port of that name.
    Name(String),
}

impl MembersConfig {
    /// The settings with what is omitted taken from the group's first
    /// Kubernetes backend.
    pub fn resolved(&self, discovery: &[DiscoveryConfig]) -> MembersConfig {
        let backend = discovery.iter().find_map(|d| match d {
            DiscoveryConfig::Kubernetes(k) => Some(k),
            _ => None,
        });
        let mut out = self.clone();
        if let Some(k) = backend {
            if out.kubeconfig.is_none() && out.context.is_none() {
                out.kubeconfig = k.kubeconfig.clone();
                out.context = k.context.clone();
            }
            if out.namespace.is_none() {
                out.namespace = Some(k.namespace.clone());
            }
            if out.pod_selector.is_none() {
                out.pod_selector = k.pod_selector.clone();
            }
        }
        out
    }

    fn validate(&self, key: &str, discovery: &[DiscoveryConfig], v: &mut Problems) {
        let r = self.resolved(discovery);
        validate_kube_credentials(key, &self.kubeconfig, &self.context, v);
        match r.namespace.as_deref() {
            None => v.add(
                format!("{key}.namespace"),
                "is required (or a [[group.discovery]] of type \"kubernetes\" to take it from)",
            ),
            Some(ns) => v.check(format!("{key}.namespace"), dns_label_problem(ns, false)),
        }
        match r.pod_selector.as_deref().map(str::trim) {
            None => v.add(
                format!("{key}.pod_selector"),
                "is required (or a [[group.discovery]] of type \"kubernetes\" with one)",
            ),
            Some("") => v.add(format!("{key}.pod_selector"), "must not be empty"),
            Some(_) => {}
        }
        match &self.port {
            PortRef::Number(0) => v.add(format!("{key}.port"), "must not be 0"),
            PortRef::Name(n) if n.is_empty() || n.len() > 15 => v.add(
                format!("{key}.port"),
                "a container port name has 1 to 15 characters",
            ),
            _ => {}
        }
        v.positive(format!("{key}.timeout"), self.timeout);
    }
}

/// TLS settings for connections to the data servers.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM file of the CA that signed the servers' certificates.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (with `key_file`), for servers that require one.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Name to verify in the server certificate (defaults to the host).
    #[serde(default)]
    pub server_name: Option<String>,
}

/// `[group.isolation_fencing]`: the fence picket keeps on the master
/// (Redis' and Valkey's `min-replicas-to-write` / `min-replicas-max-lag`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct IsolationFencingConfig {
    /// `min-replicas-to-write`: replicas that must have acknowledged within
    /// `max_lag` for the master to accept a write.
    #[serde(default = "default_min_replicas")]
    pub min_replicas: u32,
    /// `min-replicas-max-lag`: how old a replica's last acknowledgement may
    /// be for it to count (Redis counts whole seconds).
    #[serde(with = "humantime_serde", default = "default_max_lag")]
    pub max_lag: Duration,
}

impl IsolationFencingConfig {
    /// `max_lag` in the whole seconds Redis takes.
    pub fn max_lag_secs(&self) -> u64 {
        self.max_lag.as_secs()
    }
}

/// One `[[group.discovery]]` entry.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum DiscoveryConfig {
    /// Kubernetes pod labels or EndpointSlice.
    Kubernetes(KubernetesConfig),
    /// Run a program, like Sentinel's client-reconfig-script.
    Exec(ExecConfig),
    /// POST a JSON body to a URL.
    Webhook(WebhookConfig),
    /// Write the topology as a JSON file.
    File(FileConfig),
    /// Record every write in memory and show the record in `/v1/status`
    /// (for tests and for watching the gating order; routes nothing).
    Memory(MemoryConfig),
}

/// `type = "memory"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    /// Whether the failover waits for this backend.
    #[serde(default = "default_true")]
    pub required: bool,
}

/// How picket publishes the master to Kubernetes.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "kebab-case")]
pub enum KubernetesMode {
    /// Set a role label on the pods (the Dragonfly operator's contract).
    #[default]
    PodLabels,
    /// Own one EndpointSlice of a selector-less Service.
    Endpointslice,
}

/// `type = "kubernetes"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// kubeconfig path; omitted means the in-cluster service account.
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context; omitted means current-context.
    #[serde(default)]
    pub context: Option<String>,
    /// Namespace of the pods / Service.
    pub namespace: String,
    /// `pod-labels` or `endpointslice`.
    #[serde(default)]
    pub mode: KubernetesMode,
    /// pod-labels: label selector of the group's pods.
    #[serde(default)]
    pub pod_selector: Option<String>,
    /// pod-labels: the role label key.
    #[serde(default = "default_role_label")]
    pub role_label: String,
    /// pod-labels: value for the master.
    #[serde(default = "default_master_value")]
    pub master_value: String,
    /// pod-labels: value for replicas.
    #[serde(default = "default_replica_value")]
    pub replica_value: String,
    /// endpointslice: the selector-less Service.
    #[serde(default)]
    pub service: Option<String>,
    /// endpointslice: the Service port name (must match the Service).
    #[serde(default = "default_port_name")]
    pub port_name: String,
    /// Whether fencing/publication must be confirmed before the failover proceeds.
    #[serde(default = "default_true")]
    pub required: bool,
    /// Per-request timeout.
    #[serde(with = "humantime_serde", default = "default_k8s_timeout")]
    pub timeout: Duration,
    /// pod-labels with `service`: how long the fence waits for the old
    /// master to leave the Service's EndpointSlices, and the publication
    /// for the new one to appear there.
    #[serde(with = "humantime_serde", default = "default_service_gate_timeout")]
    pub service_gate_timeout: Duration,
    /// pod-labels without `service`: the explicit opt-out of the Service
    /// gate. Without `service` the fence is confirmed as soon as the label
    /// PATCH is accepted, while the Service may still route to the old
    /// master; picket refuses that unless this is set, and warns (log,
    /// `/v1/status`, `picket_discovery_gate_skipped`) when it is.
    #[serde(default)]
    pub skip_service_gate: bool,
}

/// `type = "exec"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// argv of the program; Sentinel's seven arguments are appended.
    pub command: Vec<String>,
    /// Kill the program after this long.
    #[serde(with = "humantime_serde", default = "default_exec_timeout")]
    pub timeout: Duration,
    /// Whether the failover waits for this backend.
    #[serde(default)]
    pub required: bool,
    /// Also run the program when the old master is fenced (state `fence`).
    /// Off by default: a Sentinel client-reconfig-script only knows state
    /// `start` and would take a fence for a switch.
    #[serde(default)]
    pub on_fence: bool,
}

/// `type = "webhook"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// Where to POST.
    pub url: String,
    /// Per-request timeout.
    #[serde(with = "humantime_serde", default = "default_webhook_timeout")]
    pub timeout: Duration,
    /// File holding a bearer token.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// File holding the HMAC-SHA256 key for the signature header.
    #[serde(default)]
    pub hmac_key_file: Option<PathBuf>,
    /// PEM CA to verify the server with.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Whether the failover waits for this backend.
    #[serde(default)]
    pub required: bool,
}

/// `type = "file"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Path of the JSON file.
    pub path: PathBuf,
    /// Whether the failover waits for this backend.
    #[serde(default)]
    pub required: bool,
}

fn default_listen() -> String {
    "0.0.0.0:26379".to_string()
}
fn default_http_listen() -> String {
    "0.0.0.0:9479".to_string()
}
fn default_data_dir() -> PathBuf {
    PathBuf::from("/var/lib/picket")
}
fn default_max_clients() -> usize {
    10_000
}
fn default_tcp_backlog() -> u32 {
    4096
}
fn default_down_after() -> Duration {
    Duration::from_secs(5)
}
fn default_failover_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_parallel_syncs() -> u32 {
    1
}
fn default_min_replicas() -> u32 {
    1
}
fn default_max_lag() -> Duration {
    Duration::from_secs(1)
}
fn default_role_label() -> String {
    "role".to_string()
}
/// An address that does not parse is kept as written, with port 0 (which
/// no valid address has), so that `validate()` reports it together with
/// every other problem of the file instead of stopping the parse at it.
fn addr_as_written<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Addr, D::Error> {
    let text = String::deserialize(d)?;
    Ok(text.parse().unwrap_or(Addr {
        host: text,
        port: 0,
    }))
}

/// A list of addresses, each kept as [`addr_as_written`] does.
fn addrs_as_written<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Addr>, D::Error> {
    let texts = Vec::<String>::deserialize(d)?;
    Ok(texts
        .into_iter()
        .map(|text| {
            text.parse().unwrap_or(Addr {
                host: text,
                port: 0,
            })
        })
        .collect())
}

/// Why an address kept by [`addr_as_written`] is not one.
fn addr_problem(a: &Addr) -> Option<String> {
    (a.port == 0).then(|| match a.host.parse::<Addr>() {
        Err(e) => e.to_string(),
        Ok(_) => format!("invalid address {:?}", a.host),
    })
}

fn default_master_value() -> String {
    "master".to_string()
}
fn default_replica_value() -> String {
    "replica".to_string()
}
fn default_port_name() -> String {
    "redis".to_string()
}
fn default_true() -> bool {
    true
}
/// `kubeconfig` must be a readable file and `context`, when given, not empty.
fn validate_kube_credentials(
    key: &str,
    kubeconfig: &Option<PathBuf>,
    context: &Option<String>,
    v: &mut Problems,
) {
    if let Some(f) = kubeconfig {
        v.file(format!("{key}.kubeconfig"), f);
    }
    if context.as_deref() == Some("") {
        v.add(
            format!("{key}.context"),
            "must not be empty (omit it to use current-context)",
        );
    }
}

fn default_forget_after() -> Duration {
    Duration::from_secs(600)
}

fn default_service_gate_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_k8s_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_exec_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_webhook_timeout() -> Duration {
    Duration::from_secs(2)
}

impl DaemonConfig {
    /// The address peers and clients are told to use.
    pub fn announce_addr(&self) -> &str {
        self.announce.as_deref().unwrap_or(&self.listen)
    }
}

impl GroupConfig {
    /// `down_after_refused` as configured, else 100 ms (at most
    /// `down_after`).
    pub fn down_after_refused(&self) -> Duration {
        self.down_after_refused
            .unwrap_or(Duration::from_millis(100))
            .min(self.down_after)
    }

    /// The probe period derived from `down_after`: a quarter of it, between
    /// 20 ms and 1 s, so that detection costs little more than `down_after`.
    pub fn ping_period(&self) -> Duration {
        (self.down_after / 4).clamp(Duration::from_millis(20), Duration::from_secs(1))
    }
}

/// Parse `host:port` into a socket address (IP literals only).
pub fn parse_addr(s: &str) -> Option<SocketAddr> {
    s.parse().ok()
}

/// Read a secret from a file, dropping the trailing line break(s) an editor adds.
pub fn read_secret(path: &Path) -> std::io::Result<String> {
    let mut s = std::fs::read_to_string(path)?;
    while s.ends_with('\n') || s.ends_with('\r') {
        s.pop();
    }
    Ok(s)
}

// ---------------------------------------------------------------------------
// Loading: file -> TOML tree (with spans) -> Config -> validate().

/// One thing wrong with a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// 1-based line of the offending key, or of the header of its table when
    /// the key is absent; `None` when the problem has no place in the file
    /// (it could not be read).
    pub line: Option<usize>,
    /// Dotted key path as the user sees it, e.g. `group[0].down_after`;
    /// empty when the problem concerns the file as a whole.
    pub key: String,
    /// What is wrong, in words meant for the user.
    pub reason: String,
}

/// Every problem found in one configuration file.
///
/// `Display` prints one `PATH:LINE: key: reason` line per problem, in file
/// order, the form `picket check-config` prints. `:LINE` is left out when
/// the line is unknown and `key: ` when the problem concerns the whole file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors {
    path: PathBuf,
    problems: Vec<ConfigProblem>,
}

impl ConfigErrors {
    /// The file the problems were found in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The problems, in file order (never empty).
    pub fn problems(&self) -> &[ConfigProblem] {
        &self.problems
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{}", self.path.display())?;
            if let Some(line) = p.line {
                write!(f, ":{line}")?;
            }
            f.write_str(": ")?;
            if !p.key.is_empty() {
                write!(f, "{}: ", p.key)?;
            }
            f.write_str(&p.reason)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Read, parse and validate the configuration file at `path`.
///
/// All validation problems are reported at once, each with the line of the
/// offending key, so that a user can fix the file in one pass. A TOML syntax
/// or type error stops the parse and is reported alone.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigErrors {
        path: path.to_path_buf(),
        problems: vec![ConfigProblem {
            line: None,
            key: String::new(),
            reason: format!("cannot read the configuration file: {e}"),
        }],
    })?;
    load_str(path, &text)
}

/// Parse and validate configuration text as [`load`] does; `path` only names
/// the file in messages and is not read.
pub fn load_str(path: &Path, text: &str) -> Result<Config, ConfigErrors> {
    let fail = |problems| ConfigErrors {
        path: path.to_path_buf(),
        problems,
    };
    let tree = DeTable::parse(text).map_err(|e| fail(vec![syntax_problem(text, &e)]))?;
    let index = SpanIndex::new(text, tree.get_ref());
    let config = Config::deserialize(toml::de::Deserializer::from(tree.clone()))
        .map_err(|e| fail(vec![index.serde_problem(tree.get_ref(), &e)]))?;
    let mut problems: Vec<ConfigProblem> = config
        .validate()
        .into_iter()
        .map(|(key, reason)| ConfigProblem {
            line: index.line_of_key(&key),
            key,
            reason,
        })
        .collect();
    if problems.is_empty() {
        return Ok(config);
    }
    // Stable: problems on one line keep the order validate() found them in.
    problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
    Err(fail(problems))
}

/// A syntax error stops the span-preserving parse, so the key is looked up
/// in the best-effort tree of a recovering parse.
fn syntax_problem(text: &str, err: &toml::de::Error) -> ConfigProblem {
    let (tree, _) = DeTable::parse_recoverable(text);
    let index = SpanIndex::new(text, tree.get_ref());
    let reason = one_line(err.message());
    let Some(span) = err.span() else {
        return ConfigProblem {
            line: None,
            key: String::new(),
            reason,
        };
    };
    let key = match index.innermost(span.start, true) {
        Some(entry) => entry.path.clone(),
        None => {
            let table = index
                .enclosing_header(span.start)
                .map(|e| e.path.as_str())
                .unwrap_or("");
            // The second of two equal keys is not in the tree; its span is.
            match text.get(span.clone()) {
                Some(dup) if reason == "duplicate key" => join_key(table, dup),
                _ => table.to_string(),
            }
        }
    };
    ConfigProblem {
        line: Some(index.line_at(span.start)),
        key,
        reason,
    }
}

/// Where each key of the document is, by dotted path.
struct SpanIndex {
    entries: Vec<Located>,
    /// Byte offset of the start of each line.
    line_starts: Vec<usize>,
}

/// One key (or array element) of the document.
struct Located {
    /// `group[0].discovery[1].url`.
    path: String,
    /// Where the key is written (for an array element: the element).
    key_start: usize,
    /// From the key to the end of the value (a table's value is its header).
    whole: Range<usize>,
    /// The value's span, which is what serde errors point at.
    value: Range<usize>,
    /// Start of the `[header]` when this is a table opened by one.
    header: Option<usize>,
}

impl SpanIndex {
    fn new(text: &str, root: &DeTable<'_>) -> Self {
        let mut index = SpanIndex {
            entries: Vec::new(),
            line_starts: std::iter::once(0)
                .chain(text.match_indices('\n').map(|(i, _)| i + 1))
                .collect(),
        };
        index.walk_table(text, root, "");
        index
    }

    fn walk_table(&mut self, text: &str, table: &DeTable<'_>, prefix: &str) {
        for (key, value) in table.iter() {
            let path = join_key(prefix, key.get_ref());
            let (k, v) = (key.span(), value.span());
            self.push(
                text,
                path.clone(),
                k.start,
                k.start.min(v.start)..k.end.max(v.end),
                value,
            );
            self.walk_value(text, value, &path);
        }
    }

    fn walk_value(&mut self, text: &str, value: &Spanned<DeValue<'_>>, path: &str) {
        match value.get_ref() {
            DeValue::Table(table) => self.walk_table(text, table, path),
            DeValue::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let path = format!("{path}[{i}]");
                    let span = item.span();
                    self.push(text, path.clone(), span.start, span, item);
                    self.walk_value(text, item, &path);
                }
            }
            _ => {}
        }
    }

    fn push(
        &mut self,
        text: &str,
        path: String,
        key_start: usize,
        whole: Range<usize>,
        value: &Spanned<DeValue<'_>>,
    ) {
        let span = value.span();
        let opened_by_header = value.get_ref().is_table()
            && text.get(span.start..).is_some_and(|t| t.starts_with('['));
        self.entries.push(Located {
            path,
            key_start,
            whole,
            header: opened_by_header.then_some(span.start),
            value: span,
        });
    }

    /// 1-based line of a byte offset.
    fn line_at(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|&start| start <= offset)
    }

    /// The line of `key`, or of its nearest enclosing key present in the
    /// document (a defaulted key is reported at its table's header).
    fn line_of_key(&self, key: &str) -> Option<usize> {
        let mut key = key;
        loop {
            if let Some(entry) = self.entries.iter().find(|e| e.path == key) {
                return Some(self.line_at(entry.key_start));
            }
            if key.is_empty() {
                return None;
            }
            key = parent_key(key);
        }
    }

    /// The smallest entry containing `offset`, the deepest on a tie.
    fn innermost(&self, offset: usize, inclusive_end: bool) -> Option<&Located> {
        self.entries
            .iter()
            .filter(|e| {
                let r = &e.whole;
                r.start <= offset
                    && (offset < r.end || ((inclusive_end || r.is_empty()) && offset == r.end))
            })
            .min_by_key(|e| (e.whole.len(), std::cmp::Reverse(e.path.len())))
    }

    /// The table whose `[header]` is the last one before `offset`.
    fn enclosing_header(&self, offset: usize) -> Option<&Located> {
        self.entries
            .iter()
            .filter(|e| e.header.is_some_and(|h| h <= offset))
            .max_by_key(|e| (e.header, e.path.len()))
    }

    fn serde_problem(&self, root: &DeTable<'_>, err: &toml::de::Error) -> ConfigProblem {
        let refined = refine_discovery_error(root, err);
        let err = refined.as_ref().unwrap_or(err);
        let message = one_line(err.message());
        let Some(span) = err.span() else {
            return ConfigProblem {
                line: None,
                key: String::new(),
                reason: message,
            };
        };
        let line = Some(self.line_at(span.start));
        if let Some(field) = missing_field(&message) {
            // serde points at the table that lacks the key; the root table
            // has an empty span that no entry shares.
            let table = self
                .entries
                .iter()
                .filter(|e| e.value == span)
                .max_by_key(|e| e.path.len())
                .map(|e| e.path.as_str())
                .unwrap_or("");
            return ConfigProblem {
                line,
                key: join_key(table, field),
                reason: "required key is missing".to_string(),
            };
        }
        let key = self
            .innermost(span.start, false)
            .map(|e| e.path.clone())
            .unwrap_or_default();
        ConfigProblem {
            line,
            key,
            reason: message,
        }
    }
}

/// serde's internally tagged enums (`type = "exec"`) buffer their content, so
/// an error inside a `[[group.discovery]]` entry comes back pointing at the
/// entry's header. Deserializing that entry again as its variant's struct,
/// straight from the spanned tree, finds the same error with its real span.
fn refine_discovery_error(root: &DeTable<'_>, err: &toml::de::Error) -> Option<toml::de::Error> {
    let span = err.span()?;
    let groups = root.get("group")?.get_ref().as_array()?;
    let entry = groups
        .iter()
        .filter_map(|g| {
            g.get_ref()
                .as_table()?
                .get("discovery")?
                .get_ref()
                .as_array()
        })
        .flat_map(|entries| entries.iter())
        .find(|d| d.span() == span)?;
    let table = entry.get_ref().as_table()?;
    let kind = table.get("type")?.get_ref().as_str()?;
    let mut body = table.clone();
    body.remove("type");
    let de = toml::de::ValueDeserializer::from(Spanned::new(span, DeValue::Table(body)));
    match kind {
        "kubernetes" => KubernetesConfig::deserialize(de).err(),
        "exec" => ExecConfig::deserialize(de).err(),
        "webhook" => WebhookConfig::deserialize(de).err(),
        "file" => FileConfig::deserialize(de).err(),
        _ => None,
    }
}

/// The field named by serde's "missing field `x`" message.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.strip_suffix('`')
}

fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn join_key(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// `group[0].tls.ca_file` -> `group[0].tls` -> `group[0]` -> `group` -> ``.
fn parent_key(key: &str) -> &str {
    key.rfind(['.', '[']).map_or("", |i| &key[..i])
}

// ---------------------------------------------------------------------------
// Validation: what the types cannot express.

/// Collects `(key path, reason)` pairs.
#[derive(Default)]
struct Problems(Vec<(String, String)>);

impl Problems {
    fn add(&mut self, key: impl Into<String>, reason: impl Into<String>) {
        self.0.push((key.into(), reason.into()));
    }

    fn check(&mut self, key: impl Into<String>, problem: Option<String>) {
        if let Some(reason) = problem {
            self.add(key, reason);
        }
    }

    fn file(&mut self, key: impl Into<String>, path: &Path) {
        self.check(key, file_problem(path));
    }

    fn positive(&mut self, key: impl Into<String>, d: Duration) {
        if d.is_zero() {
            self.add(key, "must be greater than 0");
        }
    }
}

/// An address reduced to what identifies a daemon: IP literals in canonical
/// form, host names case-insensitively.
type AddrKey = (String, u16);

fn addr_key(a: &Addr) -> AddrKey {
    let host = match a.host.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => a.host.trim_end_matches('.').to_ascii_lowercase(),
    };
    (host, a.port)
}

impl Config {
    /// Check everything a user can get wrong that the types cannot express,
    /// and return every problem as `(key path, reason)`, e.g.
    /// `("group[0].quorum", "must be between 1 and 3 (the number of daemons)")`.
    ///
    /// This looks at the file system: each `*_file` must be readable now,
    /// and a discovery `file` must have an existing directory.
    pub fn validate(&self) -> Vec<(String, String)> {
        let mut v = Problems::default();
        self.daemon.validate(&mut v);
        let daemons = self.daemon.peers.len() + 1;
        let mut names: HashMap<&str, usize> = HashMap::new();
        let mut masters: HashMap<AddrKey, usize> = HashMap::new();
        let mut files: HashMap<&Path, String> = HashMap::new();
        for (i, group) in self.groups.iter().enumerate() {
            let key = format!("group[{i}]");
            group.validate(&key, daemons, &mut v);
            if !group.name.is_empty() {
                match names.get(group.name.as_str()) {
                    Some(first) => v.add(
                        format!("{key}.name"),
                        format!(
                            "duplicate group name {:?} (also group[{first}])",
                            group.name
                        ),
                    ),
                    None => {
                        names.insert(&group.name, i);
                    }
                }
            }
            // Two groups sharing a master would fail it over twice.
            if group.master.port != 0 {
                let master = &group.master;
                match masters.get(&addr_key(master)) {
                    Some(&first) => v.add(
                        format!("{key}.master"),
                        format!(
                            "{} is already the master of group[{first}] ({:?})",
                            group.master, self.groups[first].name
                        ),
                    ),
                    None => {
                        masters.insert(addr_key(master), i);
                    }
                }
            }
            for (j, d) in group.discovery.iter().enumerate() {
                let DiscoveryConfig::File(f) = d else {
                    continue;
                };
                if f.path.as_os_str().is_empty() {
                    continue;
                }
                let this = format!("{key}.discovery[{j}].path");
                match files.get(f.path.as_path()) {
                    Some(first) => v.add(
                        this,
                        format!("{} is also written by {first}", f.path.display()),
                    ),
                    None => {
                        files.insert(&f.path, this);
                    }
                }
            }
        }
        v.0
    }

    /// A short human summary for `picket check-config`: the daemon, its
    /// peers, then one line per group.
    pub fn summary(&self) -> String {
        let d = &self.daemon;
        let mut lines = vec![format!(
            "daemon {}: listen {}, announce {}, http {}, data_dir {}",
            d.id.as_deref()
                .unwrap_or("(id generated on first start, kept in data_dir)"),
            d.listen,
            d.announce_addr(),
            d.http_listen,
            d.data_dir.display()
        )];
        lines.push(if d.peers.is_empty() {
            "peers: none (a single daemon)".to_string()
        } else {
            format!(
                "peers ({}): {}",
                d.peers.len(),
                d.peers
                    .iter()
                    .map(Addr::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        });
        lines.push(d.security_summary());
        if self.groups.is_empty() {
            lines.push("groups: none".to_string());
        }
        for g in &self.groups {
            let kinds: Vec<&str> = g
                .discovery
                .iter()
                .map(|d| match d {
                    DiscoveryConfig::Kubernetes(k) => match k.mode {
                        KubernetesMode::PodLabels => "kubernetes (pod-labels)",
                        KubernetesMode::Endpointslice => "kubernetes (endpointslice)",
                    },
                    DiscoveryConfig::Exec(_) => "exec",
                    DiscoveryConfig::Webhook(_) => "webhook",
                    DiscoveryConfig::File(_) => "file",
                    DiscoveryConfig::Memory(_) => "memory",
                })
                .collect();
            let members = match &g.members {
                Some(m) => {
                    let m = m.resolved(&g.discovery);
                    format!(
                        ", members: pods {:?} in {} (port {}{})",
                        m.pod_selector.unwrap_or_default(),
                        m.namespace.unwrap_or_default(),
                        match &m.port {
                            PortRef::Number(n) => n.to_string(),
                            PortRef::Name(n) => format!("{n:?}"),
                        },
                        if m.handover_on_delete {
                            ", handover on deletion"
                        } else {
                            ""
                        }
                    )
                }
                None => String::new(),
            };
            lines.push(format!(
                "group {}: master {}, quorum {} of {}, down_after {}, failover_timeout {}, \
                 flush_on_failover {}{}{members}, discovery: {}",
                g.name,
                g.master,
                g.quorum,
                d.peers.len() + 1,
                humantime::format_duration(g.down_after),
                humantime::format_duration(g.failover_timeout),
                if g.flush_on_failover { "yes" } else { "no" },
                match &g.isolation_fencing {
                    Some(f) => format!(
                        ", isolation fencing: min_replicas {} max_lag {}",
                        f.min_replicas,
                        humantime::format_duration(f.max_lag)
                    ),
                    None => String::new(),
                },
                if kinds.is_empty() {
                    "none".to_string()
                } else {
                    kinds.join(", ")
                }
            ));
        }
        lines.join("\n")
    }
}

impl DaemonConfig {
    /// One line for `check-config`: TLS and who may log in as what.
    fn security_summary(&self) -> String {
        let tls = match &self.tls {
            None => "listen in plaintext".to_string(),
            Some(t) => {
                let mut s = format!(
                    "TLS on listen (client certificates: {})",
                    match t.auth_clients {
                        AuthClients::Yes => "required",
                        AuthClients::Optional => "optional",
                        AuthClients::No => "not asked for",
                    }
                );
                s.push_str(if t.peers {
                    ", to the peers"
                } else {
                    ", peers in plaintext"
                });
                if let Some(p) = &t.plaintext_listen {
                    s.push_str(&format!(", plaintext on {p}"));
                }
                if t.http {
                    s.push_str(", HTTPS");
                }
                s
            }
        };
        let default = match (&self.password_file, self.default_role) {
            (_, Role::None) => "disabled".to_string(),
            (Some(_), r) => format!("password, role {}", r.name()),
            (None, r) => format!("no AUTH needed, role {}", r.name()),
        };
        format!(
            "security: {tls}; default user: {default}; users: {}{}",
            self.users.len(),
            self.peer_user
                .as_ref()
                .map_or(String::new(), |p| format!("; peers logged in as {p}"))
        )
    }

    fn validate(&self, v: &mut Problems) {
        if let Some(id) = &self.id {
            v.check("daemon.id", id_problem(id));
        }
        // Port 0 (any free port) is allowed on the listeners: tests use it.
        let listen = socket_addr(v, "daemon.listen", &self.listen, "0.0.0.0:26379");
        let http = socket_addr(v, "daemon.http_listen", &self.http_listen, "0.0.0.0:9479");
        if let (Some(l), Some(h)) = (listen, http)
            && same_port(l, h)
        {
            v.add(
                "daemon.http_listen",
                format!(
                    "{} overlaps daemon.listen ({}); use another port",
                    self.http_listen, self.listen
                ),
            );
        }
        let mut own: Vec<AddrKey> = Vec::new();
        if let Some(announce) = &self.announce {
            match announce.parse::<Addr>() {
                Ok(a) => {
                    if a.host.parse::<IpAddr>().is_ok_and(|ip| ip.is_unspecified()) {
                        v.add(
                            "daemon.announce",
                            format!("{announce} is not an address others can connect to"),
                        );
                    }
                    own.push(addr_key(&a));
                }
                Err(e) => v.add("daemon.announce", e.to_string()),
            }
        }
        if let Some(l) = listen.filter(|l| !l.ip().is_unspecified()) {
            own.push((l.ip().to_string(), l.port()));
        }
        let mut seen: HashMap<AddrKey, usize> = HashMap::new();
        for (i, peer) in self.peers.iter().enumerate() {
            let key = format!("daemon.peers[{i}]");
            match addr_problem(peer) {
                Some(e) => v.add(key, e),
                None => {
                    let id = addr_key(peer);
                    if own.contains(&id) {
                        v.add(
                            key,
                            format!(
                                "{peer} is this daemon's own address (daemon.listen or \
                                 daemon.announce); list only the other daemons"
                            ),
                        );
                    } else if let Some(first) = seen.get(&id) {
                        v.add(
                            key,
                            format!("{peer} is listed twice (also daemon.peers[{first}])"),
                        );
                    } else {
                        seen.insert(id, i);
                    }
                }
            }
        }
        if self.data_dir.as_os_str().is_empty() {
            v.add("daemon.data_dir", "must not be empty");
        } else if self.data_dir.exists() && !self.data_dir.is_dir() {
            v.add(
                "daemon.data_dir",
                format!("{} exists and is not a directory", self.data_dir.display()),
            );
        }
        if let Some(f) = &self.password_file {
            v.file("daemon.password_file", f);
        }
        if self.max_clients == 0 {
            v.add("daemon.max_clients", "must be at least 1");
        }
        if self.tcp_backlog == 0 || self.tcp_backlog > i32::MAX as u32 {
            v.add("daemon.tcp_backlog", "must be between 1 and 2147483647");
        }
        self.validate_users(v);
        if let Some(tls) = &self.tls {
            tls.validate(self, listen, http, v);
        }
    }

    fn validate_users(&self, v: &mut Problems) {
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, u) in self.users.iter().enumerate() {
            let key = format!("daemon.user[{i}]");
            if u.name == "default" {
                v.add(
                    format!("{key}.name"),
                    "\"default\" is the user of password_file and default_role; pick another name",
                );
            } else if let Some(p) = id_problem(&u.name) {
                v.add(
                    format!("{key}.name"),
                    p.replace("(omit it to generate one)", ""),
                );
            } else if let Some(first) = names.get(u.name.as_str()) {
                v.add(
                    format!("{key}.name"),
                    format!(
                        "user {:?} is defined twice (also daemon.user[{first}])",
                        u.name
                    ),
                );
            } else {
                names.insert(&u.name, i);
            }
            if u.role == Role::None {
                v.add(
                    format!("{key}.role"),
                    "must be client, operator, peer or all (remove the user to disable it)",
                );
            }
            v.file(format!("{key}.password_file"), &u.password_file);
        }
        if let Some(name) = &self.peer_user {
            match self.users.iter().find(|u| &u.name == name) {
                None => v.add(
                    "daemon.peer_user",
                    format!("{name:?} is not one of the [[daemon.user]] names"),
                ),
                Some(u) if !matches!(u.role, Role::Peer | Role::All) => v.add(
                    "daemon.peer_user",
                    format!(
                        "user {name:?} has role {}; the peers need role peer (or all)",
                        u.role.name()
                    ),
                ),
                Some(_) => {}
            }
        }
        if !self.users.is_empty() && self.password_file.is_none() && self.default_role == Role::All
        {
            v.add(
                "daemon.default_role",
                "with [[daemon.user]] and no password_file, anyone may run every command \
                 without AUTH; set default_role (e.g. \"client\" or \"none\") or password_file",
            );
        }
    }
}

impl ListenTlsConfig {
    fn validate(
        &self,
        d: &DaemonConfig,
        listen: Option<SocketAddr>,
        http: Option<SocketAddr>,
        v: &mut Problems,
    ) {
        let key = "daemon.tls";
        v.check(
            format!("{key}.cert_file"),
            pem_problem(&self.cert_file, Pem::Certificates),
        );
        v.check(
            format!("{key}.key_file"),
            pem_problem(&self.key_file, Pem::Key),
        );
        match &self.ca_file {
            Some(ca) => v.check(format!("{key}.ca_file"), pem_problem(ca, Pem::Certificates)),
            None => {
                if self.auth_clients != AuthClients::No {
                    v.add(
                        format!("{key}.ca_file"),
                        "is required to verify client certificates (or set auth_clients = \"no\")",
                    );
                } else if self.peers && !d.peers.is_empty() {
                    v.add(
                        format!("{key}.ca_file"),
                        "is required to verify the peers' certificates",
                    );
                }
            }
        }
        let mut taken: Vec<(&str, SocketAddr)> = Vec::new();
        taken.extend(listen.map(|a| ("daemon.listen", a)));
        taken.extend(http.map(|a| ("daemon.http_listen", a)));
        for (full, value) in [
            ("daemon.tls.plaintext_listen", &self.plaintext_listen),
            (
                "daemon.tls.plaintext_http_listen",
                &self.plaintext_http_listen,
            ),
        ] {
            let Some(s) = value else { continue };
            let Some(a) = socket_addr(v, full, s, "0.0.0.0:26380") else {
                continue;
            };
            match taken.iter().find(|(_, t)| same_port(*t, a)) {
                Some((other, _)) => v.add(full, format!("{s} overlaps {other}; use another port")),
                None => taken.push((full, a)),
            }
        }
        if self.plaintext_http_listen.is_some() && !self.http {
            v.add(
                format!("{key}.plaintext_http_listen"),
                "only applies with http = true (http_listen is plaintext already)",
            );
        }
    }
}

/// Whether two listeners would fight over one port.
fn same_port(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// What a PEM file must hold.
#[derive(Clone, Copy)]
enum Pem {
    Certificates,
    Key,
}

/// Why `path` is not a readable PEM file with at least one certificate (or
/// a private key), if it is not. Checked here so that `picket
/// check-config` finds a wrong file before any port is bound.
fn pem_problem(path: &Path, want: Pem) -> Option<String> {
    use rustls_pki_types::pem::PemObject;
    if let Some(p) = file_problem(path) {
        return Some(p);
    }
    let shown = path.display();
    match want {
        Pem::Certificates => {
            let certs: Result<Vec<_>, _> =
                match rustls_pki_types::CertificateDer::pem_file_iter(path) {
                    Ok(it) => it.collect(),
                    Err(e) => return Some(format!("{shown}: {e}")),
                };
            match certs {
                Err(e) => Some(format!("{shown}: {e}")),
                Ok(c) if c.is_empty() => Some(format!("{shown} holds no PEM certificate")),
                Ok(_) => None,
            }
        }
        Pem::Key => rustls_pki_types::PrivateKeyDer::from_pem_file(path)
            .err()
            .map(|e| format!("{shown} holds no usable PEM private key: {e}")),
    }
}

fn socket_addr(v: &mut Problems, key: &str, s: &str, example: &str) -> Option<SocketAddr> {
    match s.parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            v.add(
                key,
                format!("{s:?} is not an IP address and port such as {example}"),
            );
            None
        }
    }
}

impl GroupConfig {
    fn validate(&self, key: &str, daemons: usize, v: &mut Problems) {
        v.check(format!("{key}.name"), group_name_problem(&self.name));
        v.check(format!("{key}.master"), addr_problem(&self.master));
        if self.quorum == 0 || self.quorum as usize > daemons {
            v.add(
                format!("{key}.quorum"),
                format!("must be between 1 and {daemons} (the number of daemons)"),
            );
        }
        v.positive(format!("{key}.down_after"), self.down_after);
        if let Some(refused) = self.down_after_refused {
            v.positive(format!("{key}.down_after_refused"), refused);
        }
        if self.down_after_refused.is_some_and(|r| r > self.down_after) {
            v.add(
                format!("{key}.down_after_refused"),
                format!(
                    "must be at most down_after ({})",
                    humantime::format_duration(self.down_after)
                ),
            );
        }
        if self.failover_timeout <= self.down_after {
            v.add(
                format!("{key}.failover_timeout"),
                format!(
                    "must be longer than down_after ({})",
                    humantime::format_duration(self.down_after)
                ),
            );
        }
        if self.parallel_syncs == 0 {
            v.add(format!("{key}.parallel_syncs"), "must be at least 1");
        }
        if let Some(user) = &self.username {
            if user.is_empty() {
                v.add(
                    format!("{key}.username"),
                    "must not be empty (omit it for the default user)",
                );
            } else if self.password_file.is_none() {
                v.add(
                    format!("{key}.password_file"),
                    "is required when username is set",
                );
            }
        }
        if let Some(f) = &self.password_file {
            v.file(format!("{key}.password_file"), f);
        }
        if let Some(tls) = &self.tls {
            tls.validate(&format!("{key}.tls"), v);
        }
        if self.admin_port == Some(0) {
            v.add(format!("{key}.admin_port"), "must not be 0");
        }
        if let Some(f) = &self.isolation_fencing {
            f.validate(&format!("{key}.isolation_fencing"), v);
        }
        for (j, d) in self.discovery.iter().enumerate() {
            d.validate(&format!("{key}.discovery[{j}]"), v);
        }
        if let Some(m) = &self.members {
            m.validate(&format!("{key}.members"), &self.discovery, v);
        }
        v.positive(format!("{key}.forget_after"), self.forget_after);
    }
}

impl IsolationFencingConfig {
    fn validate(&self, key: &str, v: &mut Problems) {
        if self.min_replicas == 0 {
            v.add(
                format!("{key}.min_replicas"),
                "must be at least 1 (omit [group.isolation_fencing] to leave the master unfenced)",
            );
        }
        if self.max_lag.is_zero() || self.max_lag.subsec_nanos() != 0 {
            v.add(
                format!("{key}.max_lag"),
                format!(
                    "must be a whole number of seconds, at least 1s (Redis counts min-replicas-max-lag in seconds), not {}",
                    humantime::format_duration(self.max_lag)
                ),
            );
        } else if self.max_lag > Duration::from_secs(3600) {
            v.add(format!("{key}.max_lag"), "must be at most 1h");
        }
    }
}

impl TlsConfig {
    fn validate(&self, key: &str, v: &mut Problems) {
        for (name, file) in [
            ("ca_file", &self.ca_file),
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        ] {
            if let Some(f) = file {
                v.file(format!("{key}.{name}"), f);
            }
        }
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => v.add(
                format!("{key}.key_file"),
                "is required when cert_file is set",
            ),
            (None, Some(_)) => v.add(
                format!("{key}.cert_file"),
                "is required when key_file is set",
            ),
            _ => {}
        }
        if self.server_name.as_deref() == Some("") {
            v.add(
                format!("{key}.server_name"),
                "must not be empty (omit it to verify the host name)",
            );
        }
    }
}

impl DiscoveryConfig {
    fn validate(&self, key: &str, v: &mut Problems) {
        match self {
            DiscoveryConfig::Kubernetes(k) => k.validate(key, v),
            DiscoveryConfig::Exec(e) => {
                match e.command.first() {
                    None => v.add(
                        format!("{key}.command"),
                        "must name the program to run, e.g. [\"/usr/local/bin/reconfigure\"]",
                    ),
                    Some(program) if program.is_empty() => v.add(
                        format!("{key}.command[0]"),
                        "must not be empty (it is the program to run)",
                    ),
                    Some(_) => {}
                }
                v.positive(format!("{key}.timeout"), e.timeout);
            }
            DiscoveryConfig::Webhook(w) => {
                let rest = w
                    .url
                    .strip_prefix("https://")
                    .or_else(|| w.url.strip_prefix("http://"));
                match rest {
                    None => v.add(
                        format!("{key}.url"),
                        format!("{:?} must start with http:// or https://", w.url),
                    ),
                    Some(r) if r.is_empty() || r.starts_with('/') => {
                        v.add(format!("{key}.url"), format!("{:?} has no host", w.url))
                    }
                    Some(_) => {}
                }
                for (name, file) in [
                    ("token_file", &w.token_file),
                    ("hmac_key_file", &w.hmac_key_file),
                    ("ca_file", &w.ca_file),
                ] {
                    if let Some(f) = file {
                        v.file(format!("{key}.{name}"), f);
                    }
                }
                v.positive(format!("{key}.timeout"), w.timeout);
            }
            DiscoveryConfig::Memory(_) => {}
            DiscoveryConfig::File(f) => {
                let key = format!("{key}.path");
                if f.path.as_os_str().is_empty() {
                    v.add(key, "must not be empty");
                } else if f.path.is_dir() {
                    v.add(
                        key,
                        format!(
                            "{} is a directory; name the JSON file to write",
                            f.path.display()
                        ),
                    );
                } else {
                    let dir = f
                        .path
                        .parent()
                        .filter(|p| !p.as_os_str().is_empty())
                        .unwrap_or(Path::new("."));
                    if !dir.is_dir() {
                        v.add(key, format!("directory {} does not exist", dir.display()));
                    }
                }
            }
        }
    }
}

/// Why pod-labels mode needs `service` (the config check and the backend
/// say the same).
pub const NO_SERVICE_GATE: &str = "is required when mode is \"pod-labels\": name the Service \
     that selects the master by its role label, so that a fence is confirmed only once that \
     Service no longer routes to the old master (without it the new master can be promoted \
     while the Service still sends writes to the old one); to run without that check, set \
     skip_service_gate = true";

impl KubernetesConfig {
    fn validate(&self, key: &str, v: &mut Problems) {
        validate_kube_credentials(key, &self.kubeconfig, &self.context, v);
        v.check(
            format!("{key}.namespace"),
            dns_label_problem(&self.namespace, false),
        );
        match self.mode {
            KubernetesMode::PodLabels => {
                match self.pod_selector.as_deref() {
                    None => v.add(
                        format!("{key}.pod_selector"),
                        "is required when mode is \"pod-labels\"",
                    ),
                    Some(s) if s.trim().is_empty() => {
                        v.add(format!("{key}.pod_selector"), "must not be empty")
                    }
                    Some(_) => {}
                }
                match (self.service.as_deref(), self.skip_service_gate) {
                    (Some(s), false) => {
                        v.check(format!("{key}.service"), dns_label_problem(s, true))
                    }
                    (Some(_), true) => v.add(
                        format!("{key}.skip_service_gate"),
                        "contradicts `service`: keep one of them",
                    ),
                    (None, true) => {}
                    (None, false) => v.add(format!("{key}.service"), NO_SERVICE_GATE),
                }
            }
            KubernetesMode::Endpointslice => {
                if self.skip_service_gate {
                    v.add(
                        format!("{key}.skip_service_gate"),
                        "only applies when mode is \"pod-labels\"",
                    );
                }
                match self.service.as_deref() {
                    None => v.add(
                        format!("{key}.service"),
                        "is required when mode is \"endpointslice\"",
                    ),
                    Some(s) => v.check(format!("{key}.service"), dns_label_problem(s, true)),
                }
                v.check(
                    format!("{key}.port_name"),
                    dns_label_problem(&self.port_name, false),
                );
            }
        }
        v.check(
            format!("{key}.role_label"),
            label_key_problem(&self.role_label),
        );
        v.check(
            format!("{key}.master_value"),
            label_value_problem(&self.master_value),
        );
        v.check(
            format!("{key}.replica_value"),
            label_value_problem(&self.replica_value),
        );
        if self.master_value == self.replica_value {
            v.add(
                format!("{key}.replica_value"),
                "must differ from master_value",
            );
        }
        v.positive(format!("{key}.timeout"), self.timeout);
        v.positive(
            format!("{key}.service_gate_timeout"),
            self.service_gate_timeout,
        );
    }
}

/// Why `path` cannot be read now, if it cannot.
fn file_problem(path: &Path) -> Option<String> {
    if path.as_os_str().is_empty() {
        return Some("must not be empty".to_string());
    }
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some(format!("{} does not exist", path.display()))
        }
        Err(e) => Some(format!("cannot access {}: {e}", path.display())),
        Ok(m) if m.is_dir() => Some(format!("{} is a directory, not a file", path.display())),
        Ok(_) => std::fs::File::open(path)
            .err()
            .map(|e| format!("cannot read {}: {e}", path.display())),
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// `daemon.id`: it appears in logs, metrics and the peer protocol.
fn id_problem(id: &str) -> Option<String> {
    if id.is_empty() {
        return Some("must not be empty (omit it to generate one)".to_string());
    }
    // The character check comes first so that the length below is in
    // ASCII characters.
    if let Some(c) = id.chars().find(|c| !is_name_char(*c)) {
        return Some(format!(
            "{id:?} contains {c:?}; only letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    (id.len() > 64).then(|| format!("is {} characters long; at most 64 are allowed", id.len()))
}

/// A group name is a pub/sub channel suffix and a Kubernetes label value,
/// so it must satisfy the stricter of the two: a label value.
fn group_name_problem(name: &str) -> Option<String> {
    label_value_problem(name).map(|r| format!("group name {r}"))
}

/// A Kubernetes label value (or the name part of a label key): at most 63
/// characters of `[A-Za-z0-9._-]`, starting and ending alphanumeric. Empty
/// is legal in Kubernetes but useless here.
fn label_value_problem(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("must not be empty".to_string());
    }
    if let Some(c) = s.chars().find(|c| !is_name_char(*c)) {
        return Some(format!(
            "{s:?} contains {c:?}; only letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    if s.len() > 63 {
        return Some(format!(
            "{s:?} is {} characters long; at most 63 are allowed (a Kubernetes label value)",
            s.len()
        ));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(s.chars().next()) || !alnum(s.chars().last()) {
        return Some(format!("{s:?} must start and end with a letter or digit"));
    }
    None
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name.
fn label_key_problem(s: &str) -> Option<String> {
    match s.rsplit_once('/') {
        None => label_value_problem(s),
        Some((prefix, name)) => {
            let bad_prefix = prefix.is_empty()
                || prefix.len() > 253
                || prefix
                    .split('.')
                    .any(|l| dns_label_problem(l, false).is_some());
            if bad_prefix {
                Some(format!(
                    "{s:?} has an invalid prefix; it must be a DNS subdomain such as example.com"
                ))
            } else {
                label_value_problem(name)
            }
        }
    }
}

/// An RFC 1123 DNS label (namespaces, port names), or with `rfc1035` one that
/// must also start with a letter (Service names).
fn dns_label_problem(s: &str, rfc1035: bool) -> Option<String> {
    if s.is_empty() {
        return Some("must not be empty".to_string());
    }
    let valid = s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-')
        && (!rfc1035 || s.starts_with(|c: char| c.is_ascii_lowercase()));
    (!valid).then(|| {
        format!(
            "{s:?} is not a valid DNS label: at most 63 lowercase letters, digits and '-', \
             starting with a {} and ending with a letter or digit",
            if rfc1035 { "letter" } else { "letter or digit" }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_key_climbs_tables_and_arrays() {
        assert_eq!(parent_key("group[0].tls.ca_file"), "group[0].tls");
        assert_eq!(parent_key("group[0].tls"), "group[0]");
        assert_eq!(parent_key("group[0]"), "group");
        assert_eq!(parent_key("daemon.peers[1]"), "daemon.peers");
        assert_eq!(parent_key("daemon"), "");
    }

    #[test]
    fn absent_keys_fall_back_to_their_table_header() {
        let text = "# c\n[daemon]\nlisten = \"x\"\n\n[[group]]\nname = \"a\"\n\n[[group]]\nname = \"b\"\ntls = { ca_file = \"f\" }\n";
        let tree = DeTable::parse(text).unwrap();
        let index = SpanIndex::new(text, tree.get_ref());
        assert_eq!(index.line_of_key("daemon.listen"), Some(3));
        assert_eq!(index.line_of_key("daemon.peers[0]"), Some(2));
        assert_eq!(index.line_of_key("group[0].quorum"), Some(5));
        assert_eq!(index.line_of_key("group[1].quorum"), Some(8));
        assert_eq!(index.line_of_key("group[1].tls.cert_file"), Some(10));
        assert_eq!(index.line_of_key("nothing"), None);
    }

    #[test]
    fn kubernetes_names() {
        assert_eq!(dns_label_problem("cache-1", false), None);
        assert!(dns_label_problem("Cache", false).is_some());
        assert!(dns_label_problem("-cache", false).is_some());
        assert!(dns_label_problem(&"a".repeat(64), false).is_some());
        assert_eq!(dns_label_problem("1cache", false), None);
        assert!(dns_label_problem("1cache", true).is_some());
        assert_eq!(label_key_problem("role"), None);
        assert_eq!(label_key_problem("picket.example.com/role"), None);
        assert!(label_key_problem("/role").is_some());
        assert!(label_key_problem("Example.com/role").is_some());
        assert!(label_key_problem("example.com/").is_some());
        assert_eq!(label_value_problem("Cache_1.a"), None);
        assert!(label_value_problem("cache.").is_some());
        assert_eq!(label_value_problem(&"a".repeat(63)), None);
        assert!(label_value_problem(&"a".repeat(64)).is_some());
    }

    #[test]
    fn daemon_ids() {
        assert_eq!(id_problem("picket-a_1.x"), None);
        assert_eq!(id_problem(&"a".repeat(64)), None);
        assert!(id_problem(&"a".repeat(65)).is_some());
        assert!(id_problem("a/b").is_some());
        assert!(id_problem("").is_some());
    }

    #[test]
    fn messages_are_kept_on_one_line() {
        assert_eq!(one_line("a\n  b\tc"), "a b c");
        assert_eq!(missing_field("missing field `master`"), Some("master"));
        assert_eq!(missing_field("invalid type"), None);
    }
}

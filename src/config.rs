//! The TOML configuration: schema, loading and validation.
//!
//! The names here are picket's public contract (see DESIGN.md, "The
//! user-facing contract"); keep them stable. Every struct denies unknown
//! fields so that a typo is an error instead of a silently ignored key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    #[serde(default)]
    pub peers: Vec<String>,
    /// Maximum number of simultaneous client connections on `listen`.
    #[serde(default = "default_max_clients")]
    pub max_clients: usize,
}

/// `[[group]]`: one master and its replicas.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// Name of the group (Sentinel's "master name").
    pub name: String,
    /// The initial master (`host:port`); replicas are discovered from its INFO.
    pub master: String,
    /// Daemons (self included) that must see the master down before a failover.
    pub quorum: u32,
    /// How long without a valid reply before this daemon sees an instance down.
    #[serde(with = "humantime_serde", default = "default_down_after")]
    pub down_after: Duration,
    /// Deadline of a failover attempt; also the pause between two attempts.
    #[serde(with = "humantime_serde", default = "default_failover_timeout")]
    pub failover_timeout: Duration,
    /// How many replicas are re-pointed at the new master at the same time.
    #[serde(default = "default_parallel_syncs")]
    pub parallel_syncs: u32,
    /// FLUSHALL a promoted replica before it is advertised as master.
    #[serde(default)]
    pub flush_on_failover: bool,
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
    /// Service-discovery backends (`[[group.discovery]]`).
    #[serde(default)]
    pub discovery: Vec<DiscoveryConfig>,
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
fn default_down_after() -> Duration {
    Duration::from_secs(5)
}
fn default_failover_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_parallel_syncs() -> u32 {
    1
}
fn default_role_label() -> String {
    "role".to_string()
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

/// Read a secret from a file, dropping one trailing newline.
pub fn read_secret(path: &Path) -> std::io::Result<String> {
    let mut s = std::fs::read_to_string(path)?;
    while s.ends_with('\n') || s.ends_with('\r') {
        s.pop();
    }
    Ok(s)
}

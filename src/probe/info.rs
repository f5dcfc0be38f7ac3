//! Parsing of `INFO` (server, replication, persistence sections) and `ROLE`
//! replies for Redis, Valkey and Dragonfly.
//!
//! The three flavours differ (see `shared/reference/dragonfly.md` §4):
//! Dragonfly has no `run_id`, no `master_repl_offset`, replica offsets are
//! sums of per-shard LSNs, and its `ROLE` reply has another shape. An offset
//! that cannot be read is `None` (unknown), never 0.

use serde::Serialize;

/// Which server implementation answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Flavour {
    /// Redis (no `valkey_version`, no `dragonfly_version`).
    #[default]
    Redis,
    /// Valkey (`valkey_version` or `server_name:valkey`).
    Valkey,
    /// Dragonfly (`dragonfly_version`).
    Dragonfly,
}

/// The role an instance reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// `role:master`.
    Master,
    /// `role:slave` (or Dragonfly's older `role:replica`).
    Replica,
    /// Missing or unrecognised.
    #[default]
    Unknown,
}

/// One `slaveN:` line of a master's `INFO replication`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplicaEntry {
    /// `ip=`.
    pub ip: String,
    /// `port=`.
    pub port: u16,
    /// `state=` (online, wait_bgsave, stable_sync, ...).
    pub state: String,
    /// `offset=` (absent on Dragonfly).
    pub offset: Option<i64>,
    /// `lag=` (seconds on Redis/Valkey, LSN lag on Dragonfly).
    pub lag: Option<i64>,
}

/// What picket reads from one `INFO` reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct InfoSnapshot {
    /// Detected flavour.
    pub flavour: Flavour,
    /// `redis_version`, `valkey_version` or `dragonfly_version` as reported.
    pub version: Option<String>,
    /// `run_id` (Redis/Valkey only).
    pub run_id: Option<String>,
    /// `role:`.
    pub role: Role,
    /// Replica: `master_host`.
    pub master_host: Option<String>,
    /// Replica: `master_port`.
    pub master_port: Option<u16>,
    /// Replica: `master_link_status:up`.
    pub master_link_up: bool,
    /// Replica: `master_link_down_since_seconds` (absent on Dragonfly).
    pub master_link_down_since_secs: Option<u64>,
    /// Replica: `master_last_io_seconds_ago`.
    pub master_last_io_secs: Option<i64>,
    /// Replica: `master_sync_in_progress:1`.
    pub sync_in_progress: bool,
    /// Replica: `slave_repl_offset` (unknown when absent).
    pub replica_offset: Option<i64>,
    /// Replica: `slave_priority` / `replica_priority` (None when absent).
    pub priority: Option<u32>,
    /// Replica: `replica_announced` (true when absent).
    pub replica_announced: bool,
    /// Master: `master_repl_offset` (absent on Dragonfly).
    pub master_offset: Option<i64>,
    /// Master: the replicas it lists.
    pub replicas: Vec<ReplicaEntry>,
    /// `master_replid`.
    pub replid: Option<String>,
    /// `loading:1` (INFO persistence).
    pub loading: bool,
}

/// Parse the text of `INFO` (any subset of sections; unknown lines are ignored).
pub fn parse_info(text: &str) -> InfoSnapshot {
    let _ = text;
    InfoSnapshot::default()
}

//! The published view of a group: what `/v1/status`, `picket status` and
//! the Sentinel-compatible API read. Built by the group task; readers never
//! touch the task's state.

use serde::Serialize;

use crate::addr::Addr;
use crate::discovery::runner::BackendStatus;
use crate::probe::{Flavour, Role};

/// One instance as this daemon sees it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct InstanceView {
    /// Address.
    pub addr: Addr,
    /// Whether it is the group's current master (per config, not per INFO).
    pub is_master: bool,
    /// Role it reports.
    pub role: Role,
    /// Server flavour (after the first INFO).
    pub flavour: Flavour,
    /// Version string.
    pub version: Option<String>,
    /// `run_id` (Redis/Valkey).
    pub run_id: Option<String>,
    /// Not SDOWN.
    pub up: bool,
    /// SDOWN for this daemon.
    pub sdown: bool,
    /// Milliseconds since SDOWN began.
    pub sdown_ms: Option<u64>,
    /// Probe connection established.
    pub connected: bool,
    /// Milliseconds since the last valid PING reply.
    pub last_ok_ping_ms: u64,
    /// Milliseconds since any reply.
    pub last_reply_ms: Option<u64>,
    /// Milliseconds since the last INFO.
    pub info_age_ms: Option<u64>,
    /// Milliseconds since the role it reports last changed.
    pub role_reported_ms: Option<u64>,
    /// Replication offset (replica: `slave_repl_offset`; master: `master_repl_offset`).
    pub offset: Option<i64>,
    /// `slave_priority`.
    pub priority: Option<u32>,
    /// Replica: its master's host.
    pub master_host: Option<String>,
    /// Replica: its master's port.
    pub master_port: Option<u16>,
    /// Replica: link to the master up.
    pub master_link_up: bool,
    /// Replica: seconds the link has been down.
    pub master_link_down_secs: Option<u64>,
    /// Loading its dataset.
    pub loading: bool,
    /// `replica_announced`.
    pub replica_announced: bool,
    /// Last probe error, if the last probe failed.
    pub last_error: Option<String>,
}

/// A peer daemon as this daemon sees it, for this group.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PeerView {
    /// Configured address.
    pub addr: String,
    /// Its id (from its hello).
    pub id: Option<String>,
    /// Answered within the last few seconds.
    pub reachable: bool,
    /// Milliseconds since its last hello.
    pub last_hello_ms: Option<u64>,
    /// It answered recently that it sees the master down.
    pub sees_master_down: bool,
    /// Its vote, as it reported it.
    pub voted_leader: Option<String>,
    /// The epoch of that vote.
    pub voted_epoch: u64,
    /// Its config epoch for this group (from its hello).
    pub config_epoch: Option<u64>,
}

/// A failover in progress.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailoverView {
    /// Its epoch.
    pub epoch: u64,
    /// `failover` or `switchover`.
    pub kind: String,
    /// Sentinel-style state name.
    pub state: String,
    /// The replica being promoted.
    pub candidate: Option<Addr>,
    /// Milliseconds since it began.
    pub started_ms: u64,
}

/// The last failover this daemon led or saw.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LastFailover {
    /// Epoch.
    pub epoch: u64,
    /// Old master.
    pub from: Addr,
    /// New master (None when aborted).
    pub to: Option<Addr>,
    /// `completed`, `aborted: ...`, `observed`.
    pub outcome: String,
    /// Seconds since the Unix epoch when it ended.
    pub at_unix: u64,
    /// Duration in milliseconds (leader only).
    pub duration_ms: Option<u64>,
}

/// Isolation fencing of the group (`[group.isolation_fencing]`), as this
/// daemon keeps it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct IsolationFenceView {
    /// The configured `min-replicas-to-write`.
    pub min_replicas: u32,
    /// The configured `min-replicas-max-lag`, in seconds.
    pub max_lag_secs: u64,
    /// The `min-replicas-to-write` this daemon wants on the master now:
    /// `min_replicas`, or less while it is lowered.
    pub target: u32,
    /// Below `min_replicas` because too few replicas are up.
    pub lowered: bool,
    /// The value this daemon last found or set on the master (`CONFIG GET`
    /// / `CONFIG SET`); None before the first check or after a failure.
    pub in_force: Option<u32>,
    /// The master that value was confirmed on.
    pub confirmed_on: Option<Addr>,
    /// Milliseconds since that confirmation.
    pub confirmed_ms: Option<u64>,
    /// Daemons (this one included) whose fresh view shows the master up,
    /// and how many replicas they see up: what the target is derived from.
    pub sights: Vec<SightView>,
    /// Why the target is what it is, or why the fence cannot be kept
    /// (Dragonfly, an error).
    pub reason: Option<String>,
}

/// One daemon's view of the master and its replicas.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SightView {
    /// The daemon's id.
    pub daemon: String,
    /// It sees the master up.
    pub master_up: bool,
    /// Replicas it sees up (answering its probes).
    pub replicas_up: u32,
    /// Of those, the ones whose link to the master is up.
    pub replicas_linked: u32,
}

/// The whole group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupView {
    /// Group name.
    pub name: String,
    /// Current master.
    pub master: Addr,
    /// Its config epoch.
    pub config_epoch: u64,
    /// Configured quorum.
    pub quorum: u32,
    /// Number of daemons (peers + self).
    pub daemons: usize,
    /// `down_after` in ms.
    pub down_after_ms: u64,
    /// `failover_timeout` in ms.
    pub failover_timeout_ms: u64,
    /// `parallel_syncs`.
    pub parallel_syncs: u32,
    /// `flush_on_failover`.
    pub flush_on_failover: bool,
    /// Isolation fencing; None when the group has none.
    pub isolation_fence: Option<IsolationFenceView>,
    /// `ok`, `sdown`, `odown`, `failover`, `tilt`.
    pub status: String,
    /// Why nothing happens when something might be expected (e.g. quorum).
    pub reason: Option<String>,
    /// The master is SDOWN for this daemon.
    pub master_sdown: bool,
    /// The master is ODOWN.
    pub master_odown: bool,
    /// Milliseconds since ODOWN began.
    pub odown_ms: Option<u64>,
    /// Daemons (self included) that currently see the master down.
    pub down_votes: usize,
    /// This daemon's vote.
    pub voted_leader: Option<String>,
    /// Its epoch.
    pub voted_epoch: u64,
    /// A failover in progress.
    pub failover: Option<FailoverView>,
    /// The last failover.
    pub last_failover: Option<LastFailover>,
    /// Master first, then replicas in address order.
    pub instances: Vec<InstanceView>,
    /// The other daemons.
    pub peers: Vec<PeerView>,
    /// Discovery backends.
    pub discovery: Vec<BackendStatus>,
    /// Every write the `memory` backends accepted, in order.
    pub recorded: Vec<crate::discovery::memory::Record>,
}

impl GroupView {
    /// The master's instance view.
    pub fn master_view(&self) -> Option<&InstanceView> {
        self.instances.iter().find(|i| i.is_master)
    }

    /// Replicas (every known instance except the master).
    pub fn replicas(&self) -> impl Iterator<Item = &InstanceView> {
        self.instances.iter().filter(|i| !i.is_master)
    }

    /// Number of reachable peers plus self.
    pub fn reachable_daemons(&self) -> usize {
        1 + self.peers.iter().filter(|p| p.reachable).count()
    }
}

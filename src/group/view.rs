//! The published view of a group: what `/v1/status`, `picket status` and
//! the Sentinel-compatible API read. Built by the group task; readers never
//! touch the task's state.

use std::sync::Arc;

use serde::{Serialize, Serializer};
use tokio::time::Instant;

use super::{Group, ms};
use crate::addr::Addr;
use crate::config::GroupConfig;
use crate::discovery::runner::BackendStatus;
use crate::failover::machine::Kind;
use crate::probe::info::InfoSnapshot;
use crate::probe::{Flavour, Role};
use crate::quorum::election::Stage;
use crate::quorum::peers::Promotion;
use crate::quorum::table::PEER_TTL;
use crate::quorum::table::PeerEntry;

/// One instance as this daemon sees it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct InstanceView {
    /// Address: its identity (the configured name, or what the master
    /// lists).
    pub addr: Addr,
    /// The IP its name resolved to when it was last reached.
    pub ip: Option<std::net::IpAddr>,
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
    /// Why it is SDOWN: `silence` (no valid reply for `down_after`),
    /// `refused` (its process gone: connections refused for
    /// `down_after_refused`) or `reboot` (a master restarted with less
    /// than its replicas hold).
    pub sdown_reason: Option<&'static str>,
    /// Milliseconds since this daemon last saw it restart (`+reboot`).
    pub rebooted_ms: Option<u64>,
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
    /// Its run id (from its hello or `SENTINEL MYID`).
    pub run_id: Option<String>,
    /// It was heard from since this daemon started.
    pub heard: bool,
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

impl PeerView {
    /// What the peer table says of `e`, before this group's votes.
    fn of(e: &PeerEntry, now: Instant) -> PeerView {
        PeerView {
            addr: e.addr.clone(),
            id: e.id.clone(),
            run_id: e.run_id.clone(),
            heard: e.last_seen.is_some(),
            reachable: e.reachable(now, PEER_TTL),
            last_hello_ms: e.last_seen.map(|t| ms(now.saturating_duration_since(t))),
            sees_master_down: false,
            voted_leader: None,
            voted_epoch: 0,
            config_epoch: None,
        }
    }
}

/// A failover in progress.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FailoverView {
    /// Its epoch.
    pub epoch: u64,
    /// `failover` or `switchover`.
    #[serde(serialize_with = "kind_name")]
    pub kind: Kind,
    /// Sentinel-style state name.
    pub state: String,
    /// The replica being promoted.
    pub candidate: Option<Addr>,
    /// Milliseconds since it began.
    pub started_ms: u64,
}

fn kind_name<S: Serializer>(k: &Kind, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match k {
        Kind::Unplanned => "failover",
        Kind::Switchover => "switchover",
    })
}

/// How the last failover ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailoverOutcome {
    /// Published and every replica re-pointed.
    Completed,
    /// Published; some replicas did not confirm in time.
    CompletedWithTimeout,
    /// Nothing was published, for this reason.
    Aborted(String),
    /// Led by a peer; this daemon adopted the outcome.
    Observed,
}

impl FailoverOutcome {
    /// The `result` label of `picket_failovers_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            FailoverOutcome::Completed => "completed",
            FailoverOutcome::CompletedWithTimeout => "completed_with_timeout",
            FailoverOutcome::Aborted(_) => "aborted",
            FailoverOutcome::Observed => "observed",
        }
    }
}

impl Serialize for FailoverOutcome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FailoverOutcome::Aborted(why) => s.collect_str(&format_args!("aborted: {why}")),
            other => s.serialize_str(other.metric_label()),
        }
    }
}

/// What the group is doing, as `/v1/status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupStatus {
    /// The task has not published a view yet.
    Starting,
    /// The master is up.
    Ok,
    /// This daemon sees the master down.
    Sdown,
    /// The quorum sees the master down.
    Odown,
    /// An election or failover runs.
    Failover,
    /// Stall protection is active.
    Tilt,
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
    /// `completed`, `completed_with_timeout`, `aborted: ...`, `observed`.
    pub outcome: FailoverOutcome,
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
    /// The config epoch this daemon's hellos announce: `config_epoch`,
    /// or the persisted one after a restart in the middle of a failover
    /// this daemon led, until its kept master has reported `role:master`
    /// since the start (or another config is adopted).
    pub announced_epoch: u64,
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
    /// Clients get host names as configured, not the IPs they resolve to.
    pub announce_hostnames: bool,
    /// Isolation fencing; None when the group has none.
    pub isolation_fence: Option<IsolationFenceView>,
    /// `starting`, `ok`, `sdown`, `odown`, `failover`, `tilt`.
    pub status: GroupStatus,
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
    /// The replica a leader is promoting in an epoch newer than the
    /// config, as this daemon knows (its own failover or a vote request),
    /// announced in its hellos.
    pub promoting: Option<Promotion>,
    /// The epoch of a leader this daemon voted for and stands back for,
    /// announced in its hellos.
    pub stand_back: Option<u64>,
    /// That leader's id.
    pub stand_back_leader: Option<String>,
    /// The last failover.
    pub last_failover: Option<LastFailover>,
    /// Master first, then replicas in address order.
    pub instances: Vec<InstanceView>,
    /// The other daemons.
    pub peers: Vec<PeerView>,
    /// Members from pods (`[group.members]`), if configured.
    pub members: Option<MembersView>,
    /// Discovery backends.
    pub discovery: Vec<BackendStatus>,
    /// Every write the `memory` backends accepted, in order.
    pub recorded: Vec<crate::discovery::memory::Record>,
}

/// The pod watch of `[group.members]`, as `/v1/status` shows it.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct MembersView {
    /// The first list has been read.
    pub synced: bool,
    /// Pods with an IP and the data port.
    pub pods: usize,
    /// Of those, Ready and not being deleted.
    pub ready: usize,
    /// The pod being deleted whose server is the master, if any (a
    /// handover is under way or done).
    pub master_pod_deleting: Option<String>,
    /// Why the last list or watch failed, until one works again.
    pub error: Option<String>,
}

impl Group {
    fn members_view(&self) -> MembersView {
        let Some(m) = self.members.as_ref() else {
            return MembersView::default();
        };
        let master = self.wire(&self.master);
        MembersView {
            synced: true,
            pods: m.pods.len(),
            ready: m
                .pods
                .iter()
                .filter(|p| p.ready && p.deleting.is_none())
                .count(),
            master_pod_deleting: m
                .pods
                .iter()
                .find(|p| p.deleting.is_some() && (p.addr == master || p.addr == self.master))
                .map(|p| p.pod.clone()),
            error: m.error.clone(),
        }
    }
}

impl GroupView {
    /// The view before the task's first publication.
    pub(super) fn placeholder(
        cfg: &GroupConfig,
        master: &Addr,
        (config_epoch, announced_epoch): (u64, u64),
        daemons: usize,
        peers: &[PeerEntry],
        now: Instant,
    ) -> GroupView {
        // The peers are there from the start: a client asking `CKQUORUM`
        // before the first publication must get the start-up grace too.
        GroupView {
            name: cfg.name.clone(),
            master: master.clone(),
            config_epoch,
            announced_epoch,
            quorum: cfg.quorum,
            daemons,
            down_after_ms: ms(cfg.down_after),
            failover_timeout_ms: ms(cfg.failover_timeout),
            parallel_syncs: cfg.parallel_syncs,
            flush_on_failover: cfg.flush_on_failover,
            announce_hostnames: cfg.announce_hostnames,
            isolation_fence: None,
            status: GroupStatus::Starting,
            reason: None,
            master_sdown: false,
            master_odown: false,
            odown_ms: None,
            down_votes: 0,
            voted_leader: None,
            voted_epoch: 0,
            failover: None,
            promoting: None,
            stand_back: None,
            stand_back_leader: None,
            last_failover: None,
            instances: Vec::new(),
            peers: peers.iter().map(|e| PeerView::of(e, now)).collect(),
            members: cfg.members.as_ref().map(|_| MembersView::default()),
            discovery: Vec::new(),
            recorded: Vec::new(),
        }
    }

    /// How clients are told of `addr`: as configured with
    /// `announce_hostnames`, otherwise the IP its name resolved to (when
    /// known), as Sentinel with `resolve-hostnames` does.
    pub fn announced(&self, addr: &Addr) -> Addr {
        let ip = self
            .instances
            .iter()
            .find(|i| i.addr == *addr)
            .and_then(|i| i.ip);
        addr.announced(ip, self.announce_hostnames)
    }

    /// The master's instance view.
    pub fn master_view(&self) -> Option<&InstanceView> {
        self.instances.iter().find(|i| i.is_master)
    }

    /// Replicas: every known instance except the master and any server
    /// that reports `role:master` itself (a returning old master or an
    /// empty lone pod, until it is made a replica: a client routing reads
    /// by `SENTINEL replicas` must not be sent there).
    pub fn replicas(&self) -> impl Iterator<Item = &InstanceView> {
        self.instances
            .iter()
            .filter(|i| !i.is_master && i.role != Role::Master)
    }

    /// Number of reachable peers plus self.
    pub fn reachable_daemons(&self) -> usize {
        1 + self.peers.iter().filter(|p| p.reachable).count()
    }
}

impl Group {
    /// Build the view from the task's state; the driver hands it out.
    pub(super) fn publish_view(&mut self) {
        let now = self.now;
        let no_info = InfoSnapshot::default();
        let since = |t: Option<Instant>| t.map(|t| ms(now.saturating_duration_since(t)));
        let mut instances: Vec<InstanceView> = self
            .instances
            .values()
            .map(|i| {
                // Borrowed: cloning the whole snapshot per instance ten
                // times a second showed up in profiles.
                let info = i.info.as_deref().unwrap_or(&no_info);
                InstanceView {
                    addr: i.addr.clone(),
                    ip: i.ip,
                    is_master: i.addr == self.master,
                    role: info.role,
                    flavour: info.flavour,
                    version: info.version.clone(),
                    run_id: info.run_id.clone(),
                    up: !i.sdown.is_down(),
                    sdown: i.sdown.is_down(),
                    sdown_ms: since(i.sdown.down_since()),
                    sdown_reason: i.sdown.reason().map(|r| r.as_str()),
                    rebooted_ms: since(i.rebooted_at),
                    connected: i.connected,
                    last_ok_ping_ms: ms(now.saturating_duration_since(i.sdown.last_valid())),
                    last_reply_ms: since(i.last_reply),
                    info_age_ms: since(i.info_at),
                    role_reported_ms: since(i.role_changed_at),
                    offset: if info.role == Role::Master {
                        info.master_offset
                    } else {
                        info.replica_offset
                    },
                    priority: info.priority,
                    master_host: info.master_host.clone(),
                    master_port: info.master_port,
                    master_link_up: info.master_link_up,
                    master_link_down_secs: info.master_link_down_since_secs,
                    loading: info.loading,
                    replica_announced: info.replica_announced,
                    last_error: i.last_error.clone(),
                }
            })
            .collect();
        instances.sort_by_key(|i| !i.is_master);
        let peers = self
            .peers
            .iter()
            .zip(self.election.peers())
            .enumerate()
            .map(|(idx, (e, p))| PeerView {
                sees_master_down: self.election.peer_sees_down(idx, now),
                voted_leader: p.leader.clone(),
                voted_epoch: p.leader_epoch,
                config_epoch: e.group(&self.cfg.name).map(|g| g.config_epoch),
                ..PeerView::of(e, now)
            })
            .collect();
        let rec = self.ctx.state.group(&self.cfg.name);
        let tilt = self.ctx.tilt.until().is_some_and(|u| now < u);
        let failover = match (&self.failover, self.election.stage()) {
            (Some(run), _) => Some(FailoverView {
                epoch: run.machine.epoch,
                kind: run.machine.kind,
                state: run.machine.phase().as_str().into(),
                candidate: Some(run.machine.candidate.clone()),
                started_ms: ms(now.saturating_duration_since(run.started)),
            }),
            (None, Stage::Electing(b)) => Some(FailoverView {
                epoch: b.epoch,
                kind: b.kind,
                state: "wait_start".into(),
                candidate: Some(b.candidate.clone()),
                started_ms: ms(now.saturating_duration_since(b.started)),
            }),
            _ => None,
        };
        let odown_since = self.election.odown_since();
        let stand_back = self.election.standing_back_for(now, self.config_epoch);
        let status = if tilt {
            GroupStatus::Tilt
        } else if failover.is_some() {
            GroupStatus::Failover
        } else if odown_since.is_some() {
            GroupStatus::Odown
        } else if self.master_sdown() {
            GroupStatus::Sdown
        } else {
            GroupStatus::Ok
        };
        let view = GroupView {
            name: self.cfg.name.clone(),
            master: self.master.clone(),
            config_epoch: self.config_epoch,
            announced_epoch: self.start_announced.unwrap_or(self.config_epoch),
            quorum: self.cfg.quorum,
            daemons: self.ctx.daemons(),
            down_after_ms: ms(self.cfg.down_after),
            failover_timeout_ms: ms(self.cfg.failover_timeout),
            parallel_syncs: self.cfg.parallel_syncs,
            flush_on_failover: self.cfg.flush_on_failover,
            announce_hostnames: self.cfg.announce_hostnames,
            isolation_fence: self.isolation_view(),
            status,
            reason: self.reason.clone(),
            master_sdown: self.master_sdown(),
            master_odown: odown_since.is_some(),
            odown_ms: since(odown_since),
            down_votes: self.election.down_votes(now, self.master_sdown()),
            voted_leader: rec.voted_for,
            voted_epoch: rec.vote_epoch,
            failover,
            promoting: self
                .election
                .announced_intention(now, self.config_epoch)
                .map(|(epoch, a)| Promotion {
                    epoch,
                    replica: a.clone(),
                }),
            stand_back: stand_back.map(|(e, _)| e),
            stand_back_leader: stand_back.map(|(_, l)| l.to_string()),
            last_failover: self.last_failover.clone(),
            instances,
            peers,
            members: self.cfg.members.as_ref().map(|_| self.members_view()),
            discovery: self.discovery.status(),
            recorded: self.recorders.iter().flat_map(|r| r.history()).collect(),
        };
        self.view = Arc::new(view);
    }
}

//! The decision task of one group: the single owner of all of the group's
//! state, a thin driver over pure machines. Where each step of the failover
//! (ARCHITECTURE.md) is decided and carried out:
//!
//! | step | decided by | carried out by |
//! |---|---|---|
//! | 1. SDOWN | [`probe::sdown::Sdown`](crate::probe::sdown::Sdown) per instance; the `role:slave` rule in `observe.rs` `update_master_role_down` | `observe.rs` `on_probe`, `on_tick` |
//! | 2. ODOWN | [`quorum::election::Election`](crate::quorum::election::Election) (`update_odown`) from the peers' answers | `election.rs` `ask_peers`, `on_answer` |
//! | 3. election | the same machine (`drive`, `won`); the voter's side [`may_vote`](crate::quorum::election::may_vote) and [`cast_vote`](crate::quorum::election::cast_vote) | `election.rs` `run_election_actions`, `answer_is_down`, `on_voted` |
//! | 4. selection | [`failover::select`](crate::failover::select), through `election.rs` `ReplicaSet` | the election machine asks at start and again when won |
//! | 5. fence | [`failover::machine::Failover`](crate::failover::machine::Failover) | `failover.rs` `run_failover_actions` (`Action::Fence`) |
//! | 6. promote | the failover machine | `failover.rs` (`Action::Promote`, `Action::Switchover`) |
//! | 7. publish | the failover machine | `failover.rs` (`Action::Publish`) → `adopt.rs` `adopt_master`, `persist_and_publish` |
//! | 8. re-point | the failover machine | `failover.rs` (`Action::Repoint`), `feed_reconfiguration` |
//! | 9. returning master | `repair.rs` `check_topology` (also wrong replicas) | `repair.rs` |
//!
//! Peers learn the outcome from hellos; `adopt.rs` `check_peer_configs`
//! adopts a newer config a peer announces once the master it names
//! reports `role:master` itself. The published [`view::GroupView`] is built
//! in `view.rs`.
//!
//! ## The route from a probe to an action
//!
//! The driver ([`driver::run`]) waits on five sources: probe reports (one
//! probe task per instance), messages from the API ([`GroupMsg`]), results
//! of the work it started ([`effects::Internal`]), changes of the peer
//! table (a `watch`), and its tick (plus the election machine's deadline).
//! It reads the clock once when it wakes ([`Group`]'s `now`), and each
//! input is handled to completion before the next: the handler updates the
//! state, feeds the machines, and turns their actions into events, metrics
//! and *work* ([`effects::Work`]: a command to a server, a question to the
//! peers, a write to the state file or to a discovery backend), data that
//! [`effects::Effects`] executes as a task of the group's own tracker. The
//! result comes back as an `Internal` message, fed to the machine that
//! asked for it (the failover machine's inputs carry its epoch, so a
//! result of an abandoned failover is dropped). Every such task ends with
//! the group. Only the driver and the executor read the clock or start a
//! task, and only the driver holds the group's channels: it reads the peer
//! table into the group before each wake-up (the peers' liveness changes
//! without a notification) and hands the view the group built to the API
//! and the hellos on a `watch`.

mod adopt;
mod driver;
mod effects;
mod election;
mod failover;
mod isolation;
mod members;
mod observe;
mod repair;
// Not only a test: `picket-sim` runs it too (`crate::sim`).
pub(crate) mod scenario;
pub mod view;

pub use driver::spawn;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::addr::Addr;
use crate::config::GroupConfig;
use crate::context::DaemonCtx;
use crate::discovery::memory::MemoryBackend;
use crate::discovery::runner::DiscoveryRunner;
use crate::events::{Detail, EventKind};
use crate::failover::FailoverError;
use crate::failover::machine::{Failover, Input};
use crate::metrics as m;
use crate::probe::ProbeEvent;
use crate::probe::info::InfoSnapshot;
use crate::quorum::election::{Election, Settings};
use crate::quorum::peers::{HelloGroup, IsDownQuery, IsDownReply};
use crate::quorum::state::{GroupRecord, MasterIdentity, StateError};
use crate::quorum::table::PeerSnapshot;
use crate::resp::ClientOptions;
use effects::{Effects, Internal, Work};
use failover::CommandOut;
use observe::{Instance, RunClock};
use view::{GroupView, LastFailover};

/// Messages to a group task.
#[derive(Debug)]
pub enum GroupMsg {
    /// A peer asks whether the master is down (and maybe for a vote).
    IsDown {
        /// The question.
        query: IsDownQuery,
        /// The answer, or why none can be given (the vote not persisted).
        reply: oneshot::Sender<Result<IsDownReply, StateError>>,
    },
    /// Planned switchover (`picket failover`, `SENTINEL FAILOVER`).
    Switchover {
        /// A specific replica, or the best one.
        to: Option<Addr>,
        /// `Ok` once the election is won.
        reply: oneshot::Sender<Result<(), FailoverError>>,
    },
    /// `SENTINEL RESET`: forget replicas and peer answers, rediscover.
    Reset,
    /// The group's pods changed (`[group.members]`).
    Members(Arc<crate::discovery::kubernetes::members::Members>),
}

/// Handle to a running group task.
#[derive(Debug, Clone)]
pub struct GroupHandle {
    /// Mailbox (of boxed messages: a channel keeps blocks of 32 slots as
    /// large as its message, and every group keeps one).
    tx: mpsc::Sender<Box<GroupMsg>>,
    /// Latest view.
    pub view: watch::Receiver<Arc<GroupView>>,
    /// Stops the task.
    pub cancel: CancellationToken,
}

/// The group task has stopped (the group was removed or the daemon is
/// stopping).
#[derive(Debug, thiserror::Error)]
#[error("the group has stopped")]
pub struct GroupGone;

impl GroupHandle {
    /// Hand `msg` to the group task (waiting while its mailbox is full).
    pub async fn send(&self, msg: GroupMsg) -> Result<(), GroupGone> {
        self.tx.send(Box::new(msg)).await.map_err(|_| GroupGone)
    }
}

/// Why a group could not be started.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The password file of the data servers cannot be read.
    #[error("{path}: {source}")]
    Secret {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS settings of the data servers are unusable.
    #[error("tls: {0}")]
    Tls(String),
    /// The pod watch of `[group.members]` cannot be set up.
    #[error("members: {0}")]
    Members(String),
}

/// Who waits for the start of a planned switchover.
#[derive(Debug)]
enum SwitchoverReply {
    /// A client of the API (`SENTINEL FAILOVER`, `picket failover`).
    Api(oneshot::Sender<Result<(), FailoverError>>),
    /// This daemon's own handover before the master's pod goes away: a
    /// switchover that does not start is only logged.
    Handover {
        /// The master's pod.
        pod: String,
    },
}

impl SwitchoverReply {
    fn send(self, group: &str, r: Result<(), FailoverError>) {
        match (self, r) {
            (SwitchoverReply::Api(tx), r) => {
                let _ = tx.send(r);
            }
            (SwitchoverReply::Handover { .. }, Ok(())) => {}
            (SwitchoverReply::Handover { pod }, Err(e)) => {
                tracing::warn!(group, %pod, error = %e, "the handover before the master's pod goes away did not start")
            }
        }
    }
}

/// A planned switchover asked for, waiting for fresh INFO.
struct PendingSwitchover {
    to: Option<Addr>,
    reply: SwitchoverReply,
    since: Instant,
}

/// A failover this daemon leads.
struct Running {
    machine: Failover,
    started: Instant,
    /// The candidate's identity when the failover started (what its
    /// promotion, and the re-points sent beside it, check).
    candidate: Option<crate::probe::reboot::Identity>,
    /// The old master's `master_replid` when the failover started: a
    /// switchover's command goes only to the server still in that
    /// history (`Work::Switchover`).
    master_history: Option<String>,
    /// Stepped down for a newer election ([`Input::Superseded`]): its
    /// abort leaves the backends to that election.
    superseded: bool,
}

/// Everything the task owns.
struct Group {
    cfg: GroupConfig,
    /// The group's name as a metric label, shared by its series.
    label: metrics::SharedString,
    ctx: Arc<DaemonCtx>,
    client: ClientOptions,
    discovery: Arc<DiscoveryRunner>,
    recorders: Vec<MemoryBackend>,
    effects: Effects,
    /// The view built last ([`Group::publish_view`]); the driver hands it
    /// to the API and the hellos.
    view: Arc<GroupView>,
    /// The peer table as the driver read it before this wake-up. The
    /// driver reads it again before every one: the peers' liveness changes
    /// without a notification, only their configs wake the group.
    peers: PeerSnapshot,

    master: Addr,
    config_epoch: u64,
    /// Boxed: a B-tree's leaf holds room for eleven entries, and a group
    /// has two or three instances; inline, every group kept eleven
    /// instances' worth (5 KiB, 2.5 MiB at a thousand instances).
    instances: BTreeMap<Addr, Box<Instance>>,
    /// Other names servers report for a known instance (a replica's
    /// `replica-announce-ip` that resolves to a configured name's IP).
    aliases: BTreeMap<Addr, Addr>,
    election: Election,
    failover: Option<Box<Running>>,
    /// The reply to a switchover request whose election runs.
    switchover_reply: Option<SwitchoverReply>,
    /// A switchover request waiting for fresh INFO from every replica
    /// (healthy replicas are read only every [`observe::INFO_SLOW`]).
    pending_switchover: Option<PendingSwitchover>,
    /// When this daemon last renewed a pause ([`Group::keep_paused`]).
    pause_renewed_at: Option<Instant>,
    /// A stray master waits for the peers' hellos that came after this
    /// time before it is demoted (`repair.rs`): a peer's hello wakes the
    /// topology check too.
    awaiting_hellos: Option<Instant>,
    /// The master this daemon's config names, and since when it has
    /// looked sane without a break (`repair.rs`): a stray master is
    /// demoted only on hellos from after that too.
    master_sane_since: Option<(Addr, Instant)>,
    /// A failover of this daemon's left the backends fenced at its epoch
    /// and published nothing (aborted, or stepped down for a newer
    /// election): that epoch, and from when to route the kept master
    /// again at it if nothing newer was published by then
    /// (`failover.rs`, `route_kept_master`).
    kept_route: Option<(u64, Instant)>,
    /// Switchover commands sent whose result has not come back, and the
    /// time by which the last one has ended on the server for sure (its
    /// own timeout, with the executor's watch after it): the old master
    /// may still hand over until then (`switchover_out`).
    switchovers_sent: u32,
    switchover_ends_by: Option<Instant>,
    /// Until when a switchover's `FAILOVER` that this daemon sent before
    /// it restarted may still hand over (`led_switchover_until` in the
    /// state file): counted as a command still out.
    switchover_before_start: Option<Instant>,
    /// Promotions and re-points beside them that this daemon's failovers
    /// sent and whose answers have not come back (`failover.rs`,
    /// `commands_out`): one of a failover given up meanwhile may still
    /// take effect on its server.
    commands_out: Vec<CommandOut>,
    last_failover: Option<LastFailover>,
    /// When the task last ran anything, to notice stalls of the process.
    run_clock: RunClock,
    /// The time of the current step: read by the driver loop when the
    /// task wakes (a message, a report, a timer) and the only clock the
    /// group's decisions read, so that a step sees one instant throughout.
    now: Instant,
    /// The wall clock at `now`, in seconds since the Unix epoch (read with
    /// it): for the times the view reports, such as the last failover's.
    unix_now: u64,
    last_export: Instant,
    /// When this task started: for [`repair::PROMOTED_GRACE`] after it, a
    /// daemon back with an old config demotes no stray master, for the
    /// hellos of the peers that hold a newer one to arrive.
    started: Instant,
    published_epoch: Option<u64>,
    /// The persisted config epoch, announced in the hellos instead of
    /// `config_epoch` while that is an epoch this daemon led and never
    /// published (a restart in the middle of its failover, see
    /// [`start_config`]): until the kept master answers as one on a fresh
    /// INFO (`confirm_start_config`). Why: its peers adopt a newer config naming
    /// the master they have without asking that server, and the server
    /// may have been handed over meanwhile (a switchover's `FAILOVER`
    /// completing after the leader died): they routed the backends to a
    /// replica (simulation seed 2248 with every fault). None once
    /// confirmed or once another config is adopted.
    start_announced: Option<u64>,
    /// The current config is served from memory only: persisting it failed.
    config_unpersisted: bool,
    /// The servers besides the master last written to the state file
    /// (`known_replicas`), to write them again when the set changes.
    persisted_known: Vec<Addr>,
    /// The master's process as the state file holds it.
    persisted_identity: Option<MasterIdentity>,
    /// A write of the current config is under way.
    config_persisting: bool,
    /// The master has reported `role:slave` for too long.
    master_role_down: bool,
    /// When the current master became the master in this daemon's view.
    master_since: Instant,
    /// The last value of the quorum-reachable gauge, set only on change.
    quorum_reachable: Option<bool>,
    /// A peer's config whose master is being asked for its role.
    checking_peer_config: Option<(u64, Addr)>,
    reason: Option<String>,
    /// Something the view shows changed since it was last published.
    dirty: bool,
    /// The master changed: publish the view before anything else runs.
    urgent: bool,
    /// Isolation fencing (`[group.isolation_fencing]`), see `isolation.rs`.
    isolation: isolation::Isolation,
    /// The group's pods, as the pod watch last reported them.
    members: Option<Arc<crate::discovery::kubernetes::members::Members>>,
    /// Addresses forgotten because no pod has them any more: a master
    /// lists a dead replica until its link times out, and it must not be
    /// taken in again from that list.
    gone: BTreeSet<Addr>,
    /// The handover for a master whose pod is being deleted.
    handover: Option<members::Handover>,
    /// The replicas the last publication of this epoch named, and when a
    /// publication for a changed set is due (see `publish_current_if_needed`).
    published_replicas: Vec<Addr>,
    republish_due: Option<Instant>,
    /// The reporter and old master of this epoch's publication, which a
    /// re-publication repeats.
    epoch_publication: Option<(crate::discovery::Reporter, Option<Addr>)>,
    /// A config adopted from a peer, to publish when this daemon's turn
    /// comes (see `adopt.rs`).
    adopted_publication: Option<adopt::AdoptedPublication>,
    /// When a publication whose turn came asked the servers for the INFO
    /// it is made from (see `Group::read_for_publication`).
    publication_read_asked: Option<Instant>,
}

/// Connection settings for the group's data servers.
pub fn client_options(cfg: &GroupConfig) -> Result<ClientOptions, GroupError> {
    let password = match &cfg.password_file {
        Some(p) => Some(
            crate::config::read_secret(p).map_err(|source| GroupError::Secret {
                path: p.display().to_string(),
                source,
            })?,
        ),
        None => None,
    };
    let tls = match &cfg.tls {
        Some(t) => Some(
            crate::resp::client::TlsClient::from_config(t)
                .map_err(|e| GroupError::Tls(e.to_string()))?,
        ),
        None => None,
    };
    let ping = cfg.ping_period();
    Ok(ClientOptions {
        connect_timeout: (ping * 2).clamp(Duration::from_millis(100), Duration::from_secs(2)),
        command_timeout: cfg
            .down_after
            .clamp(Duration::from_millis(200), Duration::from_secs(5)),
        username: cfg.username.clone(),
        password,
        tls,
        max_frame: crate::resp::DEFAULT_MAX_FRAME,
        client_name: Some("picket".into()),
    })
}

impl Group {
    /// A group about to be driven, with `master` at `config_epoch` (the
    /// persisted config, or the configured master) and no instance yet, at
    /// `now` (monotonic, and seconds since the Unix epoch). `seed` fixes the
    /// election's random delays (a simulation's; None in the daemon).
    #[allow(clippy::too_many_arguments)]
    fn new(
        cfg: GroupConfig,
        ctx: Arc<DaemonCtx>,
        client: ClientOptions,
        discovery: Arc<DiscoveryRunner>,
        recorders: Vec<MemoryBackend>,
        effects: Effects,
        (master, config_epoch): (Addr, u64),
        (now, unix_now): (Instant, u64),
        seed: Option<u64>,
    ) -> Group {
        let rec = ctx.state.group(&cfg.name);
        // Above the persisted config only when this daemon led a failover
        // that never published (`start_config`): its hellos keep the
        // persisted epoch until the kept master reports `role:master`
        // (`confirm_start_config`).
        let start_announced = (config_epoch > rec.config_epoch).then_some(rec.config_epoch);
        // That failover was a switchover whose `FAILOVER` went out: the
        // server may still hand over (the simulation with switchovers,
        // seed 2353: restarted 10 ms after sending it, the leader read
        // the kept master as one, published it, and the server handed
        // over 30 ms later). Counted as a command still out until then.
        let switchover_before_start = (start_announced.is_some()
            && rec.led_epoch == config_epoch
            && rec.led_switchover_until > unix_now)
            .then(|| now + Duration::from_secs(rec.led_switchover_until - unix_now));
        let settings = Settings {
            id: ctx.id.clone(),
            daemons: ctx.daemons(),
            quorum: cfg.quorum as usize,
            ping_period: cfg.ping_period(),
            down_after: cfg.down_after,
            failover_timeout: cfg.failover_timeout,
        };
        Group {
            effects,
            client,
            discovery,
            recorders,
            view: Arc::new(GroupView::placeholder(
                &cfg,
                &master,
                (config_epoch, start_announced.unwrap_or(config_epoch)),
                ctx.daemons(),
                &ctx.peer_table.snapshot(),
                now,
            )),
            peers: ctx.peer_table.snapshot(),
            master: master.clone(),
            config_epoch,
            instances: BTreeMap::new(),
            aliases: BTreeMap::new(),
            election: {
                let mut e = Election::new(settings, ctx.peers.len(), seed);
                if let Some(p) = rec.vote_promote
                    && rec.vote_epoch > config_epoch
                    && rec.voted_for.as_deref() != Some(ctx.id.as_str())
                {
                    e.restore_intended(now, rec.vote_epoch, p);
                }
                e
            },
            failover: None,
            switchover_reply: None,
            pending_switchover: None,
            pause_renewed_at: None,
            awaiting_hellos: None,
            master_sane_since: None,
            kept_route: None,
            switchovers_sent: 0,
            switchover_ends_by: None,
            commands_out: Vec::new(),
            switchover_before_start,
            last_failover: None,
            run_clock: RunClock::new(
                now,
                observe::stall_threshold(tick_period(&cfg), cfg.down_after),
            ),
            last_export: now,
            started: now,
            now,
            unix_now,
            published_epoch: None,
            start_announced,
            config_unpersisted: false,
            persisted_known: Vec::new(),
            persisted_identity: None,
            config_persisting: false,
            master_role_down: false,
            master_since: now,
            quorum_reachable: None,
            checking_peer_config: None,
            reason: None,
            dirty: true,
            urgent: false,
            isolation: isolation::Isolation::new(&cfg.name, cfg.isolation_fencing.clone()),
            members: None,
            gone: BTreeSet::new(),
            handover: None,
            published_replicas: Vec::new(),
            republish_due: None,
            epoch_publication: None,
            adopted_publication: None,
            publication_read_asked: None,
            label: m::label(&cfg.name),
            cfg,
            ctx,
        }
    }
}

/// What woke the group task.
enum Woken {
    Probe(Box<ProbeEvent>),
    Msg(Box<GroupMsg>),
    Internal(Box<Internal>),
    Peers,
    Timer,
}
impl Group {
    /// Handle what woke the task, at `self.now`; whether the INFO cadences
    /// must be looked at again.
    pub(super) fn on_wake(&mut self, woken: Woken) -> bool {
        // Valid PINGs that changed nothing are stamped by the probes, not
        // sent: take them in before anything is decided (an SDOWN
        // deadline that woke the task may have been met meanwhile).
        self.sync_liveness();
        match woken {
            Woken::Probe(ev) => {
                let info = matches!(*ev, ProbeEvent::Info { .. });
                let changed = self.on_probe(*ev);
                if info {
                    self.try_pending_switchover(self.now);
                }
                changed
            }
            Woken::Msg(msg) => {
                self.on_msg(*msg);
                self.dirty = true;
                true
            }
            Woken::Internal(int) => {
                self.on_internal(*int);
                self.dirty = true;
                true
            }
            Woken::Peers => {
                self.check_peer_configs(self.now);
                self.on_peer_sdown_hellos(self.now);
                if self.awaiting_hellos.is_some() {
                    self.check_topology(self.now);
                }
                let newest = self
                    .peers
                    .iter()
                    .filter_map(|e| e.hello.as_ref().map(|h| h.current_epoch))
                    .max();
                if let Some(epoch) = newest {
                    self.note_newer_epoch(epoch);
                }
                self.dirty = true;
                true
            }
            Woken::Timer => {
                self.on_tick();
                true
            }
        }
    }
}

impl Group {
    /// Start probing the master and the servers known from the state file
    /// (`picket import`'s, and those known at the last config): probed
    /// before the master lists them, so that a master already down can be
    /// failed over and an old master coming back is demoted.
    fn probe_from_start(&mut self, record: &GroupRecord) {
        let master = self.master.clone();
        self.ensure_instance(&master);
        for r in record.known_replicas.iter().filter(|r| **r != master) {
            self.ensure_instance(r);
        }
        // What the state file holds (`known_servers` is the same set).
        self.persisted_known = self.known_servers();
        // The master's process as this daemon last read it, to tell a new
        // one at the first INFO (`observe.rs`).
        self.persisted_identity = record.master_identity.clone();
        if let Some(id) = record
            .master_identity
            .as_ref()
            .filter(|id| id.addr == master)
            && let Some(inst) = self.instances.get_mut(&master)
        {
            let seen = InfoSnapshot {
                run_id: id.run_id.clone(),
                replid: id.replid.clone(),
                role: crate::probe::Role::Master,
                ..InfoSnapshot::default()
            };
            inst.identity_before = Some((Box::new(seen), self.now));
        }
    }

    /// Persist the master's process when it changed (at its INFO, and
    /// from the tick): a daemon restarted later compares the master's
    /// first INFO with it. Not a new process still to be judged
    /// or judged back with less: a daemon restarted before the failover
    /// must find the process from before the restart on record and judge
    /// the new one again (with the new one on record, two daemons that
    /// had judged the master and restarted after their votes never saw it
    /// restart, let their pauses lapse, and a replica copied it while the
    /// leader was cut off: the simulation with every fault, seed 21783).
    pub(super) fn persist_master_identity(&mut self) {
        let Some(info) = self
            .instances
            .get(&self.master)
            .filter(|i| !i.reboot_unjudged && !i.sdown.rebooted())
            .and_then(|i| i.info.as_deref())
            .filter(|i| i.role == crate::probe::Role::Master)
        else {
            return;
        };
        // Compared in place: called at every INFO of the master.
        if self.persisted_identity.as_ref().is_some_and(|p| {
            p.addr == self.master && p.run_id == info.run_id && p.replid == info.replid
        }) {
            return;
        }
        let id = MasterIdentity {
            addr: self.master.clone(),
            run_id: info.run_id.clone(),
            replid: info.replid.clone(),
        };
        self.persisted_identity = Some(id.clone());
        self.effects.run(Work::PersistIdentity(id));
    }

    fn emit(&self, kind: EventKind, detail: &Detail) {
        self.ctx
            .events
            .emit(kind, detail.render(&self.cfg.name, &self.master));
    }

    fn on_msg(&mut self, msg: GroupMsg) {
        let now = self.now;
        self.notice_stall(now);
        match msg {
            GroupMsg::IsDown { query, reply } => self.answer_is_down(now, query, reply),
            GroupMsg::Switchover { to, reply } => {
                self.start_switchover(now, to, SwitchoverReply::Api(reply))
            }
            GroupMsg::Members(members) => self.on_members(now, members),
            GroupMsg::Reset => {
                for addr in self.replica_addrs() {
                    self.forget_instance(&addr);
                }
                self.election.reset();
                self.emit(EventKind::ResetMaster, &Detail::Master);
                self.refresh_info(&self.master);
            }
        }
    }

    /// A planned switchover: at once when every replica's INFO is fresh,
    /// else after reading them all.
    fn start_switchover(&mut self, now: Instant, to: Option<Addr>, reply: SwitchoverReply) {
        if self.pending_switchover.is_some() {
            reply.send(&self.cfg.name, Err(FailoverError::InProgress));
        } else if self.replicas_read_since(None, now) {
            self.request_switchover(now, to, reply);
        } else {
            // Selection refuses stale INFO: read every replica first (a
            // round trip, not a period).
            self.pending_switchover = Some(PendingSwitchover {
                to,
                reply,
                since: now,
            });
            self.refresh_replicas_info();
        }
    }

    fn on_internal(&mut self, msg: Internal) {
        let now = self.now;
        self.notice_stall(now);
        match msg {
            Internal::Answer {
                peer,
                epoch,
                at,
                result,
            } => self.on_answer(now, peer, epoch, at, result),
            Internal::EpochPersisted(result) => self.on_epoch_persisted(now, result),
            Internal::Voted {
                query,
                down,
                result,
                reply,
            } => self.on_voted(now, query, down, result, reply),
            Internal::Failover(epoch, input) => self.on_failover_result(now, epoch, input),
            Internal::SwitchedOver(epoch, result) => {
                self.switchovers_sent = self.switchovers_sent.saturating_sub(1);
                if self.switchovers_sent == 0 {
                    self.switchover_ends_by = None;
                }
                self.on_failover_result(now, epoch, Input::Promoted(result));
            }
            Internal::Published {
                epoch,
                persisted,
                machine,
                result,
            } => self.on_published(now, epoch, persisted, machine, result),
            Internal::ConfigPersisted { epoch, result } => self.on_config_persisted(epoch, result),
            Internal::Demoted(addr, r) => self.on_demoted(addr, r),
            Internal::ScriptKilled(addr, r) => self.on_script_killed(addr, r),
            // Tried again at the next tick (`keep_paused`), not half a
            // pause later: a master judged back with less that ran a
            // script answered the judgement's pause with `-BUSY`, and its
            // replica copied it before the renewal (the simulation with
            // every fault, seed 7826).
            Internal::PauseRefused(addr) => {
                tracing::debug!(group = %self.cfg.name, instance = %addr, "the pause was refused; trying again at the next tick");
                self.pause_renewed_at = None;
            }
            Internal::FenceSet {
                master,
                target,
                keep,
                lag,
                at,
                result,
            } => self.on_fence_set(master, (target, keep), lag, at, result),
            Internal::FenceCleared {
                addr,
                run_id,
                at,
                result,
            } => self.on_fence_cleared(addr, run_id, at, result),
            Internal::PeerConfigChecked { from, group, role } => {
                self.on_peer_config_checked(from, group, role)
            }
            Internal::SyncHoldRefused {
                target,
                restore,
                refused,
            } => self.on_sync_hold_refused(target, restore, refused),
        }
    }

    /// Whether every reachable replica's INFO was read since `since` (None:
    /// within [`observe::INFO_FAST`] of `now`).
    fn replicas_read_since(&self, since: Option<Instant>, now: Instant) -> bool {
        self.instances
            .values()
            .filter(|i| i.addr != self.master && i.connected && !i.sdown.is_down())
            .all(|i| {
                i.info_at.is_some_and(|t| match since {
                    Some(s) => t >= s,
                    None => now.saturating_duration_since(t) < observe::INFO_FAST,
                })
            })
    }

    /// Start a switchover that waited for fresh INFO, once every replica
    /// was read (or after [`observe::INFO_FAST`]: selection decides then
    /// with what there is).
    fn try_pending_switchover(&mut self, now: Instant) {
        let Some(p) = self.pending_switchover.as_ref() else {
            return;
        };
        if !self.replicas_read_since(Some(p.since), now)
            && now.saturating_duration_since(p.since) < observe::INFO_FAST
        {
            return;
        }
        if let Some(p) = self.pending_switchover.take() {
            self.request_switchover(now, p.to, p.reply);
            self.dirty = true;
        }
    }

    /// When the task must run next without a message: the regular tick,
    /// an instance's SDOWN deadline (so that SDOWN is seen when it is due,
    /// not at the next tick), or the end of the pre-election delay.
    fn next_wake(&self, next_tick: Instant) -> Instant {
        let now = self.now;
        self.instances
            .values()
            .filter_map(|i| i.sdown.deadline())
            .chain(self.election.deadline())
            .chain(self.suspect_deadline(now))
            .chain(self.publication_deadline())
            .fold(next_tick, Instant::min)
    }

    /// The tick: every half PING period (10–100 ms) while anything is
    /// happening (an instance down or disconnected, ODOWN, an election, a
    /// failover, a replica to repair, TILT), and every [`quiet_tick`] when
    /// the group is quiet: what can change a quiet group comes as a probe
    /// report or at an exact deadline (SDOWN, a silent master, the
    /// election), and the tick is only a safety net.
    fn tick_period_now(&self) -> Duration {
        let tick = tick_period(&self.cfg);
        let now = self.now;
        let active = self.failover.is_some()
            || self.pending_switchover.is_some()
            || self.election.busy()
            || self.election.odown_since().is_some()
            || self.master_role_down
            || self.ctx.tilt.until().is_some_and(|u| now < u)
            || self.instances.values().any(|i| {
                i.sdown.is_down() || !i.connected || i.wrong_master_since.is_some() || i.busy
            });
        if active {
            tick
        } else {
            quiet_tick(&self.cfg, self.cfg.isolation_fencing.is_some())
        }
    }

    fn on_tick(&mut self) {
        let now = self.now;
        self.notice_stall(now);
        self.try_pending_switchover(now);
        self.observe_tick(now);
        self.step_election(now, |e, o| e.tick(o));
        self.switchover_master_gone(now);
        if self.failover.is_some() {
            self.machine_input(now, Input::Tick);
        }
        self.keep_paused(now);
        self.route_kept_master(now);
        self.check_topology(now);
        self.isolation_tick(now);
        // Gauges that change continuously are exported once a second, not
        // at every tick: with a thousand instances the tick is hot.
        if now.saturating_duration_since(self.last_export) >= Duration::from_secs(1) {
            self.last_export = now;
            self.retry_persist_config();
            self.persist_known_servers();
            self.persist_master_identity();
            // A peer's newer config whose check failed is tried again.
            self.check_peer_configs(now);
            self.export_instance_gauges(now);
            self.forget_long_gone(now);
            self.check_handover(now);
        }
    }
}

/// Build this daemon's hello from the groups' views.
pub fn hello_groups(groups: &HashMap<String, GroupHandle>) -> Vec<HelloGroup> {
    let mut out: Vec<HelloGroup> = groups
        .values()
        .map(|h| hello_group(&h.view.borrow()))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// What this daemon's hello says of one group, from its view.
fn hello_group(v: &GroupView) -> HelloGroup {
    HelloGroup {
        name: v.name.clone(),
        master: v.master.clone(),
        config_epoch: v.announced_epoch,
        sdown: v.master_sdown,
        replicas: Some(isolation::replica_sight(v)),
        failover_epoch: v.failover.as_ref().map(|f| f.epoch),
        promoting: v.promoting.clone(),
        stand_back: v.stand_back,
        stand_back_leader: v.stand_back_leader.clone(),
    }
}

/// The tick of a quiet group: a quarter of `down_after` (at most 1 s, at
/// least the active tick), or 250 ms with isolation fencing, whose
/// decisions are made on time as the peers' reports age.
///
/// Ticks were most of a quiet group's wake-ups (four a second per group).
/// A quarter of `down_after` keeps the stall detector's threshold
/// (`observe::stall_threshold`: at least 1 s and half of `down_after`) at
/// twice the longest quiet gap or more, so a quiet group is never taken
/// for a stalled process.
fn quiet_tick(cfg: &GroupConfig, isolation_fencing: bool) -> Duration {
    let tick = tick_period(cfg);
    let cap = if isolation_fencing {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(1)
    };
    (cfg.down_after / 4).min(cap).max(tick)
}

/// The group task's tick: half the PING period, 10–100 ms.
fn tick_period(cfg: &GroupConfig) -> Duration {
    (cfg.ping_period() / 2).clamp(Duration::from_millis(10), Duration::from_millis(100))
}

/// The master and config epoch a group starts with: a persisted config
/// (from a failover) wins over the initial master in the file; adopting it
/// at start-up never flushes anything. A daemon that fenced as the leader of a
/// newer epoch ([`GroupRecord::led_epoch`]) was killed before that
/// failover published (the config is persisted before it is published):
/// its fence may still hold the backends, and no one else knows of it. It
/// starts with the kept master at that epoch, as an aborted failover ends,
/// so that its start-up publication, once that master answers as a
/// master, routes the backends to it again. It alone led that epoch, so
/// no other master can be published in it. Its hellos announce that epoch
/// only once that master answers as one (`Group::start_announced`).
///
/// [`GroupRecord::led_epoch`]: crate::quorum::state::GroupRecord::led_epoch
fn start_config(cfg: &GroupConfig, record: &crate::quorum::state::GroupRecord) -> (Addr, u64) {
    let master = match &record.master {
        Some(m) if record.config_epoch > 0 => m.clone(),
        _ => cfg.master.clone(),
    };
    (master, record.config_epoch.max(record.led_epoch))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future an async fn with five arguments returns.
    fn future_size<A, B, C, D, E, F>(_: fn(A, B, C, D, E) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn a_group_task_holds_its_state_once() {
        // Every group's task is allocated at this size for its life; with
        // the group passed by value it was stored twice (4.6 KiB).
        let task = future_size(driver::run);
        let group = std::mem::size_of::<Group>();
        assert!(
            task < group / 2,
            "the group task's future is {task} bytes, the group {group}"
        );
    }

    fn group(down_after: &str, fenced: bool) -> GroupConfig {
        let fence = if fenced {
            "[group.isolation_fencing]\n"
        } else {
            ""
        };
        let text = format!(
            "[daemon]\nid = \"a\"\nlisten = \"127.0.0.1:26379\"\ndata_dir = \"/tmp\"\n\n\
             [[group]]\nname = \"g\"\nmaster = \"127.0.0.1:6379\"\nquorum = 1\n\
             down_after = \"{down_after}\"\nfailover_timeout = \"60s\"\n{fence}"
        );
        crate::config::load_str(std::path::Path::new("t.toml"), &text)
            .unwrap()
            .groups
            .remove(0)
    }

    #[test]
    fn a_quiet_group_ticks_at_a_quarter_of_down_after_and_is_never_taken_for_a_stall() {
        for (down_after, want) in [("4s", 1000), ("1s", 250), ("30s", 1000), ("100ms", 25)] {
            let cfg = group(down_after, false);
            let quiet = quiet_tick(&cfg, false);
            assert_eq!(quiet, Duration::from_millis(want), "{down_after}");
            // The longest quiet gap, twice over, stays under the threshold
            // at which the task would think the process stalled.
            let threshold = observe::stall_threshold(tick_period(&cfg), cfg.down_after);
            assert!(
                quiet * 2 <= threshold,
                "{down_after}: {quiet:?} vs {threshold:?}"
            );
            assert!(quiet >= tick_period(&cfg));
        }
        // Isolation fencing decides on time: its groups tick as before.
        let cfg = group("4s", true);
        assert!(cfg.isolation_fencing.is_some());
        assert_eq!(quiet_tick(&cfg, true), Duration::from_millis(250));
    }

    #[test]
    fn ms_saturates() {
        assert_eq!(ms(Duration::from_millis(5)), 5);
        assert_eq!(ms(Duration::MAX), u64::MAX);
    }
}

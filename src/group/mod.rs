//! The decision task of one group: it owns all of the group's state,
//! derives SDOWN and ODOWN from the probes and the peers' answers, runs
//! elections and the failover state machine, fences returning old masters
//! and publishes a [`view::GroupView`] for readers.

pub mod view;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::addr::Addr;
use crate::config::GroupConfig;
use crate::daemon::DaemonCtx;
use crate::discovery::runner::DiscoveryRunner;
use crate::discovery::{Fence, Reporter, Topology};
use crate::events::{master_details, replica_details};
use crate::failover::machine::{Action, Failover, Input, Kind, Outcome, Phase};
use crate::failover::ops::InstanceOps;
use crate::failover::select::{self, Candidate, SelectionLimits};
use crate::metrics as m;
use crate::probe::info::InfoSnapshot;
use crate::probe::sdown::{Sdown, Transition};
use crate::probe::{self, Flavour, ProbeEvent, ProbeHandle, ProbeSettings, Role};
use crate::quorum::peers::{HelloGroup, IsDownQuery, IsDownReply};
use crate::resp::ClientOptions;
use view::{FailoverView, GroupView, InstanceView, LastFailover, PeerView};

/// Messages to a group task.
#[derive(Debug)]
pub enum GroupMsg {
    /// A peer asks whether the master is down (and maybe for a vote).
    IsDown {
        /// The question.
        query: IsDownQuery,
        /// The answer, or why none can be given (state not persisted).
        reply: oneshot::Sender<Result<IsDownReply, String>>,
    },
    /// A peer's hello carried this group's config.
    PeerConfig {
        /// The peer's id.
        from: String,
        /// Its view of the group.
        group: HelloGroup,
    },
    /// Planned switchover (`picket failover`, `SENTINEL FAILOVER`).
    Switchover {
        /// A specific replica, or the best one.
        to: Option<Addr>,
        /// `Ok` once started; errors use Sentinel's texts.
        reply: oneshot::Sender<Result<(), String>>,
    },
    /// `SENTINEL RESET`: forget replicas and peer answers, rediscover.
    Reset,
}

/// Handle to a running group task.
#[derive(Debug, Clone)]
pub struct GroupHandle {
    /// Mailbox.
    pub tx: mpsc::Sender<GroupMsg>,
    /// Latest view.
    pub view: watch::Receiver<Arc<GroupView>>,
    /// Stops the task.
    pub cancel: CancellationToken,
}

/// Internal results of spawned work.
#[derive(Debug)]
enum Internal {
    /// The random delay before starting an election ran out.
    ElectionTimer,
    Answer {
        peer: usize,
        epoch: u64,
        at: Instant,
        result: Result<IsDownReply, String>,
    },
    Machine(u64, Input),
    Demoted(Addr, Result<(), String>),
    PeerConfigChecked {
        from: String,
        group: HelloGroup,
        role: Result<Role, String>,
    },
}

struct Instance {
    addr: Addr,
    probe: Option<ProbeHandle>,
    sdown: Sdown,
    connected: bool,
    connected_at: Option<Instant>,
    last_reply: Option<Instant>,
    last_error: Option<String>,
    info: Option<InfoSnapshot>,
    info_at: Option<Instant>,
    role_changed_at: Option<Instant>,
    last_action: Option<Instant>,
    wrong_master_since: Option<Instant>,
}

#[derive(Debug, Clone, Default)]
struct PeerState {
    down: bool,
    answered_at: Option<Instant>,
    /// The epoch of the question its last answer replied to.
    answered_epoch: u64,
    leader: Option<String>,
    leader_epoch: u64,
}

struct Election {
    epoch: u64,
    started: Instant,
    candidate: Addr,
    kind: Kind,
    switchover_reply: Option<oneshot::Sender<Result<(), String>>>,
}

struct Running {
    machine: Failover,
    started: Instant,
}

/// Everything the task owns.
struct Group {
    cfg: GroupConfig,
    ctx: Arc<DaemonCtx>,
    ops: InstanceOps,
    client: ClientOptions,
    discovery: Arc<DiscoveryRunner>,
    recorders: Vec<crate::discovery::memory::MemoryBackend>,
    probe_tx: mpsc::Sender<ProbeEvent>,
    internal_tx: mpsc::Sender<Internal>,
    cancel: CancellationToken,
    view_tx: watch::Sender<Arc<GroupView>>,

    master: Addr,
    config_epoch: u64,
    instances: BTreeMap<Addr, Instance>,
    peers: Vec<PeerState>,
    odown_since: Option<Instant>,
    last_ask: Option<Instant>,
    election: Option<Election>,
    failover: Option<Running>,
    next_attempt: Instant,
    election_delay_until: Option<Instant>,
    intended: Option<(u64, Addr)>,
    last_failover: Option<LastFailover>,
    /// When the task last ran anything, to notice stalls of the process.
    run_clock: RunClock,
    last_export: Instant,
    published_epoch: Option<u64>,
    /// The current config is served from memory only: persisting it failed.
    config_unpersisted: bool,
    /// The master has reported `role:slave` for too long.
    master_role_down: bool,
    /// When the current master became the master in this daemon's view.
    master_since: Instant,
    /// The last value of the quorum-reachable gauge, set only on change:
    /// setting it on every tick cost a registry lookup per group 10 times
    /// a second.
    quorum_reachable: Option<bool>,
    reason: Option<String>,
}

const HELLO_TTL: Duration = Duration::from_secs(3);

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Connection settings for the group's data servers.
pub fn client_options(cfg: &GroupConfig) -> Result<ClientOptions, String> {
    let password = match &cfg.password_file {
        Some(p) => {
            Some(crate::config::read_secret(p).map_err(|e| format!("{}: {e}", p.display()))?)
        }
        None => None,
    };
    let tls = match &cfg.tls {
        Some(t) => Some(crate::resp::client::TlsClient::from_config(t).map_err(|e| e.to_string())?),
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

/// Start the task of one group.
pub fn spawn(
    cfg: GroupConfig,
    ctx: Arc<DaemonCtx>,
    discovery: Arc<DiscoveryRunner>,
    recorders: Vec<crate::discovery::memory::MemoryBackend>,
    parent: &CancellationToken,
) -> Result<GroupHandle, String> {
    let client = client_options(&cfg)?;
    let record = ctx.state.group(&cfg.name);
    let configured: Addr = cfg
        .master
        .parse()
        .map_err(|e| format!("group {}: master: {e}", cfg.name))?;
    // A persisted config (from a failover) wins over the initial master in
    // the file; adopting it at start-up never flushes anything.
    let (master, config_epoch) = match record.master {
        Some(m) if record.config_epoch > 0 => (m, record.config_epoch),
        _ => (configured, record.config_epoch),
    };
    let now = Instant::now();
    let cancel = parent.child_token();
    let (tx, mut rx) = mpsc::channel(1024);
    let (probe_tx, mut probe_rx) = mpsc::channel(4096);
    let (internal_tx, mut internal_rx) = mpsc::channel(1024);
    let npeers = ctx.peers.len();
    let mut g = Group {
        ops: InstanceOps {
            client: client.clone(),
            admin_port: cfg.admin_port,
        },
        client,
        discovery,
        recorders,
        probe_tx,
        internal_tx,
        cancel: cancel.clone(),
        view_tx: watch::channel(Arc::new(placeholder_view(
            &cfg,
            &master,
            config_epoch,
            ctx.daemons(),
        )))
        .0,
        master: master.clone(),
        config_epoch,
        instances: BTreeMap::new(),
        peers: vec![PeerState::default(); npeers],
        odown_since: None,
        last_ask: None,
        election: None,
        failover: None,
        next_attempt: now,
        election_delay_until: None,
        intended: None,
        last_failover: None,
        run_clock: RunClock::new(now, stall_threshold(tick_period(&cfg), cfg.down_after)),
        last_export: now,
        published_epoch: None,
        config_unpersisted: false,
        master_role_down: false,
        master_since: now,
        quorum_reachable: None,
        reason: None,
        cfg,
        ctx,
    };
    g.ensure_instance(&master);
    let view = g.view_tx.subscribe();
    let handle = GroupHandle {
        tx,
        view,
        cancel: cancel.clone(),
    };
    tracing::info!(group = %g.cfg.name, master = %g.master, config_epoch = g.config_epoch, "monitoring group");
    metrics::gauge!(m::CONFIG_EPOCH, "group" => g.cfg.name.clone()).set(g.config_epoch as f64);
    metrics::gauge!(m::GROUP_MASTER, "group" => g.cfg.name.clone(), "server" => g.master.to_string())
        .set(1.0);
    tokio::spawn(async move {
        let tick_every = tick_period(&g.cfg);
        let mut tick = tokio::time::interval(tick_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_view = Instant::now();
        loop {
            tokio::select! {
                _ = g.cancel.cancelled() => break,
                Some(ev) = probe_rx.recv() => g.on_probe(ev),
                Some(msg) = rx.recv() => g.on_msg(msg),
                Some(int) = internal_rx.recv() => g.on_internal(int),
                _ = tick.tick() => {
                    g.on_tick();
                    let now = Instant::now();
                    if now.duration_since(last_view) >= Duration::from_millis(100) {
                        g.publish_view();
                        last_view = now;
                    }
                }
            }
        }
        tracing::info!(group = %g.cfg.name, "group task stopped");
    });
    Ok(handle)
}

fn placeholder_view(
    cfg: &GroupConfig,
    master: &Addr,
    config_epoch: u64,
    daemons: usize,
) -> GroupView {
    GroupView {
        name: cfg.name.clone(),
        master: master.clone(),
        config_epoch,
        quorum: cfg.quorum,
        daemons,
        down_after_ms: ms(cfg.down_after),
        failover_timeout_ms: ms(cfg.failover_timeout),
        parallel_syncs: cfg.parallel_syncs,
        flush_on_failover: cfg.flush_on_failover,
        status: "starting".into(),
        reason: None,
        master_sdown: false,
        master_odown: false,
        odown_ms: None,
        down_votes: 0,
        voted_leader: None,
        voted_epoch: 0,
        failover: None,
        last_failover: None,
        instances: Vec::new(),
        peers: Vec::new(),
        discovery: Vec::new(),
        recorded: Vec::new(),
    }
}

impl Group {
    fn ensure_instance(&mut self, addr: &Addr) {
        if self.instances.contains_key(addr) {
            return;
        }
        let ping = self.cfg.ping_period();
        let settings = ProbeSettings {
            group: self.cfg.name.clone(),
            addr: addr.clone(),
            ping_period: ping,
            info_period: Duration::from_secs(1).max(ping),
            ping_timeout: self.cfg.down_after.max(Duration::from_millis(100)),
            client: self.client.clone(),
        };
        let probe = probe::spawn(settings, self.probe_tx.clone(), &self.cancel);
        let now = Instant::now();
        // Up until SDOWN says otherwise, as in the view; without this the
        // gauge would only appear at the first +sdown.
        metrics::gauge!(m::INSTANCE_UP, "group" => self.cfg.name.clone(), "server" => addr.to_string())
            .set(1.0);
        self.instances.insert(
            addr.clone(),
            Instance {
                addr: addr.clone(),
                probe: Some(probe),
                sdown: Sdown::new(self.cfg.down_after, now),
                connected: false,
                connected_at: None,
                last_reply: None,
                last_error: None,
                info: None,
                info_at: None,
                role_changed_at: None,
                last_action: None,
                wrong_master_since: None,
            },
        );
        if *addr != self.master {
            self.ctx.events.emit(
                "+slave",
                replica_details(addr, &self.cfg.name, &self.master),
            );
        }
    }

    fn refresh_info(&self, addr: &Addr) {
        if let Some(p) = self.instances.get(addr).and_then(|i| i.probe.as_ref()) {
            p.refresh_info();
        }
    }

    // === probes ===

    fn on_probe(&mut self, ev: ProbeEvent) {
        self.notice_stall(Instant::now());
        let addr = ev.addr().clone();
        let group = self.cfg.name.clone();
        let master = self.master.clone();
        let Some(inst) = self.instances.get_mut(&addr) else {
            return;
        };
        let mut transition = None;
        let mut new_replicas = Vec::new();
        match ev {
            ProbeEvent::Ping {
                at, valid, error, ..
            } => {
                if !inst.connected {
                    inst.connected_at = Some(at);
                }
                inst.connected = true;
                inst.last_reply = Some(at);
                if valid {
                    transition = inst.sdown.on_valid_reply(at);
                    inst.last_error = None;
                } else {
                    inst.last_error = error;
                }
            }
            ProbeEvent::Unreachable { error, .. } => {
                if inst.last_error.as_deref() != Some(error.as_str()) {
                    tracing::debug!(group = %group, instance = %addr, %error, "probe failed");
                }
                inst.connected = false;
                inst.last_error = Some(error);
            }
            ProbeEvent::Info { at, info, .. } => {
                if !inst.connected {
                    inst.connected_at = Some(at);
                    inst.connected = true;
                }
                let old_role = inst.info.as_ref().map(|i| i.role);
                if old_role != Some(info.role) {
                    inst.role_changed_at = Some(at);
                }
                if addr == master && info.role == Role::Master {
                    for r in &info.replicas {
                        new_replicas.push(Addr::new(r.ip.clone(), r.port));
                    }
                }
                metrics::gauge!(m::INSTANCE_ROLE, "group" => group.clone(), "server" => addr.to_string(), "role" => "master")
                    .set(if info.role == Role::Master { 1.0 } else { 0.0 });
                metrics::gauge!(m::INSTANCE_ROLE, "group" => group.clone(), "server" => addr.to_string(), "role" => "replica")
                    .set(if info.role == Role::Replica { 1.0 } else { 0.0 });
                inst.info = Some(*info);
                inst.info_at = Some(at);
            }
        }
        if let Some(t) = transition {
            self.on_sdown_transition(&addr, t);
        }
        for r in new_replicas {
            self.ensure_instance(&r);
        }
        // React at once to what INFO showed (a returning old master must be
        // demoted within the second it answers).
        self.check_topology(Instant::now());
        self.feed_reconfiguration(&addr);
    }

    fn on_sdown_transition(&mut self, addr: &Addr, t: Transition) {
        let details = if *addr == self.master {
            master_details(&self.cfg.name, addr)
        } else {
            replica_details(addr, &self.cfg.name, &self.master)
        };
        let up = match t {
            Transition::Down => {
                self.ctx.events.emit("+sdown", details);
                0.0
            }
            Transition::Up => {
                self.ctx.events.emit("-sdown", details);
                1.0
            }
        };
        metrics::gauge!(m::INSTANCE_UP, "group" => self.cfg.name.clone(), "server" => addr.to_string()).set(up);
        if *addr == self.master {
            metrics::gauge!(m::MASTER_SDOWN, "group" => self.cfg.name.clone()).set(1.0 - up);
            // Peers learn it at once through the next hello and our asks.
            self.publish_view();
            self.ctx.hello_now.notify_one();
            if t == Transition::Down {
                self.last_ask = None;
            }
        }
    }

    // === ticks ===

    /// Notice that this process did not run for a while (SIGSTOP, VM
    /// pause, overload): nothing was observed meanwhile, so the silence is
    /// forgiven and acting is suspended (TILT). Called by the tick *and*
    /// before every event: after a stall the first thing the task handles
    /// may be a probe's reply, and acting on it (demoting a "stray" master
    /// that the peers promoted during the stall) with peers' hellos from
    /// before the stall is exactly what TILT must prevent.
    fn notice_stall(&mut self, now: Instant) {
        let Some(gap) = self.run_clock.ran(now) else {
            return;
        };
        let tilt_period = (self.cfg.down_after * 3).max(Duration::from_secs(3));
        self.ctx.tilt.enter(now, gap, tilt_period);
        for inst in self.instances.values_mut() {
            inst.sdown.forgive_until(now);
        }
        for p in self.peers.iter_mut() {
            p.answered_at = None;
        }
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        self.notice_stall(now);
        let tilt = self.ctx.tilt.active(now);
        if !tilt {
            let mut transitions = Vec::new();
            for inst in self.instances.values_mut() {
                if let Some(t) = inst.sdown.check(now) {
                    transitions.push((inst.addr.clone(), t));
                }
            }
            for (a, t) in transitions {
                self.on_sdown_transition(&a, t);
            }
        }
        if !tilt {
            self.update_master_role_down(now);
        }
        let master_sdown = self.master_sdown();
        if master_sdown && !tilt && self.failover.is_none() {
            self.ask_peers(now, None, None);
        }
        self.update_odown(now, tilt);
        self.drive_election(now, tilt);
        if self.failover.is_some() {
            self.machine_input(now, Input::Tick);
        }
        self.check_topology(now);
        // Gauges that change continuously are exported once a second, not
        // at every tick: with a thousand instances the tick is hot.
        if now.saturating_duration_since(self.last_export) >= Duration::from_secs(1) {
            self.last_export = now;
            self.retry_persist_config();
            for inst in self.instances.values() {
                let labels = [
                    ("group", self.cfg.name.clone()),
                    ("server", inst.addr.to_string()),
                ];
                metrics::gauge!(m::INSTANCE_UP, &labels).set(if inst.sdown.is_down() {
                    0.0
                } else {
                    1.0
                });
                if let Some(at) = inst.info_at {
                    metrics::gauge!(m::INFO_AGE, &labels)
                        .set(now.saturating_duration_since(at).as_secs_f64());
                }
            }
        }
    }

    fn master_sdown(&self) -> bool {
        self.master_role_down
            || self
                .instances
                .get(&self.master)
                .is_some_and(|i| i.sdown.is_down())
    }

    /// Sentinel's second SDOWN rule: the master answers, but has reported
    /// `role:slave` for longer than `down_after` plus two INFO periods
    /// (e.g. it came back with a stale `replicaof` and now replicates from
    /// its own replica, so nothing is a master). Without it such a group
    /// would stay masterless for ever.
    fn update_master_role_down(&mut self, now: Instant) {
        let grace = self.cfg.down_after + Duration::from_secs(2);
        // Only INFO read since this instance became the master counts: the
        // cached INFO of a just-promoted replica still says role:slave.
        let since = self.master_since;
        let down = self.instances.get(&self.master).is_some_and(|i| {
            i.info.as_ref().is_some_and(|x| x.role == Role::Replica)
                && i.info_at.is_some_and(|t| t > since)
                && i.role_changed_at
                    .map(|t| t.max(since))
                    .is_some_and(|t| now.saturating_duration_since(t) > grace)
        });
        if down != self.master_role_down {
            self.master_role_down = down;
            let details = master_details(&self.cfg.name, &self.master);
            if down {
                self.ctx
                    .events
                    .emit("+sdown", format!("{details} #reports role:slave"));
            } else {
                self.ctx.events.emit("-sdown", details);
            }
            metrics::gauge!(m::MASTER_SDOWN, "group" => self.cfg.name.clone())
                .set(if self.master_sdown() { 1.0 } else { 0.0 });
            self.publish_view();
            self.ctx.hello_now.notify_one();
            if down {
                self.last_ask = None;
            }
        }
    }

    fn answer_ttl(&self) -> Duration {
        (self.cfg.ping_period() * 3).max(Duration::from_secs(1))
    }

    fn ask_peers(&mut self, now: Instant, candidate: Option<String>, promote: Option<Addr>) {
        let ask_period = (self.cfg.ping_period() / 2)
            .clamp(Duration::from_millis(20), Duration::from_millis(500));
        if candidate.is_none()
            && self
                .last_ask
                .is_some_and(|t| now.duration_since(t) < ask_period)
        {
            return;
        }
        self.last_ask = Some(now);
        let epoch = if candidate.is_some() {
            self.election.as_ref().map(|e| e.epoch).unwrap_or(0)
        } else {
            self.ctx.state.current_epoch()
        };
        let query = IsDownQuery {
            group: self.cfg.name.clone(),
            master: self.master.clone(),
            config_epoch: self.config_epoch,
            epoch,
            candidate,
            promote,
        };
        for (i, link) in self.ctx.peers.iter().enumerate() {
            let link = link.clone();
            let q = query.clone();
            let tx = self.internal_tx.clone();
            tokio::spawn(async move {
                let result = link.is_down(&q).await.map_err(|e| e.to_string());
                let _ = tx
                    .send(Internal::Answer {
                        peer: i,
                        epoch: q.epoch,
                        at: Instant::now(),
                        result,
                    })
                    .await;
            });
        }
    }

    fn down_votes(&self, now: Instant) -> usize {
        let ttl = self.answer_ttl();
        usize::from(self.master_sdown())
            + self
                .peers
                .iter()
                .filter(|p| {
                    p.down
                        && p.answered_at
                            .is_some_and(|t| now.saturating_duration_since(t) <= ttl)
                })
                .count()
    }

    fn update_odown(&mut self, now: Instant, tilt: bool) {
        let votes = self.down_votes(now);
        let odown = !tilt && self.master_sdown() && votes >= self.cfg.quorum as usize;
        match (odown, self.odown_since) {
            (true, None) => {
                self.odown_since = Some(now);
                self.ctx.events.emit(
                    "+odown",
                    format!(
                        "{} #quorum {}/{}",
                        master_details(&self.cfg.name, &self.master),
                        votes,
                        self.cfg.quorum
                    ),
                );
                metrics::gauge!(m::MASTER_ODOWN, "group" => self.cfg.name.clone()).set(1.0);
            }
            (false, Some(_)) => {
                self.odown_since = None;
                self.ctx
                    .events
                    .emit("-odown", master_details(&self.cfg.name, &self.master));
                metrics::gauge!(m::MASTER_ODOWN, "group" => self.cfg.name.clone()).set(0.0);
            }
            _ => {}
        }
        self.reason = if tilt {
            Some("stall protection (TILT) active: not acting".into())
        } else if self.master_sdown() && !odown {
            Some(format!(
                "master is down for this daemon but only {votes} of the required quorum {} agree{}",
                self.cfg.quorum,
                if self.reachable_daemons(now) < self.cfg.quorum as usize {
                    format!(
                        " (only {} of {} daemons reachable)",
                        self.reachable_daemons(now),
                        self.ctx.daemons()
                    )
                } else {
                    String::new()
                }
            ))
        } else if odown
            && self.failover.is_none()
            && self.election.is_none()
            && now < self.next_attempt
        {
            Some(format!(
                "master is ODOWN; next failover attempt in {} ms",
                ms(self.next_attempt - now)
            ))
        } else {
            None
        };
        let reachable =
            self.reachable_daemons(now) >= self.ctx.majority().max(self.cfg.quorum as usize);
        if self.quorum_reachable != Some(reachable) {
            self.quorum_reachable = Some(reachable);
            metrics::gauge!(m::QUORUM_REACHABLE, "group" => self.cfg.name.clone())
                .set(if reachable { 1.0 } else { 0.0 });
        }
    }

    fn reachable_daemons(&self, now: Instant) -> usize {
        1 + self
            .ctx
            .peer_table
            .snapshot()
            .iter()
            .filter(|e| {
                e.last_seen
                    .is_some_and(|t| now.saturating_duration_since(t) <= HELLO_TTL)
            })
            .count()
    }

    // === elections ===

    fn candidates(&self, now: Instant) -> Vec<Candidate> {
        self.instances
            .values()
            .filter(|i| i.addr != self.master)
            .map(|i| {
                let info = i.info.as_ref();
                Candidate {
                    addr: i.addr.clone(),
                    sdown: i.sdown.is_down(),
                    connected: i.connected,
                    last_ok_age: now.saturating_duration_since(i.sdown.last_valid()),
                    info_age: i.info_at.map(|t| now.saturating_duration_since(t)),
                    role: info.map(|x| x.role).unwrap_or_default(),
                    priority: info.and_then(|x| x.priority),
                    offset: info.and_then(|x| x.replica_offset),
                    loading: info.is_some_and(|x| x.loading),
                    sync_in_progress: info.is_some_and(|x| x.sync_in_progress),
                    link_down_since: info
                        .and_then(|x| x.master_link_down_since_secs)
                        .map(Duration::from_secs),
                }
            })
            .collect()
    }

    fn select_candidate(&self, now: Instant, to: Option<&Addr>) -> Result<Addr, String> {
        let master_down_for = self
            .instances
            .get(&self.master)
            .and_then(|i| i.sdown.down_since())
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or_default();
        let limits =
            SelectionLimits::new(self.cfg.ping_period(), self.cfg.down_after, master_down_for);
        let mut cands = self.candidates(now);
        if let Some(t) = to {
            cands.retain(|c| c.addr == *t);
            if cands.is_empty() {
                return Err(format!(
                    "NOGOODSLAVE {t} is not a known replica of {}",
                    self.cfg.name
                ));
            }
        }
        // A replica a previous leader of this failover intended to promote
        // goes first, so that a leader that died half-way is not followed
        // by the promotion of a second replica.
        if let Some((epoch, a)) = &self.intended
            && *epoch > self.config_epoch
            && let Some(c) = cands.iter().find(|c| c.addr == *a)
            && select::exclusion(c, &limits).is_none()
        {
            return Ok(a.clone());
        }
        let sel = select::select(&cands, &limits);
        match sel.chosen {
            Some(a) => Ok(a),
            None => Err(format!(
                "NOGOODSLAVE No suitable replica to promote ({})",
                if sel.excluded.is_empty() {
                    "no replica known".to_string()
                } else {
                    sel.excluded
                        .iter()
                        .map(|(a, w)| format!("{a}: {w:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            )),
        }
    }

    fn drive_election(&mut self, now: Instant, tilt: bool) {
        if self.failover.is_some() {
            return;
        }
        if let Some(el) = &self.election {
            let timeout = (self.cfg.down_after * 2)
                .clamp(Duration::from_secs(1), Duration::from_secs(10))
                .min(self.cfg.failover_timeout);
            let split = self.election_split(el.epoch);
            if self.votes_for_me(el.epoch) >= self.votes_needed() {
                self.won_election(now);
            } else if split || now.duration_since(el.started) >= timeout {
                let el = self.election.take();
                self.ctx.events.emit(
                    "-failover-abort-not-elected",
                    master_details(&self.cfg.name, &self.master),
                );
                metrics::counter!(m::ELECTIONS, "group" => self.cfg.name.clone(), "result" => if split { "split" } else { "lost" }).increment(1);
                if split {
                    // Nobody won: retry after a short random delay instead
                    // of a whole failover_timeout.
                    let spread = ms((self.cfg.ping_period() * 2).max(Duration::from_millis(300)));
                    self.next_attempt =
                        now + Duration::from_millis(rand::rng().random_range(0..=spread));
                } else {
                    self.schedule_retry(now);
                }
                if let Some(Election {
                    switchover_reply: Some(r),
                    ..
                }) = el
                {
                    let _ = r.send(Err("NOQUORUM could not win the election".into()));
                }
            }
            return;
        }
        if tilt || self.odown_since.is_none() || now < self.next_attempt {
            self.election_delay_until = None;
            return;
        }
        // A random delay before starting, against split votes. It runs on
        // its own timer: rounded to the group's tick, the daemons' delays
        // all ended on the same tick and their votes split.
        if self.election_delay_until.is_none() {
            let max = (self.cfg.ping_period() / 2)
                .clamp(Duration::from_millis(50), Duration::from_millis(150));
            let d = Duration::from_millis(rand::rng().random_range(0..=ms(max)));
            self.election_delay_until = Some(now + d);
            let tx = self.internal_tx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(d).await;
                let _ = tx.send(Internal::ElectionTimer).await;
            });
        }
    }

    /// Whether the election in `epoch` can no longer be won by anybody:
    /// every peer answered for it and no candidate holds enough votes (each
    /// daemon voted for itself, or the votes are spread). Then nobody is
    /// failing over, and retrying soon is safe.
    fn election_split(&self, epoch: u64) -> bool {
        // Every peer answered this election with a vote in it (a peer that
        // refused to vote, e.g. for a stale view, is not a split).
        if self
            .peers
            .iter()
            .any(|p| p.answered_epoch < epoch || p.leader_epoch != epoch || p.leader.is_none())
        {
            return false;
        }
        let mut tally: HashMap<&str, usize> = HashMap::new();
        *tally.entry(self.ctx.id.as_str()).or_default() += 1;
        for p in &self.peers {
            if p.leader_epoch == epoch
                && let Some(l) = p.leader.as_deref()
            {
                *tally.entry(l).or_default() += 1;
            }
        }
        tally.values().all(|n| *n < self.votes_needed())
    }

    fn votes_needed(&self) -> usize {
        self.ctx.majority().max(self.cfg.quorum as usize)
    }

    fn votes_for_me(&self, epoch: u64) -> usize {
        1 + self
            .peers
            .iter()
            .filter(|p| {
                p.leader_epoch == epoch && p.leader.as_deref() == Some(self.ctx.id.as_str())
            })
            .count()
    }

    fn schedule_retry(&mut self, now: Instant) {
        // A wide random spread, so that two daemons whose elections split
        // do not collide again on the retry.
        let spread = ms(self.cfg.ping_period().max(Duration::from_secs(1)));
        let jitter = rand::rng().random_range(0..=spread);
        self.next_attempt = now + self.cfg.failover_timeout + Duration::from_millis(jitter);
    }

    fn start_election(
        &mut self,
        now: Instant,
        kind: Kind,
        to: Option<Addr>,
        reply: Option<oneshot::Sender<Result<(), String>>>,
    ) {
        let candidate = match self.select_candidate(now, to.as_ref()) {
            Ok(c) => c,
            Err(e) => {
                if kind == Kind::Unplanned {
                    self.ctx.events.emit(
                        "-failover-abort-no-good-slave",
                        master_details(&self.cfg.name, &self.master),
                    );
                    tracing::warn!(group = %self.cfg.name, reason = %e, "no replica to promote");
                    self.schedule_retry(now);
                }
                if let Some(r) = reply {
                    let _ = r.send(Err(e));
                }
                return;
            }
        };
        let epoch = match self.ctx.state.start_election(&self.cfg.name) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(group = %self.cfg.name, error = %e, "cannot persist the new epoch; not starting an election");
                if let Some(r) = reply {
                    let _ = r.send(Err(format!("ERR cannot persist state: {e}")));
                }
                self.schedule_retry(now);
                return;
            }
        };
        metrics::gauge!(m::CURRENT_EPOCH).set(epoch as f64);
        self.ctx.events.emit("+new-epoch", epoch.to_string());
        self.ctx.events.emit(
            "+try-failover",
            master_details(&self.cfg.name, &self.master),
        );
        tracing::info!(group = %self.cfg.name, epoch, candidate = %candidate, ?kind, "starting election");
        for p in self.peers.iter_mut() {
            p.leader = None;
        }
        self.election = Some(Election {
            epoch,
            started: now,
            candidate: candidate.clone(),
            kind,
            switchover_reply: reply,
        });
        let id = self.ctx.id.clone();
        self.ask_peers(now, Some(id), Some(candidate));
        if self.votes_for_me(epoch) >= self.votes_needed() {
            self.won_election(now);
        }
    }

    fn won_election(&mut self, now: Instant) {
        let Some(el) = self.election.take() else {
            return;
        };
        metrics::counter!(m::ELECTIONS, "group" => self.cfg.name.clone(), "result" => "won")
            .increment(1);
        self.ctx.events.emit(
            "+elected-leader",
            master_details(&self.cfg.name, &self.master),
        );
        self.ctx
            .maybe_crash(crate::daemon::CRASH_AFTER_ELECTION, "after the election");
        tracing::info!(group = %self.cfg.name, epoch = el.epoch, candidate = %el.candidate, "elected leader; failing over");
        // Re-check the candidate with the freshest view.
        let candidate = if el.kind == Kind::Unplanned {
            match self.select_candidate(now, Some(&el.candidate)) {
                Ok(c) => c,
                Err(_) => match self.select_candidate(now, None) {
                    Ok(c) => c,
                    Err(e) => {
                        self.ctx.events.emit(
                            "-failover-abort-no-good-slave",
                            master_details(&self.cfg.name, &self.master),
                        );
                        tracing::warn!(group = %self.cfg.name, reason = %e, "no replica to promote");
                        self.schedule_retry(now);
                        return;
                    }
                },
            }
        } else {
            el.candidate.clone()
        };
        if let Some(r) = el.switchover_reply {
            let _ = r.send(Ok(()));
        }
        self.intended = Some((el.epoch, candidate.clone()));
        let replicas: Vec<Addr> = self
            .instances
            .keys()
            .filter(|a| **a != self.master)
            .cloned()
            .collect();
        let (machine, actions) = Failover::start(
            now,
            el.epoch,
            el.kind,
            self.master.clone(),
            candidate,
            self.cfg.flush_on_failover,
            replicas,
            self.cfg.parallel_syncs,
            self.cfg.failover_timeout,
        );
        self.failover = Some(Running {
            machine,
            started: el.started,
        });
        self.ctx.events.emit(
            "+failover-state-select-slave",
            master_details(&self.cfg.name, &self.master),
        );
        self.run_actions(actions);
    }

    // === the failover machine ===

    fn machine_input(&mut self, now: Instant, input: Input) {
        let Some(run) = self.failover.as_mut() else {
            return;
        };
        let actions = run.machine.step(now, input);
        self.run_actions(actions);
    }

    fn flavour_of(&self, addr: &Addr) -> Flavour {
        self.instances
            .get(addr)
            .and_then(|i| i.info.as_ref())
            .map(|i| i.flavour)
            .or_else(|| {
                self.instances
                    .get(&self.master)
                    .and_then(|i| i.info.as_ref())
                    .map(|i| i.flavour)
            })
            .unwrap_or_default()
    }

    fn run_actions(&mut self, actions: Vec<Action>) {
        let Some(run) = self.failover.as_ref() else {
            return;
        };
        let epoch = run.machine.epoch;
        let deadline = self.cfg.failover_timeout;
        for action in actions {
            let tx = self.internal_tx.clone();
            match action {
                Action::Event(ch, detail) => {
                    let msg = match ch {
                        "+selected-slave"
                        | "+promoted-slave"
                        | "+slave-reconf-done"
                        | "-slave-reconf-sent-timeout" => match detail.parse::<Addr>() {
                            Ok(a) => replica_details(&a, &self.cfg.name, &self.master),
                            Err(_) => detail,
                        },
                        "+failover-state-send-slaveof-noone"
                        | "+failover-state-reconf-slaves"
                        | "+failover-end"
                        | "+failover-end-for-timeout" => {
                            master_details(&self.cfg.name, &self.master)
                        }
                        _ => format!("{} {detail}", master_details(&self.cfg.name, &self.master)),
                    };
                    self.ctx.events.emit(ch, msg);
                }
                Action::Fence { old_master } => {
                    let fence = Fence {
                        group: self.cfg.name.clone(),
                        epoch,
                        old_master,
                    };
                    let runner = self.discovery.clone();
                    tokio::spawn(async move {
                        let r = runner
                            .fence(fence, deadline)
                            .await
                            .map_err(|e| e.to_string());
                        let _ = tx.send(Internal::Machine(epoch, Input::Fenced(r))).await;
                    });
                }
                Action::Promote { candidate, flush } => {
                    let ops = self.ops.clone();
                    let flavour = self.flavour_of(&candidate);
                    tracing::info!(group = %self.cfg.name, %candidate, flush, "promoting");
                    tokio::spawn(async move {
                        let r = ops.promote(&candidate, flavour, flush).await;
                        let _ = tx.send(Internal::Machine(epoch, Input::Promoted(r))).await;
                    });
                }
                Action::Switchover {
                    candidate,
                    old_master,
                } => {
                    let ops = self.ops.clone();
                    let flavour = self.flavour_of(&old_master);
                    let timeout = (self.cfg.failover_timeout / 2)
                        .clamp(Duration::from_secs(1), Duration::from_secs(10));
                    tracing::info!(group = %self.cfg.name, %candidate, "switching over");
                    tokio::spawn(async move {
                        let r = ops
                            .switchover(&old_master, flavour, &candidate, timeout)
                            .await;
                        let _ = tx.send(Internal::Machine(epoch, Input::Promoted(r))).await;
                    });
                }
                Action::Publish { master } => {
                    let old = self.master.clone();
                    self.adopt_master(master, epoch, Reporter::Leader, None);
                    let topology = self.topology(Reporter::Leader, self.replaced(old));
                    let runner = self.discovery.clone();
                    tokio::spawn(async move {
                        let r = runner
                            .publish(topology, deadline)
                            .await
                            .map_err(|e| e.to_string());
                        let _ = tx.send(Internal::Machine(epoch, Input::Published(r))).await;
                    });
                }
                Action::Repoint { replica, master } => {
                    let ops = self.ops.clone();
                    let flavour = self.flavour_of(&replica);
                    self.ctx.events.emit(
                        "+slave-reconf-sent",
                        replica_details(&replica, &self.cfg.name, &self.master),
                    );
                    tokio::spawn(async move {
                        let r = ops
                            .repoint(&replica, flavour, &master)
                            .await
                            .map_err(|e| e.to_string());
                        let _ = tx
                            .send(Internal::Machine(epoch, Input::RepointSent(replica, r)))
                            .await;
                    });
                }
                Action::Finished(outcome) => self.finish_failover(outcome),
            }
        }
    }

    fn finish_failover(&mut self, outcome: Outcome) {
        let now = Instant::now();
        let Some(run) = self.failover.take() else {
            return;
        };
        let (label, to) = match &outcome {
            Outcome::Completed => ("completed", Some(run.machine.candidate.clone())),
            Outcome::CompletedWithTimeout => (
                "completed_with_timeout",
                Some(run.machine.candidate.clone()),
            ),
            Outcome::Aborted(_) => ("aborted", None),
        };
        metrics::counter!(m::FAILOVERS, "group" => self.cfg.name.clone(), "result" => label)
            .increment(1);
        let duration = now.saturating_duration_since(run.started);
        if to.is_some() {
            metrics::histogram!(m::FAILOVER_DURATION, "group" => self.cfg.name.clone())
                .record(duration.as_secs_f64());
        }
        tracing::info!(group = %self.cfg.name, epoch = run.machine.epoch, outcome = ?outcome, duration_ms = ms(duration), "failover finished");
        self.last_failover = Some(LastFailover {
            epoch: run.machine.epoch,
            from: run.machine.old_master.clone(),
            to,
            outcome: match outcome {
                Outcome::Aborted(why) => format!("aborted: {why}"),
                _ => label.to_string(),
            },
            at_unix: unix_now(),
            duration_ms: Some(ms(duration)),
        });
        if matches!(
            self.last_failover.as_ref().map(|l| l.to.is_none()),
            Some(true)
        ) {
            self.schedule_retry(now);
            if run.machine.kind == Kind::Switchover {
                // The old master serves again: make sure the backends that
                // were fenced route to it again, with the fence's epoch.
                self.adopt_master(
                    self.master.clone(),
                    run.machine.epoch,
                    Reporter::Leader,
                    None,
                );
                let topology = self.topology(Reporter::Leader, None);
                let runner = self.discovery.clone();
                let deadline = self.cfg.failover_timeout;
                tokio::spawn(async move {
                    if let Err(e) = runner.publish(topology, deadline).await {
                        tracing::warn!(error = %e, "re-publishing the old master after an aborted switchover failed");
                    }
                });
            }
        } else {
            // A completed failover: the next one may start whenever needed.
            self.next_attempt = now;
        }
    }

    /// Make `master` the group's master with `epoch` (persisted first).
    ///
    /// A config that cannot be persisted (full disk) is still served from
    /// memory: it is the one a majority agreed on (this daemon's own
    /// promotion, which its peers adopt and persist, or a peer's config
    /// confirmed by the master's own role), and keeping the older one
    /// would send clients to a master that is no longer one. Forgetting it
    /// in a restart only makes this daemon stale until the next hello, like
    /// a daemon that was partitioned during the failover. The write is
    /// retried every second ([`Group::retry_persist_config`]).
    fn adopt_master(&mut self, master: Addr, epoch: u64, reporter: Reporter, from: Option<&str>) {
        if let Err(e) = self.ctx.state.set_config(&self.cfg.name, epoch, &master) {
            tracing::error!(group = %self.cfg.name, error = %e, %master, epoch, "cannot persist the new master; serving it from memory and retrying");
            self.config_unpersisted = true;
        } else {
            self.config_unpersisted = false;
        }
        // Every caller publishes the adopted config right after.
        self.published_epoch = Some(epoch);
        let old = std::mem::replace(&mut self.master, master.clone());
        self.config_epoch = epoch;
        metrics::gauge!(m::CONFIG_EPOCH, "group" => self.cfg.name.clone()).set(epoch as f64);
        metrics::gauge!(m::GROUP_MASTER, "group" => self.cfg.name.clone(), "server" => old.to_string()).set(0.0);
        metrics::gauge!(m::GROUP_MASTER, "group" => self.cfg.name.clone(), "server" => master.to_string()).set(1.0);
        self.ensure_instance(&master);
        self.ensure_instance(&old);
        if old != master {
            if let Some(from) = from {
                self.ctx.events.emit(
                    "+config-update-from",
                    format!(
                        "sentinel {from} @ {} {} {}",
                        self.cfg.name, master.host, master.port
                    ),
                );
            }
            self.ctx.events.emit(
                "+switch-master",
                format!(
                    "{} {} {} {} {}",
                    self.cfg.name, old.host, old.port, master.host, master.port
                ),
            );
        }
        if self.intended.as_ref().is_some_and(|(e, _)| *e <= epoch) {
            self.intended = None;
        }
        self.odown_since = None;
        self.master_role_down = false;
        if old != master {
            self.master_since = Instant::now();
            self.refresh_info(&master);
        }
        metrics::gauge!(m::MASTER_ODOWN, "group" => self.cfg.name.clone()).set(0.0);
        if reporter == Reporter::Observer && old != master {
            self.last_failover = Some(LastFailover {
                epoch,
                from: old.clone(),
                to: Some(master.clone()),
                outcome: "observed".into(),
                at_unix: unix_now(),
                duration_ms: None,
            });
        }
        self.ctx.hello_now.notify_one();
        self.publish_view();
    }

    /// Persist a config that [`Group::adopt_master`] could only apply in
    /// memory, once the state file can be written again.
    fn retry_persist_config(&mut self) {
        if !self.config_unpersisted {
            return;
        }
        match self
            .ctx
            .state
            .set_config(&self.cfg.name, self.config_epoch, &self.master)
        {
            Ok(_) => {
                tracing::info!(group = %self.cfg.name, master = %self.master, epoch = self.config_epoch, "the current master is persisted");
                self.config_unpersisted = false;
            }
            Err(e) => {
                tracing::debug!(group = %self.cfg.name, error = %e, "still cannot persist the current master")
            }
        }
    }

    /// `old` when the master is no longer `old` (the `from` of a
    /// publication, as in Sentinel's client-reconfig-script arguments).
    fn replaced(&self, old: Addr) -> Option<Addr> {
        (old != self.master).then_some(old)
    }

    fn topology(&self, reporter: Reporter, old_master: Option<Addr>) -> Topology {
        Topology {
            group: self.cfg.name.clone(),
            epoch: self.config_epoch,
            master: self.master.clone(),
            old_master,
            replicas: self
                .instances
                .keys()
                .filter(|a| **a != self.master)
                .cloned()
                .collect(),
            reporter,
        }
    }

    fn feed_reconfiguration(&mut self, addr: &Addr) {
        let Some(run) = self.failover.as_ref() else {
            return;
        };
        if run.machine.phase() != Phase::Reconfiguring {
            return;
        }
        let target = run.machine.candidate.clone();
        let synced = self
            .instances
            .get(addr)
            .and_then(|i| i.info.as_ref())
            .is_some_and(|i| {
                i.role == Role::Replica
                    && i.master_link_up
                    && i.master_host.as_deref() == Some(target.host.as_str())
                    && i.master_port == Some(target.port)
            });
        if synced {
            self.machine_input(Instant::now(), Input::ReplicaSynced(addr.clone()));
        }
    }

    // === keeping the topology right outside failovers ===

    /// Whether this daemon may reconfigure instances on its own: not in
    /// TILT, no failover, and its config confirmed by a majority (its own
    /// view is not stale).
    fn may_reconfigure(&self, now: Instant) -> bool {
        if self.failover.is_some() || self.election.is_some() || self.ctx.tilt.active(now) {
            return false;
        }
        let peers = self.ctx.peer_table.snapshot();
        let mut confirmed = 1;
        for e in &peers {
            // Any peer known to hold a newer config, however old its hello:
            // this daemon's view is stale and must not act on it.
            if let Some(h) = &e.hello
                && let Some(g) = h.groups.iter().find(|g| g.name == self.cfg.name)
                && g.config_epoch > self.config_epoch
            {
                return false;
            }
            // Only a recent hello confirms the peer's config; an answer to
            // IS-DOWN proves it is alive, not what it believes (a daemon
            // back from a partition hears answers before hellos).
            let fresh = e
                .last_hello
                .is_some_and(|t| now.saturating_duration_since(t) <= HELLO_TTL);
            if fresh {
                confirmed += 1;
            }
        }
        confirmed >= self.ctx.majority()
    }

    /// Publish the current config once per config epoch when nobody did
    /// in this process yet (after a start or a restart), so that backends
    /// converge without waiting for a failover: only once the master itself
    /// reports `role:master` on a fresh INFO and a majority confirms the
    /// config. Backends refuse it if they hold a newer epoch.
    fn publish_current_if_needed(&mut self) {
        if self.published_epoch == Some(self.config_epoch) {
            return;
        }
        if !self.reports_master_now(&self.master) {
            return;
        }
        self.published_epoch = Some(self.config_epoch);
        let topology = self.topology(Reporter::Observer, None);
        let runner = self.discovery.clone();
        let deadline = self.cfg.failover_timeout;
        let name = self.cfg.name.clone();
        tokio::spawn(async move {
            if let Err(e) = runner.publish(topology, deadline).await {
                tracing::warn!(group = %name, error = %e, "publishing the current config failed");
            }
        });
    }

    /// `addr` is up and reports `role:master` on an INFO read on its
    /// current connection.
    fn reports_master_now(&self, addr: &Addr) -> bool {
        self.instances.get(addr).is_some_and(|i| {
            i.connected
                && !i.sdown.is_down()
                && i.info_at.is_some_and(|t| Some(t) >= i.connected_at)
                && i.info.as_ref().is_some_and(|x| x.role == Role::Master)
        })
    }

    fn check_topology(&mut self, now: Instant) {
        if !self.may_reconfigure(now) {
            return;
        }
        self.publish_current_if_needed();
        let master = self.master.clone();
        let master_up = self
            .instances
            .get(&master)
            .is_some_and(|i| !i.sdown.is_down());
        // Sentinel's "master looks sane": up, and a master on a fresh INFO.
        // Only then is another instance that reports role:master a stray to
        // demote. With the master down (or not a master), that instance is
        // far more likely a replica that a leader has just promoted, whose
        // new config has not reached this daemon yet: demoting it would
        // undo the failover and trigger a second one.
        let master_sane = self.reports_master_now(&master);
        let intended = self
            .intended
            .as_ref()
            .filter(|(e, _)| *e > self.config_epoch)
            .map(|(_, a)| a.clone());
        let mut demote = Vec::new();
        let mut repoint = Vec::new();
        for inst in self.instances.values_mut() {
            if inst.addr == master || Some(&inst.addr) == intended.as_ref() {
                inst.wrong_master_since = None;
                continue;
            }
            let Some(info) = inst.info.as_ref() else {
                continue;
            };
            // Act only on what the instance says now: an INFO read on the
            // current connection of a reachable instance, never on a
            // remembered reply of an instance that has since died.
            let fresh = inst.connected
                && !inst.sdown.is_down()
                && inst.info_at.is_some_and(|t| Some(t) >= inst.connected_at);
            if !fresh {
                continue;
            }
            if inst
                .last_action
                .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
            {
                continue;
            }
            match info.role {
                // A returning old master (or any stray master): demote at
                // once, before anything could route to it (invariant 6).
                Role::Master if master_sane => {
                    inst.last_action = Some(now);
                    demote.push((inst.addr.clone(), info.flavour));
                }
                Role::Replica if master_up => {
                    let points_at = |a: &Addr| {
                        info.master_host.as_deref() == Some(a.host.as_str())
                            && info.master_port == Some(a.port)
                    };
                    // Following the replica a leader is promoting in a newer
                    // epoch is right too: its config is on the way.
                    let follows = points_at(&master) || intended.as_ref().is_some_and(points_at);
                    if follows {
                        inst.wrong_master_since = None;
                    } else {
                        let since = *inst.wrong_master_since.get_or_insert(now);
                        if now.duration_since(since) >= Duration::from_millis(500) {
                            inst.last_action = Some(now);
                            repoint.push((inst.addr.clone(), info.flavour));
                        }
                    }
                }
                _ => {}
            }
        }
        for (addr, flavour) in demote {
            self.ctx.events.emit(
                "+convert-to-slave",
                replica_details(&addr, &self.cfg.name, &master),
            );
            tracing::info!(group = %self.cfg.name, instance = %addr, master = %master, "demoting a stray master");
            let ops = self.ops.clone();
            let m = master.clone();
            let tx = self.internal_tx.clone();
            tokio::spawn(async move {
                let r = ops
                    .demote(&addr, flavour, &m)
                    .await
                    .map_err(|e| e.to_string());
                let _ = tx.send(Internal::Demoted(addr, r)).await;
            });
        }
        for (addr, flavour) in repoint {
            self.ctx.events.emit(
                "+fix-slave-config",
                replica_details(&addr, &self.cfg.name, &master),
            );
            let ops = self.ops.clone();
            let m = master.clone();
            let name = self.cfg.name.clone();
            tokio::spawn(async move {
                if let Err(e) = ops.repoint(&addr, flavour, &m).await {
                    tracing::warn!(group = %name, instance = %addr, error = %e, "re-pointing a replica failed");
                }
            });
        }
    }

    // === messages ===

    fn on_internal(&mut self, msg: Internal) {
        let now = Instant::now();
        self.notice_stall(now);
        match msg {
            Internal::Answer {
                peer,
                epoch,
                at,
                result,
            } => {
                let Some(p) = self.peers.get_mut(peer) else {
                    return;
                };
                match result {
                    Ok(r) => {
                        self.ctx.peer_table.mark_seen(peer, at);
                        p.down = r.down;
                        p.answered_at = Some(at);
                        p.answered_epoch = p.answered_epoch.max(epoch);
                        if r.leader.is_some() || r.leader_epoch >= p.leader_epoch {
                            p.leader = r.leader;
                            p.leader_epoch = r.leader_epoch;
                        }
                        let _ = epoch;
                        let tilt = self.ctx.tilt.active(now);
                        self.update_odown(now, tilt);
                        self.drive_election(now, tilt);
                    }
                    Err(e) => {
                        tracing::debug!(group = %self.cfg.name, peer = %self.ctx.peers[peer].addr(), error = %e, "peer did not answer");
                    }
                }
            }
            Internal::ElectionTimer => {
                let tilt = self.ctx.tilt.active(now);
                let ready = self.election_delay_until.is_some()
                    && self.election.is_none()
                    && self.failover.is_none()
                    && !tilt
                    && self.odown_since.is_some()
                    && now >= self.next_attempt;
                self.election_delay_until = None;
                if ready {
                    self.start_election(now, Kind::Unplanned, None, None);
                }
            }
            Internal::Machine(epoch, input) => {
                if input == Input::Promoted(Ok(())) {
                    self.ctx
                        .maybe_crash(crate::daemon::CRASH_AFTER_PROMOTION, "after the promotion");
                }
                if self
                    .failover
                    .as_ref()
                    .is_some_and(|r| r.machine.epoch == epoch)
                {
                    self.machine_input(now, input);
                }
            }
            Internal::PeerConfigChecked { from, group, role } => {
                if group.config_epoch <= self.config_epoch {
                    return;
                }
                match role {
                    Ok(Role::Master) => self.adopt_from_peer(&from, group),
                    Ok(other) => tracing::warn!(
                        group = %self.cfg.name, peer = %from, epoch = group.config_epoch,
                        master = %group.master, role = ?other,
                        "a peer announces a master that does not report role:master; not adopting"
                    ),
                    Err(e) => tracing::info!(
                        group = %self.cfg.name, peer = %from, epoch = group.config_epoch,
                        master = %group.master, error = %e,
                        "cannot confirm the master a peer announces; will retry"
                    ),
                }
            }
            Internal::Demoted(addr, r) => match r {
                Ok(()) => {
                    metrics::counter!(m::DEMOTIONS, "group" => self.cfg.name.clone()).increment(1);
                    self.refresh_info(&addr);
                }
                Err(e) => {
                    tracing::warn!(group = %self.cfg.name, instance = %addr, error = %e, "demotion failed; will retry");
                }
            },
        }
    }

    fn on_msg(&mut self, msg: GroupMsg) {
        let now = Instant::now();
        self.notice_stall(now);
        match msg {
            GroupMsg::IsDown { query, reply } => {
                let _ = reply.send(self.answer_is_down(now, query));
            }
            GroupMsg::PeerConfig { from, group } => {
                if group.config_epoch <= self.config_epoch {
                    return;
                }
                if group.master == self.master {
                    self.adopt_from_peer(&from, group);
                    return;
                }
                // A peer's word alone never moves the master: the instance
                // it names must itself say it is a master. A peer that lies
                // about an epoch (or a corrupt hello) changes nothing.
                let ops = self.ops.clone();
                let tx = self.internal_tx.clone();
                tokio::spawn(async move {
                    let role = ops
                        .info(&group.master)
                        .await
                        .map(|i| i.role)
                        .map_err(|e| e.to_string());
                    let _ = tx
                        .send(Internal::PeerConfigChecked { from, group, role })
                        .await;
                });
            }
            GroupMsg::Switchover { to, reply } => {
                if self.failover.is_some() || self.election.is_some() {
                    let _ = reply.send(Err("INPROG Failover already in progress".into()));
                    return;
                }
                if self.master_sdown() {
                    let _ = reply.send(Err(
                        "ERR the master is down: a switchover needs a live master (an automatic failover will handle it)".into(),
                    ));
                    return;
                }
                self.start_election(now, Kind::Switchover, to, Some(reply));
            }
            GroupMsg::Reset => {
                let master = self.master.clone();
                self.instances.retain(|a, _| *a == master);
                for p in self.peers.iter_mut() {
                    *p = PeerState::default();
                }
                self.ctx.events.emit(
                    "+reset-master",
                    master_details(&self.cfg.name, &self.master),
                );
                self.refresh_info(&master);
            }
        }
    }

    /// Adopt a newer config a peer announced (already checked).
    fn adopt_from_peer(&mut self, from: &str, group: HelloGroup) {
        tracing::info!(group = %self.cfg.name, from = %from, epoch = group.config_epoch, master = %group.master, "adopting a newer config from a peer");
        if let Some(run) = self.failover.take() {
            tracing::warn!(group = %self.cfg.name, epoch = run.machine.epoch, "a newer config exists; abandoning this failover");
        }
        if let Some(el) = self.election.take()
            && let Some(r) = el.switchover_reply
        {
            let _ = r.send(Err("INPROG a newer configuration was adopted".into()));
        }
        let old = self.master.clone();
        self.adopt_master(
            group.master,
            group.config_epoch,
            Reporter::Observer,
            Some(from),
        );
        let topology = self.topology(Reporter::Observer, self.replaced(old));
        let runner = self.discovery.clone();
        let deadline = self.cfg.failover_timeout;
        let name = self.cfg.name.clone();
        tokio::spawn(async move {
            if let Err(e) = runner.publish(topology, deadline).await {
                tracing::warn!(group = %name, error = %e, "publishing the adopted config failed");
            }
        });
    }

    fn answer_is_down(&mut self, now: Instant, q: IsDownQuery) -> Result<IsDownReply, String> {
        let tilt = self.ctx.tilt.active(now);
        let same_master = q.master == self.master;
        let down = !tilt && same_master && self.master_sdown();
        if let Some(candidate) = &q.candidate {
            // A candidate with a stale view of the group gets no vote: it
            // would promote a replica of a master that is not current.
            if same_master && q.config_epoch >= self.config_epoch {
                let vote = self
                    .ctx
                    .state
                    .vote(&self.cfg.name, q.epoch, candidate)
                    .map_err(|e| format!("ERR cannot persist the vote: {e}"))?;
                if vote.epoch == q.epoch
                    && vote.leader.as_deref() == Some(candidate.as_str())
                    && *candidate != self.ctx.id
                {
                    metrics::counter!(m::VOTES_GRANTED, "group" => self.cfg.name.clone())
                        .increment(1);
                    self.ctx
                        .events
                        .emit("+vote-for-leader", format!("{candidate} {}", q.epoch));
                    // Do not compete with the leader we voted for.
                    if let Some(el) = self.election.take()
                        && let Some(r) = el.switchover_reply
                    {
                        let _ = r.send(Err("INPROG another daemon leads the failover".into()));
                    }
                    self.schedule_retry(now);
                    if let Some(p) = q.promote.clone() {
                        self.intended = Some((q.epoch, p));
                    }
                }
                return Ok(IsDownReply {
                    down,
                    leader: vote.leader,
                    leader_epoch: vote.epoch,
                });
            }
        } else if q.epoch > 0
            && let Err(e) = self.ctx.state.observe_epoch(q.epoch)
        {
            tracing::debug!(error = %e, "cannot persist the observed epoch");
        }
        let rec = self.ctx.state.group(&self.cfg.name);
        Ok(IsDownReply {
            down,
            leader: rec.voted_for,
            leader_epoch: rec.vote_epoch,
        })
    }

    // === the published view ===

    fn publish_view(&self) {
        let now = Instant::now();
        let no_info = InfoSnapshot::default();
        let since = |t: Option<Instant>| t.map(|t| ms(now.saturating_duration_since(t)));
        let mut instances: Vec<InstanceView> = self
            .instances
            .values()
            .map(|i| {
                // Borrowed: cloning the whole snapshot per instance ten
                // times a second showed up in profiles.
                let info = i.info.as_ref().unwrap_or(&no_info);
                InstanceView {
                    addr: i.addr.clone(),
                    is_master: i.addr == self.master,
                    role: info.role,
                    flavour: info.flavour,
                    version: info.version.clone(),
                    run_id: info.run_id.clone(),
                    up: !i.sdown.is_down(),
                    sdown: i.sdown.is_down(),
                    sdown_ms: since(i.sdown.down_since()),
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
        let table = self.ctx.peer_table.snapshot();
        let ttl = self.answer_ttl();
        let peers = table
            .iter()
            .zip(self.peers.iter())
            .map(|(e, p)| PeerView {
                addr: e.addr.clone(),
                id: e.id.clone(),
                reachable: e
                    .last_seen
                    .is_some_and(|t| now.saturating_duration_since(t) <= HELLO_TTL),
                last_hello_ms: since(e.last_seen),
                sees_master_down: p.down
                    && p.answered_at
                        .is_some_and(|t| now.saturating_duration_since(t) <= ttl),
                voted_leader: p.leader.clone(),
                voted_epoch: p.leader_epoch,
                config_epoch: e
                    .hello
                    .as_ref()
                    .and_then(|h| h.groups.iter().find(|g| g.name == self.cfg.name))
                    .map(|g| g.config_epoch),
            })
            .collect();
        let rec = self.ctx.state.group(&self.cfg.name);
        let tilt = self.ctx.tilt.until().is_some_and(|u| now < u);
        let failover = if let Some(run) = &self.failover {
            Some(FailoverView {
                epoch: run.machine.epoch,
                kind: match run.machine.kind {
                    Kind::Unplanned => "failover".into(),
                    Kind::Switchover => "switchover".into(),
                },
                state: run.machine.phase().as_str().into(),
                candidate: Some(run.machine.candidate.clone()),
                started_ms: ms(now.saturating_duration_since(run.started)),
            })
        } else {
            self.election.as_ref().map(|el| FailoverView {
                epoch: el.epoch,
                kind: match el.kind {
                    Kind::Unplanned => "failover".into(),
                    Kind::Switchover => "switchover".into(),
                },
                state: "wait_start".into(),
                candidate: Some(el.candidate.clone()),
                started_ms: ms(now.saturating_duration_since(el.started)),
            })
        };
        let status = if tilt {
            "tilt"
        } else if failover.is_some() {
            "failover"
        } else if self.odown_since.is_some() {
            "odown"
        } else if self.master_sdown() {
            "sdown"
        } else {
            "ok"
        };
        let view = GroupView {
            name: self.cfg.name.clone(),
            master: self.master.clone(),
            config_epoch: self.config_epoch,
            quorum: self.cfg.quorum,
            daemons: self.ctx.daemons(),
            down_after_ms: ms(self.cfg.down_after),
            failover_timeout_ms: ms(self.cfg.failover_timeout),
            parallel_syncs: self.cfg.parallel_syncs,
            flush_on_failover: self.cfg.flush_on_failover,
            status: status.into(),
            reason: self.reason.clone(),
            master_sdown: self.master_sdown(),
            master_odown: self.odown_since.is_some(),
            odown_ms: since(self.odown_since),
            down_votes: self.down_votes(now),
            voted_leader: rec.voted_for,
            voted_epoch: rec.vote_epoch,
            failover,
            last_failover: self.last_failover.clone(),
            instances,
            peers,
            discovery: self.discovery.status(),
            recorded: self.recorders.iter().flat_map(|r| r.history()).collect(),
        };
        self.view_tx.send_replace(Arc::new(view));
    }
}

/// Build this daemon's hello from the groups' views.
pub fn hello_groups(groups: &HashMap<String, GroupHandle>) -> Vec<HelloGroup> {
    let mut out: Vec<HelloGroup> = groups
        .values()
        .map(|h| {
            let v = h.view.borrow();
            HelloGroup {
                name: v.name.clone(),
                master: v.master.clone(),
                config_epoch: v.config_epoch,
                sdown: v.master_sdown,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The group task's tick: half the PING period, 10–100 ms.
fn tick_period(cfg: &GroupConfig) -> Duration {
    (cfg.ping_period() / 2).clamp(Duration::from_millis(10), Duration::from_millis(100))
}

/// A pause longer than this between two runs of the group task is a stall
/// of the process, not scheduling noise.
fn stall_threshold(tick: Duration, down_after: Duration) -> Duration {
    (tick * 4).max(Duration::from_secs(1)).max(down_after / 2)
}

/// When the group task last ran anything (a tick or an event).
#[derive(Debug)]
struct RunClock {
    last: Instant,
    threshold: Duration,
}

impl RunClock {
    fn new(now: Instant, threshold: Duration) -> RunClock {
        RunClock {
            last: now,
            threshold,
        }
    }

    /// The task runs at `now`: the length of the pause before, when it was
    /// a stall.
    fn ran(&mut self, now: Instant) -> Option<Duration> {
        let gap = now.saturating_duration_since(self.last);
        self.last = self.last.max(now);
        (gap > self.threshold).then_some(gap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_stall_is_noticed_once_by_whatever_runs_first() {
        let start = Instant::now();
        let mut clock = RunClock::new(
            start,
            stall_threshold(Duration::from_millis(100), Duration::from_secs(1)),
        );
        // Events and ticks a few ms to 900 ms apart: scheduling, not a stall.
        for step in [5u64, 100, 900, 40] {
            tokio::time::advance(Duration::from_millis(step)).await;
            assert_eq!(clock.ran(Instant::now()), None, "after {step} ms");
        }
        // The process was stopped for 3 s; the first thing to run (here a
        // probe's reply, before any tick) notices it, and only it.
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(clock.ran(Instant::now()), Some(Duration::from_secs(3)));
        assert_eq!(clock.ran(Instant::now()), None);
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(clock.ran(Instant::now()), None);
    }

    #[test]
    fn the_stall_threshold_grows_with_down_after() {
        let tick = Duration::from_millis(100);
        assert_eq!(
            stall_threshold(tick, Duration::from_secs(1)),
            Duration::from_secs(1)
        );
        assert_eq!(
            stall_threshold(tick, Duration::from_secs(30)),
            Duration::from_secs(15)
        );
    }

    #[test]
    fn ms_saturates() {
        assert_eq!(ms(Duration::from_millis(5)), 5);
        assert_eq!(ms(Duration::MAX), u64::MAX);
    }
}

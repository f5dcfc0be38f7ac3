//! Step 1, observation: the group's instances, what their probes report,
//! SDOWN per instance, Sentinel's `role:slave` rule for the master, and
//! the stall detector that forgives silences the process itself caused.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::Group;
use super::effects::Work;
use crate::addr::Addr;
use crate::events::{Detail, EventKind};
use crate::failover::ops::ScriptKill;
use crate::metrics as m;
use crate::probe::info::{InfoSnapshot, ReplicaEntry};
use crate::probe::sdown::{Reason, Sdown, Transition};
use crate::probe::{self, Failure, ProbeEvent, ProbeHandle, ProbeSettings, Role, reboot};
use crate::resp::RespError;

/// One data server of the group, as this daemon sees it.
pub(super) struct Instance {
    pub(super) addr: Addr,
    /// Its `server` metric label, shared by its series.
    pub(super) server: metrics::SharedString,
    pub(super) probe: Option<ProbeHandle>,
    pub(super) sdown: Sdown,
    pub(super) connected: bool,
    pub(super) connected_at: Option<Instant>,
    pub(super) last_reply: Option<Instant>,
    pub(super) last_error: Option<String>,
    pub(super) info: Option<Box<InfoSnapshot>>,
    pub(super) info_at: Option<Instant>,
    /// The IP its name resolved to when it was last reached.
    pub(super) ip: Option<IpAddr>,
    pub(super) role_changed_at: Option<Instant>,
    /// When it turned from replica to master on one connection (a
    /// promotion: a leader's, or by hand), until it reports another role.
    pub(super) promoted_in_place_at: Option<Instant>,
    /// When it last left SDOWN: an INFO read before says nothing of the
    /// process that answers now (it may have restarted while its replies
    /// were lost, and the connection not yet seen reset).
    pub(super) up_again_at: Option<Instant>,
    pub(super) last_action: Option<Instant>,
    pub(super) wrong_master_since: Option<Instant>,
    /// Its last reply was `-BUSY`: alive, but running a script.
    pub(super) busy: bool,
    /// The `SCRIPT KILL` sent while it was SDOWN and busy.
    pub(super) script_kill: Option<KillAttempt>,
    /// The INFO period its probe was given: [`INFO_SLOW`], [`INFO_FAST`],
    /// or the PING period while it syncs from the master.
    pub(super) info_period: Duration,
    /// Its probe reads only `INFO replication` between full reads
    /// [`INFO_SLOW`] apart (a healthy master).
    pub(super) info_light: bool,
    /// Its `picket_instance_up` gauge, looked up once.
    up_gauge: metrics::Gauge,
    /// Its INFO-age gauge, registered at its first INFO.
    info_age_gauge: Option<metrics::Gauge>,
    /// It was the master, or its last INFO said `role:master`: it is never
    /// forgotten for being down (if it came back it must be demoted).
    pub(super) last_seen_master: bool,
    /// When this daemon last saw it restart (`+reboot`).
    pub(super) rebooted_at: Option<Instant>,
    /// Its last INFO (and when it was read) from before a failover made
    /// it the old master: the view forgets what it reported, the restart
    /// detection compares with it.
    pub(super) identity_before: Option<(Box<InfoSnapshot>, Instant)>,
    /// A restarted master still loading its data: judged against its
    /// replicas once it is done.
    pub(super) reboot_unjudged: bool,
    /// The replication history it served before its last restart: a
    /// restart in the same history (its data reloaded) is not a new one
    /// that replicas copy from, and a stray master that continued it
    /// holds what the restarted master is judged against.
    pub(super) history_before_reboot: Option<String>,
    /// Whether its probe holds full copies on reconnecting (the group's
    /// master, Redis or Valkey; see `probe::hold`).
    pub(super) sync_hold_armed: bool,
    /// A hold its probe put on at a reconnect, until released.
    pub(super) sync_hold: Option<SyncHold>,
}

/// A hold of full copies from an instance (`probe::hold`), put on by its
/// probe at a reconnect and released by the group.
#[derive(Debug, Clone)]
pub(super) struct SyncHold {
    /// When it was put on.
    pub(super) at: Instant,
    /// When the server lets the copies go on its own (and the group sets
    /// its settings back whatever happened).
    pub(super) until: Instant,
    /// The server's own settings (None: another daemon's hold was found,
    /// that daemon sets them back).
    pub(super) restore: Option<Vec<(String, String)>>,
    /// How many times setting them back was refused (a timeout while
    /// the server was paused, a lost connection): each is retried at the
    /// next INFO, up to [`SYNC_HOLD_RELEASE_TRIES`].
    pub(super) refused: u32,
}

/// How many times a sync hold's release is tried: the settings it leaves
/// behind make every full copy from that server wait the hold's delay.
pub(super) const SYNC_HOLD_RELEASE_TRIES: u32 = 5;

/// The INFO period of a master, of a replica out of place, and of every
/// instance around a failover (Sentinel: 1 s during a failover).
pub(super) const INFO_FAST: Duration = Duration::from_secs(1);

/// The INFO period of a healthy replica while nothing happens (Sentinel's
/// 10 s). Its PINGs go on at the PING period, so that its SDOWN is seen as
/// soon as before; what INFO adds (offset, link, priority) matters only
/// when a failover nears, and then every replica is read at once.
pub(super) const INFO_SLOW: Duration = Duration::from_secs(10);

/// How long after a change of master every instance stays at
/// [`INFO_FAST`]: the replicas are re-pointed and resynchronise then.
const AFTER_CHANGE: Duration = Duration::from_secs(10);

/// One `SCRIPT KILL` (Sentinel's `script_kill_sent`).
#[derive(Debug, Clone, Copy)]
pub(super) struct KillAttempt {
    pub(super) sent_at: Instant,
    /// None while it is under way; Err when it could not be sent.
    pub(super) outcome: Option<Result<ScriptKill, ()>>,
}

/// Whether a replica whose INFO is `info` names `target` (reached at
/// `ip`) as its master: as a data server names it, or on Dragonfly by the
/// group's `admin_port`, over which picket makes replicas replicate
/// (`InstanceOps::repoint`), so that their INFO gives that port.
pub(super) fn names_master(
    info: &InfoSnapshot,
    target: &Addr,
    ip: Option<IpAddr>,
    admin_port: Option<u16>,
) -> bool {
    let host = info.master_host.as_deref();
    target.is_reported_as(ip, host, info.master_port)
        || (info.flavour == crate::probe::Flavour::Dragonfly
            && admin_port.is_some_and(|p| {
                info.master_port == Some(p) && target.is_reported_as(ip, host, Some(target.port))
            }))
}

/// The replicas `master`'s fresh INFO lists, if it is a master that shows
/// its whole list (Dragonfly's `--managed_service_info` hides it).
pub(super) fn master_list<'a>(
    instances: &'a BTreeMap<Addr, Box<Instance>>,
    master: &Addr,
) -> Option<&'a [ReplicaEntry]> {
    instances
        .get(master)
        .filter(|m| m.fresh())
        .and_then(|m| m.info.as_ref())
        .filter(|i| {
            i.role == Role::Master
                && i.connected_replicas
                    .is_none_or(|n| n as usize <= i.replicas.len())
        })
        .map(|i| i.replicas.as_slice())
}

impl Instance {
    /// Whether `list` (a master's replicas) has this instance online.
    pub(super) fn listed_online(&self, list: &[ReplicaEntry]) -> bool {
        list.iter().any(|r| {
            // Older Dragonfly says `stable_sync` for online.
            matches!(r.state.as_str(), "online" | "stable_sync")
                && self.addr.is_reported_as(self.ip, Some(&r.ip), Some(r.port))
        })
    }

    /// What the view shows of the instance, besides ages and offsets: a
    /// probe report that changes none of it does not republish the view.
    fn shown(&self) -> impl PartialEq + use<> {
        let info = self.info.as_ref();
        (
            self.connected,
            self.sdown.is_down(),
            self.busy,
            self.last_error.clone(),
            info.map(|i| {
                (
                    i.role,
                    i.master_link_up,
                    i.master_host.clone(),
                    i.master_port,
                    i.loading,
                    i.priority,
                )
            }),
        )
    }

    /// A busy instance is not down for the quorum until a `SCRIPT KILL`
    /// has had `down_after` to work (Sentinel kills the script before it
    /// fails a live server over; with `flush_on_failover` the new master
    /// would start empty). A script that has written cannot be killed:
    /// then, as when the kill could not be sent, it is down as before.
    pub(super) fn busy_hold(&self, now: Instant, down_after: Duration) -> bool {
        if !self.busy {
            return false;
        }
        match self.script_kill {
            None => true,
            Some(KillAttempt {
                outcome: Some(Ok(ScriptKill::Unkillable) | Err(())),
                ..
            }) => false,
            Some(k) => now < k.sent_at + down_after,
        }
    }

    /// A replica where it belongs: up, following the group's master with
    /// its link up, not loading or syncing. Only such a replica's INFO is
    /// read slowly.
    fn settled(&self) -> bool {
        self.connected
            && !self.sdown.is_down()
            && !self.busy
            && self.wrong_master_since.is_none()
            && self.info.as_ref().is_some_and(|i| {
                i.role == Role::Replica && i.master_link_up && !i.loading && !i.sync_in_progress
            })
    }

    /// Reachable and read on its current connection: what it says now,
    /// never a remembered reply of an instance that has since died.
    pub(super) fn fresh(&self) -> bool {
        self.connected
            && !self.sdown.is_down()
            && self
                .info_at
                .is_some_and(|t| Some(t) >= self.connected_at && Some(t) >= self.up_again_at)
    }
}

impl Group {
    /// The known instance a server-reported `addr` means: itself, or the
    /// instance whose name resolved to that IP (one server, one identity:
    /// a master lists its replicas by IP whatever name they were
    /// configured under).
    pub(super) fn identify(&self, addr: &Addr) -> Addr {
        if self.instances.contains_key(addr) {
            return addr.clone();
        }
        if let Some(known) = self.aliases.get(addr) {
            return known.clone();
        }
        addr.ip()
            .and_then(|ip| self.named_at(ip, addr.port, addr))
            .unwrap_or_else(|| addr.clone())
    }

    /// The instance known by a name (not `except`) that last resolved to
    /// `ip`, on `port`.
    fn named_at(&self, ip: IpAddr, port: u16, except: &Addr) -> Option<Addr> {
        self.instances
            .values()
            .find(|i| {
                i.addr != *except
                    && i.addr.port == port
                    && i.addr.ip().is_none()
                    && i.ip == Some(ip)
            })
            .map(|i| i.addr.clone())
    }

    /// The IP `addr`'s name resolved to when it was last reached (its own
    /// host when that is an IP).
    pub(super) fn ip_of(&self, addr: &Addr) -> Option<IpAddr> {
        self.instances
            .get(addr)
            .and_then(|i| i.ip)
            .or_else(|| addr.ip())
    }

    /// How to name `addr` to a data server (`REPLICAOF`): its IP when it
    /// is known by a name, unless `announce_hostnames` (Sentinel's
    /// default: servers are told IPs, so what they report matches what
    /// the master lists).
    pub(super) fn wire(&self, addr: &Addr) -> Addr {
        addr.announced(self.ip_of(addr), self.cfg.announce_hostnames)
    }

    /// How the master's INFO lists `addr` among its replicas (what
    /// `FAILOVER TO` must name), or [`Group::wire`] when it does not.
    pub(super) fn listed_by_master(&self, addr: &Addr) -> Addr {
        let ip = self.ip_of(addr);
        self.instances
            .get(&self.master)
            .and_then(|m| m.info.as_ref())
            .and_then(|info| {
                info.replicas
                    .iter()
                    .find(|r| addr.is_reported_as(ip, Some(&r.ip), Some(r.port)))
            })
            .map_or_else(|| self.wire(addr), |r| Addr::new(r.ip.clone(), r.port))
    }

    /// The named instance `addr` now resolves to `ip`. An instance known by
    /// that IP (listed by the master before the name was first reached) is
    /// the same server: it is forgotten, unless it is the master itself.
    /// Another name already known at that IP is the same server too: the
    /// name known first stays, `addr` becomes its alias.
    fn merge_resolved(&mut self, addr: &Addr, ip: IpAddr) {
        if addr.ip().is_some() {
            return;
        }
        let twin = Addr::new(ip.to_string(), addr.port);
        if twin != self.master && self.instances.contains_key(&twin) {
            tracing::info!(group = %self.cfg.name, instance = %addr, %twin, "one server under two addresses: keeping its name");
            self.forget_instance(&twin);
        }
        if let Some(known) = self.named_at(ip, addr.port, addr)
            && *addr != self.master
        {
            tracing::info!(group = %self.cfg.name, instance = %addr, %known, "one server under two names: keeping the first");
            self.forget_instance(addr);
            self.aliases.insert(addr.clone(), known);
        }
    }

    /// Stop probing `addr` and drop what is known of it.
    pub(super) fn forget_instance(&mut self, addr: &Addr) {
        if let Some(i) = self.instances.remove(addr) {
            if let Some(p) = i.probe {
                p.stop();
            }
            // Its series leave /metrics: a forgotten server must not keep
            // an alert on "instance down" firing.
            m::forget_instance_series(&self.cfg.name, &i.server);
        }
        self.aliases
            .retain(|alias, known| alias != addr && known != addr);
        self.dirty = true;
    }

    /// Start probing `addr` if it is not known yet.
    pub(super) fn ensure_instance(&mut self, addr: &Addr) {
        if self.instances.contains_key(addr) {
            return;
        }
        let ping = self.cfg.ping_period();
        let server = m::label(&addr.to_string());
        m::revive_instance_series(&self.cfg.name, &server);
        let settings = ProbeSettings {
            group: self.label.clone(),
            addr: addr.clone(),
            server: server.clone(),
            ping_period: ping,
            info_period: INFO_FAST.max(ping),
            ping_timeout: self.cfg.down_after.max(Duration::from_millis(100)),
            client: self.client.clone(),
            reconnect_fast: reconnect_fast(self.cfg.down_after_refused()),
            // Long enough to see a restarted server before its replicas
            // reconnect to it (Redis retries once a second).
            reconnect_fast_for: (self.cfg.down_after + self.cfg.down_after_refused())
                .max(Duration::from_secs(2)),
        };
        let probe = self.effects.start_probe(settings);
        let now = self.now;
        // Up until SDOWN says otherwise, as in the view; without this the
        // gauge would only appear at the first +sdown.
        let up_gauge = metrics::gauge!(m::INSTANCE_UP, "group" => self.label.clone(), m::SERVER_LABEL => server.clone());
        up_gauge.set(1.0);
        self.instances.insert(
            addr.clone(),
            Box::new(Instance {
                addr: addr.clone(),
                server,
                probe,
                sdown: Sdown::new(self.cfg.down_after, self.cfg.down_after_refused(), now),
                connected: false,
                connected_at: None,
                last_reply: None,
                last_error: None,
                info: None,
                info_at: None,
                ip: addr.ip(),
                role_changed_at: None,
                promoted_in_place_at: None,
                up_again_at: None,
                last_action: None,
                wrong_master_since: None,
                busy: false,
                script_kill: None,
                info_period: INFO_FAST.max(ping),
                info_light: false,
                up_gauge,
                info_age_gauge: None,
                last_seen_master: *addr == self.master,
                rebooted_at: None,
                identity_before: None,
                reboot_unjudged: false,
                history_before_reboot: None,
                sync_hold_armed: false,
                sync_hold: None,
            }),
        );
        if *addr != self.master {
            self.emit(EventKind::Slave, &Detail::Replica(addr.clone()));
        }
        self.dirty = true;
    }

    /// Whether every instance's INFO is wanted every [`INFO_FAST`]: a
    /// failover, an election or a switchover under way or just over, the
    /// master down, silent for half of `down_after`, or reporting
    /// `role:slave`. Replica selection then finds fresh INFO everywhere
    /// (it refuses INFO older than a few PING periods).
    pub(super) fn info_watch(&self, now: Instant) -> bool {
        self.failover.is_some()
            || self.pending_switchover.is_some()
            || self.election.busy()
            || self.election.odown_since().is_some()
            || self.master_role_down
            || now.saturating_duration_since(self.master_since) < AFTER_CHANGE
            || self.instances.get(&self.master).is_none_or(|i| {
                !i.connected
                    || i.sdown.is_down()
                    || now.saturating_duration_since(i.sdown.last_valid()) >= self.suspect_after()
            })
    }

    /// A master silent this long makes every replica's INFO wanted.
    pub(super) fn suspect_after(&self) -> Duration {
        self.cfg.down_after / 2
    }

    /// When the master becomes suspect if it stays silent (a wake-up of
    /// the task, so that the replicas are read before SDOWN is due).
    pub(super) fn suspect_deadline(&self, now: Instant) -> Option<Instant> {
        let at = self.instances.get(&self.master)?.sdown.last_valid() + self.suspect_after();
        (at > now).then_some(at)
    }

    /// Give each probe its INFO period: [`INFO_FAST`] for the master, for
    /// replicas out of place and for everything while [`Group::info_watch`]
    /// holds; [`INFO_SLOW`] for the other replicas. A probe whose INFO is
    /// older than its new period reads it at once.
    pub(super) fn update_info_cadence(&mut self, now: Instant) {
        let watch = self.info_watch(now);
        let ping = self.cfg.ping_period();
        let Group {
            instances, master, ..
        } = self;
        // What the master lists as online, from its own INFO (read every
        // INFO_FAST): a replica it dropped or lists in another state has
        // lost its link, whatever the replica's last INFO said ten
        // seconds ago, and is read again at once.
        let listed = master_list(instances, master);
        let mut changed = Vec::new();
        for inst in instances.values() {
            let is_master = inst.addr == *master;
            let online = is_master || listed.is_none_or(|rs| inst.listed_online(rs));
            let fast = watch || is_master || !online || !inst.settled();
            // A replica whose link is down is syncing (a member just made
            // a replica, a replica re-pointed): read at the PING period, so
            // that the moment its link comes up (and the master is read
            // again, see `on_probe`) is seen within a PING period, not an
            // INFO period: it is published as a replica only then.
            let syncing = !is_master
                && inst
                    .info
                    .as_ref()
                    .is_some_and(|i| i.role == Role::Replica && !i.master_link_up);
            let period = if syncing {
                ping
            } else if fast {
                INFO_FAST.max(ping)
            } else {
                INFO_SLOW.max(ping)
            };
            // A healthy master's replication state is read every second,
            // the rest of its INFO at the slow period: nothing else it
            // tells changes while it serves (a restart is a new
            // connection, which is read in full). Anything that makes
            // the group watch reads every INFO in full.
            let light = is_master && !watch;
            if period != inst.info_period || light != inst.info_light {
                changed.push((inst.addr.clone(), period, light));
            }
        }
        for (addr, period, light) in changed {
            let Some(inst) = instances.get_mut(&addr) else {
                continue;
            };
            if let Some(p) = inst.probe.as_ref() {
                if period != inst.info_period {
                    p.set_info_period(period);
                }
                if light != inst.info_light {
                    p.set_full_info_every(light.then_some(INFO_SLOW));
                }
            }
            inst.info_period = period;
            inst.info_light = light;
        }
    }

    /// Every instance but the master.
    pub(super) fn replica_addrs(&self) -> Vec<Addr> {
        self.instances
            .keys()
            .filter(|a| **a != self.master)
            .cloned()
            .collect()
    }

    /// Ask every replica's probe for an INFO now (no list collected: the
    /// probes are asked in place).
    pub(super) fn refresh_replicas_info(&self) {
        for inst in self.instances.values().filter(|i| i.addr != self.master) {
            if let Some(p) = inst.probe.as_ref() {
                p.refresh_info();
            }
        }
    }

    /// Ask `addr`'s probe for an INFO now.
    pub(super) fn refresh_info(&self, addr: &Addr) {
        if let Some(p) = self.instances.get(addr).and_then(|i| i.probe.as_ref()) {
            p.refresh_info();
        }
    }

    /// This daemon sees the master down: SDOWN (and not a busy script
    /// being killed, [`Instance::busy_hold`]), or `role:slave` too long.
    pub(super) fn master_sdown(&self) -> bool {
        let now = self.now;
        self.master_role_down
            || self
                .instances
                .get(&self.master)
                .is_some_and(|i| i.sdown.is_down() && !i.busy_hold(now, self.cfg.down_after))
    }

    /// Take in the probes' stamps of valid replies: a PING that found an
    /// instance as the group last heard of it is not reported, only
    /// stamped (see `probe::Control::last_valid`). An instance that was
    /// declared SDOWN while such a reply was late is up again here.
    pub(super) fn sync_liveness(&mut self) {
        let mut up = Vec::new();
        for inst in self.instances.values_mut() {
            let Some(t) = inst.probe.as_ref().and_then(ProbeHandle::last_valid) else {
                continue;
            };
            if inst.last_reply.is_none_or(|r| r < t) {
                inst.last_reply = Some(t);
            }
            if t > inst.sdown.last_valid()
                && let Some(tr) = inst.sdown.on_valid_reply(t)
            {
                up.push((inst.addr.clone(), tr));
            }
        }
        for (addr, tr) in up {
            self.dirty = true;
            self.on_sdown_transition(&addr, tr);
        }
    }

    /// Take in one probe report; whether it changed anything (a PING that
    /// found the instance as it was, the most frequent report by far,
    /// changes nothing and costs only the look-up).
    pub(super) fn on_probe(&mut self, ev: ProbeEvent) -> bool {
        self.notice_stall(self.now);
        let addr = ev.addr().clone();
        let is_master = addr == self.master;
        let group = &self.label;
        let plain_ping = matches!(ev, ProbeEvent::Ping { .. });
        let Some(inst) = self.instances.get_mut(&addr) else {
            return false;
        };
        // A PING can change only these (and the error text, when it
        // failed); comparing them spares two copies of the shown strings.
        let quiet = |i: &Instance| {
            (
                i.connected,
                i.busy,
                i.sdown.is_down(),
                i.last_error.is_none(),
            )
        };
        let before_ping = quiet(inst);
        let before = (!plain_ping).then(|| inst.shown());
        let mut transition = None;
        let mut new_replicas = Vec::new();
        let mut kill = false;
        let mut resolved = None;
        let mut reboot = None;
        let mut reread_replicas = false;
        let mut link_came_up = false;
        match ev {
            ProbeEvent::Ping {
                at,
                valid,
                error,
                busy,
                ..
            } => {
                if !inst.connected {
                    inst.connected_at = Some(at);
                }
                inst.connected = true;
                inst.last_reply = Some(at);
                inst.busy = busy;
                if valid {
                    transition = inst.sdown.on_valid_reply(at);
                    inst.last_error = None;
                    inst.script_kill = None;
                } else {
                    // It answered: its process is there.
                    inst.sdown.on_other_failure();
                    inst.last_error = error;
                }
                // Sentinel's rule: once it is SDOWN and answers -BUSY, one
                // SCRIPT KILL.
                if busy && inst.sdown.is_down() && inst.script_kill.is_none() {
                    inst.script_kill = Some(KillAttempt {
                        sent_at: at,
                        outcome: None,
                    });
                    kill = true;
                }
            }
            ProbeEvent::SyncHeld { at, restore, .. } => {
                metrics::counter!(m::SYNC_HOLDS, "group" => group.clone(), "result" => "held")
                    .increment(1);
                tracing::info!(group = %group, instance = %addr, own_settings = restore.is_some(), "reconnected to the master: full copies from it held until it is judged");
                let until = at + sync_hold(self.cfg.down_after) + Duration::from_secs(1);
                // A hold found on (another daemon's) is kept to be set back
                // only if this daemon holds the server's own settings.
                let restore = restore.or_else(|| inst.sync_hold.take().and_then(|h| h.restore));
                inst.sync_hold = Some(SyncHold {
                    at,
                    until,
                    restore,
                    refused: 0,
                });
                return false;
            }
            ProbeEvent::Unreachable {
                error, cause, at, ..
            } => {
                if inst.last_error.as_deref() != Some(error.as_str()) {
                    tracing::debug!(group = %group, instance = %addr, %error, "probe failed");
                }
                match cause {
                    Failure::Refused => transition = inst.sdown.on_refused(at),
                    Failure::Closed => {
                        inst.sdown.on_closed(at);
                        // The master's process may have died: what each
                        // replica holds now is what a failover, or a
                        // restarted master, is judged against.
                        reread_replicas = is_master;
                    }
                    Failure::Other => inst.sdown.on_other_failure(),
                }
                inst.connected = false;
                inst.busy = false;
                inst.last_error = Some(error);
            }
            ProbeEvent::Info { at, info, ip, .. } => {
                if ip.is_some() && inst.ip != ip {
                    resolved = ip;
                }
                inst.ip = ip.or(inst.ip);
                if !inst.connected {
                    inst.connected_at = Some(at);
                    inst.connected = true;
                }
                let old_role = inst.info.as_ref().map(|i| i.role);
                if old_role != Some(info.role) {
                    inst.role_changed_at = Some(at);
                    let same_connection =
                        inst.info_at.is_some_and(|t| Some(t) >= inst.connected_at);
                    inst.promoted_in_place_at = (old_role == Some(Role::Replica)
                        && info.role == Role::Master
                        && same_connection)
                        .then_some(at);
                }
                // A new process since the last INFO (a full read: every
                // new connection's first INFO is one).
                let before = match (inst.info.as_deref(), inst.info_at) {
                    (Some(i), Some(t)) => Some((i, t)),
                    _ => inst.identity_before.as_ref().map(|(i, t)| (&**i, *t)),
                };
                if let Some((before, before_at)) = before
                    && let Some(why) =
                        reboot::restarted(before, &info, at.saturating_duration_since(before_at))
                {
                    inst.rebooted_at = Some(at);
                    inst.reboot_unjudged = is_master;
                    inst.history_before_reboot = before.replid.clone();
                    reboot = Some(why);
                }
                inst.last_seen_master = info.role == Role::Master || is_master;
                if is_master && info.role == Role::Master {
                    for r in &info.replicas {
                        new_replicas.push(Addr::new(r.ip.clone(), r.port));
                    }
                }
                // Set on change only: two registry look-ups per INFO
                // were a measurable share of the CPU.
                if old_role != Some(info.role) {
                    metrics::gauge!(m::INSTANCE_ROLE, "group" => group.clone(), m::SERVER_LABEL => inst.server.clone(), "role" => "master")
                        .set(if info.role == Role::Master { 1.0 } else { 0.0 });
                    metrics::gauge!(m::INSTANCE_ROLE, "group" => group.clone(), m::SERVER_LABEL => inst.server.clone(), "role" => "replica")
                        .set(if info.role == Role::Replica { 1.0 } else { 0.0 });
                }
                // A replica whose link has just come up (its sync is
                // done): the master's list says whether it is online, and
                // is read at once rather than at its next period.
                link_came_up = !is_master
                    && info.role == Role::Replica
                    && info.master_link_up
                    && inst
                        .info
                        .as_ref()
                        .is_some_and(|i| i.role != Role::Replica || !i.master_link_up);
                inst.info = Some(info);
                inst.info_at = Some(at);
                inst.identity_before = None;
            }
        }
        let shown_changed = match before {
            Some(b) => inst.shown() != b,
            None => quiet(inst) != before_ping || inst.last_error.is_some(),
        };
        if shown_changed {
            self.dirty = true;
        }
        if plain_ping && !shown_changed && transition.is_none() && !kill {
            return false;
        }
        if reread_replicas {
            self.refresh_replicas_info();
        }
        if link_came_up {
            self.refresh_info(&self.master);
        }
        if let Some(why) = reboot {
            self.on_reboot(&addr, &why);
        }
        if let Some(t) = transition {
            self.on_sdown_transition(&addr, t);
        }
        // The master's restart may wait for a replica's first INFO.
        let master = self.master.clone();
        self.judge_reboot(&master, self.now);
        if let Some(p) = self.unjudged_promotion() {
            self.judge_reboot(&p, self.now);
        }
        // A new master's process on record at its first read, not at the
        // next second's tick: restarted empty within that second, and this
        // daemon restarted too, nothing on record told the new process
        // from the old (the simulation with every fault, seed 21783).
        if addr == master {
            self.persist_master_identity();
        }
        self.review_sync_hold(&addr, self.now);
        if kill {
            self.kill_script(&addr);
        }
        if let Some(ip) = resolved {
            self.merge_resolved(&addr, ip);
        }
        for r in new_replicas {
            let r = self.identify(&r);
            if self.may_add_listed(&r) {
                self.ensure_instance(&r);
            }
        }
        // React at once to what INFO showed (a returning old master must be
        // demoted within the second it answers).
        self.check_topology(self.now);
        self.feed_reconfiguration(&addr);
        true
    }

    fn kill_script(&mut self, addr: &Addr) {
        let detail = if *addr == self.master {
            Detail::Master
        } else {
            Detail::Replica(addr.clone())
        };
        self.emit(EventKind::ScriptKill, &detail);
        self.effects.run(Work::ScriptKill(addr.clone()));
    }

    pub(super) fn on_script_killed(&mut self, addr: Addr, result: Result<ScriptKill, RespError>) {
        let Some(inst) = self.instances.get_mut(&addr) else {
            return;
        };
        let Some(k) = inst.script_kill.as_mut() else {
            return;
        };
        match &result {
            Ok(ScriptKill::Unkillable) => {
                tracing::warn!(group = %self.cfg.name, instance = %addr, "the busy script has written and cannot be killed; the instance counts as down")
            }
            Ok(outcome) => {
                tracing::info!(group = %self.cfg.name, instance = %addr, ?outcome, "SCRIPT KILL sent to a busy instance")
            }
            Err(e) => {
                tracing::warn!(group = %self.cfg.name, instance = %addr, error = %e, "SCRIPT KILL failed; the instance counts as down")
            }
        }
        k.outcome = Some(result.map_err(|_| ()));
    }

    /// `addr` restarted (`+reboot`, Sentinel's event for a new `run_id`).
    fn on_reboot(&mut self, addr: &Addr, why: &str) {
        let is_master = *addr == self.master;
        tracing::warn!(group = %self.cfg.name, instance = %addr, master = is_master, reason = %why, "the server restarted");
        let detail = if is_master {
            Detail::Master
        } else {
            Detail::Replica(addr.clone())
        };
        self.emit(EventKind::Reboot, &detail);
        if let Some(i) = self.instances.get(addr) {
            metrics::counter!(m::INSTANCE_REBOOTS, "group" => self.label.clone(), m::SERVER_LABEL => i.server.clone()).increment(1);
        }
        // The replica a leader is promoting in a newer epoch, back as a
        // master: a master by now for the daemons that have the leader's
        // config, and judged as one here (`judge_reboot`). To a daemon
        // still on the old config it was a replica that restarted, and
        // its replicas, re-pointed to it by the leader, copied it empty
        // (the simulation, seed 3865: the leader cut off 110 ms after its
        // publication).
        if !is_master
            && self.intended_promotion(self.now).as_ref() == Some(addr)
            && let Some(i) = self.instances.get_mut(addr)
            && i.info.as_ref().is_some_and(|x| x.role == Role::Master)
        {
            i.reboot_unjudged = true;
        }
        self.dirty = true;
    }

    /// The replica a leader is promoting, when it restarted and is still
    /// to be judged (see [`Group::on_reboot`]).
    fn unjudged_promotion(&self) -> Option<Addr> {
        self.intended_promotion(self.now)
            .filter(|p| *p != self.master)
            .filter(|p| self.instances.get(p).is_some_and(|i| i.reboot_unjudged))
    }

    /// A restarted master is judged against what its replicas held (see
    /// `probe::reboot`): one that holds less is SDOWN (`#reboot`) and, on
    /// Redis and Valkey, paused at once so that no replica takes a full
    /// copy of it before the quorum has failed it over. With
    /// `flush_on_failover` the group wants an empty master after a failure
    /// anyway: the restarted one stays, and its replicas follow it.
    fn judge_reboot(&mut self, addr: &Addr, now: Instant) {
        let Some(inst) = self.instances.get(addr) else {
            return;
        };
        if !inst.reboot_unjudged
            || (*addr != self.master && self.intended_promotion(now).as_ref() != Some(addr))
        {
            return;
        }
        let Some(info) = inst.info.as_deref() else {
            return;
        };
        if self.cfg.flush_on_failover {
            if let Some(i) = self.instances.get_mut(addr) {
                i.reboot_unjudged = false;
            }
            return;
        }
        // A server this daemon knows but has not read yet (it has just
        // started, from the servers in its state file; a replica loading
        // its data) is judged against once read, or once down, before the
        // master is kept: kept without it, a master that came back with
        // less than that replica holds was kept, and the replica copied it
        // (the simulation, seeds 909 and 912 with the network's faults:
        // every daemon restarted just after its vote). Behind a replica
        // read already, it is judged at once: waiting for a replica still
        // loading, the daemons let another take its full copy (the
        // simulation with every fault, seed 11764).
        let unread = self
            .instances
            .values()
            .any(|r| r.addr != *addr && r.info.is_none() && !r.sdown.is_down());
        // The replicas, and a master that serves the history the
        // restarted one served before (a replica promoted meanwhile, by a
        // leader whose config has not reached this daemon, or left a
        // master by a failover that stepped down): kept, the restarted
        // master would have it demoted to it as a stray and emptied (the
        // simulation, seed 1345 of `--ops --service`). Judged behind it,
        // the restarted master is failed over, and that master, a
        // candidate like any other, is chosen if it holds the most.
        // The replica a leader that has not published yet was promoting
        // continues that history too, whatever its replication id says:
        // Dragonfly draws a new one at a promotion and keeps no second
        // one. Left out, a daemon restarted after its vote kept the master
        // that had come back empty, and demoted that replica to it (the
        // simulation on Dragonfly, seeds 1884679 and 1885280).
        let history = inst.history_before_reboot.as_ref();
        let promoted = self.intended_promotion(now);
        let continues = |r: &Instance, i: &InfoSnapshot| {
            promoted.as_ref() == Some(&r.addr)
                || history
                    .is_some_and(|h| i.replid.as_ref() == Some(h) || i.replid2.as_ref() == Some(h))
        };
        let holdings: Vec<reboot::Holding> = self
            .instances
            .values()
            .filter(|r| r.addr != *addr)
            .filter_map(|r| {
                let i = r.info.as_deref()?;
                (i.role == Role::Replica || (i.role == Role::Master && continues(r, i)))
                    .then(|| reboot::Holding::of(r.addr.to_string(), i))
            })
            .collect();
        let mut verdict = reboot::judge(info, &holdings);
        if crate::mutation::planted(crate::mutation::Mutation::KeepRebootedMaster) {
            verdict = reboot::Verdict::Keeps;
        }
        let flavour = info.flavour;
        let (keys, replid) = (info.keys, info.replid.clone());
        let Some(inst) = self.instances.get_mut(addr) else {
            return;
        };
        let why = match verdict {
            reboot::Verdict::Loading => return,
            reboot::Verdict::Keeps if unread => return,
            reboot::Verdict::Keeps => {
                inst.reboot_unjudged = false;
                tracing::info!(group = %self.cfg.name, master = %addr, ?holdings, ?keys, ?replid, "the restarted master holds what its replicas hold: it stays the master");
                return;
            }
            reboot::Verdict::Behind(why) => why,
        };
        inst.reboot_unjudged = false;
        let t = inst.sdown.set_rebooted(true, now);
        // A replica that reconnected to it before it was paused is taking
        // (or took) its copy: read them all now, so that selection sees
        // which (`Exclusion::CopiedRestartedMaster`).
        self.refresh_replicas_info();
        if *addr == self.master {
            tracing::warn!(group = %self.cfg.name, master = %addr, reason = %why, "the master restarted with less than its replicas hold: it is down for this daemon");
        } else {
            tracing::warn!(group = %self.cfg.name, instance = %addr, reason = %why, "the replica a leader is promoting restarted as a master with less than the replicas hold: it is down for this daemon");
        }
        if flavour != crate::probe::Flavour::Dragonfly {
            // Dragonfly pauses only client connections, not replication
            // (a replica there must not resync on its own: its
            // `--break_replication_on_master_restart`, or the failover
            // coming first).
            let pause = reboot_pause(self.cfg.down_after);
            // A paused server answers nobody, the other daemons' probes
            // included: they are given the time of one reconnect to read
            // its INFO and judge it on their own evidence, or they would
            // see only silence and fail it over only after down_after.
            // Replicas reconnect far less often (Redis: once a second).
            let after = reconnect_fast(self.cfg.down_after_refused()) + Duration::from_millis(5);
            self.effects.run(Work::Pause {
                target: addr.clone(),
                pause,
                after,
            });
            // Renewed (`keep_paused`) half a pause after it begins, not at
            // once: a renewal now would take the other daemons' reconnect
            // from them.
            self.pause_renewed_at = Some(now + after);
        }
        if let Some(t) = t {
            self.on_sdown_transition(addr, t);
        }
    }

    /// Release the sync hold on `addr` when `probe::hold::release_due`
    /// says so: set its settings back (if this daemon found them).
    pub(super) fn review_sync_hold(&mut self, addr: &Addr, now: Instant) {
        let Some(inst) = self.instances.get_mut(addr) else {
            return;
        };
        let Some(h) = inst.sync_hold.as_ref() else {
            return;
        };
        let standing = probe::hold::Standing {
            held_at: h.at,
            until: h.until,
            info_at: inst.info_at,
            unjudged: inst.reboot_unjudged,
            behind: inst.sdown.rebooted(),
            is_master: *addr == self.master,
            role: inst.info.as_ref().map(|i| i.role),
        };
        let release = probe::hold::release_due(&standing, now);
        if !release {
            return;
        }
        let Some(h) = inst.sync_hold.take() else {
            return;
        };
        let Some(restore) = h.restore else {
            return;
        };
        self.effects.run(Work::ReleaseSyncHold {
            target: addr.clone(),
            restore,
            refused: h.refused,
        });
    }

    /// The settings of a released hold were not set back: keep them, to
    /// be tried again at the next INFO (unless a new hold was put on
    /// meanwhile, which then owns them).
    pub(super) fn on_sync_hold_refused(
        &mut self,
        addr: Addr,
        restore: Vec<(String, String)>,
        refused: u32,
    ) {
        if refused >= SYNC_HOLD_RELEASE_TRIES {
            tracing::error!(group = %self.cfg.name, instance = %addr, settings = ?restore, "gave up setting the server's replication settings back after a sync hold: set them by hand");
            return;
        }
        let now = self.now;
        let Some(inst) = self.instances.get_mut(&addr) else {
            return;
        };
        match inst.sync_hold.as_mut() {
            Some(h) => {
                h.restore.get_or_insert(restore);
            }
            None => {
                inst.sync_hold = Some(SyncHold {
                    at: now,
                    until: now,
                    restore: Some(restore),
                    refused,
                });
            }
        }
    }

    /// Arm the sync hold on the master's probe, and only there (Redis and
    /// Valkey: Dragonfly has no such settings; not with
    /// `flush_on_failover`, whose groups want an empty master anyway).
    pub(super) fn update_sync_holds(&mut self) {
        let hold = sync_hold(self.cfg.down_after);
        let flush = self.cfg.flush_on_failover;
        let master = self.master.clone();
        for inst in self.instances.values_mut() {
            let armed = !flush
                && inst.addr == master
                && inst
                    .info
                    .as_ref()
                    .is_some_and(|i| i.flavour != crate::probe::Flavour::Dragonfly);
            if armed != inst.sync_hold_armed {
                if let Some(p) = inst.probe.as_ref() {
                    p.set_sync_hold(armed.then_some(hold));
                }
                inst.sync_hold_armed = armed;
            }
        }
    }

    fn on_sdown_transition(&mut self, addr: &Addr, t: Transition) {
        let detail = if *addr == self.master {
            match self.instances.get(addr).and_then(|i| i.sdown.reason()) {
                Some(r) if t == Transition::Down && r != Reason::Silence => {
                    Detail::MasterAnd(format!("#{}", r.as_str()))
                }
                _ => Detail::Master,
            }
        } else {
            Detail::Replica(addr.clone())
        };
        let up = match t {
            Transition::Down => {
                if let Some(r) = self.instances.get(addr).and_then(|i| i.sdown.reason()) {
                    metrics::counter!(m::SDOWN_TOTAL, "group" => self.label.clone(), "reason" => r.as_str()).increment(1);
                    tracing::info!(group = %self.cfg.name, instance = %addr, reason = r.as_str(), "+sdown");
                }
                self.emit(EventKind::Sdown, &detail);
                0.0
            }
            Transition::Up => {
                self.emit(EventKind::SdownCleared, &detail);
                // What it said before it went down is no longer taken for
                // what it is (`Instance::fresh`): read it now.
                if let Some(i) = self.instances.get_mut(addr) {
                    i.up_again_at = Some(self.now);
                }
                self.refresh_info(addr);
                1.0
            }
        };
        if let Some(i) = self.instances.get(addr) {
            i.up_gauge.set(up);
        }
        if *addr == self.master {
            metrics::gauge!(m::MASTER_SDOWN, "group" => self.label.clone()).set(1.0 - up);
            // Peers learn it at once through the next hello and our asks.
            // Peers learn it from the hello that goes out now.
            self.dirty = true;
            self.urgent = true;
            self.ctx.hello_now.notify_one();
            if t == Transition::Down {
                self.election.master_went_down();
                // A switchover's old master is judged at the tick
                // (`Group::switchover_master_gone`).
                if !self.switching_over() {
                    let now = self.now;
                    self.machine_input(now, crate::failover::machine::Input::MasterDown);
                }
            }
        }
    }

    /// The tick's observations: SDOWN deadlines and the `role:slave` rule
    /// (nothing while in TILT: the silence may be the process's own).
    pub(super) fn observe_tick(&mut self, now: Instant) {
        if self.ctx.tilt.active(now) {
            return;
        }
        let mut transitions = Vec::new();
        // The replica a leader is promoting, judged as a master: held down
        // as the master is, until the config says otherwise.
        let promoting = self.intended_promotion(now);
        let master = &self.master;
        for inst in self.instances.values_mut() {
            if let Some(t) = inst.sdown.check(now) {
                transitions.push((inst.addr.clone(), t));
            }
            // A restarted master that has been failed over is the
            // returning old master now: demoted, not held down.
            if inst.addr != *master
                && Some(&inst.addr) != promoting.as_ref()
                && inst.sdown.rebooted()
                && let Some(t) = inst.sdown.set_rebooted(false, now)
            {
                transitions.push((inst.addr.clone(), t));
            }
        }
        for (a, t) in transitions {
            self.on_sdown_transition(&a, t);
        }
        let held: Vec<Addr> = self
            .instances
            .values()
            .filter(|i| i.sync_hold.is_some())
            .map(|i| i.addr.clone())
            .collect();
        for a in held {
            self.review_sync_hold(&a, now);
        }
        self.update_master_role_down(now);
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
            if down {
                self.emit(
                    EventKind::Sdown,
                    &Detail::MasterAnd("#reports role:slave".into()),
                );
            } else {
                self.emit(EventKind::SdownCleared, &Detail::Master);
            }
            metrics::gauge!(m::MASTER_SDOWN, "group" => self.label.clone())
                .set(if self.master_sdown() { 1.0 } else { 0.0 });
            // Peers learn it from the hello that goes out now.
            self.dirty = true;
            self.urgent = true;
            self.ctx.hello_now.notify_one();
            if down {
                self.election.master_went_down();
            }
        }
    }

    /// Notice that this process did not run for a while (SIGSTOP, VM
    /// pause, overload): nothing was observed meanwhile, so the silence is
    /// forgiven and acting is suspended (TILT). Called by the tick *and*
    /// before every event: after a stall the first thing the task handles
    /// may be a probe's reply, and acting on it (demoting a "stray" master
    /// that the peers promoted during the stall) with peers' hellos from
    /// before the stall is exactly what TILT must prevent.
    pub(super) fn notice_stall(&mut self, now: Instant) {
        let Some(gap) = self.run_clock.ran(now) else {
            return;
        };
        let tilt_period = (self.cfg.down_after * 3).max(Duration::from_secs(3));
        self.ctx.tilt.enter(now, gap, tilt_period);
        for inst in self.instances.values_mut() {
            inst.sdown.forgive_until(now);
        }
        self.election.on_stall();
        self.step_down_after_stall(now);
    }

    /// The gauges that change continuously, once a second.
    pub(super) fn export_instance_gauges(&mut self, now: Instant) {
        let group = &self.label;
        for inst in self.instances.values_mut() {
            inst.up_gauge
                .set(if inst.sdown.is_down() { 0.0 } else { 1.0 });
            if let Some(at) = inst.info_at {
                inst.info_age_gauge
                    .get_or_insert_with(|| {
                        metrics::gauge!(m::INFO_AGE, "group" => group.clone(), m::SERVER_LABEL => inst.server.clone())
                    })
                    .set(now.saturating_duration_since(at).as_secs_f64());
            }
        }
    }
}

/// How often a probe reconnects after the server closed or refused a
/// connection: five tries within `down_after_refused`, 5–50 ms apart.
pub(super) fn reconnect_fast(down_after_refused: Duration) -> Duration {
    (down_after_refused / 5).clamp(Duration::from_millis(5), Duration::from_millis(50))
}

/// How long a master that restarted with less than its replicas hold is
/// paused (`CLIENT PAUSE .. ALL`: nobody, a replica's handshake included,
/// is served): long enough for the quorum to fail it over (tens of
/// milliseconds once every daemon has seen the restart), short enough
/// that a quorum that cannot decide leaves it usable again. Commands sent
/// to it meanwhile, the demotion after the failover among them, wait.
pub(super) fn reboot_pause(down_after: Duration) -> Duration {
    (down_after * 2).clamp(Duration::from_secs(2), Duration::from_secs(10))
}

/// How long a sync hold makes full copies wait (`probe::hold`): past the
/// pause of a master judged to have come back with less, by a `down_after`
/// for the failover to finish within; released long before by any other
/// verdict.
pub(super) fn sync_hold(down_after: Duration) -> Duration {
    reboot_pause(down_after) + down_after
}

/// A pause longer than this between two runs of the group task is a stall
/// of the process, not scheduling noise.
pub(super) fn stall_threshold(tick: Duration, down_after: Duration) -> Duration {
    (tick * 4).max(Duration::from_secs(1)).max(down_after / 2)
}

/// When the group task last ran anything (a tick or an event).
#[derive(Debug)]
pub(super) struct RunClock {
    last: Instant,
    threshold: Duration,
}

impl RunClock {
    pub(super) fn new(now: Instant, threshold: Duration) -> RunClock {
        RunClock {
            last: now,
            threshold,
        }
    }

    /// The task runs at `now`: the length of the pause before, when it was
    /// a stall.
    pub(super) fn ran(&mut self, now: Instant) -> Option<Duration> {
        let gap = now.saturating_duration_since(self.last);
        self.last = self.last.max(now);
        (gap > self.threshold).then_some(gap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Dragonfly replica made to replicate over the admin port reports
    /// that port as its master's: it follows the master all the same (it
    /// was taken for a replica of another master, and re-pointed again
    /// and again; and a switchover found no candidate). On Redis, or
    /// without an admin port, another port is another master.
    #[test]
    fn a_replica_over_the_admin_port_names_its_master() {
        let replica = |port: u16, flavour: &str| {
            crate::probe::info::parse_info(&format!(
                "# Server\r\nredis_version:7.4.0\r\n{flavour}\r\n# Replication\r\n\
                 role:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:{port}\r\n\
                 master_link_status:up\r\n"
            ))
        };
        let master = Addr::new("10.0.0.1".to_string(), 6379);
        let df = "dragonfly_version:df-v1.40.1";
        let redis = "run_id:0123456789012345678901234567890123456789";
        assert!(names_master(&replica(6379, df), &master, None, Some(9999)));
        assert!(names_master(&replica(9999, df), &master, None, Some(9999)));
        assert!(!names_master(&replica(9999, df), &master, None, None));
        assert!(!names_master(
            &replica(9999, redis),
            &master,
            None,
            Some(9999)
        ));
        assert!(!names_master(&replica(7000, df), &master, None, Some(9999)));
        let elsewhere = Addr::new("10.0.0.2".to_string(), 6379);
        assert!(!names_master(
            &replica(9999, df),
            &elsewhere,
            None,
            Some(9999)
        ));
    }

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
}

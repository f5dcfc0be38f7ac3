//! `SENTINEL` subcommands with Redis Sentinel's reply shapes, field order
//! and error texts, built from the groups' published views.
//!
//! Instance maps follow `addReplySentinelRedisInstance` field by field:
//! every number is a bulk string, optional fields appear only when Sentinel
//! would emit them, and the flags use Sentinel's vocabulary in its order.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use super::peer::{is_down, simulate_failure, switchover};
use super::pubsub::glob_match;
use super::reply::Reply;
use super::util::{arity, help, unknown_sub};
use crate::addr::Addr;
use crate::daemon::Daemon;
use crate::group::GroupMsg;
use crate::group::view::{GroupView, InstanceView, PeerView};
use crate::probe::Role;
use crate::quorum::peers::{IsDownQuery, IsDownReply};

const NO_SUCH_MASTER: &str = "ERR No such master with that name";

/// Flags in Sentinel's order (`s_down,o_down,master,slave,sentinel,
/// disconnected,master_down,failover_in_progress,promoted,...`).
#[derive(Debug, Default)]
struct Flags {
    s_down: bool,
    o_down: bool,
    master: bool,
    slave: bool,
    sentinel: bool,
    disconnected: bool,
    master_down: bool,
    failover_in_progress: bool,
    promoted: bool,
    /// Sentinel's `master_reboot`: the master restarted (here: with less
    /// than its replicas hold, and is down for it).
    master_reboot: bool,
}

impl Flags {
    fn render(&self) -> String {
        let all = [
            (self.s_down, "s_down"),
            (self.o_down, "o_down"),
            (self.master, "master"),
            (self.slave, "slave"),
            (self.sentinel, "sentinel"),
            (self.disconnected, "disconnected"),
            (self.master_down, "master_down"),
            (self.failover_in_progress, "failover_in_progress"),
            (self.promoted, "promoted"),
            (self.master_reboot, "master_reboot"),
        ];
        all.iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Builds one instance map in Sentinel's order.
struct MapBuilder(Vec<(Reply, Reply)>);

impl MapBuilder {
    fn new() -> Self {
        MapBuilder(Vec::with_capacity(32))
    }

    fn s(&mut self, key: &str, value: impl AsRef<[u8]>) -> &mut Self {
        self.0.push((Reply::bulk(key), Reply::bulk(value)));
        self
    }

    fn n(&mut self, key: &str, value: impl std::fmt::Display) -> &mut Self {
        self.0.push((Reply::bulk(key), Reply::num(value)));
        self
    }

    fn done(self) -> Reply {
        Reply::Map(self.0)
    }
}

/// Sentinel's `last-ping-sent`: how long the oldest unanswered PING has
/// been waiting, 0 when none is. picket probes continuously, so while the
/// instance fails to answer that is the time since its last valid reply.
fn last_ping_sent(i: &InstanceView) -> u64 {
    if i.last_error.is_some() || !i.connected || i.sdown {
        i.last_ok_ping_ms
    } else {
        0
    }
}

fn role_name(role: Role, expected_master: bool) -> &'static str {
    match role {
        Role::Master => "master",
        Role::Replica => "slave",
        Role::Unknown if expected_master => "master",
        Role::Unknown => "slave",
    }
}

/// What the fields every master and replica map starts with are made of.
struct Common<'a> {
    name: &'a str,
    inst: Option<&'a InstanceView>,
    addr: &'a Addr,
    flags: Flags,
    failover_state: Option<&'a str>,
    odown_ms: Option<u64>,
    down_after_ms: u64,
    expected_master: bool,
}

impl Common<'_> {
    fn write(&self, b: &mut MapBuilder) {
        let i = self.inst;
        b.s("name", self.name)
            .s("ip", &self.addr.host)
            .n("port", self.addr.port)
            .s("runid", i.and_then(|i| i.run_id.as_deref()).unwrap_or(""))
            .s("flags", self.flags.render())
            .n("link-pending-commands", 0)
            .n("link-refcount", 1);
        if let Some(st) = self.failover_state {
            b.s("failover-state", st);
        }
        let ok = i.map_or(0, |i| i.last_ok_ping_ms);
        b.n("last-ping-sent", i.map_or(0, last_ping_sent))
            .n("last-ok-ping-reply", ok)
            .n(
                "last-ping-reply",
                i.and_then(|i| i.last_reply_ms).unwrap_or(ok),
            );
        if let Some(ms) = i.filter(|i| i.sdown).map(|i| i.sdown_ms.unwrap_or(0)) {
            b.n("s-down-time", ms);
        }
        if let Some(ms) = self.odown_ms {
            b.n("o-down-time", ms);
        }
        b.n("down-after-milliseconds", self.down_after_ms)
            .n("info-refresh", i.and_then(|i| i.info_age_ms).unwrap_or(0))
            .s(
                "role-reported",
                role_name(i.map_or(Role::Unknown, |i| i.role), self.expected_master),
            )
            .n(
                "role-reported-time",
                i.and_then(|i| i.role_reported_ms).unwrap_or(0),
            );
    }
}

/// `SENTINEL MASTER`: one master's map.
pub fn master_map(v: &GroupView) -> Reply {
    let mv = v.master_view();
    let flags = Flags {
        s_down: v.master_sdown,
        o_down: v.master_odown,
        master: true,
        disconnected: mv.is_some_and(|i| !i.connected),
        failover_in_progress: v.failover.is_some(),
        master_reboot: mv.is_some_and(|i| i.sdown_reason == Some("reboot")),
        ..Default::default()
    };
    let mut b = MapBuilder::new();
    Common {
        name: &v.name,
        inst: mv,
        addr: &v.announced(&v.master),
        flags,
        failover_state: v.failover.as_ref().map(|f| f.state.as_str()),
        odown_ms: v.master_odown.then(|| v.odown_ms.unwrap_or(0)),
        down_after_ms: v.down_after_ms,
        expected_master: true,
    }
    .write(&mut b);
    b.n("config-epoch", v.config_epoch)
        .n("num-slaves", v.replicas().count())
        .n("num-other-sentinels", v.peers.len())
        .n("quorum", v.quorum)
        .n("failover-timeout", v.failover_timeout_ms)
        .n("parallel-syncs", v.parallel_syncs);
    b.done()
}

/// `SENTINEL REPLICAS`: one replica's map.
pub fn replica_map(v: &GroupView, i: &InstanceView) -> Reply {
    let promoted = v.failover.as_ref().is_some_and(|f| {
        f.candidate.as_ref() == Some(&i.addr) && !matches!(f.state.as_str(), "wait_start")
    });
    let flags = Flags {
        s_down: i.sdown,
        slave: true,
        disconnected: !i.connected,
        promoted,
        ..Default::default()
    };
    let mut b = MapBuilder::new();
    let addr = v.announced(&i.addr);
    Common {
        name: &format!("{}:{}", addr.host, addr.port),
        inst: Some(i),
        addr: &addr,
        flags,
        failover_state: None,
        odown_ms: None,
        down_after_ms: v.down_after_ms,
        expected_master: false,
    }
    .write(&mut b);
    b.n(
        "master-link-down-time",
        i.master_link_down_secs.unwrap_or(0).saturating_mul(1000),
    )
    .s(
        "master-link-status",
        if i.master_link_up { "ok" } else { "err" },
    )
    .s("master-host", i.master_host.as_deref().unwrap_or("?"))
    .n("master-port", i.master_port.unwrap_or(0))
    .n("slave-priority", i.priority.unwrap_or(100))
    .n("slave-repl-offset", i.offset.unwrap_or(0))
    .n("replica-announced", u8::from(i.replica_announced));
    b.done()
}

/// `SENTINEL SENTINELS`: one peer daemon's map.
pub fn peer_map(v: &GroupView, p: &PeerView, never_ms: u64) -> Reply {
    let addr: Addr = p
        .addr
        .parse()
        .unwrap_or_else(|_| Addr::new(p.addr.clone(), 0));
    let seen = p.last_hello_ms.unwrap_or(never_ms);
    let flags = Flags {
        s_down: !p.reachable,
        sentinel: true,
        disconnected: p.last_hello_ms.is_none(),
        master_down: p.sees_master_down,
        ..Default::default()
    };
    let mut b = MapBuilder::new();
    b.s("name", p.id.as_deref().unwrap_or(&p.addr))
        .s("ip", &addr.host)
        .n("port", addr.port)
        .s("runid", p.run_id.as_deref().unwrap_or(""))
        .s("flags", flags.render())
        .n("link-pending-commands", 0)
        .n("link-refcount", 1)
        .n("last-ping-sent", if p.reachable { 0 } else { seen })
        .n("last-ok-ping-reply", seen)
        .n("last-ping-reply", seen);
    if !p.reachable {
        b.n("s-down-time", seen.saturating_sub(v.down_after_ms));
    }
    b.n("down-after-milliseconds", v.down_after_ms)
        .n("last-hello-message", seen)
        .s("voted-leader", p.voted_leader.as_deref().unwrap_or("?"))
        .n("voted-leader-epoch", p.voted_epoch);
    b.done()
}

/// A group's current view. The handle is only borrowed: cloning it (its
/// mailbox, view and cancellation token) cost more than the lookup, on
/// the path of every `GET-MASTER-ADDR-BY-NAME`.
fn view(d: &Daemon, name: &str) -> Option<Arc<GroupView>> {
    d.groups
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
        .map(|h| h.view.borrow().clone())
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME <name>`: the master's announced
/// address, or a null array for an unknown name.
pub fn master_addr(d: &Daemon, name: &str) -> Reply {
    match view(d, name) {
        Some(v) => address_reply(&v),
        None => Reply::NullArray,
    }
}

fn address_reply(v: &GroupView) -> Reply {
    let m = v.announced(&v.master);
    Reply::Array(vec![Reply::bulk(&m.host), Reply::num(m.port)])
}

/// The last group a connection asked the master of, with the answer
/// encoded: a client asks for the same group again and again, and while
/// the group's view has not changed the answer is the same bytes (no
/// lock, no lookup, no reference count shared with other threads).
#[derive(Debug)]
pub struct MasterCache {
    name: Bytes,
    view: watch::Receiver<Arc<GroupView>>,
    reply: Bytes,
}

/// [`master_addr`] through the connection's [`MasterCache`].
pub fn master_addr_cached(d: &Daemon, name: &Bytes, cache: &mut Option<MasterCache>) -> Reply {
    if let Some(c) = cache
        && c.name == *name
        && matches!(c.view.has_changed(), Ok(false))
    {
        return Reply::Encoded(c.reply.clone());
    }
    let Ok(text) = std::str::from_utf8(name) else {
        return Reply::NullArray;
    };
    let Some(mut rx) = d
        .groups
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(text)
        .map(|h| h.view.clone())
    else {
        *cache = None;
        return Reply::NullArray;
    };
    let v = rx.borrow_and_update().clone();
    let reply = address_reply(&v).to_bytes(false);
    *cache = Some(MasterCache {
        name: name.clone(),
        view: rx,
        reply: reply.clone(),
    });
    Reply::Encoded(reply)
}

/// `+OK <n> usable Sentinels...` or `-NOQUORUM ...`.
pub fn ckquorum(v: &GroupView) -> Reply {
    let usable = v.reachable_daemons();
    let voters = v.daemons;
    let no_quorum = usable < v.quorum as usize;
    let no_auth = usable < voters / 2 + 1;
    if !no_quorum && !no_auth {
        return Reply::Simple(format!(
            "OK {usable} usable Sentinels. Quorum and failover authorization can be reached"
        ));
    }
    let mut e = format!("NOQUORUM {usable} usable Sentinels. ");
    if no_quorum {
        e.push_str("Not enough available Sentinels to reach the specified quorum for this master");
    }
    if no_auth {
        if no_quorum {
            e.push_str(". ");
        }
        e.push_str("Not enough available Sentinels to reach the majority and authorize a failover");
    }
    Reply::err(e)
}

const SENTINEL_HELP: &[&str] = &[
    "SENTINEL <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
    "CKQUORUM <master-name>",
    "    Check if the current Sentinel configuration is able to reach the quorum",
    "    needed to failover a master and the majority needed to authorize the",
    "    failover.",
    "GET-MASTER-ADDR-BY-NAME <master-name>",
    "    Return the ip and port number of the master with that name.",
    "FAILOVER <master-name>",
    "    Start a planned switchover of a master (picket: elected, no data loss).",
    "IS-MASTER-DOWN-BY-ADDR <ip> <port> <current-epoch> <runid>",
    "    Check if the master specified by ip:port is down from current Sentinel's",
    "    point of view.",
    "MASTER <master-name>",
    "    Show the state and info of the specified master.",
    "MASTERS",
    "    Show a list of monitored masters and their state.",
    "MYID",
    "    Return the ID of the Sentinel instance.",
    "REPLICAS <master-name>",
    "    Show a list of replicas for this master and their state.",
    "RESET <pattern>",
    "    Reset masters for specific master name matching this pattern.",
    "SENTINELS <master-name>",
    "    Show a list of Sentinel instances for this master and their state.",
    "SIMULATE-FAILURE [CRASH-AFTER-ELECTION] [CRASH-AFTER-PROMOTION] [NONE] [HELP]",
    "    Simulate a Sentinel crash (only with daemon.enable_fault_injection).",
    "HELP",
    "    Prints this help.",
    "(picket is configured by its TOML file: MONITOR, REMOVE, SET, CONFIG, DEBUG,",
    "FLUSHCONFIG, INFO-CACHE and PENDING-SCRIPTS are not supported.)",
];

fn not_supported(sub: &str) -> Reply {
    let upper = sub.to_uppercase();
    Reply::err(match upper.as_str() {
        "DEBUG" => format!(
            "ERR picket takes its timing from its TOML file (down_after, failover_timeout); SENTINEL {upper} is not supported"
        ),
        "INFO-CACHE" => format!(
            "ERR SENTINEL {upper} is not supported by picket; the HTTP endpoint /v1/status shows what picket knows of every instance"
        ),
        "PENDING-SCRIPTS" => format!(
            "ERR picket runs no scripts (see the exec discovery backend); SENTINEL {upper} is not supported"
        ),
        _ => {
            format!("ERR picket is configured by its TOML file; SENTINEL {upper} is not supported")
        }
    })
}

fn int_arg(s: &str) -> Result<i64, Reply> {
    s.parse::<i64>()
        .map_err(|_| Reply::err("ERR value is not an integer or out of range"))
}

/// Run `SENTINEL <sub> ...`.
pub async fn sentinel(d: &Daemon, rest: &[String]) -> Reply {
    let Some(sub) = rest.first() else {
        return arity("sentinel");
    };
    let lower = sub.to_lowercase();
    let ar = || arity(&format!("sentinel|{lower}"));
    let named = |n: usize| rest.len() == n;
    match lower.as_str() {
        "masters" | "primaries" => {
            if !named(1) {
                return ar();
            }
            Reply::Array(d.views().iter().map(|v| master_map(v)).collect())
        }
        "master" | "primary" => {
            if !named(2) {
                return ar();
            }
            match view(d, &rest[1]) {
                Some(v) => master_map(&v),
                None => Reply::err(NO_SUCH_MASTER),
            }
        }
        "replicas" | "slaves" => {
            if !named(2) {
                return ar();
            }
            match view(d, &rest[1]) {
                Some(v) => Reply::Array(
                    v.replicas()
                        .filter(|i| i.replica_announced)
                        .map(|i| replica_map(&v, i))
                        .collect(),
                ),
                None => Reply::err(NO_SUCH_MASTER),
            }
        }
        "sentinels" => {
            if !named(2) {
                return ar();
            }
            let never = u64::try_from(
                Instant::now()
                    .saturating_duration_since(d.started)
                    .as_millis(),
            )
            .unwrap_or(u64::MAX);
            match view(d, &rest[1]) {
                // As Sentinel, a peer is listed once heard from; one never
                // heard is listed (down) only once a peer that went quiet
                // would be down too.
                Some(v) => Reply::Array(
                    v.peers
                        .iter()
                        .filter(|p| p.heard || !p.reachable)
                        .map(|p| peer_map(&v, p, never))
                        .collect(),
                ),
                None => Reply::err(NO_SUCH_MASTER),
            }
        }
        "get-master-addr-by-name" | "get-primary-addr-by-name" => {
            if !named(2) {
                return ar();
            }
            master_addr(d, &rest[1])
        }
        "ckquorum" => {
            if !named(2) {
                return ar();
            }
            match view(d, &rest[1]) {
                Some(v) => ckquorum(&v),
                None => Reply::err(NO_SUCH_MASTER),
            }
        }
        "failover" => match rest {
            // Valkey 9's COORDINATED asks for what picket always does.
            [_, name] => switchover(d, name, None).await,
            [_, name, c] if c.eq_ignore_ascii_case("coordinated") => {
                switchover(d, name, None).await
            }
            [_, _, _] => Reply::err("ERR syntax error"),
            _ => ar(),
        },
        "reset" => {
            if !named(2) {
                return ar();
            }
            let mut n = 0;
            for v in d.views() {
                if glob_match(&rest[1], &v.name)
                    && let Some(h) = d.group(&v.name)
                    && h.send(GroupMsg::Reset).await.is_ok()
                {
                    n += 1;
                }
            }
            Reply::Int(n)
        }
        "myid" => {
            if !named(1) {
                return ar();
            }
            Reply::bulk(&d.ctx.run_id)
        }
        "is-master-down-by-addr" | "is-primary-down-by-addr" => {
            let [_, ip, port, epoch, runid] = rest else {
                return ar();
            };
            let port = match int_arg(port) {
                Ok(p) => p,
                Err(e) => return e,
            };
            let epoch = match int_arg(epoch) {
                Ok(e) => u64::try_from(e).unwrap_or(0),
                Err(e) => return e,
            };
            let found = d.views().into_iter().find(|v| {
                let resolved = v.master_view().and_then(|m| m.ip);
                u16::try_from(port)
                    .is_ok_and(|p| v.master.is_reported_as(resolved, Some(ip), Some(p)))
            });
            let Some(v) = found else {
                return Reply::from(IsDownReply::not_down().to_frame());
            };
            let Some(h) = d.group(&v.name) else {
                return Reply::from(IsDownReply::not_down().to_frame());
            };
            let q = IsDownQuery {
                group: v.name.clone(),
                master: v.master.clone(),
                config_epoch: v.config_epoch,
                epoch,
                candidate: (runid != "*").then(|| runid.clone()),
                promote: None,
            };
            is_down(&h, q).await
        }
        "simulate-failure" => simulate_failure(d, "sentinel|simulate-failure", &rest[1..]),
        "help" => help(SENTINEL_HELP),
        "monitor" | "remove" | "set" | "config" | "debug" | "flushconfig" | "info-cache"
        | "pending-scripts" => not_supported(sub),
        _ => unknown_sub("sentinel", sub),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::view::FailoverView;

    fn inst(addr: &str, master: bool) -> InstanceView {
        InstanceView {
            addr: addr.parse().unwrap(),
            ip: None,
            is_master: master,
            role: if master { Role::Master } else { Role::Replica },
            flavour: Default::default(),
            version: None,
            run_id: Some("abc".into()),
            up: true,
            sdown: false,
            sdown_ms: None,
            sdown_reason: None,
            rebooted_ms: None,
            connected: true,
            last_ok_ping_ms: 12,
            last_reply_ms: Some(12),
            info_age_ms: Some(300),
            role_reported_ms: Some(5000),
            offset: Some(42),
            priority: Some(100),
            master_host: (!master).then(|| "10.0.0.1".into()),
            master_port: (!master).then_some(6379),
            master_link_up: !master,
            master_link_down_secs: None,
            loading: false,
            replica_announced: true,
            last_error: None,
        }
    }

    fn group() -> GroupView {
        GroupView {
            name: "cache".into(),
            master: "10.0.0.1:6379".parse().unwrap(),
            config_epoch: 3,
            announced_epoch: 3,
            quorum: 2,
            daemons: 3,
            down_after_ms: 1000,
            failover_timeout_ms: 30000,
            parallel_syncs: 1,
            flush_on_failover: false,
            announce_hostnames: false,
            isolation_fence: None,
            status: crate::group::view::GroupStatus::Ok,
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
            instances: vec![inst("10.0.0.1:6379", true), inst("10.0.0.2:6379", false)],
            peers: vec![
                PeerView {
                    addr: "10.0.0.8:26379".into(),
                    id: Some("picket-b".into()),
                    run_id: Some("b".repeat(40)),
                    heard: true,
                    reachable: true,
                    last_hello_ms: Some(200),
                    sees_master_down: false,
                    voted_leader: None,
                    voted_epoch: 0,
                    config_epoch: Some(3),
                },
                PeerView {
                    addr: "10.0.0.9:26379".into(),
                    id: None,
                    run_id: None,
                    heard: false,
                    reachable: false,
                    last_hello_ms: None,
                    sees_master_down: false,
                    voted_leader: None,
                    voted_epoch: 0,
                    config_epoch: None,
                },
            ],
            members: None,
            discovery: vec![],
            recorded: vec![],
        }
    }

    fn keys(r: &Reply) -> Vec<String> {
        let Reply::Map(m) = r else { panic!("{r:?}") };
        m.iter()
            .map(|(k, _)| match k {
                Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                _ => panic!(),
            })
            .collect()
    }

    fn get(r: &Reply, key: &str) -> String {
        let Reply::Map(m) = r else { panic!() };
        m.iter()
            .find(|(k, _)| *k == Reply::bulk(key))
            .map(|(_, v)| match v {
                Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                other => panic!("{other:?}"),
            })
            .unwrap_or_else(|| panic!("no {key}"))
    }

    const COMMON: &[&str] = &[
        "name",
        "ip",
        "port",
        "runid",
        "flags",
        "link-pending-commands",
        "link-refcount",
        "last-ping-sent",
        "last-ok-ping-reply",
        "last-ping-reply",
        "down-after-milliseconds",
        "info-refresh",
        "role-reported",
        "role-reported-time",
    ];

    #[test]
    fn master_map_fields_in_sentinel_order() {
        let v = group();
        let m = master_map(&v);
        let mut want: Vec<&str> = COMMON.to_vec();
        want.extend([
            "config-epoch",
            "num-slaves",
            "num-other-sentinels",
            "quorum",
            "failover-timeout",
            "parallel-syncs",
        ]);
        assert_eq!(keys(&m), want);
        assert_eq!(get(&m, "flags"), "master");
        assert_eq!(get(&m, "num-other-sentinels"), "2");
        assert_eq!(get(&m, "num-slaves"), "1");
        assert_eq!(get(&m, "port"), "6379");
        // Field 33 (the value of num-other-sentinels) as Sentinel's tests read it.
        let Reply::Map(pairs) = &m else { panic!() };
        assert_eq!(pairs[16].0, Reply::bulk("num-other-sentinels"));
    }

    #[test]
    fn master_map_while_down_and_failing_over() {
        let mut v = group();
        v.master_sdown = true;
        v.master_odown = true;
        v.odown_ms = Some(50);
        v.instances[0].sdown = true;
        v.instances[0].sdown_ms = Some(70);
        v.instances[0].connected = false;
        v.failover = Some(FailoverView {
            epoch: 4,
            kind: crate::failover::machine::Kind::Unplanned,
            state: "send_slaveof_noone".into(),
            candidate: Some("10.0.0.2:6379".parse().unwrap()),
            started_ms: 5,
        });
        let m = master_map(&v);
        assert_eq!(
            get(&m, "flags"),
            "s_down,o_down,master,disconnected,failover_in_progress"
        );
        let k = keys(&m);
        let pos = |f: &str| k.iter().position(|x| x == f).unwrap();
        assert_eq!(pos("failover-state"), 7);
        assert!(pos("s-down-time") < pos("o-down-time"));
        assert!(pos("o-down-time") < pos("down-after-milliseconds"));
        assert_eq!(get(&m, "s-down-time"), "70");
        let r = replica_map(&v, &v.instances[1]);
        assert_eq!(get(&r, "flags"), "slave,promoted");
    }

    #[test]
    fn replica_map_fields_in_sentinel_order() {
        let v = group();
        let r = replica_map(&v, &v.instances[1]);
        let mut want: Vec<&str> = COMMON.to_vec();
        want.extend([
            "master-link-down-time",
            "master-link-status",
            "master-host",
            "master-port",
            "slave-priority",
            "slave-repl-offset",
            "replica-announced",
        ]);
        assert_eq!(keys(&r), want);
        assert_eq!(get(&r, "name"), "10.0.0.2:6379");
        assert_eq!(get(&r, "flags"), "slave");
        assert_eq!(get(&r, "role-reported"), "slave");
        assert_eq!(get(&r, "master-link-status"), "ok");
    }

    #[test]
    fn peer_map_fields_in_sentinel_order() {
        let v = group();
        let p = peer_map(&v, &v.peers[0], 9999);
        assert_eq!(
            keys(&p),
            vec![
                "name",
                "ip",
                "port",
                "runid",
                "flags",
                "link-pending-commands",
                "link-refcount",
                "last-ping-sent",
                "last-ok-ping-reply",
                "last-ping-reply",
                "down-after-milliseconds",
                "last-hello-message",
                "voted-leader",
                "voted-leader-epoch",
            ]
        );
        assert_eq!(get(&p, "name"), "picket-b");
        assert_eq!(get(&p, "flags"), "sentinel");
        assert_eq!(get(&p, "voted-leader"), "?");
        let q = peer_map(&v, &v.peers[1], 9999);
        assert_eq!(get(&q, "flags"), "s_down,sentinel,disconnected");
        assert_eq!(get(&q, "name"), "10.0.0.9:26379");
        assert!(keys(&q).contains(&"s-down-time".to_string()));
    }

    #[test]
    fn named_instances_are_announced_by_ip_unless_announce_hostnames() {
        let mut v = group();
        v.master = "redis-a:6379".parse().unwrap();
        let mut m = inst("redis-a:6379", true);
        m.ip = "10.0.0.9".parse().ok();
        let mut r = inst("redis-b:6379", false);
        r.ip = "10.0.0.10".parse().ok();
        v.instances = vec![m, r.clone(), inst("10.0.0.11:6379", false)];
        assert_eq!(v.announced(&v.master).to_string(), "10.0.0.9:6379");
        assert_eq!(v.announced(&r.addr).to_string(), "10.0.0.10:6379");
        // Not reached yet: the name is all there is.
        assert_eq!(
            v.announced(&"redis-c:6379".parse().unwrap()).to_string(),
            "redis-c:6379"
        );
        let get = |v: &GroupView| get(&master_map(v), "ip");
        assert_eq!(get(&v), "10.0.0.9");
        v.announce_hostnames = true;
        assert_eq!(v.announced(&v.master).to_string(), "redis-a:6379");
        assert_eq!(get(&v), "redis-a");
    }

    #[test]
    fn ckquorum_texts() {
        let v = group();
        assert_eq!(
            ckquorum(&v),
            Reply::Simple(
                "OK 2 usable Sentinels. Quorum and failover authorization can be reached".into()
            )
        );
        let mut v = group();
        v.peers[0].reachable = false;
        assert_eq!(
            ckquorum(&v),
            Reply::err(
                "NOQUORUM 1 usable Sentinels. Not enough available Sentinels to reach the specified quorum for this master. Not enough available Sentinels to reach the majority and authorize a failover"
            )
        );
        v.quorum = 1;
        assert_eq!(
            ckquorum(&v),
            Reply::err(
                "NOQUORUM 1 usable Sentinels. Not enough available Sentinels to reach the majority and authorize a failover"
            )
        );
    }
}

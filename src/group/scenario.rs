//! Whole failovers through the group's own decisions, in virtual time.
//!
//! The group is built as the daemon builds it, but its executor only
//! records the work the decisions ask for ([`Effects::recording`]); the
//! test carries it out against simulated servers and feeds the results
//! back, as the driver does with real ones. No socket, no task, no clock:
//! the time is whatever the test says, so a schedule runs in microseconds
//! and runs the same every time. The process-level tests check the same
//! decisions against real servers; these check their order and outcome.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::effects::{Effects, Internal, Work};
use super::{Group, Woken, client_options};
use crate::addr::Addr;
use crate::context::DaemonCtx;
use crate::discovery::runner::DiscoveryRunner;
use crate::events::Events;
use crate::failover::machine::Input;
use crate::probe::info::parse_info;
use crate::probe::{Failure, ProbeEvent};
use crate::quorum::state::StateStore;
use crate::quorum::table::PeerTable;
use crate::tilt::Tilt;

/// One simulated data server (Redis 7).
#[derive(Debug, Clone)]
struct Server {
    addr: Addr,
    alive: bool,
    /// `None`: a master.
    master: Option<Addr>,
    offset: u64,
    run_id: String,
    /// The replication history (`master_replid`).
    replid: String,
    priority: u32,
}

/// The servers of one group.
#[derive(Debug)]
struct Servers(Vec<Server>);

impl Servers {
    fn get(&self, addr: &Addr) -> &Server {
        self.0
            .iter()
            .find(|s| s.addr == *addr)
            .expect("a known server")
    }

    fn get_mut(&mut self, addr: &Addr) -> &mut Server {
        self.0
            .iter_mut()
            .find(|s| s.addr == *addr)
            .expect("a known server")
    }

    /// What `INFO` answers on `addr`: a replica's link is up when its
    /// master is alive and a master.
    fn info(&self, addr: &Addr) -> String {
        let s = self.get(addr);
        let mut out = format!(
            "# Server\r\nredis_version:7.0.15\r\nrun_id:{}\r\n# Replication\r\n",
            s.run_id
        );
        match &s.master {
            None => {
                let replicas: Vec<&Server> = self
                    .0
                    .iter()
                    .filter(|r| r.alive && r.master.as_ref() == Some(addr))
                    .collect();
                out += &format!("role:master\r\nconnected_slaves:{}\r\n", replicas.len());
                for (i, r) in replicas.iter().enumerate() {
                    out += &format!(
                        "slave{i}:ip={},port={},state=online,offset={},lag=0\r\n",
                        r.addr.host, r.addr.port, r.offset
                    );
                }
            }
            Some(m) => {
                let up = self
                    .0
                    .iter()
                    .any(|x| x.addr == *m && x.alive && x.master.is_none());
                out += &format!(
                    "role:slave\r\nmaster_host:{}\r\nmaster_port:{}\r\nmaster_link_status:{}\r\n\
                     master_last_io_seconds_ago:0\r\nmaster_sync_in_progress:0\r\n\
                     slave_repl_offset:{}\r\nslave_priority:{}\r\nslave_read_only:1\r\n",
                    m.host,
                    m.port,
                    if up { "up" } else { "down" },
                    s.offset,
                    s.priority
                );
            }
        }
        out += &format!(
            "master_replid:{}\r\nmaster_repl_offset:{}\r\n# Keyspace\r\n",
            s.replid, s.offset
        );
        if s.offset > 0 {
            out += &format!("db0:keys={},expires=0,avg_ttl=0\r\n", s.offset);
        }
        out
    }
}

/// A group driven by the test, with what it asked for in order.
struct Bench {
    g: Box<Group>,
    ctx: Arc<DaemonCtx>,
    servers: Servers,
    t0: Instant,
    /// Virtual milliseconds since `t0`.
    ms: u64,
    /// `(ms, what)`: the work the group asked for, as a trace.
    trace: Vec<(u64, String)>,
    _dir: tempfile::TempDir,
}

fn addr(port: u16) -> Addr {
    Addr {
        host: "127.0.0.1".into(),
        port,
    }
}

impl Bench {
    /// Three servers (7000 the master, 7001 with the better priority),
    /// one daemon with `quorum = 1`.
    fn new() -> Bench {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let text = "[daemon]\nid = \"a\"\nlisten = \"127.0.0.1:26379\"\ndata_dir = \"/tmp\"\n\n\
             [[group]]\nname = \"g\"\nmaster = \"127.0.0.1:7000\"\nquorum = 1\n\
             down_after = \"1s\"\nfailover_timeout = \"10s\"\n";
        let cfg = crate::config::load_str(std::path::Path::new("t.toml"), text)
            .expect("a valid config")
            .groups
            .remove(0);
        let events = Events::new();
        let ctx = Arc::new(DaemonCtx {
            id: "a".into(),
            run_id: "0".repeat(40),
            announce: "127.0.0.1:26379".into(),
            state: Arc::new(StateStore::open(dir.path(), Some("a")).expect("a state store")),
            peers: vec![],
            peer_table: PeerTable::new(&[]),
            events: events.clone(),
            hello_now: tokio::sync::Notify::new(),
            tilt: Tilt::new(events),
            password: None,
            simulate_failure: Default::default(),
        });
        let server = |port: u16, master: Option<u16>, offset: u64, priority: u32| Server {
            addr: addr(port),
            alive: true,
            master: master.map(addr),
            offset,
            run_id: format!("{port}").repeat(10),
            replid: "a".repeat(40),
            priority,
        };
        let servers = Servers(vec![
            server(7000, None, 1000, 100),
            server(7001, Some(7000), 1000, 10),
            server(7002, Some(7000), 1000, 100),
        ]);
        let t0 = Instant::now();
        let client = client_options(&cfg).expect("client options");
        let discovery = Arc::new(DiscoveryRunner::new("g", vec![]));
        let mut g = Box::new(Group::new(
            cfg,
            ctx.clone(),
            client,
            discovery,
            vec![],
            Effects::recording(),
            (addr(7000), 0),
            (t0, 1_800_000_000),
        ));
        g.ensure_instance(&addr(7000));
        Bench {
            g,
            ctx,
            servers,
            t0,
            ms: 0,
            trace: Vec::new(),
            _dir: dir,
        }
    }

    fn wake(&mut self, woken: Woken) {
        self.g.now = self.t0 + Duration::from_millis(self.ms);
        self.g.on_wake(woken);
    }

    /// Each server answers its probe (every 20 ms of virtual time), INFO
    /// every 100 ms, the tick every 50 ms; the work asked for is carried
    /// out at once.
    async fn run_for(&mut self, ms: u64) {
        let end = self.ms + ms;
        while self.ms < end {
            self.ms += 10;
            let at = self.t0 + Duration::from_millis(self.ms);
            let known: Vec<Addr> = self.g.instances.keys().cloned().collect();
            for a in known {
                let Some(s) = self.servers.0.iter().find(|s| s.addr == a) else {
                    continue;
                };
                let ev = if !s.alive {
                    self.ms.is_multiple_of(20).then(|| ProbeEvent::Unreachable {
                        addr: a.clone(),
                        at,
                        error: "Connection refused".into(),
                        cause: Failure::Refused,
                    })
                } else if self.ms.is_multiple_of(100) {
                    Some(ProbeEvent::Info {
                        addr: a.clone(),
                        at,
                        info: Box::new(parse_info(&self.servers.info(&a))),
                        ip: None,
                    })
                } else {
                    self.ms.is_multiple_of(20).then(|| ProbeEvent::Ping {
                        addr: a.clone(),
                        at,
                        valid: true,
                        latency: Some(Duration::from_millis(1)),
                        error: None,
                        busy: false,
                    })
                };
                if let Some(ev) = ev {
                    self.wake(Woken::Probe(Box::new(ev)));
                    self.execute().await;
                }
            }
            if self.ms.is_multiple_of(50) {
                self.wake(Woken::Timer);
                self.execute().await;
            }
        }
    }

    /// Carry out the recorded work on the simulated servers and feed each
    /// result back, until the group asks for nothing more.
    async fn execute(&mut self) {
        for _ in 0..100 {
            let work = self.g.effects.take();
            if work.is_empty() {
                return;
            }
            for w in work {
                if let Some(result) = self.carry_out(w).await {
                    self.wake(Woken::Internal(Box::new(result)));
                }
            }
        }
        panic!("the group kept asking for work at {} ms", self.ms);
    }

    async fn carry_out(&mut self, w: Work) -> Option<Internal> {
        let ms = self.ms;
        let mut note = |what: String| self.trace.push((ms, what));
        match w {
            Work::StartElection { seen } => {
                note("start election".into());
                Some(Internal::EpochPersisted(
                    self.ctx.state.start_election("g", seen).await,
                ))
            }
            Work::Fence { epoch, fence, .. } => {
                note(format!("fence {}", fence.old_master));
                Some(Internal::Failover(epoch, Input::Fenced(Ok(()))))
            }
            Work::Promote {
                epoch, candidate, ..
            } => {
                note(format!("promote {candidate}"));
                self.servers.get_mut(&candidate).master = None;
                Some(Internal::Failover(epoch, Input::Promoted(Ok(()))))
            }
            Work::PersistAndPublish {
                topology, machine, ..
            } => {
                note(format!("publish {} at {}", topology.master, topology.epoch));
                let epoch = topology.epoch;
                let persisted = self
                    .ctx
                    .state
                    .set_config("g", epoch, &topology.master)
                    .await;
                Some(Internal::Published {
                    epoch,
                    persisted,
                    machine,
                    result: Ok(()),
                })
            }
            Work::Repoint {
                epoch,
                replica,
                master,
                ..
            } => {
                note(format!("repoint {replica} to {master}"));
                self.servers.get_mut(&replica).master = Some(master);
                epoch.map(|e| Internal::Failover(e, Input::RepointSent(replica, Ok(()))))
            }
            Work::Demote { addr, master, .. } => {
                note(format!("demote {addr} to {master}"));
                self.servers.get_mut(&addr).master = Some(master);
                Some(Internal::Demoted(addr, Ok(())))
            }
            Work::Republish { topology, .. } => {
                note(format!(
                    "republish {} at {}",
                    topology.master, topology.epoch
                ));
                None
            }
            other => {
                note(format!("{other:?}"));
                None
            }
        }
    }

    /// The position in the trace of the first entry starting with `what`
    /// (a failure when there is none).
    fn at(&self, what: &str) -> usize {
        self.trace
            .iter()
            .position(|(_, w)| w.starts_with(what))
            .unwrap_or_else(|| panic!("no {what:?} in the trace: {:#?}", self.trace))
    }
}

#[tokio::test]
async fn a_killed_master_is_failed_over_in_order_and_demoted_when_it_returns() {
    let mut b = Bench::new();
    b.run_for(2_000).await;
    assert_eq!(
        b.g.instances.len(),
        3,
        "the replicas are learnt from the master's INFO"
    );
    // While healthy: only the start-up publication of the configured
    // master (once per epoch and process).
    let healthy: Vec<&str> = b.trace.iter().map(|(_, w)| w.as_str()).collect();
    assert_eq!(healthy, ["republish 127.0.0.1:7000 at 0"], "{:#?}", b.trace);

    b.servers.get_mut(&addr(7000)).alive = false;
    let killed = b.ms;
    b.run_for(1_000).await;
    let new = addr(7001);
    assert_eq!(
        b.g.master, new,
        "the replica with the better priority: {:#?}",
        b.trace
    );
    let (fence, promote, publish) = (b.at("fence"), b.at("promote"), b.at("publish"));
    assert!(fence < promote && promote < publish, "{:#?}", b.trace);
    assert_eq!(b.trace[promote].1, format!("promote {new}"));
    assert!(b.at("repoint 127.0.0.1:7002 to 127.0.0.1:7001") > publish);
    // Refused connections: down within down_after_refused (100 ms), not
    // down_after (1 s); the failover itself takes no virtual time here.
    let published_after = b.trace[publish].0 - killed;
    assert!(
        published_after < 400,
        "published {published_after} ms after the kill"
    );
    assert_eq!(b.ctx.state.group("g").config_epoch, 1);

    // The old master comes back empty (a new run id) as a master: it is
    // demoted to the new one.
    {
        let old = b.servers.get_mut(&addr(7000));
        old.alive = true;
        old.offset = 0;
        old.run_id = "f".repeat(40);
        old.replid = "b".repeat(40);
    }
    b.run_for(1_000).await;
    b.at(&format!("demote 127.0.0.1:7000 to {new}"));
    assert_eq!(b.g.master, new);
    assert!(b.servers.get(&addr(7000)).master.is_some());
}

#[tokio::test]
async fn a_master_restarted_empty_before_it_was_seen_down_is_failed_over_for_its_reboot() {
    let mut b = Bench::new();
    b.run_for(2_000).await;
    // Killed and back, empty, within one probe period: the probes never
    // see a refusal long enough for SDOWN, only a new run id with less.
    {
        let m = b.servers.get_mut(&addr(7000));
        m.offset = 0;
        m.run_id = "f".repeat(40);
        m.replid = "b".repeat(40);
    }
    b.run_for(2_000).await;
    let new = addr(7001);
    assert_eq!(b.g.master, new, "{:#?}", b.trace);
    let pause = b.at("Pause");
    let (fence, promote, publish) = (b.at("fence"), b.at("promote"), b.at("publish"));
    assert!(
        pause < promote,
        "paused before the promotion: {:#?}",
        b.trace
    );
    assert!(fence < promote && promote < publish, "{:#?}", b.trace);
    b.at(&format!("demote 127.0.0.1:7000 to {new}"));
}

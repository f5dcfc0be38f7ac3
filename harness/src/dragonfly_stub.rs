//! A Dragonfly stand-in for switchover tests: a small RESP server (tokio,
//! 127.0.0.x) that answers what picket sends to a Dragonfly server with the
//! replies recorded from a real one (`shared/reference/dragonfly.md`,
//! appendix): `INFO` with `dragonfly_version` and Dragonfly's replication
//! section (no `master_repl_offset`, no `run_id`), `PING`, `ROLE`,
//! `REPLICAOF`/`SLAVEOF`, `CLIENT KILL LADDR` (closes every connection of
//! that listener, the sender's too, without a reply), `CLIENT PAUSE` /
//! `UNPAUSE`, `FLUSHALL` (refused inside `MULTI`), `DBSIZE`, `SET`/`GET`,
//! and `REPLTAKEOVER <secs>`: on a replica whose master runs, the replica
//! becomes a master (new replid, data kept) and the old master "exits" (it
//! stops listening and drops its connections); on a master it is a no-op
//! `+OK`. `FAILOVER` and `CLIENT KILL TYPE` fail as on Dragonfly.
//!
//! Stubs live in a [`StubWorld`], which plays the network between them:
//! a replica's link is up while its master runs, is a master and is in the
//! replica's replication history (same `master_replid`), and every write on
//! a master is applied to the replicas linked to it at once (stable sync).
//! Every command each stub receives is recorded for assertions.
//!
//! A master that exits ([`DragonflyStub::kill`]: its connections closed,
//! its port refused) and comes back ([`DragonflyStub::restart_empty_master`])
//! is a new process as a real Dragonfly shows it: a new `master_replid`,
//! `uptime_in_seconds` from 0, no keys.
//!
//! A replica's replication follows Dragonfly's replication fiber (the
//! source read: dragonflydb/dragonfly v1.40.1, commit 434478e00), as far as
//! picket's decisions depend on it:
//! - A replica that loses its master tries it again 500 ms later, and every
//!   500 ms after that (`src/server/replica.cc:246`, `MainReplicationFb`:
//!   `ThisFiber::SleepFor(500ms)` before each reconnect). If the master
//!   answers with another replication id (it restarted), the replica takes a
//!   full copy of it and drops what it held (`InitiateDflySync` →
//!   `JournalExecutor::FlushAll`, `replica.cc:668`; every copy is recorded:
//!   [`DragonflyStub::full_syncs`]), unless
//!   `--break_replication_on_master_restart`
//!   ([`StubWorld::break_replication_on_master_restart`]): then it stops,
//!   its link down and its data kept (`HandleCapaDflyResp`,
//!   `replica.cc:401-407`).
//! - `REPLICAOF NO ONE` on a replica waiting to reconnect stops it at once
//!   but answers only when that sleep ends (`server_family.cc:3360-3383`
//!   `ReplicaOfNoOne` holds `replicaof_mu_` and `Replica::Stop`,
//!   `replica.cc:171-182`, joins the sleeping fiber): after a kill, about
//!   0.4 s after picket sees it down.
//! - `REPLICAOF host port` greets the new master before it touches the
//!   current replication (`ReplicaOfInternal`: `Replica::Start` at
//!   `server_family.cc:3421`, then `Replica::Stop` of the old one at 3439).
//!   A master that is still a replica refuses it (`ReplConf`,
//!   `server_family.cc:3524-3529`: "Replicating a replica is unsupported"; the
//!   replica answers "could not greet master Bad message" and keeps its
//!   replication); one whose `REPLICAOF NO ONE` is under way makes it wait
//!   on its `replicaof_mu_` until it is a master. When that promotion ends
//!   at the same moment as the replica's own retry, the re-point stops the
//!   retry first: it has two round trips left (the rest of its greeting),
//!   the retry at least six (connect, greeting, the flows) before it drops
//!   anything. On a real server that margin is a few round trips, not a
//!   certainty.
//!
//! Not modelled: `INFO` and `ROLE` wait on `replicaof_mu_` during such a
//! promotion (here they answer at once, with the old role), and the
//! candidate accepts writes from the moment `REPLICAOF NO ONE` arrives
//! (`SetMasterFlagOnAllThreads(true)` before `Replica::Stop`); `REPLICAOF`
//! to a server that refuses connections is accepted here (a real one
//! answers "could not connect to master").

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A reply of the stub.
#[derive(Debug, Clone)]
enum Out {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(String),
    Nil,
    Array(Vec<Out>),
    /// Close the connection without replying (`CLIENT KILL LADDR`).
    Close,
}

impl Out {
    fn ok() -> Out {
        Out::Status("OK".into())
    }

    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Out::Status(s) => out.extend_from_slice(format!("+{s}\r\n").as_bytes()),
            Out::Error(e) => out.extend_from_slice(format!("-{e}\r\n").as_bytes()),
            Out::Int(i) => out.extend_from_slice(format!(":{i}\r\n").as_bytes()),
            Out::Bulk(b) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Out::Nil => out.extend_from_slice(b"$-1\r\n"),
            Out::Array(a) => {
                out.extend_from_slice(format!("*{}\r\n", a.len()).as_bytes());
                for x in a {
                    x.encode(out);
                }
            }
            Out::Close => {}
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    Master,
    Replica(SocketAddr),
}

/// How often a replica whose master is gone tries it again (Dragonfly
/// `replica.cc` `MainReplicationFb`: `ThisFiber::SleepFor(500ms)`).
pub const RECONNECT_EVERY: Duration = Duration::from_millis(500);

/// Where a replica's replication fiber is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// Following its master (or about to find it gone).
    Streaming,
    /// Its master went away: the next try at `next`.
    Reconnecting { next: std::time::Instant },
    /// Stopped (`Replica::Stop`, or a master with another replication id
    /// under `--break_replication_on_master_restart`): tries nothing.
    Stopped,
}

/// A full copy a replica took.
#[derive(Debug, Clone)]
pub struct FullSync {
    /// The master it copied.
    pub from: SocketAddr,
    /// When.
    pub at: std::time::Instant,
    /// How many keys it copied (what it held before is gone).
    pub keys: usize,
}

#[derive(Debug)]
struct State {
    role: Role,
    data: BTreeMap<String, String>,
    replid: String,
    /// Journal position: one per write (Dragonfly's offsets are LSNs).
    lsn: u64,
    commands: Vec<Vec<String>>,
    pid: u32,
    /// When this process started (`uptime_in_seconds`).
    started: std::time::Instant,
    /// The replication fiber (replicas only).
    link: Link,
    /// `REPLICAOF NO ONE` waits for the fiber's sleep to end.
    promoting: bool,
    /// Replicas whose `REPLICAOF` to this server waits for that promotion.
    waiters: Vec<SocketAddr>,
    /// Full copies taken, oldest first.
    full_syncs: Vec<FullSync>,
}

struct Node {
    addr: SocketAddr,
    state: Mutex<State>,
    /// Cancelled when the stub "exits"; None while stopped.
    running: Mutex<Option<CancellationToken>>,
    /// Cancelled by `CLIENT KILL LADDR` (then replaced).
    conns: Mutex<CancellationToken>,
    /// Bumped when a promotion ends, for the commands waiting on it.
    changed: tokio::sync::watch::Sender<u64>,
}

impl Node {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_running(&self) -> bool {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    fn stop(&self) {
        if let Some(t) = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            t.cancel();
        }
    }

    fn kill_connections(&self) {
        let mut g = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        g.cancel();
        *g = CancellationToken::new();
    }

    fn conn_token(&self) -> CancellationToken {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Wait (at most 10 s) until a promotion under way has ended; whether
    /// it is a master then.
    async fn wait_promoted(&self) -> bool {
        let mut rx = self.changed.subscribe();
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                if !self.state().promoting {
                    return;
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
        ended.is_ok() && self.state().role == Role::Master
    }

    /// Whether `master` runs, is a master and is in this replica's history.
    fn linked_to(&self, world: &StubWorld, master: SocketAddr) -> bool {
        let replid = self.state().replid.clone();
        world.node(master).is_some_and(|n| {
            n.is_running() && {
                let s = n.state();
                s.role == Role::Master && s.replid == replid
            }
        })
    }
}

struct WorldInner {
    rt: Option<tokio::runtime::Runtime>,
    nodes: Mutex<HashMap<SocketAddr, Arc<Node>>>,
    next_id: Mutex<u64>,
    /// `--break_replication_on_master_restart`: a replica keeps its data
    /// when its master comes back with another replication id.
    break_on_restart: Mutex<bool>,
}

/// The stubs of one test and the runtime that serves them. Dropping it
/// stops every stub.
#[derive(Clone)]
pub struct StubWorld {
    inner: Arc<WorldInner>,
}

/// One Dragonfly stub.
#[derive(Clone)]
pub struct DragonflyStub {
    world: StubWorld,
    node: Arc<Node>,
}

impl Default for StubWorld {
    fn default() -> Self {
        Self::new()
    }
}

impl StubWorld {
    /// A world with its own small runtime.
    pub fn new() -> StubWorld {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("stub runtime: {e}"));
        let world = StubWorld {
            inner: Arc::new(WorldInner {
                rt: Some(rt),
                nodes: Mutex::new(HashMap::new()),
                next_id: Mutex::new(0),
                break_on_restart: Mutex::new(false),
            }),
        };
        // The replicas' replication fibers, stepped every few milliseconds
        // (well under their 500 ms retry).
        let weak = Arc::downgrade(&world.inner);
        world.rt().spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let Some(inner) = weak.upgrade() else { return };
                StubWorld { inner }.step_replication(std::time::Instant::now());
            }
        });
        world
    }

    /// `--break_replication_on_master_restart=true`: a replica never
    /// resyncs from a master with another replication id on its own.
    pub fn break_replication_on_master_restart(&self) {
        *self
            .inner
            .break_on_restart
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = true;
    }

    /// One step of every replica's replication fiber at `now`: promotions
    /// whose sleep ended first (and the re-points waiting on them stop
    /// their replica's old replication), then the retries that are due,
    /// then the links found lost. Never two stubs' locks at once.
    fn step_replication(&self, now: std::time::Instant) {
        let nodes: Vec<Arc<Node>> = self
            .nodes()
            .values()
            .filter(|n| n.is_running())
            .cloned()
            .collect();
        for n in &nodes {
            let waiters = {
                let mut s = n.state();
                let due = matches!(s.link, Link::Reconnecting { next } if next <= now);
                if !(s.promoting && due) {
                    continue;
                }
                s.promoting = false;
                s.role = Role::Master;
                s.replid = self.new_replid();
                s.link = Link::Stopped;
                std::mem::take(&mut s.waiters)
            };
            for w in waiters.iter().filter_map(|w| self.node(*w)) {
                w.state().link = Link::Stopped;
            }
            n.changed.send_modify(|g| *g += 1);
        }
        let break_on_restart = *self
            .inner
            .break_on_restart
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for r in &nodes {
            let (master, replid, next) = {
                let s = r.state();
                match (&s.role, s.link) {
                    (Role::Replica(m), Link::Reconnecting { next }) if next <= now => {
                        (*m, s.replid.clone(), next)
                    }
                    _ => continue,
                }
            };
            let mut next = next;
            while next <= now {
                next += RECONNECT_EVERY;
            }
            // A copy (of the data only for a full sync), so that no two
            // stubs' locks are ever held together.
            let found = self.node(master).filter(|m| m.is_running()).and_then(|m| {
                let s = m.state();
                (s.role == Role::Master).then(|| {
                    let copy =
                        (s.replid != replid && !break_on_restart).then(|| (s.data.clone(), s.lsn));
                    (s.replid.clone(), copy)
                })
            });
            let mut s = r.state();
            s.link = match found {
                // Refused, or a replica that refuses replicas: later.
                None => Link::Reconnecting { next },
                Some((id, _)) if id == replid => Link::Streaming,
                Some((_, None)) => Link::Stopped,
                Some((id, Some((data, lsn)))) => {
                    s.full_syncs.push(FullSync {
                        from: master,
                        at: now,
                        keys: data.len(),
                    });
                    s.data = data;
                    s.lsn = lsn;
                    s.replid = id;
                    Link::Streaming
                }
            };
        }
        for r in &nodes {
            let master = {
                let s = r.state();
                match (&s.role, s.link) {
                    (Role::Replica(m), Link::Streaming) => *m,
                    _ => continue,
                }
            };
            if !r.linked_to(self, master) {
                r.state().link = Link::Reconnecting {
                    next: now + RECONNECT_EVERY,
                };
            }
        }
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.inner.rt.as_ref().unwrap_or_else(|| unreachable!())
    }

    fn nodes(&self) -> MutexGuard<'_, HashMap<SocketAddr, Arc<Node>>> {
        self.inner.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn node(&self, addr: SocketAddr) -> Option<Arc<Node>> {
        self.nodes().get(&addr).cloned()
    }

    fn new_replid(&self) -> String {
        let mut g = self.inner.next_id.lock().unwrap_or_else(|e| e.into_inner());
        *g += 1;
        format!("{:040x}", 0xdf00_0000_u64 + *g)
    }

    /// A master on `ip` (a free port), empty.
    pub fn start_master(&self, ip: &str) -> DragonflyStub {
        self.start(ip, Role::Master)
    }

    /// A replica of `master` on `ip`, fully synced at once.
    pub fn start_replica(&self, ip: &str, master: SocketAddr) -> DragonflyStub {
        let stub = self.start(ip, Role::Master);
        stub.replicaof(master);
        stub
    }

    fn start(&self, ip: &str, role: Role) -> DragonflyStub {
        assert!(
            ip.parse::<std::net::IpAddr>()
                .is_ok_and(|i| i.is_loopback()),
            "stubs listen on loopback only, not {ip}"
        );
        let listener = self
            .rt()
            .block_on(TcpListener::bind((ip, 0)))
            .unwrap_or_else(|e| panic!("stub bind {ip}:0: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("stub local_addr: {e}"));
        let id = {
            let mut g = self.inner.next_id.lock().unwrap_or_else(|e| e.into_inner());
            *g += 1;
            *g
        };
        let node = Arc::new(Node {
            addr,
            state: Mutex::new(State {
                role,
                data: BTreeMap::new(),
                replid: String::new(),
                lsn: 0,
                commands: Vec::new(),
                pid: 40_000 + u32::try_from(id).unwrap_or(0),
                started: std::time::Instant::now(),
                link: Link::Stopped,
                promoting: false,
                waiters: Vec::new(),
                full_syncs: Vec::new(),
            }),
            running: Mutex::new(None),
            conns: Mutex::new(CancellationToken::new()),
            changed: tokio::sync::watch::Sender::new(0),
        });
        node.state().replid = self.new_replid();
        self.nodes().insert(addr, node.clone());
        let stub = DragonflyStub {
            world: self.clone(),
            node,
        };
        stub.serve(listener);
        stub
    }
}

impl Drop for WorldInner {
    fn drop(&mut self) {
        for n in self
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            n.stop();
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl DragonflyStub {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.node.addr
    }

    /// Whether it still listens (false after a takeover made it exit).
    pub fn is_running(&self) -> bool {
        self.node.is_running()
    }

    /// Every command received so far, upper-cased command name first.
    pub fn commands(&self) -> Vec<Vec<String>> {
        self.node.state().commands.clone()
    }

    /// Whether a command starting with `prefix` (e.g. `["CLIENT", "KILL"]`)
    /// was received.
    pub fn received(&self, prefix: &[&str]) -> bool {
        self.commands().iter().any(|c| {
            c.len() >= prefix.len() && c.iter().zip(prefix).all(|(a, b)| a.eq_ignore_ascii_case(b))
        })
    }

    /// `Some(master)` while a replica, None while a master.
    pub fn master(&self) -> Option<SocketAddr> {
        match self.node.state().role {
            Role::Master => None,
            Role::Replica(m) => Some(m),
        }
    }

    /// Every full copy this stub took as a replica, oldest first (its
    /// first sync included).
    pub fn full_syncs(&self) -> Vec<FullSync> {
        self.node.state().full_syncs.clone()
    }

    /// Number of keys.
    pub fn dbsize(&self) -> usize {
        self.node.state().data.len()
    }

    /// Write `n` keys (`key:0` ...) as one client's writes would be,
    /// applied to the linked replicas too.
    pub fn load(&self, n: usize) {
        for i in 0..n {
            self.write(|d| {
                d.insert(format!("key:{i}"), "value".into());
            });
        }
    }

    /// The process dies (`kill -9`): its connections are closed and its
    /// port refuses new ones until [`DragonflyStub::restart_empty_master`].
    /// Its replicas see their link close at once and try again
    /// [`RECONNECT_EVERY`] later.
    pub fn kill(&self) {
        let now = std::time::Instant::now();
        for r in self.world.replicas_of(self.addr()) {
            r.state().link = Link::Reconnecting {
                next: now + RECONNECT_EVERY,
            };
        }
        self.node.stop();
    }

    /// Start again after an exit, as a supervisor would: an empty master on
    /// the same address.
    pub fn restart_empty_master(&self) {
        assert!(!self.is_running(), "{} still runs", self.addr());
        let listener = self
            .world
            .rt()
            .block_on(TcpListener::bind(self.addr()))
            .unwrap_or_else(|e| panic!("stub rebind {}: {e}", self.addr()));
        {
            let mut s = self.node.state();
            s.role = Role::Master;
            s.data.clear();
            s.lsn = 0;
            s.replid = self.world.new_replid();
            s.pid += 1000;
            s.started = std::time::Instant::now();
        }
        self.serve(listener);
    }

    fn serve(&self, listener: TcpListener) {
        let token = CancellationToken::new();
        *self.node.running.lock().unwrap_or_else(|e| e.into_inner()) = Some(token.clone());
        let stub = self.clone();
        self.world.rt().spawn(async move {
            loop {
                let (sock, _) = tokio::select! {
                    _ = token.cancelled() => return,
                    a = listener.accept() => match a {
                        Ok(x) => x,
                        Err(_) => continue,
                    },
                };
                let stub = stub.clone();
                let token = token.clone();
                let conns = stub.node.conn_token();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = token.cancelled() => {}
                        _ = conns.cancelled() => {}
                        _ = stub.connection(sock) => {}
                    }
                });
            }
        });
    }

    async fn connection(&self, mut sock: TcpStream) {
        let mut buf: Vec<u8> = Vec::new();
        let mut chunk = vec![0u8; 16 * 1024];
        let mut tx = Tx::default();
        loop {
            let frame = loop {
                match decode(&buf) {
                    Ok(Some((frame, used))) => {
                        buf.drain(..used);
                        break frame;
                    }
                    Ok(None) => {}
                    Err(_) => return,
                }
                match sock.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let OwnedFrame::Array(items) = frame else {
                return;
            };
            let args: Vec<String> = items
                .into_iter()
                .filter_map(|f| match f {
                    OwnedFrame::BulkString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                    OwnedFrame::SimpleString(b) => Some(String::from_utf8_lossy(&b).into_owned()),
                    OwnedFrame::Integer(i) => Some(i.to_string()),
                    _ => None,
                })
                .collect();
            if args.is_empty() {
                return;
            }
            let reply = self.command(&mut tx, args).await;
            if matches!(reply, Out::Close) {
                return;
            }
            let mut out = Vec::new();
            reply.encode(&mut out);
            if sock.write_all(&out).await.is_err() {
                return;
            }
        }
    }

    async fn command(&self, tx: &mut Tx, mut args: Vec<String>) -> Out {
        args[0] = args[0].to_uppercase();
        self.node.state().commands.push(args.clone());
        let name = args[0].as_str();
        if tx.active && !matches!(name, "EXEC" | "DISCARD" | "MULTI") {
            if name == "FLUSHALL" {
                tx.failed = true;
                return Out::Error("ERR 'FLUSHALL' not allowed inside a transaction".into());
            }
            tx.queued.push(args);
            return Out::Status("QUEUED".into());
        }
        match name {
            "MULTI" => {
                *tx = Tx {
                    active: true,
                    ..Tx::default()
                };
                Out::ok()
            }
            "DISCARD" => {
                *tx = Tx::default();
                Out::ok()
            }
            "EXEC" => {
                let t = std::mem::take(tx);
                if !t.active {
                    return Out::Error("ERR EXEC without MULTI".into());
                }
                if t.failed {
                    return Out::Error(
                        "EXECABORT Transaction discarded because of previous errors".into(),
                    );
                }
                let mut replies = Vec::new();
                for c in t.queued {
                    replies.push(self.simple(c));
                }
                Out::Array(replies)
            }
            "REPLTAKEOVER" => self.repltakeover(&args).await,
            "REPLICAOF" | "SLAVEOF" if args.len() == 3 => self.replicaof_command(&args).await,
            _ => self.simple(args),
        }
    }

    /// Commands that never wait.
    fn simple(&self, args: Vec<String>) -> Out {
        let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
        match args[0].as_str() {
            "PING" => match args.len() {
                1 => Out::Status("PONG".into()),
                _ => Out::Bulk(arg(1).to_owned()),
            },
            "ECHO" => Out::Bulk(arg(1).to_owned()),
            "SELECT" => Out::ok(),
            "INFO" => Out::Bulk(self.info(args.get(1).map(String::as_str))),
            "ROLE" => self.role(),
            "DBSIZE" => Out::Int(i64::try_from(self.dbsize()).unwrap_or(i64::MAX)),
            "GET" => match self.node.state().data.get(arg(1)) {
                Some(v) => Out::Bulk(v.clone()),
                None => Out::Nil,
            },
            "SET" if args.len() >= 3 => {
                if self.master().is_some() {
                    return Out::Error("READONLY You can't write against a read only replica.".into());
                }
                self.write(|d| {
                    d.insert(args[1].clone(), args[2].clone());
                });
                Out::ok()
            }
            "FLUSHALL" => {
                if self.master().is_some() {
                    return Out::Error("READONLY You can't write against a read only replica.".into());
                }
                self.write(BTreeMap::clear);
                Out::ok()
            }
            // Outside MULTI it is `replicaof_command`, which may wait.
            "REPLICAOF" | "SLAVEOF" if args.len() == 3 => {
                Out::Error("ERR the stub runs REPLICAOF outside MULTI only".into())
            }
            "REPLICAOF" | "SLAVEOF" => Out::Error(format!(
                "ERR wrong number of arguments for '{}' command",
                args[0].to_lowercase()
            )),
            "CLIENT" => self.client(&args),
            "FAILOVER" => Out::Error("ERR unknown command `FAILOVER`".into()),
            "AUTH" => Out::Error(
                "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?".into(),
            ),
            other => Out::Error(format!("ERR unknown command `{other}`")),
        }
    }

    fn client(&self, args: &[String]) -> Out {
        let sub = args.get(1).map(|s| s.to_uppercase()).unwrap_or_default();
        match sub.as_str() {
            "SETNAME" | "PAUSE" | "UNPAUSE" => Out::ok(),
            "GETNAME" => Out::Nil,
            "LIST" => Out::Bulk(String::new()),
            "KILL" => match args.get(2).map(|s| s.to_uppercase()).as_deref() {
                Some("LADDR") if args.len() == 4 => {
                    if args[3] == self.addr().to_string() {
                        // Every connection of this listener goes, the
                        // sender's too: no reply is ever written.
                        self.node.kill_connections();
                        Out::Close
                    } else {
                        Out::Error("ERR No such client".into())
                    }
                }
                _ => Out::Error("ERR syntax error".into()),
            },
            _ => Out::Error(format!("ERR Unknown subcommand '{sub}'")),
        }
    }

    /// Apply a write to this master and to its running replicas.
    fn write(&self, f: impl Fn(&mut BTreeMap<String, String>)) {
        let lsn = {
            let mut s = self.node.state();
            f(&mut s.data);
            s.lsn += 1;
            s.lsn
        };
        for r in self.world.replicas_of(self.addr()) {
            let mut s = r.state();
            f(&mut s.data);
            s.lsn = lsn;
        }
    }

    /// `REPLICAOF`/`SLAVEOF` as Dragonfly's `ReplicaOfInternal` runs it.
    async fn replicaof_command(&self, args: &[String]) -> Out {
        if args[1].eq_ignore_ascii_case("no") && args[2].eq_ignore_ascii_case("one") {
            return self.replicaof_no_one().await;
        }
        let Ok(m) = format!("{}:{}", args[1], args[2]).parse::<SocketAddr>() else {
            return Out::Error("ERR Invalid master address".into());
        };
        // Replica::Start: the greeting of the new master comes first, while
        // the current replication goes on. Its REPLCONF is refused by a
        // replica, and waits on the replicaof_mu_ of one being promoted
        // (server_family.cc ReplConf).
        if let Some(target) = self.world.node(m).filter(|n| n.is_running()) {
            let promoting = {
                let mut s = target.state();
                match s.role {
                    Role::Master => None,
                    Role::Replica(_) if s.promoting => {
                        s.waiters.push(self.addr());
                        Some(true)
                    }
                    Role::Replica(_) => Some(false),
                }
            };
            let refused = match promoting {
                None => false,
                Some(false) => true,
                Some(true) => !target.wait_promoted().await,
            };
            if refused {
                // replica.cc Greet: PC_RETURN_ON_BAD_RESPONSE, then
                // Start's "could not greet master " + the error.
                return Out::Error("ERR could not greet master Bad message".into());
            }
        }
        // Replica::Stop of the current replication: it tries nothing more,
        // and the answer waits for its sleep to end.
        let sleeping_until = {
            let mut s = self.node.state();
            let until = match s.link {
                Link::Reconnecting { next } => Some(next),
                _ => None,
            };
            s.link = Link::Stopped;
            until
        };
        if let Some(t) = sleeping_until {
            tokio::time::sleep_until(t.into()).await;
        }
        self.replicaof(m);
        Out::ok()
    }

    /// `REPLICAOF NO ONE`: at once, unless the replica waits to reconnect
    /// to a lost master; then it stops trying now and answers when that
    /// sleep ends (`ReplicaOfNoOne` → `Replica::Stop`), as
    /// [`StubWorld::step_replication`] completes it.
    async fn replicaof_no_one(&self) -> Out {
        let wait = {
            let mut s = self.node.state();
            match (&s.role, s.link) {
                (Role::Master, _) => false,
                (Role::Replica(_), Link::Reconnecting { .. }) => {
                    s.promoting = true;
                    true
                }
                (Role::Replica(_), _) => {
                    s.role = Role::Master;
                    s.replid = self.world.new_replid();
                    s.link = Link::Stopped;
                    false
                }
            }
        };
        if wait && !self.node.wait_promoted().await {
            return Out::Error("ERR replication cancelled".into());
        }
        Out::ok()
    }

    /// A new replication of `m`: a full copy when it is a running master;
    /// else the link stays down, the data kept, and it is tried again.
    fn replicaof(&self, m: SocketAddr) {
        let snapshot = self
            .world
            .node(m)
            .filter(|n| n.is_running() && n.state().role == Role::Master)
            .map(|n| {
                let s = n.state();
                (s.data.clone(), s.lsn, s.replid.clone())
            });
        let now = std::time::Instant::now();
        let mut s = self.node.state();
        s.role = Role::Replica(m);
        s.promoting = false;
        match snapshot {
            Some((data, lsn, replid)) => {
                s.full_syncs.push(FullSync {
                    from: m,
                    at: now,
                    keys: data.len(),
                });
                s.data = data;
                s.lsn = lsn;
                s.replid = replid;
                s.link = Link::Streaming;
            }
            None => {
                s.link = Link::Reconnecting {
                    next: now + RECONNECT_EVERY,
                }
            }
        }
    }

    async fn repltakeover(&self, args: &[String]) -> Out {
        let Some(secs) = args.get(1).and_then(|s| s.parse::<u64>().ok()) else {
            return Out::Error("ERR value is not an integer or out of range".into());
        };
        let Some(master) = self.master() else {
            // Idempotent on a master.
            return Out::ok();
        };
        match self
            .world
            .node(master)
            .filter(|n| n.is_running() && n.state().role == Role::Master)
        {
            Some(old) => {
                // The master locks, hands over and exits (non-cluster mode).
                old.stop();
                {
                    let mut s = self.node.state();
                    s.role = Role::Master;
                    s.replid = self.world.new_replid();
                    s.link = Link::Stopped;
                }
                Out::ok()
            }
            None => {
                tokio::time::sleep(Duration::from_secs(secs)).await;
                Out::Error("ERR Couldn't execute takeover".into())
            }
        }
    }

    fn link_up(&self, master: SocketAddr) -> bool {
        self.node.linked_to(&self.world, master)
    }

    fn info(&self, section: Option<&str>) -> String {
        // A copy, so that no two stubs' locks are ever held together.
        let (role, replid, lsn, pid, uptime, keys) = {
            let s = self.node.state();
            (
                s.role.clone(),
                s.replid.clone(),
                s.lsn,
                s.pid,
                s.started.elapsed().as_secs(),
                s.data.len(),
            )
        };
        let server = format!(
            "# Server\r\nredis_version:7.4.0\r\ndragonfly_version:df-dev\r\nredis_mode:standalone\r\n\
             arch_bits:64\r\nprocess_id:{}\r\nos:Linux 6.18.44 x86_64\r\nthread_count:2\r\n\
             multiplexing_api:iouring\r\ntcp_port:{}\r\nuptime_in_seconds:{uptime}\r\n\
             uptime_in_days:{}\r\n",
            pid,
            self.addr().port(),
            uptime / 86_400
        );
        let replication = match role {
            Role::Master => {
                let replicas = self.world.replicas_of(self.addr());
                let mut t = format!(
                    "# Replication\r\nrole:master\r\nconnected_slaves:{}\r\n",
                    replicas.len()
                );
                for (i, r) in replicas.iter().enumerate() {
                    t.push_str(&format!(
                        "slave{i}:ip={},port={},state=online,lag=0\r\n",
                        r.addr.ip(),
                        r.addr.port()
                    ));
                }
                t.push_str(&format!("master_replid:{replid}\r\n"));
                t
            }
            Role::Replica(m) => format!(
                "# Replication\r\nrole:slave\r\nmaster_host:{}\r\nmaster_port:{}\r\n\
                 master_link_status:{}\r\nmaster_last_io_seconds_ago:0\r\nmaster_sync_in_progress:0\r\n\
                 master_replid:{}\r\nslave_repl_offset:{}\r\nslave_priority:100\r\nslave_read_only:1\r\n\
                 psync_attempts:0\r\npsync_successes:0\r\n",
                m.ip(),
                m.port(),
                if self.link_up(m) { "up" } else { "down" },
                replid,
                lsn
            ),
        };
        let persistence = "# Persistence\r\nloading:0\r\nload_state:done\r\n".to_string();
        let keyspace = if keys > 0 {
            format!("# Keyspace\r\ndb0:keys={keys},expires=0,avg_ttl=-1\r\n")
        } else {
            "# Keyspace\r\n".to_string()
        };
        match section.map(str::to_lowercase).as_deref() {
            None | Some("all") | Some("default") | Some("everything") => {
                format!("{server}\r\n{replication}\r\n{persistence}\r\n{keyspace}")
            }
            Some("server") => server,
            Some("replication") => replication,
            Some("persistence") => persistence,
            Some("keyspace") => keyspace,
            Some(_) => String::new(),
        }
    }

    fn role(&self) -> Out {
        match self.master() {
            None => Out::Array(vec![
                Out::Bulk("master".into()),
                Out::Array(
                    self.world
                        .replicas_of(self.addr())
                        .iter()
                        .map(|r| {
                            Out::Array(vec![
                                Out::Bulk(r.addr.ip().to_string()),
                                Out::Bulk(r.addr.port().to_string()),
                                Out::Bulk("online".into()),
                            ])
                        })
                        .collect(),
                ),
            ]),
            Some(m) => Out::Array(vec![
                Out::Bulk("slave".into()),
                Out::Bulk(m.ip().to_string()),
                Out::Bulk(m.port().to_string()),
                Out::Bulk(
                    if self.link_up(m) {
                        "online"
                    } else {
                        "connecting"
                    }
                    .into(),
                ),
            ]),
        }
    }
}

impl StubWorld {
    /// Running replicas of `master`, in address order.
    fn replicas_of(&self, master: SocketAddr) -> Vec<Arc<Node>> {
        let mut v: Vec<Arc<Node>> = self
            .nodes()
            .values()
            .filter(|n| n.addr != master && n.is_running())
            .filter(|n| n.state().role == Role::Replica(master))
            .cloned()
            .collect();
        // Only those in the master's history are linked to it.
        let replid = self.node(master).map(|m| m.state().replid.clone());
        v.retain(|n| Some(&n.state().replid) == replid.as_ref());
        v.sort_by_key(|n| n.addr);
        v
    }
}

/// `MULTI` state of one connection.
#[derive(Default)]
struct Tx {
    active: bool,
    failed: bool,
    queued: Vec<Vec<String>>,
}

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
//! `uptime_in_seconds` from 0, no keys. Its replicas then behave as a real
//! Dragonfly replica does when it reconnects to a master with another
//! replication id: by default (`--break_replication_on_master_restart=false`)
//! it takes a full copy of it [`StubWorld::resync_after`] the restart
//! (1 s here; about 2 s were measured on a real one) and drops what it
//! held; with the flag ([`StubWorld::break_replication_on_master_restart`])
//! it stays a replica with its link down and keeps its data.

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
}

struct Node {
    addr: SocketAddr,
    state: Mutex<State>,
    /// Cancelled when the stub "exits"; None while stopped.
    running: Mutex<Option<CancellationToken>>,
    /// Cancelled by `CLIENT KILL LADDR` (then replaced).
    conns: Mutex<CancellationToken>,
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
}

struct WorldInner {
    rt: Option<tokio::runtime::Runtime>,
    nodes: Mutex<HashMap<SocketAddr, Arc<Node>>>,
    next_id: Mutex<u64>,
    /// How a replica treats a master with another replication id: None,
    /// it keeps its data (`--break_replication_on_master_restart`); Some,
    /// it takes a full copy that long after the master started.
    resync_after: Mutex<Option<Duration>>,
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
                resync_after: Mutex::new(Some(Duration::from_secs(1))),
            }),
        };
        // The replicas' reconnects, as a real replica retries its master.
        let weak = Arc::downgrade(&world.inner);
        world.rt().spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let Some(inner) = weak.upgrade() else { return };
                StubWorld { inner }.resync_replicas();
            }
        });
        world
    }

    /// A replica of a master that restarted (a new replication id) takes
    /// a full copy of it `after` the restart, dropping what it held.
    pub fn resync_after(&self, after: Duration) {
        *self
            .inner
            .resync_after
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(after);
    }

    /// `--break_replication_on_master_restart=true`: a replica never
    /// resyncs from a master with another replication id on its own.
    pub fn break_replication_on_master_restart(&self) {
        *self
            .inner
            .resync_after
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Replicas whose running master has another replication id than
    /// theirs and has been up for `resync_after`: a full copy of it.
    fn resync_replicas(&self) {
        let Some(after) = *self
            .inner
            .resync_after
            .lock()
            .unwrap_or_else(|e| e.into_inner())
        else {
            return;
        };
        let nodes: Vec<Arc<Node>> = self.nodes().values().cloned().collect();
        for r in nodes.iter().filter(|n| n.is_running()) {
            let (master, replid) = {
                let s = r.state();
                match s.role {
                    Role::Replica(m) => (m, s.replid.clone()),
                    Role::Master => continue,
                }
            };
            let Some(m) = self.node(master).filter(|m| m.is_running()) else {
                continue;
            };
            // A copy, so that no two stubs' locks are ever held together.
            let copy = {
                let s = m.state();
                (s.role == Role::Master && s.replid != replid && s.started.elapsed() >= after)
                    .then(|| (s.data.clone(), s.lsn, s.replid.clone()))
            };
            if let Some((data, lsn, replid)) = copy {
                let mut s = r.state();
                s.data = data;
                s.lsn = lsn;
                s.replid = replid;
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
        stub.replicaof(Some(master));
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
            }),
            running: Mutex::new(None),
            conns: Mutex::new(CancellationToken::new()),
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
    pub fn kill(&self) {
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
            "REPLICAOF" | "SLAVEOF" if args.len() == 3 => {
                if arg(1).eq_ignore_ascii_case("no") && arg(2).eq_ignore_ascii_case("one") {
                    self.replicaof(None);
                    return Out::ok();
                }
                match format!("{}:{}", arg(1), arg(2)).parse::<SocketAddr>() {
                    Ok(m) => {
                        self.replicaof(Some(m));
                        Out::ok()
                    }
                    Err(_) => Out::Error("ERR Invalid master address".into()),
                }
            }
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

    fn replicaof(&self, master: Option<SocketAddr>) {
        match master {
            None => {
                let mut s = self.node.state();
                if s.role != Role::Master {
                    s.role = Role::Master;
                    s.replid = self.world.new_replid();
                }
            }
            Some(m) => {
                // A full sync when the master is up; else the link stays
                // down and the data is kept until it comes.
                let snapshot = self
                    .world
                    .node(m)
                    .filter(|n| n.is_running() && n.state().role == Role::Master)
                    .map(|n| {
                        let s = n.state();
                        (s.data.clone(), s.lsn, s.replid.clone())
                    });
                let mut s = self.node.state();
                s.role = Role::Replica(m);
                if let Some((data, lsn, replid)) = snapshot {
                    s.data = data;
                    s.lsn = lsn;
                    s.replid = replid;
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
        let replid = self.node.state().replid.clone();
        self.world.node(master).is_some_and(|n| {
            n.is_running() && {
                let s = n.state();
                s.role == Role::Master && s.replid == replid
            }
        })
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

//! The listener's shared state: its limits and counters, the registry of
//! open connections (`CLIENT LIST`, `CLIENT KILL`) and the state of one
//! connection as the commands see it.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::acl::{Identity, Users};
use super::pubsub;
use crate::daemon::Daemon;

/// Cap on one request: all of its arguments together (a client has no
/// reason to send more).
pub const MAX_REQUEST_FRAME: usize = 1024 * 1024;
/// Cap on the number of arguments of one command.
pub const MAX_ARGS: usize = 1024;
/// Cap on one encoded reply; a larger one is replaced by an error.
pub const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;
/// Unsent output one connection may hold, in bytes. Replies wait for room
/// (the client is then not read either); pub/sub messages that find no room
/// within [`SLOW_SUBSCRIBER_GRACE`] disconnect the subscriber.
pub const OUTPUT_BUDGET: usize = 8 * 1024 * 1024;
/// How long a pub/sub message may wait for room in the output queue
/// before its subscriber counts as slow (a burst the writer has not had
/// the time to flush is not slowness).
pub const SLOW_SUBSCRIBER_GRACE: Duration = Duration::from_millis(100);

/// The listener's limits (the constants above unless a test says otherwise).
#[derive(Debug, Clone)]
pub struct Limits {
    /// `max_clients`.
    pub max_clients: usize,
    /// [`MAX_REQUEST_FRAME`].
    pub max_request: usize,
    /// [`MAX_ARGS`].
    pub max_args: usize,
    /// [`MAX_REPLY_BYTES`].
    pub max_reply: usize,
    /// [`OUTPUT_BUDGET`].
    pub output_budget: usize,
}

impl Limits {
    /// The production limits with `max_clients` connections.
    pub fn new(max_clients: usize) -> Limits {
        Limits {
            max_clients,
            max_request: MAX_REQUEST_FRAME,
            max_args: MAX_ARGS,
            max_reply: MAX_REPLY_BYTES,
            output_budget: OUTPUT_BUDGET,
        }
    }
}

/// Counters for `INFO stats` and `INFO clients`.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted (including refused ones).
    pub connections_received: AtomicU64,
    /// Connections refused for `max_clients`.
    pub rejected_connections: AtomicU64,
    /// Commands run.
    pub commands_processed: AtomicU64,
    /// Error replies sent.
    pub error_replies: AtomicU64,
    /// Connections open now.
    pub connected: AtomicUsize,
}

/// What `CLIENT LIST` shows of one connection and how to end it.
#[derive(Debug)]
pub struct ClientEntry {
    /// `CLIENT ID`.
    pub id: u64,
    /// Remote address.
    pub addr: SocketAddr,
    /// Local address.
    pub laddr: Option<SocketAddr>,
    /// When it connected.
    pub created: Instant,
    /// Cancelled by `CLIENT KILL` ([`ClientEntry::disconnect`]).
    pub kill: CancellationToken,
    /// Set by [`ClientEntry::disconnect`] before `kill` is cancelled: the
    /// connection's loop reads this flag at every turn, where the token's
    /// own check takes a lock and its wait another (a tenth of the
    /// instructions of a one-client request, callgrind).
    pub killed: AtomicBool,
    /// The parts that change.
    pub state: Mutex<ClientState>,
}

/// The changing part of a [`ClientEntry`].
#[derive(Debug, Clone)]
pub struct ClientState {
    /// `CLIENT SETNAME`.
    pub name: String,
    /// `CLIENT SETINFO LIB-NAME`.
    pub lib_name: String,
    /// `CLIENT SETINFO LIB-VER`.
    pub lib_ver: String,
    /// Last command (lower case, `sentinel|masters` style).
    pub last_cmd: Cow<'static, str>,
    /// When the last command ran.
    pub last_active: Instant,
    /// Subscribed channels.
    pub sub: usize,
    /// Subscribed patterns.
    pub psub: usize,
    /// 2 or 3.
    pub resp: u8,
    /// The user logged in as (`default` before `AUTH`, as in Redis).
    pub user: String,
}

impl ClientEntry {
    /// `CLIENT KILL`: end the connection (its loop sees the flag when the
    /// token's cancellation wakes it).
    pub fn disconnect(&self) {
        self.killed.store(true, Ordering::Release);
        self.kill.cancel();
    }

    /// A copy of the changing part.
    pub fn snapshot(&self) -> ClientState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// One `CLIENT LIST` line (without the newline).
    pub fn line(&self, now: Instant) -> String {
        let s = self.snapshot();
        let flags = if s.sub + s.psub > 0 { "P" } else { "N" };
        format!(
            "id={} addr={} laddr={} fd=0 name={} age={} idle={} flags={flags} db=0 sub={} psub={} ssub=0 multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={} user={} redir=-1 resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr.map(|a| a.to_string()).unwrap_or_default(),
            s.name,
            now.saturating_duration_since(self.created).as_secs(),
            now.saturating_duration_since(s.last_active).as_secs(),
            s.sub,
            s.psub,
            if s.last_cmd.is_empty() {
                "NULL"
            } else {
                &s.last_cmd
            },
            s.user,
            s.resp,
            s.lib_name,
            s.lib_ver,
        )
    }
}

/// The listener's shared state: the daemon, counters and open connections.
#[derive(Debug)]
pub struct Api {
    /// The daemon served.
    pub daemon: Arc<Daemon>,
    /// Counters.
    pub stats: Stats,
    /// Open connections by id.
    pub clients: Mutex<BTreeMap<u64, Arc<ClientEntry>>>,
    /// `max_clients`.
    pub max_clients: usize,
    /// Every limit.
    pub limits: Limits,
    /// The bound port (`INFO server` `tcp_port`).
    pub port: u16,
    /// A random 40-hex id of this process (`INFO server` `run_id`).
    pub run_id: String,
    /// Who may log in and what they may run.
    pub users: Users,
    /// `max_clients` slots, shared by every listener of this API (the TLS
    /// one and the plaintext one of a migration).
    pub(crate) slots: Arc<Semaphore>,
    /// The subscribers, by channel.
    pub hub: Arc<super::hub::Hub>,
    /// `picket_api_clients`, looked up once rather than at every
    /// connection and disconnection.
    pub(crate) clients_gauge: metrics::Gauge,
    next_id: AtomicU64,
}

impl Api {
    /// Shared state for the listeners of `daemon`, the main one bound to
    /// `port`.
    pub fn new(daemon: Arc<Daemon>, limits: Limits, port: u16, users: Users) -> Api {
        let mut rng = rand::rng();
        let run_id = (0..40)
            .map(|_| char::from(b"0123456789abcdef"[rand::Rng::random_range(&mut rng, 0..16)]))
            .collect();
        Api {
            hub: Arc::new(super::hub::Hub::new(&daemon.ctx.events)),
            clients_gauge: metrics::gauge!(crate::metrics::API_CLIENTS),
            daemon,
            stats: Stats::default(),
            clients: Mutex::new(BTreeMap::new()),
            max_clients: limits.max_clients,
            slots: Arc::new(Semaphore::new(limits.max_clients)),
            limits,
            port,
            run_id,
            users,
            next_id: AtomicU64::new(1),
        }
    }

    /// A copy of the open connections.
    pub fn client_list(&self) -> Vec<Arc<ClientEntry>> {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// A fresh `CLIENT ID`.
    pub(crate) fn next_client_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn register(&self, entry: Arc<ClientEntry>) {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(entry.id, entry);
    }

    pub(crate) fn unregister(&self, id: u64) {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }
}

/// Per-connection state seen by the commands.
#[derive(Debug)]
pub struct Conn {
    /// `CLIENT ID`.
    pub id: u64,
    /// Who it is logged in as; `None` before `AUTH` (the default user
    /// from the start when it needs no password).
    pub user: Option<Identity>,
    /// Failed `AUTH` attempts so far (they are slowed down, then the
    /// connection is closed).
    pub auth_failures: u32,
    /// Replies in RESP3 (after `HELLO 3`).
    pub resp3: bool,
    /// `CLIENT SETNAME`.
    pub name: Option<String>,
    /// `CLIENT SETINFO LIB-NAME` / `LIB-VER`.
    pub lib: (String, String),
    /// Close after this reply (`QUIT`).
    pub quit: bool,
    /// Peer address.
    pub peer: SocketAddr,
    /// Channels and patterns.
    pub subs: pubsub::Subscriptions,
    /// The events of its channels and patterns, while subscribed to
    /// anything.
    pub events: Option<Arc<super::hub::Mailbox>>,
    /// This connection in the registry.
    pub entry: Arc<ClientEntry>,
    /// The master address it asked for last.
    pub master: Option<super::sentinel::MasterCache>,
}

impl Conn {
    /// Tell the hub what this connection is subscribed to now: it gets a
    /// mailbox on its first subscription (owed the events from then on)
    /// and loses it on its last unsubscription.
    pub fn sync_events(&mut self, api: &Api) {
        let since = api.daemon.ctx.events.next_seq();
        self.events = api
            .hub
            .update(self.id, self.events.take(), &self.subs, since);
    }

    /// After a command that changed nothing of the connection: its name
    /// (a static one: nothing copied) and when it ran.
    pub(crate) fn touch(&self, cmd: &'static str) {
        let mut s = self.entry.state.lock().unwrap_or_else(|e| e.into_inner());
        if !matches!(&s.last_cmd, Cow::Borrowed(c) if std::ptr::eq(*c, cmd)) {
            s.last_cmd = Cow::Borrowed(cmd);
        }
        s.last_active = Instant::now();
    }

    /// Copy what `CLIENT LIST` shows into the registry entry.
    ///
    /// Runs after every command: a text is copied only when it changed,
    /// and the command's name is moved in (a static one for the commands
    /// every client repeats), so a client repeating a command allocates
    /// and compares nothing long here.
    pub(crate) fn publish_state(&self, cmd: Cow<'static, str>) {
        fn set(to: &mut String, from: &str) {
            if to != from {
                to.clear();
                to.push_str(from);
            }
        }
        let mut s = self.entry.state.lock().unwrap_or_else(|e| e.into_inner());
        set(&mut s.name, self.name.as_deref().unwrap_or_default());
        set(&mut s.lib_name, &self.lib.0);
        set(&mut s.lib_ver, &self.lib.1);
        s.last_cmd = cmd;
        s.last_active = Instant::now();
        s.sub = self.subs.channels();
        s.psub = self.subs.patterns();
        s.resp = if self.resp3 { 3 } else { 2 };
        // Redis shows a connection that has not logged in as default.
        set(
            &mut s.user,
            self.user.as_ref().map_or("default", |u| &u.name),
        );
    }
}

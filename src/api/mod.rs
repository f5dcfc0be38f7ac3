//! The RESP listener: the Sentinel-compatible API for clients and the
//! peer protocol (`PICKET ...`) for the other daemons, on one port.
//!
//! Limits keep a hostile or broken client from hurting the daemon: a
//! maximum number of connections, caps on request size and on the number of
//! arguments, a cap on one reply, a bounded output queue per connection
//! (a subscriber that does not read is disconnected), and `AUTH` before
//! anything else when a password is set.
//!
//! Each connection has two tasks: the reader decodes requests, runs them
//! and forwards events to subscribers; the writer drains a bounded queue of
//! encoded replies into the socket. The queue is bounded twice, in entries
//! and in bytes, so a connection holds at most [`OUTPUT_BUDGET`] bytes of
//! unsent output whatever the client does.

pub mod commands;
pub mod info;
pub mod pubsub;
pub mod reply;
pub mod request;
pub mod sentinel;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, mpsc};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::daemon::Daemon;
use crate::events::Event;
use crate::metrics as m;
pub use reply::Reply;
use request::{RequestDecoder, RequestError};

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
/// Unsent replies and messages one connection may hold, in entries.
pub const OUTPUT_QUEUE: usize = 1024;
/// How long a pub/sub message may wait for room in the output queue
/// before its subscriber counts as slow (a burst the writer has not had
/// the time to flush is not slowness).
pub const SLOW_SUBSCRIBER_GRACE: Duration = Duration::from_millis(100);
/// How long a closing connection may take to flush its last replies.
const FLUSH_GRACE: Duration = Duration::from_secs(2);

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
    /// [`OUTPUT_QUEUE`].
    pub output_queue: usize,
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
            output_queue: OUTPUT_QUEUE,
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
    pub addr: String,
    /// Local address.
    pub laddr: String,
    /// When it connected.
    pub created: Instant,
    /// Cancelled by `CLIENT KILL`.
    pub kill: CancellationToken,
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
    pub last_cmd: String,
    /// When the last command ran.
    pub last_active: Instant,
    /// Subscribed channels.
    pub sub: usize,
    /// Subscribed patterns.
    pub psub: usize,
    /// 2 or 3.
    pub resp: u8,
}

impl ClientEntry {
    /// A copy of the changing part.
    pub fn snapshot(&self) -> ClientState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// One `CLIENT LIST` line (without the newline).
    pub fn line(&self, now: Instant) -> String {
        let s = self.snapshot();
        let flags = if s.sub + s.psub > 0 { "P" } else { "N" };
        format!(
            "id={} addr={} laddr={} fd=0 name={} age={} idle={} flags={flags} db=0 sub={} psub={} ssub=0 multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={} user=default redir=-1 resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
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
    next_id: AtomicU64,
}

impl Api {
    /// Shared state for a listener bound to `port`.
    pub fn new(daemon: Arc<Daemon>, limits: Limits, port: u16) -> Api {
        let mut rng = rand::rng();
        let run_id = (0..40)
            .map(|_| char::from(b"0123456789abcdef"[rand::Rng::random_range(&mut rng, 0..16)]))
            .collect();
        Api {
            daemon,
            stats: Stats::default(),
            clients: Mutex::new(BTreeMap::new()),
            max_clients: limits.max_clients,
            limits,
            port,
            run_id,
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

    fn register(&self, entry: Arc<ClientEntry>) {
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(entry.id, entry);
    }

    fn unregister(&self, id: u64) {
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
    /// Authenticated (always true without a password).
    pub authed: bool,
    /// Replies in RESP3 (after `HELLO 3`).
    pub resp3: bool,
    /// `CLIENT SETNAME`.
    pub name: Option<String>,
    /// `CLIENT SETINFO LIB-NAME` / `LIB-VER`.
    pub lib: (String, String),
    /// Close after this reply (`QUIT`).
    pub quit: bool,
    /// Peer address.
    pub peer: String,
    /// Channels and patterns.
    pub subs: pubsub::Subscriptions,
    /// The event bus, while subscribed to anything.
    pub events: Option<broadcast::Receiver<Event>>,
    /// This connection in the registry.
    pub entry: Arc<ClientEntry>,
}

impl Conn {
    /// Subscribe to the event bus on the first subscription and leave it on
    /// the last unsubscription.
    pub fn sync_events(&mut self, d: &Daemon) {
        if self.subs.count() == 0 {
            self.events = None;
        } else if self.events.is_none() {
            self.events = Some(d.ctx.events.subscribe());
        }
    }

    fn publish_state(&self, cmd: &str) {
        let mut s = self.entry.state.lock().unwrap_or_else(|e| e.into_inner());
        s.name = self.name.clone().unwrap_or_default();
        s.lib_name.clone_from(&self.lib.0);
        s.lib_ver.clone_from(&self.lib.1);
        s.last_cmd = cmd.to_string();
        s.last_active = Instant::now();
        s.sub = self.subs.channels();
        s.psub = self.subs.patterns();
        s.resp = if self.resp3 { 3 } else { 2 };
    }
}

/// Serve the RESP listener until `cancel`.
pub async fn serve(
    listener: TcpListener,
    daemon: Arc<Daemon>,
    max_clients: usize,
    cancel: CancellationToken,
) {
    serve_with(listener, daemon, Limits::new(max_clients), cancel).await;
}

/// [`serve`] with explicit limits.
pub async fn serve_with(
    listener: TcpListener,
    daemon: Arc<Daemon>,
    limits: Limits,
    cancel: CancellationToken,
) {
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let slots = Arc::new(Semaphore::new(limits.max_clients));
    let api = Arc::new(Api::new(daemon, limits, port));
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let (mut sock, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        api.stats
            .connections_received
            .fetch_add(1, Ordering::Relaxed);
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            metrics::counter!(m::API_REJECTED, "reason" => "max_clients").increment(1);
            api.stats
                .rejected_connections
                .fetch_add(1, Ordering::Relaxed);
            // Answer and close without holding a slot; a client that does
            // not read the error cannot keep this task alive for long.
            tokio::spawn(async move {
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    sock.write_all(b"-ERR max number of clients reached\r\n"),
                )
                .await;
            });
            continue;
        };
        let api = api.clone();
        let c = cancel.clone();
        tokio::spawn(async move {
            metrics::gauge!(m::API_CLIENTS).increment(1.0);
            api.stats.connected.fetch_add(1, Ordering::Relaxed);
            let _ = sock.set_nodelay(true);
            tokio::select! {
                _ = c.cancelled() => {}
                _ = handle(sock, peer.to_string(), &api) => {}
            }
            api.stats.connected.fetch_sub(1, Ordering::Relaxed);
            metrics::gauge!(m::API_CLIENTS).decrement(1.0);
            drop(permit);
        });
    }
}

/// One unit of output and the share of the byte budget it holds until it
/// is written.
struct Out {
    bytes: Bytes,
    _permit: Option<OwnedSemaphorePermit>,
}

/// The output side of a connection.
struct Output {
    tx: mpsc::Sender<Out>,
    budget: Arc<Semaphore>,
    size: usize,
}

/// Why output could not be queued.
#[derive(Debug, PartialEq, Eq)]
enum Blocked {
    /// The writer is gone (the socket failed).
    Closed,
    /// No room (only for messages, which never wait).
    Full,
}

impl Output {
    fn permits(&self, len: usize) -> u32 {
        u32::try_from(len.clamp(1, self.size)).unwrap_or(u32::MAX)
    }

    /// Queue a reply, waiting for room.
    async fn reply(&self, bytes: Bytes) -> Result<(), Blocked> {
        let permit = self
            .budget
            .clone()
            .acquire_many_owned(self.permits(bytes.len()))
            .await
            .map_err(|_| Blocked::Closed)?;
        self.tx
            .send(Out {
                bytes,
                _permit: Some(permit),
            })
            .await
            .map_err(|_| Blocked::Closed)
    }

    /// Queue a pub/sub message, waiting at most [`SLOW_SUBSCRIBER_GRACE`]
    /// for room.
    async fn message(&self, bytes: Bytes) -> Result<(), Blocked> {
        let n = self.permits(bytes.len());
        if let Ok(permit) = self.budget.clone().try_acquire_many_owned(n) {
            match self.tx.try_send(Out {
                bytes,
                _permit: Some(permit),
            }) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Closed(_)) => return Err(Blocked::Closed),
                Err(mpsc::error::TrySendError::Full(out)) => {
                    return self.wait_for_room(out).await;
                }
            }
        }
        let out = Out {
            bytes,
            _permit: None,
        };
        self.wait_for_room(out).await
    }

    async fn wait_for_room(&self, mut out: Out) -> Result<(), Blocked> {
        let n = self.permits(out.bytes.len());
        let wait = async {
            if out._permit.is_none() {
                out._permit = Some(
                    self.budget
                        .clone()
                        .acquire_many_owned(n)
                        .await
                        .map_err(|_| Blocked::Closed)?,
                );
            }
            self.tx.send(out).await.map_err(|_| Blocked::Closed)
        };
        match tokio::time::timeout(SLOW_SUBSCRIBER_GRACE, wait).await {
            Ok(r) => r,
            Err(_) => Err(Blocked::Full),
        }
    }
}

async fn write_loop(mut wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Out>) {
    while let Some(out) = rx.recv().await {
        if wr.write_all(&out.bytes).await.is_err() {
            return;
        }
        drop(out);
    }
    let _ = wr.shutdown().await;
}

/// Receive the next event, or wait forever when not subscribed.
async fn next_event(
    rx: &mut Option<broadcast::Receiver<Event>>,
) -> Result<Event, broadcast::error::RecvError> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// How a connection ended.
enum End {
    /// Flush what is queued, then close.
    Flush,
    /// Close at once, dropping queued output.
    Abort,
}

async fn handle(sock: TcpStream, peer: String, api: &Arc<Api>) {
    let laddr = sock.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let (rd, wr) = sock.into_split();
    let (tx, rx) = mpsc::channel(api.limits.output_queue.max(1));
    let size = api.limits.output_budget.clamp(1, Semaphore::MAX_PERMITS);
    let out = Output {
        tx,
        budget: Arc::new(Semaphore::new(size)),
        size,
    };
    let writer = tokio::spawn(write_loop(wr, rx));
    let now = Instant::now();
    let entry = Arc::new(ClientEntry {
        id: api.next_id.fetch_add(1, Ordering::Relaxed),
        addr: peer.clone(),
        laddr,
        created: now,
        kill: CancellationToken::new(),
        state: Mutex::new(ClientState {
            name: String::new(),
            lib_name: String::new(),
            lib_ver: String::new(),
            last_cmd: String::new(),
            last_active: now,
            sub: 0,
            psub: 0,
            resp: 2,
        }),
    });
    api.register(entry.clone());
    let mut conn = Conn {
        id: entry.id,
        authed: api.daemon.ctx.password.is_none(),
        resp3: false,
        name: None,
        lib: Default::default(),
        quit: false,
        peer,
        subs: Default::default(),
        events: None,
        entry: entry.clone(),
    };
    let end = run(&mut conn, api, rd, &out).await;
    api.unregister(entry.id);
    drop(out);
    match end {
        End::Flush => {
            let abort = writer.abort_handle();
            if tokio::time::timeout(FLUSH_GRACE, writer).await.is_err() {
                abort.abort();
            }
        }
        End::Abort => writer.abort(),
    }
}

fn slow_subscriber(conn: &Conn, why: &str) -> End {
    metrics::counter!(m::API_REJECTED, "reason" => "slow_subscriber").increment(1);
    tracing::info!(client = %conn.peer, id = conn.id, "disconnecting a slow subscriber: {why}");
    End::Abort
}

async fn run(
    conn: &mut Conn,
    api: &Arc<Api>,
    rd: tokio::net::tcp::OwnedReadHalf,
    out: &Output,
) -> End {
    let mut frames = FramedRead::new(
        rd,
        RequestDecoder::new(api.limits.max_args, api.limits.max_request),
    );
    let kill = conn.entry.kill.clone();
    loop {
        tokio::select! {
            biased;
            _ = kill.cancelled() => return End::Abort,
            ev = next_event(&mut conn.events) => match ev {
                Ok(ev) => {
                    for msg in conn.subs.messages(&ev) {
                        match out.message(msg.to_bytes(conn.resp3)).await {
                            Ok(()) => {}
                            Err(Blocked::Full) => return slow_subscriber(conn, "output queue full"),
                            Err(Blocked::Closed) => return End::Abort,
                        }
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    return slow_subscriber(conn, &format!("missed {n} events"));
                }
                Err(broadcast::error::RecvError::Closed) => conn.events = None,
            },
            next = frames.next() => {
                let args = match next {
                    None => return End::Flush,
                    Some(Ok(args)) => args,
                    Some(Err(RequestError::Io(_))) => return End::Abort,
                    Some(Err(e)) => {
                        metrics::counter!(m::API_REJECTED, "reason" => e.reason()).increment(1);
                        api.stats.error_replies.fetch_add(1, Ordering::Relaxed);
                        let _ = out.reply(Reply::err(e.to_string()).to_bytes(conn.resp3)).await;
                        return End::Flush;
                    }
                };
                api.stats.commands_processed.fetch_add(1, Ordering::Relaxed);
                let (reply, cmd_name) = tokio::select! {
                    biased;
                    _ = kill.cancelled() => return End::Abort,
                    r = commands::dispatch(api, conn, args) => r,
                };
                conn.publish_state(&cmd_name);
                let mut bytes = reply.to_bytes(conn.resp3);
                if bytes.len() > api.limits.max_reply {
                    metrics::counter!(m::API_REJECTED, "reason" => "reply_too_large").increment(1);
                    bytes = Reply::err(format!(
                        "ERR reply of {} bytes exceeds the limit of {} bytes",
                        bytes.len(),
                        api.limits.max_reply
                    ))
                    .to_bytes(conn.resp3);
                    api.stats.error_replies.fetch_add(1, Ordering::Relaxed);
                } else if reply.is_error() {
                    api.stats.error_replies.fetch_add(1, Ordering::Relaxed);
                }
                let queued = tokio::select! {
                    biased;
                    _ = kill.cancelled() => return End::Abort,
                    q = out.reply(bytes) => q,
                };
                if queued.is_err() {
                    return End::Abort;
                }
                if conn.quit {
                    return End::Flush;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::DaemonCtx;
    use crate::events::Events;
    use crate::quorum::state::StateStore;
    use crate::quorum::table::PeerTable;
    use crate::tilt::Tilt;
    use tokio::io::AsyncReadExt;

    fn daemon(dir: &std::path::Path, password: Option<&str>) -> Arc<Daemon> {
        let config: crate::config::Config = toml::from_str("[daemon]\n").unwrap();
        let events = Events::new();
        let ctx = Arc::new(DaemonCtx {
            id: "test-daemon".into(),
            run_id: "0".repeat(40),
            announce: "127.0.0.1:0".into(),
            state: Arc::new(StateStore::open(dir, Some("test-daemon")).unwrap()),
            peers: vec![],
            peer_table: PeerTable::new(&[]),
            events: events.clone(),
            hello_now: tokio::sync::Notify::new(),
            tilt: Tilt::new(events),
            password: password.map(String::from),
            simulate_failure: Default::default(),
        });
        Arc::new(Daemon {
            ctx,
            groups: Default::default(),
            config: std::sync::RwLock::new(config),
            metrics: None,
            ready: Default::default(),
            group_tasks: Default::default(),
            started: Instant::now(),
        })
    }

    async fn start(
        limits: Limits,
    ) -> (
        Arc<Daemon>,
        SocketAddr,
        CancellationToken,
        tempfile::TempDir,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let d = daemon(dir.path(), None);
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let cancel = CancellationToken::new();
        tokio::spawn(serve_with(l, d.clone(), limits, cancel.clone()));
        (d, addr, cancel, dir)
    }

    use std::net::SocketAddr;

    fn cmd(args: &[&str]) -> Vec<u8> {
        let mut v = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            v.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        v
    }

    async fn read_some(s: &mut TcpStream) -> String {
        let mut buf = vec![0u8; 64 * 1024];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn a_reply_over_the_cap_becomes_an_error() {
        let mut limits = Limits::new(10);
        limits.max_reply = 64;
        let (_d, addr, cancel, _dir) = start(limits).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&cmd(&["INFO"])).await.unwrap();
        let r = read_some(&mut s).await;
        assert!(
            r.starts_with("-ERR reply of ") && r.ends_with("exceeds the limit of 64 bytes\r\n"),
            "{r}"
        );
        s.write_all(&cmd(&["PING"])).await.unwrap();
        assert_eq!(read_some(&mut s).await, "+PONG\r\n");
        cancel.cancel();
    }

    #[tokio::test]
    async fn a_subscriber_that_stops_reading_is_cut_off_and_others_are_not() {
        let mut limits = Limits::new(10);
        limits.output_queue = 8;
        limits.output_budget = 64 * 1024;
        let (d, addr, cancel, _dir) = start(limits).await;
        // A tiny receive window, so that the kernel holds little for it.
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        let mut stalled = sock.connect(addr).await.unwrap();
        stalled
            .write_all(&cmd(&["SUBSCRIBE", "+sdown"]))
            .await
            .unwrap();
        assert!(read_some(&mut stalled).await.contains("subscribe"));
        let mut good = TcpStream::connect(addr).await.unwrap();
        good.write_all(&cmd(&["HELLO", "3"])).await.unwrap();
        read_some(&mut good).await;
        good.write_all(&cmd(&["SUBSCRIBE", "+sdown"]))
            .await
            .unwrap();
        assert!(read_some(&mut good).await.starts_with(">3\r\n"));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0usize;
            while !stop2.load(Ordering::SeqCst) {
                match tokio::time::timeout(Duration::from_millis(200), good.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return (total, false),
                    Ok(Ok(n)) => total += n,
                    Err(_) => {}
                }
            }
            (total, true)
        });
        let mut admin = TcpStream::connect(addr).await.unwrap();
        // Paced bursts, so that the broadcast never lags: the cut-off comes
        // from the stalled connection's own queue. At most 64 MB in all.
        let payload = "y".repeat(1000);
        let mut cut_off = false;
        for _ in 0..6400 {
            for _ in 0..10 {
                d.ctx
                    .events
                    .emit(crate::events::EventKind::Sdown, payload.clone());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            admin
                .write_all(&cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]))
                .await
                .unwrap();
            let list = read_some(&mut admin).await;
            if list.matches("sub=1").count() == 1 {
                cut_off = true;
                break;
            }
        }
        assert!(cut_off, "the stalled subscriber was not disconnected");
        stop.store(true, Ordering::SeqCst);
        let (got, alive) = reader.await.unwrap();
        assert!(
            alive,
            "the reading subscriber was cut off after {got} bytes"
        );
        // The stalled one reads what was buffered, then end of stream.
        let mut buf = vec![0u8; 1 << 16];
        let closed = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match stalled.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the stalled subscriber's socket stays open");
        cancel.cancel();
    }
}

//! The RESP listener's sockets: binding with the configured backlog,
//! accepting connections within `max_clients`, one task per connection
//! that reads, runs every complete request of a read and writes their
//! replies at once, the bounded output buffer and the pub/sub forwarding.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use futures::FutureExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::codec::Decoder;
use tokio_util::sync::CancellationToken;

use super::commands;
use super::conn::{Api, ClientEntry, ClientState, Conn, SLOW_SUBSCRIBER_GRACE};
use super::hub::{Mail, Mailbox};
use super::reply::Reply;
use super::request::{RequestDecoder, RequestError};
use crate::events::Event;
use crate::metrics as m;
use crate::tls::Shared;

/// How long a closing connection may take to flush its last replies.
const FLUSH_GRACE: Duration = Duration::from_secs(2);

/// How long a client of a TLS listener may take to finish its handshake
/// (it holds a `max_clients` slot meanwhile).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bind a RESP listener on `addr` (every address it resolves to, in turn,
/// as [`TcpListener::bind`]) with an accept queue of `backlog`: the
/// standard library's 128 overflowed when a few thousand clients connected
/// at once (each overflow costs its client a 1 s SYN retransmit), and
/// Redis' and Sentinel's 511 still did on a busy machine: the kernel
/// completes a client's connection without the listener, so connections
/// opened one after another fill 511 places in about 15 ms while the
/// listener's thread waits for a core.
pub async fn bind(addr: &str, backlog: u32) -> std::io::Result<TcpListener> {
    let mut last = None;
    for a in tokio::net::lookup_host(addr).await? {
        let sock = if a.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        // As the standard library: a restarted daemon binds its port again
        // while old connections are in TIME_WAIT.
        sock.set_reuseaddr(true)?;
        match sock.bind(a).and_then(|()| sock.listen(backlog)) {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{addr} resolves to no address"),
        )
    }))
}

/// [`serve`] on a thread of its own, with a runtime of one thread, until
/// `cancel`; returns once that thread has stopped.
///
/// Why: on the daemon's runtime, whose worker threads steal tasks from
/// each other, a request could wake a second worker (a futex call and a
/// context switch for a task that one thread could run at once), and the
/// connections' tasks moved between threads. One thread serving every
/// connection, as Sentinel's event loop does, costs one `epoll_wait`, one
/// read and one write per request or pipelined batch (strace), and the
/// API does not compete with the groups' probes for a worker. The
/// commands still reach the groups by their channels.
pub async fn serve_on_own_thread(
    api: Arc<Api>,
    listener: TcpListener,
    tls: Option<Shared<rustls::ServerConfig>>,
    cancel: CancellationToken,
) {
    // The listener is registered with this runtime's reactor: hand the
    // socket itself to the new runtime.
    let std_listener = match listener.into_std() {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "cannot move the RESP listener to its thread");
            return;
        }
    };
    let (done, stopped) = tokio::sync::oneshot::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("picket-api".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the RESP listener's runtime");
                    return;
                }
            };
            rt.block_on(async move {
                match TcpListener::from_std(std_listener) {
                    Ok(l) => {
                        tokio::select! {
                            () = serve(api, l, tls, cancel) => {}
                            () = super::spin::run() => {}
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "cannot serve the RESP listener"),
                }
            });
            // Dropping the runtime ends the connections' tasks.
            drop(rt);
            drop(done);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the RESP listener's thread");
        return;
    }
    let _ = stopped.await;
}

/// Serve one listener of `api` until `cancel`: TLS with the configuration
/// in `tls` at each handshake (it may be replaced while serving), or
/// plaintext without.
pub async fn serve(
    api: Arc<Api>,
    listener: TcpListener,
    tls: Option<Shared<rustls::ServerConfig>>,
    cancel: CancellationToken,
) {
    // The events are passed on to the subscribers on the listener's own
    // thread (the first listener's, when there are two): their wake-ups
    // stay on the thread that runs the subscribers.
    let hub = tokio::spawn(api.hub.clone().run());
    let local = listener
        .local_addr()
        .ok()
        .filter(|a| !a.ip().is_unspecified());
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => {
                hub.abort();
                // Every connection ends with the listener (one that
                // registers after this sees `cancel` itself).
                for c in api.client_list() {
                    c.disconnect();
                }
                return;
            }
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
        let Ok(permit) = api.slots.clone().try_acquire_owned() else {
            metrics::counter!(m::API_REJECTED, "reason" => "max_clients").increment(1);
            api.stats
                .rejected_connections
                .fetch_add(1, Ordering::Relaxed);
            // Answer and close without holding a slot; a client that does
            // not read the error cannot keep this task alive for long. A
            // TLS client could not read a plaintext error: it is closed.
            if tls.is_none() {
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(1),
                        sock.write_all(b"-ERR max number of clients reached\r\n"),
                    )
                    .await;
                });
            }
            continue;
        };
        let api = api.clone();
        let c = cancel.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            api.clients_gauge.increment(1.0);
            api.stats.connected.fetch_add(1, Ordering::Relaxed);
            let _ = sock.set_nodelay(true);
            // The listener's own address unless it listens on every
            // address (a system call and a text less per connection).
            let laddr = local.or_else(|| sock.local_addr().ok());
            // Not in a select with `c.cancelled()`: that wait was polled
            // at every wake-up of the connection, two locks per request.
            // The listener disconnects every connection when it stops.
            accept(sock, tls, peer, laddr, &api, &c).await;
            api.stats.connected.fetch_sub(1, Ordering::Relaxed);
            api.clients_gauge.decrement(1.0);
            drop(permit);
        });
    }
}

/// Run the TLS handshake when the listener has TLS, then the connection.
async fn accept(
    sock: TcpStream,
    tls: Option<Shared<rustls::ServerConfig>>,
    peer: SocketAddr,
    laddr: Option<SocketAddr>,
    api: &Arc<Api>,
    cancel: &CancellationToken,
) {
    let Some(cfg) = tls else {
        // Owned halves of the socket itself: no lock between reading and
        // writing, as the generic split needs. The writing half is shared
        // with the hub, which writes to a parked subscriber itself.
        let (rd, wr) = sock.into_split();
        let wr = Arc::new(wr);
        let direct = Some(wr.clone());
        return handle(rd, SharedWrite(wr), direct, peer, laddr, api, cancel).await;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(crate::tls::current(&cfg));
    let why = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await {
        Ok(Ok(stream)) => {
            let (rd, wr) = tokio::io::split(stream);
            // No direct writes from the hub: TLS records are the stream's.
            return handle(rd, wr, None, peer, laddr, api, cancel).await;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no handshake within {TLS_HANDSHAKE_TIMEOUT:?}"),
    };
    metrics::counter!(m::API_REJECTED, "reason" => "tls_handshake").increment(1);
    // An unknown CA, an expired or misnamed certificate: the operator
    // needs the reason, the client only gets the TLS alert.
    tracing::info!(client = %peer, "TLS handshake refused: {why}");
}

/// Room asked of the input buffer before a read: a batch of pipelined
/// requests (16 `SENTINEL get-master-addr-by-name` are about 1 KiB) fits
/// in one read, and an idle connection holds no more. A read that fills
/// it doubles it, up to [`MAX_READ_CHUNK`].
const READ_CHUNK: usize = 4 * 1024;
/// The most a read asks for.
const MAX_READ_CHUNK: usize = 64 * 1024;
/// An output buffer left larger than this once written (after a large
/// reply) is given back instead of kept for the next reply.
const KEEP_OUTPUT: usize = 64 * 1024;

/// The writing half of a plaintext connection, shared with the hub while
/// the connection is parked ([`Mailbox::park`]). Writes through the
/// socket's readiness as the half itself does; the connection's own
/// writes and the hub's never overlap (the hub writes only while the
/// connection is parked, under the mailbox's lock).
struct SharedWrite(Arc<OwnedWriteHalf>);

impl AsyncWrite for SharedWrite {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let sock: &TcpStream = (*self.0).as_ref();
        loop {
            std::task::ready!(sock.poll_write_ready(cx))?;
            match sock.try_write(buf) {
                // Readiness was stale: cleared by `try_write`, wait again.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return std::task::Poll::Ready(r),
            }
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        // Shared only while parked, and a closing connection is not: the
        // half is this one's alone. Otherwise dropping the last share
        // shuts the writing side down as well.
        match Arc::get_mut(&mut self.0) {
            Some(half) => std::pin::Pin::new(half).poll_shutdown(cx),
            None => std::task::Poll::Ready(Ok(())),
        }
    }
}

/// A parked connection ([`Mailbox::park`]): unparked by [`Parked::end`],
/// or when this is dropped however the connection's task ends.
struct Parked(Option<Arc<Mailbox>>);

impl Parked {
    /// Unpark: the end of a message the hub began writing, which goes
    /// out before anything of the connection's own.
    fn end(mut self) -> Option<bytes::Bytes> {
        self.0.take().and_then(|mb| mb.unpark())
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        if let Some(mb) = self.0.take() {
            mb.unpark();
        }
    }
}

/// A pub/sub message that found no room in the output buffer, and when
/// its subscriber counts as slow.
struct Held {
    bytes: BytesMut,
    deadline: Instant,
}

/// One connection's socket and buffers. One task reads, runs and writes:
/// the replies to one read's requests are encoded into one buffer and
/// written with one system call, and no other task is woken per request.
struct Io<R, W> {
    rd: R,
    wr: W,
    decoder: RequestDecoder,
    input: BytesMut,
    /// What the next read asks room for.
    chunk: usize,
    /// Encoded replies and messages not yet written.
    output: BytesMut,
    /// [`Limits::output_budget`](super::Limits::output_budget).
    budget: usize,
    held: Option<Held>,
    /// The socket the hub may write to while the connection is parked
    /// (plaintext only).
    direct: Option<Arc<OwnedWriteHalf>>,
}

impl<R, W: AsyncWrite + Unpin> Io<R, W> {
    /// Write until at most `keep` bytes are left unsent.
    async fn drain_to(&mut self, keep: usize) -> std::io::Result<()> {
        while self.output.len() > keep {
            let n = self.wr.write(&self.output).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::WriteZero.into());
            }
            self.wrote(n);
        }
        if self.output.is_empty() {
            self.wr.flush().await?;
        }
        Ok(())
    }

    /// `n` bytes went out: drop them, and take in a held message if it
    /// fits now.
    fn wrote(&mut self, n: usize) {
        self.output.advance(n);
        if self.output.is_empty() {
            if self.output.capacity() > KEEP_OUTPUT {
                self.output = BytesMut::new();
            } else {
                // Back to the start of the buffer, its capacity kept.
                self.output.clear();
            }
        }
        if self
            .held
            .as_ref()
            .is_some_and(|h| self.output.len() + h.bytes.len() <= self.budget)
            && let Some(h) = self.held.take()
        {
            self.output.extend_from_slice(&h.bytes);
        }
    }
}

/// Receive the next mail, or wait forever when not subscribed; `Err(n)`
/// once `n` events were missed.
async fn next_event(mailbox: &Option<Arc<Mailbox>>) -> Result<Mail, u64> {
    match mailbox {
        Some(mb) => mb.recv().await,
        None => std::future::pending().await,
    }
}

/// Wait until `held`'s deadline, or forever when nothing is held.
async fn held_deadline(held: &Option<Held>) {
    match held {
        Some(h) => tokio::time::sleep_until(h.deadline).await,
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

async fn handle<R, W>(
    rd: R,
    wr: W,
    direct: Option<Arc<OwnedWriteHalf>>,
    peer: SocketAddr,
    laddr: Option<SocketAddr>,
    api: &Arc<Api>,
    cancel: &CancellationToken,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut io = Io {
        rd,
        wr,
        decoder: RequestDecoder::new(api.limits.max_args, api.limits.max_request),
        input: BytesMut::new(),
        chunk: READ_CHUNK,
        output: BytesMut::new(),
        budget: api.limits.output_budget.max(1),
        held: None,
        direct,
    };
    let now = Instant::now();
    let entry = Arc::new(ClientEntry {
        id: api.next_client_id(),
        addr: peer,
        laddr,
        created: now,
        kill: CancellationToken::new(),
        killed: Default::default(),
        state: Mutex::new(ClientState {
            name: String::new(),
            lib_name: String::new(),
            lib_ver: String::new(),
            last_cmd: Default::default(),
            last_active: now,
            sub: 0,
            psub: 0,
            resp: 2,
            user: "default".into(),
        }),
    });
    api.register(entry.clone());
    // The listener stopped before this connection was registered: it
    // was not among those it disconnected.
    if cancel.is_cancelled() {
        entry.disconnect();
    }
    let mut conn = Conn {
        id: entry.id,
        user: api.users.initial(),
        auth_failures: 0,
        resp3: false,
        name: None,
        lib: Default::default(),
        quit: false,
        peer,
        subs: Default::default(),
        events: None,
        entry: entry.clone(),
        master: None,
    };
    let end = {
        let _registered = Registered { api, id: entry.id };
        run(&mut conn, api, &mut io).await
    };
    if let End::Flush = end {
        let _ = tokio::time::timeout(FLUSH_GRACE, async {
            io.drain_to(0).await?;
            io.wr.shutdown().await
        })
        .await;
    }
}

/// A connection in the registry (`CLIENT LIST`) and the hub until it ends,
/// however its task ends (dropped with the runtime too).
struct Registered<'a> {
    api: &'a Api,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.api.unregister(self.id);
        self.api.hub.remove(self.id);
    }
}

fn slow_subscriber(conn: &Conn, why: &str) -> End {
    metrics::counter!(m::API_REJECTED, "reason" => "slow_subscriber").increment(1);
    tracing::info!(client = %conn.peer, id = conn.id, "disconnecting a slow subscriber: {why}");
    End::Abort
}

/// What one turn of the connection's loop saw.
enum Turn {
    Killed,
    Event(Result<Mail, u64>),
    Read(std::io::Result<usize>),
    Wrote(std::io::Result<usize>),
    Slow,
}

async fn run<R, W>(conn: &mut Conn, api: &Arc<Api>, io: &mut Io<R, W>) -> End
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let kill = conn.entry.kill.clone();
    let entry = conn.entry.clone();
    // One wait for `CLIENT KILL`, registered (with this task's waker) by
    // the first turn only: a new one per turn would register and remove a
    // waiter under a lock each time, and even re-polling the one wait
    // takes two locks. Later turns read the flag `disconnect` sets before
    // it cancels the token, whose cancellation then wakes this task.
    let wait = kill.cancelled();
    tokio::pin!(wait);
    let mut registered = false;
    loop {
        let killed = std::future::poll_fn(|cx| {
            if entry.killed.load(Ordering::Acquire) {
                return std::task::Poll::Ready(());
            }
            if !registered {
                registered = true;
                return wait.as_mut().poll(cx);
            }
            std::task::Poll::Pending
        });
        // Read while the unsent output is within the budget (replies wait
        // for room: the client is then not read either); write whenever
        // something is unsent; take events unless one is already held.
        let reading = io.output.len() < io.budget && io.held.is_none();
        let room = io.input.capacity() - io.input.len();
        if reading && room < io.chunk / 4 {
            io.input.reserve(io.chunk);
        }
        let room = io.input.capacity() - io.input.len();
        // A subscriber with nothing to write waits parked: the hub writes
        // its channels' messages to its socket without waking this task.
        let parked = match (&conn.events, &io.direct) {
            (Some(mb), Some(sock))
                if io.output.is_empty()
                    && io.held.is_none()
                    && conn.subs.patterns() == 0
                    && mb.park(sock, conn.resp3) =>
            {
                Some(Parked(Some(mb.clone())))
            }
            _ => None,
        };
        let turn = tokio::select! {
            biased;
            _ = killed => Turn::Killed,
            _ = held_deadline(&io.held) => Turn::Slow,
            n = io.wr.write(&io.output), if !io.output.is_empty() => Turn::Wrote(n),
            ev = next_event(&conn.events), if io.held.is_none() => Turn::Event(ev),
            n = io.rd.read_buf(&mut io.input), if reading => Turn::Read(n),
        };
        // Whatever this turn writes goes after what the hub wrote, never
        // into the middle of it: the end of a message the hub began goes
        // first (the output is empty while parked); and the commands may
        // change what the connection is subscribed to.
        if let Some(rest) = parked.and_then(Parked::end) {
            io.output.extend_from_slice(&rest);
        }
        match turn {
            Turn::Killed => return End::Abort,
            Turn::Slow => return slow_subscriber(conn, "output queue full"),
            Turn::Wrote(Ok(n)) if n > 0 => {
                io.wrote(n);
                if io.output.is_empty() && io.wr.flush().await.is_err() {
                    return End::Abort;
                }
            }
            Turn::Wrote(_) => return End::Abort,
            Turn::Event(Ok(mail)) => {
                // Every event already waiting, at once (a failover emits
                // a burst): one wake-up and one write instead of one per
                // event.
                let mut next = Some(mail);
                while let Some(mail) = next.take() {
                    match mail {
                        // The end of a message the hub began: first, whole.
                        Mail::Rest(b) => io.output.extend_from_slice(&b),
                        Mail::Event(ev) => queue_messages(conn, io, &ev),
                    }
                    if io.held.is_some() {
                        break;
                    }
                    next = match conn.events.as_ref().map(|mb| mb.try_recv()) {
                        Some(Err(n)) => {
                            return slow_subscriber(conn, &format!("missed {n} events"));
                        }
                        Some(Ok(ev)) => ev,
                        None => None,
                    };
                }
                // Written at once, as replies are (the socket is almost
                // always writable), instead of in another turn of the loop
                // for each subscriber of a fan-out. Not waited for: a
                // subscriber that does not read is left to the loop (its
                // deadline, `CLIENT KILL`).
                if !io.output.is_empty()
                    && let Some(r) = io.wr.write(&io.output).now_or_never()
                {
                    match r {
                        Ok(n) if n > 0 => io.wrote(n),
                        _ => return End::Abort,
                    }
                    if io.output.is_empty() && io.wr.flush().await.is_err() {
                        return End::Abort;
                    }
                }
            }
            Turn::Event(Err(n)) => {
                return slow_subscriber(conn, &format!("missed {n} events"));
            }
            Turn::Read(Ok(0)) => return End::Flush,
            Turn::Read(Ok(n)) => {
                if n >= room {
                    io.chunk = (io.chunk * 2).min(MAX_READ_CHUNK);
                }
                if let Some(end) = answer(conn, api, io, &kill).await {
                    return end;
                }
                // One write for the whole batch, at once: the socket is
                // almost always writable, and the next turn reads.
                if !io.output.is_empty() {
                    match io.wr.write(&io.output).await {
                        Ok(n) if n > 0 => io.wrote(n),
                        _ => return End::Abort,
                    }
                    if io.output.is_empty() && io.wr.flush().await.is_err() {
                        return End::Abort;
                    }
                }
            }
            Turn::Read(Err(_)) => return End::Abort,
        }
    }
}

/// Encode what `ev` means for this connection into its output, or hold it
/// when there is no room (then the subscriber has
/// [`SLOW_SUBSCRIBER_GRACE`] to make room).
fn queue_messages<R, W>(conn: &Conn, io: &mut Io<R, W>, ev: &Event) {
    let start = io.output.len();
    conn.subs.encode_messages(ev, &mut io.output, conn.resp3);
    if io.output.len() > io.budget {
        io.held = Some(Held {
            bytes: io.output.split_off(start),
            deadline: Instant::now() + SLOW_SUBSCRIBER_GRACE,
        });
    }
}

/// Run every complete request in the input buffer, encoding the replies
/// into the output buffer. `Some` when the connection ends.
async fn answer<R, W: AsyncWrite + Unpin>(
    conn: &mut Conn,
    api: &Arc<Api>,
    io: &mut Io<R, W>,
    kill: &CancellationToken,
) -> Option<End> {
    // Counted once per batch: the counter is shared by every worker
    // thread, and one increment per request made them fight over it.
    let mut ran = 0u64;
    let end = answer_batch(conn, api, io, kill, &mut ran).await;
    api.stats
        .commands_processed
        .fetch_add(ran, Ordering::Relaxed);
    super::spin::batch_answered();
    end
}

async fn answer_batch<R, W: AsyncWrite + Unpin>(
    conn: &mut Conn,
    api: &Arc<Api>,
    io: &mut Io<R, W>,
    kill: &CancellationToken,
    ran: &mut u64,
) -> Option<End> {
    loop {
        let args = match io.decoder.decode(&mut io.input) {
            Ok(Some(args)) => args,
            Ok(None) => return None,
            Err(RequestError::Io(_)) => return Some(End::Abort),
            Err(e) => {
                metrics::counter!(m::API_REJECTED, "reason" => e.reason()).increment(1);
                api.stats.error_replies.fetch_add(1, Ordering::Relaxed);
                Reply::err(e.to_string()).encode(&mut io.output, conn.resp3);
                return Some(End::Flush);
            }
        };
        *ran += 1;
        let reply = if let Some((reply, name)) = commands::hot(api, conn, &args) {
            conn.touch(name);
            reply
        } else {
            // The command first: most complete at once, and then the wait
            // for `CLIENT KILL` is never polled (nor registered).
            let (reply, name) = tokio::select! {
                biased;
                r = commands::dispatch(api, conn, args) => r,
                _ = kill.cancelled() => return Some(End::Abort),
            };
            conn.publish_state(Cow::Owned(name));
            reply
        };
        let start = io.output.len();
        reply.encode(&mut io.output, conn.resp3);
        let len = io.output.len() - start;
        if len > api.limits.max_reply {
            io.output.truncate(start);
            metrics::counter!(m::API_REJECTED, "reason" => "reply_too_large").increment(1);
            Reply::err(format!(
                "ERR reply of {len} bytes exceeds the limit of {} bytes",
                api.limits.max_reply
            ))
            .encode(&mut io.output, conn.resp3);
            api.stats.error_replies.fetch_add(1, Ordering::Relaxed);
        } else if reply.is_error() {
            api.stats.error_replies.fetch_add(1, Ordering::Relaxed);
        }
        if conn.quit {
            return Some(End::Flush);
        }
        if io.output.len() >= io.budget {
            // A long pipeline of large replies: wait for room before the
            // next request, as a client that does not read is not read.
            let room = tokio::select! {
                biased;
                _ = kill.cancelled() => return Some(End::Abort),
                r = io.drain_to(io.budget / 2) => r,
            };
            if room.is_err() {
                return Some(End::Abort);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conn::Limits;
    use crate::context::DaemonCtx;
    use crate::daemon::Daemon;
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
        let api = Arc::new(Api::new(
            d.clone(),
            limits,
            addr.port(),
            crate::api::acl::Users::single_password(None),
        ));
        tokio::spawn(serve(api, l, None, cancel.clone()));
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
    async fn connections_end_when_the_listener_stops() {
        let (_d, addr, cancel, _dir) = start(Limits::new(10)).await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(&cmd(&["PING"])).await.unwrap();
        assert_eq!(read_some(&mut idle).await, "+PONG\r\n");
        let mut sub = TcpStream::connect(addr).await.unwrap();
        sub.write_all(&cmd(&["SUBSCRIBE", "+sdown"])).await.unwrap();
        assert!(read_some(&mut sub).await.contains("subscribe"));
        cancel.cancel();
        for s in [&mut idle, &mut sub] {
            let mut buf = [0u8; 64];
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                .await
                .expect("the connection stays open after the listener stopped");
            assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
        }
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

    /// The hub's direct writes, its partial ones (a small receive window
    /// fills at once) and the connection's own replies on one socket:
    /// every message arrives once, whole and in order, and every reply
    /// whole between them. Which interleavings occur depends on timing;
    /// what is checked does not.
    #[tokio::test]
    async fn a_subscriber_that_also_pings_gets_every_message_once_and_every_reply_whole() {
        let (d, addr, cancel, _dir) = start(Limits::new(10)).await;
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.set_recv_buffer_size(4096).unwrap();
        let s = sock.connect(addr).await.unwrap();
        let (mut rd, mut wr) = s.into_split();
        wr.write_all(&cmd(&["SUBSCRIBE", "+sdown"])).await.unwrap();
        let want_sub = b"*3\r\n$9\r\nsubscribe\r\n$6\r\n+sdown\r\n:1\r\n";
        let mut got = vec![0u8; want_sub.len()];
        tokio::time::timeout(Duration::from_secs(5), rd.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&got[..], &want_sub[..]);
        const EVENTS: usize = 2000;
        const PINGS: usize = EVENTS / 10;
        let pad = "p".repeat(2000);
        let payload = |i: usize| format!("{i:06} {pad}");
        let message = |i: usize| {
            let p = payload(i);
            format!(
                "*3\r\n$7\r\nmessage\r\n$6\r\n+sdown\r\n${}\r\n{p}\r\n",
                p.len()
            )
            .into_bytes()
        };
        let pong = b"*2\r\n$4\r\npong\r\n$0\r\n\r\n";
        // The reader takes in everything the messages and pongs add up to.
        let total = (0..EVENTS).map(|i| message(i).len()).sum::<usize>() + PINGS * pong.len();
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; total];
            tokio::time::timeout(Duration::from_secs(60), rd.read_exact(&mut buf))
                .await
                .expect("everything within 60 s")
                .expect("the connection stays open");
            buf
        });
        for i in 0..EVENTS {
            d.ctx
                .events
                .emit(crate::events::EventKind::Sdown, payload(i));
            if i % 10 == 9 {
                wr.write_all(&cmd(&["PING"])).await.unwrap();
                // Paced, so that the bus never lags (4,096 events).
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let buf = reader.await.unwrap();
        let (mut at, mut next, mut pongs) = (0usize, 0usize, 0usize);
        while at < buf.len() {
            if buf[at..].starts_with(pong) {
                at += pong.len();
                pongs += 1;
                continue;
            }
            let m = message(next);
            assert!(
                buf[at..].starts_with(&m),
                "at byte {at}, after {next} messages and {pongs} pongs: {:?}",
                String::from_utf8_lossy(&buf[at..(at + 80).min(buf.len())])
            );
            at += m.len();
            next += 1;
        }
        assert_eq!((next, pongs), (EVENTS, PINGS));
        cancel.cancel();
    }
}

//! The RESP listener's sockets: accepting connections within
//! `max_clients`, one reader and one writer task per connection, the
//! bounded output queue and the pub/sub forwarding.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, mpsc};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use super::commands;
use super::conn::{Api, ClientEntry, ClientState, Conn, SLOW_SUBSCRIBER_GRACE};
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

/// Serve one listener of `api` until `cancel`: TLS with the configuration
/// in `tls` at each handshake (it may be replaced while serving), or
/// plaintext without.
pub async fn serve(
    api: Arc<Api>,
    listener: TcpListener,
    tls: Option<Shared<rustls::ServerConfig>>,
    cancel: CancellationToken,
) {
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
            metrics::gauge!(m::API_CLIENTS).increment(1.0);
            api.stats.connected.fetch_add(1, Ordering::Relaxed);
            let _ = sock.set_nodelay(true);
            let laddr = sock.local_addr().map(|a| a.to_string()).unwrap_or_default();
            let peer = peer.to_string();
            tokio::select! {
                _ = c.cancelled() => {}
                _ = accept(sock, tls, peer, laddr, &api) => {}
            }
            api.stats.connected.fetch_sub(1, Ordering::Relaxed);
            metrics::gauge!(m::API_CLIENTS).decrement(1.0);
            drop(permit);
        });
    }
}

/// Run the TLS handshake when the listener has TLS, then the connection.
async fn accept(
    sock: TcpStream,
    tls: Option<Shared<rustls::ServerConfig>>,
    peer: String,
    laddr: String,
    api: &Arc<Api>,
) {
    let Some(cfg) = tls else {
        return handle(sock, peer, laddr, api).await;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(crate::tls::current(&cfg));
    let why = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await {
        Ok(Ok(stream)) => return handle(stream, peer, laddr, api).await,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no handshake within {TLS_HANDSHAKE_TIMEOUT:?}"),
    };
    metrics::counter!(m::API_REJECTED, "reason" => "tls_handshake").increment(1);
    // An unknown CA, an expired or misnamed certificate: the operator
    // needs the reason, the client only gets the TLS alert.
    tracing::info!(client = %peer, "TLS handshake refused: {why}");
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

async fn write_loop<W: AsyncWrite + Unpin>(mut wr: W, mut rx: mpsc::Receiver<Out>) {
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

async fn handle<S>(sock: S, peer: String, laddr: String, api: &Arc<Api>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(sock);
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
        id: api.next_client_id(),
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
            user: "default".into(),
        }),
    });
    api.register(entry.clone());
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

async fn run<R: AsyncRead + Unpin>(conn: &mut Conn, api: &Arc<Api>, rd: R, out: &Output) -> End {
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

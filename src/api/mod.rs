//! The RESP listener: the Sentinel-compatible API for clients and the
//! peer protocol (`PICKET ...`) for the other daemons, on one port.
//!
//! Limits keep a hostile or broken client from hurting the daemon: a
//! maximum number of connections, a cap on frame size and on the number of
//! arguments, and `AUTH` before anything else when a password is set.

pub mod commands;
pub mod reply;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use redis_protocol::resp2::types::BytesFrame;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::daemon::Daemon;
use crate::metrics as m;
use crate::resp::{RespCodec, RespError};
pub use reply::Reply;

/// Cap on one request frame (a client has no reason to send more).
pub const MAX_REQUEST_FRAME: usize = 1024 * 1024;
/// Cap on the number of arguments of one command.
pub const MAX_ARGS: usize = 1024;

static NEXT_CLIENT_ID: AtomicU64 = AtomicU64::new(1);

/// Per-connection state.
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
    /// Close after this reply (`QUIT`).
    pub quit: bool,
    /// Peer address.
    pub peer: String,
}

/// Serve the RESP listener until `cancel`.
pub async fn serve(
    listener: TcpListener,
    daemon: Arc<Daemon>,
    max_clients: usize,
    cancel: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(max_clients));
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
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            metrics::counter!(m::API_REJECTED, "reason" => "max_clients").increment(1);
            tokio::spawn(async move {
                let _ = sock
                    .write_all(b"-ERR max number of clients reached\r\n")
                    .await;
            });
            continue;
        };
        let d = daemon.clone();
        let c = cancel.clone();
        tokio::spawn(async move {
            metrics::gauge!(m::API_CLIENTS).increment(1.0);
            let _ = sock.set_nodelay(true);
            tokio::select! {
                _ = c.cancelled() => {}
                _ = handle(sock, peer.to_string(), d) => {}
            }
            metrics::gauge!(m::API_CLIENTS).decrement(1.0);
            drop(permit);
        });
    }
}

/// Turn a request frame into arguments, or say why it is not a command.
fn to_args(frame: BytesFrame) -> Result<Vec<Bytes>, String> {
    match frame {
        BytesFrame::Array(items) => {
            if items.is_empty() {
                return Err("ERR empty command".into());
            }
            if items.len() > MAX_ARGS {
                return Err(format!("ERR too many arguments (at most {MAX_ARGS})"));
            }
            items
                .into_iter()
                .map(|f| match f {
                    BytesFrame::BulkString(b) | BytesFrame::SimpleString(b) => Ok(b),
                    BytesFrame::Integer(i) => Ok(Bytes::from(i.to_string())),
                    _ => Err("ERR Protocol error: expected bulk strings".to_string()),
                })
                .collect()
        }
        _ => Err("ERR Protocol error: expected an array of bulk strings".into()),
    }
}

async fn handle(sock: TcpStream, peer: String, daemon: Arc<Daemon>) {
    let (rd, mut wr) = sock.into_split();
    let mut frames = FramedRead::new(rd, RespCodec::new(MAX_REQUEST_FRAME));
    let mut conn = Conn {
        id: NEXT_CLIENT_ID.fetch_add(1, Ordering::Relaxed),
        authed: daemon.ctx.password.is_none(),
        resp3: false,
        name: None,
        quit: false,
        peer,
    };
    let mut out = BytesMut::new();
    while let Some(next) = frames.next().await {
        let reply = match next {
            Ok(frame) => match to_args(frame) {
                Ok(args) => commands::dispatch(&daemon, &mut conn, args).await,
                Err(e) => Reply::err(e),
            },
            Err(RespError::FrameTooLarge { limit }) => {
                metrics::counter!(m::API_REJECTED, "reason" => "frame_too_large").increment(1);
                let _ = wr
                    .write_all(
                        format!("-ERR Protocol error: request larger than {limit} bytes\r\n")
                            .as_bytes(),
                    )
                    .await;
                return;
            }
            Err(e) => {
                // The stream is out of sync after a decode error.
                metrics::counter!(m::API_REJECTED, "reason" => "protocol").increment(1);
                let _ = wr
                    .write_all(
                        format!(
                            "-ERR Protocol error: {}\r\n",
                            e.to_string().replace(['\r', '\n'], " ")
                        )
                        .as_bytes(),
                    )
                    .await;
                return;
            }
        };
        out.clear();
        reply.encode(&mut out, conn.resp3);
        if wr.write_all(&out).await.is_err() || conn.quit {
            return;
        }
    }
}

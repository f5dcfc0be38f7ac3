//! A RESP2 connection to one server: connect and per-command timeouts,
//! `AUTH`, optional TLS, a frame-size cap and typed error replies.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use redis_protocol::resp2::types::BytesFrame;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use super::{RespCodec, RespError, classify_error, command};
use crate::config::TlsConfig;

/// A byte stream: plain TCP or TLS over TCP.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// TLS settings ready to use for connections. Clones share one
/// configuration, which [`crate::tls::ListenerTls::reload`] may replace:
/// each new connection uses the one in force.
#[derive(Clone)]
pub struct TlsClient {
    config: crate::tls::Shared<rustls::ClientConfig>,
    server_name: Option<String>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Build from the group's `tls` settings: CA file (else no server can be
    /// verified, so it is required), optional client certificate and key.
    pub fn from_config(cfg: &TlsConfig) -> Result<Self, RespError> {
        let ca = cfg
            .ca_file
            .as_deref()
            .ok_or_else(|| RespError::Tls("tls.ca_file is required".into()))?;
        let identity = match (&cfg.cert_file, &cfg.key_file) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            _ => None,
        };
        let config =
            crate::tls::client_config(ca, identity).map_err(|e| RespError::Tls(e.to_string()))?;
        Ok(Self::new(config, cfg.server_name.clone()))
    }

    /// Use `config`; `server_name` is the name to verify (default: the host
    /// of each address connected to).
    pub fn new(config: rustls::ClientConfig, server_name: Option<String>) -> Self {
        Self::shared(crate::tls::shared(config), server_name)
    }

    /// Use the configuration `config` holds at each connection.
    pub fn shared(
        config: crate::tls::Shared<rustls::ClientConfig>,
        server_name: Option<String>,
    ) -> Self {
        TlsClient {
            config,
            server_name,
        }
    }
}

/// How to connect and authenticate.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Deadline for TCP connect plus TLS handshake plus AUTH.
    pub connect_timeout: Duration,
    /// Default deadline for one command.
    pub command_timeout: Duration,
    /// ACL user name (`AUTH user pass`); `None` sends `AUTH pass`.
    pub username: Option<String>,
    /// Password; `None` skips AUTH.
    pub password: Option<String>,
    /// TLS, when the servers require it.
    pub tls: Option<TlsClient>,
    /// Cap on one reply frame.
    pub max_frame: usize,
    /// `CLIENT SETNAME` after connecting, so operators see us in `CLIENT LIST`.
    pub client_name: Option<String>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: Duration::from_secs(1),
            command_timeout: Duration::from_secs(1),
            username: None,
            password: None,
            tls: None,
            max_frame: super::DEFAULT_MAX_FRAME,
            client_name: None,
        }
    }
}

/// One connection. Commands are sent one at a time; a connection whose
/// command failed with a transport error must be dropped.
pub struct Connection {
    framed: Framed<Box<dyn Io>, RespCodec>,
    command_timeout: Duration,
    peer: Option<SocketAddr>,
    /// The size of the last text reply (INFO), reserved before the next
    /// one so that it is read in one go.
    text_hint: usize,
}

/// What a connection's read buffer holds between commands. The codec's
/// default (8 KiB to read and 8 KiB to write, kept for the connection's
/// life) was most of picket's memory with a thousand probed instances; a
/// PONG needs a few bytes, and a large reply's room is reserved for it
/// and given back after it (512 bytes before: 0.4 MiB more at a thousand).
const READ_BUF: usize = 128;

/// A read buffer larger than this is given back once it is empty.
const KEEP_BUF: usize = 4096;

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").finish_non_exhaustive()
    }
}

impl Connection {
    /// Connect to `addr` (`host:port`), negotiate TLS, AUTH and SETNAME, all
    /// within `opts.connect_timeout`.
    pub async fn connect(addr: &str, opts: &ClientOptions) -> Result<Connection, RespError> {
        tokio::time::timeout(opts.connect_timeout, Self::connect_inner(addr, None, opts))
            .await
            .map_err(|_| RespError::Timeout(opts.connect_timeout))?
    }

    /// Like [`Connection::connect`], from the local address `source` (any
    /// port): a client whose packets a test or benchmark must tell apart
    /// from every other process's on the same host.
    pub async fn connect_from(
        addr: &str,
        source: IpAddr,
        opts: &ClientOptions,
    ) -> Result<Connection, RespError> {
        tokio::time::timeout(
            opts.connect_timeout,
            Self::connect_inner(addr, Some(source), opts),
        )
        .await
        .map_err(|_| RespError::Timeout(opts.connect_timeout))?
    }

    async fn tcp_from(addr: &str, source: IpAddr) -> std::io::Result<TcpStream> {
        let target = tokio::net::lookup_host(addr)
            .await?
            .find(|a| a.is_ipv4() == source.is_ipv4())
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::AddrNotAvailable,
                    format!("{addr} has no address of the family of {source}"),
                )
            })?;
        let socket = if source.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.bind(SocketAddr::new(source, 0))?;
        socket.connect(target).await
    }

    async fn connect_inner(
        addr: &str,
        source: Option<IpAddr>,
        opts: &ClientOptions,
    ) -> Result<Connection, RespError> {
        let tcp = match source {
            None => TcpStream::connect(addr).await,
            Some(ip) => Self::tcp_from(addr, ip).await,
        }
        .map_err(|source| RespError::Connect {
            addr: addr.to_string(),
            source,
        })?;
        // Probes are tiny request/reply exchanges: never wait for Nagle.
        let _ = tcp.set_nodelay(true);
        let peer = tcp.peer_addr().ok();
        let io: Box<dyn Io> = match &opts.tls {
            None => Box::new(tcp),
            Some(tls) => {
                let host = match &tls.server_name {
                    Some(n) => n.clone(),
                    None => addr
                        .rsplit_once(':')
                        .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']'))
                        .unwrap_or(addr)
                        .to_string(),
                };
                let name = rustls_pki_types::ServerName::try_from(host.clone())
                    .map_err(|e| RespError::Tls(format!("server name {host:?}: {e}")))?;
                let connector = tokio_rustls::TlsConnector::from(crate::tls::current(&tls.config));
                let stream = connector
                    .connect(name, tcp)
                    .await
                    .map_err(|e| RespError::Tls(e.to_string()))?;
                Box::new(stream)
            }
        };
        let mut conn = Connection {
            framed: Framed::with_capacity(io, RespCodec::new(opts.max_frame), READ_BUF),
            command_timeout: opts.command_timeout,
            peer,
            text_hint: 0,
        };
        *conn.framed.write_buffer_mut() = BytesMut::with_capacity(128);
        if let Some(pw) = &opts.password {
            let reply = match &opts.username {
                Some(user) => conn.call(["AUTH", user.as_str(), pw.as_str()]).await?,
                None => conn.call(["AUTH", pw.as_str()]).await?,
            };
            if !matches!(reply, BytesFrame::SimpleString(_)) {
                return Err(RespError::Unexpected(format!("AUTH replied {reply:?}")));
            }
        }
        if let Some(name) = &opts.client_name {
            // Not every server accepts SETNAME (or the ACL may deny it);
            // the name is only a courtesy.
            match conn.call(["CLIENT", "SETNAME", name.as_str()]).await {
                Ok(_) | Err(RespError::Server(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(conn)
    }

    /// The address this connection reached: what a host name resolved to
    /// at this connect (the name may point elsewhere at the next one).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Send one command (arguments as separate bulk strings) and wait for its
    /// reply within the default command timeout. Error replies are `Err`.
    pub async fn call<I, A>(&mut self, args: I) -> Result<BytesFrame, RespError>
    where
        I: IntoIterator<Item = A>,
        A: AsRef<[u8]>,
    {
        let t = self.command_timeout;
        self.call_timeout(args, t).await
    }

    /// Like [`Connection::call`] with an explicit timeout (e.g. `REPLTAKEOVER`,
    /// whose server-side wait is longer than a normal command's).
    pub async fn call_timeout<I, A>(
        &mut self,
        args: I,
        timeout: Duration,
    ) -> Result<BytesFrame, RespError>
    where
        I: IntoIterator<Item = A>,
        A: AsRef<[u8]>,
    {
        let frame = command(args);
        tokio::time::timeout(timeout, self.roundtrip(frame))
            .await
            .map_err(|_| RespError::Timeout(timeout))?
    }

    async fn roundtrip(&mut self, frame: BytesFrame) -> Result<BytesFrame, RespError> {
        self.framed.send(frame).await?;
        let reply = self.framed.next().await;
        let buf = self.framed.read_buffer_mut();
        if buf.is_empty() && buf.capacity() > KEEP_BUF {
            *buf = BytesMut::with_capacity(READ_BUF);
        }
        match reply {
            None => Err(RespError::Closed),
            Some(Err(e)) => Err(e),
            Some(Ok(BytesFrame::Error(msg))) => Err(RespError::Server(classify_error(&msg))),
            Some(Ok(frame)) => Ok(frame),
        }
    }

    /// The next frame the server sends on its own, such as a pub/sub
    /// message after `SUBSCRIBE` (no deadline: the caller bounds the wait).
    pub async fn next_frame(&mut self) -> Result<BytesFrame, RespError> {
        match self.framed.next().await {
            None => Err(RespError::Closed),
            Some(r) => r,
        }
    }

    /// Send a command and do not wait for a reply (e.g. `CLIENT KILL LADDR`
    /// on Dragonfly, which closes our own connection too).
    pub async fn send_only<I, A>(&mut self, args: I) -> Result<(), RespError>
    where
        I: IntoIterator<Item = A>,
        A: AsRef<[u8]>,
    {
        let t = self.command_timeout;
        tokio::time::timeout(t, self.framed.send(command(args)))
            .await
            .map_err(|_| RespError::Timeout(t))?
    }

    /// Send a command and read its reply as text (INFO).
    pub async fn call_text<I, A>(&mut self, args: I) -> Result<String, RespError>
    where
        I: IntoIterator<Item = A>,
        A: AsRef<[u8]>,
    {
        // Room for a reply as large as the last one, plus some.
        let want = self.text_hint + self.text_hint / 4;
        let buf = self.framed.read_buffer_mut();
        if want > buf.capacity() - buf.len() {
            buf.reserve(want);
        }
        let reply = self.call(args).await;
        // The reply's bytes share the buffer they were read into: give it
        // back whole, however much of it is left.
        let buf = self.framed.read_buffer_mut();
        if buf.is_empty() {
            *buf = BytesMut::with_capacity(READ_BUF);
        }
        let reply = reply?;
        let text = super::frame_text(&reply)
            .ok_or_else(|| RespError::Unexpected(format!("expected a string, got {reply:?}")))?;
        self.text_hint = text.len().min(1 << 20);
        Ok(text)
    }
}

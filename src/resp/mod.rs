//! RESP2 on redis-protocol's codec, with a cap on frame size, and a small
//! client for the data servers and the peer daemons.
//!
//! Commands are always arrays of bulk strings built from separate
//! arguments (never a string split on spaces), and server error replies
//! become typed errors in exactly one place ([`classify_error`]).

pub mod client;
pub mod codec;

pub use client::{ClientOptions, Connection};
pub use codec::RespCodec;

use std::time::Duration;

use bytes::Bytes;
use redis_protocol::resp2::types::BytesFrame;

/// Default cap on one frame: INFO replies are a few KB, so 8 MiB leaves a
/// wide margin while a hostile length prefix cannot make us buffer 1 GB.
pub const DEFAULT_MAX_FRAME: usize = 8 * 1024 * 1024;

/// An error reply from a server, by the kind picket acts on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerError {
    /// `-LOADING`: the server is loading its dataset (still a valid PING reply).
    #[error("{0}")]
    Loading(String),
    /// `-READONLY`: a write against a replica.
    #[error("{0}")]
    ReadOnly(String),
    /// `-MASTERDOWN`: a replica whose link to the master is down (valid PING reply).
    #[error("{0}")]
    MasterDown(String),
    /// `-NOAUTH`: authentication required.
    #[error("{0}")]
    NoAuth(String),
    /// `-WRONGPASS` (or the pre-6 `-ERR invalid password`): bad credentials.
    #[error("{0}")]
    WrongPass(String),
    /// `-NOPERM`: the ACL user may not run this command.
    #[error("{0}")]
    NoPerm(String),
    /// `-BUSY`: a script is running.
    #[error("{0}")]
    Busy(String),
    /// Any other error reply.
    #[error("{0}")]
    Other(String),
}

impl ServerError {
    /// Label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ServerError::Loading(_) => "loading",
            ServerError::ReadOnly(_) => "readonly",
            ServerError::MasterDown(_) => "masterdown",
            ServerError::NoAuth(_) => "noauth",
            ServerError::WrongPass(_) => "wrongpass",
            ServerError::NoPerm(_) => "noperm",
            ServerError::Busy(_) => "busy",
            ServerError::Other(_) => "error",
        }
    }

    /// The full text of the reply.
    pub fn message(&self) -> &str {
        match self {
            ServerError::Loading(m)
            | ServerError::ReadOnly(m)
            | ServerError::MasterDown(m)
            | ServerError::NoAuth(m)
            | ServerError::WrongPass(m)
            | ServerError::NoPerm(m)
            | ServerError::Busy(m)
            | ServerError::Other(m) => m,
        }
    }
}

/// Turn an error reply's text into a [`ServerError`].
pub fn classify_error(text: &str) -> ServerError {
    let code = text.split_whitespace().next().unwrap_or("");
    let owned = text.to_string();
    match code {
        "LOADING" => ServerError::Loading(owned),
        "READONLY" => ServerError::ReadOnly(owned),
        "MASTERDOWN" => ServerError::MasterDown(owned),
        "NOAUTH" => ServerError::NoAuth(owned),
        "WRONGPASS" => ServerError::WrongPass(owned),
        "NOPERM" => ServerError::NoPerm(owned),
        "BUSY" => ServerError::Busy(owned),
        "ERR" if text.contains("invalid password") || text.contains("invalid username") => {
            ServerError::WrongPass(owned)
        }
        _ => ServerError::Other(owned),
    }
}

/// Everything that can go wrong talking RESP.
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    /// TCP connect failed.
    #[error("connect to {addr}: {source}")]
    Connect {
        /// Where we tried to connect.
        addr: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Connect or command did not finish in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Socket error.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Bytes that are not RESP.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A frame larger than the cap.
    #[error("frame larger than {limit} bytes")]
    FrameTooLarge {
        /// The cap that was exceeded.
        limit: usize,
    },
    /// The server closed the connection.
    #[error("connection closed by peer")]
    Closed,
    /// TLS setup or handshake failed.
    #[error("tls: {0}")]
    Tls(String),
    /// An error reply.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// A reply of the wrong shape.
    #[error("unexpected reply: {0}")]
    Unexpected(String),
}

impl RespError {
    /// Label for metrics and status (never the message itself).
    pub fn metric_label(&self) -> &'static str {
        match self {
            RespError::Connect { source, .. } => match source.kind() {
                std::io::ErrorKind::ConnectionRefused => "refused",
                _ => "connect",
            },
            RespError::Timeout(_) => "timeout",
            RespError::Io(_) => "io",
            RespError::Protocol(_) => "protocol",
            RespError::FrameTooLarge { .. } => "frame_too_large",
            RespError::Closed => "closed",
            RespError::Tls(_) => "tls",
            RespError::Server(e) => e.metric_label(),
            RespError::Unexpected(_) => "unexpected",
        }
    }

    /// Whether the error means the connection can no longer be used.
    pub fn is_fatal_to_connection(&self) -> bool {
        !matches!(self, RespError::Server(_) | RespError::Unexpected(_))
    }
}

/// Build a command from arguments: an array of bulk strings.
pub fn command<I, A>(args: I) -> BytesFrame
where
    I: IntoIterator<Item = A>,
    A: AsRef<[u8]>,
{
    BytesFrame::Array(
        args.into_iter()
            .map(|a| BytesFrame::BulkString(Bytes::copy_from_slice(a.as_ref())))
            .collect(),
    )
}

/// The text of a simple/bulk string reply, if it is one.
pub fn frame_text(frame: &BytesFrame) -> Option<String> {
    match frame {
        // Checked first as it is: the lossy conversion walks the bytes one
        // by one, the check a word at a time, and INFO is always valid.
        BytesFrame::SimpleString(b) | BytesFrame::BulkString(b) => {
            Some(match std::str::from_utf8(b) {
                Ok(s) => s.to_owned(),
                Err(_) => String::from_utf8_lossy(b).into_owned(),
            })
        }
        _ => None,
    }
}

/// The integer of an integer reply (or of a numeric bulk string).
pub fn frame_int(frame: &BytesFrame) -> Option<i64> {
    match frame {
        BytesFrame::Integer(i) => Some(*i),
        BytesFrame::BulkString(b) | BytesFrame::SimpleString(b) => {
            std::str::from_utf8(b).ok()?.parse().ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_error_replies() {
        assert!(matches!(
            classify_error("LOADING Redis is loading the dataset in memory"),
            ServerError::Loading(_)
        ));
        assert!(matches!(
            classify_error("READONLY You can't write against a read only replica."),
            ServerError::ReadOnly(_)
        ));
        assert!(matches!(
            classify_error("MASTERDOWN Link with MASTER is down"),
            ServerError::MasterDown(_)
        ));
        assert!(matches!(
            classify_error("NOAUTH Authentication required."),
            ServerError::NoAuth(_)
        ));
        assert!(matches!(
            classify_error("WRONGPASS invalid username-password pair or user is disabled."),
            ServerError::WrongPass(_)
        ));
        assert!(matches!(
            classify_error("ERR invalid password"),
            ServerError::WrongPass(_)
        ));
        assert!(matches!(
            classify_error("ERR unknown command 'FOO'"),
            ServerError::Other(_)
        ));
        assert_eq!(classify_error("").metric_label(), "error");
    }

    #[test]
    fn commands_keep_spaces_inside_arguments() {
        let f = command(["SET", "a key", ""]);
        assert_eq!(
            f,
            BytesFrame::Array(vec![
                BytesFrame::BulkString(Bytes::from_static(b"SET")),
                BytesFrame::BulkString(Bytes::from_static(b"a key")),
                BytesFrame::BulkString(Bytes::new()),
            ])
        );
    }
}

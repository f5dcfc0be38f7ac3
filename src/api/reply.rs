//! Replies of the RESP listener, encoded as RESP2 or RESP3.
//!
//! Sentinel's instance tables are maps whose field order matters (tests
//! and clients read positions), so replies are built and encoded here with
//! their order kept, instead of through a hash map.

use bytes::{BufMut, Bytes, BytesMut};

/// A reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...` (the text includes the code).
    Error(String),
    /// `:1`.
    Int(i64),
    /// `$3\r\nfoo`.
    Bulk(Bytes),
    /// Null bulk string (`$-1`; RESP3 `_`).
    Null,
    /// Null array (`*-1`; RESP3 `_`).
    NullArray,
    /// `*n`.
    Array(Vec<Reply>),
    /// A map: RESP3 `%n`; RESP2 a flat array of alternating keys and values.
    Map(Vec<(Reply, Reply)>),
    /// Out-of-band data (pub/sub messages): RESP3 `>n`; RESP2 an array.
    Push(Vec<Reply>),
    /// Text (`CLIENT LIST`): RESP3 verbatim `=n\r\ntxt:`; RESP2 a bulk string.
    Verbatim(String),
    /// A set (`COMMAND` flags): RESP3 `~n`; RESP2 an array.
    Set(Vec<Reply>),
    /// Several replies in a row, one per argument (`SUBSCRIBE a b`).
    Many(Vec<Reply>),
    /// A reply already encoded, the same in RESP2 and RESP3 (a master's
    /// address, kept per connection while the group's view is unchanged).
    Encoded(Bytes),
}

/// A RESP2 frame built elsewhere (the peer protocol's own encoders, such as
/// [`crate::quorum::peers::IsDownReply::to_frame`]) sent as a reply: the
/// wire form stays the one place that encodes it.
impl From<redis_protocol::resp2::types::BytesFrame> for Reply {
    fn from(frame: redis_protocol::resp2::types::BytesFrame) -> Reply {
        use redis_protocol::resp2::types::BytesFrame as F;
        match frame {
            F::SimpleString(s) => Reply::Simple(String::from_utf8_lossy(&s).into_owned()),
            F::Error(e) => Reply::Error(e.to_string()),
            F::Integer(i) => Reply::Int(i),
            F::BulkString(b) => Reply::Bulk(b),
            F::Array(items) => Reply::Array(items.into_iter().map(Reply::from).collect()),
            F::Null => Reply::Null,
        }
    }
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// An error reply; `text` starts with the code (`ERR`, `NOGOODSLAVE`, ...).
    pub fn err(text: impl Into<String>) -> Reply {
        Reply::Error(text.into())
    }

    /// A bulk string.
    pub fn bulk(s: impl AsRef<[u8]>) -> Reply {
        Reply::Bulk(Bytes::copy_from_slice(s.as_ref()))
    }

    /// A map with string keys.
    pub fn map_str(pairs: Vec<(&str, Reply)>) -> Reply {
        Reply::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (Reply::bulk(k), v))
                .collect(),
        )
    }

    /// A bulk string holding a number (Sentinel's instance maps send every
    /// number this way).
    pub fn num(n: impl std::fmt::Display) -> Reply {
        Reply::bulk(n.to_string())
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// The encoded form.
    pub fn to_bytes(&self, resp3: bool) -> bytes::Bytes {
        let mut b = BytesMut::new();
        self.encode(&mut b, resp3);
        b.freeze()
    }

    /// Encode into `buf`.
    pub fn encode(&self, buf: &mut BytesMut, resp3: bool) {
        match self {
            Reply::Simple(s) => {
                buf.put_u8(b'+');
                put_line(buf, s.as_bytes());
            }
            Reply::Error(s) => {
                buf.put_u8(b'-');
                put_line(buf, s.as_bytes());
            }
            Reply::Int(i) => {
                buf.put_u8(b':');
                put_line(buf, i.to_string().as_bytes());
            }
            Reply::Bulk(b) => {
                buf.put_u8(b'$');
                put_line(buf, b.len().to_string().as_bytes());
                buf.put_slice(b);
                buf.put_slice(b"\r\n");
            }
            Reply::Null if resp3 => buf.put_slice(b"_\r\n"),
            Reply::Null => buf.put_slice(b"$-1\r\n"),
            Reply::NullArray if resp3 => buf.put_slice(b"_\r\n"),
            Reply::NullArray => buf.put_slice(b"*-1\r\n"),
            Reply::Array(items) => {
                buf.put_u8(b'*');
                put_line(buf, items.len().to_string().as_bytes());
                for i in items {
                    i.encode(buf, resp3);
                }
            }
            Reply::Many(items) => {
                for i in items {
                    i.encode(buf, resp3);
                }
            }
            Reply::Encoded(b) => buf.put_slice(b),
            Reply::Set(items) => {
                buf.put_u8(if resp3 { b'~' } else { b'*' });
                put_line(buf, items.len().to_string().as_bytes());
                for i in items {
                    i.encode(buf, resp3);
                }
            }
            Reply::Push(items) => {
                buf.put_u8(if resp3 { b'>' } else { b'*' });
                put_line(buf, items.len().to_string().as_bytes());
                for i in items {
                    i.encode(buf, resp3);
                }
            }
            Reply::Map(pairs) => {
                if resp3 {
                    buf.put_u8(b'%');
                    put_line(buf, pairs.len().to_string().as_bytes());
                } else {
                    buf.put_u8(b'*');
                    put_line(buf, (pairs.len() * 2).to_string().as_bytes());
                }
                for (k, v) in pairs {
                    k.encode(buf, resp3);
                    v.encode(buf, resp3);
                }
            }
            Reply::Verbatim(s) => {
                if resp3 {
                    buf.put_u8(b'=');
                    put_line(buf, (s.len() + 4).to_string().as_bytes());
                    buf.put_slice(b"txt:");
                    buf.put_slice(s.as_bytes());
                    buf.put_slice(b"\r\n");
                } else {
                    Reply::bulk(s).encode(buf, resp3);
                }
            }
        }
    }
}

fn put_line(buf: &mut BytesMut, s: &[u8]) {
    // A line never carries CR or LF: they would split the frame.
    for &b in s {
        buf.put_u8(if b == b'\r' || b == b'\n' { b' ' } else { b });
    }
    buf.put_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(r: &Reply, resp3: bool) -> Vec<u8> {
        let mut b = BytesMut::new();
        r.encode(&mut b, resp3);
        b.to_vec()
    }

    #[test]
    fn encodes_both_protocols() {
        let m = Reply::map_str(vec![("name", Reply::bulk("g")), ("port", Reply::bulk("1"))]);
        assert_eq!(
            enc(&m, false),
            b"*4\r\n$4\r\nname\r\n$1\r\ng\r\n$4\r\nport\r\n$1\r\n1\r\n"
        );
        assert_eq!(
            enc(&m, true),
            b"%2\r\n$4\r\nname\r\n$1\r\ng\r\n$4\r\nport\r\n$1\r\n1\r\n"
        );
        assert_eq!(enc(&Reply::NullArray, false), b"*-1\r\n");
        assert_eq!(enc(&Reply::NullArray, true), b"_\r\n");
        let p = Reply::Push(vec![Reply::bulk("message")]);
        assert_eq!(enc(&p, false), b"*1\r\n$7\r\nmessage\r\n");
        assert_eq!(enc(&p, true), b">1\r\n$7\r\nmessage\r\n");
        assert_eq!(enc(&Reply::Verbatim("a".into()), true), b"=5\r\ntxt:a\r\n");
        assert_eq!(enc(&Reply::err("ERR x\r\ny"), false), b"-ERR x  y\r\n");
        let set = Reply::Set(vec![Reply::Simple("fast".into())]);
        assert_eq!(enc(&set, false), b"*1\r\n+fast\r\n");
        assert_eq!(enc(&set, true), b"~1\r\n+fast\r\n");
        let many = Reply::Many(vec![Reply::Int(1), Reply::Int(2)]);
        assert_eq!(enc(&many, false), b":1\r\n:2\r\n");
        assert_eq!(enc(&Reply::Null, false), b"$-1\r\n");
        assert_eq!(enc(&Reply::Null, true), b"_\r\n");
        assert_eq!(enc(&Reply::num(7), true), b"$1\r\n7\r\n");
        let e = Reply::Encoded(Bytes::from_static(b"+x\r\n"));
        assert_eq!(enc(&e, false), b"+x\r\n");
        assert_eq!(enc(&e, true), b"+x\r\n");
    }
}

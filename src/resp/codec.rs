//! A RESP2 decoder with a hard cap on frame size, and encoders for RESP2
//! and RESP3 frames (the API answers in RESP3 after `HELLO 3`).

use bytes::BytesMut;
use redis_protocol::codec::{Resp2, Resp3};
use redis_protocol::resp2::types::BytesFrame;
use redis_protocol::resp3::types::BytesFrame as Resp3Frame;
use tokio_util::codec::{Decoder, Encoder};

use super::RespError;

/// How deeply arrays may nest in one frame. No reply picket reads nests
/// more than three levels (`ROLE`), and redis-protocol's decoder recurses
/// once per level: unbounded, `*1\r\n` repeated would overflow the stack
/// of the task decoding it and abort the daemon.
pub const MAX_DEPTH: usize = 32;

/// RESP2 codec that refuses frames larger than `max_frame` bytes or nested
/// deeper than [`MAX_DEPTH`].
///
/// redis-protocol buffers whatever length a peer declares; without the cap
/// a `$1000000000` prefix would make us hold a gigabyte. Before handing a
/// frame to redis-protocol, the codec finds where it ends with a scan that
/// does not recurse and resumes where it stopped, so that a frame trickled
/// in small reads is scanned once rather than re-parsed on every read.
#[derive(Debug, Clone)]
pub struct RespCodec {
    resp2: Resp2,
    max_frame: usize,
    scan: Scan,
}

impl RespCodec {
    /// A codec with the given cap (bytes).
    pub fn new(max_frame: usize) -> Self {
        RespCodec {
            // Integers in requests are sent as bulk strings, which every
            // server expects.
            resp2: Resp2::new(true),
            max_frame,
            scan: Scan::default(),
        }
    }
}

impl Default for RespCodec {
    fn default() -> Self {
        Self::new(super::DEFAULT_MAX_FRAME)
    }
}

impl Decoder for RespCodec {
    type Item = BytesFrame;
    type Error = RespError;

    /// `src` must be the buffer of the previous call with bytes appended
    /// (as `Framed` and `FramedRead` guarantee): the scan resumes in it.
    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesFrame>, RespError> {
        if self.scan.pos > src.len() {
            // Not the buffer we were scanning: start over.
            self.scan = Scan::default();
        }
        let extent = self.scan.advance(src);
        if !matches!(extent, Extent::Incomplete) {
            self.scan = Scan::default();
        }
        let len = match extent {
            Extent::Incomplete if src.len() > self.max_frame => {
                return Err(RespError::FrameTooLarge {
                    limit: self.max_frame,
                });
            }
            Extent::Incomplete => return Ok(None),
            Extent::TooDeep => {
                return Err(RespError::Protocol(format!(
                    "arrays nested deeper than {MAX_DEPTH} levels"
                )));
            }
            Extent::Invalid(why) => return Err(RespError::Protocol(why)),
            // A frame that arrived whole is held to the cap too: otherwise
            // the cap would depend on how the stream was split into reads.
            Extent::Complete(len) if len > self.max_frame => {
                return Err(RespError::FrameTooLarge {
                    limit: self.max_frame,
                });
            }
            Extent::Complete(len) => len,
        };
        // The scan bounded the depth, so redis-protocol's recursion is safe.
        let buffered = src.len();
        match self.resp2.decode(src) {
            Ok(Some(frame)) if buffered - src.len() == len => Ok(Some(frame)),
            Ok(Some(_)) | Ok(None) => Err(RespError::Protocol(format!(
                "the decoder and the scan disagree on a frame of {len} bytes"
            ))),
            Err(e) => Err(RespError::Protocol(e.to_string())),
        }
    }
}

/// Where the frame at the start of the buffer ends, as far as known.
#[derive(Debug)]
enum Extent {
    /// The frame is this many bytes long and all there.
    Complete(usize),
    /// More bytes are needed.
    Incomplete,
    /// Arrays nest deeper than [`MAX_DEPTH`].
    TooDeep,
    /// Not RESP2.
    Invalid(String),
}

/// A resumable walk over the frame at the start of the buffer, following
/// redis-protocol's RESP2 grammar: a type byte and a line up to CRLF; `$`
/// and `*` lines are lengths (`-1` is null), a bulk string is followed by
/// its bytes and two more; `:` lines are integers.
#[derive(Debug, Clone, Default)]
struct Scan {
    /// Start of the next element; everything before it has been walked.
    pos: usize,
    /// Where to go on looking for the CRLF of the line at `pos`.
    search: usize,
    /// For each array entered, how many of its elements are still to come.
    open: Vec<usize>,
}

impl Scan {
    fn advance(&mut self, buf: &[u8]) -> Extent {
        loop {
            let Some(&kind) = buf.get(self.pos) else {
                return Extent::Incomplete;
            };
            let from = self.search.max(self.pos + 1);
            let Some(cr) = find_crlf(buf, from) else {
                // The last byte may be a CR whose LF is still to come.
                self.search = buf.len().saturating_sub(1).max(self.pos + 1);
                return Extent::Incomplete;
            };
            let line = &buf[self.pos + 1..cr];
            let next = cr + 2;
            let end = match kind {
                b'+' | b'-' => next,
                b':' => match number::<i64>(line) {
                    Some(_) => next,
                    None => return self.invalid("integer", line),
                },
                b'$' => match number::<isize>(line) {
                    Some(-1) => next,
                    Some(n) if n >= 0 => {
                        // n fits in isize, so this cannot overflow.
                        let end = next + n.unsigned_abs() + 2;
                        if buf.len() < end {
                            // Keep the header: no need to look for its CRLF again.
                            self.search = cr;
                            return Extent::Incomplete;
                        }
                        end
                    }
                    _ => return self.invalid("bulk string length", line),
                },
                b'*' => match number::<isize>(line) {
                    Some(-1 | 0) => next,
                    Some(n) if n > 0 => {
                        if self.open.len() == MAX_DEPTH {
                            return Extent::TooDeep;
                        }
                        self.open.push(n.unsigned_abs());
                        self.pos = next;
                        self.search = 0;
                        continue;
                    }
                    _ => return self.invalid("array length", line),
                },
                other => {
                    return Extent::Invalid(format!("invalid frame type byte {other:#04x}"));
                }
            };
            // One element is complete, and with it maybe the arrays it ends.
            self.pos = end;
            self.search = 0;
            loop {
                match self.open.last_mut() {
                    None => return Extent::Complete(end),
                    Some(left) if *left > 1 => {
                        *left -= 1;
                        break;
                    }
                    Some(_) => {
                        self.open.pop();
                    }
                }
            }
        }
    }

    fn invalid(&self, what: &str, line: &[u8]) -> Extent {
        let shown: String = String::from_utf8_lossy(line).chars().take(32).collect();
        Extent::Invalid(format!("invalid {what} {shown:?}"))
    }
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    buf.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|i| from + i)
}

/// A number as redis-protocol reads it (Rust's integer syntax, a leading
/// `+` allowed).
fn number<T: std::str::FromStr>(line: &[u8]) -> Option<T> {
    std::str::from_utf8(line).ok()?.parse().ok()
}

impl Encoder<BytesFrame> for RespCodec {
    type Error = RespError;

    fn encode(&mut self, item: BytesFrame, dst: &mut BytesMut) -> Result<(), RespError> {
        self.resp2
            .encode(item, dst)
            .map_err(|e| RespError::Protocol(e.to_string()))
    }
}

impl Encoder<Resp3Frame> for RespCodec {
    type Error = RespError;

    fn encode(&mut self, item: Resp3Frame, dst: &mut BytesMut) -> Result<(), RespError> {
        Resp3::new(false)
            .encode(item, dst)
            .map_err(|e| RespError::Protocol(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_frame_in_pieces() {
        let mut c = RespCodec::new(1024);
        let mut buf = BytesMut::from(&b"*2\r\n$4\r\nPING\r\n$2"[..]);
        assert!(c.decode(&mut buf).unwrap().is_none());
        buf.extend_from_slice(b"\r\nhi\r\n");
        let f = c.decode(&mut buf).unwrap().unwrap();
        assert!(matches!(f, BytesFrame::Array(ref v) if v.len() == 2));
        assert!(buf.is_empty());
    }

    #[test]
    fn refuses_a_frame_over_the_cap() {
        let mut c = RespCodec::new(64);
        let mut buf = BytesMut::from(&b"$1000000000\r\n"[..]);
        assert!(c.decode(&mut buf).unwrap().is_none());
        buf.extend_from_slice(&[b'x'; 100]);
        assert!(matches!(
            c.decode(&mut buf),
            Err(RespError::FrameTooLarge { limit: 64 })
        ));
    }

    #[test]
    fn a_complete_frame_over_the_cap_is_refused() {
        // Found by fuzz/fuzz_targets/resp_decode: a frame that arrived in
        // one read passed the cap, the same bytes in two reads did not.
        let frame = [&b"$40\r\n"[..], &[b'y'; 40], b"\r\n"].concat();
        let mut c = RespCodec::new(16);
        let mut whole = BytesMut::from(&frame[..]);
        assert!(matches!(
            c.decode(&mut whole),
            Err(RespError::FrameTooLarge { limit: 16 })
        ));
        let mut c = RespCodec::new(frame.len());
        let mut exact = BytesMut::from(&frame[..]);
        assert!(matches!(
            c.decode(&mut exact),
            Ok(Some(BytesFrame::BulkString(_)))
        ));
    }

    #[test]
    fn deep_nesting_is_refused_not_a_stack_overflow() {
        // `*1` repeated: redis-protocol recurses once per level, so this
        // (well under the API's 1 MiB cap) overflowed the 2 MiB stack of a
        // tokio worker and aborted the daemon.
        let deep = [b"*1\r\n".repeat(200_000), b":1\r\n".to_vec()].concat();
        let outcome = std::thread::Builder::new()
            .stack_size(2 * 1024 * 1024)
            .spawn(move || {
                let mut c = RespCodec::new(1024 * 1024);
                let mut buf = BytesMut::from(&deep[..]);
                c.decode(&mut buf).map(|f| f.is_some())
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(
            matches!(&outcome, Err(RespError::Protocol(m)) if m.contains("nested")),
            "{outcome:?}"
        );

        let ok = [b"*1\r\n".repeat(MAX_DEPTH), b":1\r\n".to_vec()].concat();
        let mut c = RespCodec::new(1024);
        let mut buf = BytesMut::from(&ok[..]);
        assert!(c.decode(&mut buf).unwrap().is_some());
        assert!(buf.is_empty());
        let over = [b"*1\r\n".repeat(MAX_DEPTH + 1), b":1\r\n".to_vec()].concat();
        let mut buf = BytesMut::from(&over[..]);
        assert!(matches!(c.decode(&mut buf), Err(RespError::Protocol(_))));
    }

    #[test]
    fn byte_by_byte_decodes_as_whole() {
        // The scan resumes between reads; the frames must not change.
        let stream: &[u8] = b"*3\r\n$3\r\nSET\r\n*2\r\n:-7\r\n$-1\r\n+a b\r\n\
            $0\r\n\r\n*-1\r\n*0\r\n-ERR x\r\n$5\r\na\r\nbc\r\n";
        let mut whole = BytesMut::from(stream);
        let mut c = RespCodec::new(1024);
        let mut expected = Vec::new();
        while let Some(f) = c.decode(&mut whole).unwrap() {
            expected.push(f);
        }
        assert!(whole.is_empty());
        assert_eq!(expected.len(), 6);
        let mut c = RespCodec::new(1024);
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for b in stream {
            buf.extend_from_slice(&[*b]);
            while let Some(f) = c.decode(&mut buf).unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, expected);
    }

    #[test]
    fn garbage_is_a_protocol_error() {
        let mut c = RespCodec::new(1024);
        let mut buf = BytesMut::from(&b"!!not resp\r\n"[..]);
        assert!(matches!(c.decode(&mut buf), Err(RespError::Protocol(_))));
    }
}

//! A RESP2 decoder with a hard cap on frame size, and encoders for RESP2
//! and RESP3 frames (the API answers in RESP3 after `HELLO 3`).

use bytes::BytesMut;
use redis_protocol::codec::{Resp2, Resp3};
use redis_protocol::resp2::types::BytesFrame;
use redis_protocol::resp3::types::BytesFrame as Resp3Frame;
use tokio_util::codec::{Decoder, Encoder};

use super::RespError;

/// RESP2 codec that refuses frames larger than `max_frame` bytes.
///
/// redis-protocol buffers whatever length a peer declares; without the cap
/// a `$1000000000` prefix would make us hold a gigabyte.
#[derive(Debug, Clone)]
pub struct RespCodec {
    resp2: Resp2,
    max_frame: usize,
}

impl RespCodec {
    /// A codec with the given cap (bytes).
    pub fn new(max_frame: usize) -> Self {
        RespCodec {
            // Integers in requests are sent as bulk strings, which every
            // server expects.
            resp2: Resp2::new(true),
            max_frame,
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

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<BytesFrame>, RespError> {
        let buffered = src.len();
        match self.resp2.decode(src) {
            // A frame that arrived whole is held to the cap too: otherwise
            // the cap would depend on how the stream was split into reads.
            Ok(Some(_)) if buffered - src.len() > self.max_frame => Err(RespError::FrameTooLarge {
                limit: self.max_frame,
            }),
            Ok(Some(frame)) => Ok(Some(frame)),
            Ok(None) if src.len() > self.max_frame => Err(RespError::FrameTooLarge {
                limit: self.max_frame,
            }),
            Ok(None) => {
                // Reserve for the declared bulk length only up to the cap,
                // so a lying prefix cannot make us pre-allocate.
                Ok(None)
            }
            Err(e) => Err(RespError::Protocol(e.to_string())),
        }
    }
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
    fn garbage_is_a_protocol_error() {
        let mut c = RespCodec::new(1024);
        let mut buf = BytesMut::from(&b"!!not resp\r\n"[..]);
        assert!(matches!(c.decode(&mut buf), Err(RespError::Protocol(_))));
    }
}

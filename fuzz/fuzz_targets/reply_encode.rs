//! `picket::api::Reply` encoding: any reply tree, with any text in it,
//! must encode (RESP2 and RESP3) to exactly one well-formed frame, and the
//! RESP2 form must decode (redis-protocol) to the same values, with CR and
//! LF blanked only in simple strings and errors.
//!
//! Input: a byte stream read as a recipe for a reply tree (depth ≤ 5) of
//! the shapes picket sends: map keys and set members are scalars, pushes
//! and `Many` (several replies in a row) are top-level; a `Many` of n
//! replies must encode to exactly n frames.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use picket::api::Reply;
use redis_protocol::resp2::types::BytesFrame;

struct Recipe<'a>(&'a [u8]);

impl Recipe<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    fn bytes(&mut self) -> Vec<u8> {
        let n = usize::from(self.byte() % 24).min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head.to_vec()
    }

    fn text(&mut self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }

    fn int(&mut self) -> i64 {
        let mut b = [0u8; 8];
        for x in &mut b {
            *x = self.byte();
        }
        i64::from_le_bytes(b)
    }

    /// Map keys are names: picket's maps have string keys only.
    fn key(&mut self) -> Reply {
        match self.byte() % 3 {
            0 => Reply::Simple(self.text()),
            1 => Reply::Int(self.int()),
            _ => Reply::Bulk(Bytes::from(self.bytes())),
        }
    }

    /// A reply of the types RESP2 and RESP3 encode alike.
    fn plain(&mut self, depth: usize) -> Reply {
        let n = if depth < 5 {
            usize::from(self.byte() % 5)
        } else {
            0
        };
        match self.byte() % 4 {
            0 => Reply::Simple(self.text()),
            1 => Reply::Int(self.int()),
            2 => Reply::Bulk(Bytes::from(self.bytes())),
            _ => Reply::Array((0..n).map(|_| self.plain(depth + 1)).collect()),
        }
    }

    fn reply(&mut self, depth: usize) -> Reply {
        let kind = self.byte() % 12;
        let n = if depth < 5 {
            usize::from(self.byte() % 5)
        } else {
            0
        };
        match kind {
            0 => Reply::Simple(self.text()),
            1 => Reply::Error(self.text()),
            2 => Reply::Int(self.int()),
            3 => Reply::Bulk(Bytes::from(self.bytes())),
            4 => Reply::Null,
            5 => Reply::NullArray,
            6 => Reply::Array((0..n).map(|_| self.reply(depth + 1)).collect()),
            7 => Reply::Map(
                (0..n)
                    .map(|_| (self.key(), self.reply(depth + 1)))
                    .collect(),
            ),
            // Push frames are out-of-band messages: top level only.
            8 if depth == 0 => Reply::Push((0..n).map(|_| self.reply(depth + 1)).collect()),
            8 => Reply::Array((0..n).map(|_| self.reply(depth + 1)).collect()),
            // A reply kept encoded (a master's address): made of the
            // types RESP2 and RESP3 write alike.
            9 => {
                let inner = self.plain(depth + 1);
                let mut buf = BytesMut::new();
                inner.encode(&mut buf, false);
                Reply::Encoded(buf.freeze())
            }
            // Sets hold names (COMMAND flags).
            10 => Reply::Set((0..n).map(|_| self.key()).collect()),
            // One reply per argument (SUBSCRIBE a b): top level only.
            11 if depth == 0 => Reply::Many((0..n).map(|_| self.reply(depth + 1)).collect()),
            11 => Reply::Array((0..n).map(|_| self.reply(depth + 1)).collect()),
            _ => Reply::Verbatim(self.text()),
        }
    }
}

/// A frame reduced to what RESP2 can tell apart.
#[derive(Debug, PartialEq)]
enum Norm {
    Simple(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<Norm>),
}

fn blank(s: &str) -> Vec<u8> {
    s.bytes()
        .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b })
        .collect()
}

fn expected(r: &Reply) -> Norm {
    match r {
        Reply::Simple(s) => Norm::Simple(blank(s)),
        Reply::Error(s) => Norm::Error(blank(s)),
        Reply::Int(i) => Norm::Int(*i),
        Reply::Bulk(b) => Norm::Bulk(b.to_vec()),
        Reply::Null | Reply::NullArray => Norm::Null,
        Reply::Array(v) | Reply::Push(v) | Reply::Set(v) => {
            Norm::Array(v.iter().map(expected).collect())
        }
        Reply::Many(_) => unreachable!("Many is top-level only: see frames()"),
        Reply::Map(kv) => Norm::Array(
            kv.iter()
                .flat_map(|(k, v)| [expected(k), expected(v)])
                .collect(),
        ),
        Reply::Verbatim(s) => Norm::Bulk(s.as_bytes().to_vec()),
        Reply::Encoded(b) => {
            let mut buf = BytesMut::from(&b[..]);
            match redis_protocol::resp2::decode::decode_bytes_mut(&mut buf) {
                Ok(Some((frame, _, _))) if buf.is_empty() => norm(&frame),
                other => panic!("an encoded reply that is not one RESP2 frame: {other:?}"),
            }
        }
    }
}

fn norm(f: &BytesFrame) -> Norm {
    match f {
        BytesFrame::SimpleString(b) => Norm::Simple(b.to_vec()),
        BytesFrame::Error(s) => Norm::Error(s.as_bytes().to_vec()),
        BytesFrame::Integer(i) => Norm::Int(*i),
        BytesFrame::BulkString(b) => Norm::Bulk(b.to_vec()),
        BytesFrame::Null => Norm::Null,
        BytesFrame::Array(v) => Norm::Array(v.iter().map(norm).collect()),
    }
}

/// The frames `r` must encode to, reduced to what RESP2 tells apart.
fn frames(r: &Reply) -> Vec<Norm> {
    match r {
        Reply::Many(v) => v.iter().map(expected).collect(),
        r => vec![expected(r)],
    }
}

fuzz_target!(|data: &[u8]| {
    let reply = Recipe(data).reply(0);
    let want = frames(&reply);
    for resp3 in [false, true] {
        let mut buf = BytesMut::new();
        reply.encode(&mut buf, resp3);
        match picket_fuzz::check_reply_stream(&buf) {
            Ok(n) if n == want.len() => {}
            other => panic!(
                "{reply:?} (resp3: {resp3}) encoded to {other:?} frames, not {}: {:?}",
                want.len(),
                String::from_utf8_lossy(&buf)
            ),
        }
        let mut got = Vec::new();
        while !buf.is_empty() {
            if resp3 {
                let (_, used, _) =
                    redis_protocol::resp3::decode::complete::decode_bytes_mut(&mut buf)
                        .unwrap_or_else(|e| {
                            panic!("redis-protocol refuses the RESP3 of {reply:?}: {e}")
                        })
                        .unwrap_or_else(|| {
                            panic!("redis-protocol finds the RESP3 of {reply:?} incomplete")
                        });
                assert!(used > 0);
                got.push(None);
            } else {
                let (frame, used, _) = redis_protocol::resp2::decode::decode_bytes_mut(&mut buf)
                    .unwrap_or_else(|e| {
                        panic!("redis-protocol refuses the RESP2 of {reply:?}: {e}")
                    })
                    .unwrap_or_else(|| {
                        panic!("redis-protocol finds the RESP2 of {reply:?} incomplete")
                    });
                assert!(used > 0);
                got.push(Some(norm(&frame)));
            }
        }
        assert_eq!(
            got.len(),
            want.len(),
            "frames of {reply:?} (resp3: {resp3})"
        );
        if !resp3 {
            let got: Vec<Norm> = got.into_iter().flatten().collect();
            assert_eq!(got, want, "RESP2 of {reply:?}");
        }
    }
});

//! `RespCodec`'s decoder on arbitrary bytes, fed whole and in random
//! chunks: the two must agree (TCP may split a stream anywhere), every frame
//! must be what redis-protocol itself decodes, no frame may exceed the cap
//! or nest deeper than `MAX_DEPTH` (redis-protocol recurses per level), and
//! an incomplete frame may never be buffered beyond the cap.
//!
//! Input: byte 0 picks the cap (16..=2056 bytes, so that inputs reach it),
//! bytes 1..3 seed the chunk sizes, the rest is the stream.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use picket::resp::codec::MAX_DEPTH;
use picket::resp::{RespCodec, RespError};
use picket_fuzz::Chunker;
use redis_protocol::resp2::decode::decode_bytes_mut;
use redis_protocol::resp2::types::BytesFrame;
use tokio_util::codec::Decoder;

fn depth(f: &BytesFrame) -> usize {
    match f {
        BytesFrame::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

#[derive(Debug, PartialEq)]
enum End {
    /// All bytes used, or an incomplete frame within the cap.
    Incomplete,
    /// The codec refused a frame over the cap.
    TooLarge,
    /// The codec refused bytes that are not RESP2.
    Invalid,
}

fn run<'a>(cap: usize, chunks: impl Iterator<Item = &'a [u8]>) -> (Vec<BytesFrame>, End) {
    let mut codec = RespCodec::new(cap);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => {
                    assert!(
                        buf.len() <= cap,
                        "{} bytes of an incomplete frame buffered past the cap of {cap}",
                        buf.len()
                    );
                    break;
                }
                Err(RespError::FrameTooLarge { limit }) => {
                    assert_eq!(limit, cap);
                    return (frames, End::TooLarge);
                }
                Err(RespError::Protocol(_)) => return (frames, End::Invalid),
                Err(e) => panic!("decoder returned an unexpected error: {e}"),
            }
        }
    }
    (frames, End::Incomplete)
}

fuzz_target!(|data: &[u8]| {
    let [a, b, c, input @ ..] = data else {
        return;
    };
    let cap = 16 + usize::from(*a) * 8;
    let seed = u32::from(*b) << 8 | u32::from(*c);
    let whole = run(cap, std::iter::once(input));
    let max_chunk = 1 + (seed as usize % 64);
    let pieces = run(cap, Chunker::new(input, seed, max_chunk));

    // Where the stream is split must not change what is decoded.
    assert_eq!(whole.0, pieces.0, "whole and chunked decoding disagree");
    assert_eq!(
        whole.1 == End::Incomplete,
        pieces.1 == End::Incomplete,
        "whole ended {:?}, chunked {:?}",
        whole.1,
        pieces.1
    );

    // Each frame is exactly what the library decodes from the same bytes,
    // and none is larger than the cap.
    let mut raw = BytesMut::from(input);
    for f in &whole.0 {
        let (g, used, _) = decode_bytes_mut(&mut raw)
            .expect("the codec returned a frame redis-protocol refuses")
            .expect("the codec returned a frame redis-protocol finds incomplete");
        assert_eq!(&g, f);
        assert!(
            used <= cap,
            "a frame of {used} bytes passed the cap of {cap}"
        );
        assert!(
            depth(f) <= MAX_DEPTH,
            "a frame nested {} deep passed",
            depth(f)
        );
    }
});

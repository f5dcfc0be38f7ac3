//! The peer protocol's messages: `PICKET IS-DOWN` arguments
//! (`IsDownQuery::from_args`), `PICKET HELLO` JSON (`Hello`), IS-DOWN
//! replies (`IsDownReply::from_frame`), epochs and `host:port` addresses.
//! Nothing may panic, and whatever parses must survive its own encoding:
//! a daemon must understand what it sends.
//!
//! Input: the same bytes are read as NUL-separated arguments, as JSON, as a
//! RESP2 frame and as an address.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use picket::addr::Addr;
use picket::quorum::peers::{Hello, IsDownQuery, IsDownReply, parse_epoch};

fuzz_target!(|data: &[u8]| {
    // IS-DOWN arguments, as the listener hands them over (lossy UTF-8).
    let args: Vec<String> = data
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if let Ok(q) = IsDownQuery::from_args(&args) {
        let sent = q.to_args();
        assert_eq!(&sent[..2], ["PICKET", "IS-DOWN"]);
        let back = IsDownQuery::from_args(&sent[2..])
            .unwrap_or_else(|e| panic!("{q:?} sent as {sent:?} is refused: {e}"));
        assert_eq!(back, q, "IS-DOWN changed on the way: {sent:?}");
    }

    // HELLO JSON.
    if let Ok(h) = serde_json::from_slice::<Hello>(data) {
        let json = serde_json::to_string(&h).expect("a Hello serializes");
        let back: Hello = serde_json::from_str(&json)
            .unwrap_or_else(|e| panic!("{h:?} sent as {json} is refused: {e}"));
        assert_eq!(back, h);
    }

    // Replies: IS-DOWN and epochs.
    let mut buf = BytesMut::from(data);
    if let Ok(Some((frame, _, _))) = redis_protocol::resp2::decode::decode_bytes_mut(&mut buf) {
        let _ = parse_epoch(&frame);
        if let Ok(r) = IsDownReply::from_frame(&frame) {
            let again = IsDownReply::from_frame(&r.to_frame())
                .unwrap_or_else(|e| panic!("{r:?} does not survive its own frame: {e}"));
            assert_eq!(again, r);
        }
    }

    // Addresses (the master of a group, a peer, a promoted replica).
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(a) = s.parse::<Addr>()
    {
        let shown = a.to_string();
        let back: Addr = shown
            .parse()
            .unwrap_or_else(|e| panic!("{a:?} shown as {shown:?} does not parse: {e}"));
        assert_eq!(back, a, "{s:?} -> {shown:?}");
    }
});

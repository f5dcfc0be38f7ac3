//! `INFO` and `ROLE` parsing (`picket::probe::info`): what a data server
//! answers is untrusted. `parse_info` takes any text (read lossily, as the
//! probe does) and must read CRLF and LF line ends alike; `parse_role`
//! takes any frame the decoder produces.
//!
//! Input: the same bytes are parsed as INFO text and as RESP2 frames.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use picket::probe::info::{RoleReply, parse_info, parse_role};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let snap = parse_info(&text);
    // Servers send CRLF; tests and proxies sometimes LF: same result.
    let crlf = text.replace("\r\n", "\n").replace('\n', "\r\n");
    assert_eq!(parse_info(&crlf), snap, "CRLF and LF read differently");
    // A replica entry comes from one line each.
    assert!(snap.replicas.len() <= text.lines().count());

    let mut buf = BytesMut::from(data);
    while let Ok(Some((frame, _, _))) = redis_protocol::resp2::decode::decode_bytes_mut(&mut buf) {
        if let Ok(RoleReply::Master { replicas, .. }) = parse_role(&frame) {
            // Every listed replica is kept, or the reply is refused.
            let redis_protocol::resp2::types::BytesFrame::Array(items) = &frame else {
                panic!("a master ROLE reply that is not an array: {frame:?}");
            };
            let listed = match items.last() {
                Some(redis_protocol::resp2::types::BytesFrame::Array(l)) => l.len(),
                _ => panic!("a master ROLE reply without its replica list: {frame:?}"),
            };
            assert_eq!(replicas.len(), listed);
        }
    }
});

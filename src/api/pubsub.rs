//! Pub/sub on the event channels: one connection's subscriptions, the
//! confirmation replies and the messages, shaped as Redis shapes them.

use std::collections::BTreeSet;

use bytes::{BufMut, BytesMut};

use super::reply::Reply;
use crate::events::Event;

/// Most channels plus patterns one connection may hold (each is matched
/// against every event, so the number is bounded).
pub const MAX_SUBSCRIPTIONS: usize = 1024;

/// One connection's channels and patterns.
#[derive(Debug, Default)]
pub struct Subscriptions {
    channels: BTreeSet<String>,
    /// Patterns in subscription order (Redis answers `PUNSUBSCRIBE` with
    /// no argument in that order).
    patterns: Vec<String>,
}

fn confirm(kind: &str, name: Option<&str>, count: usize) -> Reply {
    Reply::Push(vec![
        Reply::bulk(kind),
        name.map_or(Reply::Null, Reply::bulk),
        Reply::Int(i64::try_from(count).unwrap_or(i64::MAX)),
    ])
}

impl Subscriptions {
    /// Channels plus patterns (what Redis reports as the count).
    pub fn count(&self) -> usize {
        self.channels.len() + self.patterns.len()
    }

    /// Number of channels.
    pub fn channels(&self) -> usize {
        self.channels.len()
    }

    /// Number of patterns.
    pub fn patterns(&self) -> usize {
        self.patterns.len()
    }

    /// The channels.
    pub fn channel_names(&self) -> impl Iterator<Item = &String> {
        self.channels.iter()
    }

    /// The patterns, in subscription order.
    pub fn pattern_names(&self) -> &[String] {
        &self.patterns
    }

    fn full(&self) -> Reply {
        Reply::err(format!(
            "ERR too many subscriptions on this connection (at most {MAX_SUBSCRIPTIONS})"
        ))
    }

    /// `SUBSCRIBE ch...`: one confirmation per channel.
    pub fn subscribe(&mut self, names: &[String]) -> Reply {
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            if !self.channels.contains(n) && self.count() >= MAX_SUBSCRIPTIONS {
                out.push(self.full());
                break;
            }
            self.channels.insert(n.clone());
            out.push(confirm("subscribe", Some(n), self.count()));
        }
        Reply::Many(out)
    }

    /// `PSUBSCRIBE pattern...`.
    pub fn psubscribe(&mut self, names: &[String]) -> Reply {
        let mut out = Vec::with_capacity(names.len());
        for n in names {
            if !self.patterns.contains(n) {
                if self.count() >= MAX_SUBSCRIPTIONS {
                    out.push(self.full());
                    break;
                }
                self.patterns.push(n.clone());
            }
            out.push(confirm("psubscribe", Some(n), self.count()));
        }
        Reply::Many(out)
    }

    /// `UNSUBSCRIBE [ch...]`: without arguments, every channel; with none
    /// subscribed, one confirmation with a null channel.
    pub fn unsubscribe(&mut self, names: &[String]) -> Reply {
        let names: Vec<String> = if names.is_empty() {
            self.channels.iter().cloned().collect()
        } else {
            names.to_vec()
        };
        if names.is_empty() {
            return confirm("unsubscribe", None, self.count());
        }
        Reply::Many(
            names
                .iter()
                .map(|n| {
                    self.channels.remove(n);
                    confirm("unsubscribe", Some(n), self.count())
                })
                .collect(),
        )
    }

    /// `PUNSUBSCRIBE [pattern...]`.
    pub fn punsubscribe(&mut self, names: &[String]) -> Reply {
        let names: Vec<String> = if names.is_empty() {
            self.patterns.clone()
        } else {
            names.to_vec()
        };
        if names.is_empty() {
            return confirm("punsubscribe", None, self.count());
        }
        Reply::Many(
            names
                .iter()
                .map(|n| {
                    self.patterns.retain(|p| p != n);
                    confirm("punsubscribe", Some(n), self.count())
                })
                .collect(),
        )
    }

    /// Drop every subscription (`RESET`).
    pub fn clear(&mut self) {
        self.channels.clear();
        self.patterns.clear();
    }

    /// Encode the messages `ev` produces for this connection into `buf`:
    /// a `message` if its channel is subscribed, then a `pmessage` per
    /// matching pattern (RESP3 push frames after `HELLO 3`). Written
    /// straight into the output: with thousands of subscribers every one
    /// of them does this for the same event.
    pub fn encode_messages(&self, ev: &Event, buf: &mut BytesMut, resp3: bool) {
        let head = if resp3 { b'>' } else { b'*' };
        if self.channels.contains(&ev.channel) {
            encode_message(ev, buf, resp3);
        }
        for p in &self.patterns {
            if glob_match(p, &ev.channel) {
                buf.put_u8(head);
                buf.put_slice(b"4\r\n");
                put_bulk(buf, b"pmessage");
                put_bulk(buf, p.as_bytes());
                put_bulk(buf, ev.channel.as_bytes());
                put_bulk(buf, ev.message.as_bytes());
            }
        }
    }
}

/// The `message` that a subscriber of `ev`'s channel receives (a RESP3
/// push frame after `HELLO 3`): the same bytes for every such subscriber,
/// so that the hub encodes them once per event.
pub fn encode_message(ev: &Event, buf: &mut BytesMut, resp3: bool) {
    buf.put_u8(if resp3 { b'>' } else { b'*' });
    buf.put_slice(b"3\r\n");
    put_bulk(buf, b"message");
    put_bulk(buf, ev.channel.as_bytes());
    put_bulk(buf, ev.message.as_bytes());
}

/// A bulk string: `$<len>\r\n<bytes>\r\n`.
fn put_bulk(buf: &mut BytesMut, b: &[u8]) {
    buf.put_u8(b'$');
    // The length's digits without a String: a fan-out writes three of
    // these per subscriber.
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = b.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.put_slice(&digits[at..]);
    buf.put_slice(b"\r\n");
    buf.put_slice(b);
    buf.put_slice(b"\r\n");
}

/// Redis's glob (`stringmatchlen`): `*`, `?`, `[abc]`, `[^a]`, `[a-z]` and
/// `\` escapes. Iterative with backtracking to the last `*`, so a hostile
/// pattern costs at most `pattern × text` steps, never exponential time.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p = pattern.as_bytes();
    let s = text.as_bytes();
    let (mut pi, mut si) = (0usize, 0usize);
    // Where to resume after the last `*`: (pattern index after it, text index).
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() {
            match p[pi] {
                b'*' => {
                    while pi < p.len() && p[pi] == b'*' {
                        pi += 1;
                    }
                    if pi == p.len() {
                        return true;
                    }
                    star = Some((pi, si));
                    continue;
                }
                b'?' => {
                    pi += 1;
                    si += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class(p, pi, s[si])
                        && matched
                    {
                        pi = next;
                        si += 1;
                        continue;
                    }
                }
                b'\\' if pi + 1 < p.len() => {
                    if p[pi + 1] == s[si] {
                        pi += 2;
                        si += 1;
                        continue;
                    }
                }
                c => {
                    if c == s[si] {
                        pi += 1;
                        si += 1;
                        continue;
                    }
                }
            }
        }
        // Mismatch: let the last `*` swallow one more byte.
        match star {
            Some((sp, ss)) => {
                pi = sp;
                si = ss + 1;
                star = Some((sp, ss + 1));
            }
            None => return false,
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// Match `c` against the class starting at `p[start] == '['`; returns
/// whether it matched and the index after the class. An unterminated class
/// extends to the end of the pattern, as in Redis.
fn class(p: &[u8], start: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = start + 1;
    let negate = p.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    while i < p.len() && p[i] != b']' {
        if p[i] == b'\\' && i + 1 < p.len() {
            i += 1;
            matched |= p[i] == c;
        } else if i + 2 < p.len() && p[i + 1] == b'-' && p[i + 2] != b']' {
            let (mut lo, mut hi) = (p[i], p[i + 2]);
            if lo > hi {
                std::mem::swap(&mut lo, &mut hi);
            }
            matched |= (lo..=hi).contains(&c);
            i += 2;
        } else {
            matched |= p[i] == c;
        }
        i += 1;
    }
    let next = if i < p.len() { i + 1 } else { i };
    Some((matched != negate, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob() {
        assert!(glob_match("*", "cache"));
        assert!(glob_match("*", ""));
        assert!(glob_match("ca*", "cache"));
        assert!(glob_match("*he", "cache"));
        assert!(glob_match("c*c*e", "cache"));
        assert!(glob_match("c?che", "cache"));
        assert!(!glob_match("x*", "cache"));
        assert!(glob_match("cache", "cache"));
        assert!(!glob_match("cache", "cachex"));
        assert!(glob_match("+s[dz]own", "+sdown"));
        assert!(!glob_match("+s[^d]own", "+sdown"));
        assert!(glob_match("[a-c]ache", "cache"));
        assert!(glob_match("[c-a]ache", "cache"));
        assert!(glob_match("\\*x", "*x"));
        assert!(!glob_match("\\*x", "ax"));
        assert!(glob_match("+*-master", "+switch-master"));
        assert!(glob_match("-*", "-sdown"));
        assert!(!glob_match("+*", "-sdown"));
    }

    #[test]
    fn glob_is_not_exponential() {
        let text = "a".repeat(5000);
        let pattern = format!("{}b", "*a".repeat(500));
        let t = std::time::Instant::now();
        assert!(!glob_match(&pattern, &text));
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn messages_carry_their_lengths() {
        let mut s = Subscriptions::default();
        s.subscribe(&["+sdown".into()]);
        s.psubscribe(&["+s*".into()]);
        for len in [0, 9, 10, 99, 100, 12345] {
            let ev = Event {
                channel: "+sdown".into(),
                message: "m".repeat(len),
                seq: 0,
            };
            let mut buf = BytesMut::new();
            s.encode_messages(&ev, &mut buf, false);
            let m = "m".repeat(len);
            let want = format!(
                "*3\r\n$7\r\nmessage\r\n$6\r\n+sdown\r\n${len}\r\n{m}\r\n\
                 *4\r\n$8\r\npmessage\r\n$3\r\n+s*\r\n$6\r\n+sdown\r\n${len}\r\n{m}\r\n"
            );
            assert_eq!(String::from_utf8_lossy(&buf), want, "{len}");
        }
    }

    fn bytes(r: &Reply, resp3: bool) -> Vec<u8> {
        r.to_bytes(resp3).to_vec()
    }

    #[test]
    fn confirmations_like_redis() {
        let mut s = Subscriptions::default();
        assert_eq!(
            bytes(&s.unsubscribe(&[]), false),
            b"*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n"
        );
        assert_eq!(
            bytes(&s.punsubscribe(&[]), true),
            b">3\r\n$12\r\npunsubscribe\r\n_\r\n:0\r\n"
        );
        let r = s.subscribe(&["+switch-master".into(), "+sdown".into()]);
        assert_eq!(
            bytes(&r, false),
            b"*3\r\n$9\r\nsubscribe\r\n$14\r\n+switch-master\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$6\r\n+sdown\r\n:2\r\n"
        );
        assert_eq!(
            bytes(&s.psubscribe(&["*".into()]), false),
            b"*3\r\n$10\r\npsubscribe\r\n$1\r\n*\r\n:3\r\n"
        );
        let ev = Event {
            channel: "+sdown".into(),
            message: "master g 1.2.3.4 5".into(),
            seq: 0,
        };
        let msgs = |resp3| {
            let mut b = BytesMut::new();
            s.encode_messages(&ev, &mut b, resp3);
            b.to_vec()
        };
        // As Redis: the `message`, then a `pmessage` per matching pattern.
        assert_eq!(
            msgs(false),
            b"*3\r\n$7\r\nmessage\r\n$6\r\n+sdown\r\n$18\r\nmaster g 1.2.3.4 5\r\n\
              *4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$6\r\n+sdown\r\n$18\r\nmaster g 1.2.3.4 5\r\n"
        );
        assert_eq!(
            msgs(true),
            b">3\r\n$7\r\nmessage\r\n$6\r\n+sdown\r\n$18\r\nmaster g 1.2.3.4 5\r\n\
              >4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$6\r\n+sdown\r\n$18\r\nmaster g 1.2.3.4 5\r\n"
        );
        assert_eq!(
            bytes(&s.unsubscribe(&["+sdown".into(), "nope".into()]), false),
            b"*3\r\n$11\r\nunsubscribe\r\n$6\r\n+sdown\r\n:2\r\n*3\r\n$11\r\nunsubscribe\r\n$4\r\nnope\r\n:2\r\n"
        );
        assert_eq!(
            bytes(&s.punsubscribe(&[]), false),
            b"*3\r\n$12\r\npunsubscribe\r\n$1\r\n*\r\n:1\r\n"
        );
        assert_eq!(
            bytes(&s.unsubscribe(&[]), false),
            b"*3\r\n$11\r\nunsubscribe\r\n$14\r\n+switch-master\r\n:0\r\n"
        );
        assert_eq!(s.count(), 0);
        let mut none = BytesMut::new();
        s.encode_messages(&ev, &mut none, false);
        assert!(none.is_empty());
    }

    #[test]
    fn subscriptions_are_bounded() {
        let mut s = Subscriptions::default();
        let names: Vec<String> = (0..MAX_SUBSCRIPTIONS + 5).map(|i| i.to_string()).collect();
        let Reply::Many(r) = s.subscribe(&names) else {
            panic!()
        };
        assert_eq!(s.count(), MAX_SUBSCRIPTIONS);
        assert!(r.last().unwrap().is_error());
        // Subscribing again to a held channel is fine.
        let Reply::Many(r) = s.subscribe(&names[..1]) else {
            panic!()
        };
        assert!(!r[0].is_error());
    }
}

//! The request decoder of the RESP listener.
//!
//! Clients send commands as arrays of bulk strings (or, typed by hand, as
//! one inline line). This decoder accepts exactly that and nothing else, so
//! it never recurses (a nested `*1\r\n*1\r\n...` cannot exhaust the stack),
//! never scans the same bytes twice (a frame fed one byte at a time costs
//! linear time), and refuses an oversized declaration as soon as it sees
//! the header, before any of the body arrives.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::Decoder;

/// Why the connection's input cannot be decoded. Every variant closes the
/// connection after its error reply, as Redis does: the stream is no longer
/// in sync.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    /// A header (`*n`, `$n`) that is not a number in range.
    #[error("ERR Protocol error: invalid {0} length")]
    BadLength(&'static str),
    /// More arguments than the cap.
    #[error("ERR Protocol error: too many arguments ({got}, at most {limit})")]
    TooManyArgs {
        /// Declared.
        got: usize,
        /// Cap.
        limit: usize,
    },
    /// A request (all of its arguments) larger than the cap.
    #[error("ERR Protocol error: request larger than {limit} bytes")]
    TooLarge {
        /// Cap.
        limit: usize,
    },
    /// An inline request line longer than the cap.
    #[error("ERR Protocol error: too big inline request")]
    InlineTooLong,
    /// Something else where `$` was expected.
    #[error("ERR Protocol error: expected '$', got '{0}'")]
    ExpectedBulk(char),
    /// A bulk string not followed by CRLF.
    #[error("ERR Protocol error: bulk string not terminated by CRLF")]
    Unterminated,
    /// Unbalanced quotes in an inline request.
    #[error("ERR Protocol error: unbalanced quotes in request")]
    UnbalancedQuotes,
    /// The socket failed.
    #[error("I/O error: {0}")]
    Io(String),
}

impl From<std::io::Error> for RequestError {
    fn from(e: std::io::Error) -> Self {
        RequestError::Io(e.to_string())
    }
}

impl RequestError {
    /// Short label for the `reason` of the rejection metric.
    pub fn reason(&self) -> &'static str {
        match self {
            RequestError::TooManyArgs { .. } => "too_many_args",
            RequestError::TooLarge { .. } | RequestError::InlineTooLong => "frame_too_large",
            RequestError::Io(_) => "io",
            _ => "protocol",
        }
    }
}

/// Longest header line (`*1048576\r\n` is 10 bytes; leave room).
const MAX_HEADER: usize = 32;
/// Longest inline request, as in Redis.
pub const MAX_INLINE: usize = 64 * 1024;

/// Decodes requests into their arguments.
#[derive(Debug)]
pub struct RequestDecoder {
    max_args: usize,
    max_bytes: usize,
    /// Arguments still expected in the current request (None: between requests).
    remaining: Option<usize>,
    /// Length of the bulk string whose header was read, if any.
    bulk_len: Option<usize>,
    /// Arguments decoded so far.
    args: Vec<Bytes>,
    /// Bytes of the current request so far.
    used: usize,
}

impl RequestDecoder {
    /// A decoder with caps on the number of arguments and on the total size
    /// of one request.
    pub fn new(max_args: usize, max_bytes: usize) -> Self {
        RequestDecoder {
            max_args,
            max_bytes,
            remaining: None,
            bulk_len: None,
            args: Vec::new(),
            used: 0,
        }
    }

    fn charge(&mut self, n: usize) -> Result<(), RequestError> {
        self.used += n;
        if self.used > self.max_bytes {
            return Err(RequestError::TooLarge {
                limit: self.max_bytes,
            });
        }
        Ok(())
    }
}

/// Read a `<prefix><number>\r\n` header at the start of `src`, if complete.
fn header(src: &BytesMut, what: &'static str) -> Result<Option<(i64, usize)>, RequestError> {
    let window = &src[..src.len().min(MAX_HEADER)];
    let Some(lf) = window.iter().position(|&b| b == b'\n') else {
        if src.len() >= MAX_HEADER {
            return Err(RequestError::BadLength(what));
        }
        return Ok(None);
    };
    if lf < 2 || window[lf - 1] != b'\r' {
        return Err(RequestError::BadLength(what));
    }
    let raw = &window[1..lf - 1];
    // Every request has a few of these headers, almost always plain
    // digits: read them directly (the UTF-8 check and the general parse
    // were a tenth of the instructions of a one-client request, callgrind).
    // Anything else (a sign, more digits than fit) takes the general path.
    if (1..=18).contains(&raw.len()) && raw.iter().all(u8::is_ascii_digit) {
        let n = raw.iter().fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'));
        return Ok(Some((n, lf + 1)));
    }
    let digits = std::str::from_utf8(raw).map_err(|_| RequestError::BadLength(what))?;
    let n = digits
        .parse::<i64>()
        .map_err(|_| RequestError::BadLength(what))?;
    Ok(Some((n, lf + 1)))
}

/// Split an inline request like Redis's `sdssplitargs`: whitespace
/// separates arguments; double quotes allow escapes, single quotes none.
fn split_inline(line: &[u8]) -> Result<Vec<Bytes>, RequestError> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < line.len() {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= line.len() {
            break;
        }
        let mut cur = Vec::new();
        let quote = match line[i] {
            q @ (b'"' | b'\'') => {
                i += 1;
                Some(q)
            }
            _ => None,
        };
        loop {
            let Some(&c) = line.get(i) else {
                if quote.is_some() {
                    return Err(RequestError::UnbalancedQuotes);
                }
                break;
            };
            match quote {
                None if c.is_ascii_whitespace() => break,
                None => cur.push(c),
                Some(q) if c == q => {
                    i += 1;
                    // A closing quote must end the argument.
                    if line.get(i).is_some_and(|b| !b.is_ascii_whitespace()) {
                        return Err(RequestError::UnbalancedQuotes);
                    }
                    break;
                }
                Some(b'"') if c == b'\\' && i + 1 < line.len() => {
                    i += 1;
                    cur.push(match line[i] {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 8,
                        b'a' => 7,
                        other => other,
                    });
                }
                Some(_) => cur.push(c),
            }
            i += 1;
        }
        out.push(Bytes::from(cur));
    }
    Ok(out)
}

impl Decoder for RequestDecoder {
    type Item = Vec<Bytes>;
    type Error = RequestError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Vec<Bytes>>, RequestError> {
        loop {
            let Some(remaining) = self.remaining else {
                // Between requests.
                let Some(&first) = src.first() else {
                    return Ok(None);
                };
                if first != b'*' {
                    let Some(lf) = src.iter().take(MAX_INLINE).position(|&b| b == b'\n') else {
                        if src.len() >= MAX_INLINE {
                            return Err(RequestError::InlineTooLong);
                        }
                        return Ok(None);
                    };
                    let line = src.split_to(lf + 1);
                    let args = split_inline(&line)?;
                    if args.is_empty() {
                        continue;
                    }
                    if args.len() > self.max_args {
                        return Err(RequestError::TooManyArgs {
                            got: args.len(),
                            limit: self.max_args,
                        });
                    }
                    return Ok(Some(args));
                }
                let Some((n, used)) = header(src, "multibulk")? else {
                    return Ok(None);
                };
                src.advance(used);
                if n <= 0 {
                    // Redis ignores empty and null arrays.
                    continue;
                }
                let n = usize::try_from(n).map_err(|_| RequestError::BadLength("multibulk"))?;
                if n > self.max_args {
                    return Err(RequestError::TooManyArgs {
                        got: n,
                        limit: self.max_args,
                    });
                }
                self.remaining = Some(n);
                self.args = Vec::with_capacity(n);
                self.used = 0;
                self.charge(used)?;
                continue;
            };
            if remaining == 0 {
                self.remaining = None;
                self.used = 0;
                return Ok(Some(std::mem::take(&mut self.args)));
            }
            match self.bulk_len {
                None => {
                    let Some(&first) = src.first() else {
                        return Ok(None);
                    };
                    if first != b'$' {
                        return Err(RequestError::ExpectedBulk(char::from(first)));
                    }
                    let Some((n, used)) = header(src, "bulk")? else {
                        return Ok(None);
                    };
                    let n = usize::try_from(n).map_err(|_| RequestError::BadLength("bulk"))?;
                    if n > self.max_bytes {
                        return Err(RequestError::TooLarge {
                            limit: self.max_bytes,
                        });
                    }
                    src.advance(used);
                    self.charge(used)?;
                    // Charge the declared length now: a lying header is
                    // refused before its body is buffered.
                    self.charge(n + 2)?;
                    self.bulk_len = Some(n);
                }
                Some(n) => {
                    if src.len() < n + 2 {
                        src.reserve(n + 2 - src.len());
                        return Ok(None);
                    }
                    if &src[n..n + 2] != b"\r\n" {
                        return Err(RequestError::Unterminated);
                    }
                    let data = src.split_to(n).freeze();
                    src.advance(2);
                    self.args.push(data);
                    self.bulk_len = None;
                    self.remaining = Some(remaining - 1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec() -> RequestDecoder {
        RequestDecoder::new(8, 1024)
    }

    fn strs(v: Vec<Bytes>) -> Vec<String> {
        v.iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect()
    }

    #[test]
    fn decodes_one_byte_at_a_time() {
        let input = b"*2\r\n$4\r\nPING\r\n$5\r\nhello\r\n*1\r\n$4\r\nQUIT\r\n";
        let mut d = dec();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for &b in input.iter() {
            buf.extend_from_slice(&[b]);
            while let Some(args) = d.decode(&mut buf).unwrap() {
                out.push(strs(args));
            }
        }
        assert_eq!(out, vec![vec!["PING", "hello"], vec!["QUIT"]]);
        assert!(buf.is_empty());
    }

    #[test]
    fn binary_safe_and_empty_arguments() {
        let mut d = dec();
        let mut buf = BytesMut::from(&b"*2\r\n$3\r\na\r\n\r\n$0\r\n\r\n"[..]);
        let args = d.decode(&mut buf).unwrap().unwrap();
        assert_eq!(args[0].as_ref(), b"a\r\n");
        assert!(args[1].is_empty());
    }

    #[test]
    fn inline_requests() {
        let mut d = dec();
        let mut buf =
            BytesMut::from(&b"\r\nPING\r\nsentinel  masters\n\"a b\" 'c\\n' \"x\\ny\"\r\n"[..]);
        assert_eq!(strs(d.decode(&mut buf).unwrap().unwrap()), vec!["PING"]);
        assert_eq!(
            strs(d.decode(&mut buf).unwrap().unwrap()),
            vec!["sentinel", "masters"]
        );
        assert_eq!(
            strs(d.decode(&mut buf).unwrap().unwrap()),
            vec!["a b", "c\\n", "x\ny"]
        );
        let mut buf = BytesMut::from(&b"PING \"oops\r\n"[..]);
        assert_eq!(
            d.decode(&mut buf).unwrap_err(),
            RequestError::UnbalancedQuotes
        );
    }

    #[test]
    fn empty_and_null_arrays_are_skipped() {
        let mut d = dec();
        let mut buf = BytesMut::from(&b"*0\r\n*-1\r\n*1\r\n$1\r\nx\r\n"[..]);
        assert_eq!(strs(d.decode(&mut buf).unwrap().unwrap()), vec!["x"]);
    }

    #[test]
    fn refuses_oversized_declarations_before_the_body() {
        let mut d = dec();
        let mut buf = BytesMut::from(&b"*1\r\n$1000000000\r\n"[..]);
        assert_eq!(
            d.decode(&mut buf).unwrap_err(),
            RequestError::TooLarge { limit: 1024 }
        );
        let mut d = dec();
        let mut buf = BytesMut::from(&b"*10000\r\n"[..]);
        assert_eq!(
            d.decode(&mut buf).unwrap_err(),
            RequestError::TooManyArgs {
                got: 10000,
                limit: 8
            }
        );
        // The sum of the arguments counts, not only each one.
        let mut d = RequestDecoder::new(8, 40);
        let mut buf =
            BytesMut::from(&b"*3\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n$10\r\n"[..]);
        assert!(matches!(
            d.decode(&mut buf),
            Err(RequestError::TooLarge { .. })
        ));
    }

    #[test]
    fn headers_read_as_the_general_parse_reads_them() {
        // The digits-only shortcut and the general path agree on every
        // header, signs, leading zeros and 19 digits included.
        for digits in [
            "0",
            "7",
            "007",
            "16",
            "123456789012345678",
            "999999999999999999",
            "1234567890123456789",
            "9223372036854775807",
            "9223372036854775808",
            "+5",
            "-1",
            "-0",
            "",
            " 5",
            "5 ",
            "1e3",
        ] {
            let buf = BytesMut::from(format!("*{digits}\r\n").as_bytes());
            let want = digits.parse::<i64>().ok().map(|n| (n, digits.len() + 3));
            let got = header(&buf, "multibulk").ok().flatten();
            assert_eq!(got, want, "{digits:?}");
        }
    }

    #[test]
    fn garbage_is_refused() {
        for input in [
            &b"*1\r\n*1\r\n*1\r\n"[..],
            b"*1\r\n:5\r\n",
            b"*x\r\n",
            b"*1\r\n$-5\r\n",
            b"*1\r\n$3\r\nabcde\r\n",
            b"*99999999999999999999999\r\n",
            b"*1111111111111111111111111111111111111111111111",
        ] {
            let mut d = dec();
            let mut buf = BytesMut::from(input);
            assert!(d.decode(&mut buf).is_err(), "{input:?}");
        }
        let mut d = dec();
        let mut buf = BytesMut::from(&vec![b'a'; MAX_INLINE + 1][..]);
        assert_eq!(d.decode(&mut buf).unwrap_err(), RequestError::InlineTooLong);
    }
}

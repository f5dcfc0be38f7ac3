//! Helpers shared by the fuzz targets: a deterministic chunker and an
//! independent check that bytes are well-formed RESP2/RESP3 replies.
#![forbid(unsafe_code)]

/// Splits input into pieces of pseudo-random sizes (1..=max), driven by a
/// seed taken from the input itself so that a crash reproduces.
pub struct Chunker<'a> {
    rest: &'a [u8],
    state: u32,
    max: usize,
}

impl<'a> Chunker<'a> {
    /// Chunks of `data`, sizes in 1..=`max`, from `seed`.
    pub fn new(data: &'a [u8], seed: u32, max: usize) -> Self {
        Chunker {
            rest: data,
            state: seed | 1,
            max: max.max(1),
        }
    }
}

impl<'a> Iterator for Chunker<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.rest.is_empty() {
            return None;
        }
        // xorshift32: cheap and deterministic.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 17;
        self.state ^= self.state << 5;
        let n = (self.state as usize % self.max + 1).min(self.rest.len());
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Some(head)
    }
}

/// Check that `buf` is a sequence of complete, well-formed RESP2 or RESP3
/// frames (as an API server may send them) and return how many top-level
/// frames it holds. Written independently of picket and of redis-protocol,
/// so that it can judge both.
pub fn check_reply_stream(buf: &[u8]) -> Result<usize, String> {
    let mut pos = 0;
    let mut n = 0;
    while pos < buf.len() {
        pos = frame(buf, pos, 0)?;
        n += 1;
    }
    Ok(n)
}

fn line(buf: &[u8], pos: usize) -> Result<(&[u8], usize), String> {
    let rest = buf.get(pos..).ok_or("past the end")?;
    let end = rest
        .windows(2)
        .position(|w| w == b"\r\n")
        .ok_or_else(|| format!("no CRLF after offset {pos}"))?;
    let l = &rest[..end];
    if l.contains(&b'\r') || l.contains(&b'\n') {
        return Err(format!("bare CR or LF in the line at offset {pos}"));
    }
    Ok((l, pos + end + 2))
}

fn number(l: &[u8], pos: usize) -> Result<i64, String> {
    std::str::from_utf8(l)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| {
            format!(
                "bad number {:?} at offset {pos}",
                String::from_utf8_lossy(l)
            )
        })
}

fn frame(buf: &[u8], pos: usize, depth: usize) -> Result<usize, String> {
    if depth > 64 {
        return Err("nested deeper than 64".into());
    }
    let kind = *buf.get(pos).ok_or("truncated frame")?;
    let (l, next) = line(buf, pos + 1)?;
    match kind {
        b'+' | b'-' => Ok(next),
        b':' => number(l, pos).map(|_| next),
        b'_' if l.is_empty() => Ok(next),
        b'$' | b'=' => {
            let len = number(l, pos)?;
            if len == -1 && kind == b'$' {
                return Ok(next);
            }
            let len = usize::try_from(len).map_err(|_| format!("negative length at {pos}"))?;
            let end = next + len;
            if buf.get(end..end + 2) != Some(b"\r\n") {
                return Err(format!("blob at offset {pos} does not end with CRLF"));
            }
            if kind == b'=' && (len < 4 || buf[next + 3] != b':') {
                return Err(format!("verbatim string at {pos} lacks its format"));
            }
            Ok(end + 2)
        }
        // Arrays, pushes, sets and maps.
        b'*' | b'>' | b'~' | b'%' => {
            let len = number(l, pos)?;
            if len == -1 && kind == b'*' {
                return Ok(next);
            }
            let len = usize::try_from(len).map_err(|_| format!("negative length at {pos}"))?;
            let items = if kind == b'%' { len * 2 } else { len };
            let mut p = next;
            for _ in 0..items {
                p = frame(buf, p, depth + 1)?;
            }
            Ok(p)
        }
        other => Err(format!("unknown type byte {other:#04x} at offset {pos}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_replies() {
        assert_eq!(
            check_reply_stream(b"+OK\r\n:1\r\n$-1\r\n*-1\r\n_\r\n"),
            Ok(5)
        );
        assert_eq!(
            check_reply_stream(b"%1\r\n$1\r\na\r\n*2\r\n:1\r\n=5\r\ntxt:x\r\n"),
            Ok(1)
        );
        assert_eq!(check_reply_stream(b"~2\r\n+a\r\n:1\r\n"), Ok(1));
        assert!(check_reply_stream(b"~2\r\n+a\r\n").is_err());
        assert!(check_reply_stream(b"$3\r\nab\r\n").is_err());
        assert!(check_reply_stream(b"+a\rb\r\n").is_err());
        assert!(check_reply_stream(b"*2\r\n:1\r\n").is_err());
    }
}

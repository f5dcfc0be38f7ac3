//! Helpers for the API tests: picket daemons on loopback, a real
//! `redis-sentinel` beside them, `redis-cli`, a tiny HTTP GET, and a shape
//! normaliser for `redis-cli --no-raw` output.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use crate::*;

/// One picket daemon of a test cluster.
pub struct Daemon {
    /// Its RESP address.
    pub resp: SocketAddr,
    /// Its HTTP address.
    pub http: SocketAddr,
    /// The process.
    pub proc: PicketProcess,
}

/// Options of a test cluster.
#[derive(Clone, Debug)]
pub struct ClusterOpts {
    /// Number of daemons.
    pub daemons: usize,
    /// Group quorum.
    pub quorum: u32,
    /// `down_after`.
    pub down_after: String,
    /// `failover_timeout`.
    pub failover_timeout: String,
    /// Group name.
    pub group: String,
    /// Password on `listen`.
    pub password: Option<String>,
    /// `max_clients`.
    pub max_clients: Option<usize>,
    /// More lines for the `[daemon]` table (e.g. `enable_fault_injection = true`).
    pub daemon_extra: String,
}

impl Default for ClusterOpts {
    fn default() -> Self {
        ClusterOpts {
            daemons: 1,
            quorum: 1,
            down_after: "1s".into(),
            failover_timeout: "10s".into(),
            group: "mymaster".into(),
            password: None,
            max_clients: None,
            daemon_extra: String::new(),
        }
    }
}

/// Start `opts.daemons` picket daemons peered with each other, monitoring
/// `master`, and wait until each answers PING (authenticated when a
/// password is set).
pub fn start_cluster(master: SocketAddr, opts: &ClusterOpts) -> Vec<Daemon> {
    let addrs: Vec<(SocketAddr, SocketAddr)> = (0..opts.daemons)
        .map(|_| {
            let ip = next_loopback_ip();
            let resp: SocketAddr = format!("{ip}:{}", free_port(&ip)).parse().unwrap();
            let http: SocketAddr = format!("{ip}:{}", free_port(&ip)).parse().unwrap();
            (resp, http)
        })
        .collect();
    let mut out = Vec::new();
    for (i, (resp, http)) in addrs.iter().enumerate() {
        let peers: Vec<String> = addrs
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, (r, _))| format!("\"{r}\""))
            .collect();
        let opts = opts.clone();
        let proc = PicketProcess::start_with(
            |dir: &Path| {
                let mut daemon = format!(
                    "[daemon]\nid = \"picket-{i}\"\nlisten = \"{resp}\"\nhttp_listen = \"{http}\"\ndata_dir = \"{}\"\npeers = [{}]\n",
                    dir.join("data").display(),
                    peers.join(", ")
                );
                if let Some(pw) = &opts.password {
                    let f = dir.join("secret");
                    fs::write(&f, pw).unwrap();
                    daemon.push_str(&format!("password_file = \"{}\"\n", f.display()));
                }
                if let Some(m) = opts.max_clients {
                    daemon.push_str(&format!("max_clients = {m}\n"));
                }
                daemon.push_str(&opts.daemon_extra);
                format!(
                    "{daemon}\n[[group]]\nname = \"{}\"\nmaster = \"{master}\"\nquorum = {}\ndown_after = \"{}\"\nfailover_timeout = \"{}\"\n",
                    opts.group, opts.quorum, opts.down_after, opts.failover_timeout
                )
            },
            &[],
            &[("RUST_LOG", "info")],
        );
        out.push(Daemon {
            resp: *resp,
            http: *http,
            proc,
        });
    }
    for d in &mut out {
        let pw = opts.password.clone();
        let resp = d.resp;
        let mut ok = false;
        for _ in 0..500 {
            if redis_cmd_auth(resp, pw.as_deref(), &["PING"])
                .is_ok_and(|r| r.as_str() == Some("PONG"))
            {
                ok = true;
                break;
            }
            if d.proc.try_exit_status().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(ok, "picket on {resp} did not start:\n{}", d.proc.logs());
    }
    out
}

/// A real `redis-sentinel` process, killed by PID when dropped.
pub struct RealSentinel {
    /// Its address.
    pub addr: SocketAddr,
    dir: TempDir,
    child: Option<Child>,
}

impl RealSentinel {
    /// Start one monitoring `master` as `name` (quorum 1, down-after 1000).
    pub fn start(name: &str, master: SocketAddr) -> RealSentinel {
        let ip = next_loopback_ip();
        let port = free_port(&ip);
        let dir = tempfile::Builder::new()
            .prefix("picket-sentinel-")
            .tempdir()
            .unwrap();
        let conf = dir.path().join("sentinel.conf");
        fs::write(
            &conf,
            format!(
                "bind {ip}\nport {port}\ndir {}\nlogfile {}\nsentinel announce-ip {ip}\nsentinel monitor {name} {} {} 1\nsentinel down-after-milliseconds {name} 1000\nsentinel failover-timeout {name} 10000\n",
                dir.path().display(),
                dir.path().join("sentinel.log").display(),
                master.ip(),
                master.port()
            ),
        )
        .unwrap();
        let child = Command::new("redis-sentinel")
            .arg(&conf)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("spawn redis-sentinel (apt-get install redis-sentinel): {e}")
            });
        let addr: SocketAddr = format!("{ip}:{port}").parse().unwrap();
        let s = RealSentinel {
            addr,
            dir,
            child: Some(child),
        };
        wait_for("redis-sentinel answers PING", READY_TIMEOUT, || {
            redis_cmd(addr, &["PING"]).is_ok_and(|r| r.as_str() == Some("PONG"))
        });
        s
    }

    /// Its log.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default()
    }
}

impl Drop for RealSentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Run `redis-cli -h ip -p port [extra...] args...` and return stdout
/// (killed by PID after 10 s: a subscribing command never returns).
pub fn cli(addr: SocketAddr, extra: &[&str], args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("out");
    let mut child = Command::new("redis-cli")
        .arg("-h")
        .arg(addr.ip().to_string())
        .arg("-p")
        .arg(addr.port().to_string())
        .args(extra)
        .args(args)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("run redis-cli (apt-get install redis-tools): {e}"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("redis-cli {args:?} on {addr} did not return within 10 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    fs::read_to_string(&out_path).unwrap_or_default()
}

/// Reduce `redis-cli --no-raw` output to its shape: types, nesting, map
/// keys and the field names of RESP2 flat maps stay; values become
/// `<str>`, `<int>` and so on. Error and status texts stay whole.
pub fn shape(out: &str) -> String {
    let mut lines = Vec::new();
    for line in out.lines() {
        lines.push(shape_line(line));
    }
    lines.join("\n")
}

fn shape_line(line: &str) -> String {
    // Split off the index markers: runs of spaces, digits and `)`/`#`/`~`.
    let bytes = line.as_bytes();
    let mut i = 0;
    let mut last_marker: Option<(u64, char)> = None;
    let mut prefix = String::new();
    loop {
        let start = i;
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        let digits_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i > digits_start && i < bytes.len() && matches!(bytes[i], b')' | b'#' | b'~') {
            let n: u64 = line[digits_start..i].parse().unwrap();
            let c = bytes[i] as char;
            last_marker = Some((n, c));
            prefix.push_str(&line[start..=i]);
            i += 1;
            continue;
        }
        i = start;
        break;
    }
    let body = &line[i..];
    let body = body.trim_start();
    let value = |v: &str, keep: bool| -> String {
        if v.starts_with('"') {
            if keep { v.to_string() } else { "<str>".into() }
        } else if v.starts_with("(integer)") {
            "<int>".into()
        } else {
            v.to_string()
        }
    };
    let shaped = match last_marker {
        Some((_, '#')) => match body.split_once(" => ") {
            Some((k, v)) => format!("{k} => {}", value(v, false)),
            None => body.to_string(),
        },
        Some((n, ')')) => value(body, n % 2 == 1),
        _ => value(body, false),
    };
    format!("{prefix} {shaped}")
}

/// Resident set size of a process in KiB, from /proc.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// A RESP2 flat map (`[k1, v1, k2, v2, ...]`) as ordered pairs of strings.
pub fn pairs(r: &Reply) -> Vec<(String, String)> {
    let Reply::Array(items) = r else {
        panic!("not an array: {r:?}")
    };
    assert_eq!(items.len() % 2, 0, "odd map: {r:?}");
    items
        .chunks(2)
        .map(|kv| {
            (
                kv[0]
                    .as_str()
                    .unwrap_or_else(|| panic!("key {kv:?}"))
                    .to_string(),
                kv[1]
                    .as_str()
                    .unwrap_or_else(|| panic!("value {kv:?}"))
                    .to_string(),
            )
        })
        .collect()
}

/// The value of `key` in a flat map.
pub fn field(r: &Reply, key: &str) -> Option<String> {
    pairs(r).into_iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// Sentinel's flag vocabulary.
pub const FLAGS: &[&str] = &[
    "s_down",
    "o_down",
    "master",
    "slave",
    "sentinel",
    "disconnected",
    "master_down",
    "failover_in_progress",
    "promoted",
    "reconf_sent",
    "reconf_inprog",
    "reconf_done",
    "force_failover",
    "script_kill_sent",
    "master_reboot",
];

/// Check a flags value uses Sentinel's vocabulary in Sentinel's order.
pub fn check_flags(flags: &str) {
    let mut last = None;
    for f in flags.split(',') {
        let pos = FLAGS
            .iter()
            .position(|x| *x == f)
            .unwrap_or_else(|| panic!("flag {f:?} is not Sentinel's (in {flags:?})"));
        assert!(
            last.is_none_or(|l| l < pos),
            "flags out of Sentinel's order: {flags:?}"
        );
        last = Some(pos);
    }
}

/// A raw RESP connection that returns each reply's exact bytes (RESP2 or
/// RESP3), for byte-for-byte comparisons and pub/sub.
pub struct RawConn {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// The encoding of a command as an array of bulk strings.
pub fn encode_cmd(args: &[&str]) -> Vec<u8> {
    let mut req = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        req.extend_from_slice(a.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    req
}

/// Length of the first complete frame in `buf`, if any.
fn frame_len(buf: &[u8]) -> Result<Option<usize>, String> {
    use redis_protocol::resp2::decode::decode as d2;
    use redis_protocol::resp3::decode::complete::decode as d3;
    match d2(buf) {
        Ok(Some((_, n))) => return Ok(Some(n)),
        Ok(None) => return Ok(None),
        Err(_) => {}
    }
    match d3(buf) {
        Ok(Some((_, n))) => Ok(Some(n)),
        Ok(None) => Ok(None),
        Err(e) => Err(format!(
            "bad RESP {:?}: {e:?}",
            String::from_utf8_lossy(buf)
        )),
    }
}

impl RawConn {
    /// Connect with a read timeout.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> RawConn {
        let stream = TcpStream::connect_timeout(&addr, timeout).unwrap();
        stream.set_read_timeout(Some(timeout)).unwrap();
        stream.set_nodelay(true).unwrap();
        RawConn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Send raw bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Send a command.
    pub fn send(&mut self, args: &[&str]) {
        self.send_raw(&encode_cmd(args)).unwrap();
    }

    /// Read one reply's bytes; Err on timeout, close or garbage.
    pub fn read(&mut self) -> Result<Vec<u8>, String> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            if let Some(n) = frame_len(&self.buf)? {
                return Ok(self.buf.drain(..n).collect());
            }
            let n = self
                .stream
                .read(&mut chunk)
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Err("closed".into());
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Send a command and read `n` replies, as text.
    pub fn cmd_n(&mut self, args: &[&str], n: usize) -> Vec<String> {
        self.send(args);
        (0..n)
            .map(|_| String::from_utf8_lossy(&self.read().unwrap()).into_owned())
            .collect()
    }

    /// Send a command and read its reply, as text.
    pub fn cmd(&mut self, args: &[&str]) -> String {
        self.cmd_n(args, 1).remove(0)
    }

    /// Whether the server closed the connection (reads until EOF, an
    /// error, or `timeout`).
    pub fn closed_within(&mut self, timeout: Duration) -> bool {
        self.stream.set_read_timeout(Some(timeout)).unwrap();
        let mut chunk = [0u8; 64 * 1024];
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut =>
                {
                    return false;
                }
                Err(_) => return true,
            }
        }
        false
    }
}

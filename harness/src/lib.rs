//! Shared harness for picket's integration tests.
//!
//! - [`RedisServer`]: a real `redis-server` on its own 127.0.0.x address, in
//!   its own temporary directory, killed by PID when dropped.
//! - [`Topology`]: a master and replicas, waited on until every link is up.
//! - [`redis_cmd`] / [`RespConn`]: a small blocking RESP2 client over a raw
//!   `TcpStream`, independent of picket's own client, so tests can check the
//!   servers' state without trusting the code under test.
//! - [`wait_for`]: bounded polling that panics with a description.
//! - [`PicketProcess`]: the `picket` binary run with a config in a temp dir.
//!
//! A crate of its own (dev-only), compiled once for the one integration-test
//! binary `tests/it`.
//!
//! Everything listens on 127.0.0.0/8 only (Linux routes all of it to `lo`).
//! [`next_loopback_ip`] hands out a fresh address per server within the test
//! process so that one address means one server; ports are still picked free
//! per address because other processes (other worktrees, CI) may be using
//! the same addresses at the same time.

/// Partitions by address with iptables rules of their own (the benchmark's
/// own): `partition::Partition`.
pub use picket_bench::partition;

use std::fmt;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::types::OwnedFrame;
use tempfile::TempDir;

pub mod api_util;
pub mod dragonfly_stub;
pub mod fake_kube;
pub mod jitter;
pub mod obs_support;
pub mod ops_support;
pub mod tls;
pub mod writes;

/// How long a server (or topology link) gets to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Default connect/read/write timeout of [`redis_cmd`].
pub const CMD_TIMEOUT: Duration = Duration::from_secs(5);
/// Interval between two checks of a polled condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Environment variable naming another server binary (e.g. `valkey-server`).
pub const SERVER_BIN_ENV: &str = "PICKET_TEST_REDIS_SERVER";

/// The `picket` binary cargo built beside the running test binary (a test
/// binary runs from `target/<profile>/deps/`; cargo builds a package's
/// binaries before its integration tests). The workspace's other binaries
/// (`picket-writer`) are its siblings once `cargo build --workspace --bins`
/// has run.
pub fn picket_bin() -> PathBuf {
    workspace_bin("picket")
}

/// A binary of the workspace by name, next to `picket` (see [`picket_bin`]).
#[track_caller]
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap_or_else(|| panic!("{} has no target/<profile>/deps parent", exe.display()));
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace --bins` first",
        bin.display()
    );
    bin
}

// ---------------------------------------------------------------------------
// Waiting

/// Poll `cond` until it returns true; panic with `desc` after `timeout`.
///
/// The condition is always evaluated at least once, and once more at the
/// deadline, so a slow machine does not turn a success into a failure.
#[track_caller]
pub fn wait_for(desc: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    wait_for_or(desc, timeout, cond, String::new);
}

/// [`wait_for`], and on a timeout the panic carries `context()` too (the
/// daemons' logs, say: read only when the wait failed).
pub fn wait_for_or(
    desc: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> bool,
    context: impl FnOnce() -> String,
) {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {desc}\n{}",
                context()
            );
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

/// [`wait_for`] for async tests: sleeps with `tokio::time` between polls so
/// that it does not block the runtime (use real time, not paused time, with
/// external processes).
pub async fn wait_for_async(desc: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {desc}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

// ---------------------------------------------------------------------------
// Addresses

static NEXT_IP: AtomicU32 = AtomicU32::new(2);

static NEXT_NET_IP: AtomicU32 = AtomicU32::new(2);

thread_local! {
    /// Whether this thread entered a network namespace of its own
    /// ([`enter_own_netns`]): its servers then get 198.18.x.y addresses.
    static OWN_NETNS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The prefix [`enter_own_netns`] makes local (RFC 2544 benchmark space:
/// never routed, and not loopback, which a real Kubernetes API server
/// refuses in an EndpointSlice).
pub const OWN_NETNS_PREFIX: &str = "198.18.0.0/15";

/// Move the calling thread into a new network namespace with `lo` up and
/// all of [`OWN_NETNS_PREFIX`] local to it (bindable, like 127.0.0.0/8);
/// from then on [`next_loopback_ip`] hands out 198.18.x.y addresses on
/// this thread. Threads and processes this thread starts afterwards
/// (a tokio runtime, redis-server, picket) inherit the namespace; nothing
/// outside it sees those addresses, and the namespace goes away with its
/// last thread or process. Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN).
pub fn enter_own_netns() -> Result<(), String> {
    picket_bench::netns::enter(&[
        &["link", "set", "lo", "up"],
        &["route", "add", "local", OWN_NETNS_PREFIX, "dev", "lo"],
    ])?;
    OWN_NETNS.with(|c| c.set(true));
    Ok(())
}

/// A loopback address no other live test process holds: 127.0.0.2,
/// 127.0.0.3, ..., then 127.0.1.1 and so on (never x.x.x.0 or x.x.x.255).
/// On a thread that entered [`enter_own_netns`]: 198.18.0.2, 198.18.0.3, ...
/// (a namespace of the process's own: nobody else can see those).
///
/// The one allocator of every test: tests run side by side (threads of one
/// test binary, one process per test under nextest, other checkouts' test
/// runs on the same machine), and an address must mean one test's server,
/// because the partition and lossy-link tests cut traffic by address with
/// iptables. An address is held with a lock file under
/// [`address_lock_dir`] until this process exits, when the kernel releases
/// the lock whatever way the process ends.
pub fn next_loopback_ip() -> String {
    if OWN_NETNS.with(|c| c.get()) {
        loop {
            let n = NEXT_NET_IP.fetch_add(1, Ordering::Relaxed);
            let (c, d) = ((n >> 8) & 0x1ff, n & 0xff);
            assert!(n < 0x0001_ffff, "ran out of 198.18.0.0/15 addresses");
            if d != 0 && d != 255 {
                return format!("198.{}.{}.{d}", 18 + (c >> 8), c & 0xff);
            }
        }
    }
    loop {
        let n = NEXT_IP.fetch_add(1, Ordering::Relaxed);
        let (b, c, d) = ((n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff);
        assert!(n < 0x00ff_ffff, "ran out of loopback addresses");
        if d == 0 || d == 255 {
            continue;
        }
        let ip = format!("127.{b}.{c}.{d}");
        if claim_address(&ip) {
            return ip;
        }
    }
}

/// Where the lock files of [`next_loopback_ip`] live (one empty file per
/// address ever handed out; they stay, only their locks come and go).
pub fn address_lock_dir() -> PathBuf {
    std::env::temp_dir().join("picket-test-addresses")
}

/// The lock files of the addresses this process holds: kept open (a lock
/// lives as long as its open file), so the addresses stay ours until exit.
static CLAIMED: std::sync::Mutex<Vec<File>> = std::sync::Mutex::new(Vec::new());

/// Take `ip` for this process unless another live process holds it.
fn claim_address(ip: &str) -> bool {
    let dir = address_lock_dir();
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    let path = dir.join(ip);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    match file.try_lock() {
        Ok(()) => {
            CLAIMED
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(file);
            true
        }
        Err(std::fs::TryLockError::WouldBlock) => false,
        Err(std::fs::TryLockError::Error(e)) => panic!("lock {}: {e}", path.display()),
    }
}

/// A port that is free on `ip` right now (bound with port 0, then released).
/// Another process may still take it before the caller binds it; callers that
/// start servers retry with a new port when that happens.
pub fn free_port(ip: &str) -> u16 {
    let listener = TcpListener::bind((ip, 0))
        .unwrap_or_else(|e| panic!("cannot bind {ip}:0 to find a free port: {e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("local_addr of {ip}:0: {e}"))
        .port();
    drop(listener);
    port
}

fn socket_addr(ip: &str, port: u16) -> SocketAddr {
    let ip: IpAddr = ip
        .parse()
        .unwrap_or_else(|e| panic!("{ip:?} is not an IP address: {e}"));
    // In a namespace of the test's own (enter_own_netns) nothing is
    // reachable from outside either.
    let own = OWN_NETNS.with(|c| c.get()) && ip.to_string().starts_with("198.1");
    assert!(
        ip.is_loopback() || own,
        "tests must only listen on loopback (or in a network namespace of their own), not {ip}"
    );
    SocketAddr::new(ip, port)
}

// ---------------------------------------------------------------------------
// RESP client

/// A RESP2 reply.
#[derive(Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+...`.
    Status(String),
    /// `-...` (a server error such as `READONLY ...`; not a transport error).
    Error(String),
    /// `:...`.
    Int(i64),
    /// `$...` (binary-safe).
    Bulk(Vec<u8>),
    /// `*...`.
    Array(Vec<Reply>),
    /// `$-1` / `*-1`.
    Nil,
}

impl Reply {
    /// The text of a status or bulk reply.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Reply::Status(s) => Some(s),
            Reply::Bulk(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The value of an integer reply.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The message of an error reply.
    pub fn as_error(&self) -> Option<&str> {
        match self {
            Reply::Error(e) => Some(e),
            _ => None,
        }
    }

    /// Whether this is `+OK`.
    pub fn is_ok(&self) -> bool {
        matches!(self, Reply::Status(s) if s == "OK")
    }

    /// Turn an error reply into `Err`, for `?`-style test code.
    pub fn into_result(self) -> Result<Reply, String> {
        match self {
            Reply::Error(e) => Err(e),
            other => Ok(other),
        }
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Status(s) => write!(f, "+{s}"),
            Reply::Error(e) => write!(f, "-{e}"),
            Reply::Int(i) => write!(f, ":{i}"),
            Reply::Bulk(b) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Reply::Array(a) => f.debug_list().entries(a).finish(),
            Reply::Nil => write!(f, "nil"),
        }
    }
}

impl From<OwnedFrame> for Reply {
    fn from(frame: OwnedFrame) -> Self {
        match frame {
            OwnedFrame::SimpleString(s) => Reply::Status(String::from_utf8_lossy(&s).into_owned()),
            OwnedFrame::Error(e) => Reply::Error(e),
            OwnedFrame::Integer(i) => Reply::Int(i),
            OwnedFrame::BulkString(b) => Reply::Bulk(b),
            OwnedFrame::Array(a) => Reply::Array(a.into_iter().map(Reply::from).collect()),
            OwnedFrame::Null => Reply::Nil,
        }
    }
}

/// One blocking RESP2 connection with timeouts on every operation.
pub struct RespConn {
    stream: Box<dyn tls::Stream>,
    buf: Vec<u8>,
    addr: SocketAddr,
}

impl RespConn {
    /// Connect to `addr` with `timeout` for the connect and for every later
    /// read and write.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<RespConn, String> {
        let stream = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| format!("connect {addr}: {e}"))?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| format!("socket options {addr}: {e}"))?;
        Ok(RespConn::over(Box::new(stream), addr))
    }

    /// A connection over an established stream (TLS: [`RespConn::connect_tls`]).
    pub fn over(stream: Box<dyn tls::Stream>, addr: SocketAddr) -> RespConn {
        RespConn {
            stream,
            buf: Vec::new(),
            addr,
        }
    }

    /// Send one command and read its reply. `Err` means a transport or
    /// protocol failure; server errors come back as `Ok(Reply::Error)`.
    pub fn cmd(&mut self, args: &[&str]) -> Result<Reply, String> {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a.as_bytes());
            req.extend_from_slice(b"\r\n");
        }
        self.stream
            .write_all(&req)
            .map_err(|e| format!("write to {}: {e}", self.addr))?;
        self.read_reply()
    }

    /// `AUTH password`, failing on an error reply.
    pub fn auth(&mut self, password: &str) -> Result<(), String> {
        match self.cmd(&["AUTH", password])? {
            r if r.is_ok() => Ok(()),
            other => Err(format!("AUTH on {}: {other:?}", self.addr)),
        }
    }

    fn read_reply(&mut self) -> Result<Reply, String> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match decode(&self.buf) {
                Ok(Some((frame, used))) => {
                    self.buf.drain(..used);
                    return Ok(frame.into());
                }
                Ok(None) => {}
                Err(e) => return Err(format!("bad RESP from {}: {e:?}", self.addr)),
            }
            let n = self
                .stream
                .read(&mut chunk)
                .map_err(|e| format!("read from {}: {e}", self.addr))?;
            if n == 0 {
                return Err(format!("{} closed the connection", self.addr));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Run one command on a fresh connection (timeout [`CMD_TIMEOUT`]).
pub fn redis_cmd(addr: SocketAddr, args: &[&str]) -> Result<Reply, String> {
    redis_cmd_auth(addr, None, args)
}

/// [`redis_cmd`] that first authenticates when `password` is given.
pub fn redis_cmd_auth(
    addr: SocketAddr,
    password: Option<&str>,
    args: &[&str],
) -> Result<Reply, String> {
    let mut conn = RespConn::connect(addr, CMD_TIMEOUT)?;
    if let Some(pw) = password {
        conn.auth(pw)?;
    }
    conn.cmd(args)
}

/// The value of `key` in an INFO text, read with a plain line scan so that
/// tests do not depend on picket's own INFO parser.
pub fn info_value(info: &str, key: &str) -> Option<String> {
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.trim().to_owned())
}

// ---------------------------------------------------------------------------
// redis-server

/// How to start a [`RedisServer`] beyond the fixed arguments.
#[derive(Clone, Debug, Default)]
pub struct RedisOpts {
    /// `--replicaof <ip> <port>`.
    pub replicaof: Option<SocketAddr>,
    /// `--requirepass`; also used by [`RedisServer::cmd`] to authenticate.
    pub requirepass: Option<String>,
    /// `--masterauth`.
    pub masterauth: Option<String>,
    /// Appended last, so they override the fixed arguments.
    pub extra_args: Vec<String>,
}

impl RedisOpts {
    /// Start as a replica of `master`.
    pub fn replica_of(mut self, master: SocketAddr) -> Self {
        self.replicaof = Some(master);
        self
    }

    /// Require `password` from clients and use it towards the master.
    pub fn password(mut self, password: &str) -> Self {
        self.requirepass = Some(password.to_owned());
        self.masterauth = Some(password.to_owned());
        self
    }

    /// Add raw arguments (e.g. `["--replica-priority", "50"]`).
    pub fn args(mut self, args: &[&str]) -> Self {
        self.extra_args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }
}

/// The server binary: `$PICKET_TEST_REDIS_SERVER` or `redis-server`.
pub fn redis_server_bin() -> String {
    std::env::var(SERVER_BIN_ENV).unwrap_or_else(|_| "redis-server".to_owned())
}

/// Panic with an actionable message unless the server binary runs (checked
/// once per test binary).
#[track_caller]
pub fn require_redis_server() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(e) = CHECKED.get_or_init(check_redis_server) {
        panic!("{e}");
    }
}

fn check_redis_server() -> Result<(), String> {
    let bin = redis_server_bin();
    match Command::new(&bin).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`{bin} --version` failed ({}): integration tests need a working redis-server",
            out.status
        )),
        Err(e) => Err(format!(
            "cannot run `{bin}` ({e}): integration tests need redis-server on PATH \
             (Debian/Ubuntu: apt-get install -y redis-server), or {SERVER_BIN_ENV} set"
        )),
    }
}

/// A `redis-server` process owned by the test. Dropping it SIGKILLs the
/// process (by PID) and removes its directory.
pub struct RedisServer {
    addr: SocketAddr,
    opts: RedisOpts,
    dir: TempDir,
    child: Option<Child>,
    /// Bumped on every (re)start so each start's stdout gets its own file.
    starts: u32,
}

impl RedisServer {
    /// Start a server on `ip:port` (port 0: pick a free one, retrying if it
    /// is taken meanwhile) and wait until it answers PING. Panics with the
    /// server log on failure.
    #[track_caller]
    pub fn start(ip: &str, port: u16, opts: RedisOpts) -> RedisServer {
        Self::try_start(ip, port, opts).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`RedisServer::start`] on a fresh loopback address and a free port.
    #[track_caller]
    pub fn start_fresh(opts: RedisOpts) -> RedisServer {
        Self::start(&next_loopback_ip(), 0, opts)
    }

    /// [`RedisServer::start`], returning the failure instead of panicking.
    pub fn try_start(ip: &str, port: u16, opts: RedisOpts) -> Result<RedisServer, String> {
        require_redis_server();
        let auto_port = port == 0;
        let attempts = if auto_port { 5 } else { 1 };
        let mut last_err = String::new();
        for _ in 0..attempts {
            let port = if auto_port { free_port(ip) } else { port };
            let dir = tempfile::Builder::new()
                .prefix("picket-redis-")
                .tempdir()
                .map_err(|e| format!("tempdir: {e}"))?;
            let mut server = RedisServer {
                addr: socket_addr(ip, port),
                opts: opts.clone(),
                dir,
                child: None,
                starts: 0,
            };
            match server.spawn_and_wait() {
                Ok(()) => return Ok(server),
                // Someone took the free port between our probe and the bind.
                Err(e) if auto_port && e.contains("already in use") => last_err = e,
                Err(e) => return Err(e),
            }
        }
        Err(last_err)
    }

    /// `ip:port`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The IP as text.
    pub fn ip(&self) -> String {
        self.addr.ip().to_string()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// PID of the running process (None after [`RedisServer::kill9`]).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The options it was started with.
    pub fn opts(&self) -> &RedisOpts {
        &self.opts
    }

    /// The server log (all starts), for assertion messages.
    pub fn log(&self) -> String {
        let mut out = fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
        for i in 1..=self.starts {
            let path = self.dir.path().join(format!("stdout-{i}.log"));
            if let Ok(s) = fs::read_to_string(path)
                && !s.is_empty()
            {
                out.push_str(&format!("\n--- stdout/stderr of start {i} ---\n{s}"));
            }
        }
        out
    }

    /// SIGKILL the process by PID and wait for it to exit. Returns its exit
    /// status, or None when it was not running.
    pub fn kill9(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        // `Child::kill` sends SIGKILL to this child's PID.
        let _ = child.kill();
        child.wait().ok()
    }

    /// Whether the process is still alive (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// Start again with the same directory, address and arguments (killing
    /// the current process first if it still runs). Without persistence the
    /// dataset comes back empty, as after an OOM kill.
    #[track_caller]
    pub fn restart(&mut self) {
        self.kill9();
        if let Err(e) = self.spawn_and_wait() {
            panic!("{e}");
        }
    }

    /// Send a SIGSTOP (the server freezes with its sockets open).
    pub fn sigstop(&self) {
        signal_child(self.pid(), Signal::SIGSTOP);
    }

    /// Send a SIGCONT.
    pub fn sigcont(&self) {
        signal_child(self.pid(), Signal::SIGCONT);
    }

    /// Run a command, authenticating with `requirepass` if set.
    pub fn cmd(&self, args: &[&str]) -> Result<Reply, String> {
        redis_cmd_auth(self.addr, self.opts.requirepass.as_deref(), args)
    }

    /// Set `n` keys `<prefix>0`, `<prefix>1`, ... to `v`, a thousand per
    /// `MSET` (each acknowledged).
    #[track_caller]
    pub fn set_keys(&self, prefix: &str, n: usize) {
        for start in (0..n).step_by(1000) {
            let mut args = vec!["MSET".to_string()];
            for i in start..n.min(start + 1000) {
                args.push(format!("{prefix}{i}"));
                args.push("v".to_string());
            }
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let reply = self
                .cmd(&refs)
                .unwrap_or_else(|e| panic!("MSET on {}: {e}", self.addr));
            assert!(reply.is_ok(), "MSET on {}: {reply:?}", self.addr);
        }
    }

    /// `DBSIZE`, or `None` when the server does not answer with a number.
    pub fn dbsize(&self) -> Option<i64> {
        self.cmd(&["DBSIZE"]).ok().and_then(|r| r.as_int())
    }

    /// The text of `INFO <section>`.
    pub fn info(&self, section: &str) -> Result<String, String> {
        match self.cmd(&["INFO", section])? {
            Reply::Bulk(b) => Ok(String::from_utf8_lossy(&b).into_owned()),
            other => Err(format!("INFO {section} on {}: {other:?}", self.addr)),
        }
    }

    /// One field of `INFO <section>`, None when absent or unreachable.
    pub fn info_field(&self, section: &str, key: &str) -> Option<String> {
        info_value(&self.info(section).ok()?, key)
    }

    fn args(&self) -> Vec<String> {
        let dir = self.dir.path();
        let mut args: Vec<String> = vec![
            "--bind".into(),
            self.ip(),
            "--port".into(),
            self.port().to_string(),
            "--save".into(),
            String::new(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            dir.display().to_string(),
            "--logfile".into(),
            dir.join("redis.log").display().to_string(),
            "--protected-mode".into(),
            "no".into(),
            "--daemonize".into(),
            "no".into(),
            // Start a full sync at once instead of waiting 5 s for more
            // replicas to join the same transfer.
            "--repl-diskless-sync-delay".into(),
            "0".into(),
            // Replicas connect from 127.0.0.1 whatever they bind to; announce
            // the bound address so a master lists them under their own.
            "--replica-announce-ip".into(),
            self.ip(),
        ];
        if let Some(m) = self.opts.replicaof {
            args.extend([
                "--replicaof".into(),
                m.ip().to_string(),
                m.port().to_string(),
            ]);
        }
        if let Some(pw) = &self.opts.requirepass {
            args.extend(["--requirepass".into(), pw.clone()]);
        }
        if let Some(pw) = &self.opts.masterauth {
            args.extend(["--masterauth".into(), pw.clone()]);
        }
        args.extend(self.opts.extra_args.iter().cloned());
        args
    }

    /// Start again (like [`RedisServer::restart`]) with a client that
    /// connects the moment the port accepts connections, before the server
    /// is even ready and before anyone else (a prober polls less often).
    /// Returns that client and when it connected.
    #[track_caller]
    pub fn restart_with_early_client(&mut self) -> (RespConn, Instant) {
        self.kill9();
        let pid = self.spawn().unwrap_or_else(|e| panic!("{e}"));
        let deadline = Instant::now() + READY_TIMEOUT;
        let early = loop {
            if let Ok(c) = RespConn::connect(self.addr, CMD_TIMEOUT) {
                break (c, Instant::now());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not accept connections within {READY_TIMEOUT:?}; log:\n{}",
                self.addr,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        if let Err(e) = self.wait_ready(pid) {
            panic!("{e}");
        }
        early
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let pid = self.spawn()?;
        self.wait_ready(pid)
    }

    fn spawn(&mut self) -> Result<u32, String> {
        self.starts += 1;
        let out_path = self.dir.path().join(format!("stdout-{}.log", self.starts));
        let out = File::create(&out_path).map_err(|e| format!("create {out_path:?}: {e}"))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("clone {out_path:?}: {e}"))?;
        let child = Command::new(redis_server_bin())
            .args(self.args())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", redis_server_bin()))?;
        let pid = child.id();
        self.child = Some(child);
        Ok(pid)
    }

    fn wait_ready(&mut self, pid: u32) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if !self.is_running() {
                return Err(format!(
                    "redis-server on {} (pid {pid}) exited during startup; log:\n{}",
                    self.addr,
                    self.log()
                ));
            }
            // Ready when *our* process answers: another server could hold the
            // address, so compare the PID it reports.
            if let Ok(info) = self.info("server")
                && info_value(&info, "process_id").as_deref() == Some(pid.to_string().as_str())
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.kill9();
                return Err(format!(
                    "redis-server on {} (pid {pid}) did not answer within {READY_TIMEOUT:?}; log:\n{}",
                    self.addr,
                    self.log()
                ));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("addr", &self.addr)
            .field("pid", &self.pid())
            .field("dir", &self.dir.path())
            .finish()
    }
}

fn signal_child(pid: Option<u32>, sig: Signal) {
    let Some(pid) = pid else {
        panic!("cannot send {sig}: process not running");
    };
    let pid = i32::try_from(pid).unwrap_or_else(|_| panic!("pid {pid} out of range"));
    kill(Pid::from_raw(pid), sig).unwrap_or_else(|e| panic!("kill({pid}, {sig}): {e}"));
}

// ---------------------------------------------------------------------------
// Topologies

/// A master and its replicas, each on its own loopback address.
#[derive(Debug)]
pub struct Topology {
    /// The master.
    pub master: RedisServer,
    /// The replicas, in start order.
    pub replicas: Vec<RedisServer>,
}

impl Topology {
    /// A master and `n` replicas on fresh addresses (127.0.0.2, .3, .4, ...
    /// in the first topology of a test binary), returned once every replica
    /// reports `master_link_status:up` towards the master.
    #[track_caller]
    pub fn master_with_replicas(n: usize) -> Topology {
        Self::master_with_replicas_opts(n, RedisOpts::default())
    }

    /// [`Topology::master_with_replicas`] with options applied to every
    /// server (`replicaof` is set per replica).
    #[track_caller]
    pub fn master_with_replicas_opts(n: usize, opts: RedisOpts) -> Topology {
        let master = RedisServer::start_fresh(RedisOpts {
            replicaof: None,
            ..opts.clone()
        });
        let replicas = (0..n)
            .map(|_| RedisServer::start_fresh(opts.clone().replica_of(master.addr())))
            .collect();
        let topo = Topology { master, replicas };
        topo.wait_replicas_up(READY_TIMEOUT);
        topo
    }

    /// Wait until every replica reports the master and a link that is up.
    #[track_caller]
    pub fn wait_replicas_up(&self, timeout: Duration) {
        for r in &self.replicas {
            wait_for(
                &format!(
                    "replica {} linked to master {}",
                    r.addr(),
                    self.master.addr()
                ),
                timeout,
                || replica_linked_to(r, self.master.addr()),
            );
        }
    }

    /// Write `keys` keys (`key:0`, `key:1`, ...) to the master, a thousand
    /// per `MSET`, and wait until every replica holds them.
    #[track_caller]
    pub fn fill(&self, keys: usize, timeout: Duration) {
        self.master.set_keys("key:", keys);
        for r in &self.replicas {
            wait_for(
                &format!("{keys} keys replicated to {}", r.addr()),
                timeout,
                || r.dbsize() == Some(keys as i64),
            );
        }
    }

    /// Master first, then the replicas.
    pub fn all(&self) -> impl Iterator<Item = &RedisServer> {
        std::iter::once(&self.master).chain(&self.replicas)
    }
}

/// Whether `replica` reports `master` as its master with the link up.
pub fn replica_linked_to(replica: &RedisServer, master: SocketAddr) -> bool {
    let Ok(info) = replica.info("replication") else {
        return false;
    };
    info_value(&info, "role").as_deref() == Some("slave")
        && info_value(&info, "master_host").as_deref() == Some(master.ip().to_string().as_str())
        && info_value(&info, "master_port").as_deref() == Some(master.port().to_string().as_str())
        && info_value(&info, "master_link_status").as_deref() == Some("up")
}

// ---------------------------------------------------------------------------
// picket

/// How long [`PicketProcess::stop`] waits after SIGTERM before SIGKILL.
pub const PICKET_STOP_GRACE: Duration = Duration::from_secs(5);

/// The `picket` binary, run as `picket run --config <dir>/picket.toml` with
/// stdout and stderr captured in the same directory. Dropping it stops the
/// process (SIGCONT, SIGTERM, then SIGKILL after [`PICKET_STOP_GRACE`]).
/// [`PicketProcess::restart`] runs it again in the same directory (same
/// config, same `data_dir` when the config puts it there), appending to the
/// same log files.
pub struct PicketProcess {
    dir: TempDir,
    child: Option<Child>,
    extra_args: Vec<String>,
    envs: Vec<(String, String)>,
    /// A command that runs picket (`wrapper... picket run ...`), e.g. to
    /// start it in its own mount namespace.
    wrapper: Vec<String>,
}

impl PicketProcess {
    /// Write `config` and start picket with it.
    #[track_caller]
    pub fn start(config: &str) -> PicketProcess {
        Self::start_with(|_| config.to_owned(), &[], &[])
    }

    /// Start picket with a config built from its directory (for state files
    /// and the like), extra arguments after `run --config <file>`, and extra
    /// environment variables.
    #[track_caller]
    pub fn start_with(
        config: impl FnOnce(&Path) -> String,
        extra_args: &[&str],
        envs: &[(&str, &str)],
    ) -> PicketProcess {
        Self::start_wrapped(config, &[], extra_args, envs)
    }

    /// [`PicketProcess::start_with`], with picket started through
    /// `wrapper` (its arguments, then picket's path and arguments). The
    /// wrapper must exec picket, so that the PID stays picket's.
    #[track_caller]
    pub fn start_wrapped(
        config: impl FnOnce(&Path) -> String,
        wrapper: &[&str],
        extra_args: &[&str],
        envs: &[(&str, &str)],
    ) -> PicketProcess {
        let dir = tempfile::Builder::new()
            .prefix("picket-run-")
            .tempdir_in(run_root())
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let config_path = dir.path().join("picket.toml");
        fs::write(&config_path, config(dir.path()))
            .unwrap_or_else(|e| panic!("write {config_path:?}: {e}"));
        let mut p = PicketProcess {
            dir,
            child: None,
            extra_args: extra_args.iter().map(|a| (*a).to_owned()).collect(),
            envs: envs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            wrapper: wrapper.iter().map(|a| (*a).to_owned()).collect(),
        };
        p.spawn();
        p
    }

    #[track_caller]
    fn spawn(&mut self) {
        let open = |name: &str| {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.dir.path().join(name))
                .unwrap_or_else(|e| panic!("open {name}: {e}"))
        };
        let (stdout, stderr) = (open("stdout.log"), open("stderr.log"));
        let picket = picket_bin();
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(picket);
                c
            }
            None => Command::new(picket),
        };
        let child = cmd
            .arg("run")
            .arg("--config")
            .arg(self.config_path())
            .args(&self.extra_args)
            .envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn picket: {e}"));
        self.child = Some(child);
    }

    /// SIGKILL the running process (if any) and start it again with the
    /// same config, arguments and directory.
    #[track_caller]
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// PID while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The directory holding the config and the captured output.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Path of the config file.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("picket.toml")
    }

    /// Captured stderr (picket logs there) of every start so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }

    /// Captured stdout and stderr so far, for assertion messages.
    pub fn logs(&self) -> String {
        let read = |name: &str| fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "--- picket stdout ---\n{}\n--- picket stderr ---\n{}",
            read("stdout.log"),
            read("stderr.log")
        )
    }

    /// The exit status if the process has exited (reaping it).
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status)
    }

    /// Wait up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit_status() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }

    /// SIGKILL by PID and wait for exit.
    pub fn kill9(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let _ = child.kill();
        child.wait().ok()
    }

    /// SIGSTOP: freeze the process with its sockets open.
    pub fn sigstop(&self) {
        signal_child(self.pid(), Signal::SIGSTOP);
    }

    /// SIGCONT.
    pub fn sigcont(&self) {
        signal_child(self.pid(), Signal::SIGCONT);
    }

    /// SIGHUP (reload the configuration and the certificates).
    pub fn sighup(&self) {
        signal_child(self.pid(), Signal::SIGHUP);
    }

    /// SIGTERM without waiting.
    pub fn sigterm(&self) {
        signal_child(self.pid(), Signal::SIGTERM);
    }

    /// SIGCONT + SIGTERM, wait up to [`PICKET_STOP_GRACE`], then SIGKILL.
    /// Returns the exit status and whether SIGKILL was needed.
    pub fn stop(&mut self) -> Option<(ExitStatus, bool)> {
        let pid = self.pid()?;
        if let Ok(raw) = i32::try_from(pid) {
            // A stopped process would not act on SIGTERM until continued.
            let _ = kill(Pid::from_raw(raw), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(raw), Signal::SIGTERM);
        }
        let deadline = Instant::now() + PICKET_STOP_GRACE;
        while Instant::now() < deadline {
            if let Some(status) = self.try_exit_status() {
                return Some((status, false));
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        self.kill9().map(|s| (s, true))
    }
}

impl Drop for PicketProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A wrapper for [`PicketProcess::start_wrapped`]: the daemon runs in a
/// private mount namespace of its own (`unshare --mount`, plus a user
/// namespace when not run as root), after `sh -c script arg` set it up
/// (the script ends with `exec "$@"`), so the machine's mounts are never
/// touched and the mounts vanish with the process.
pub fn private_mount_wrapper(script: &str, arg: &str) -> Vec<String> {
    let mut w = vec!["unshare".to_string(), "--mount".to_string()];
    if !nix::unistd::geteuid().is_root() {
        w.extend(["--user".to_string(), "--map-root-user".to_string()]);
    }
    w.extend(["sh", "-c", script, arg].map(String::from));
    w
}

// ---------------------------------------------------------------------------
// HTTP

/// A plain HTTP/1.1 GET on loopback: `(status code, body)`. Bounded by
/// [`CMD_TIMEOUT`]; handles `Content-Length`, chunked and close-delimited
/// bodies (all the daemon's endpoints are small).
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let mut stream = TcpStream::connect_timeout(&addr, CMD_TIMEOUT)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(CMD_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(CMD_TIMEOUT)))
        .map_err(|e| format!("socket options {addr}: {e}"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(req.as_bytes())
        .map_err(|e| format!("write to {addr}: {e}"))?;
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no end of headers from {addr}{path}: {text:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| format!("bad status line from {addr}{path}: {head:?}"))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        let mut out = String::new();
        let mut rest = body;
        loop {
            let (size, after) = rest
                .split_once("\r\n")
                .ok_or_else(|| format!("bad chunk from {addr}{path}"))?;
            let n = usize::from_str_radix(size.trim(), 16)
                .map_err(|e| format!("bad chunk size {size:?}: {e}"))?;
            if n == 0 {
                break;
            }
            out.push_str(after.get(..n).ok_or("short chunk")?);
            rest = after.get(n + 2..).ok_or("short chunk")?;
        }
        out
    } else {
        body.to_owned()
    };
    Ok((code, body))
}

/// The value of one Prometheus sample: `name{labels}` where every
/// `(key, value)` of `labels` appears among the sample's labels.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if n != name {
            return None;
        }
        let all = labels
            .iter()
            .all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
        if all { value.parse().ok() } else { None }
    })
}

// ---------------------------------------------------------------------------
// picket clusters

/// An event a daemon logged (its Sentinel channel and message), read back
/// from the JSON log lines of [`PicketNode`]s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedEvent {
    /// Channel, e.g. `+promoted-slave`.
    pub event: String,
    /// The whole message, e.g. `+promoted-slave slave 127.0.0.3:...`.
    pub message: String,
}

/// Events in a JSON log (`log_format = "json"`), in order.
pub fn parse_events(log: &str) -> Vec<LoggedEvent> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "picket::events")
        .filter_map(|v| {
            Some(LoggedEvent {
                event: v["event"].as_str()?.to_owned(),
                message: v["message"].as_str().unwrap_or_default().to_owned(),
            })
        })
        .collect()
}

/// Addresses and ids of the daemons of a cluster, chosen before any
/// starts (so that proxies can be put between them).
#[derive(Debug, Clone)]
pub struct ClusterPlan {
    /// Daemon ids (`picket-0`, `picket-1`, ...).
    pub ids: Vec<String>,
    /// RESP listen address of each daemon.
    pub resp: Vec<SocketAddr>,
    /// HTTP listen address of each daemon.
    pub http: Vec<SocketAddr>,
    /// More lines for each daemon's `[daemon]` table (empty by default),
    /// e.g. `enable_fault_injection = true` or TLS settings.
    pub daemon_extra: Vec<String>,
}

impl ClusterPlan {
    /// `n` daemons, each on its own loopback address.
    pub fn new(n: usize) -> ClusterPlan {
        let mut plan = ClusterPlan {
            ids: Vec::new(),
            resp: Vec::new(),
            http: Vec::new(),
            daemon_extra: vec![String::new(); n],
        };
        for i in 0..n {
            let ip = next_loopback_ip();
            let resp = socket_addr(&ip, free_port(&ip));
            let mut http = socket_addr(&ip, free_port(&ip));
            while http == resp {
                http = socket_addr(&ip, free_port(&ip));
            }
            plan.ids.push(format!("picket-{i}"));
            plan.resp.push(resp);
            plan.http.push(http);
        }
        plan
    }

    /// A fault-injecting proxy for every ordered pair of daemons, on one
    /// new loopback address: `[i][j]` is how daemon `i` reaches daemon `j`
    /// (None on the diagonal), so that links can be cut one by one.
    pub fn peer_proxies(&self) -> Vec<Vec<Option<FaultProxy>>> {
        let ip = next_loopback_ip();
        let n = self.resp.len();
        (0..n)
            .map(|i| {
                (0..n)
                    .map(|j| (i != j).then(|| FaultProxy::start(&ip, self.resp[j])))
                    .collect()
            })
            .collect()
    }

    /// The `[daemon]` table of daemon `i`, reaching daemon `j` at
    /// `peer(i, j)`.
    pub fn daemon_toml(
        &self,
        i: usize,
        data_dir: &Path,
        peer: &dyn Fn(usize, usize) -> String,
    ) -> String {
        let peers: Vec<String> = (0..self.ids.len())
            .filter(|j| *j != i)
            .map(|j| format!("\"{}\"", peer(i, j)))
            .collect();
        format!(
            "[daemon]\nid = \"{}\"\nlisten = \"{}\"\nhttp_listen = \"{}\"\ndata_dir = \"{}\"\n\
             log_format = \"json\"\npeers = [{}]\n{}\n",
            self.ids[i],
            self.resp[i],
            self.http[i],
            data_dir.display(),
            peers.join(", "),
            self.daemon_extra.get(i).map_or("", String::as_str),
        )
    }

    /// Allow `SIMULATE-FAILURE` on every daemon (crash tests).
    pub fn with_fault_injection(mut self) -> ClusterPlan {
        for extra in &mut self.daemon_extra {
            extra.push_str("enable_fault_injection = true\n");
        }
        self
    }

    /// Start every daemon with `groups` (the `[[group]]` tables), peers
    /// reached directly.
    #[track_caller]
    pub fn start(self, groups: &str) -> PicketCluster {
        let resp = self.resp.clone();
        self.start_with_peers(groups, move |_, j| resp[j].to_string())
    }

    /// Start every daemon; daemon `i` reaches daemon `j` at `peer(i, j)`.
    #[track_caller]
    pub fn start_with_peers(
        self,
        groups: &str,
        peer: impl Fn(usize, usize) -> String,
    ) -> PicketCluster {
        let nodes = (0..self.ids.len())
            .map(|i| self.spawn_node(i, groups, &peer, None, &[]))
            .collect();
        let cluster = PicketCluster { nodes };
        cluster.wait_ready(READY_TIMEOUT);
        cluster
    }
}

/// Where the daemons' directories (config, state file, logs) go: memory
/// (`/dev/shm`) when there is one. The daemons of a test share one disk,
/// unlike daemons on their own hosts: under a loaded disk their state
/// writes (each fsync'd before a vote goes out) finished together, in one
/// journal commit a second late, and three elections started in the same
/// millisecond and split. `PICKET_TEST_TMP` chooses another place.
fn run_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("PICKET_TEST_TMP") {
        return PathBuf::from(dir);
    }
    let shm = Path::new("/dev/shm");
    let writable = shm.is_dir() && fs::metadata(shm).is_ok_and(|m| !m.permissions().readonly());
    if writable {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

impl ClusterPlan {
    /// Start daemon `i` alone (logging at info) with `groups`, reaching
    /// daemon `j` at `peer(i, j)`, its state in `data_dir` (default: `data`
    /// in its own directory), started through `wrapper` (see
    /// [`PicketProcess::start_wrapped`]; empty: directly).
    #[track_caller]
    pub fn spawn_node(
        &self,
        i: usize,
        groups: &str,
        peer: &dyn Fn(usize, usize) -> String,
        data_dir: Option<&Path>,
        wrapper: &[&str],
    ) -> PicketNode {
        let process = PicketProcess::start_wrapped(
            |dir| {
                let data = data_dir.map_or_else(|| dir.join("data"), Path::to_path_buf);
                format!("{}{groups}", self.daemon_toml(i, &data, peer))
            },
            wrapper,
            &[],
            &[("RUST_LOG", "info")],
        );
        PicketNode {
            id: self.ids[i].clone(),
            resp: self.resp[i],
            http: self.http[i],
            process,
        }
    }
}

/// The `[[group]]` table of a Redis group with test timings; `extra` is
/// appended (more keys, `[[group.discovery]]` tables).
pub fn group_toml(name: &str, master: SocketAddr, quorum: u32, extra: &str) -> String {
    format!(
        "[[group]]\nname = \"{name}\"\nmaster = \"{master}\"\nquorum = {quorum}\n\
         down_after = \"1s\"\nfailover_timeout = \"5s\"\n{extra}\n"
    )
}

/// One picket daemon of a test cluster.
pub struct PicketNode {
    /// Its configured id.
    pub id: String,
    /// RESP listen address (API and peer protocol).
    pub resp: SocketAddr,
    /// HTTP listen address.
    pub http: SocketAddr,
    /// The process.
    pub process: PicketProcess,
}

impl PicketNode {
    /// `/v1/status` as JSON.
    pub fn status(&self) -> Result<serde_json::Value, String> {
        let (code, body) = http_get(self.http, "/v1/status")?;
        if code != 200 {
            return Err(format!("/v1/status of {}: HTTP {code}: {body}", self.id));
        }
        serde_json::from_str(&body).map_err(|e| format!("/v1/status of {}: {e}", self.id))
    }

    /// The view of one group in `/v1/status` (Null when unreachable).
    pub fn group(&self, name: &str) -> serde_json::Value {
        self.status()
            .ok()
            .and_then(|s| {
                s["groups"]
                    .as_array()?
                    .iter()
                    .find(|g| g["name"] == name)
                    .cloned()
            })
            .unwrap_or(serde_json::Value::Null)
    }

    /// The addresses of the instances of `group` in `/v1/status` (empty
    /// when unreachable).
    pub fn instance_addrs(&self, group: &str) -> Vec<String> {
        self.group(group)["instances"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|i| i["addr"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The `/metrics` text.
    pub fn metrics(&self) -> Result<String, String> {
        match http_get(self.http, "/metrics")? {
            (200, body) => Ok(body),
            (code, body) => Err(format!("/metrics of {}: HTTP {code}: {body}", self.id)),
        }
    }

    /// A command on its RESP listener.
    pub fn cmd(&self, args: &[&str]) -> Result<Reply, String> {
        redis_cmd(self.resp, args)
    }

    /// `SENTINEL get-master-addr-by-name`.
    pub fn master_addr(&self, group: &str) -> Option<SocketAddr> {
        match self
            .cmd(&["SENTINEL", "get-master-addr-by-name", group])
            .ok()?
        {
            Reply::Array(a) if a.len() == 2 => format!("{}:{}", a[0].as_str()?, a[1].as_str()?)
                .parse()
                .ok(),
            _ => None,
        }
    }

    /// `PICKET SIMULATE-FAILURE <mode>`.
    #[track_caller]
    pub fn simulate_failure(&self, mode: &str) {
        let r = self.cmd(&["PICKET", "SIMULATE-FAILURE", mode]);
        assert!(
            r.as_ref().is_ok_and(Reply::is_ok),
            "SIMULATE-FAILURE {mode} on {}: {r:?}",
            self.id
        );
    }

    /// Every event it logged so far (all starts).
    pub fn events(&self) -> Vec<LoggedEvent> {
        parse_events(&self.process.stderr())
    }

    /// How many times it logged `event`.
    pub fn count_event(&self, event: &str) -> usize {
        self.events().iter().filter(|e| e.event == event).count()
    }

    /// Whether it answers `/readyz` with 200.
    pub fn is_ready(&self) -> bool {
        http_get(self.http, "/readyz").is_ok_and(|(c, _)| c == 200)
    }

    /// Its logs, for assertion messages.
    pub fn logs(&self) -> String {
        format!("=== {} ===\n{}", self.id, self.process.logs())
    }
}

/// Several picket daemons configured as peers of each other.
pub struct PicketCluster {
    /// The daemons, in plan order.
    pub nodes: Vec<PicketNode>,
}

impl PicketCluster {
    /// Wait until every daemon in `which` reports the same master of
    /// `group`, other than `old`, with the same config epoch; returns them.
    #[track_caller]
    pub fn wait_agreed_new_master(
        &self,
        group: &str,
        which: &[usize],
        old: SocketAddr,
        timeout: Duration,
    ) -> (SocketAddr, u64) {
        self.wait_agreed_new_master_checking(group, which, old, timeout, || {})
    }

    /// [`wait_agreed_new_master`](Self::wait_agreed_new_master), calling
    /// `check` before every look at the daemons: the place for what must
    /// hold all the way to the agreement (it panics when it does not).
    #[track_caller]
    pub fn wait_agreed_new_master_checking(
        &self,
        group: &str,
        which: &[usize],
        old: SocketAddr,
        timeout: Duration,
        mut check: impl FnMut(),
    ) -> (SocketAddr, u64) {
        let sock = |v: &serde_json::Value| v.as_str().and_then(|s| s.parse::<SocketAddr>().ok());
        let mut agreed = None;
        let deadline = Instant::now() + timeout;
        loop {
            check();
            let views: Vec<(Option<SocketAddr>, Option<u64>)> = which
                .iter()
                .map(|&i| {
                    let g = self.nodes[i].group(group);
                    (sock(&g["master"]), g["config_epoch"].as_u64())
                })
                .collect();
            if let Some((Some(m), Some(e))) = views.first().copied()
                && m != old
                && views.iter().all(|v| *v == (Some(m), Some(e)))
            {
                agreed = Some((m, e));
            }
            if agreed.is_some() || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        agreed.unwrap_or_else(|| {
            panic!(
                "daemons {which:?} did not agree on a new master of {group} (old {old}) within {timeout:?}\n{}",
                self.logs()
            )
        })
    }

    /// Wait until every running daemon answers `/readyz`.
    #[track_caller]
    pub fn wait_ready(&self, timeout: Duration) {
        for n in &self.nodes {
            wait_for(&format!("{} ready", n.id), timeout, || {
                assert!(
                    n.process.pid().is_some(),
                    "{} is not running\n{}",
                    n.id,
                    n.logs()
                );
                n.is_ready()
            });
        }
    }

    /// Wait until every daemon in `which` knows `instances` instances of
    /// `group` with a role read from INFO, and sees every peer in `which`
    /// as reachable: the state in which a failover can be expected to work.
    #[track_caller]
    pub fn wait_converged(
        &self,
        which: &[usize],
        group: &str,
        instances: usize,
        timeout: Duration,
    ) {
        for &i in which {
            let n = &self.nodes[i];
            let peers: Vec<String> = which
                .iter()
                .filter(|j| **j != i)
                .map(|j| self.nodes[*j].id.clone())
                .collect();
            wait_for(
                &format!(
                    "{} to know {instances} instances of {group} and peers {peers:?}",
                    n.id
                ),
                timeout,
                || {
                    let g = n.group(group);
                    let known = g["instances"].as_array().is_some_and(|a| {
                        a.len() == instances
                            && a.iter().all(|i| {
                                i["role"] != "unknown"
                                    && i["up"] == true
                                    && i["info_age_ms"].is_u64()
                            })
                    });
                    let reachable = peers.iter().all(|id| {
                        g["peers"].as_array().is_some_and(|ps| {
                            ps.iter()
                                .any(|p| p["id"] == id.as_str() && p["reachable"] == true)
                        })
                    });
                    known && reachable
                },
            );
        }
    }

    /// Every daemon's logs, for assertion messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(PicketNode::logs)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

// ---------------------------------------------------------------------------
// Fault-injecting TCP proxy

struct ProxyShared {
    blocked: std::sync::atomic::AtomicBool,
    stop: std::sync::atomic::AtomicBool,
    next_id: std::sync::atomic::AtomicU64,
    /// Both sockets of every live forwarded connection, by id.
    conns: std::sync::Mutex<Vec<(u64, TcpStream, TcpStream)>>,
    accepted: std::sync::atomic::AtomicU64,
    refused: std::sync::atomic::AtomicU64,
}

impl ProxyShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, TcpStream, TcpStream)>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn close_all(&self) {
        for (_, a, b) in self.lock().drain(..) {
            let _ = a.shutdown(std::net::Shutdown::Both);
            let _ = b.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Partitions between picket daemons and data servers, which loopback
/// addresses alone cannot make (a daemon's connections leave from any
/// address, and a server's address is its identity, so no proxy can sit in
/// between): each daemon runs in a cgroup of its own, and an iptables rule
/// in `OUTPUT` drops what that cgroup sends to a server, as a silent network
/// partition would. Needs root, iptables with the cgroup match and a cgroup2
/// mount; [`NetCut::new`] says what is missing.
///
/// Dropping it removes its rules and cgroups; drop it after the processes
/// in it have been stopped.
pub struct NetCut {
    /// The cgroup2 mount point.
    root: PathBuf,
    /// Its cgroup below `root`: `picket-test-<pid>-<n>`.
    base: String,
    members: usize,
    /// The arguments of every rule in force, to delete them.
    rules: std::sync::Mutex<Vec<Vec<String>>>,
}

impl NetCut {
    /// Cgroups for `members` processes, after checking that a rule can be
    /// added and removed.
    pub fn new(members: usize) -> Result<NetCut, String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        if !nix::unistd::geteuid().is_root() {
            return Err("not root: cgroups and iptables rules need root".into());
        }
        let mounts = fs::read_to_string("/proc/self/mounts")
            .map_err(|e| format!("read /proc/self/mounts: {e}"))?;
        let root = mounts
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
            })
            .ok_or("no cgroup2 file system is mounted")?;
        let base = format!(
            "picket-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let cut = NetCut {
            root,
            base,
            members,
            rules: std::sync::Mutex::new(Vec::new()),
        };
        for i in 0..members {
            let dir = cut.root.join(&cut.base).join(format!("m{i}"));
            fs::create_dir_all(&dir).map_err(|e| format!("create cgroup {dir:?}: {e}"))?;
        }
        // A rule that matches nothing, to learn whether rules work at all.
        let probe: SocketAddr = "127.0.0.1:1".parse().map_err(|e| format!("{e}"))?;
        cut.cut(0, probe)?;
        cut.heal()?;
        Ok(cut)
    }

    /// The wrapper that starts a process as member `i` (see
    /// [`PicketProcess::start_wrapped`]).
    pub fn wrapper(&self, i: usize) -> Vec<String> {
        let procs = self.root.join(self.path(i).trim_start_matches('/'));
        vec![
            "sh".into(),
            "-c".into(),
            "echo $$ > \"$0\" && exec \"$@\"".into(),
            procs.join("cgroup.procs").display().to_string(),
        ]
    }

    fn path(&self, i: usize) -> String {
        format!("/{}/m{i}", self.base)
    }

    fn iptables(args: &[String]) -> Result<(), String> {
        partition::iptables(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Drop every packet member `i` sends to `server`, from now until
    /// [`NetCut::heal`].
    pub fn cut(&self, i: usize, server: SocketAddr) -> Result<(), String> {
        let rule: Vec<String> = [
            "OUTPUT",
            "-m",
            "cgroup",
            "--path",
            &self.path(i),
            "-d",
            &format!("{}/32", server.ip()),
            "-p",
            "tcp",
            "--dport",
            &server.port().to_string(),
            "-j",
            "DROP",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        let mut add = vec!["-A".to_owned()];
        add.extend(rule.iter().cloned());
        Self::iptables(&add)?;
        self.rules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(rule);
        Ok(())
    }

    /// Remove every rule: the partitions heal.
    pub fn heal(&self) -> Result<(), String> {
        let rules = std::mem::take(&mut *self.rules.lock().unwrap_or_else(|e| e.into_inner()));
        let mut first_error = None;
        for rule in rules {
            let mut del = vec!["-D".to_owned()];
            del.extend(rule);
            if let Err(e) = Self::iptables(&del) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for NetCut {
    fn drop(&mut self) {
        let _ = self.heal();
        for i in 0..self.members {
            let _ = fs::remove_dir(self.root.join(self.path(i).trim_start_matches('/')));
        }
        let _ = fs::remove_dir(self.root.join(&self.base));
    }
}

/// A loopback TCP forwarder to `target` that can cut the link:
/// [`FaultProxy::block`] closes every forwarded connection and closes each
/// new one as soon as it is accepted, until [`FaultProxy::unblock`].
/// Dropping it stops the accept thread and closes everything.
pub struct FaultProxy {
    addr: SocketAddr,
    target: SocketAddr,
    shared: std::sync::Arc<ProxyShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Listen on `ip` (a free port) and forward to `target`.
    #[track_caller]
    pub fn start(ip: &str, target: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind(socket_addr(ip, 0))
            .unwrap_or_else(|e| panic!("proxy bind {ip}:0: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("proxy local_addr: {e}"));
        listener
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("proxy nonblocking: {e}"));
        // Loopback, or the 198.18.0.0/15 addresses of a test's own network
        // namespace (enter_own_netns): never another machine.
        let own = match target.ip() {
            std::net::IpAddr::V4(v4) => {
                v4.is_loopback() || (v4.octets()[0] == 198 && v4.octets()[1] & 0xfe == 18)
            }
            std::net::IpAddr::V6(v6) => v6.is_loopback(),
        };
        assert!(
            own,
            "proxy target {target} is neither loopback nor in 198.18.0.0/15"
        );
        let shared = std::sync::Arc::new(ProxyShared {
            blocked: false.into(),
            stop: false.into(),
            next_id: 0.into(),
            conns: std::sync::Mutex::new(Vec::new()),
            accepted: 0.into(),
            refused: 0.into(),
        });
        let s = shared.clone();
        let thread = std::thread::spawn(move || accept_loop(listener, target, s));
        FaultProxy {
            addr,
            target,
            shared,
            thread: Some(thread),
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where it forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// Cut the link: drop every forwarded connection, refuse new ones.
    pub fn block(&self) {
        self.shared.blocked.store(true, Ordering::SeqCst);
        self.shared.close_all();
    }

    /// Forward again.
    pub fn unblock(&self) {
        self.shared.blocked.store(false, Ordering::SeqCst);
    }

    /// Connections forwarded so far.
    pub fn accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections closed at once because the proxy was blocked.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.close_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, target: SocketAddr, s: std::sync::Arc<ProxyShared>) {
    while !s.stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((c, _)) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(_) => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
        };
        if s.blocked.load(Ordering::SeqCst) {
            s.refused.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(std::net::Shutdown::Both);
            continue;
        }
        let _ = client.set_nonblocking(false);
        let Ok(upstream) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) else {
            let _ = client.shutdown(std::net::Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (Ok(c2), Ok(u2), Ok(c3), Ok(u3)) = (
            client.try_clone(),
            upstream.try_clone(),
            client.try_clone(),
            upstream.try_clone(),
        ) else {
            continue;
        };
        let id = s.next_id.fetch_add(1, Ordering::SeqCst);
        s.lock().push((id, c3, u3));
        // A block() between the check above and the registration must
        // not leave this connection forwarding.
        if s.blocked.load(Ordering::SeqCst) || s.stop.load(Ordering::SeqCst) {
            s.close_all();
            continue;
        }
        s.accepted.fetch_add(1, Ordering::SeqCst);
        for (mut from, mut to) in [(client, upstream), (u2, c2)] {
            let s = s.clone();
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from, &mut to);
                let _ = from.shutdown(std::net::Shutdown::Both);
                let _ = to.shutdown(std::net::Shutdown::Both);
                s.lock().retain(|(i, _, _)| *i != id);
            });
        }
    }
}

// ---------------------------------------------------------------------------
// A client on the isolated side of a partition

/// `min-replicas-to-write` of a server (isolation fencing), None when it
/// does not answer.
pub fn min_replicas_to_write(server: SocketAddr) -> Option<i64> {
    config_get(server, "min-replicas-to-write")?.parse().ok()
}

/// The value of one setting of a server (`CONFIG GET`), None when it does
/// not answer or has no such setting.
pub fn config_get(server: SocketAddr, name: &str) -> Option<String> {
    match redis_cmd(server, &["CONFIG", "GET", name]).ok()? {
        Reply::Array(kv) => Some(kv.get(1)?.as_str()?.to_owned()),
        _ => None,
    }
}

/// What a [`SideClient`] saw.
#[derive(Debug, Default)]
struct SideLog {
    acked: Vec<(u64, Instant)>,
    refused: Vec<(String, Instant)>,
}

/// A client that writes `<prefix>:<seq>` to one server every 10 ms from
/// the local address `source` (so that a [`partition::Partition`] can keep
/// it on the server's side), on one connection kept as long as it works, as
/// real clients do, reconnecting to the same server when it breaks. It
/// records every acknowledged and every refused write. Stopped and joined
/// when dropped.
pub struct SideClient {
    log: std::sync::Arc<std::sync::Mutex<SideLog>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl SideClient {
    /// Start writing to `server` from `source`.
    pub fn start(server: SocketAddr, source: IpAddr, prefix: &str) -> SideClient {
        use picket::resp::{ClientOptions, Connection, RespError};
        let log = std::sync::Arc::new(std::sync::Mutex::new(SideLog::default()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (out, halt, prefix) = (log.clone(), stop.clone(), prefix.to_owned());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the side client");
            rt.block_on(async move {
                let opts = ClientOptions {
                    connect_timeout: Duration::from_millis(300),
                    command_timeout: Duration::from_millis(300),
                    ..Default::default()
                };
                let mut conn: Option<Connection> = None;
                let mut seq = 0u64;
                while !halt.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    if conn.is_none() {
                        conn = Connection::connect_from(&server.to_string(), source, &opts)
                            .await
                            .ok();
                    }
                    let Some(c) = conn.as_mut() else { continue };
                    seq += 1;
                    let key = format!("{prefix}:{seq}");
                    let r = c.call(["SET", key.as_str(), "1"]).await;
                    let mut l = out.lock().unwrap_or_else(|e| e.into_inner());
                    match r {
                        Ok(_) => l.acked.push((seq, Instant::now())),
                        Err(RespError::Server(e)) => {
                            l.refused.push((e.to_string(), Instant::now()))
                        }
                        Err(_) => conn = None,
                    }
                }
            });
        });
        SideClient {
            log,
            stop,
            thread: Some(thread),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SideLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every acknowledged write so far: sequence number and when.
    pub fn acked(&self) -> Vec<(u64, Instant)> {
        self.lock().acked.clone()
    }

    /// The acknowledged writes after `t`.
    pub fn acked_after(&self, t: Instant) -> Vec<(u64, Instant)> {
        self.lock()
            .acked
            .iter()
            .filter(|(_, a)| *a > t)
            .copied()
            .collect()
    }

    /// The first refused write after `t`: the error and how long after `t`.
    pub fn first_refusal_after(&self, t: Instant) -> Option<(String, Duration)> {
        self.lock()
            .refused
            .iter()
            .find(|(_, a)| *a > t)
            .map(|(e, a)| (e.clone(), a.duration_since(t)))
    }
}

impl Drop for SideClient {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

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
//! Include it from a test file with `mod common;`. Each test binary uses only
//! part of it, hence the `dead_code` allowance.
//!
//! Everything listens on 127.0.0.0/8 only (Linux routes all of it to `lo`).
//! [`next_loopback_ip`] hands out a fresh address per server within one test
//! binary so that one address means one server; ports are still picked free
//! per address because other test binaries (other worktrees, CI) may be using
//! the same addresses at the same time.
#![allow(dead_code)]

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

/// How long a server (or topology link) gets to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Default connect/read/write timeout of [`redis_cmd`].
pub const CMD_TIMEOUT: Duration = Duration::from_secs(5);
/// Interval between two checks of a polled condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Environment variable naming another server binary (e.g. `valkey-server`).
pub const SERVER_BIN_ENV: &str = "PICKET_TEST_REDIS_SERVER";

// ---------------------------------------------------------------------------
// Waiting

/// Poll `cond` until it returns true; panic with `desc` after `timeout`.
///
/// The condition is always evaluated at least once, and once more at the
/// deadline, so a slow machine does not turn a success into a failure.
#[track_caller]
pub fn wait_for(desc: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {desc}");
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

/// A loopback address not yet handed out in this test binary: 127.0.0.2,
/// 127.0.0.3, ..., then 127.0.1.1 and so on (never x.x.x.0 or x.x.x.255).
pub fn next_loopback_ip() -> String {
    loop {
        let n = NEXT_IP.fetch_add(1, Ordering::Relaxed);
        let (b, c, d) = ((n >> 16) & 0xff, (n >> 8) & 0xff, n & 0xff);
        assert!(n < 0x00ff_ffff, "ran out of loopback addresses");
        if d != 0 && d != 255 {
            return format!("127.{b}.{c}.{d}");
        }
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
    assert!(
        ip.is_loopback(),
        "tests must only listen on loopback, not {ip}"
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
    stream: TcpStream,
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
        Ok(RespConn {
            stream,
            buf: Vec::new(),
            addr,
        })
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

    fn spawn_and_wait(&mut self) -> Result<(), String> {
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
pub struct PicketProcess {
    dir: TempDir,
    child: Option<Child>,
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
        let dir = tempfile::Builder::new()
            .prefix("picket-run-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tempdir: {e}"));
        let config_path = dir.path().join("picket.toml");
        fs::write(&config_path, config(dir.path()))
            .unwrap_or_else(|e| panic!("write {config_path:?}: {e}"));
        let stdout = File::create(dir.path().join("stdout.log"))
            .unwrap_or_else(|e| panic!("create stdout.log: {e}"));
        let stderr = File::create(dir.path().join("stderr.log"))
            .unwrap_or_else(|e| panic!("create stderr.log: {e}"));
        let child = Command::new(env!("CARGO_BIN_EXE_picket"))
            .arg("run")
            .arg("--config")
            .arg(&config_path)
            .args(extra_args)
            .envs(envs.iter().copied())
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn picket: {e}"));
        PicketProcess {
            dir,
            child: Some(child),
        }
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

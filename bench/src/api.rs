//! `picket-bench api`: the client-facing API side by side with
//! redis-sentinel, in one interleaved run. Each side manages its own
//! master and two replicas (redis-server) alone (quorum 1) and is measured
//! in turn, round after round, case by case:
//!
//! - queries per second of `SENTINEL get-master-addr-by-name` at 1, 50 and
//!   500 clients, pipelined (16 deep) and not, driven by redis-benchmark,
//!   in slices that alternate between the sides;
//! - opening 10,000 connections one after another and holding them: the
//!   time until all are open, until all have answered a PING, the kernel's
//!   `ListenOverflows` meanwhile and the manager's memory per connection;
//! - a reconnect storm: 2,000 clients connecting at once, each asking
//!   where the master is;
//! - `+switch-master` fan-out: 5,000 subscribers (the time to subscribe
//!   them, the memory per subscriber), then a `SENTINEL FAILOVER` and when
//!   each subscriber got the event: when the benchmark read it, and when
//!   the kernel received it (`SO_TIMESTAMPNS`).
//!
//! Medians over the rounds, and picket's figure over Sentinel's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

use crate::cluster::{Env, GROUP, Side, start_redis};
use crate::procs::{Proc, cmd, free_port, proc_usage, wait_until};
use crate::report::stat;

/// What `picket-bench api` runs.
#[derive(Debug, Clone)]
pub struct ApiOpts {
    /// Rounds (each side measured once per case per round).
    pub rounds: usize,
    /// Client counts of the queries-per-second cases.
    pub clients: Vec<usize>,
    /// Pipeline depth of the pipelined cases.
    pub pipeline: usize,
    /// Requests per run without pipelining.
    pub requests: usize,
    /// Requests per pipelined run.
    pub pipelined_requests: usize,
    /// Slices each queries-per-second run is cut into, the two sides
    /// alternating slice by slice (see [`qps_interleaved`]).
    pub slices: usize,
    /// Connections opened and held.
    pub held: usize,
    /// Clients of the reconnect storm.
    pub storm: usize,
    /// `+switch-master` subscribers.
    pub subscribers: usize,
    /// redis-benchmark binary.
    pub redis_benchmark: PathBuf,
    /// Which cases run (`qps`, `held`, `storm`, `fanout`).
    pub cases: Vec<String>,
}

impl ApiOpts {
    fn runs(&self, case: &str) -> bool {
        self.cases.iter().any(|c| c == case)
    }
}

/// One measurement of one side.
#[derive(Debug, Clone, Serialize)]
pub struct ApiSample {
    /// Who.
    pub side: Side,
    /// Which case (`qps c=50 P=16`, `held`, ...).
    pub case: String,
    /// Which figure of the case.
    pub figure: String,
    /// The value.
    pub value: f64,
}

/// A side's manager and the servers it manages.
struct Server {
    side: Side,
    api: String,
    manager: Proc,
    _redis: Vec<Proc>,
}

impl Server {
    /// Start the manager again (its state and configuration kept), so
    /// that a memory figure is taken from a process that has not held
    /// anything yet: the allocator keeps what earlier cases freed, and the
    /// next case's growth would not show.
    async fn restart(&mut self) -> anyhow::Result<()> {
        self.manager.restart()?;
        both_replicas_known(&self.api, &self.manager).await
    }

    fn rss_kib(&self) -> anyhow::Result<u64> {
        let pid = self.manager.pid().context("the manager is not running")?;
        proc_usage(pid)
            .map(|(rss, _)| rss)
            .with_context(|| format!("cannot read /proc/{pid}"))
    }
}

fn picket_conf(listen: &str, http: &str, dir: &Path, master: &str) -> String {
    format!(
        "[daemon]\nid = \"picket-api\"\nlisten = \"{listen}\"\nhttp_listen = \"{http}\"\n\
         data_dir = \"{}\"\npeers = []\nmax_clients = 20000\n\n\
         [[group]]\nname = \"{GROUP}\"\nmaster = \"{master}\"\nquorum = 1\n\
         down_after = \"5s\"\nfailover_timeout = \"10s\"\n",
        dir.join("data").display()
    )
}

fn sentinel_conf(port: u16, dir: &Path, master: &str) -> String {
    let (h, p) = master.rsplit_once(':').unwrap_or((master, "6379"));
    format!(
        "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {}\n\
         maxclients 20000\nsentinel announce-ip 127.0.0.1\n\
         sentinel monitor {GROUP} {h} {p} 1\n\
         sentinel down-after-milliseconds {GROUP} 5000\n\
         sentinel failover-timeout {GROUP} 10000\n",
        dir.display()
    )
}

async fn replicas_known(api: &str) -> usize {
    match cmd(
        api,
        &["SENTINEL", "REPLICAS", GROUP],
        Duration::from_secs(2),
    )
    .await
    {
        Ok(redis_protocol::resp2::types::BytesFrame::Array(v)) => v.len(),
        _ => 0,
    }
}

/// Wait until the manager on `api` lists both replicas.
async fn both_replicas_known(api: &str, manager: &Proc) -> anyhow::Result<()> {
    let a = api.to_string();
    wait_until(
        "the manager to know both replicas",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let a = a.clone();
            async move { replicas_known(&a).await == 2 }
        },
    )
    .await
    .with_context(|| manager.log_tail(10))
}

async fn start(env: &Env, side: Side, dir: &Path, run: usize) -> anyhow::Result<Server> {
    std::fs::create_dir_all(dir)?;
    let (redis, addrs) = start_redis(env, dir, run, &[], &[]).await?;
    let port = free_port("127.0.0.1")?;
    let api = format!("127.0.0.1:{port}");
    let manager = match side {
        Side::RedisSentinel => {
            let conf = dir.join("sentinel.conf");
            std::fs::write(&conf, sentinel_conf(port, dir, &addrs[0]))?;
            Proc::spawn(
                "redis-sentinel",
                &env.sentinel,
                &[conf.display().to_string()],
                &[],
                &dir.join("sentinel.log"),
            )?
        }
        Side::Picket | Side::PicketTls => {
            let http = format!("127.0.0.1:{}", free_port("127.0.0.1")?);
            let conf = dir.join("picket.toml");
            std::fs::write(&conf, picket_conf(&api, &http, dir, &addrs[0]))?;
            Proc::spawn(
                "picket",
                &env.picket,
                &["run".into(), "--config".into(), conf.display().to_string()],
                &[("RUST_LOG", "warn")],
                &dir.join("picket.log"),
            )?
        }
    };
    both_replicas_known(&api, &manager).await?;
    Ok(Server {
        side,
        api,
        manager,
        _redis: redis,
    })
}

/// Move this process into a network namespace of its own, with `lo` up,
/// before any thread or process is started: every server, manager and
/// client of the run then lives in it, and `/proc/net/netstat` (read by
/// [`listen_overflows`]) counts only their sockets. On the machine's
/// namespace the counter is everyone's: another program's accept queue
/// overflowing during a case was counted against the side measured.
/// Needs root; `Err` says why not (the run then counts the machine's).
pub fn enter_own_netns() -> Result<(), String> {
    picket_bench::netns::enter(&[&["link", "set", "lo", "up"]])
}

/// The kernel's `TcpExt: ListenOverflows` (accept queue full), from
/// `/proc/net/netstat`: a header line of names, then a line of values.
pub fn listen_overflows() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines();
    while let Some(names) = lines.next() {
        let values = lines.next()?;
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let i = names
            .split_whitespace()
            .position(|n| n == "ListenOverflows")?;
        return values.split_whitespace().nth(i)?.parse().ok();
    }
    None
}

/// Queries per second reported by one redis-benchmark run (`--csv`: a
/// header line, then `"<test>","<rps>",...`).
pub fn parse_rps(csv: &str) -> Option<f64> {
    let line = csv.lines().rev().find(|l| !l.trim().is_empty())?;
    line.split("\",\"").nth(1)?.trim_matches('"').parse().ok()
}

/// One side's rate over a case's slices, in the order they ran.
struct Slices {
    requests: f64,
    secs: f64,
    rates: Vec<f64>,
}

/// Each side's requests per second at `clients` clients and `pipeline`
/// deep: the run is cut into `o.slices` slices, the sides alternating
/// (picket then Sentinel, then Sentinel then picket, ...), and each side's
/// figure is its requests over its time in all slices.
///
/// Why: one request at a time is a round trip between two processes that
/// sleep in between, and its rate is mostly the machine's wake-up
/// latency, which moved by a factor of six within minutes (17,000 to
/// 103,000 requests/s, both sides alike). Two long runs one after the
/// other saw different machines (per round ratios 0.48 to 1.42); slices
/// a fraction of a second long, in alternating order, give both sides
/// the same mix of quiet and busy moments.
fn qps_interleaved(
    o: &ApiOpts,
    servers: &[Server],
    clients: usize,
    pipeline: usize,
) -> anyhow::Result<Vec<f64>> {
    let total = if pipeline > 1 {
        o.pipelined_requests
    } else {
        o.requests
    };
    let slices = o.slices.max(1);
    // Every client sends a few requests in each slice at least.
    let n = (total / slices).max(clients * pipeline * 4);
    let mut sides: Vec<Slices> = servers
        .iter()
        .map(|_| Slices {
            requests: 0.0,
            secs: 0.0,
            rates: Vec::new(),
        })
        .collect();
    for i in 0..slices {
        let mut order: Vec<usize> = (0..servers.len()).collect();
        if i % 2 == 1 {
            order.reverse();
        }
        for k in order {
            let rate = qps(o, &servers[k].api, clients, pipeline, n)?;
            let side = &mut sides[k];
            side.requests += n as f64;
            side.secs += n as f64 / rate.max(1.0);
            side.rates.push(rate);
        }
    }
    for (s, side) in servers.iter().zip(&sides) {
        let shown: Vec<String> = side.rates.iter().map(|r| format!("{r:.0}")).collect();
        eprintln!(
            "api: qps c={clients} P={pipeline} {} slices: {}",
            s.side.name(),
            shown.join(" ")
        );
    }
    Ok(sides.iter().map(|s| s.requests / s.secs).collect())
}

fn qps(o: &ApiOpts, api: &str, clients: usize, pipeline: usize, n: usize) -> anyhow::Result<f64> {
    let (h, p) = api.rsplit_once(':').unwrap_or((api, "26379"));
    let out = Command::new(&o.redis_benchmark)
        .args(["-h", h, "-p", p, "-c", &clients.to_string()])
        .args(["-n", &n.to_string(), "-P", &pipeline.to_string(), "--csv"])
        .args(["SENTINEL", "get-master-addr-by-name", GROUP])
        .output()
        .with_context(|| format!("cannot run {}", o.redis_benchmark.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_rps(&text).with_context(|| {
        format!(
            "no rate in redis-benchmark's output: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A client socket from `src` (its own loopback address per run, so that
/// runs do not exhaust one address's ephemeral ports).
async fn connect(src: std::net::Ipv4Addr, to: &str) -> anyhow::Result<TcpStream> {
    let sock = TcpSocket::new_v4()?;
    sock.bind((src, 0).into())?;
    let to: std::net::SocketAddr = to.parse()?;
    Ok(sock.connect(to).await?)
}

/// Read from `s` until `done(bytes so far)`, within `timeout`.
async fn read_until(
    s: &mut TcpStream,
    timeout: Duration,
    done: impl Fn(&[u8]) -> bool,
) -> anyhow::Result<()> {
    let mut buf = Vec::with_capacity(64);
    let mut chunk = [0u8; 512];
    tokio::time::timeout(timeout, async {
        while !done(&buf) {
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                bail!("closed after {:?}", String::from_utf8_lossy(&buf));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok(())
    })
    .await
    .context("no reply in time")?
}

/// [`read_until`], and when the kernel received the bytes that completed
/// it (`SO_TIMESTAMPNS`, which `s` must have on; the real-time clock).
///
/// Why: the time a reader task runs is the benchmark's own scheduling as
/// much as the server's: 5,000 readers on the benchmark's two threads,
/// on a machine whose two cores also run the server, its Redis servers
/// and whatever else. In one traced fan-out both servers wrote their
/// 5,000 messages within 107 ms, and the readers saw them spread over
/// 622 and 358 ms. The kernel's receive time is when the server's write
/// reached the subscriber's socket (on loopback, within the write).
async fn read_stamped(
    s: &TcpStream,
    timeout: Duration,
    done: impl Fn(&[u8]) -> bool,
) -> anyhow::Result<std::time::SystemTime> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::AsRawFd;
    let fd = s.as_raw_fd();
    let mut buf = Vec::with_capacity(128);
    let mut chunk = [0u8; 512];
    let mut stamp = None;
    tokio::time::timeout(timeout, async {
        while !done(&buf) {
            s.readable().await?;
            let got = s.try_io(tokio::io::Interest::READABLE, || {
                let mut iov = [std::io::IoSliceMut::new(&mut chunk)];
                let mut space = nix::cmsg_space!(nix::sys::time::TimeSpec);
                let m = recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_DONTWAIT)
                    .map_err(std::io::Error::from)?;
                let mut ts = None;
                for c in m.cmsgs().map_err(std::io::Error::from)? {
                    if let ControlMessageOwned::ScmTimestampns(t) = c {
                        ts = Some(t);
                    }
                }
                Ok((m.bytes, ts))
            });
            let (n, ts) = match got {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.into()),
            };
            if n == 0 {
                bail!("closed after {:?}", String::from_utf8_lossy(&buf));
            }
            buf.extend_from_slice(&chunk[..n]);
            stamp = ts.or(stamp);
        }
        Ok(())
    })
    .await
    .context("no reply in time")??;
    let t = stamp.context("no receive time from the kernel (SO_TIMESTAMPNS)")?;
    let since_epoch = Duration::new(
        u64::try_from(t.tv_sec()).unwrap_or(0),
        u32::try_from(t.tv_nsec()).unwrap_or(0),
    );
    Ok(std::time::UNIX_EPOCH + since_epoch)
}

fn lines(b: &[u8]) -> usize {
    b.windows(2).filter(|w| w == b"\r\n").count()
}

fn resp_cmd(args: &[&str]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    v
}

/// Wait until the manager counts at most `n` connected clients (the
/// previous case's connections are gone).
async fn settle(api: &str, n: usize) -> anyhow::Result<()> {
    let a = api.to_string();
    wait_until(
        "the previous connections to close",
        Duration::from_secs(60),
        Duration::from_millis(100),
        || {
            let a = a.clone();
            async move {
                let Ok(f) = cmd(&a, &["INFO", "clients"], Duration::from_secs(2)).await else {
                    return false;
                };
                picket::resp::frame_text(&f)
                    .and_then(|t| crate::procs::info_value(&t, "connected_clients"))
                    .and_then(|v| v.parse::<usize>().ok())
                    .is_some_and(|c| c <= n)
            }
        },
    )
    .await
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Open `n` connections one after another and hold them; then a PING on
/// each. Figures: seconds until all are open, until all answered, listen
/// overflows, KiB of the manager's RSS per connection.
async fn held(
    s: &mut Server,
    n: usize,
    src: std::net::Ipv4Addr,
) -> anyhow::Result<Vec<(String, f64)>> {
    s.restart().await?;
    settle(&s.api, 2).await?;
    let rss0 = s.rss_kib()?;
    let over0 = listen_overflows().unwrap_or(0);
    let t0 = Instant::now();
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        conns.push(
            connect(src, &s.api)
                .await
                .with_context(|| format!("connection {i}"))?,
        );
    }
    let opened = t0.elapsed();
    let ping = resp_cmd(&["PING"]);
    for c in &mut conns {
        c.write_all(&ping).await?;
    }
    for c in &mut conns {
        read_until(c, Duration::from_secs(30), |b| b.ends_with(b"\r\n")).await?;
    }
    let answered = t0.elapsed();
    let over = listen_overflows().unwrap_or(0).saturating_sub(over0);
    let rss1 = s.rss_kib()?;
    drop(conns);
    Ok(vec![
        ("open s".into(), secs(opened)),
        ("all answered s".into(), secs(answered)),
        ("ListenOverflows".into(), over as f64),
        (
            "KiB per connection".into(),
            rss1.saturating_sub(rss0) as f64 / n as f64,
        ),
    ])
}

/// `n` clients connect at once, each asks where the master is. Figures:
/// seconds until all have their answer, listen overflows.
async fn storm(
    s: &Server,
    n: usize,
    src: std::net::Ipv4Addr,
) -> anyhow::Result<Vec<(String, f64)>> {
    settle(&s.api, 2).await?;
    let over0 = listen_overflows().unwrap_or(0);
    let ask = resp_cmd(&["SENTINEL", "get-master-addr-by-name", GROUP]);
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let api = s.api.clone();
        let ask = ask.clone();
        tasks.spawn(async move {
            let mut c = connect(src, &api).await?;
            c.write_all(&ask).await?;
            // *2, $len, host, $len, port.
            read_until(&mut c, Duration::from_secs(30), |b| lines(b) >= 5).await?;
            anyhow::Ok(c)
        });
    }
    let mut conns = Vec::with_capacity(n);
    while let Some(r) = tasks.join_next().await {
        conns.push(r??);
    }
    let all = t0.elapsed();
    let over = listen_overflows().unwrap_or(0).saturating_sub(over0);
    drop(conns);
    Ok(vec![
        ("all answered s".into(), secs(all)),
        ("ListenOverflows".into(), over as f64),
    ])
}

/// `n` subscribers to `+switch-master`, then a failover. Figures: seconds
/// to subscribe them all (one after another), KiB of RSS per subscriber,
/// and when they got the event: the first (from the failover's start, which
/// includes the failover itself), then the 99th percentile and the last
/// after the first.
async fn fanout(
    s: &mut Server,
    n: usize,
    src: std::net::Ipv4Addr,
) -> anyhow::Result<Vec<(String, f64)>> {
    // Restarted once both replicas are known again after the last
    // failover: a new one can start.
    s.restart().await?;
    settle(&s.api, 2).await?;
    let rss0 = s.rss_kib()?;
    let sub = resp_cmd(&["SUBSCRIBE", "+switch-master"]);
    let t0 = Instant::now();
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = connect(src, &s.api).await?;
        c.write_all(&sub).await?;
        conns.push(c);
    }
    for c in &mut conns {
        // *3, $9 subscribe, $14 +switch-master, :1.
        read_until(c, Duration::from_secs(30), |b| lines(b) >= 6).await?;
        nix::sys::socket::setsockopt(&*c, nix::sys::socket::sockopt::ReceiveTimestampns, &true)
            .context("SO_TIMESTAMPNS")?;
    }
    let subscribed = t0.elapsed();
    let rss1 = s.rss_kib()?;
    let mut tasks = tokio::task::JoinSet::new();
    // Each reader says when it runs: the failover starts only once all
    // wait for their event (picket's switchover publishes within
    // milliseconds, before 5,000 new tasks have all run once).
    let waiting = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // The last reader to get its event wakes this task, once. Collecting
    // the readers through the JoinSet meanwhile woke this task (the
    // benchmark's main thread) at every receipt, and those 5,000
    // wake-ups preempted the server writing the fan-out on the same core
    // (perf sched: picket's listener thread switched out 341 times for
    // the benchmark's main thread during one fan-out).
    let left = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(n));
    let all_in = std::sync::Arc::new(tokio::sync::Notify::new());
    for c in conns {
        let waiting = waiting.clone();
        let left = left.clone();
        let all_in = all_in.clone();
        tasks.spawn(async move {
            waiting.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // *3, $7 message, $14 +switch-master, $n, the payload.
            let r = read_stamped(&c, Duration::from_secs(90), |b| {
                b.windows(14).any(|w| w == b"+switch-master") && lines(b) >= 7
            })
            .await;
            let at = Instant::now();
            if left.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
                all_in.notify_one();
            }
            r.map(|received| (at, received))
        });
    }
    let w = waiting.clone();
    wait_until(
        "every subscriber to wait for its event",
        Duration::from_secs(30),
        Duration::from_millis(10),
        || {
            let w = w.clone();
            async move { w.load(std::sync::atomic::Ordering::Relaxed) == n }
        },
    )
    .await?;
    // A failover may be refused for a moment after the last one (the
    // replicas are being reconfigured): ask again until it starts.
    let deadline = Instant::now() + Duration::from_secs(60);
    let started = loop {
        let r = cmd(
            &s.api,
            &["SENTINEL", "FAILOVER", GROUP],
            Duration::from_secs(5),
        )
        .await;
        if matches!(&r, Ok(f) if picket::resp::frame_text(f).as_deref() == Some("OK")) {
            break Instant::now();
        }
        if Instant::now() > deadline {
            bail!("SENTINEL FAILOVER refused: {r:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // Every reader has its own bound (90 s).
    tokio::time::timeout(Duration::from_secs(120), all_in.notified())
        .await
        .context("the subscribers' readers did not finish")?;
    let mut got = Vec::with_capacity(n);
    let mut received = Vec::with_capacity(n);
    while let Some(r) = tasks.join_next().await {
        let (at, kernel) = r??;
        got.push(at);
        received.push(kernel);
    }
    got.sort();
    received.sort();
    let kernel_at = |q: f64| {
        let i = ((received.len() as f64 - 1.0) * q).round() as usize;
        match (received.first(), received.get(i)) {
            (Some(first), Some(t)) => secs(t.duration_since(*first).unwrap_or_default()) * 1000.0,
            _ => 0.0,
        }
    };
    let first = got.first().copied().unwrap_or(started);
    let at = |q: f64| {
        let i = ((got.len() as f64 - 1.0) * q).round() as usize;
        got.get(i)
            .map_or(0.0, |t| secs(t.saturating_duration_since(first)) * 1000.0)
    };
    Ok(vec![
        ("subscribe all s".into(), secs(subscribed)),
        (
            "KiB per subscriber".into(),
            rss1.saturating_sub(rss0) as f64 / n as f64,
        ),
        (
            "first event after FAILOVER ms".into(),
            secs(first.saturating_duration_since(started)) * 1000.0,
        ),
        ("p50 after first ms".into(), at(0.5)),
        ("p99 after first ms".into(), at(0.99)),
        ("last after first ms".into(), at(1.0)),
        ("kernel p50 after first ms".into(), kernel_at(0.5)),
        ("kernel p99 after first ms".into(), kernel_at(0.99)),
        ("kernel last after first ms".into(), kernel_at(1.0)),
    ])
}

/// Run every case, interleaved, and return the samples.
pub async fn run(env: &Env, o: &ApiOpts, work: &Path) -> anyhow::Result<Vec<ApiSample>> {
    // The connections of the largest case, and room for the rest; the
    // managers and redis-benchmark inherit it.
    let want = o.held.max(o.storm).max(o.subscribers) as u64 + 1000;
    let got = crate::procs::raise_nofile(want);
    if got < want {
        bail!("the open-file limit is {got}, {want} needed (run as root or raise it)");
    }
    if !o.redis_benchmark.exists() {
        bail!(
            "redis-benchmark not found at {} (Debian: apt-get install redis-tools)",
            o.redis_benchmark.display()
        );
    }
    let mut servers = Vec::new();
    for (i, side) in [Side::Picket, Side::RedisSentinel].into_iter().enumerate() {
        eprintln!("api: starting {}", side.name());
        servers.push(
            start(
                env,
                side,
                &work.join(format!("api-{}", side.name())),
                200 + i,
            )
            .await?,
        );
    }
    let mut samples = Vec::new();
    let mut push = |side: Side, case: &str, figs: Vec<(String, f64)>| {
        let shown: Vec<String> = figs.iter().map(|(f, v)| format!("{f} {v:.3}")).collect();
        eprintln!("api: {case} {}: {}", side.name(), shown.join(", "));
        for (figure, value) in figs {
            samples.push(ApiSample {
                side,
                case: case.to_string(),
                figure,
                value,
            });
        }
    };
    let mut src_n = 0u8;
    let mut next_src = || {
        src_n = src_n.wrapping_add(1).max(1);
        std::net::Ipv4Addr::new(127, 91, src_n, 1)
    };
    for round in 0..o.rounds {
        eprintln!("api: round {}/{}", round + 1, o.rounds);
        for &c in o.clients.iter().filter(|_| o.runs("qps")) {
            for p in [1, o.pipeline] {
                let case = format!("qps c={c} P={p}");
                let rates = qps_interleaved(o, &servers, c, p)?;
                for (s, v) in servers.iter().zip(rates) {
                    push(s.side, &case, vec![("requests/s".into(), v)]);
                }
            }
        }
        for s in servers.iter_mut().filter(|_| o.runs("held")) {
            let figs = held(s, o.held, next_src()).await?;
            push(s.side, &format!("held {}", o.held), figs);
        }
        for s in servers.iter().filter(|_| o.runs("storm")) {
            let figs = storm(s, o.storm, next_src()).await?;
            push(s.side, &format!("storm {}", o.storm), figs);
        }
        for s in servers.iter_mut().filter(|_| o.runs("fanout")) {
            let figs = fanout(s, o.subscribers, next_src()).await?;
            push(s.side, &format!("fan-out {}", o.subscribers), figs);
        }
    }
    Ok(samples)
}

/// The table: per case and figure, each side's median and picket over
/// Sentinel.
pub fn table(samples: &[ApiSample], rounds: usize) -> String {
    let mut keys: Vec<(String, String)> = Vec::new();
    for s in samples {
        let k = (s.case.clone(), s.figure.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut out = format!(
        "\nClient API, picket vs redis-sentinel (medians of {rounds} interleaved rounds)\n\
         {:<22} {:<30} {:>14} {:>14} {:>8}\n",
        "case", "figure", "picket", "redis-sentinel", "ratio"
    );
    for (case, figure) in keys {
        let median = |side: Side| {
            let v: Vec<f64> = samples
                .iter()
                .filter(|s| s.side == side && s.case == case && s.figure == figure)
                .map(|s| s.value)
                .collect();
            stat(&v).map(|s| s.median)
        };
        let (p, r) = (median(Side::Picket), median(Side::RedisSentinel));
        let ratio = match (p, r) {
            (Some(p), Some(r)) if r != 0.0 => format!("{:.2}", p / r),
            _ => "-".into(),
        };
        let f = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.3}"));
        out.push_str(&format!(
            "{case:<22} {figure:<30} {:>14} {:>14} {ratio:>8}\n",
            f(p),
            f(r)
        ));
    }
    out.push_str("ratio: picket / redis-sentinel (requests/s: higher is better; times, overflows and memory: lower is better)\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_redis_benchmark_csv() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\"\n\"SENTINEL get-master-addr-by-name cache\",\"141643.05\",\"0.183\"\n";
        assert_eq!(parse_rps(csv), Some(141643.05));
        assert_eq!(parse_rps("garbage"), None);
    }

    #[test]
    fn reads_listen_overflows() {
        // Present on every Linux kernel the benchmark runs on.
        assert!(listen_overflows().is_some());
    }
}

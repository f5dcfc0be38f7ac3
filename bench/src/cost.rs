//! Cost per monitored instance: one picket daemon and one redis-sentinel,
//! each alone (quorum 1), monitoring N instances served by the benchmark's
//! own target process (or by real redis-server processes), CPU% and RSS
//! sampled from /proc over a fixed window.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use redis_protocol::resp2::types::BytesFrame;
use serde::Serialize;
use tokio::time::Instant;

use crate::cluster::{Env, Side, picket_status, redis_args};
use crate::procs::{Proc, USER_HZ, cmd, free_port, pairs, proc_usage, wait_until};
use crate::targets::Layout;

/// What instances the managers watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetKind {
    /// The benchmark's own RESP stand-in (one process).
    Fake,
    /// Real redis-server processes with real replication.
    Redis,
}

/// One measurement.
#[derive(Debug, Clone, Serialize)]
pub struct CostRow {
    /// Who was measured.
    pub side: Side,
    /// Monitored instances.
    pub instances: usize,
    /// Groups (masters) among them.
    pub groups: usize,
    /// What served them.
    pub targets: TargetKind,
    /// down-after given to the manager.
    pub down_after_ms: u64,
    /// Resulting PING period per instance.
    pub ping_period_ms: u64,
    /// Resulting INFO period of a master.
    pub info_period_ms: u64,
    /// Resulting INFO period of a healthy replica.
    pub replica_info_period_ms: u64,
    /// Start until every instance was known and connected.
    pub ready_s: f64,
    /// CPU over the window, percent of one core.
    pub cpu_pct: f64,
    /// Mean RSS over the window, MiB.
    pub rss_mib: f64,
    /// Largest RSS sample, MiB.
    pub rss_max_mib: f64,
    /// CPU of the target process(es) over the same window.
    pub targets_cpu_pct: f64,
    /// Window length, seconds.
    pub window_s: f64,
}

impl CostRow {
    /// CPU time per PING sent, in microseconds: the CPU per instance per
    /// probe per second. Constant across sizes when the cost grows
    /// linearly with the instances.
    pub fn cpu_us_per_ping(&self) -> f64 {
        let pings_per_s = self.instances as f64 * 1000.0 / self.ping_period_ms.max(1) as f64;
        if pings_per_s > 0.0 {
            self.cpu_pct / 100.0 * 1e6 / pings_per_s
        } else {
            f64::NAN
        }
    }
}

/// picket's probe cadence for a down_after (src/config.rs `ping_period`,
/// src/group/observe.rs `INFO_FAST`, `INFO_SLOW`): PING, INFO of a master,
/// INFO of a healthy replica.
pub fn picket_cadence(down_after: Duration) -> (Duration, Duration, Duration) {
    let ping = (down_after / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
    (
        ping,
        Duration::from_secs(1).max(ping),
        Duration::from_secs(10).max(ping),
    )
}

/// redis-sentinel's cadence (sentinel.c: ping period min(down-after, 1 s),
/// INFO every 10 s while the master is healthy, masters and replicas alike).
pub fn sentinel_cadence(down_after: Duration) -> (Duration, Duration, Duration) {
    (
        down_after.min(Duration::from_secs(1)),
        Duration::from_secs(10),
        Duration::from_secs(10),
    )
}

/// Settings of the cost measurement.
#[derive(Debug, Clone)]
pub struct CostOpts {
    /// Instances per group (master + replicas).
    pub per_group: usize,
    /// Sampling window.
    pub window: Duration,
    /// Wait after readiness before sampling.
    pub warmup: Duration,
    /// Loopback network (`A.B`) of the targets.
    pub net: String,
}

struct Targets {
    procs: Vec<Proc>,
    layout: Layout,
}

impl Targets {
    fn cpu_ticks(&self) -> u64 {
        self.procs
            .iter()
            .filter_map(|p| p.pid().and_then(proc_usage))
            .map(|(_, t)| t)
            .sum()
    }
}

/// Instances per stand-in process: a listener and a connection each
/// (Sentinel: two) stay well within a 20,000 open-file limit.
const PER_TARGET_PROCESS: usize = 4000;

async fn start_fake(env: &Env, dir: &Path, n: usize, o: &CostOpts) -> anyhow::Result<Targets> {
    let exe = std::env::current_exe().context("cannot find picket-bench's own binary")?;
    let per_group = o.per_group.max(1);
    let chunk = (PER_TARGET_PROCESS / per_group).max(1) * per_group;
    let mut procs = Vec::new();
    let mut paths = Vec::new();
    let mut first = 0;
    while first < n {
        let count = chunk.min(n - first);
        let layout_path = dir.join(format!("layout-{first}.json"));
        procs.push(Proc::spawn(
            "targets",
            &exe,
            &[
                "targets".into(),
                "--first".into(),
                first.to_string(),
                "--count".into(),
                count.to_string(),
                "--per-group".into(),
                o.per_group.to_string(),
                "--net".into(),
                o.net.clone(),
                "--layout-out".into(),
                layout_path.display().to_string(),
            ],
            &[],
            &dir.join(format!("targets-{first}.log")),
        )?);
        paths.push(layout_path);
        first += count;
    }
    let mut layout = Layout { groups: Vec::new() };
    for (p, lp) in procs.iter().zip(&paths) {
        let wait_for = lp.clone();
        wait_until(
            "the targets to listen",
            Duration::from_secs(60),
            Duration::from_millis(50),
            || {
                let lp = wait_for.clone();
                async move { lp.exists() }
            },
        )
        .await
        .with_context(|| p.log_tail(10))?;
        let part: Layout = serde_json::from_slice(&std::fs::read(lp)?)?;
        layout.groups.extend(part.groups);
    }
    let _ = env;
    Ok(Targets { procs, layout })
}

async fn start_real(env: &Env, dir: &Path, n: usize, o: &CostOpts) -> anyhow::Result<Targets> {
    let mut procs = Vec::new();
    let mut groups: Vec<Vec<String>> = Vec::new();
    for i in 0..n {
        let ip = crate::targets::target_ip(&o.net, i);
        let port = free_port(&ip)?;
        let d = dir.join(format!("redis-{i}"));
        std::fs::create_dir_all(&d)?;
        let master = if i % o.per_group == 0 {
            groups.push(Vec::new());
            None
        } else {
            groups.last().and_then(|g| g.first().cloned())
        };
        let args = redis_args(&ip, port, &d, master.as_deref());
        procs.push(Proc::spawn(
            &format!("redis {ip}"),
            &env.redis,
            &args,
            &[],
            &d.join("log"),
        )?);
        if let Some(g) = groups.last_mut() {
            g.push(format!("{ip}:{port}"));
        }
    }
    for g in &groups {
        let m = g[0].clone();
        let want = g.len() - 1;
        wait_until("replicas online", Duration::from_secs(30), Duration::from_millis(50), || {
            let m = m.clone();
            async move {
                matches!(cmd(&m, &["INFO", "replication"], Duration::from_secs(1)).await,
                    Ok(f) if picket::resp::frame_text(&f).is_some_and(|t| t.matches("state=online").count() == want))
            }
        })
        .await?;
    }
    Ok(Targets {
        procs,
        layout: Layout { groups },
    })
}

fn sentinel_conf(port: u16, dir: &Path, layout: &Layout, down_after: Duration) -> String {
    let mut s = format!(
        "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {}\nsentinel announce-ip 127.0.0.1\n",
        dir.display()
    );
    for (i, g) in layout.groups.iter().enumerate() {
        let (h, p) = g[0].rsplit_once(':').unwrap_or((&g[0], "6379"));
        s.push_str(&format!(
            "sentinel monitor g{i} {h} {p} 1\nsentinel down-after-milliseconds g{i} {}\nsentinel failover-timeout g{i} 10000\n",
            down_after.as_millis()
        ));
    }
    s
}

fn picket_conf(
    listen: &str,
    http: &str,
    dir: &Path,
    layout: &Layout,
    down_after: Duration,
) -> String {
    let mut s = format!(
        "[daemon]\nid = \"picket-cost\"\nlisten = \"{listen}\"\nhttp_listen = \"{http}\"\ndata_dir = \"{}\"\npeers = []\n",
        dir.join("data").display()
    );
    for (i, g) in layout.groups.iter().enumerate() {
        s.push_str(&format!(
            "\n[[group]]\nname = \"g{i}\"\nmaster = \"{}\"\nquorum = 1\ndown_after = \"{}ms\"\nfailover_timeout = \"10s\"\n",
            g[0],
            down_after.as_millis()
        ));
    }
    s
}

/// Every master known with all its replicas (SENTINEL MASTERS num-slaves).
async fn sentinel_sees_all(api: &str, layout: &Layout) -> bool {
    let Ok(BytesFrame::Array(masters)) =
        cmd(api, &["SENTINEL", "MASTERS"], Duration::from_secs(2)).await
    else {
        return false;
    };
    let want = layout.groups.first().map_or(0, |g| g.len() - 1);
    masters.len() == layout.groups.len()
        && masters.iter().all(|m| {
            let p = pairs(m);
            let get = |k: &str| p.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.clone());
            get("num-slaves").and_then(|v| v.parse::<usize>().ok()) == Some(want)
                && get("flags").as_deref() == Some("master")
        })
}

async fn picket_sees_all(http: &str, layout: &Layout) -> bool {
    let Some(s) = picket_status(http).await else {
        return false;
    };
    let Some(groups) = s["groups"].as_array() else {
        return false;
    };
    let want = layout.groups.first().map_or(0, Vec::len);
    groups.len() == layout.groups.len()
        && groups.iter().all(|g| {
            g["instances"].as_array().is_some_and(|v| {
                v.len() == want && v.iter().all(|i| i["connected"].as_bool() == Some(true))
            })
        })
}

/// Measure one manager monitoring `n` instances.
pub async fn measure(
    env: &Env,
    side: Side,
    n: usize,
    down_after: Duration,
    kind: TargetKind,
    o: &CostOpts,
) -> anyhow::Result<CostRow> {
    let dir: PathBuf = env.work.join(format!(
        "cost-{}-{n}-{}ms-{kind:?}",
        side.name(),
        down_after.as_millis()
    ));
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    // The manager holds a connection per instance (Sentinel: two).
    let per_instance = if side == Side::RedisSentinel { 2 } else { 1 };
    let want = n as u64 * per_instance + 1024;
    let limit = crate::procs::raise_nofile(want);
    if limit < want {
        eprint!("(open-file limit {limit} < {want}: connections may fail) ");
    }
    let targets = match kind {
        TargetKind::Fake => start_fake(env, &dir, n, o).await?,
        TargetKind::Redis => start_real(env, &dir, n, o).await?,
    };
    let port = free_port("127.0.0.1")?;
    let api = format!("127.0.0.1:{port}");
    let started = Instant::now();
    let (manager, http) = match side {
        Side::RedisSentinel => {
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                sentinel_conf(port, &dir, &targets.layout, down_after),
            )?;
            let p = Proc::spawn(
                "redis-sentinel",
                &env.sentinel,
                &[conf.display().to_string()],
                &[],
                &dir.join("sentinel.log"),
            )?;
            (p, None)
        }
        Side::Picket | Side::PicketTls => {
            let http = format!("127.0.0.1:{}", free_port("127.0.0.1")?);
            let conf = dir.join("picket.toml");
            std::fs::write(
                &conf,
                picket_conf(&api, &http, &dir, &targets.layout, down_after),
            )?;
            let p = Proc::spawn(
                "picket",
                &env.picket,
                &["run".into(), "--config".into(), conf.display().to_string()],
                &[("RUST_LOG", "warn")],
                &dir.join("picket.log"),
            )?;
            (p, Some(http))
        }
    };
    let layout = targets.layout.clone();
    let ready = wait_until(
        "the manager to see every instance",
        Duration::from_secs(180),
        Duration::from_millis(500),
        || {
            let api = api.clone();
            let http = http.clone();
            let layout = layout.clone();
            async move {
                match &http {
                    None => sentinel_sees_all(&api, &layout).await,
                    Some(h) => picket_sees_all(h, &layout).await,
                }
            }
        },
    )
    .await;
    if let Err(e) = ready {
        bail!("{e}\n{} log:\n{}", manager.name, manager.log_tail(20));
    }
    let ready_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(o.warmup).await;
    let pid = manager.pid().context("manager not running")?;
    let (_, c0) = proc_usage(pid).context("cannot read /proc of the manager")?;
    let t_c0 = targets.cpu_ticks();
    let t0 = Instant::now();
    let mut rss = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while t0.elapsed() < o.window {
        tick.tick().await;
        if let Some((r, _)) = proc_usage(pid) {
            rss.push(r as f64 / 1024.0);
        }
    }
    let (r1, c1) = proc_usage(pid).context("the manager exited during the window")?;
    rss.push(r1 as f64 / 1024.0);
    let window = t0.elapsed().as_secs_f64();
    let t_c1 = targets.cpu_ticks();
    let (ping, info, replica_info) = match side {
        Side::Picket | Side::PicketTls => picket_cadence(down_after),
        Side::RedisSentinel => sentinel_cadence(down_after),
    };
    drop(manager);
    drop(targets);
    Ok(CostRow {
        side,
        instances: n,
        groups: layout.groups.len(),
        targets: kind,
        down_after_ms: down_after.as_millis() as u64,
        ping_period_ms: ping.as_millis() as u64,
        info_period_ms: info.as_millis() as u64,
        replica_info_period_ms: replica_info.as_millis() as u64,
        ready_s,
        cpu_pct: (c1 - c0) as f64 / USER_HZ / window * 100.0,
        rss_mib: rss.iter().sum::<f64>() / rss.len() as f64,
        rss_max_mib: rss.iter().copied().fold(0.0, f64::max),
        targets_cpu_pct: t_c1.saturating_sub(t_c0) as f64 / USER_HZ / window * 100.0,
        window_s: window,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cadences() {
        let s = Duration::from_secs;
        assert_eq!(picket_cadence(s(4)), (s(1), s(1), s(10)));
        assert_eq!(
            picket_cadence(s(1)),
            (Duration::from_millis(250), s(1), s(10))
        );
        assert_eq!(
            picket_cadence(Duration::from_millis(40)),
            (Duration::from_millis(20), s(1), s(10))
        );
        assert_eq!(sentinel_cadence(s(4)), (s(1), s(10), s(10)));
        assert_eq!(
            sentinel_cadence(Duration::from_millis(500)),
            (Duration::from_millis(500), s(10), s(10))
        );
    }

    #[test]
    fn cpu_per_ping() {
        let row = |n: usize, ping: u64, cpu: f64| CostRow {
            side: Side::Picket,
            instances: n,
            groups: n / 2,
            targets: TargetKind::Fake,
            down_after_ms: ping * 4,
            ping_period_ms: ping,
            info_period_ms: 1000,
            replica_info_period_ms: 10000,
            ready_s: 0.0,
            cpu_pct: cpu,
            rss_mib: 0.0,
            rss_max_mib: 0.0,
            targets_cpu_pct: 0.0,
            window_s: 60.0,
        };
        // 1,000 PINGs a second for 5 % of a core: 50 µs each.
        assert!((row(1000, 1000, 5.0).cpu_us_per_ping() - 50.0).abs() < 1e-9);
        assert!((row(1000, 250, 20.0).cpu_us_per_ping() - 50.0).abs() < 1e-9);
    }
}

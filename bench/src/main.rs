//! picket-bench: picket side by side with Redis Sentinel (redis-sentinel)
//! on the same topology, under the same writing client.
//!
//! - `failover`: kill -9 of the master of a master + 2 replicas topology
//!   (redis-server, one loopback address each), managed in turn by three
//!   redis-sentinel processes and by three picket daemons with the same
//!   down_after and quorum 2; runs interleaved. Measures the write
//!   unavailability, the time to the switch, errors by kind, acknowledged
//!   writes lost, the demotion of the restarted old master and double
//!   failovers.
//! - `switchover`: `SENTINEL FAILOVER` against `PICKET FAILOVER` with the
//!   master alive: acknowledged writes lost and the write gap.
//! - `cost`: CPU and RSS of one manager monitoring 100 and 1,000 instances.
//! - `partition`: the master and one client cut off from the managers, the
//!   replicas and another client for 5 s and 20 s (Jepsen-style), under
//!   redis-sentinel (defaults, and with `min-replicas-to-write 1`) and picket
//!   (without and with isolation fencing): acknowledged writes lost. Needs
//!   root (iptables).
//! - `restart`: kill -9 of the master and an empty restart at the same
//!   address 0.1 s, 0.4 s and 2 s later (disk-based replication, 20,000
//!   keys): the share of the keys on the group's final master, runs
//!   interleaved.
//! - `all` (the default): the four in turn (`partition` only as root, and
//!   not with `--quick`).
//! - `tls`: the `failover` run of picket without and with TLS, side by
//!   side: mutual TLS between the three daemons (each its own certificate
//!   of a CA made for the run, the peers logged in as a peer user) and TLS
//!   with a client certificate and a password for the writing client.
//!   Reports the difference of the write unavailability (the goal: within
//!   50 ms).
//!
//! - `api`: the client-facing API side by side with redis-sentinel:
//!   queries per second at 1, 50 and 500 clients, pipelined and not,
//!   10,000 held connections, a reconnect storm of 2,000 clients and the
//!   `+switch-master` fan-out to 5,000 subscribers, with the memory per
//!   connection and per subscriber (see `api.rs`).
//!
//! `--quick` (for CI) runs one failover per side and fails only if a side
//! did not fail over. See docs/benchmarks.md for the method.

mod api;
mod cluster;
mod cost;
mod partition_runs;
mod plot;
mod procs;
mod report;
mod restart;
mod runs;
mod targets;
mod watch;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use serde::Serialize;

use crate::cluster::{Env, ServerKind, Side};
use crate::cost::{CostOpts, CostRow, TargetKind};
use crate::report::Compared;
use crate::runs::{FailoverRun, RunOpts, SwitchoverRun};

#[derive(Parser, Debug)]
#[command(
    name = "picket-bench",
    about = "picket vs redis-sentinel: failover, switchover, cost, partition"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    o: Opts,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Failover, switchover and cost, in turn (the default).
    All,
    /// Unplanned failover: kill -9 of the master.
    Failover,
    /// Planned switchover with the master alive.
    Switchover,
    /// CPU and RSS per monitored instance.
    Cost,
    /// A partition of the master and one client (needs root).
    Partition,
    /// kill -9 of the master and an empty restart at the same address:
    /// the keys the final master keeps.
    Restart,
    /// Unplanned failover, picket without and with TLS (mutual TLS between
    /// the daemons, TLS and a password for the client), side by side.
    Tls,
    /// The client API: queries per second, held connections, a
    /// reconnect storm and the pub/sub fan-out, side by side.
    Api,
    /// Draw the plot again (`--plot PATH`) from a `--json` file.
    Replot {
        /// The JSON written by an earlier run.
        from: PathBuf,
    },
    /// (internal) serve stand-in Redis instances for `cost`.
    #[command(hide = true)]
    Targets {
        /// Index of the first instance (its address); several processes
        /// share a large count, each within its open-file limit.
        #[arg(long, default_value_t = 0)]
        first: usize,
        #[arg(long)]
        count: usize,
        #[arg(long, default_value_t = 2)]
        per_group: usize,
        #[arg(long, default_value = "127.78")]
        net: String,
        #[arg(long)]
        layout_out: PathBuf,
    },
}

fn durations(s: &str) -> Result<Vec<Duration>, String> {
    s.split(',')
        .map(|p| humantime::parse_duration(p.trim()).map_err(|e| format!("{p}: {e}")))
        .collect()
}

fn counts(s: &str) -> Result<Vec<usize>, String> {
    s.split(',')
        .map(|p| p.trim().parse().map_err(|e| format!("{p}: {e}")))
        .collect()
}

#[derive(clap::Args, Debug)]
struct Opts {
    /// CI mode: one failover per side at down_after 1 s (asserted), one
    /// switchover per side and a 5 s cost sample at 100 instances (reported).
    #[arg(long, global = true)]
    quick: bool,
    /// Failover runs per side at each down_after.
    #[arg(long, global = true, default_value_t = 5)]
    runs: usize,
    /// Failover runs per side at down_after 1 s (the double-failover count).
    #[arg(long, global = true, default_value_t = 20)]
    double_runs: usize,
    /// down_after values of the failover runs.
    #[arg(long, global = true, value_parser = durations, default_value = "1s,5s")]
    down_after: std::vec::Vec<Duration>,
    /// Switchover runs per side.
    #[arg(long, global = true, default_value_t = 5)]
    switchover_runs: usize,
    /// Sentinel's and picket's failover timeout.
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "10s")]
    failover_timeout: Duration,
    /// Time between two writes of the client.
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "10ms")]
    interval: Duration,
    /// Per-operation timeout of the client.
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "200ms")]
    timeout: Duration,
    /// How long to wait for the restarted old master's demotion.
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "30s")]
    demote_wait: Duration,
    /// Instance counts of the cost measurement.
    #[arg(long, global = true, value_parser = counts, default_value = "100,1000,10000")]
    cost_sizes: std::vec::Vec<usize>,
    /// redis-sentinel is measured only up to this many instances (at
    /// 10,000 it takes minutes to discover its replicas).
    #[arg(long, global = true, default_value_t = 1000)]
    cost_sentinel_max: usize,
    /// Instances per group in the cost measurement (master + replicas).
    #[arg(long, global = true, default_value_t = 2)]
    per_group: usize,
    /// Sampling window of the cost measurement.
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "60s")]
    cost_window: Duration,
    /// redis-sentinel's down-after in the cost measurement (ping period
    /// min(down-after, 1 s)).
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "4s")]
    cost_sentinel_down_after: Duration,
    /// picket's down_after values in the cost measurement (ping period
    /// down_after / 4): 4 s matches Sentinel's 1 s ping period.
    #[arg(long, global = true, value_parser = durations, default_value = "4s,1s")]
    cost_picket_down_after: std::vec::Vec<Duration>,
    /// Also measure the smallest cost size against real redis-server
    /// processes.
    #[arg(long, global = true)]
    cost_real_redis: bool,
    /// Partition runs per configuration and length.
    #[arg(long, global = true, default_value_t = 3)]
    partition_runs: usize,
    /// Partition lengths.
    #[arg(long, global = true, value_parser = durations, default_value = "5s,20s")]
    partition: std::vec::Vec<Duration>,
    /// `restart`: delays between the kill and the empty restart.
    #[arg(long, global = true, value_parser = durations, default_value = "100ms,400ms,2s")]
    restart_after: std::vec::Vec<Duration>,
    /// `restart`: runs per side and delay.
    #[arg(long, global = true, default_value_t = 10)]
    restart_runs: usize,
    /// `restart`: keys written before the kill.
    #[arg(long, global = true, default_value_t = 20_000)]
    restart_keys: u64,
    /// Rounds of `api` (each case once per side per round, interleaved).
    #[arg(long, global = true, default_value_t = 3)]
    api_rounds: usize,
    /// Slices of each of `api`'s queries-per-second runs, the two sides
    /// alternating slice by slice.
    #[arg(long, global = true, default_value_t = 10)]
    api_slices: usize,
    /// Client counts of `api`'s queries-per-second cases.
    #[arg(long, global = true, value_parser = counts, default_value = "1,50,500")]
    api_clients: std::vec::Vec<usize>,
    /// Connections `api` opens one after another and holds.
    #[arg(long, global = true, default_value_t = 10_000)]
    api_held: usize,
    /// Clients of `api`'s reconnect storm.
    #[arg(long, global = true, default_value_t = 2_000)]
    api_storm: usize,
    /// `+switch-master` subscribers of `api`'s fan-out.
    #[arg(long, global = true, default_value_t = 5_000)]
    api_subscribers: usize,
    /// The cases `api` runs: any of qps, held, storm, fanout.
    #[arg(
        long,
        global = true,
        value_delimiter = ',',
        default_value = "qps,held,storm,fanout"
    )]
    api_cases: Vec<String>,
    /// Run `api` in the machine's network namespace instead of one of its
    /// own (then `ListenOverflows` counts every program's sockets).
    #[arg(long, global = true)]
    api_shared_net: bool,
    /// redis-benchmark binary (the load of `api`'s queries per second).
    #[arg(long, global = true, default_value = "/usr/bin/redis-benchmark")]
    redis_benchmark: PathBuf,
    /// Write every result as JSON here.
    #[arg(long, global = true)]
    json: Option<PathBuf>,
    /// Write the PNG plot of the write timelines here.
    #[arg(long, global = true)]
    plot: Option<PathBuf>,
    /// Working directory (default: a new directory under /tmp).
    #[arg(long, global = true)]
    work: Option<PathBuf>,
    /// Keep the working directory (logs, configs).
    #[arg(long, global = true)]
    keep: bool,
    /// picket binary (default: next to this program).
    #[arg(long, global = true)]
    picket_bin: Option<PathBuf>,
    /// redis-sentinel binary.
    #[arg(long, global = true, default_value = "/usr/bin/redis-sentinel")]
    sentinel_bin: PathBuf,
    /// redis-server binary.
    #[arg(long, global = true, default_value = "/usr/bin/redis-server")]
    redis_bin: PathBuf,
    /// picket's log filter (`RUST_LOG`), e.g. `picket=debug` to see why a
    /// run went as it did (with `--keep`: `run-N-picket/picket-I/log`).
    #[arg(long, global = true, default_value = "info")]
    picket_log: String,
    /// Dragonfly binary: when given, the data servers of `failover`,
    /// `switchover`, `restart` and `api` are Dragonfly processes instead of
    /// `--redis-bin` (Sentinel and picket manage them as they are).
    #[arg(long, global = true)]
    dragonfly_bin: Option<PathBuf>,
    /// The sides measured by `failover` and `restart`, in this order
    /// within each round: any of picket, redis-sentinel.
    #[arg(long, global = true, value_delimiter = ',', value_parser = side, default_value = "picket,redis-sentinel")]
    sides: Vec<Side>,
}

fn side(s: &str) -> Result<Side, String> {
    match s.trim() {
        "picket" => Ok(Side::Picket),
        "redis-sentinel" => Ok(Side::RedisSentinel),
        other => Err(format!("{other}: not a side (picket, redis-sentinel)")),
    }
}

#[derive(Debug, Serialize)]
struct FailoverSet {
    down_after_ms: u64,
    figures: Vec<Compared>,
    runs: Vec<FailoverRun>,
}

#[derive(Debug, Default, Serialize)]
struct Results {
    mode: &'static str,
    settings: serde_json::Value,
    failover: Vec<FailoverSet>,
    switchover: Option<(Vec<Compared>, Vec<SwitchoverRun>)>,
    cost: Vec<CostRow>,
    partition: Vec<partition_runs::PartitionRow>,
    partition_runs: Vec<partition_runs::PartitionRun>,
    restart: Vec<restart::RestartRun>,
    targets: Vec<report::TargetCheck>,
    errors: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Cmd::Targets {
        first,
        count,
        per_group,
        net,
        layout_out,
    }) = &cli.command
    {
        // The stand-in instances get their own process (and runtime), so
        // their CPU is not charged to anyone measured.
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        return match rt.block_on(targets::serve(*first, *count, *per_group, net, layout_out)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("targets: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    // Before any thread exists: the namespace is the calling thread's,
    // and the runtime's threads and every process started inherit it.
    if matches!(cli.command, Some(Cmd::Api))
        && !cli.o.api_shared_net
        && let Err(e) = api::enter_own_netns()
    {
        eprintln!(
            "api: {e}; ListenOverflows will count the whole machine's sockets, not only the benchmark's"
        );
    }
    // reqwest (picket's /v1/status) needs rustls' provider, as in picket.
    picket::tls::install_crypto_provider();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async {
        // On Ctrl-C the benchmark future is dropped, which kills every
        // process it started (their guards kill by PID).
        tokio::select! {
            r = bench(cli) => match r {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("picket-bench: {e:#}");
                    ExitCode::FAILURE
                }
            },
            _ = tokio::signal::ctrl_c() => {
                eprintln!("interrupted");
                ExitCode::from(130)
            }
        }
    })
}

/// The restart table: per delay and side, the share of keys kept (median
/// and lowest) and the runs that kept at least 99 %.
fn print_restart(runs: &[restart::RestartRun], delays: &[Duration]) {
    println!("\n## kill -9 and empty restart of the master (keys on the final master)\n");
    println!(
        "| restart after | side | runs | kept, median | kept, lowest | runs with >= 99 % | failed over |"
    );
    println!("|---|---|---|---|---|---|---|");
    for d in delays {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        for side in [Side::Picket, Side::RedisSentinel] {
            let mut pct: Vec<f64> = runs
                .iter()
                .filter(|r| r.side == side && r.after_ms == ms)
                .map(restart::RestartRun::kept_pct)
                .collect();
            if pct.is_empty() {
                continue;
            }
            pct.sort_by(f64::total_cmp);
            let n = pct.len();
            let failed_over = runs
                .iter()
                .filter(|r| r.side == side && r.after_ms == ms && r.failed_over)
                .count();
            println!(
                "| {d:?} | {} | {n} | {:.1} % | {:.1} % | {} | {failed_over} |",
                side.name(),
                pct[n / 2],
                pct[0],
                pct.iter().filter(|p| **p >= 99.0).count()
            );
        }
    }
}

fn find_picket(o: &Opts) -> anyhow::Result<PathBuf> {
    if let Some(p) = &o.picket_bin {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().context("current_exe")?;
    let p = exe.with_file_name("picket");
    if !p.exists() {
        bail!(
            "{} not found: build it (cargo build --release --workspace --bins) or pass --picket-bin",
            p.display()
        );
    }
    Ok(p)
}

async fn bench(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut o = cli.o;
    let cmd = cli.command.unwrap_or(Cmd::All);
    if let Cmd::Replot { from } = &cmd {
        let Some(path) = &o.plot else {
            bail!("replot needs --plot PATH");
        };
        let sets = sets_from_json(from)?;
        plot_timelines(path, &sets)?;
        return Ok(ExitCode::SUCCESS);
    }
    if o.quick {
        o.runs = 1;
        o.double_runs = 1;
        o.down_after = vec![Duration::from_secs(1)];
        o.switchover_runs = 1;
        o.cost_sizes = vec![100];
        o.cost_window = Duration::from_secs(5);
        o.cost_picket_down_after = vec![Duration::from_secs(4)];
        o.demote_wait = o.demote_wait.min(Duration::from_secs(25));
    }
    let (server, server_bin) = match &o.dragonfly_bin {
        Some(p) => (ServerKind::Dragonfly, p),
        None => (ServerKind::Redis, &o.redis_bin),
    };
    for (what, p) in [
        ("redis-sentinel", &o.sentinel_bin),
        (server.name(), server_bin),
    ] {
        if !p.exists() {
            bail!(
                "{what} not found at {} (Debian: apt-get install redis-server redis-sentinel)",
                p.display()
            );
        }
    }
    let work = match &o.work {
        Some(w) => w.clone(),
        None => std::env::temp_dir().join(format!("picket-bench.{}", std::process::id())),
    };
    std::fs::create_dir_all(&work).with_context(|| work.display().to_string())?;
    let env = Env {
        picket: find_picket(&o)?,
        sentinel: o.sentinel_bin.clone(),
        redis: server_bin.clone(),
        server,
        picket_log: o.picket_log.clone(),
        work: work.clone(),
        failover_timeout: o.failover_timeout,
    };
    eprintln!(
        "picket-bench: picket {}, work dir {}",
        env.picket.display(),
        work.display()
    );
    let mut res = Results {
        mode: if o.quick { "quick" } else { "full" },
        settings: serde_json::json!({
            "interval_ms": o.interval.as_millis() as u64,
            "timeout_ms": o.timeout.as_millis() as u64,
            "failover_timeout_ms": o.failover_timeout.as_millis() as u64,
            "demote_wait_ms": o.demote_wait.as_millis() as u64,
            "restart_after_ms": 1000,
            "quorum": 2,
            "parallel_syncs": 1,
            "picket": env.picket.display().to_string(),
            "redis_sentinel": env.sentinel.display().to_string(),
            "server": env.server,
            "server_bin": env.redis.display().to_string(),
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        }),
        ..Default::default()
    };
    let mut seq = 0usize;
    let mut next_run = || {
        seq += 1;
        seq
    };
    if matches!(cmd, Cmd::Tls) {
        return tls_bench(&env, &o, &work).await;
    }
    if matches!(cmd, Cmd::Restart) {
        for &after in &o.restart_after {
            for i in 0..o.restart_runs {
                for &side in &o.sides {
                    let run = next_run();
                    eprint!(
                        "restart after {after:?} {} run {}/{} ... ",
                        side.name(),
                        i + 1,
                        o.restart_runs
                    );
                    match restart::restart_run(
                        &env,
                        side,
                        Duration::from_secs(1),
                        run,
                        after,
                        o.restart_keys,
                        Duration::from_secs(30),
                    )
                    .await
                    {
                        Ok(r) => {
                            eprintln!(
                                "kept {}/{} ({:.1} %), failed over {}, settled {:?} ms",
                                r.kept,
                                r.keys,
                                r.kept_pct(),
                                r.failed_over,
                                r.settled_ms.map(f64::round)
                            );
                            res.restart.push(r);
                        }
                        Err(e) => {
                            eprintln!("error: {e:#}");
                            res.errors
                                .push(format!("restart {after:?} {}: {e:#}", side.name()));
                        }
                    }
                }
            }
        }
        print_restart(&res.restart, &o.restart_after);
    }
    if matches!(cmd, Cmd::Api) {
        return api_bench(&env, &o, &work).await;
    }
    if matches!(cmd, Cmd::All | Cmd::Failover) {
        for &da in &o.down_after {
            let n = if da == Duration::from_secs(1) {
                o.runs.max(o.double_runs)
            } else {
                o.runs
            };
            let ro = failover_opts(&o, da);
            let mut runs = Vec::new();
            for i in 0..n {
                for &side in &o.sides {
                    let run = next_run();
                    eprint!(
                        "failover down_after {da:?} {} run {}/{n} ... ",
                        side.name(),
                        i + 1
                    );
                    match runs::failover_run(&env, side, &ro, run).await {
                        Ok(r) => {
                            eprintln!(
                                "unavailable {:?} ms, switch {:?} ms, demoted {:?} ms, lost {}, double {}",
                                r.unavailable_ms.map(|v| v.round()),
                                r.switch_seen_ms.map(|v| v.round()),
                                r.demotion_ms.map(|v| v.round()),
                                r.acked_lost,
                                r.double_failover
                            );
                            runs.push(r);
                        }
                        Err(e) => {
                            eprintln!("error: {e:#}");
                            res.errors
                                .push(format!("failover {} run {run}: {e:#}", side.name()));
                        }
                    }
                }
            }
            let figures = report::failover_figures(&runs);
            let t = report::table(
                &format!(
                    "Failover after kill -9 of the master, down_after {} ms ({} runs per side, interleaved)",
                    da.as_millis(),
                    n
                ),
                &figures,
            );
            print!("{t}");
            res.failover.push(FailoverSet {
                down_after_ms: da.as_millis() as u64,
                figures,
                runs,
            });
        }
        if let Some(p) = &o.plot {
            plot_timelines(p, &res.failover)?;
        }
    }

    if matches!(cmd, Cmd::All | Cmd::Switchover) {
        let ro = RunOpts {
            down_after: Duration::from_secs(1),
            warmup: Duration::from_secs(2),
            restart_after: Duration::from_secs(1),
            demote_wait: o.demote_wait,
            settle: Duration::from_secs(1),
            interval: o.interval,
            timeout: o.timeout,
        };
        let mut runs = Vec::new();
        for i in 0..o.switchover_runs {
            for side in [Side::Picket, Side::RedisSentinel] {
                let run = next_run();
                eprint!(
                    "switchover {} run {}/{} ... ",
                    side.name(),
                    i + 1,
                    o.switchover_runs
                );
                match runs::switchover_run(&env, side, &ro, run).await {
                    Ok(r) => {
                        eprintln!(
                            "reply {:?}, lost {}, gap {:?} ms, old demoted {:?} ms",
                            r.reply,
                            r.acked_lost,
                            r.write_gap_ms.map(|v| v.round()),
                            r.old_master_demoted_ms.map(|v| v.round())
                        );
                        runs.push(r);
                    }
                    Err(e) => {
                        eprintln!("error: {e:#}");
                        res.errors
                            .push(format!("switchover {} run {run}: {e:#}", side.name()));
                    }
                }
            }
        }
        let figures = report::switchover_figures(&runs);
        let t = report::table(
            &format!(
                "Planned switchover, master alive (SENTINEL FAILOVER vs PICKET FAILOVER; {} runs per side)",
                o.switchover_runs
            ),
            &figures,
        );
        print!("{t}");
        res.switchover = Some((figures, runs));
    }

    if matches!(cmd, Cmd::All | Cmd::Cost) {
        let co = CostOpts {
            per_group: o.per_group,
            window: o.cost_window,
            warmup: if o.quick {
                Duration::from_secs(2)
            } else {
                Duration::from_secs(10)
            },
            net: "127.78".into(),
        };
        let mut plan: Vec<(Side, usize, Duration, TargetKind)> = Vec::new();
        for &n in &o.cost_sizes {
            if n <= o.cost_sentinel_max {
                plan.push((
                    Side::RedisSentinel,
                    n,
                    o.cost_sentinel_down_after,
                    TargetKind::Fake,
                ));
            }
            for &da in &o.cost_picket_down_after {
                plan.push((Side::Picket, n, da, TargetKind::Fake));
            }
        }
        if o.cost_real_redis
            && let Some(&n) = o.cost_sizes.iter().min()
        {
            plan.push((
                Side::RedisSentinel,
                n,
                o.cost_sentinel_down_after,
                TargetKind::Redis,
            ));
            for &da in &o.cost_picket_down_after {
                plan.push((Side::Picket, n, da, TargetKind::Redis));
            }
        }
        for (side, n, da, kind) in plan {
            eprint!(
                "cost {} {n} instances down_after {da:?} {kind:?} ... ",
                side.name()
            );
            match cost::measure(&env, side, n, da, kind, &co).await {
                Ok(r) => {
                    eprintln!("CPU {:.2}%, RSS {:.1} MiB", r.cpu_pct, r.rss_mib);
                    res.cost.push(r);
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    res.errors.push(format!("cost {} {n}: {e:#}", side.name()));
                }
            }
        }
        let t = report::cost_table(&res.cost);
        print!("{t}");
    }

    let partition_wanted = match cmd {
        Cmd::Partition => true,
        Cmd::All if !o.quick => match partition_runs::check() {
            Ok(()) => true,
            Err(e) => {
                eprintln!("partition scenario skipped: {e:#}");
                false
            }
        },
        _ => false,
    };
    if partition_wanted {
        partition_runs::check()?;
        let po = partition_runs::PartitionOpts {
            down_after: Duration::from_secs(1),
            warmup: Duration::from_secs(2),
            settle_wait: Duration::from_secs(60),
            interval: o.interval,
            timeout: o.timeout,
        };
        for &len in &o.partition {
            for i in 0..o.partition_runs {
                for config in partition_runs::Config::ALL {
                    let run = next_run();
                    eprint!(
                        "partition {len:?} {} run {}/{} ... ",
                        config.name(),
                        i + 1,
                        o.partition_runs
                    );
                    match partition_runs::partition_run(&env, config, len, &po, run).await {
                        Ok(r) => {
                            eprintln!(
                                "lost {} (isolated client {}, other {}), old master acked {} after the cut, the last {:?} ms after it, settled {:?} ms after the heal",
                                r.acked_lost,
                                r.lost_isolated_client,
                                r.lost_other_client,
                                r.old_master_acked_after_cut,
                                r.old_master_last_ack_ms.map(|v| v.round()),
                                r.settled_ms.map(|v| v.round()),
                            );
                            res.partition_runs.push(r);
                        }
                        Err(e) => {
                            eprintln!("error: {e:#}");
                            res.errors
                                .push(format!("partition {} run {run}: {e:#}", config.name()));
                        }
                    }
                }
            }
        }
        res.partition = partition_runs::rows(&res.partition_runs, &o.partition);
        print!("{}", partition_runs::table(&res.partition, o.interval));
    }

    let fo: Vec<(u64, &[FailoverRun])> = res
        .failover
        .iter()
        .map(|s| (s.down_after_ms, s.runs.as_slice()))
        .collect();
    let sw = res
        .switchover
        .as_ref()
        .map_or(&[][..], |(_, r)| r.as_slice());
    res.targets = report::check_targets(&fo, sw, &res.cost);
    print!("{}", report::targets_table(&res.targets));
    if !res.errors.is_empty() {
        println!("\nErrors:");
        for e in &res.errors {
            println!("  {e}");
        }
    }
    if let Some(p) = &o.json {
        std::fs::write(p, serde_json::to_vec_pretty(&res)?)
            .with_context(|| p.display().to_string())?;
    }
    if !o.keep && o.work.is_none() {
        let _ = std::fs::remove_dir_all(&work);
    }
    if o.quick && matches!(cmd, Cmd::All | Cmd::Failover) {
        // CI asserts only that both sides fail over.
        let mut ok = true;
        for side in [Side::Picket, Side::RedisSentinel] {
            let runs: Vec<&FailoverRun> = res
                .failover
                .iter()
                .flat_map(|s| s.runs.iter())
                .filter(|r| r.side == side)
                .collect();
            if runs.is_empty() || runs.iter().any(|r| !r.failed_over) {
                eprintln!("FAILED: {} did not fail over", side.name());
                ok = false;
            }
        }
        if matches!(cmd, Cmd::All | Cmd::Failover) {
            return Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The settings of a kill -9 failover run at `down_after`.
fn failover_opts(o: &Opts, down_after: Duration) -> RunOpts {
    RunOpts {
        down_after,
        warmup: Duration::from_secs(2),
        restart_after: Duration::from_secs(1),
        demote_wait: o.demote_wait,
        settle: Duration::from_secs(5),
        interval: o.interval,
        timeout: o.timeout,
    }
}

/// `picket-bench tls`: kill -9 failovers at the first `--down-after`,
/// `--runs` per side, picket and picket-tls interleaved, and the
/// difference of their write unavailability.
async fn tls_bench(env: &Env, o: &Opts, work: &std::path::Path) -> anyhow::Result<ExitCode> {
    let da = o
        .down_after
        .first()
        .copied()
        .unwrap_or(Duration::from_secs(1));
    let ro = failover_opts(o, da);
    let mut runs = Vec::new();
    let mut errors = Vec::new();
    let mut run = 0;
    for i in 0..o.runs {
        for side in [Side::Picket, Side::PicketTls] {
            run += 1;
            eprint!(
                "tls failover down_after {da:?} {} run {}/{} ... ",
                side.name(),
                i + 1,
                o.runs
            );
            match runs::failover_run(env, side, &ro, run).await {
                Ok(r) => {
                    eprintln!(
                        "unavailable {:?} ms, switch {:?} ms, lost {}",
                        r.unavailable_ms.map(|v| v.round()),
                        r.switch_seen_ms.map(|v| v.round()),
                        r.acked_lost
                    );
                    runs.push(r);
                }
                Err(e) => {
                    eprintln!("error: {e:#}");
                    errors.push(format!("{} run {run}: {e:#}", side.name()));
                }
            }
        }
    }
    let (table, gap_delta) = report::tls_table(da, &runs);
    print!("{table}");
    for e in &errors {
        println!("  error: {e}");
    }
    if let Some(p) = &o.json {
        let out = serde_json::json!({
            "mode": if o.quick { "quick" } else { "full" },
            "down_after_ms": da.as_millis() as u64,
            "unavailable_median_delta_ms": gap_delta,
            "runs": runs,
            "errors": errors,
        });
        std::fs::write(p, serde_json::to_vec_pretty(&out)?)
            .with_context(|| p.display().to_string())?;
    }
    if !o.keep && o.work.is_none() {
        let _ = std::fs::remove_dir_all(work);
    }
    let all_failed_over = [Side::Picket, Side::PicketTls].iter().all(|s| {
        let mine: Vec<&FailoverRun> = runs.iter().filter(|r| r.side == *s).collect();
        !mine.is_empty() && mine.iter().all(|r| r.failed_over)
    });
    Ok(if all_failed_over {
        ExitCode::SUCCESS
    } else {
        eprintln!("FAILED: a side did not fail over");
        ExitCode::FAILURE
    })
}

/// `picket-bench api`: every case of [`api::run`], the table of medians
/// and ratios, the samples as JSON with `--json`.
async fn api_bench(env: &Env, o: &Opts, work: &std::path::Path) -> anyhow::Result<ExitCode> {
    let mut ao = api::ApiOpts {
        rounds: o.api_rounds.max(1),
        clients: o.api_clients.clone(),
        pipeline: 16,
        requests: 100_000,
        pipelined_requests: 1_000_000,
        slices: o.api_slices.max(1),
        held: o.api_held,
        storm: o.api_storm,
        subscribers: o.api_subscribers,
        redis_benchmark: o.redis_benchmark.clone(),
        cases: o.api_cases.clone(),
    };
    if o.quick {
        ao.rounds = 1;
        ao.requests = 10_000;
        ao.pipelined_requests = 50_000;
        ao.slices = ao.slices.min(2);
        ao.held = ao.held.min(1_000);
        ao.storm = ao.storm.min(200);
        ao.subscribers = ao.subscribers.min(200);
    }
    let samples = api::run(env, &ao, work).await?;
    print!("{}", api::table(&samples, ao.rounds));
    if let Some(p) = &o.json {
        let out = serde_json::json!({
            "mode": if o.quick { "quick" } else { "full" },
            "rounds": ao.rounds,
            "samples": samples,
        });
        std::fs::write(p, serde_json::to_vec_pretty(&out)?)
            .with_context(|| p.display().to_string())?;
    }
    if !o.keep && o.work.is_none() {
        let _ = std::fs::remove_dir_all(work);
    }
    Ok(ExitCode::SUCCESS)
}

/// The failover runs of an earlier `--json` file, with only what the plot
/// needs.
fn sets_from_json(path: &std::path::Path) -> anyhow::Result<Vec<FailoverSet>> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).with_context(|| path.display().to_string())?)?;
    let kinds = [
        "ok",
        "refused",
        "readonly",
        "loading",
        "timeout",
        "closed",
        "error",
        "unresolved",
    ];
    let mut sets = Vec::new();
    for set in v["failover"].as_array().into_iter().flatten() {
        let mut runs = Vec::new();
        for r in set["runs"].as_array().into_iter().flatten() {
            let side = match r["side"].as_str() {
                Some("picket") => Side::Picket,
                _ => Side::RedisSentinel,
            };
            let timeline = r["timeline"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| runs::Point {
                    t_ms: p["t_ms"].as_f64().unwrap_or(0.0),
                    outcome: kinds
                        .iter()
                        .find(|k| Some(**k) == p["outcome"].as_str())
                        .copied()
                        .unwrap_or("other"),
                })
                .collect();
            let mut run: FailoverRun = runs::FailoverRun::empty(side);
            run.unavailable_ms = r["unavailable_ms"].as_f64();
            run.timeline = timeline;
            runs.push(run);
        }
        sets.push(FailoverSet {
            down_after_ms: set["down_after_ms"].as_u64().unwrap_or(0),
            figures: Vec::new(),
            runs,
        });
    }
    Ok(sets)
}

/// Plot the run of each side whose unavailability is the median one, at
/// the smallest down_after.
fn plot_timelines(path: &std::path::Path, sets: &[FailoverSet]) -> anyhow::Result<()> {
    let Some(set) = sets.iter().min_by_key(|s| s.down_after_ms) else {
        return Ok(());
    };
    let median_run = |side: Side| {
        let mut v: Vec<&FailoverRun> = set
            .runs
            .iter()
            .filter(|r| r.side == side && r.unavailable_ms.is_some())
            .collect();
        v.sort_by(|a, b| {
            a.unavailable_ms
                .unwrap_or(0.0)
                .total_cmp(&b.unavailable_ms.unwrap_or(0.0))
        });
        v.get(v.len() / 2).copied()
    };
    let mut series = Vec::new();
    for (side, color) in [
        (Side::Picket, plot::PICKET),
        (Side::RedisSentinel, plot::SENTINEL),
    ] {
        if let Some(r) = median_run(side) {
            series.push(plot::Series {
                label: format!(
                    "{} (unavailable {:.0} ms)",
                    side.name(),
                    r.unavailable_ms.unwrap_or(0.0)
                ),
                short: match side {
                    Side::Picket => "picket".into(),
                    Side::PicketTls => "picket-tls".into(),
                    Side::RedisSentinel => "sentinel".into(),
                },
                color,
                points: &r.timeline,
            });
        }
    }
    if series.is_empty() {
        return Ok(());
    }
    let title = format!(
        "Writes every 10 ms, kill -9 of the master, down_after {} ms",
        set.down_after_ms
    );
    plot::draw(path, &title, set.down_after_ms as f64, &series)
}

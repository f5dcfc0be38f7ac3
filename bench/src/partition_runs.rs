//! The partition scenario (Jepsen-style, as in the 2013 test of Redis
//! Sentinel): the master and one writing client on one side; the three
//! managers, both replicas and a second writing client on the other. Both
//! clients resolve the master through the managers and write a numbered key
//! every interval; the isolated one keeps the connection it has, as real
//! clients do, and can reach nothing but the master. After the partition
//! heals and the topology has settled, the acknowledged writes missing from
//! the final master are counted.
//!
//! The partition is made of iptables rules of the benchmark's own
//! ([`crate::partition::Partition`]): everything to and from the master's
//! `ip:port` is dropped except the isolated client's, which leaves from an
//! address of its own (127.77.R.9) and cannot reach the managers.

use std::net::IpAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use picket_bench::client::WriterSummary;
use picket_bench::partition::Partition;
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, Env, Extras, GROUP, Side, missing_keys, role};
use crate::procs::{info_field, master_of, opts, wait_until};
use crate::report::{Stat, stat};
use crate::runs::{acked_seqs, ms, start_writer, wait_writing};

/// The four configurations compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Config {
    /// redis-sentinel with its defaults (and the benchmark's timings).
    SentinelDefaults,
    /// redis-sentinel, every server with `min-replicas-to-write 1` and
    /// `min-replicas-max-lag 10` (the advice of Sentinel's documentation).
    SentinelMinReplicas,
    /// picket without isolation fencing.
    Picket,
    /// picket with `[group.isolation_fencing]` (`min_replicas = 1`,
    /// `max_lag = "1s"`).
    PicketFenced,
}

impl Config {
    /// All four, in table order.
    pub const ALL: [Config; 4] = [
        Config::SentinelDefaults,
        Config::SentinelMinReplicas,
        Config::Picket,
        Config::PicketFenced,
    ];

    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Config::SentinelDefaults => "redis-sentinel, defaults",
            Config::SentinelMinReplicas => "redis-sentinel, min-replicas-to-write 1, max-lag 10",
            Config::Picket => "picket, no isolation fencing",
            Config::PicketFenced => "picket, isolation fencing (max_lag 1s)",
        }
    }

    fn side(self) -> Side {
        match self {
            Config::SentinelDefaults | Config::SentinelMinReplicas => Side::RedisSentinel,
            Config::Picket | Config::PicketFenced => Side::Picket,
        }
    }

    fn extras(self) -> Extras {
        match self {
            Config::SentinelMinReplicas => Extras {
                redis_args: [
                    "--min-replicas-to-write",
                    "1",
                    "--min-replicas-max-lag",
                    "10",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                ..Extras::default()
            },
            Config::PicketFenced => Extras {
                picket_group: "\n[group.isolation_fencing]\nmin_replicas = 1\nmax_lag = \"1s\"\n"
                    .into(),
                ..Extras::default()
            },
            _ => Extras::default(),
        }
    }
}

/// Settings of the partition runs.
#[derive(Debug, Clone)]
pub struct PartitionOpts {
    /// down-after (both managers).
    pub down_after: Duration,
    /// Writing before the partition.
    pub warmup: Duration,
    /// How long the topology may take to settle after the heal.
    pub settle_wait: Duration,
    /// Time between two writes of each client.
    pub interval: Duration,
    /// Per-operation timeout of the clients.
    pub timeout: Duration,
}

/// One partition run.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionRun {
    /// What managed the topology.
    pub config: Config,
    /// Run number.
    pub run: usize,
    /// How long the partition lasted, in milliseconds.
    pub partition_ms: u64,
    /// The managers published a new master during the partition.
    pub failed_over: bool,
    /// The isolated master.
    pub old_master: String,
    /// The master after the heal.
    pub final_master: Option<String>,
    /// The topology settled (one master, both others its linked replicas)
    /// after the heal, and how long that took.
    pub settled_ms: Option<f64>,
    /// Writes acknowledged, both clients.
    pub acked: u64,
    /// Acknowledged writes missing from the final master, both clients.
    pub acked_lost: u64,
    /// Of those, the isolated client's.
    pub lost_isolated_client: u64,
    /// Of those, the other client's.
    pub lost_other_client: u64,
    /// Writes the old master acknowledged after the cut.
    pub old_master_acked_after_cut: u64,
    /// Cut to the old master's last acknowledged write, in milliseconds.
    pub old_master_last_ack_ms: Option<f64>,
    /// Cut to the isolated client's first refused write.
    pub first_refusal_ms: Option<f64>,
    /// The clients' summaries (isolated, other).
    pub writers: Vec<WriterSummary>,
}

/// Whether the partition scenario can run here (root, iptables).
pub fn check() -> anyhow::Result<()> {
    let p = Partition::new()
        .map_err(|e| anyhow::anyhow!("the partition scenario needs root and iptables: {e}"))?;
    drop(p);
    Ok(())
}

/// The managers agree on one master, which is a master, and both other
/// servers are its replicas with their links up.
async fn settled(c: &Cluster) -> Option<String> {
    let mut agreed: Option<String> = None;
    for a in &c.api {
        let mut conn = picket::resp::Connection::connect(a, &opts(Duration::from_millis(300)))
            .await
            .ok()?;
        let m = master_of(&mut conn, GROUP).await?;
        if agreed.as_ref().is_some_and(|x| *x != m) {
            return None;
        }
        agreed = Some(m);
    }
    let m = agreed?;
    if role(&m).await.as_deref() != Some("master") {
        return None;
    }
    let (mh, mp) = m.rsplit_once(':')?;
    for r in c.addrs.iter().filter(|a| **a != m) {
        let link = info_field(r, "replication", "master_link_status").await;
        let host = info_field(r, "replication", "master_host").await;
        let port = info_field(r, "replication", "master_port").await;
        if link.as_deref() != Some("up")
            || host.as_deref() != Some(mh)
            || port.as_deref() != Some(mp)
        {
            return None;
        }
    }
    Some(m)
}

/// Partition the master with one client for `length`, heal, settle, count.
pub async fn partition_run(
    env: &Env,
    config: Config,
    length: Duration,
    o: &PartitionOpts,
    run: usize,
) -> anyhow::Result<PartitionRun> {
    let c = Cluster::start_with(env, config.side(), o.down_after, run, &config.extras()).await?;
    let old = c.addrs[0].clone();
    if config == Config::PicketFenced {
        wait_until(
            "picket to fence the master",
            Duration::from_secs(20),
            Duration::from_millis(50),
            || {
                let old = old.clone();
                async move {
                    info_field(&old, "replication", "min_slaves_good_slaves")
                        .await
                        .is_some()
                }
            },
        )
        .await?;
    }
    let r = run % 250 + 1;
    let source: IpAddr = format!("127.77.{r}.9").parse().context("client address")?;
    let stop = CancellationToken::new();
    let prefix_a = format!("bench:{run}:isolated");
    let prefix_b = format!("bench:{run}:other");
    let timing = (o.interval, o.timeout);
    let writer_a = start_writer(&c.api, &c.access, &prefix_a, Some(source), timing, &stop);
    let writer_b = start_writer(&c.api, &c.access, &prefix_b, None, timing, &stop);
    for p in [&prefix_a, &prefix_b] {
        wait_writing(&old, p, 20).await?;
    }
    tokio::time::sleep(o.warmup).await;

    let master: std::net::SocketAddr = old.parse().context("master address")?;
    let managers: Vec<std::net::SocketAddr> = c
        .api
        .iter()
        .map(|a| a.parse())
        .collect::<Result<_, _>>()
        .context("manager addresses")?;
    let part = Partition::new().map_err(|e| anyhow::anyhow!(e))?;
    part.isolate(master, &[source], &managers)
        .map_err(|e| anyhow::anyhow!(e))?;
    let cut = Instant::now();
    let switch = crate::watch::first_change(&c.api, &c.access, &old, length).await;
    tokio::time::sleep_until(cut + length).await;
    part.heal().map_err(|e| anyhow::anyhow!(e))?;
    let healed = Instant::now();
    let deadline = healed + o.settle_wait;
    let mut final_master = None;
    while Instant::now() < deadline {
        if let Some(m) = settled(&c).await {
            final_master = Some(m);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let settled_ms = final_master.as_ref().map(|_| ms(healed.elapsed()));
    // One more second of writes on the settled topology.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let (sum_a, ops_a) = writer_a.await?;
    let (sum_b, ops_b) = writer_b.await?;
    drop(part);

    let (lost_a, lost_b) = match &final_master {
        Some(m) => (
            missing_keys(m, &prefix_a, &acked_seqs(&ops_a)).await?.len() as u64,
            missing_keys(m, &prefix_b, &acked_seqs(&ops_b)).await?.len() as u64,
        ),
        None => bail!(
            "the topology did not settle within {:?} of the heal\n{}",
            o.settle_wait,
            c.managers
                .iter()
                .map(|m| format!("{}:\n{}", m.name, m.log_tail(20)))
                .collect::<Vec<_>>()
                .join("\n")
        ),
    };
    let by_old_after_cut: Vec<Instant> = ops_a
        .iter()
        .chain(ops_b.iter())
        .filter(|op| op.is_ok() && op.at > cut && op.master.as_deref() == Some(old.as_str()))
        .map(|op| op.at)
        .collect();
    let first_refusal_ms = ops_a
        .iter()
        .find(|op| op.at > cut && op.outcome == "error")
        .map(|op| ms(op.at - cut));
    Ok(PartitionRun {
        config,
        run,
        partition_ms: length.as_millis() as u64,
        failed_over: switch.is_some(),
        old_master: old,
        final_master,
        settled_ms,
        acked: sum_a.acked + sum_b.acked,
        acked_lost: lost_a + lost_b,
        lost_isolated_client: lost_a,
        lost_other_client: lost_b,
        old_master_acked_after_cut: by_old_after_cut.len() as u64,
        old_master_last_ack_ms: by_old_after_cut.iter().max().map(|t| ms(*t - cut)),
        first_refusal_ms,
        writers: vec![sum_a, sum_b],
    })
}

/// The figures of one configuration at one partition length.
#[derive(Debug, Clone, Serialize)]
pub struct PartitionRow {
    /// The configuration.
    pub config: Config,
    /// Partition length, in milliseconds.
    pub partition_ms: u64,
    /// Runs counted.
    pub runs: usize,
    /// Runs that failed over during the partition.
    pub failed_over: usize,
    /// Acknowledged writes lost.
    pub lost: Option<Stat>,
    /// Cut to the old master's last acknowledged write, in seconds.
    pub last_ack_s: Option<Stat>,
    /// Heal to settled, in seconds.
    pub settled_s: Option<Stat>,
    /// The other client's longest gap between two acknowledged writes (the
    /// failover's unavailability), in seconds.
    pub other_gap_s: Option<Stat>,
}

/// One row per configuration and length, in table order.
pub fn rows(runs: &[PartitionRun], lengths: &[Duration]) -> Vec<PartitionRow> {
    let mut out = Vec::new();
    for &len in lengths {
        for config in Config::ALL {
            let rs: Vec<&PartitionRun> = runs
                .iter()
                .filter(|r| r.config == config && r.partition_ms == len.as_millis() as u64)
                .collect();
            if rs.is_empty() {
                continue;
            }
            let f = |g: &dyn Fn(&PartitionRun) -> Option<f64>| {
                stat(&rs.iter().filter_map(|r| g(r)).collect::<Vec<_>>())
            };
            out.push(PartitionRow {
                config,
                partition_ms: len.as_millis() as u64,
                runs: rs.len(),
                failed_over: rs.iter().filter(|r| r.failed_over).count(),
                lost: f(&|r| Some(r.acked_lost as f64)),
                last_ack_s: f(&|r| r.old_master_last_ack_ms.map(|v| v / 1000.0)),
                settled_s: f(&|r| r.settled_ms.map(|v| v / 1000.0)),
                other_gap_s: f(&|r| r.writers.get(1).map(|w| w.max_gap_ms as f64 / 1000.0)),
            });
        }
    }
    out
}

fn cell(s: &Option<Stat>, decimals: usize) -> String {
    match s {
        None => "-".into(),
        Some(s) if s.min == s.max => format!("{:.*}", decimals, s.median),
        Some(s) => format!(
            "{:.*} [{:.*}-{:.*}]",
            decimals, s.median, decimals, s.min, decimals, s.max
        ),
    }
}

/// The table printed on stdout (and pasted into docs/benchmarks.md).
pub fn table(rows: &[PartitionRow], interval: Duration) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nPartition of the master with one client (two clients, a write every {} ms each; median [min-max])",
        interval.as_millis()
    );
    let _ = writeln!(
        t,
        "| configuration | partition | runs (failed over) | acknowledged writes lost | old master's last ack after the cut (s) | heal to settled (s) | other client's longest write gap (s) |"
    );
    let _ = writeln!(t, "|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            t,
            "| {} | {} s | {} ({}) | {} | {} | {} | {} |",
            r.config.name(),
            r.partition_ms / 1000,
            r.runs,
            r.failed_over,
            cell(&r.lost, 0),
            cell(&r.last_ack_s, 1),
            cell(&r.settled_s, 1),
            cell(&r.other_gap_s, 1),
        );
    }
    t
}

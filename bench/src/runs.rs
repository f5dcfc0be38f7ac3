//! The two timed scenarios: an unplanned failover (kill -9 of the master)
//! and a planned switchover with the master alive, each under a client
//! that writes every few milliseconds through the Sentinel API.

use std::collections::BTreeMap;
use std::time::Duration;

use picket_bench::client::{WriteOp, WriterConfig, WriterSummary, run_writer};
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, Env, GROUP, Side, missing_keys, role};
use crate::procs::{Access, info_value, master_of, opts};
use crate::watch::{Seen, Watch, first_change};

/// Settings of the timed runs.
#[derive(Debug, Clone)]
pub struct RunOpts {
    /// down-after (both sides).
    pub down_after: Duration,
    /// Writing before the kill (or the switchover).
    pub warmup: Duration,
    /// Delay between the failover being visible and restarting the old master.
    pub restart_after: Duration,
    /// How long to wait for the old master's demotion.
    pub demote_wait: Duration,
    /// Minimum observation after the failover (double failovers).
    pub settle: Duration,
    /// Time between two writes.
    pub interval: Duration,
    /// Per-operation timeout of the writer.
    pub timeout: Duration,
}

/// One write of the client, relative to the kill (or the switchover).
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// Milliseconds since the event (negative: before).
    pub t_ms: f64,
    /// `ok` or the error kind.
    pub outcome: &'static str,
}

/// One unplanned failover.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverRun {
    /// Who managed the topology.
    pub side: Side,
    /// Run number (interleaving order).
    pub run: usize,
    /// down-after in milliseconds.
    pub down_after_ms: u64,
    /// A new master was published.
    pub failed_over: bool,
    /// The killed master.
    pub old_master: String,
    /// The first new master published.
    pub new_master: Option<String>,
    /// Last acknowledged write before the kill to the first acknowledged
    /// write (on another server) after it.
    pub unavailable_ms: Option<f64>,
    /// Kill to the first `get-master-addr-by-name` change on any manager.
    pub switch_seen_ms: Option<f64>,
    /// Kill to the first `+switch-master` message on any manager.
    pub switch_event_ms: Option<f64>,
    /// Whether every manager accepted `SUBSCRIBE +switch-master`.
    pub switch_event_supported: bool,
    /// Failed operations after the kill, by kind.
    pub errors: BTreeMap<&'static str, u64>,
    /// Writes acknowledged during the run.
    pub acked: u64,
    /// Acknowledged writes missing on the final master.
    pub acked_lost: u64,
    /// Restarted old master: first answer to `role:slave`.
    pub demotion_ms: Option<f64>,
    /// The restarted old master answered at all.
    pub old_master_answered: bool,
    /// Most master changes seen by one manager's poller.
    pub master_changes: usize,
    /// Most `+switch-master` messages seen on one manager.
    pub switch_events: usize,
    /// Final config epoch per manager.
    pub config_epochs: Vec<Option<u64>>,
    /// More than one failover happened.
    pub double_failover: bool,
    /// The writer's summary.
    pub writer: WriterSummary,
    /// The client's operations from 1 s before the kill to the end.
    pub timeline: Vec<Point>,
}

impl FailoverRun {
    /// A run with nothing measured (to be filled in, e.g. from JSON).
    pub fn empty(side: Side) -> FailoverRun {
        FailoverRun {
            side,
            run: 0,
            down_after_ms: 0,
            failed_over: false,
            old_master: String::new(),
            new_master: None,
            unavailable_ms: None,
            switch_seen_ms: None,
            switch_event_ms: None,
            switch_event_supported: false,
            errors: BTreeMap::new(),
            acked: 0,
            acked_lost: 0,
            demotion_ms: None,
            old_master_answered: false,
            master_changes: 0,
            switch_events: 0,
            config_epochs: Vec::new(),
            double_failover: false,
            writer: WriterSummary::default(),
            timeline: Vec::new(),
        }
    }
}

/// One planned switchover.
#[derive(Debug, Clone, Serialize)]
pub struct SwitchoverRun {
    /// Who managed the topology.
    pub side: Side,
    /// Run number.
    pub run: usize,
    /// The command's reply (`OK` or the error).
    pub reply: String,
    /// How long the command took to answer.
    pub reply_ms: f64,
    /// A new master was published.
    pub switched: bool,
    /// Command to the first `get-master-addr-by-name` change.
    pub switch_seen_ms: Option<f64>,
    /// Command to the old master reporting `role:slave`.
    pub old_master_demoted_ms: Option<f64>,
    /// Longest gap between two acknowledged writes from the command on.
    pub write_gap_ms: Option<f64>,
    /// Failed operations after the command, by kind.
    pub errors: BTreeMap<&'static str, u64>,
    /// Writes acknowledged during the run.
    pub acked: u64,
    /// Acknowledged writes missing on the final master.
    pub acked_lost: u64,
    /// Acknowledged by the old master after the new one was published.
    pub acked_by_old_after_switch: u64,
}

/// A running writer: its summary and every operation, once stopped.
pub type WriterTask = JoinHandle<(WriterSummary, Vec<WriteOp>)>;

/// Start a writing client through the managers at `api` (reached with
/// `access`), writing `PREFIX:SEQ` every `interval` (from `source` when
/// given) until `stop`.
pub fn start_writer(
    api: &[String],
    access: &Access,
    prefix: &str,
    source: Option<std::net::IpAddr>,
    (interval, timeout): (Duration, Duration),
    stop: &CancellationToken,
) -> WriterTask {
    let cfg = WriterConfig {
        sentinels: api.to_vec(),
        group: GROUP.to_string(),
        interval,
        timeout,
        prefix: prefix.to_string(),
        source,
        sentinel_tls: access.tls.clone(),
        sentinel_password: access.password.clone(),
    };
    let stop = stop.clone();
    tokio::spawn(async move {
        let mut ops = Vec::new();
        let sum = run_writer(&cfg, stop.cancelled_owned(), |op| ops.push(op.clone())).await;
        (sum, ops)
    })
}

/// Milliseconds, as the reports give them.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn since(t: Instant, from: Instant) -> f64 {
    if t >= from {
        ms(t - from)
    } else {
        -ms(from - t)
    }
}

/// Errors by kind among `ops` after `from`.
fn errors_after(ops: &[WriteOp], from: Instant) -> BTreeMap<&'static str, u64> {
    let mut m = BTreeMap::new();
    for op in ops.iter().filter(|o| o.at > from && !o.is_ok()) {
        *m.entry(op.outcome).or_default() += 1;
    }
    m
}

/// The sequence numbers of the acknowledged writes.
pub fn acked_seqs(ops: &[WriteOp]) -> Vec<u64> {
    ops.iter()
        .filter(|o| o.is_ok())
        .filter_map(|o| o.seq)
        .collect()
}

/// Double failover signals: a manager saw the master change more than once,
/// or published `+switch-master` more than once.
fn changes_and_events(seen: &Seen, from: Instant) -> (usize, usize) {
    let changes = seen
        .changes
        .iter()
        .map(|c| c.iter().filter(|(t, _)| *t > from).count())
        .max()
        .unwrap_or(0);
    let events = seen
        .switch_events
        .iter()
        .map(|e| e.iter().filter(|(t, _)| *t > from).count())
        .max()
        .unwrap_or(0);
    (changes, events)
}

/// Wait until the writer has had `n` acknowledged writes... as seen by the
/// server: the key `PREFIX:n` exists on `master`.
pub async fn wait_writing(master: &str, prefix: &str, n: u64) -> anyhow::Result<()> {
    let key = format!("{prefix}:{n}");
    crate::procs::wait_until(
        "the writer to write",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || {
            let key = key.clone();
            async move {
                matches!(
                    crate::procs::cmd(master, &["EXISTS", &key], Duration::from_millis(500)).await,
                    Ok(redis_protocol::resp2::types::BytesFrame::Integer(1))
                )
            }
        },
    )
    .await
}

/// Kill the master, let the managers fail over, restart the old master and
/// time its demotion.
pub async fn failover_run(
    env: &Env,
    side: Side,
    o: &RunOpts,
    run: usize,
) -> anyhow::Result<FailoverRun> {
    let mut c = Cluster::start(env, side, o.down_after, run).await?;
    let old = c.addrs[0].clone();
    let watch = Watch::start(&c.api, &c.access, Duration::from_millis(10)).await;
    let stop = CancellationToken::new();
    let prefix = format!("bench:{run}");
    let writer = start_writer(
        &c.api,
        &c.access,
        &prefix,
        None,
        (o.interval, o.timeout),
        &stop,
    );
    wait_writing(&old, &prefix, 20).await?;
    tokio::time::sleep(o.warmup).await;

    let kill_at = Instant::now();
    c.redis[0].kill9();
    let switch = first_change(
        &c.api,
        &c.access,
        &old,
        o.down_after + Duration::from_secs(60),
    )
    .await;

    let mut demotion_ms = None;
    let mut answered = false;
    if let Some((switch_at, _)) = &switch {
        tokio::time::sleep_until(*switch_at + o.restart_after).await;
        c.redis[0].restart()?;
        // Time from its first answer to `role:slave`.
        let deadline = Instant::now() + o.demote_wait;
        let mut first_answer: Option<Instant> = None;
        let mut conn = None;
        while Instant::now() < deadline {
            if conn.is_none() {
                conn = picket::resp::Connection::connect(&old, &opts(Duration::from_millis(200)))
                    .await
                    .ok();
            }
            if let Some(cn) = conn.as_mut() {
                match cn.call_text(["INFO", "replication"]).await {
                    Ok(text) => {
                        let now = Instant::now();
                        let first = *first_answer.get_or_insert(now);
                        if info_value(&text, "role").as_deref() == Some("slave") {
                            demotion_ms = Some(ms(now - first));
                            break;
                        }
                    }
                    Err(_) => conn = None,
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        answered = first_answer.is_some();
        let settle_until = (*switch_at + o.settle).max(Instant::now() + Duration::from_secs(1));
        tokio::time::sleep_until(settle_until).await;
    }
    stop.cancel();
    let (summary, ops) = writer.await?;
    let seen = watch.stop().await;

    let last_before = ops
        .iter()
        .rev()
        .find(|op| op.is_ok() && op.at <= kill_at)
        .map(|op| op.at);
    let first_after = ops
        .iter()
        .find(|op| op.is_ok() && op.at > kill_at && op.master.as_deref() != Some(old.as_str()))
        .map(|op| op.at);
    let unavailable_ms = match (last_before, first_after) {
        (Some(a), Some(b)) => Some(ms(b - a)),
        _ => None,
    };
    let switch_event_ms = seen
        .switch_events
        .iter()
        .flat_map(|e| e.iter().map(|(t, _)| *t))
        .filter(|t| *t > kill_at)
        .min()
        .map(|t| ms(t - kill_at));
    let (master_changes, switch_events) = changes_and_events(&seen, kill_at);
    let distinct_new: std::collections::BTreeSet<&String> =
        summary.masters.iter().filter(|m| **m != old).collect();
    let double_failover = master_changes > 1 || switch_events > 1 || distinct_new.len() > 1;

    let mut acked_lost = 0;
    if let Ok(mut conn) =
        picket::resp::Connection::connect(&c.api[0], &c.access.opts(Duration::from_secs(1))).await
        && let Some(final_master) = master_of(&mut conn, GROUP).await
    {
        acked_lost = missing_keys(&final_master, &prefix, &acked_seqs(&ops))
            .await?
            .len() as u64;
    }
    let config_epochs = c.config_epochs().await;
    let timeline = ops
        .iter()
        .filter(|op| op.at + Duration::from_secs(1) >= kill_at)
        .map(|op| Point {
            t_ms: since(op.at, kill_at),
            outcome: op.outcome,
        })
        .collect();
    Ok(FailoverRun {
        side,
        run,
        down_after_ms: o.down_after.as_millis() as u64,
        failed_over: switch.is_some(),
        old_master: old,
        new_master: switch.as_ref().map(|(_, m)| m.clone()),
        unavailable_ms,
        switch_seen_ms: switch.as_ref().map(|(t, _)| ms(*t - kill_at)),
        switch_event_ms,
        switch_event_supported: seen.subscribe_supported,
        errors: errors_after(&ops, kill_at),
        acked: summary.acked,
        acked_lost,
        demotion_ms,
        old_master_answered: answered,
        master_changes,
        switch_events,
        config_epochs,
        double_failover,
        writer: summary,
        timeline,
    })
}

/// A planned switchover under the writer.
pub async fn switchover_run(
    env: &Env,
    side: Side,
    o: &RunOpts,
    run: usize,
) -> anyhow::Result<SwitchoverRun> {
    let c = Cluster::start(env, side, o.down_after, run).await?;
    let old = c.addrs[0].clone();
    let stop = CancellationToken::new();
    let prefix = format!("bench:{run}");
    let writer = start_writer(
        &c.api,
        &c.access,
        &prefix,
        None,
        (o.interval, o.timeout),
        &stop,
    );
    wait_writing(&old, &prefix, 20).await?;
    tokio::time::sleep(o.warmup).await;

    let t0 = Instant::now();
    let reply = c.switchover().await;
    let reply_ms = ms(t0.elapsed());
    let reply = match reply {
        Ok(f) => picket::resp::frame_text(&f).unwrap_or_else(|| format!("{f:?}")),
        Err(e) => format!("error: {e}"),
    };
    let switch = first_change(&c.api, &c.access, &old, Duration::from_secs(30)).await;
    let mut demoted = None;
    if switch.is_some() {
        let deadline = t0 + o.demote_wait;
        while Instant::now() < deadline {
            if role(&old).await.as_deref() == Some("slave") {
                demoted = Some(ms(t0.elapsed()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let (summary, ops) = writer.await?;

    let acks: Vec<Instant> = ops.iter().filter(|op| op.is_ok()).map(|op| op.at).collect();
    let start = acks.iter().rposition(|a| *a <= t0).unwrap_or(0);
    let write_gap_ms = acks[start..]
        .windows(2)
        .map(|w| ms(w[1] - w[0]))
        .fold(None, |m: Option<f64>, g| Some(m.map_or(g, |m| m.max(g))));
    let acked_by_old_after_switch = match &switch {
        Some((at, _)) => ops
            .iter()
            .filter(|op| op.is_ok() && op.at > *at && op.master.as_deref() == Some(old.as_str()))
            .count() as u64,
        None => 0,
    };
    let mut acked_lost = 0;
    if let Ok(mut conn) =
        picket::resp::Connection::connect(&c.api[0], &c.access.opts(Duration::from_secs(1))).await
        && let Some(final_master) = master_of(&mut conn, GROUP).await
    {
        acked_lost = missing_keys(&final_master, &prefix, &acked_seqs(&ops))
            .await?
            .len() as u64;
    }
    Ok(SwitchoverRun {
        side,
        run,
        reply,
        reply_ms,
        switched: switch.is_some(),
        switch_seen_ms: switch.as_ref().map(|(t, _)| ms(*t - t0)),
        old_master_demoted_ms: demoted,
        write_gap_ms,
        errors: errors_after(&ops, t0),
        acked: summary.acked,
        acked_lost,
        acked_by_old_after_switch,
    })
}

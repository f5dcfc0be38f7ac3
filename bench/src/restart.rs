//! The master killed with `kill -9` and started again, empty, at the same
//! address a moment later (a supervisor's restart after a crash or an OOM
//! kill): how many of the keys written before the kill the group's final
//! master still holds, under redis-sentinel and under picket.
//!
//! The servers replicate disk-based (`repl-diskless-sync no`): a replica
//! that reconnects to the empty master takes its copy in milliseconds, the
//! worst case (Redis 7's diskless default waits 5 s before a transfer).

use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::cluster::{Cluster, Env, Extras, Side};
use crate::procs::{Access, cmd, info_value, master_of, opts};

/// One kill and empty restart.
#[derive(Debug, Clone, Serialize)]
pub struct RestartRun {
    /// Who managed the topology.
    pub side: Side,
    /// Run number.
    pub run: usize,
    /// Kill to the restart, milliseconds.
    pub after_ms: u64,
    /// Keys written (and replicated) before the kill.
    pub keys: u64,
    /// The master every manager named once the group settled.
    pub final_master: Option<String>,
    /// The group was failed over (the final master is not the killed one).
    pub failed_over: bool,
    /// Keys on the final master.
    pub kept: u64,
    /// Kill to the settled group, milliseconds.
    pub settled_ms: Option<f64>,
}

impl RestartRun {
    /// The share of the keys kept, in percent.
    pub fn kept_pct(&self) -> f64 {
        if self.keys == 0 {
            return 100.0;
        }
        100.0 * self.kept as f64 / self.keys as f64
    }
}

/// Write `keys` keys to `master` in batches of 1,000 (`MSET`).
async fn fill(master: &str, keys: u64) -> anyhow::Result<()> {
    let mut c = picket::resp::Connection::connect(master, &opts(Duration::from_secs(5))).await?;
    let mut i = 0;
    while i < keys {
        let end = (i + 1000).min(keys);
        let mut args = vec!["MSET".to_string()];
        for k in i..end {
            args.push(format!("key:{k}"));
            args.push("value".into());
        }
        c.call(args.iter().map(String::as_str)).await?;
        i = end;
    }
    Ok(())
}

async fn dbsize(addr: &str) -> Option<u64> {
    match cmd(addr, &["DBSIZE"], Duration::from_millis(500)).await {
        Ok(redis_protocol::resp2::types::BytesFrame::Integer(n)) => u64::try_from(n).ok(),
        _ => None,
    }
}

async fn replication(addr: &str) -> Option<String> {
    let reply = cmd(addr, &["INFO", "replication"], Duration::from_millis(500))
        .await
        .ok()?;
    picket::resp::frame_text(&reply)
}

/// Whether the group is settled on `master`: it reports `role:master`
/// and every other server is its replica with the link up and no sync
/// under way.
async fn settled_on(c: &Cluster, master: &str) -> bool {
    let Some(m) = replication(master).await else {
        return false;
    };
    if info_value(&m, "role").as_deref() != Some("master") {
        return false;
    }
    for a in c.addrs.iter().filter(|a| *a != master) {
        let Some(r) = replication(a).await else {
            return false;
        };
        let (host, port) = master.rsplit_once(':').unwrap_or((master, ""));
        if info_value(&r, "role").as_deref() != Some("slave")
            || info_value(&r, "master_host").as_deref() != Some(host)
            || info_value(&r, "master_port").as_deref() != Some(port)
            || info_value(&r, "master_link_status").as_deref() != Some("up")
            || info_value(&r, "master_sync_in_progress").as_deref() != Some("0")
        {
            return false;
        }
    }
    true
}

/// The master every manager names now (None if they disagree or one
/// cannot be read).
async fn agreed_master(c: &Cluster, access: &Access) -> Option<String> {
    let mut seen = None;
    for api in &c.api {
        let mut conn =
            picket::resp::Connection::connect(api, &access.opts(Duration::from_millis(500)))
                .await
                .ok()?;
        let m = master_of(&mut conn, crate::cluster::GROUP).await?;
        match &seen {
            None => seen = Some(m),
            Some(s) if *s == m => {}
            Some(_) => return None,
        }
    }
    seen
}

/// How long after the managers started the master is killed at the
/// earliest: past picket's start-up grace for stray masters (4 s).
const STARTUP_GRACE: Duration = Duration::from_millis(4_500);

/// One run: start the topology under `side`, write `keys` keys, kill the
/// master, start it again empty `after` later, and wait (at most `within`)
/// until the managers agree on a master that every other server follows.
pub async fn restart_run(
    env: &Env,
    side: Side,
    down_after: Duration,
    run: usize,
    after: Duration,
    keys: u64,
    within: Duration,
) -> anyhow::Result<RestartRun> {
    let extras = Extras {
        redis_args: vec!["--repl-diskless-sync".into(), "no".into()],
        ..Extras::default()
    };
    let mut c = Cluster::start_with(env, side, down_after, run, &extras).await?;
    let managers_up = Instant::now();
    let old = c.addrs[0].clone();
    fill(&old, keys).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    for r in &c.addrs[1..] {
        while dbsize(r).await != Some(keys) {
            anyhow::ensure!(Instant::now() < deadline, "{r} did not get the keys");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Both managers read the replicas at least every 10 s; picket reads
    // them again when the master's connection drops, Sentinel every second
    // once the master is down. Give both a read of the filled replicas.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // A picket daemon leaves a stray master alone for its first 4 s
    // (`PROMOTED_GRACE`: its peers' configs may still be on the way), so a
    // kill sooner after the start measured that grace in "settled" (the
    // restarted old master demoted at start + 4 s), not what a running
    // group does. Sentinel waits the same.
    tokio::time::sleep_until(managers_up + STARTUP_GRACE).await;
    c.redis[0].kill9();
    let killed = Instant::now();
    tokio::time::sleep(after).await;
    c.redis[0].restart()?;
    let access = c.access.clone();
    let mut final_master = None;
    let mut settled_ms = None;
    // Past the replicas' own resync from the empty server, if it comes.
    let quiet = Instant::now() + Duration::from_secs(3);
    while killed.elapsed() < within {
        if let Some(m) = agreed_master(&c, &access).await
            && settled_on(&c, &m).await
        {
            final_master = Some(m);
            settled_ms.get_or_insert(killed.elapsed().as_secs_f64() * 1000.0);
            if Instant::now() >= quiet {
                break;
            }
        } else {
            settled_ms = None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let kept = match &final_master {
        Some(m) => dbsize(m).await.unwrap_or(0),
        None => 0,
    };
    Ok(RestartRun {
        side,
        run,
        after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
        keys,
        failed_over: final_master.as_ref().is_some_and(|m| *m != old),
        final_master,
        kept,
        settled_ms,
    })
}

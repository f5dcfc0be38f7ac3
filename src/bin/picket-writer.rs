//! A client that behaves like an application behind Sentinel: it resolves
//! the master with `SENTINEL get-master-addr-by-name`, writes a numbered key
//! every interval, and on any error re-resolves and reconnects. It reports
//! the acknowledged writes, errors by kind and the longest gap between two
//! acknowledged writes (the write-unavailability window). Used by the demo,
//! the tests and the benchmark; works against picket and redis-sentinel.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use picket::resp::{ClientOptions, Connection, RespError, ServerError, frame_text};
use tokio::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "picket-writer",
    about = "Write through a Sentinel-resolved master and measure unavailability"
)]
struct Args {
    /// Sentinel-compatible address (repeatable), e.g. 127.0.0.1:26379.
    #[arg(long = "sentinel", required = true)]
    sentinels: Vec<String>,
    /// Group (master name).
    #[arg(long, default_value = "cache")]
    group: String,
    /// Time between writes.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10ms")]
    interval: Duration,
    /// Per-operation timeout.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "200ms")]
    timeout: Duration,
    /// Stop after this long (default: until SIGINT/SIGTERM).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Key prefix.
    #[arg(long, default_value = "picket-writer")]
    prefix: String,
    /// Write every acknowledged sequence number to this file (one per line).
    #[arg(long)]
    acked_file: Option<PathBuf>,
    /// Write a JSON summary to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a timeline (unix-ms,ok|error-kind per operation) to this CSV file.
    #[arg(long)]
    timeline: Option<PathBuf>,
    /// Print a line for each error.
    #[arg(long)]
    verbose: bool,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn kind(e: &RespError) -> &'static str {
    match e {
        RespError::Server(ServerError::ReadOnly(_)) => "readonly",
        RespError::Server(ServerError::Loading(_)) => "loading",
        RespError::Timeout(_) => "timeout",
        RespError::Connect { source, .. }
            if source.kind() == std::io::ErrorKind::ConnectionRefused =>
        {
            "refused"
        }
        RespError::Closed | RespError::Io(_) => "closed",
        RespError::Server(_) => "error",
        _ => "other",
    }
}

async fn resolve(args: &Args, opts: &ClientOptions) -> Option<String> {
    for s in &args.sentinels {
        let Ok(mut c) = Connection::connect(s, opts).await else {
            continue;
        };
        if let Ok(redis_protocol::resp2::types::BytesFrame::Array(v)) = c
            .call(["SENTINEL", "get-master-addr-by-name", args.group.as_str()])
            .await
            && let (Some(h), Some(p)) = (
                v.first().and_then(frame_text),
                v.get(1).and_then(frame_text),
            )
        {
            return Some(format!("{h}:{p}"));
        }
    }
    None
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let opts = ClientOptions {
        connect_timeout: args.timeout,
        command_timeout: args.timeout,
        ..Default::default()
    };
    let stop = async {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut t), Ok(mut i)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return std::future::pending().await;
        };
        tokio::select! { _ = t.recv() => {}, _ = i.recv() => {} }
    };
    tokio::pin!(stop);
    let end = args.duration.map(|d| Instant::now() + d);
    let mut acked_out = args
        .acked_file
        .as_ref()
        .and_then(|p| std::fs::File::create(p).ok())
        .map(std::io::BufWriter::new);
    let mut timeline = args
        .timeline
        .as_ref()
        .and_then(|p| std::fs::File::create(p).ok())
        .map(std::io::BufWriter::new);
    let mut conn: Option<Connection> = None;
    let mut master: Option<String> = None;
    let mut errors: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut seq: u64 = 0;
    let mut acked: u64 = 0;
    let mut last_ack: Option<u64> = None;
    let (mut gap_ms, mut gap_from, mut gap_to) = (0u64, 0u64, 0u64);
    let mut masters_seen: Vec<String> = Vec::new();
    let mut tick = tokio::time::interval(args.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {}
        }
        if end.is_some_and(|e| Instant::now() >= e) {
            break;
        }
        if conn.is_none() {
            master = resolve(&args, &opts).await;
            if let Some(m) = &master {
                if masters_seen.last() != Some(m) {
                    masters_seen.push(m.clone());
                }
                match Connection::connect(m, &opts).await {
                    Ok(c) => conn = Some(c),
                    Err(e) => {
                        *errors.entry(kind(&e)).or_default() += 1;
                        if let Some(t) = timeline.as_mut() {
                            let _ = writeln!(t, "{},{}", unix_ms(), kind(&e));
                        }
                        continue;
                    }
                }
            } else {
                *errors.entry("unresolved").or_default() += 1;
                continue;
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        seq += 1;
        let key = format!("{}:{seq}", args.prefix);
        match c.call(["SET", key.as_str(), &seq.to_string()]).await {
            Ok(_) => {
                let now = unix_ms();
                acked += 1;
                if let Some(prev) = last_ack
                    && now - prev > gap_ms
                {
                    gap_ms = now - prev;
                    gap_from = prev;
                    gap_to = now;
                }
                last_ack = Some(now);
                if let Some(f) = acked_out.as_mut() {
                    let _ = writeln!(f, "{seq}");
                }
                if let Some(t) = timeline.as_mut() {
                    let _ = writeln!(t, "{now},ok");
                }
            }
            Err(e) => {
                let k = kind(&e);
                if args.verbose {
                    eprintln!("{} write {seq} to {:?}: {e}", unix_ms(), master);
                }
                *errors.entry(k).or_default() += 1;
                if let Some(t) = timeline.as_mut() {
                    let _ = writeln!(t, "{},{k}", unix_ms());
                }
                conn = None;
            }
        }
    }
    if let Some(mut f) = acked_out {
        let _ = f.flush();
    }
    if let Some(mut t) = timeline {
        let _ = t.flush();
    }
    let total_errors: u64 = errors.values().sum();
    let summary = serde_json::json!({
        "writes": seq,
        "acked": acked,
        "errors": errors,
        "errors_total": total_errors,
        "max_gap_ms": gap_ms,
        "max_gap_from_unix_ms": gap_from,
        "max_gap_to_unix_ms": gap_to,
        "masters": masters_seen,
    });
    println!(
        "writes {seq}, acknowledged {acked}, errors {total_errors} {:?}, longest gap between acknowledged writes {gap_ms} ms, masters {:?}",
        errors, masters_seen
    );
    if let Some(p) = &args.json
        && let Err(e) = std::fs::write(p, summary.to_string())
    {
        eprintln!("cannot write {}: {e}", p.display());
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}

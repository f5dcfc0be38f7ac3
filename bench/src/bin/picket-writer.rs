//! A client that behaves like an application behind Sentinel: it resolves
//! the master with `SENTINEL get-master-addr-by-name`, writes a numbered key
//! every interval, and on any error re-resolves and reconnects. It reports
//! the acknowledged writes, errors by kind and the longest gap between two
//! acknowledged writes (the write-unavailability window). Used by the demo
//! and the tests; works against picket and redis-sentinel. The loop itself
//! is `picket_bench::client`, shared with `picket-bench`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use picket_bench::client::{WriterConfig, run_writer};

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
    /// Local address every connection leaves from (e.g. to be singled out
    /// by a partition's rules).
    #[arg(long)]
    source: Option<std::net::IpAddr>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let cfg = WriterConfig {
        sentinels: args.sentinels.clone(),
        group: args.group.clone(),
        interval: args.interval,
        timeout: args.timeout,
        prefix: args.prefix.clone(),
        source: args.source,
        sentinel_tls: None,
        sentinel_password: None,
    };
    let duration = args.duration;
    let stop = async move {
        use tokio::signal::unix::{SignalKind, signal};
        let until = async {
            match duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let (Ok(mut t), Ok(mut i)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return until.await;
        };
        tokio::select! { _ = t.recv() => {}, _ = i.recv() => {}, _ = until => {} }
    };
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
    let verbose = args.verbose;
    let sum = run_writer(&cfg, stop, |op| {
        if op.is_ok()
            && let (Some(f), Some(seq)) = (acked_out.as_mut(), op.seq)
        {
            let _ = writeln!(f, "{seq}");
        }
        if verbose && !op.is_ok() {
            eprintln!(
                "{} {} (seq {:?}) via {:?}",
                op.unix_ms, op.outcome, op.seq, op.master
            );
        }
        // Unresolved attempts never reached a server: the timeline lists
        // what the servers answered, as it always has.
        if op.outcome != "unresolved"
            && let Some(t) = timeline.as_mut()
        {
            let _ = writeln!(t, "{},{}", op.unix_ms, op.outcome);
        }
    })
    .await;
    if let Some(mut f) = acked_out {
        let _ = f.flush();
    }
    if let Some(mut t) = timeline {
        let _ = t.flush();
    }
    let total_errors = sum.errors_total();
    let summary = serde_json::json!({
        "writes": sum.writes,
        "acked": sum.acked,
        "errors": sum.errors,
        "errors_total": total_errors,
        "max_gap_ms": sum.max_gap_ms,
        "max_gap_from_unix_ms": sum.max_gap_from_unix_ms,
        "max_gap_to_unix_ms": sum.max_gap_to_unix_ms,
        "masters": sum.masters,
    });
    println!(
        "writes {}, acknowledged {}, errors {total_errors} {:?}, longest gap between acknowledged writes {} ms, masters {:?}",
        sum.writes, sum.acked, sum.errors, sum.max_gap_ms, sum.masters
    );
    if let Some(p) = &args.json
        && let Err(e) = std::fs::write(p, summary.to_string())
    {
        eprintln!("cannot write {}: {e}", p.display());
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}

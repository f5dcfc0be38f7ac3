//! A client that behaves like an application behind Sentinel, shared by
//! `picket-writer` and `picket-bench`: it resolves the master with
//! `SENTINEL get-master-addr-by-name`, writes a numbered key every interval,
//! and on any error drops its connection and re-resolves before the next
//! write. It works against picket and redis-sentinel alike.
//!
//! Every operation is reported to a callback as a [`WriteOp`], so a caller
//! can stream a timeline to a file (the writer) or keep it in memory and
//! line it up with other events (the benchmark).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis_protocol::resp2::types::BytesFrame;
use serde::Serialize;
use tokio::time::Instant;

use picket::resp::client::TlsClient;
use picket::resp::{ClientOptions, Connection, RespError, ServerError, frame_text};

/// What the writing client does.
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Sentinel-compatible addresses, asked in order.
    pub sentinels: Vec<String>,
    /// Group (master name).
    pub group: String,
    /// Time between two writes.
    pub interval: Duration,
    /// Per-operation timeout (connect, resolve and each write).
    pub timeout: Duration,
    /// Key prefix: keys are `PREFIX:SEQ`.
    pub prefix: String,
    /// The local address every connection leaves from (default: the
    /// system's choice), so that a partition can tell this client apart.
    pub source: Option<IpAddr>,
    /// TLS towards the Sentinel-compatible servers (picket with
    /// `[daemon.tls]`; the data servers stay plaintext).
    pub sentinel_tls: Option<TlsClient>,
    /// `AUTH <password>` on the Sentinel-compatible servers.
    pub sentinel_password: Option<String>,
}

/// One operation of the writer: a write, or a failed attempt to get a
/// connection to write on.
#[derive(Debug, Clone, Serialize)]
pub struct WriteOp {
    /// When the outcome was known (monotonic clock).
    #[serde(skip)]
    pub at: Instant,
    /// The same moment, wall clock (milliseconds since the Unix epoch).
    pub unix_ms: u64,
    /// The sequence number written, when a write was sent.
    pub seq: Option<u64>,
    /// `ok`, or the error kind (see [`error_kind`]).
    pub outcome: &'static str,
    /// The master the client was using, when it had resolved one.
    pub master: Option<String>,
}

impl WriteOp {
    /// Whether the write was acknowledged.
    pub fn is_ok(&self) -> bool {
        self.outcome == "ok"
    }
}

/// What a writer did, in total.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WriterSummary {
    /// Writes sent.
    pub writes: u64,
    /// Writes acknowledged.
    pub acked: u64,
    /// Failed operations by kind.
    pub errors: BTreeMap<&'static str, u64>,
    /// Longest gap between two acknowledged writes, in milliseconds.
    pub max_gap_ms: u64,
    /// Wall-clock start of that gap (ms since the Unix epoch).
    pub max_gap_from_unix_ms: u64,
    /// Wall-clock end of that gap.
    pub max_gap_to_unix_ms: u64,
    /// Every master the client resolved, in order, without repeats in a row.
    pub masters: Vec<String>,
}

impl WriterSummary {
    /// All failed operations.
    pub fn errors_total(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The kind of a failed operation, as the benchmark counts them:
/// `refused`, `readonly`, `loading`, `timeout`, `closed`, `error` (another
/// error reply) or `other`.
pub fn error_kind(e: &RespError) -> &'static str {
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

/// Connect to `addr`, from `source` when given.
pub async fn connect(
    addr: &str,
    source: Option<IpAddr>,
    opts: &ClientOptions,
) -> Result<Connection, RespError> {
    match source {
        Some(ip) => Connection::connect_from(addr, ip, opts).await,
        None => Connection::connect(addr, opts).await,
    }
}

/// Ask the Sentinel-compatible servers, in order, for the master of
/// `group`; the first usable answer wins.
pub async fn resolve_master(
    sentinels: &[String],
    group: &str,
    source: Option<IpAddr>,
    opts: &ClientOptions,
) -> Option<String> {
    for s in sentinels {
        let Ok(mut c) = connect(s, source, opts).await else {
            continue;
        };
        if let Ok(BytesFrame::Array(v)) =
            c.call(["SENTINEL", "get-master-addr-by-name", group]).await
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

/// Write until `stop` completes, calling `on_op` after every operation.
pub async fn run_writer<S, F>(cfg: &WriterConfig, stop: S, mut on_op: F) -> WriterSummary
where
    S: Future<Output = ()>,
    F: FnMut(&WriteOp),
{
    let opts = ClientOptions {
        connect_timeout: cfg.timeout,
        command_timeout: cfg.timeout,
        ..Default::default()
    };
    let sentinel_opts = ClientOptions {
        tls: cfg.sentinel_tls.clone(),
        password: cfg.sentinel_password.clone(),
        ..opts.clone()
    };
    tokio::pin!(stop);
    let mut sum = WriterSummary::default();
    let mut conn: Option<Connection> = None;
    let mut master: Option<String> = None;
    let mut last_ack: Option<(Instant, u64)> = None;
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut report = |sum: &mut WriterSummary,
                      seq: Option<u64>,
                      outcome: &'static str,
                      master: &Option<String>| {
        let op = WriteOp {
            at: Instant::now(),
            unix_ms: unix_ms(),
            seq,
            outcome,
            master: master.clone(),
        };
        if outcome != "ok" {
            *sum.errors.entry(outcome).or_default() += 1;
        }
        on_op(&op);
        op
    };
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {}
        }
        if conn.is_none() {
            master = resolve_master(&cfg.sentinels, &cfg.group, cfg.source, &sentinel_opts).await;
            let Some(m) = &master else {
                report(&mut sum, None, "unresolved", &master);
                continue;
            };
            if sum.masters.last() != Some(m) {
                sum.masters.push(m.clone());
            }
            match connect(m, cfg.source, &opts).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    report(&mut sum, None, error_kind(&e), &master);
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        sum.writes += 1;
        let seq = sum.writes;
        let key = format!("{}:{seq}", cfg.prefix);
        match c.call(["SET", key.as_str(), &seq.to_string()]).await {
            Ok(_) => {
                let op = report(&mut sum, Some(seq), "ok", &master);
                sum.acked += 1;
                if let Some((prev_at, prev_unix)) = last_ack {
                    let gap = op.at.saturating_duration_since(prev_at).as_millis() as u64;
                    if gap > sum.max_gap_ms {
                        sum.max_gap_ms = gap;
                        sum.max_gap_from_unix_ms = prev_unix;
                        sum.max_gap_to_unix_ms = op.unix_ms;
                    }
                }
                last_ack = Some((op.at, op.unix_ms));
            }
            Err(e) => {
                report(&mut sum, Some(seq), error_kind(&e), &master);
                conn = None;
            }
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds() {
        let refused = RespError::Connect {
            addr: "x".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert_eq!(error_kind(&refused), "refused");
        let reset = RespError::Connect {
            addr: "x".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        };
        assert_eq!(error_kind(&reset), "other");
        assert_eq!(
            error_kind(&RespError::Server(ServerError::ReadOnly("READONLY".into()))),
            "readonly"
        );
        assert_eq!(
            error_kind(&RespError::Server(ServerError::Loading("LOADING".into()))),
            "loading"
        );
        assert_eq!(
            error_kind(&RespError::Timeout(Duration::from_millis(1))),
            "timeout"
        );
        assert_eq!(error_kind(&RespError::Closed), "closed");
        assert_eq!(
            error_kind(&RespError::Server(ServerError::Other("ERR x".into()))),
            "error"
        );
    }

    /// Nothing answers on the sentinel address: every tick is one
    /// `unresolved` operation and nothing is written.
    #[tokio::test]
    async fn unresolved_when_no_sentinel_answers() {
        // Bind then drop a listener to get an address nobody listens on.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let cfg = WriterConfig {
            sentinels: vec![addr],
            group: "cache".into(),
            interval: Duration::from_millis(5),
            timeout: Duration::from_millis(100),
            prefix: "t".into(),
            source: None,
            sentinel_tls: None,
            sentinel_password: None,
        };
        let mut ops = Vec::new();
        let sum = run_writer(&cfg, tokio::time::sleep(Duration::from_millis(100)), |op| {
            ops.push(op.clone())
        })
        .await;
        assert_eq!(sum.writes, 0);
        assert_eq!(sum.acked, 0);
        assert!(!ops.is_empty());
        assert!(
            ops.iter()
                .all(|o| o.outcome == "unresolved" && o.seq.is_none())
        );
        assert_eq!(
            sum.errors.get("unresolved").copied(),
            Some(ops.len() as u64)
        );
    }
}

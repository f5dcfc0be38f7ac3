//! Probing of data servers: one task per instance.
//!
//! A probe owns its connection, sends `PING` every `ping_period` and `INFO`
//! every `info_period` (or at once when the group asks), and reports what
//! it saw to the group's decision task. It decides nothing itself.

pub mod hold;
pub mod info;
pub mod reboot;
pub(crate) mod sdown;

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::addr::Addr;
use crate::metrics as m;
use crate::resp::{ClientOptions, Connection, RespError, ServerError};
use info::ServerFields;
pub use info::{Flavour, InfoSnapshot, Role};

/// What a probe reports.
#[derive(Debug, Clone)]
pub enum ProbeEvent {
    /// A PING round trip ended (or failed).
    Ping {
        /// The instance.
        addr: Addr,
        /// When the reply (or the failure) was seen.
        at: Instant,
        /// `PONG`, `-LOADING` or `-MASTERDOWN`.
        valid: bool,
        /// Round-trip time when there was a reply.
        latency: Option<Duration>,
        /// What went wrong, when not valid.
        error: Option<String>,
        /// The reply was `-BUSY` (a script or function runs too long).
        busy: bool,
    },
    /// A parsed INFO reply.
    Info {
        /// The instance.
        addr: Addr,
        /// When it arrived.
        at: Instant,
        /// The parsed reply.
        info: Box<InfoSnapshot>,
        /// The IP the connection reached: what the instance's name resolved
        /// to, so that the addresses servers report are matched to it.
        ip: Option<IpAddr>,
    },
    /// Reconnected to the group's master after losing it, the probe held
    /// full copies from it (see [`hold`]) before reading its INFO.
    SyncHeld {
        /// The instance.
        addr: Addr,
        /// When the hold was put on.
        at: Instant,
        /// What to set back when the group releases it; None: nothing
        /// (another daemon's hold was found).
        restore: Option<Vec<(String, String)>>,
    },
    /// Connecting failed (or the connection broke).
    Unreachable {
        /// The instance.
        addr: Addr,
        /// When.
        at: Instant,
        /// Why (connection refused, timeout, WRONGPASS, ...).
        error: String,
        /// What kind of failure it was, for SDOWN.
        cause: Failure,
    },
}

/// What a failed connection tells of the server's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The connection was refused: nothing listens on the port of a host
    /// that answers (the process is gone).
    Refused,
    /// The server closed the connection (EOF or reset): the process may
    /// have died, or closed this one client.
    Closed,
    /// Anything else (a timeout, TLS, AUTH, a protocol error).
    Other,
}

impl Failure {
    /// The kind of `e`.
    pub fn of(e: &RespError) -> Failure {
        use std::io::ErrorKind;
        match e {
            RespError::Connect { source, .. } if source.kind() == ErrorKind::ConnectionRefused => {
                Failure::Refused
            }
            RespError::Closed => Failure::Closed,
            RespError::Io(io)
                if matches!(
                    io.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::BrokenPipe | ErrorKind::UnexpectedEof
                ) =>
            {
                Failure::Closed
            }
            _ => Failure::Other,
        }
    }
}

impl ProbeEvent {
    /// The instance the event is about.
    pub fn addr(&self) -> &Addr {
        match self {
            ProbeEvent::Ping { addr, .. }
            | ProbeEvent::Info { addr, .. }
            | ProbeEvent::SyncHeld { addr, .. }
            | ProbeEvent::Unreachable { addr, .. } => addr,
        }
    }
}

/// Settings of one probe.
#[derive(Debug, Clone)]
pub struct ProbeSettings {
    /// Group name, as a metric label (shared by the instance's series).
    pub group: metrics::SharedString,
    /// The instance.
    pub addr: Addr,
    /// The instance's `server` metric label (shared by its series).
    pub server: metrics::SharedString,
    /// PING cadence.
    pub ping_period: Duration,
    /// INFO cadence at the start ([`ProbeHandle::set_info_period`] changes it).
    pub info_period: Duration,
    /// How long a PING may stay unanswered before the connection is
    /// considered stuck and re-established.
    pub ping_timeout: Duration,
    /// Connection settings (auth, TLS, timeouts).
    pub client: ClientOptions,
    /// After the server closed a connection or refused one: reconnect at
    /// once, then every `reconnect_fast` for `reconnect_fast_for`, instead
    /// of at the PING period (a dead process is confirmed within
    /// `down_after_refused`, and a restarted one is seen at once).
    pub reconnect_fast: Duration,
    /// See `reconnect_fast`.
    pub reconnect_fast_for: Duration,
}

/// What the group tells a running probe: INFO now, and how often.
#[derive(Debug)]
struct Control {
    /// Wakes the probe when one of the fields changed.
    wake: Notify,
    /// An INFO is wanted as soon as possible.
    info_asap: AtomicBool,
    /// The INFO period, in milliseconds.
    info_period_ms: AtomicU64,
    /// How often (milliseconds) the INFO must be a full one; between
    /// those `INFO replication` will do. 0: every INFO is full.
    full_info_every_ms: AtomicU64,
    /// When the last valid reply arrived ([`stamp`]; 0: none yet). A valid
    /// PING that finds the instance as the group last heard of it is
    /// only written here: the group reads it when it runs, instead of
    /// being woken for each of a thousand PINGs a second.
    last_valid: AtomicU64,
    /// How long a hold put on at a reconnect lasts, in milliseconds (0:
    /// no hold; see [`hold`]): set by the group for its master.
    sync_hold_ms: AtomicU64,
    /// Where this probe's less frequent reads fall in their period.
    phase: Phase,
}

impl Control {
    fn info_period(&self) -> Duration {
        Duration::from_millis(self.info_period_ms.load(Ordering::Relaxed))
    }
}

/// The origin of the probes' clocks: their wake-up grid and their reply
/// stamps count from it.
fn origin() -> std::time::Instant {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// `t` as nanoseconds after [`origin`], plus one (0 means "never").
fn stamp(t: Instant) -> u64 {
    let ns = t.into_std().saturating_duration_since(origin()).as_nanos();
    u64::try_from(ns).unwrap_or(u64::MAX - 1) + 1
}

/// The instant of a [`stamp`].
fn unstamp(v: u64) -> Option<Instant> {
    let ns = v.checked_sub(1)?;
    origin()
        .checked_add(Duration::from_nanos(ns))
        .map(Instant::from_std)
}

/// Control handle of a running probe; dropping it stops the probe.
#[derive(Debug)]
pub struct ProbeHandle {
    task: AbortHandle,
    control: Arc<Control>,
}

impl ProbeHandle {
    /// Ask for an INFO as soon as possible (e.g. during a failover).
    pub fn refresh_info(&self) {
        self.control.info_asap.store(true, Ordering::Relaxed);
        self.control.wake.notify_one();
    }

    /// Read INFO every `period` from now on (counted from the last INFO:
    /// a shorter period takes effect at once).
    pub fn set_info_period(&self, period: Duration) {
        let ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX).max(1);
        if self.control.info_period_ms.swap(ms, Ordering::Relaxed) != ms {
            self.control.wake.notify_one();
        }
    }

    /// Between full INFO reads at most `every` apart, read only the
    /// replication section (None: every INFO is full). For a healthy
    /// master read every second: the rest of a reply (four fifths of
    /// Redis' 5 KB) tells picket nothing new between failovers.
    pub fn set_full_info_every(&self, every: Option<Duration>) {
        let ms = every.map_or(0, |d| {
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
        });
        self.control.full_info_every_ms.store(ms, Ordering::Relaxed);
    }

    /// On reconnecting after losing the instance, hold full copies from
    /// it for `hold` before anything else (None: do not). The group sets
    /// it for its master (Redis, Valkey), so that a replica reconnecting
    /// to a master restarted empty waits for the verdict instead of
    /// copying nothing.
    pub fn set_sync_hold(&self, hold: Option<Duration>) {
        let ms = hold.map_or(0, |d| {
            u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
        });
        self.control.sync_hold_ms.store(ms, Ordering::Relaxed);
    }

    /// When the instance last gave a valid reply, as the probe saw it
    /// (newer than the last [`ProbeEvent::Ping`] when later PINGs found
    /// nothing new to report).
    pub fn last_valid(&self) -> Option<Instant> {
        unstamp(self.control.last_valid.load(Ordering::Relaxed))
    }

    /// Stop the probe.
    pub fn stop(&self) {
        self.task.abort();
    }
}

impl Drop for ProbeHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Start a probe task; it reports on `tx` until `stop`, or until the
/// handle is dropped (with the group that owns it).
///
/// Reports are boxed: a channel keeps blocks of 32 slots as large as its
/// message, and with one channel per group at 10,000 instances unboxed
/// reports held about 30 MiB of blocks; boxed, a report costs an
/// allocation, and most PINGs send none.
///
/// The task is aborted rather than told through a cancellation token: a
/// token's future is polled (and its lock taken) at every wake-up of the
/// probe, a measurable share of the CPU with thousands of instances.
pub fn spawn(settings: ProbeSettings, tx: mpsc::Sender<Box<ProbeEvent>>) -> ProbeHandle {
    m::register_instance(&settings.group, &settings.server);
    let control = Arc::new(Control {
        wake: Notify::new(),
        info_asap: AtomicBool::new(false),
        info_period_ms: AtomicU64::new(0),
        full_info_every_ms: AtomicU64::new(0),
        last_valid: AtomicU64::new(0),
        sync_hold_ms: AtomicU64::new(0),
        phase: Phase::of(&settings.server),
    });
    origin();
    let period = settings.info_period;
    // Boxed: an async fn keeps its arguments and the locals they are moved
    // into side by side, so the settings were stored twice in every probe.
    let task = tokio::spawn(run(Box::new(settings), tx, control.clone())).abort_handle();
    let handle = ProbeHandle { task, control };
    handle.set_info_period(period);
    handle
}

async fn run(s: Box<ProbeSettings>, tx: mpsc::Sender<Box<ProbeEvent>>, ctl: Arc<Control>) {
    // Looked up once: a lookup allocates both labels and searches the
    // registry, and with thousands of instances every PING paid for it.
    let duration = metrics::histogram!(m::PROBE_DURATION, "group" => s.group.clone(), m::SERVER_LABEL => s.server.clone());
    let grain = grain(s.ping_period);
    let mut conn: Option<Connection> = None;
    let mut next_ping = Instant::now();
    // When INFO was last asked for (None: at once).
    let mut last_info: Option<Instant> = None;
    // The last full INFO on this connection: when, what only it tells,
    // and the full-read period (ms) its phase was taken in.
    let mut full: Option<(Instant, ServerFields, u64)> = None;
    // The INFO period this probe has taken its phase in (None: not yet,
    // on this connection).
    let mut phased_for: Option<Duration> = None;
    // One timer and one wake-up registration, kept across the idle waits
    // (re-created each time, they were registered and freed at every
    // PING).
    let sleep = tokio::time::sleep_until(next_ping);
    tokio::pin!(sleep);
    let woken = ctl.wake.notified();
    tokio::pin!(woken);
    // Whether the group's last news of this instance was a valid reply on
    // the current connection: then a valid PING is only stamped.
    let mut reported_ok = false;
    // When the server last closed or refused a connection: reconnects are
    // quick for a while after it.
    let mut dropped_at: Option<Instant> = None;
    // Connection attempts are never closer than `reconnect_fast`: a server
    // that accepts and closes at once (at `maxclients`) is not hammered.
    let mut last_attempt: Option<Instant> = None;
    // The instance was lost (a connection broke or could not be made)
    // since the last connection: the next one may reach a new process.
    let mut lost = false;
    // A hold the server refused was reported once, not at every reconnect.
    let mut hold_warned = false;
    loop {
        if conn.is_none() {
            if let Some(t) = last_attempt {
                let next = t + s.reconnect_fast;
                if next > Instant::now() {
                    sleep.as_mut().reset(next);
                    (&mut sleep).await;
                }
            }
            last_attempt = Some(Instant::now());
            // Boxed: the connect future (TCP, TLS, AUTH) is large, and
            // inline it made every probe's task that large for its life.
            match Box::pin(Connection::connect(&s.server, &s.client)).await {
                Ok(mut c) => {
                    let hold_ms = ctl.sync_hold_ms.load(Ordering::Relaxed);
                    if std::mem::take(&mut lost)
                        && hold_ms > 0
                        && !Box::pin(hold_on_return(
                            &s,
                            &mut c,
                            Duration::from_millis(hold_ms),
                            &tx,
                            &mut hold_warned,
                        ))
                        .await
                    {
                        return;
                    }
                    conn = Some(c);
                    reported_ok = false;
                    // A (re)connected instance is read at once: a returning
                    // old master must be seen, and demoted, without delay.
                    last_info = None;
                    full = None;
                    phased_for = None;
                    next_ping = Instant::now();
                }
                Err(e) => {
                    lost = true;
                    metrics::counter!(m::PROBE_ERRORS, "group" => s.group.clone(), m::SERVER_LABEL => s.server.clone(), "kind" => e.metric_label()).increment(1);
                    let cause = Failure::of(&e);
                    let now = Instant::now();
                    if cause == Failure::Refused {
                        dropped_at.get_or_insert(now);
                    }
                    let ev = ProbeEvent::Unreachable {
                        addr: s.addr.clone(),
                        at: now,
                        error: e.to_string(),
                        cause,
                    };
                    if tx.send(Box::new(ev)).await.is_err() {
                        return;
                    }
                    let quick = dropped_at
                        .is_some_and(|t| now.saturating_duration_since(t) < s.reconnect_fast_for);
                    let pause = if quick {
                        s.reconnect_fast
                    } else {
                        s.ping_period
                    };
                    // The loop's timer, not one of its own: a second timer
                    // made every probe's task larger by its size.
                    sleep.as_mut().reset(Instant::now() + pause);
                    (&mut sleep).await;
                    continue;
                }
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let now = Instant::now();
        if ctl.info_asap.swap(false, Ordering::Relaxed) {
            last_info = None;
            full = None;
        }
        let period = ctl.info_period();
        let next_info = last_info.map_or(now, |t| {
            let early = ctl
                .phase
                .early_unless(phased_for == Some(period), period, s.ping_period);
            on_grid(t + period - early, grain)
        });
        let result = if now >= next_info {
            if last_info.is_some() {
                phased_for = Some(period);
            }
            last_info = Some(now);
            // Boxed: read once a second at most, its future (the reply's
            // text and the parsed INFO) need not be part of every probe.
            Box::pin(info_round(
                &s,
                c,
                &tx,
                &duration,
                &ctl,
                &mut reported_ok,
                &mut full,
            ))
            .await
        } else if now >= next_ping {
            // From the PING's due time, not from now: the next one stays
            // on the grid, and the period does not drift by a grain.
            let due = next_ping + s.ping_period;
            next_ping = on_grid(if due > now { due } else { now + s.ping_period }, grain);
            // Boxed: with the race against a late reply its future is
            // large, and inline it made every probe's task that large for
            // its life (an allocation per PING instead).
            Box::pin(ping_round(&s, c, &tx, &duration, &ctl, &mut reported_ok)).await
        } else {
            let wake = next_ping.min(next_info);
            if sleep.deadline() != wake {
                sleep.as_mut().reset(wake);
            }
            // Between rounds nothing is asked, so anything the connection
            // yields is its end: a process that dies is seen at once, not
            // at the next PING.
            let idle = tokio::select! {
                _ = &mut sleep => None,
                _ = &mut woken => {
                    woken.set(ctl.wake.notified());
                    None
                }
                r = c.next_frame() => Some(match r {
                    Err(e) => e,
                    Ok(f) => RespError::Unexpected(format!("unsolicited {f:?}")),
                }),
            };
            match idle {
                None => continue,
                Some(e) => Err(match e {
                    // An unsolicited frame leaves the connection out of step.
                    RespError::Unexpected(_) => RespError::Protocol(e.to_string()),
                    e => e,
                }),
            }
        };
        match result {
            Ok(true) => {
                if reported_ok {
                    dropped_at = None;
                }
            }
            Ok(false) => return, // the group is gone
            Err(e) => {
                metrics::counter!(m::PROBE_ERRORS, "group" => s.group.clone(), m::SERVER_LABEL => s.server.clone(), "kind" => e.metric_label()).increment(1);
                if e.is_fatal_to_connection() {
                    conn = None;
                    lost = true;
                    reported_ok = false;
                    let cause = Failure::of(&e);
                    let now = Instant::now();
                    if cause == Failure::Closed {
                        // Reconnect at once: a refusal confirms a dead
                        // process, an accepted connection a live one.
                        dropped_at.get_or_insert(now);
                    }
                    let ev = ProbeEvent::Unreachable {
                        addr: s.addr.clone(),
                        at: now,
                        error: e.to_string(),
                        cause,
                    };
                    if tx.send(Box::new(ev)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Put the sync hold on the instance just reconnected to on `c` and tell
/// the group what to set back; false when the group is gone. A server that
/// refuses it (CONFIG renamed, an ACL without it) is probed as before: its
/// replicas are then protected only by the pause that follows a verdict.
async fn hold_on_return(
    s: &ProbeSettings,
    c: &mut Connection,
    hold: Duration,
    tx: &mpsc::Sender<Box<ProbeEvent>>,
    warned: &mut bool,
) -> bool {
    match hold::apply(c, hold, s.ping_timeout).await {
        Ok(held) => {
            let ev = ProbeEvent::SyncHeld {
                addr: s.addr.clone(),
                at: Instant::now(),
                restore: held.restore,
            };
            tx.send(Box::new(ev)).await.is_ok()
        }
        Err(e) => {
            metrics::counter!(m::SYNC_HOLDS, "group" => s.group.clone(), "result" => "refused")
                .increment(1);
            if !std::mem::replace(warned, true) {
                tracing::warn!(group = %s.group, instance = %s.addr, error = %e, "could not hold full copies from the master on reconnecting (a replica may copy a master restarted empty before the verdict)");
            }
            true
        }
    }
}

/// Where a probe's periodic INFO falls in its period, from its address.
///
/// Probes started together (every instance at start-up, or every replica
/// when a failover's fast reads end) would otherwise read their INFO in
/// the same second for ever: a thousand replies of 4 KB, their text and
/// their parse alive at once, a peak the allocator keeps as resident
/// memory after it is freed. Each probe's first periodic INFO after a
/// connect or a change of period comes earlier by a whole number of PING
/// periods, different across probes, and the ones after it a period
/// apart: the reads stay on the PING grid (no extra wake-up), none is
/// later than before, and a thousand probes read about a tenth of
/// themselves each second of a 10 s period.
#[derive(Debug, Clone, Copy)]
struct Phase(f64);

impl Phase {
    /// A fraction in [0, 1) of `server`'s address, spread evenly.
    fn of(server: &str) -> Phase {
        use std::hash::{Hash as _, Hasher as _};
        let mut h = std::hash::DefaultHasher::new();
        server.hash(&mut h);
        // The top 53 bits, exactly representable: [0, 1).
        Phase((h.finish() >> 11) as f64 / (1u64 << 53) as f64)
    }

    /// How much earlier than `period` the next read comes: nothing when
    /// the phase was already `taken` in this period, else [`early`](Self::early).
    fn early_unless(self, taken: bool, period: Duration, step: Duration) -> Duration {
        if taken {
            Duration::ZERO
        } else {
            self.early(period, step)
        }
    }

    /// How much earlier than `period` the first read comes: this phase's
    /// share of the period, in whole `step`s (none when the period is a
    /// single step).
    fn early(self, period: Duration, step: Duration) -> Duration {
        let Some(steps) = period.as_nanos().checked_div(step.as_nanos()) else {
            return Duration::ZERO;
        };
        let steps = u32::try_from(steps).unwrap_or(u32::MAX);
        // Truncation intended: a whole number of steps below `steps`.
        let k = (self.0 * f64::from(steps)) as u32;
        step.saturating_mul(k.min(steps.saturating_sub(1)))
    }
}

/// The grid that probes' (and group ticks') wake-ups are rounded to, for a
/// PING period: an eighth of it, 5–100 ms.
///
/// Each probe keeping its own phase woke the runtime once per PING: at a
/// thousand instances a thousand wake-ups (and thread switches) a second,
/// most of picket's CPU. On a shared grid the probes due within a grain
/// of each other are woken together, as Sentinel's 10 Hz timer sends the
/// PINGs that are due in one pass. Detection is unaffected: SDOWN counts
/// from the last valid reply, at its own exact deadline.
pub(crate) fn grain(ping_period: Duration) -> Duration {
    (ping_period / 8).clamp(Duration::from_millis(5), Duration::from_millis(100))
}

/// `t` rounded to the nearest point of the process-wide grid of `grain`.
pub(crate) fn on_grid(t: Instant, grain: Duration) -> Instant {
    let origin = Instant::from_std(origin());
    let g = grain.as_nanos().max(1);
    let Some(offset) = t.checked_duration_since(origin) else {
        return t;
    };
    let steps = (offset.as_nanos() + g / 2) / g;
    let rounded = steps.saturating_mul(g);
    u64::try_from(rounded)
        .ok()
        .and_then(|ns| origin.checked_add(Duration::from_nanos(ns)))
        .unwrap_or(t)
}

/// One PING. Returns Ok(false) when the receiver is gone.
async fn ping_round(
    s: &ProbeSettings,
    c: &mut Connection,
    tx: &mpsc::Sender<Box<ProbeEvent>>,
    duration: &metrics::Histogram,
    ctl: &Control,
    reported_ok: &mut bool,
) -> Result<bool, RespError> {
    let start = Instant::now();
    // The connection that answers first is kept (see `race_late`).
    // The reply is awaited for twice `ping_timeout`: new connections prove
    // the server alive meanwhile, and under loss a connection given up
    // costs more (a new handshake) than one waited for.
    let patience = s.ping_timeout * 2;
    let (reply, fresh) =
        match race_late(s, c.call_timeout(["PING"], patience), start + patience).await {
            Raced::Own(r) => (r, None),
            Raced::Fresh(conn, r) => (r, Some(*conn)),
        };
    if let Some(f) = fresh {
        // The old connection still owes a reply: it goes.
        *c = f;
    }
    let at = Instant::now();
    let valid = sdown::is_valid_ping_reply(&reply);
    let latency = at - start;
    if valid {
        duration.record(latency.as_secs_f64());
    }
    let (error, fatal) = match &reply {
        Ok(_) if valid => (None, None),
        Ok(f) => (Some(format!("unexpected PING reply {f:?}")), None),
        Err(e) if valid => (Some(e.to_string()), None),
        Err(e) => (Some(e.to_string()), Some(e)),
    };
    let busy = matches!(reply, Err(RespError::Server(ServerError::Busy(_))));
    let ok = valid && !busy && error.is_none();
    if ok {
        ctl.last_valid.store(stamp(at), Ordering::Relaxed);
        if *reported_ok {
            return Ok(true);
        }
    }
    *reported_ok = ok;
    let ev = ProbeEvent::Ping {
        addr: s.addr.clone(),
        at,
        valid,
        latency: reply.is_ok().then_some(latency),
        error,
        busy,
    };
    if tx.send(Box::new(ev)).await.is_err() {
        return Ok(false);
    }
    match fatal {
        Some(e) if e.is_fatal_to_connection() => Err(reply.err().unwrap_or(RespError::Closed)),
        _ => Ok(true),
    }
}

/// Which answered first in [`race_late`].
enum Raced<T> {
    /// The request on the probe's own connection.
    Own(T),
    /// A PING on a new connection, validly answered (boxed: a connection
    /// is large, and this is the rare case).
    Fresh(
        Box<Connection>,
        Result<redis_protocol::resp2::types::BytesFrame, RespError>,
    ),
}

/// Await `own`, a request on the probe's connection; once it is later than
/// a probe period, race it with PINGs on new connections, one more every
/// probe period (two at most at a time) until `until`, each given until
/// then. On a lossy link one
/// lost segment holds a connection for TCP's retransmission timeouts (200,
/// 400, 800 ms ...) and a lost SYN-ACK a new one for a second, while the
/// packets of other connections get through: the server is not silent.
/// The new connections (boxed, made only then) cost nothing while replies
/// come in time.
async fn race_late<F: std::future::Future>(
    s: &ProbeSettings,
    own: F,
    until: Instant,
) -> Raced<F::Output> {
    use futures::StreamExt;
    tokio::pin!(own);
    let mut hedges = futures::stream::FuturesUnordered::new();
    let mut next = Instant::now() + s.ping_period;
    loop {
        // At most two at a time: a frozen server accepts connections (its
        // kernel does) and answers none, and its listen queue is not to be
        // filled by probes.
        let more = next < until && hedges.len() < 2;
        tokio::select! {
            r = &mut own => return Raced::Own(r),
            _ = tokio::time::sleep_until(next), if more => {
                let left = until.saturating_duration_since(Instant::now());
                hedges.push(Box::pin(hedge_ping(s, left)));
                next += s.ping_period;
            }
            Some(h) = hedges.next(), if !hedges.is_empty() => {
                if let Some((c, r)) = h {
                    return Raced::Fresh(Box::new(c), r);
                }
            }
        }
    }
}

/// A PING on a new connection, answered validly within `within` (None
/// otherwise): proof of life while the probe's own connection is stalled.
async fn hedge_ping(
    s: &ProbeSettings,
    within: Duration,
) -> Option<(
    Connection,
    Result<redis_protocol::resp2::types::BytesFrame, RespError>,
)> {
    let started = Instant::now();
    let attempt = async {
        let mut c = Connection::connect(&s.server, &s.client).await.ok()?;
        let r = c.call(["PING"]).await;
        sdown::is_valid_ping_reply(&r).then_some((c, r))
    };
    let got = tokio::time::timeout(within, attempt).await.ok().flatten();
    if got.is_none() {
        // A refusal fails at once: the next try is not made sooner than a
        // quick reconnect would be.
        tokio::time::sleep_until(started + s.reconnect_fast).await;
    }
    got
}

/// One INFO (all sections picket reads). Returns Ok(false) when the
/// receiver is gone.
async fn info_round(
    s: &ProbeSettings,
    c: &mut Connection,
    tx: &mpsc::Sender<Box<ProbeEvent>>,
    duration: &metrics::Histogram,
    ctl: &Control,
    reported_ok: &mut bool,
    full: &mut Option<(Instant, ServerFields, u64)>,
) -> Result<bool, RespError> {
    let start = Instant::now();
    let every = ctl.full_info_every_ms.load(Ordering::Relaxed);
    let known = full
        .as_ref()
        .filter(|(t, _, phased)| {
            let period = Duration::from_millis(every);
            // The first full read in a new period comes earlier by the
            // probe's phase, as the periodic INFO does (see [`Phase`]).
            let early = ctl
                .phase
                .early_unless(*phased == every, period, ctl.info_period());
            every > 0 && start.duration_since(*t) + early < period
        })
        .map(|(_, f, _)| f);
    // `INFO` without arguments covers server, replication and persistence
    // on every flavour (Dragonfly does not accept several section names,
    // but one it does).
    // A PING answered on a new connection while the reply is late proves
    // the server alive, and that connection is kept as a spare: if the
    // reply never comes, the probe goes on with it instead of
    // reconnecting (under loss, a new handshake is what costs most).
    let (reply, spare) = {
        let main = async {
            match known {
                Some(_) => c.call_text(["INFO", "replication"]).await,
                None => c.call_text(["INFO"]).await,
            }
        };
        tokio::pin!(main);
        let until = start + s.ping_timeout.max(s.client.command_timeout);
        let mut spare = None;
        let reply = loop {
            match race_late(s, &mut main, until).await {
                Raced::Own(r) => break r,
                Raced::Fresh(conn, _) => {
                    ctl.last_valid
                        .store(stamp(Instant::now()), Ordering::Relaxed);
                    spare = Some(*conn);
                }
            }
        };
        (reply, spare)
    };
    let reply = match (reply, spare) {
        (Err(e), Some(conn)) if e.is_fatal_to_connection() => {
            tracing::debug!(instance = %s.addr, error = %e, "INFO lost; going on with a new connection");
            *c = conn;
            *full = None;
            return Ok(true);
        }
        (r, _) => r,
    };
    let text = match reply {
        Ok(t) => t,
        Err(RespError::Server(e)) => {
            // A LOADING server still answers PING; INFO errors are reported
            // through the PING path, not as unreachability. The next INFO
            // is a full one.
            tracing::debug!(instance = %s.addr, error = %e, "INFO refused");
            *full = None;
            return Ok(true);
        }
        Err(e) => return Err(e),
    };
    let at = Instant::now();
    let info = match known {
        Some(f) => Box::new(info::parse_info(&text).with_server_fields(f)),
        None => {
            let info = info::parse_info(&text);
            *full = Some((start, info.server_fields(), every));
            Box::new(info)
        }
    };
    duration.record((at - start).as_secs_f64());
    // INFO is also proof of life.
    ctl.last_valid.store(stamp(at), Ordering::Relaxed);
    if !*reported_ok {
        *reported_ok = true;
        let ping = ProbeEvent::Ping {
            addr: s.addr.clone(),
            at,
            valid: true,
            latency: Some(at - start),
            error: None,
            busy: false,
        };
        if tx.send(Box::new(ping)).await.is_err() {
            return Ok(false);
        }
    }
    let ev = ProbeEvent::Info {
        addr: s.addr.clone(),
        at,
        info,
        ip: c.peer_addr().map(|a| a.ip()),
    };
    Ok(tx.send(Box::new(ev)).await.is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future an async fn with three arguments returns.
    fn future_size<A, B, C, F>(_: fn(A, B, C) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn a_probe_task_stays_small() {
        // One per instance, allocated for its life: with the settings
        // passed by value, a second timer and the INFO round inline it
        // was 1.9 KiB (debug build). Watching the idle connection for its
        // end and the quick reconnects added 56 bytes.
        let task = future_size(run);
        assert!(task <= 1500, "a probe's task is {task} bytes");
    }

    #[test]
    fn grain_is_an_eighth_of_the_ping_period_within_bounds() {
        assert_eq!(grain(Duration::from_secs(1)), Duration::from_millis(100));
        assert_eq!(
            grain(Duration::from_millis(250)),
            Duration::from_micros(31_250)
        );
        assert_eq!(grain(Duration::from_millis(20)), Duration::from_millis(5));
        assert_eq!(grain(Duration::from_secs(10)), Duration::from_millis(100));
    }

    #[test]
    fn the_periodic_info_is_spread_over_the_period_and_never_later() {
        let s = Duration::from_secs;
        let mut per_second = [0u32; 10];
        for i in 0..1000 {
            let early = Phase::of(&format!("10.0.{}.{}:6379", i / 250, i % 250)).early(s(10), s(1));
            assert!(early < s(10) && early.subsec_nanos() == 0, "{early:?}");
            per_second[early.as_secs() as usize] += 1;
        }
        // About a tenth of the probes in each second of the period.
        assert!(
            per_second.iter().all(|&n| (50..=150).contains(&n)),
            "{per_second:?}"
        );
        // One PING period per INFO period: nothing to spread.
        let p = Phase::of("10.0.0.1:6379");
        assert_eq!(p.early(s(1), s(1)), Duration::ZERO);
        assert_eq!(p.early(s(1), Duration::ZERO), Duration::ZERO);
        // The same address, the same place.
        assert_eq!(
            p.early(s(10), s(1)),
            Phase::of("10.0.0.1:6379").early(s(10), s(1))
        );
    }

    #[test]
    fn times_within_a_grain_land_on_one_grid_point() {
        let g = Duration::from_millis(100);
        let base = on_grid(Instant::now() + Duration::from_secs(1), g);
        // Already on the grid: unchanged.
        assert_eq!(on_grid(base, g), base);
        // Nearest point: never more than half a grain away.
        for ms in [1u64, 20, 49] {
            assert_eq!(on_grid(base + Duration::from_millis(ms), g), base);
            assert_eq!(on_grid(base - Duration::from_millis(ms), g), base);
        }
        assert_eq!(on_grid(base + Duration::from_millis(51), g), base + g);
        // A period that is a multiple of the grain stays on it.
        assert_eq!(
            on_grid(base + Duration::from_secs(1), g),
            base + Duration::from_secs(1)
        );
    }

    #[test]
    fn stamps_round_trip_and_zero_means_never() {
        assert_eq!(unstamp(0), None);
        let t = Instant::now() + Duration::from_millis(1234);
        let back = unstamp(stamp(t)).unwrap();
        let diff = if back > t { back - t } else { t - back };
        assert!(diff < Duration::from_micros(1), "{diff:?}");
        assert!(stamp(t) > stamp(t - Duration::from_millis(1)));
    }
}

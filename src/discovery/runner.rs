//! Runs one group's writes against all of its discovery backends.
//!
//! A [`DiscoveryRunner`] owns the backends of one group. [`fence`] and
//! [`publish`] write to every backend at once and retry transient failures
//! with jittered exponential backoff (50 ms, doubling, capped at 2 s). The
//! call returns when every *required* backend has confirmed, or with a
//! [`RunnerError`] when one has not by the deadline (or answered stale or
//! permanent). *Best-effort* backends do not hold the call up: they keep
//! retrying in the background until they succeed or a newer write replaces
//! theirs.
//!
//! Per backend, writes are serialized: a new write cancels the older one
//! still pending (its in-flight attempt is dropped) before it starts, so
//! two writes never reach one backend at the same time. A write is newer
//! when its epoch is higher, or when it is a publication of the same epoch
//! as a fence (the publication after the promotion). A write that is older
//! than the latest one handed to a backend is refused locally as stale. An
//! identical write that arrives while the same one is still pending joins
//! it instead of restarting it.
//!
//! [`fence`]: DiscoveryRunner::fence
//! [`publish`]: DiscoveryRunner::publish

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::Rng;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Backend, DiscoveryError, Fence, Topology};

/// Counter of backend writes, labelled `backend` (the kind: `file`, `exec`,
/// ...) and `result` (`ok`, `stale`, `transient`, `permanent`). Every
/// attempt counts, retries included.
pub const WRITES_TOTAL: &str = "picket_discovery_writes_total";

/// Histogram of the duration of one backend write attempt in seconds,
/// labelled `backend` (the kind).
pub const WRITE_DURATION_SECONDS: &str = "picket_discovery_write_duration_seconds";

// === Backoff ===

/// Delays between the attempts of one write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Growth factor from one retry to the next.
    pub factor: u32,
    /// Upper bound of a delay.
    pub max: Duration,
    /// Fraction (0 to 1) of each delay that is random: a delay `d` becomes
    /// a uniform pick in `[d * (1 - jitter), d]`, so that daemons retrying
    /// the same backend spread out.
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(50),
            factor: 2,
            max: Duration::from_secs(2),
            jitter: 0.5,
        }
    }
}

impl Backoff {
    /// The delay before retry number `retry` (0 for the first), without
    /// jitter.
    pub fn delay(&self, retry: u32) -> Duration {
        let mut d = self.initial;
        for _ in 0..retry {
            if d >= self.max {
                break;
            }
            d = d.saturating_mul(self.factor.max(1));
        }
        d.min(self.max)
    }

    /// The delay before retry number `retry`, with jitter.
    pub fn jittered(&self, retry: u32) -> Duration {
        let d = self.delay(retry);
        let jitter = self.jitter.clamp(0.0, 1.0);
        if jitter == 0.0 {
            return d;
        }
        let cut: f64 = rand::rng().random_range(0.0..=jitter);
        d.mul_f64(1.0 - cut)
    }
}

// === Status and errors ===

/// Which write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpKind {
    /// [`Backend::fence`].
    Fence,
    /// [`Backend::publish`].
    Publish,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Fence => "fence",
            OpKind::Publish => "publish",
        })
    }
}

/// The outcome of one write attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WriteResult {
    /// The backend confirmed.
    Ok,
    /// The backend holds a higher epoch.
    Stale,
    /// Failed; retried.
    Transient,
    /// Failed; not retried.
    Permanent,
}

impl WriteResult {
    fn of(r: &Result<(), DiscoveryError>) -> Self {
        match r {
            Ok(()) => WriteResult::Ok,
            Err(DiscoveryError::Stale { .. }) => WriteResult::Stale,
            Err(DiscoveryError::Transient(_)) => WriteResult::Transient,
            Err(DiscoveryError::Permanent(_)) => WriteResult::Permanent,
        }
    }

    fn label(self) -> &'static str {
        match self {
            WriteResult::Ok => "ok",
            WriteResult::Stale => "stale",
            WriteResult::Transient => "transient",
            WriteResult::Permanent => "permanent",
        }
    }
}

/// One backend's state, for `/v1/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BackendStatus {
    /// [`Backend::name`].
    pub name: String,
    /// [`Backend::kind`].
    pub kind: &'static str,
    /// Whether failovers wait for it.
    pub required: bool,
    /// The write of the latest attempt.
    pub last_op: Option<OpKind>,
    /// The epoch of the latest attempt.
    pub last_epoch: Option<u64>,
    /// The outcome of the latest attempt.
    pub last_result: Option<WriteResult>,
    /// The error of the latest attempt, if it failed.
    pub last_error: Option<String>,
    /// When an attempt last succeeded (unix seconds).
    pub last_ok_at: Option<u64>,
    /// Attempts that succeeded.
    pub writes_ok: u64,
    /// Attempts that failed (stale, transient or permanent).
    pub writes_failed: u64,
    /// Whether a failed write is waiting for its next attempt.
    pub retrying: bool,
}

/// Why one backend did not confirm a write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FailureReason {
    /// The backend's final answer (stale or permanent).
    #[error("{0}")]
    Backend(DiscoveryError),
    /// The deadline passed; `last` is the last error seen, if any.
    #[error("deadline passed{}", match last {
        Some(e) => format!(" (last error: {e})"),
        None => " before any attempt finished".to_string(),
    })]
    Deadline {
        /// The last error before the deadline.
        last: Option<DiscoveryError>,
    },
    /// A newer write to the same backend replaced this one.
    #[error("superseded by a newer write")]
    Superseded,
    /// The runner was shut down.
    #[error("discovery runner shut down")]
    Shutdown,
    /// The write task ended without a result (it panicked).
    #[error("write task failed")]
    TaskFailed,
}

/// One required backend that did not confirm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendFailure {
    /// [`Backend::name`].
    pub name: String,
    /// Why.
    pub reason: FailureReason,
}

/// A fence or publication that not every required backend confirmed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op} of group {group} at epoch {epoch} not confirmed: {}", list(.failures))]
pub struct RunnerError {
    /// The group.
    pub group: String,
    /// The write.
    pub op: OpKind,
    /// Its epoch.
    pub epoch: u64,
    /// Every required backend that did not confirm, with its last error.
    pub failures: Vec<BackendFailure>,
}

fn list(failures: &[BackendFailure]) -> String {
    failures
        .iter()
        .map(|f| format!("{}: {}", f.name, f.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

impl RunnerError {
    /// The highest epoch a backend reported holding above ours, if any:
    /// another failover has won, and this one should stand down.
    pub fn stale_epoch(&self) -> Option<u64> {
        self.failures
            .iter()
            .filter_map(|f| match &f.reason {
                FailureReason::Backend(DiscoveryError::Stale { stored, .. }) => Some(*stored),
                _ => None,
            })
            .max()
    }
}

// === Ops and slots ===

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Fence(Fence),
    Publish(Topology),
}

impl Op {
    fn kind(&self) -> OpKind {
        match self {
            Op::Fence(_) => OpKind::Fence,
            Op::Publish(_) => OpKind::Publish,
        }
    }

    fn epoch(&self) -> u64 {
        match self {
            Op::Fence(f) => f.epoch,
            Op::Publish(t) => t.epoch,
        }
    }

    /// Newer writes compare greater: by epoch, and within one epoch the
    /// publication after the fence.
    fn order(&self) -> (u64, u8) {
        match self {
            Op::Fence(f) => (f.epoch, 0),
            Op::Publish(t) => (t.epoch, 1),
        }
    }

    async fn apply(&self, backend: &dyn Backend) -> Result<(), DiscoveryError> {
        match self {
            Op::Fence(f) => backend.fence(f).await,
            Op::Publish(t) => backend.publish(t).await,
        }
    }
}

type Outcome = Option<Result<(), FailureReason>>;

/// The latest write handed to a backend.
struct Pending {
    op: Arc<Op>,
    seq: u64,
    token: CancellationToken,
    done: watch::Receiver<Outcome>,
}

#[derive(Debug, Default)]
struct Counters {
    last_op: Option<OpKind>,
    last_epoch: Option<u64>,
    last_result: Option<WriteResult>,
    last_error: Option<String>,
    last_ok_at: Option<u64>,
    writes_ok: u64,
    writes_failed: u64,
    retrying: bool,
}

struct Slot {
    backend: Arc<dyn Backend>,
    name: String,
    required: bool,
    /// Held for the whole of one attempt: one write at a time.
    write_lock: tokio::sync::Mutex<()>,
    pending: Mutex<Option<Pending>>,
    counters: Mutex<Counters>,
}

/// Locks a std mutex; a poisoned one only means a panic elsewhere while
/// the plain data inside was consistent.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

enum Submitted {
    /// A new write task must run with this token and report on this sender.
    Start(
        CancellationToken,
        watch::Sender<Outcome>,
        watch::Receiver<Outcome>,
    ),
    /// The same write is pending: wait for it.
    Join(watch::Receiver<Outcome>),
    /// A newer write was already handed to this backend (its epoch).
    Older(u64),
}

impl Slot {
    fn submit(&self, op: &Arc<Op>, seq: u64, parent: &CancellationToken) -> Submitted {
        let mut pending = lock(&self.pending);
        if let Some(p) = pending.as_ref() {
            if op.order() < p.op.order() {
                return Submitted::Older(p.op.epoch());
            }
            let unfinished = p.done.borrow().is_none();
            if unfinished && *p.op == **op {
                return Submitted::Join(p.done.clone());
            }
            p.token.cancel();
        }
        let token = parent.child_token();
        let (tx, rx) = watch::channel(None);
        *pending = Some(Pending {
            op: Arc::clone(op),
            seq,
            token: token.clone(),
            done: rx.clone(),
        });
        Submitted::Start(token, tx, rx)
    }

    fn is_current(&self, seq: u64) -> bool {
        lock(&self.pending).as_ref().is_some_and(|p| p.seq == seq)
    }

    fn record(&self, op: &Op, result: &Result<(), DiscoveryError>, took: Duration) {
        let outcome = WriteResult::of(result);
        let kind = self.backend.kind();
        metrics::counter!(WRITES_TOTAL, "backend" => kind, "result" => outcome.label())
            .increment(1);
        metrics::histogram!(WRITE_DURATION_SECONDS, "backend" => kind).record(took.as_secs_f64());
        let mut c = lock(&self.counters);
        c.last_op = Some(op.kind());
        c.last_epoch = Some(op.epoch());
        c.last_result = Some(outcome);
        match result {
            Ok(()) => {
                c.writes_ok += 1;
                c.last_error = None;
                c.last_ok_at = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .ok()
                    .map(|d| d.as_secs());
            }
            Err(e) => {
                c.writes_failed += 1;
                c.last_error = Some(e.to_string());
            }
        }
    }

    fn set_retrying(&self, seq: u64, retrying: bool) {
        // Only the current write speaks for the backend: a superseded one
        // ending must not clear the flag of its successor.
        if self.is_current(seq) {
            lock(&self.counters).retrying = retrying;
        }
    }

    fn status(&self) -> BackendStatus {
        let c = lock(&self.counters);
        BackendStatus {
            name: self.name.clone(),
            kind: self.backend.kind(),
            required: self.required,
            last_op: c.last_op,
            last_epoch: c.last_epoch,
            last_result: c.last_result,
            last_error: c.last_error.clone(),
            last_ok_at: c.last_ok_at,
            writes_ok: c.writes_ok,
            writes_failed: c.writes_failed,
            retrying: c.retrying,
        }
    }
}

// === The runner ===

/// Owns one group's discovery backends and runs writes against them.
pub struct DiscoveryRunner {
    group: String,
    slots: Vec<Arc<Slot>>,
    backoff: Backoff,
    shutdown: CancellationToken,
    seq: AtomicU64,
}

impl fmt::Debug for DiscoveryRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiscoveryRunner")
            .field("group", &self.group)
            .field(
                "backends",
                &self.slots.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .field("backoff", &self.backoff)
            .finish()
    }
}

impl DiscoveryRunner {
    /// A runner for `group` writing to `backends`, with the default backoff.
    pub fn new(group: impl Into<String>, backends: Vec<Arc<dyn Backend>>) -> Self {
        let slots = backends
            .into_iter()
            .map(|backend| {
                Arc::new(Slot {
                    name: backend.name(),
                    required: backend.required(),
                    backend,
                    write_lock: tokio::sync::Mutex::new(()),
                    pending: Mutex::new(None),
                    counters: Mutex::new(Counters::default()),
                })
            })
            .collect();
        DiscoveryRunner {
            group: group.into(),
            slots,
            backoff: Backoff::default(),
            shutdown: CancellationToken::new(),
            seq: AtomicU64::new(0),
        }
    }

    /// Replace the retry delays (tests use no jitter).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Take `fence.old_master` out of routing in every backend; `Ok` once
    /// every required backend confirmed within `deadline`.
    pub async fn fence(&self, fence: Fence, deadline: Duration) -> Result<(), RunnerError> {
        self.write(Op::Fence(fence), deadline).await
    }

    /// Publish `t` to every backend; `Ok` once every required backend
    /// confirmed within `deadline`.
    pub async fn publish(&self, t: Topology, deadline: Duration) -> Result<(), RunnerError> {
        self.write(Op::Publish(t), deadline).await
    }

    /// Every backend's state, in configuration order.
    pub fn status(&self) -> Vec<BackendStatus> {
        self.slots.iter().map(|s| s.status()).collect()
    }

    /// Stop every pending write, background retries included.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    async fn write(&self, op: Op, deadline: Duration) -> Result<(), RunnerError> {
        let op = Arc::new(op);
        let deadline_at = Instant::now() + deadline;
        let mut failures = Vec::new();
        let mut waits = Vec::new();
        for slot in &self.slots {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let done = match slot.submit(&op, seq, &self.shutdown) {
                Submitted::Older(stored) => {
                    tracing::info!(
                        group = %self.group, backend = %slot.name, op = %op.kind(),
                        epoch = op.epoch(), newer_epoch = stored,
                        "not written: a newer write was already handed to this backend"
                    );
                    if slot.required {
                        failures.push(BackendFailure {
                            name: slot.name.clone(),
                            reason: FailureReason::Backend(DiscoveryError::Stale {
                                stored,
                                ours: op.epoch(),
                            }),
                        });
                    }
                    continue;
                }
                Submitted::Join(done) => done,
                Submitted::Start(token, tx, rx) => {
                    let task = WriteTask {
                        group: self.group.clone(),
                        slot: Arc::clone(slot),
                        op: Arc::clone(&op),
                        seq,
                        token,
                        shutdown: self.shutdown.clone(),
                        // Best-effort writes outlive the call.
                        deadline: slot.required.then_some(deadline_at),
                        backoff: self.backoff,
                    };
                    tokio::spawn(async move {
                        let outcome = task.run().await;
                        let _ = tx.send(Some(outcome));
                    });
                    rx
                }
            };
            if slot.required {
                waits.push((slot, done));
            }
        }
        for (slot, mut done) in waits {
            // A joined write may have been started with a later deadline
            // (or none); ours still bounds this call.
            let waited = tokio::time::timeout_at(deadline_at, done.wait_for(|o| o.is_some())).await;
            let reason = match waited {
                Ok(Ok(outcome)) => match outcome.as_ref() {
                    Some(Ok(())) => continue,
                    Some(Err(reason)) => reason.clone(),
                    None => FailureReason::TaskFailed,
                },
                Ok(Err(_closed)) => FailureReason::TaskFailed,
                Err(_elapsed) => FailureReason::Deadline { last: None },
            };
            failures.push(BackendFailure {
                name: slot.name.clone(),
                reason,
            });
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(RunnerError {
                group: self.group.clone(),
                op: op.kind(),
                epoch: op.epoch(),
                failures,
            })
        }
    }
}

impl Drop for DiscoveryRunner {
    fn drop(&mut self) {
        // Background retries must not outlive the runner: a later runner for
        // the same backends would not be serialized with them.
        self.shutdown.cancel();
    }
}

/// One write to one backend, retried until it is settled.
struct WriteTask {
    group: String,
    slot: Arc<Slot>,
    op: Arc<Op>,
    seq: u64,
    token: CancellationToken,
    shutdown: CancellationToken,
    deadline: Option<Instant>,
    backoff: Backoff,
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl WriteTask {
    fn cancelled(&self) -> FailureReason {
        if self.shutdown.is_cancelled() {
            FailureReason::Shutdown
        } else {
            FailureReason::Superseded
        }
    }

    async fn run(self) -> Result<(), FailureReason> {
        let result = self.attempts().await;
        self.slot.set_retrying(self.seq, false);
        match &result {
            Ok(()) => tracing::info!(
                group = %self.group, backend = %self.slot.name, op = %self.op.kind(),
                epoch = self.op.epoch(), "discovery write confirmed"
            ),
            Err(reason) => tracing::warn!(
                group = %self.group, backend = %self.slot.name, op = %self.op.kind(),
                epoch = self.op.epoch(), %reason, "discovery write given up"
            ),
        }
        result
    }

    async fn attempts(&self) -> Result<(), FailureReason> {
        let mut last: Option<DiscoveryError> = None;
        let mut retry = 0u32;
        loop {
            let guard = tokio::select! {
                biased;
                _ = self.token.cancelled() => return Err(self.cancelled()),
                _ = sleep_until_opt(self.deadline) => return Err(FailureReason::Deadline { last }),
                g = self.slot.write_lock.lock() => g,
            };
            let started = Instant::now();
            let result = tokio::select! {
                biased;
                // Dropping the attempt is what cancels it (an HTTP request
                // is abandoned, a program killed).
                _ = self.token.cancelled() => return Err(self.cancelled()),
                _ = sleep_until_opt(self.deadline) => Err(DiscoveryError::Transient(
                    "deadline passed during the attempt".to_string(),
                )),
                r = self.op.apply(&*self.slot.backend) => r,
            };
            drop(guard);
            self.slot.record(
                &self.op,
                &result,
                Instant::now().saturating_duration_since(started),
            );
            let err = match result {
                Ok(()) => return Ok(()),
                Err(e @ (DiscoveryError::Stale { .. } | DiscoveryError::Permanent(_))) => {
                    return Err(FailureReason::Backend(e));
                }
                Err(e) => e,
            };
            let delay = self.backoff.jittered(retry);
            retry = retry.saturating_add(1);
            let next = Instant::now() + delay;
            if self.deadline.is_some_and(|d| next >= d) {
                // The next attempt could not finish in time anyway.
                return Err(FailureReason::Deadline { last: Some(err) });
            }
            tracing::warn!(
                group = %self.group, backend = %self.slot.name, op = %self.op.kind(),
                epoch = self.op.epoch(), error = %err, retry_in = ?delay,
                "discovery write failed; retrying"
            );
            last = Some(err);
            self.slot.set_retrying(self.seq, true);
            tokio::select! {
                biased;
                _ = self.token.cancelled() => return Err(self.cancelled()),
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }
}

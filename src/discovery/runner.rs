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
use crate::metrics as m;

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
    /// The last waits for the Service (Kubernetes pod-labels with
    /// `service`); absent for other backends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_gate: Option<super::kubernetes::gate::GateStatus>,
    /// [`super::Backend::warning`]: what this backend does not guarantee
    /// as configured; absent when nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<&'static str>,
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
        metrics::counter!(m::DISCOVERY_WRITES, "backend" => kind, "result" => outcome.label())
            .increment(1);
        metrics::histogram!(m::DISCOVERY_WRITE_DURATION, "backend" => kind)
            .record(took.as_secs_f64());
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
            service_gate: self.backend.service_gate(),
            warning: self.backend.warning(),
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
    #[cfg(test)]
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
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
                Submitted::Join(done) => (done, true),
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
                    (rx, false)
                }
            };
            if slot.required {
                waits.push((slot, done));
            }
        }
        for (slot, (mut done, joined)) in waits {
            // Our own tasks stop at our deadline and report why, so they
            // are awaited in full. A joined write may have been started
            // with a later deadline; ours still bounds this call.
            let finished = done.wait_for(|o| o.is_some());
            let waited = if joined {
                tokio::time::timeout_at(deadline_at, finished).await
            } else {
                Ok(finished.await)
            };
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

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// The highest epoch a backend reported holding above ours.
    fn stale_epoch(e: &RunnerError) -> Option<u64> {
        e.failures
            .iter()
            .filter_map(|f| match &f.reason {
                FailureReason::Backend(DiscoveryError::Stale { stored, .. }) => Some(*stored),
                _ => None,
            })
            .max()
    }
    use crate::addr::Addr;
    use crate::discovery::{BoxFuture, Reporter};

    /// One call seen by a fake backend.
    #[derive(Debug, Clone, PartialEq)]
    struct Call {
        at: Duration,
        op: OpKind,
        epoch: u64,
    }

    /// A scriptable backend: answers from `script` in order, then `then`
    /// forever; every call takes `delay`.
    struct Fake {
        name: String,
        required: bool,
        start: Instant,
        delay: Duration,
        script: Mutex<VecDeque<Result<(), DiscoveryError>>>,
        then: Result<(), DiscoveryError>,
        /// Only fences get the script (publications succeed) when set.
        script_fences_only: bool,
        calls: Mutex<Vec<Call>>,
        finished: Mutex<Vec<Call>>,
        in_flight: AtomicUsize,
        max_in_flight: AtomicUsize,
    }

    /// Decrements the in-flight count even when the attempt is dropped.
    struct InFlight<'a>(&'a AtomicUsize);
    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl Fake {
        fn new(name: &str, required: bool) -> Self {
            Fake {
                name: name.to_string(),
                required,
                start: Instant::now(),
                delay: Duration::ZERO,
                script: Mutex::new(VecDeque::new()),
                then: Ok(()),
                script_fences_only: false,
                calls: Mutex::new(Vec::new()),
                finished: Mutex::new(Vec::new()),
                in_flight: AtomicUsize::new(0),
                max_in_flight: AtomicUsize::new(0),
            }
        }

        fn failing(self, n: usize) -> Self {
            *lock(&self.script) = (0..n).map(|i| Err(transient(i))).collect();
            self
        }

        fn then(mut self, r: Result<(), DiscoveryError>) -> Self {
            self.then = r;
            self
        }

        fn slow(mut self, d: Duration) -> Self {
            self.delay = d;
            self
        }

        fn calls(&self) -> Vec<Call> {
            lock(&self.calls).clone()
        }

        fn finished(&self) -> Vec<Call> {
            lock(&self.finished).clone()
        }

        fn call<'a>(&'a self, op: OpKind, epoch: u64) -> BoxFuture<'a, Result<(), DiscoveryError>> {
            Box::pin(async move {
                let call = Call {
                    at: Instant::now() - self.start,
                    op,
                    epoch,
                };
                lock(&self.calls).push(call.clone());
                let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                self.max_in_flight.fetch_max(now, Ordering::SeqCst);
                let _guard = InFlight(&self.in_flight);
                tokio::time::sleep(self.delay).await;
                lock(&self.finished).push(call);
                if self.script_fences_only && op == OpKind::Publish {
                    return Ok(());
                }
                let next = lock(&self.script).pop_front();
                next.unwrap_or_else(|| self.then.clone())
            })
        }
    }

    impl Backend for Fake {
        fn kind(&self) -> &'static str {
            "fake"
        }
        fn name(&self) -> String {
            self.name.clone()
        }
        fn required(&self) -> bool {
            self.required
        }
        fn fence<'a>(&'a self, f: &'a Fence) -> BoxFuture<'a, Result<(), DiscoveryError>> {
            self.call(OpKind::Fence, f.epoch)
        }
        fn publish<'a>(&'a self, t: &'a Topology) -> BoxFuture<'a, Result<(), DiscoveryError>> {
            self.call(OpKind::Publish, t.epoch)
        }
    }

    fn transient(i: usize) -> DiscoveryError {
        DiscoveryError::Transient(format!("failure {i}"))
    }

    fn topo(epoch: u64) -> Topology {
        Topology {
            group: "g".into(),
            epoch,
            master: Addr::new("10.0.0.1", 6379),
            old_master: None,
            replicas: vec![],
            reporter: Reporter::Leader,
        }
    }

    fn fence(epoch: u64) -> Fence {
        Fence {
            group: "g".into(),
            epoch,
            old_master: Addr::new("10.0.0.9", 6379),
        }
    }

    fn no_jitter() -> Backoff {
        Backoff {
            jitter: 0.0,
            ..Backoff::default()
        }
    }

    fn runner(backends: &[&Arc<Fake>]) -> DiscoveryRunner {
        let backends = backends
            .iter()
            .map(|b| Arc::clone(b) as Arc<dyn Backend>)
            .collect();
        DiscoveryRunner::new("g", backends).with_backoff(no_jitter())
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Lets spawned tasks run until `cond` holds, advancing paused time in
    /// small steps; panics after `limit` of virtual time.
    async fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) {
        let until = Instant::now() + limit;
        while !cond() {
            assert!(Instant::now() < until, "condition not met within {limit:?}");
            tokio::time::sleep(ms(10)).await;
        }
    }

    #[test]
    fn backoff_doubles_from_50ms_and_caps_at_2s() {
        let b = Backoff::default();
        let delays: Vec<u64> = (0..9).map(|r| b.delay(r).as_millis() as u64).collect();
        assert_eq!(delays, vec![50, 100, 200, 400, 800, 1600, 2000, 2000, 2000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(2));
    }

    #[test]
    fn jitter_stays_within_bounds_and_varies() {
        let b = Backoff::default();
        let samples: Vec<Duration> = (0..200).map(|_| b.jittered(3)).collect();
        for d in &samples {
            assert!(
                *d >= ms(200) && *d <= ms(400),
                "{d:?} outside [200ms, 400ms]"
            );
        }
        let distinct: std::collections::HashSet<_> = samples.iter().collect();
        assert!(distinct.len() > 10, "jitter does not vary: {distinct:?}");
        assert_eq!(no_jitter().jittered(3), ms(400));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_transient_failures_with_growing_backoff() {
        let fake = Arc::new(Fake::new("a", true).failing(4));
        let r = runner(&[&fake]);
        r.publish(topo(1), Duration::from_secs(10)).await.unwrap();
        let at: Vec<Duration> = fake.calls().iter().map(|c| c.at).collect();
        // 50, 100, 200, 400 ms between attempts.
        assert_eq!(at, vec![ms(0), ms(50), ms(150), ms(350), ms(750)]);
        let s = &r.status()[0];
        assert_eq!(s.writes_ok, 1);
        assert_eq!(s.writes_failed, 4);
        assert_eq!(s.last_result, Some(WriteResult::Ok));
        assert_eq!(s.last_error, None);
        assert_eq!(s.last_op, Some(OpKind::Publish));
        assert_eq!(s.last_epoch, Some(1));
        assert!(s.last_ok_at.is_some());
        assert!(!s.retrying);
    }

    #[tokio::test(start_paused = true)]
    async fn jittered_retries_are_not_later_than_the_backoff() {
        let fake = Arc::new(Fake::new("a", true).failing(3));
        let r = DiscoveryRunner::new("g", vec![Arc::clone(&fake) as Arc<dyn Backend>]);
        r.publish(topo(1), Duration::from_secs(10)).await.unwrap();
        let at: Vec<Duration> = fake.calls().iter().map(|c| c.at).collect();
        assert_eq!(at.len(), 4);
        for (i, w) in at.windows(2).enumerate() {
            let gap = w[1] - w[0];
            let full = Backoff::default().delay(i as u32);
            assert!(gap <= full && gap >= full / 2, "retry {i}: gap {gap:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_required_backend_that_never_succeeds_fails_by_the_deadline() {
        let fake = Arc::new(Fake::new("a", true).then(Err(transient(99))));
        let ok = Arc::new(Fake::new("b", true));
        let r = runner(&[&fake, &ok]);
        let start = Instant::now();
        let err = r.fence(fence(3), Duration::from_secs(1)).await.unwrap_err();
        let took = Instant::now() - start;
        // Attempts at 0, 50, 150, 350, 750 ms; the next (1550 ms) would be
        // past the deadline, so the call gives up at 750 ms.
        assert_eq!(fake.calls().len(), 5);
        assert_eq!(took, ms(750));
        assert_eq!(err.op, OpKind::Fence);
        assert_eq!(err.epoch, 3);
        assert_eq!(
            err.failures,
            vec![BackendFailure {
                name: "a".into(),
                reason: FailureReason::Deadline {
                    last: Some(transient(99))
                },
            }]
        );
        assert!(
            err.to_string()
                .contains("a: deadline passed (last error: transient: failure 99)")
        );
        assert_eq!(ok.calls().len(), 1);
        // Required writes stop at the deadline: no background retries.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(fake.calls().len(), 5);
        assert!(!r.status()[0].retrying);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_attempt_is_abandoned_at_the_deadline() {
        let fake = Arc::new(Fake::new("hung", true).slow(Duration::from_secs(3600)));
        let r = runner(&[&fake]);
        let start = Instant::now();
        let err = r
            .publish(topo(1), Duration::from_secs(2))
            .await
            .unwrap_err();
        assert_eq!(Instant::now() - start, Duration::from_secs(2));
        assert!(
            matches!(&err.failures[0].reason, FailureReason::Deadline { last: Some(DiscoveryError::Transient(m)) } if m.contains("during the attempt")),
            "{err:?}"
        );
        assert_eq!(fake.in_flight.load(Ordering::SeqCst), 0, "attempt dropped");
        assert_eq!(r.status()[0].writes_failed, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn stale_and_permanent_answers_are_final() {
        let stale =
            Arc::new(Fake::new("s", true).then(Err(DiscoveryError::Stale { stored: 9, ours: 4 })));
        let perm =
            Arc::new(Fake::new("p", true).then(Err(DiscoveryError::Permanent("401".into()))));
        let r = runner(&[&stale, &perm]);
        let start = Instant::now();
        let err = r
            .publish(topo(4), Duration::from_secs(10))
            .await
            .unwrap_err();
        assert_eq!(Instant::now(), start, "no waiting for final answers");
        assert_eq!(stale.calls().len(), 1);
        assert_eq!(perm.calls().len(), 1);
        assert_eq!(stale_epoch(&err), Some(9));
        assert_eq!(err.failures.len(), 2);
        assert_eq!(
            err.failures[1].reason,
            FailureReason::Backend(DiscoveryError::Permanent("401".into()))
        );
        let st = r.status();
        assert_eq!(st[0].last_result, Some(WriteResult::Stale));
        assert_eq!(st[1].last_result, Some(WriteResult::Permanent));
        assert_eq!(st[1].last_error.as_deref(), Some("permanent: 401"));
    }

    #[tokio::test(start_paused = true)]
    async fn best_effort_backends_do_not_hold_the_call_and_keep_retrying() {
        let required = Arc::new(Fake::new("req", true));
        let best = Arc::new(Fake::new("best", false).failing(7));
        let r = runner(&[&required, &best]);
        let start = Instant::now();
        r.publish(topo(2), ms(100)).await.unwrap();
        assert_eq!(Instant::now(), start);
        // The deadline does not apply: retries go on past it.
        eventually(Duration::from_secs(60), || r.status()[1].writes_ok == 1).await;
        assert_eq!(best.calls().len(), 8);
        let last = best.calls().last().unwrap().at;
        // 50+100+200+400+800+1600+2000 ms, the last delay capped.
        assert_eq!(last, ms(5150));
        assert!(!r.status()[1].retrying);
        // Converged: nothing more happens.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(best.calls().len(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn retrying_is_reported_while_waiting() {
        let best = Arc::new(Fake::new("best", false).failing(3));
        let r = runner(&[&best]);
        r.publish(topo(2), ms(100)).await.unwrap();
        eventually(Duration::from_secs(1), || best.calls().len() == 1).await;
        eventually(Duration::from_secs(1), || r.status()[0].retrying).await;
        let s = &r.status()[0];
        assert_eq!(s.last_result, Some(WriteResult::Transient));
        assert_eq!(s.last_error.as_deref(), Some("transient: failure 0"));
        eventually(Duration::from_secs(5), || !r.status()[0].retrying).await;
        assert_eq!(r.status()[0].writes_ok, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_publish_supersedes_a_retrying_fence() {
        let mut f = Fake::new("best", false).then(Err(transient(1)));
        f.script_fences_only = true;
        let best = Arc::new(f);
        let r = runner(&[&best]);
        r.fence(fence(5), Duration::from_secs(1)).await.unwrap();
        eventually(Duration::from_secs(5), || best.calls().len() >= 4).await;
        r.publish(topo(5), Duration::from_secs(1)).await.unwrap();
        eventually(Duration::from_secs(5), || r.status()[0].writes_ok == 1).await;
        let n = best.calls().len();
        tokio::time::sleep(Duration::from_secs(60)).await;
        let calls = best.calls();
        assert_eq!(calls.len(), n, "the superseded fence stopped retrying");
        assert_eq!(calls.last().unwrap().op, OpKind::Publish);
        assert_eq!(calls.iter().filter(|c| c.op == OpKind::Publish).count(), 1);
        assert!(!r.status()[0].retrying);
    }

    #[tokio::test(start_paused = true)]
    async fn a_higher_epoch_supersedes_a_retrying_publish() {
        let best = Arc::new(Fake::new("best", false).failing(1000));
        let r = runner(&[&best]);
        r.publish(topo(1), ms(1)).await.unwrap();
        eventually(Duration::from_secs(5), || best.calls().len() >= 3).await;
        r.publish(topo(2), ms(1)).await.unwrap();
        eventually(Duration::from_secs(5), || {
            best.calls().iter().filter(|c| c.epoch == 2).count() >= 3
        })
        .await;
        let epoch1 = best.calls().iter().filter(|c| c.epoch == 1).count();
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(
            best.calls().iter().filter(|c| c.epoch == 1).count(),
            epoch1,
            "epoch 1 stopped"
        );
        assert!(best.calls().iter().filter(|c| c.epoch == 2).count() > 3);
        r.shutdown();
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_write_is_refused_without_touching_the_backend() {
        let req = Arc::new(Fake::new("req", true));
        let best = Arc::new(Fake::new("best", false).failing(1000));
        let r = runner(&[&req, &best]);
        r.publish(topo(5), ms(10)).await.unwrap();
        eventually(Duration::from_secs(1), || best.calls().len() >= 2).await;
        let err = r.fence(fence(4), Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(stale_epoch(&err), Some(5));
        assert_eq!(err.failures.len(), 1, "only the required backend is listed");
        // A fence after the publication of the same epoch is older too.
        let err = r.fence(fence(5), Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(stale_epoch(&err), Some(5));
        assert_eq!(req.calls().len(), 1);
        // The best-effort publication of epoch 5 was not cancelled.
        let n = best.calls().len();
        eventually(Duration::from_secs(5), || best.calls().len() > n + 2).await;
        assert!(
            best.calls()
                .iter()
                .all(|c| c.op == OpKind::Publish && c.epoch == 5)
        );
        r.shutdown();
    }

    #[tokio::test(start_paused = true)]
    async fn writes_to_one_backend_never_overlap() {
        let slow = Arc::new(Fake::new("slow", false).slow(ms(300)));
        let r = Arc::new(runner(&[&slow]));
        for epoch in 1..=5 {
            r.publish(topo(epoch), ms(1)).await.unwrap();
            tokio::time::sleep(ms(100)).await;
        }
        eventually(Duration::from_secs(5), || r.status()[0].writes_ok == 1).await;
        assert_eq!(slow.max_in_flight.load(Ordering::SeqCst), 1);
        // Each newer write cancelled the one in flight; only the last finished.
        let finished = slow.finished();
        assert_eq!(finished.len(), 1);
        assert_eq!(finished[0].epoch, 5);
        assert_eq!(slow.calls().len(), 5);
        assert_eq!(r.status()[0].last_epoch, Some(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_write_waits_for_the_backend_to_be_free() {
        // Fence and publish fired together to a slow backend: the publish
        // starts only once the fence's attempt is gone.
        let mut f = Fake::new("slow", true).slow(ms(200));
        f.script_fences_only = true;
        let slow = Arc::new(f);
        let r = runner(&[&slow]);
        let (a, b) = tokio::join!(
            r.fence(fence(7), Duration::from_secs(5)),
            r.publish(topo(7), Duration::from_secs(5)),
        );
        assert_eq!(a.unwrap_err().failures[0].reason, FailureReason::Superseded);
        b.unwrap();
        assert_eq!(slow.max_in_flight.load(Ordering::SeqCst), 1);
        let calls = slow.calls();
        assert_eq!(calls.last().unwrap().op, OpKind::Publish);
        assert_eq!(slow.finished().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn writes_never_overlap_across_worker_threads() {
        // Real time and several workers: a superseded attempt may still be
        // running on one thread while its successor is polled on another.
        let slow = Arc::new(Fake::new("slow", false).slow(ms(2)));
        let r = Arc::new(runner(&[&slow]));
        let mut calls = Vec::new();
        for epoch in 1..=200u64 {
            let r = Arc::clone(&r);
            calls.push(tokio::spawn(async move {
                let _ = r.publish(topo(epoch), ms(1)).await;
            }));
        }
        for c in calls {
            c.await.unwrap();
        }
        let until = Instant::now() + Duration::from_secs(10);
        while r.status()[0].last_epoch != Some(200) || r.status()[0].retrying {
            assert!(Instant::now() < until, "no convergence");
            tokio::time::sleep(ms(5)).await;
        }
        assert_eq!(slow.max_in_flight.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_identical_write_joins_the_pending_one() {
        let fake = Arc::new(Fake::new("a", true).failing(2));
        let r = runner(&[&fake]);
        let (a, b) = tokio::join!(
            r.publish(topo(3), Duration::from_secs(5)),
            r.publish(topo(3), Duration::from_secs(5)),
        );
        a.unwrap();
        b.unwrap();
        assert_eq!(fake.calls().len(), 3, "one write, retried twice");
        assert_eq!(fake.max_in_flight.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_background_retries() {
        let best = Arc::new(Fake::new("best", false).failing(1000));
        let r = runner(&[&best]);
        r.publish(topo(1), ms(1)).await.unwrap();
        eventually(Duration::from_secs(5), || best.calls().len() >= 3).await;
        r.shutdown();
        let n = best.calls().len();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(best.calls().len(), n);
        assert!(!r.status()[0].retrying);
    }

    #[tokio::test(start_paused = true)]
    async fn status_serializes_for_the_http_api() {
        let fake = Arc::new(Fake::new("file:/run/x.json", true).failing(1));
        let r = runner(&[&fake]);
        let before = serde_json::to_value(r.status()).unwrap();
        assert_eq!(before[0]["last_result"], serde_json::Value::Null);
        assert_eq!(before[0]["writes_ok"], 0);
        r.publish(topo(8), Duration::from_secs(1)).await.unwrap();
        let mut v = serde_json::to_value(r.status()).unwrap();
        let at = v[0]["last_ok_at"].as_u64().unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(at <= now && at + 60 > now);
        v[0].as_object_mut().unwrap().remove("last_ok_at");
        assert_eq!(
            v,
            serde_json::json!([{
                "name": "file:/run/x.json",
                "kind": "fake",
                "required": true,
                "last_op": "publish",
                "last_epoch": 8,
                "last_result": "ok",
                "last_error": null,
                "writes_ok": 1,
                "writes_failed": 1,
                "retrying": false,
            }])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_count_every_attempt_by_kind_and_result() {
        use metrics_util::debugging::{DebugValue, DebuggingRecorder};
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _guard = metrics::set_default_local_recorder(&recorder);

        let fake = Arc::new(Fake::new("a", true).failing(2));
        let stale =
            Arc::new(Fake::new("s", false).then(Err(DiscoveryError::Stale { stored: 2, ours: 1 })));
        let r = runner(&[&fake, &stale]);
        r.publish(topo(1), Duration::from_secs(5)).await.unwrap();
        eventually(Duration::from_secs(1), || stale.calls().len() == 1).await;

        let mut counters = std::collections::BTreeMap::new();
        let mut histograms = 0;
        for (key, _unit, _desc, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            match value {
                DebugValue::Counter(n) => {
                    assert_eq!(key.name(), m::DISCOVERY_WRITES);
                    counters.insert(labels.join(","), n);
                }
                DebugValue::Histogram(samples) => {
                    assert_eq!(key.name(), m::DISCOVERY_WRITE_DURATION);
                    assert_eq!(labels, vec!["backend=fake".to_string()]);
                    histograms += samples.len();
                }
                DebugValue::Gauge(_) => panic!("unexpected gauge"),
            }
        }
        let expected: std::collections::BTreeMap<String, u64> = [
            ("backend=fake,result=ok".to_string(), 1),
            ("backend=fake,result=stale".to_string(), 1),
            ("backend=fake,result=transient".to_string(), 2),
        ]
        .into();
        assert_eq!(counters, expected);
        assert_eq!(histograms, 4);
    }
}

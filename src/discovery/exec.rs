//! The exec backend: run a program on every change of master, like Redis
//! Sentinel's `client-reconfig-script`, so that existing scripts work
//! unchanged.
//!
//! On `publish` the configured argv is run (directly, never through a
//! shell) with Sentinel's seven arguments appended:
//!
//! ```text
//! <group> <role> <state> <from-ip> <from-port> <to-ip> <to-port>
//! ```
//!
//! `role` is `leader` or `observer`, `state` is `start`, `from` is the old
//! master and `to` the new one. When there was no old master (the first
//! publication after start-up), `from` is the new master too, so the seven
//! arguments are always there. The same facts, plus the epoch, are in the
//! environment: `PICKET_GROUP`, `PICKET_EPOCH`, `PICKET_EVENT`
//! (`publish`/`fence`), `PICKET_ROLE`, `PICKET_OLD_MASTER`,
//! `PICKET_NEW_MASTER`, `PICKET_REPLICAS` (comma-separated `ip:port`).
//!
//! `fence` runs nothing unless `on_fence = true`: a Sentinel script only
//! knows state `start` and would take a fence for a switch. With it, the
//! program gets `<group> leader fence <old-ip> <old-port> <old-ip>
//! <old-port>` and `PICKET_EVENT=fence`, `PICKET_NEW_MASTER` empty.
//!
//! The program runs in its own process group; when `timeout` passes the
//! whole group is killed (a shell script's children too) and the write is a
//! transient failure.

use std::io;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use super::delivered::Delivered;
use super::{Backend, BoxFuture, DiscoveryError, Fence, Reporter, Topology};
use crate::addr::Addr;
use crate::config::ExecConfig;

/// How much of the program's stderr is kept for the error message.
pub const STDERR_LIMIT: usize = 512;

/// Runs a program on every publication (and, optionally, fence).
#[derive(Debug)]
pub struct ExecBackend {
    program: String,
    args: Vec<String>,
    timeout: Duration,
    required: bool,
    on_fence: bool,
    delivered: Delivered,
}

/// The arguments and environment of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// Sentinel's seven arguments, appended to the configured argv.
    pub args: Vec<String>,
    /// `PICKET_*` variables, added to picket's own environment.
    pub env: Vec<(&'static str, String)>,
}

fn join(addrs: &[Addr]) -> String {
    addrs
        .iter()
        .map(Addr::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl Invocation {
    /// The run for a publication.
    pub fn publish(t: &Topology) -> Self {
        let from = t.old_master.as_ref().unwrap_or(&t.master);
        Invocation {
            args: vec![
                t.group.clone(),
                t.reporter.as_str().to_string(),
                "start".to_string(),
                from.host.clone(),
                from.port.to_string(),
                t.master.host.clone(),
                t.master.port.to_string(),
            ],
            env: vec![
                ("PICKET_GROUP", t.group.clone()),
                ("PICKET_EPOCH", t.epoch.to_string()),
                ("PICKET_EVENT", "publish".to_string()),
                ("PICKET_ROLE", t.reporter.as_str().to_string()),
                (
                    "PICKET_OLD_MASTER",
                    t.old_master
                        .as_ref()
                        .map(Addr::to_string)
                        .unwrap_or_default(),
                ),
                ("PICKET_NEW_MASTER", t.master.to_string()),
                ("PICKET_REPLICAS", join(&t.replicas)),
            ],
        }
    }

    /// The run for a fence (only with `on_fence = true`).
    pub fn fence(f: &Fence) -> Self {
        let old = &f.old_master;
        Invocation {
            args: vec![
                f.group.clone(),
                Reporter::Leader.as_str().to_string(),
                "fence".to_string(),
                old.host.clone(),
                old.port.to_string(),
                old.host.clone(),
                old.port.to_string(),
            ],
            env: vec![
                ("PICKET_GROUP", f.group.clone()),
                ("PICKET_EPOCH", f.epoch.to_string()),
                ("PICKET_EVENT", "fence".to_string()),
                ("PICKET_ROLE", Reporter::Leader.as_str().to_string()),
                ("PICKET_OLD_MASTER", old.to_string()),
                ("PICKET_NEW_MASTER", String::new()),
                ("PICKET_REPLICAS", String::new()),
            ],
        }
    }
}

impl ExecBackend {
    /// A backend for `cfg`. Fails when `command` is empty.
    pub fn new(cfg: &ExecConfig) -> Result<Self, DiscoveryError> {
        let (program, args) = cfg
            .command
            .split_first()
            .ok_or_else(|| DiscoveryError::Permanent("exec backend: empty command".into()))?;
        Ok(ExecBackend {
            program: program.clone(),
            args: args.to_vec(),
            timeout: cfg.timeout,
            required: cfg.required,
            on_fence: cfg.on_fence,
            delivered: Delivered::default(),
        })
    }

    /// Run the program once with `inv`, bounded by the timeout.
    pub async fn run(&self, inv: &Invocation) -> Result<(), DiscoveryError> {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .args(&inv.args)
            .envs(inv.env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Its own group, so that a timeout kills what it started too.
            .process_group(0)
            // If this future is dropped (a newer write superseded it), the
            // program must not outlive it.
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| self.spawn_error(&e))?;
        // Declared after `child`, so dropped before it: the group is
        // killed while its leader is not yet reaped (its id not reusable).
        let mut group = GroupKiller(child.id());
        let stderr = child.stderr.take();

        let waited = tokio::time::timeout(self.timeout, async {
            let head = read_head(stderr, STDERR_LIMIT);
            let (status, head) = tokio::join!(child.wait(), head);
            (status, head)
        })
        .await;

        match waited {
            Err(_elapsed) => {
                group.kill();
                // SIGKILL cannot be ignored; reap it so no zombie is left.
                // Bounded in case it is stuck in the kernel: kill_on_drop
                // and tokio's orphan reaping take over then.
                let _ = tokio::time::timeout(Duration::from_secs(1), child.kill()).await;
                Err(DiscoveryError::Transient(format!(
                    "exec {}: timed out after {}",
                    self.program,
                    humantime::format_duration(self.timeout)
                )))
            }
            Ok((Err(e), _)) => {
                group.kill();
                Err(DiscoveryError::Transient(format!(
                    "exec {}: wait failed: {e}",
                    self.program
                )))
            }
            Ok((Ok(status), head)) => {
                // Reaped: nothing left to kill by this id.
                group.disarm();
                check_status(&self.program, status, &head)
            }
        }
    }

    fn spawn_error(&self, e: &io::Error) -> DiscoveryError {
        let msg = format!("exec {}: cannot start: {e}", self.program);
        match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied => {
                DiscoveryError::Permanent(msg)
            }
            _ => DiscoveryError::Transient(msg),
        }
    }
}

fn check_status(program: &str, status: ExitStatus, stderr: &[u8]) -> Result<(), DiscoveryError> {
    if status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    Err(DiscoveryError::Transient(if text.is_empty() {
        format!("exec {program}: {status}")
    } else {
        format!("exec {program}: {status}: {text}")
    }))
}

/// Keeps the first `limit` bytes and drains the rest, so that a chatty
/// program never blocks on a full pipe.
async fn read_head(r: Option<impl AsyncRead + Unpin>, limit: usize) -> Vec<u8> {
    let mut head = Vec::new();
    let Some(mut r) = r else { return head };
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return head,
            Ok(n) => {
                let take = n.min(limit - head.len());
                head.extend_from_slice(&buf[..take]);
            }
        }
    }
}

/// SIGKILLs a process group when dropped, unless disarmed.
struct GroupKiller(Option<u32>);

impl GroupKiller {
    fn kill(&mut self) {
        if let Some(pid) = self.0.take() {
            let pid = i32::try_from(pid)
                .ok()
                .and_then(rustix::process::Pid::from_raw);
            if let Some(pid) = pid {
                // ESRCH only means the group is already gone.
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
        }
    }

    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GroupKiller {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Backend for ExecBackend {
    fn kind(&self) -> &'static str {
        "exec"
    }

    fn name(&self) -> String {
        format!("exec:{}", self.program)
    }

    fn required(&self) -> bool {
        self.required
    }

    fn fence<'a>(&'a self, fence: &'a Fence) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        Box::pin(async move {
            if !self.on_fence || !self.delivered.check_fence(fence)? {
                return Ok(());
            }
            self.run(&Invocation::fence(fence)).await?;
            self.delivered.record_fence(fence);
            Ok(())
        })
    }

    fn publish<'a>(&'a self, t: &'a Topology) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        Box::pin(async move {
            if !self.delivered.check_publish(t)? {
                return Ok(());
            }
            self.run(&Invocation::publish(t)).await?;
            self.delivered.record_publish(t);
            Ok(())
        })
    }
}

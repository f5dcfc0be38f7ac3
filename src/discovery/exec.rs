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
            if !self.on_fence {
                return Ok(());
            }
            self.delivered
                .fence_once(fence, || async move {
                    self.run(&Invocation::fence(fence)).await
                })
                .await
        })
    }

    fn publish<'a>(&'a self, t: &'a Topology) -> BoxFuture<'a, Result<(), DiscoveryError>> {
        Box::pin(async move {
            // Run once per outcome, as Sentinel's client-reconfig-script:
            // a change of the linked replicas within an epoch (a member
            // attached, a replica lost) does not run it again.
            let routing = Topology {
                replicas: Vec::new(),
                ..t.clone()
            };
            self.delivered
                .publish_once(&routing, || async move {
                    self.run(&Invocation::publish(t)).await
                })
                .await
        })
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;

    use tokio::time::Instant;

    use super::*;
    use crate::discovery::runner::DiscoveryRunner;

    /// A shell script in a temp dir, run as `/bin/sh script` (running the
    /// file itself can fail with ETXTBSY while another test thread forks).
    struct Script {
        dir: tempfile::TempDir,
        path: PathBuf,
    }

    impl Script {
        fn new(body: &str) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("reconfig.sh");
            let body = body.replace("$DIR", &dir.path().display().to_string());
            fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            Script { dir, path }
        }

        fn file(&self, name: &str) -> PathBuf {
            self.dir.path().join(name)
        }

        fn read(&self, name: &str) -> String {
            fs::read_to_string(self.file(name)).unwrap()
        }

        fn config(&self, extra: &[&str], timeout: Duration, on_fence: bool) -> ExecConfig {
            let mut command = vec!["/bin/sh".to_string(), self.path.display().to_string()];
            command.extend(extra.iter().map(|s| s.to_string()));
            ExecConfig {
                command,
                timeout,
                required: true,
                on_fence,
            }
        }

        fn backend(&self, extra: &[&str]) -> ExecBackend {
            ExecBackend::new(&self.config(extra, Duration::from_secs(10), false)).unwrap()
        }

        fn runs(&self) -> usize {
            fs::read_to_string(self.file("count"))
                .map(|s| s.lines().count())
                .unwrap_or(0)
        }
    }

    /// Records its argv (one per line) and PICKET_* environment.
    const RECORD: &str = r#"for a in "$@"; do printf '%s\n' "$a"; done > "$DIR/args"
env | grep '^PICKET_' | LC_ALL=C sort > "$DIR/env"
echo run >> "$DIR/count""#;

    fn topo(epoch: u64, old: Option<&str>, reporter: Reporter) -> Topology {
        Topology {
            group: "cache".into(),
            epoch,
            master: "10.0.0.2:6380".parse().unwrap(),
            old_master: old.map(|o| o.parse().unwrap()),
            replicas: vec![
                "10.0.0.3:6379".parse().unwrap(),
                "10.0.0.4:6379".parse().unwrap(),
            ],
            reporter,
        }
    }

    fn lines(s: &str) -> Vec<&str> {
        s.lines().collect()
    }

    /// Whether `pid` is a live (not zombie) process.
    fn alive(pid: i32) -> bool {
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        state.is_some_and(|c| c != 'Z' && c != 'X')
    }

    /// Kills, by PID, whatever a test's scripts started, if still alive.
    struct PidGuard(Vec<PathBuf>);

    impl Drop for PidGuard {
        fn drop(&mut self) {
            for f in &self.0 {
                let pid = fs::read_to_string(f)
                    .ok()
                    .and_then(|s| s.trim().parse::<i32>().ok());
                if let Some(pid) = pid.filter(|p| alive(*p))
                    && let Some(pid) = rustix::process::Pid::from_raw(pid)
                {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
        }
    }

    fn read_pid(path: &Path) -> i32 {
        fs::read_to_string(path).unwrap().trim().parse().unwrap()
    }

    async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) {
        let until = Instant::now() + limit;
        while !cond() {
            assert!(Instant::now() < until, "condition not met within {limit:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn publish_passes_sentinel_arguments_and_environment() {
        let s = Script::new(RECORD);
        let b = s.backend(&["--flag", "two words"]);
        b.publish(&topo(7, Some("10.0.0.1:6379"), Reporter::Leader))
            .await
            .unwrap();
        assert_eq!(
            lines(&s.read("args")),
            vec![
                "--flag",
                "two words",
                "cache",
                "leader",
                "start",
                "10.0.0.1",
                "6379",
                "10.0.0.2",
                "6380"
            ]
        );
        assert_eq!(
            lines(&s.read("env")),
            vec![
                "PICKET_EPOCH=7",
                "PICKET_EVENT=publish",
                "PICKET_GROUP=cache",
                "PICKET_NEW_MASTER=10.0.0.2:6380",
                "PICKET_OLD_MASTER=10.0.0.1:6379",
                "PICKET_REPLICAS=10.0.0.3:6379,10.0.0.4:6379",
                "PICKET_ROLE=leader",
            ]
        );
    }

    #[tokio::test]
    async fn without_an_old_master_from_is_the_new_master() {
        let s = Script::new(RECORD);
        let b = s.backend(&[]);
        let mut t = topo(1, None, Reporter::Observer);
        t.replicas.clear();
        b.publish(&t).await.unwrap();
        assert_eq!(
            lines(&s.read("args")),
            vec![
                "cache", "observer", "start", "10.0.0.2", "6380", "10.0.0.2", "6380"
            ]
        );
        assert_eq!(
            lines(&s.read("env")),
            vec![
                "PICKET_EPOCH=1",
                "PICKET_EVENT=publish",
                "PICKET_GROUP=cache",
                "PICKET_NEW_MASTER=10.0.0.2:6380",
                "PICKET_OLD_MASTER=",
                "PICKET_REPLICAS=",
                "PICKET_ROLE=observer",
            ]
        );
    }

    #[tokio::test]
    async fn fence_runs_nothing_unless_on_fence() {
        let s = Script::new(RECORD);
        let f = Fence {
            group: "cache".into(),
            epoch: 4,
            old_master: "10.0.0.1:6379".parse().unwrap(),
        };
        s.backend(&[]).fence(&f).await.unwrap();
        assert_eq!(s.runs(), 0);

        let b = ExecBackend::new(&s.config(&[], Duration::from_secs(10), true)).unwrap();
        b.fence(&f).await.unwrap();
        assert_eq!(s.runs(), 1);
        assert_eq!(
            lines(&s.read("args")),
            vec![
                "cache", "leader", "fence", "10.0.0.1", "6379", "10.0.0.1", "6379"
            ]
        );
        assert_eq!(
            lines(&s.read("env")),
            vec![
                "PICKET_EPOCH=4",
                "PICKET_EVENT=fence",
                "PICKET_GROUP=cache",
                "PICKET_NEW_MASTER=",
                "PICKET_OLD_MASTER=10.0.0.1:6379",
                "PICKET_REPLICAS=",
                "PICKET_ROLE=leader",
            ]
        );
    }

    #[tokio::test]
    async fn same_epoch_and_routing_runs_once_and_lower_epochs_are_refused() {
        let s = Script::new(RECORD);
        let b = s.backend(&[]);
        b.publish(&topo(5, Some("10.0.0.1:6379"), Reporter::Leader))
            .await
            .unwrap();
        b.publish(&topo(5, Some("10.0.0.1:6379"), Reporter::Leader))
            .await
            .unwrap();
        b.publish(&topo(5, None, Reporter::Observer)).await.unwrap();
        assert_eq!(s.runs(), 1);
        let err = b
            .publish(&topo(4, None, Reporter::Observer))
            .await
            .unwrap_err();
        assert_eq!(err, DiscoveryError::Stale { stored: 5, ours: 4 });
        assert_eq!(s.runs(), 1);
        b.publish(&topo(6, None, Reporter::Observer)).await.unwrap();
        assert_eq!(s.runs(), 2);
    }

    #[tokio::test]
    async fn timeout_kills_the_program_and_its_children() {
        let s = Script::new(
            r#"echo $$ > "$DIR/shell.pid"
sleep 60 &
echo $! > "$DIR/sleep.pid"
wait"#,
        );
        let _guard = PidGuard(vec![s.file("shell.pid"), s.file("sleep.pid")]);
        let b = ExecBackend::new(&s.config(&[], Duration::from_secs(1), false)).unwrap();
        let start = Instant::now();
        let err = b
            .publish(&topo(1, None, Reporter::Leader))
            .await
            .unwrap_err();
        let took = Instant::now() - start;
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(6),
            "took {took:?}"
        );
        assert!(
            matches!(&err, DiscoveryError::Transient(m) if m.ends_with("timed out after 1s")),
            "{err:?}"
        );
        let shell = read_pid(&s.file("shell.pid"));
        let sleep = read_pid(&s.file("sleep.pid"));
        wait_until(Duration::from_secs(5), || !alive(shell) && !alive(sleep)).await;
        // A failed run is not remembered: the same write is tried again.
        let err2 = b
            .publish(&topo(1, None, Reporter::Leader))
            .await
            .unwrap_err();
        assert!(matches!(err2, DiscoveryError::Transient(_)));
    }

    #[tokio::test]
    async fn a_dropped_write_kills_the_program() {
        let s = Script::new(
            r#"echo $$ > "$DIR/shell.pid"
sleep 60 &
echo $! > "$DIR/sleep.pid"
wait"#,
        );
        let _guard = PidGuard(vec![s.file("shell.pid"), s.file("sleep.pid")]);
        let b = s.backend(&[]);
        let t = topo(1, None, Reporter::Leader);
        let pid_file = s.file("sleep.pid");
        tokio::select! {
            r = b.publish(&t) => panic!("finished: {r:?}"),
            _ = wait_until(Duration::from_secs(5), || {
                fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
            }) => {}
        }
        // The publish future is dropped here, as when a newer write
        // supersedes it.
        let shell = read_pid(&s.file("shell.pid"));
        let sleep = read_pid(&pid_file);
        wait_until(Duration::from_secs(5), || !alive(shell) && !alive(sleep)).await;
    }

    #[tokio::test]
    async fn non_zero_exit_reports_status_and_stderr() {
        let s = Script::new(r#"echo "boom: $3 went wrong" >&2; exit 3"#);
        let err = s
            .backend(&[])
            .publish(&topo(1, None, Reporter::Leader))
            .await
            .unwrap_err();
        let DiscoveryError::Transient(m) = &err else {
            panic!("{err:?}")
        };
        assert!(m.ends_with("exit status: 3: boom: start went wrong"), "{m}");
    }

    #[tokio::test]
    async fn only_the_first_512_bytes_of_stderr_are_kept() {
        let s = Script::new(r#"head -c 100000 /dev/zero | tr '\0' x >&2; exit 1"#);
        let err = s
            .backend(&[])
            .publish(&topo(1, None, Reporter::Leader))
            .await
            .unwrap_err();
        let DiscoveryError::Transient(m) = &err else {
            panic!("{err:?}")
        };
        let run = m.rsplit(": ").next().unwrap();
        assert_eq!(run, "x".repeat(STDERR_LIMIT), "{m}");
    }

    #[tokio::test]
    async fn a_missing_program_is_permanent() {
        let dir = tempfile::tempdir().unwrap();
        let b = ExecBackend::new(&ExecConfig {
            command: vec![dir.path().join("nope").display().to_string()],
            timeout: Duration::from_secs(1),
            required: false,
            on_fence: false,
        })
        .unwrap();
        let err = b
            .publish(&topo(1, None, Reporter::Leader))
            .await
            .unwrap_err();
        assert!(matches!(err, DiscoveryError::Permanent(_)), "{err:?}");
        let empty = ExecBackend::new(&ExecConfig {
            command: vec![],
            timeout: Duration::from_secs(1),
            required: false,
            on_fence: false,
        });
        assert!(matches!(empty, Err(DiscoveryError::Permanent(_))));
    }

    #[tokio::test]
    async fn the_runner_retries_a_failing_program() {
        let s = Script::new(
            r#"echo run >> "$DIR/count"
n=$(wc -l < "$DIR/count")
[ "$n" -ge 3 ] || { echo "attempt $n fails" >&2; exit 1; }"#,
        );
        let b: Arc<dyn Backend> = Arc::new(s.backend(&[]));
        let r = DiscoveryRunner::new("cache", vec![b]);
        r.publish(topo(1, None, Reporter::Leader), Duration::from_secs(20))
            .await
            .unwrap();
        assert_eq!(s.runs(), 3);
        let st = &r.status()[0];
        assert_eq!(st.writes_failed, 2);
        assert_eq!(st.writes_ok, 1);
        assert_eq!(st.kind, "exec");
        assert_eq!(st.name, "exec:/bin/sh");
    }
}

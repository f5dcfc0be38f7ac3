//! The processes the benchmark starts (redis-server, redis-sentinel, picket,
//! its own target server), each killed by PID when dropped, and small
//! helpers to talk RESP to them and to wait for conditions.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use picket::resp::{ClientOptions, Connection, RespError, frame_text};
use redis_protocol::resp2::types::BytesFrame;
use tokio::time::Instant;

/// A child process, killed (SIGKILL, by PID) and reaped when dropped.
pub struct Proc {
    /// A name for messages.
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// Start `program args...` with stdout and stderr appended to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> anyhow::Result<Proc> {
        let mut p = Proc {
            name: name.to_string(),
            program: program.to_path_buf(),
            args: args.to_vec(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log: log.to_path_buf(),
            child: None,
        };
        p.start()?;
        Ok(p)
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let out = open_log(&self.log)?;
        let err = out
            .try_clone()
            .with_context(|| format!("{}", self.log.display()))?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {} ({})", self.name, self.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// Start the same command again (after [`Proc::kill9`]).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill9();
        self.start()
    }

    /// The PID while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL (by PID) and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The last `n` lines of its log, for error messages.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn open_log(path: &Path) -> anyhow::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))
}

/// A port free on `ip` right now (bound with port 0, then released).
pub fn free_port(ip: &str) -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind((ip, 0)).with_context(|| format!("bind {ip}:0"))?;
    Ok(l.local_addr()?.port())
}

/// Poll `cond` every `every` until it is true; fail with `desc` after
/// `timeout`. The condition is checked once more at the deadline.
pub async fn wait_until<F, Fut>(
    desc: &str,
    timeout: Duration,
    every: Duration,
    mut cond: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {desc}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Client options for the benchmark's own checks.
pub fn opts(timeout: Duration) -> ClientOptions {
    ClientOptions {
        connect_timeout: timeout,
        command_timeout: timeout,
        ..Default::default()
    }
}

/// One command on a fresh connection.
pub async fn cmd(addr: &str, args: &[&str], timeout: Duration) -> Result<BytesFrame, RespError> {
    let mut c = Connection::connect(addr, &opts(timeout)).await?;
    c.call(args).await
}

/// How to reach the managers' Sentinel-compatible API: plaintext without a
/// password, or (picket with `[daemon.tls]`) TLS with a client
/// certificate and the default user's password.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// TLS towards the managers.
    pub tls: Option<picket::resp::client::TlsClient>,
    /// `AUTH <password>`.
    pub password: Option<String>,
}

impl Access {
    /// Connection options with `timeout`.
    pub fn opts(&self, timeout: Duration) -> ClientOptions {
        ClientOptions {
            tls: self.tls.clone(),
            password: self.password.clone(),
            ..opts(timeout)
        }
    }

    /// One command on a fresh connection.
    pub async fn cmd(
        &self,
        addr: &str,
        args: &[&str],
        timeout: Duration,
    ) -> Result<BytesFrame, RespError> {
        let mut c = Connection::connect(addr, &self.opts(timeout)).await?;
        c.call(args).await
    }
}

/// A field of `INFO section`, on a fresh connection.
pub async fn info_field(addr: &str, section: &str, key: &str) -> Option<String> {
    let reply = cmd(addr, &["INFO", section], Duration::from_millis(500))
        .await
        .ok()?;
    let text = frame_text(&reply)?;
    info_value(&text, key)
}

/// A field of an INFO text.
pub fn info_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.trim().to_string())
    })
}

/// `SENTINEL get-master-addr-by-name` on one connection.
pub async fn master_of(c: &mut Connection, group: &str) -> Option<String> {
    match c.call(["SENTINEL", "get-master-addr-by-name", group]).await {
        Ok(BytesFrame::Array(v)) => {
            let h = v.first().and_then(frame_text)?;
            let p = v.get(1).and_then(frame_text)?;
            Some(format!("{h}:{p}"))
        }
        _ => None,
    }
}

/// A flat `[k, v, k, v, ...]` reply (SENTINEL MASTER) as pairs.
pub fn pairs(frame: &BytesFrame) -> Vec<(String, String)> {
    let BytesFrame::Array(v) = frame else {
        return Vec::new();
    };
    v.chunks(2)
        .filter_map(|kv| match kv {
            [k, v] => Some((frame_text(k)?, frame_text(v)?)),
            _ => None,
        })
        .collect()
}

/// Resident set size (kB) and CPU time (user + system, clock ticks) of a
/// process, from `/proc/PID/status` and `/proc/PID/stat`.
pub fn proc_usage(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces: count from the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) and stime (15) are at 11, 12.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((rss, utime + stime))
}

/// Clock ticks per second of `/proc/PID/stat` (USER_HZ): 100 on every
/// Linux architecture the benchmark runs on.
pub const USER_HZ: f64 = 100.0;

/// Raise this process's open-file limit (inherited by what it starts) to at
/// least `want`, the hard limit too when allowed (root); returns the soft
/// limit in force afterwards. At 10,000 instances the stand-in needs a
/// listener and a connection per instance (and Sentinel a second one),
/// beyond the usual 20,000.
pub fn raise_nofile(want: u64) -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let cur = getrlimit(Resource::Nofile);
    let soft = cur.current.unwrap_or(u64::MAX);
    if soft >= want {
        return soft;
    }
    let hard = cur.maximum.unwrap_or(u64::MAX);
    let raised = Rlimit {
        current: Some(want),
        maximum: Some(hard.max(want)),
    };
    if setrlimit(Resource::Nofile, raised).is_ok() {
        return want;
    }
    // Not allowed above the hard limit: as far as it goes.
    let capped = Rlimit {
        current: Some(hard.min(want)),
        maximum: cur.maximum,
    };
    if setrlimit(Resource::Nofile, capped).is_ok() {
        hard.min(want)
    } else {
        soft
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_usage() {
        let (rss, ticks) = proc_usage(std::process::id()).unwrap();
        assert!(rss > 0);
        // Burn some CPU so the counter moves.
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        let (_, later) = proc_usage(std::process::id()).unwrap();
        assert!(later >= ticks);
    }

    #[test]
    fn info_values() {
        let t = "# Replication\r\nrole:slave\r\nmaster_host:127.0.0.2\r\n";
        assert_eq!(info_value(t, "role").as_deref(), Some("slave"));
        assert_eq!(info_value(t, "master_host").as_deref(), Some("127.0.0.2"));
        assert_eq!(info_value(t, "nope"), None);
    }
}

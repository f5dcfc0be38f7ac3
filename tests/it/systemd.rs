//! Running under systemd: the unit file passes `systemd-analyze verify`, and
//! the notify protocol is spoken over a NOTIFY_SOCKET the test owns (a unix
//! datagram socket it binds and reads): READY=1 only once both listeners
//! accept connections, WATCHDOG=1 periodically when WATCHDOG_USEC is set
//! (and never otherwise), RELOADING=1 then READY=1 around a SIGHUP, and
//! STOPPING=1 on SIGTERM.

use picket_harness::ops_support;

use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ops_support::{Ports, group_table};
use picket_harness::{PicketProcess, RedisOpts, RedisServer};

const UNIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/picket.service");

/// The unit with its binary path pointed at the binary under test, written
/// to `dir`: `systemd-analyze verify` insists that ExecStart exists.
fn unit_copy(dir: &Path, transform: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(UNIT).unwrap();
    let text = transform(text.replace("/usr/local/bin/picket", env!("CARGO_BIN_EXE_picket")));
    let path = dir.join("picket.service");
    std::fs::write(&path, text).unwrap();
    path
}

/// `systemd-analyze verify`: exit status and everything it printed.
fn verify(unit: &Path) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(unit)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run systemd-analyze ({e}); install systemd (apt-get install systemd)")
        });
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_unit_passes_systemd_analyze_verify_without_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, output) = verify(&unit_copy(dir.path(), |t| t));
    assert!(ok, "systemd-analyze verify failed:\n{output}");
    // verify exits 0 for unknown keys and bad values, printing a warning:
    // any output at all is a finding.
    assert!(
        output.trim().is_empty(),
        "systemd-analyze verify:\n{output}"
    );

    // The check above can fail: a typo is reported.
    let (_, output) = verify(&unit_copy(dir.path(), |t| {
        t.replace("ProtectSystem=strict", "ProtectSytem=strict")
    }));
    assert!(output.contains("ProtectSytem"), "{output}");
}

/// Every `Key=value` of the `[Service]` section.
fn service_settings() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(UNIT).unwrap();
    let mut in_service = false;
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service
            && !line.starts_with('#')
            && let Some((k, v)) = line.split_once('=')
        {
            out.push((k.to_string(), v.to_string()));
        }
    }
    out
}

#[test]
fn the_unit_runs_picket_as_a_hardened_notify_service() {
    let settings = service_settings();
    let get = |key: &str| -> Vec<&str> {
        settings
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    let expect = [
        ("Type", "notify"),
        ("Restart", "on-failure"),
        ("DynamicUser", "yes"),
        ("StateDirectory", "picket"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
        ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
        ("SystemCallFilter", "@system-service"),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("LockPersonality", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("WatchdogSec", "10s"),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
        (
            "ExecStart",
            "/usr/local/bin/picket run --config /etc/picket/picket.toml",
        ),
    ];
    for (key, value) in expect {
        assert!(
            get(key).contains(&value),
            "{key}={value} missing; found {:?}",
            get(key)
        );
    }
    // The default data_dir is the state directory systemd creates.
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/picket.toml"))
            .unwrap();
    assert!(example.contains("data_dir = \"/var/lib/picket\""));
}

/// A datagram socket standing in for systemd's.
struct NotifySocket {
    _dir: tempfile::TempDir,
    path: PathBuf,
    sock: UnixDatagram,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = tempfile::Builder::new()
            .prefix("picket-notify-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        NotifySocket {
            _dir: dir,
            path,
            sock,
        }
    }

    /// The next datagram, or None after `timeout`.
    fn recv(&self, timeout: Duration) -> Option<String> {
        self.sock.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = [0u8; 4096];
        match self.sock.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("recv on the notify socket: {e}"),
        }
    }

    /// Datagrams until one contains `line` (as a whole line), within
    /// `timeout`; returns every datagram read, the matching one last.
    fn until(&self, line: &str, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                panic!("no {line:?} within {timeout:?}; got {got:?}");
            }
            if let Some(msg) = self.recv(left) {
                let hit = msg.lines().any(|l| l == line);
                got.push(msg);
                if hit {
                    return got;
                }
            }
        }
    }

    /// Every datagram received during `window`.
    fn collect(&self, window: Duration) -> Vec<String> {
        let deadline = Instant::now() + window;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return got;
            }
            if let Some(msg) = self.recv(left) {
                got.push(msg);
            }
        }
    }
}

fn start_picket(
    notify: &NotifySocket,
    env: &[(&str, &str)],
) -> (PicketProcess, Ports, RedisServer) {
    let redis = RedisServer::start_fresh(RedisOpts::default());
    let ports = Ports::fresh();
    let path = notify.path.to_str().unwrap().to_string();
    let mut envs: Vec<(&str, &str)> = vec![("NOTIFY_SOCKET", path.as_str())];
    envs.extend_from_slice(env);
    let p = PicketProcess::start_with(
        |dir| {
            format!(
                "{}{}",
                ports.daemon_table("notify-a", &dir.join("data")),
                group_table("cache", redis.addr(), "")
            )
        },
        &[],
        &envs,
    );
    (p, ports, redis)
}

fn count(msgs: &[String], line: &str) -> usize {
    msgs.iter().filter(|m| m.lines().any(|l| l == line)).count()
}

#[test]
fn ready_after_the_ports_are_bound_watchdog_pings_and_stopping_on_sigterm() {
    let notify = NotifySocket::bind();
    // 300 ms: a ping every 150 ms.
    let (mut p, ports, _redis) = start_picket(&notify, &[("WATCHDOG_USEC", "300000")]);
    let got = notify.until("READY=1", Duration::from_secs(15));
    // Checked right after READY=1 arrived: both listeners accept.
    TcpStream::connect_timeout(&ports.resp, Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("RESP port not bound at READY=1: {e}\n{}", p.logs()));
    TcpStream::connect_timeout(&ports.http, Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("HTTP port not bound at READY=1: {e}\n{}", p.logs()));
    let ready = got.last().unwrap();
    assert!(
        ready
            .lines()
            .any(|l| l == "STATUS=1 group, 0/0 peers reachable"),
        "{ready:?}"
    );
    assert_eq!(
        count(&got, "WATCHDOG=1"),
        0,
        "no ping before READY: {got:?}"
    );

    let window = Duration::from_millis(1500);
    let pings = count(&notify.collect(window), "WATCHDOG=1");
    // About 10 expected; a loaded machine may delay a few.
    assert!((4..=12).contains(&pings), "{pings} pings in {window:?}");

    p.sigterm();
    notify.until("STOPPING=1", Duration::from_secs(5));
    let (exit, killed) = p.stop().expect("was running");
    assert!(exit.success() && !killed, "{exit:?}\n{}", p.logs());
}

#[test]
fn no_watchdog_pings_unless_asked_for_this_process() {
    let notify = NotifySocket::bind();
    // WATCHDOG_PID names another process (init): the watchdog is not ours.
    let (p, _ports, _redis) = start_picket(
        &notify,
        &[("WATCHDOG_USEC", "200000"), ("WATCHDOG_PID", "1")],
    );
    notify.until("READY=1", Duration::from_secs(15));
    let after = notify.collect(Duration::from_millis(1200));
    assert_eq!(count(&after, "WATCHDOG=1"), 0, "{after:?}\n{}", p.logs());
}

#[test]
fn sighup_reports_reloading_then_ready() {
    let notify = NotifySocket::bind();
    let (p, _ports, _redis) = start_picket(&notify, &[]);
    notify.until("READY=1", Duration::from_secs(15));
    let pid = i32::try_from(p.pid().unwrap()).unwrap();
    kill(Pid::from_raw(pid), Signal::SIGHUP).unwrap();
    let got = notify.until("RELOADING=1", Duration::from_secs(5));
    let reloading = got.last().unwrap();
    let usec = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .unwrap_or_else(|| panic!("RELOADING=1 without MONOTONIC_USEC: {reloading:?}"));
    assert!(usec.parse::<u64>().is_ok_and(|u| u > 0), "{usec}");
    let got = notify.until("READY=1", Duration::from_secs(5));
    assert!(
        got.last()
            .unwrap()
            .contains("STATUS=1 group, 0/0 peers reachable"),
        "{got:?}"
    );
    assert!(p.logs().contains("configuration reloaded"), "{}", p.logs());
}

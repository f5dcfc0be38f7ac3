//! Network partitions on one host, made with iptables rules of their own.
//!
//! The servers of a benchmark or test each listen on an address of their own
//! (127.x.y.z), but every unbound client socket leaves from 127.0.0.1, so
//! senders cannot be told apart by address alone. A [`Partition`] therefore
//! names what it cuts by the server's `ip:port` (its listening socket is
//! unique) and by the *source* addresses of the clients that must stay on
//! its side, which bind their sockets to an address of their own
//! (`picket::resp::Connection::connect_from`, Redis' `bind-source-addr`).
//! Every rule names one of those addresses and ports, so nothing else on the
//! machine is touched, and the rules live in a chain of their own, jumped to
//! from `OUTPUT` (loopback packets traverse `OUTPUT` once): healing flushes
//! the chain, dropping the [`Partition`] removes it.
//!
//! Packets are dropped, not refused: both sides see a silent network, as in
//! a real partition, and established connections survive the heal.
//!
//! Needs root and iptables. Part of the bench's library, which picket's
//! tests use through the harness.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A set of iptables rules in a chain of their own.
#[derive(Debug)]
pub struct Partition {
    chain: String,
    jumped: bool,
}

/// Run `iptables -w ARGS`; its error output on failure.
pub fn iptables(args: &[&str]) -> Result<(), String> {
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .map_err(|e| format!("iptables: {e} (is iptables installed?)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "iptables {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn host(ip: IpAddr) -> Result<String, String> {
    match ip {
        IpAddr::V4(v4) => Ok(format!("{v4}/32")),
        IpAddr::V6(_) => Err(format!("{ip}: only IPv4 partitions are supported")),
    }
}

impl Partition {
    /// An empty chain (nothing cut yet), jumped to from `OUTPUT`.
    pub fn new() -> Result<Partition, String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        // iptables chain names have at most 28 characters.
        let chain = format!(
            "picket-part-{}-{}",
            std::process::id() % 1_000_000,
            NEXT.fetch_add(1, Ordering::SeqCst) % 1000
        );
        iptables(&["-N", &chain])?;
        let mut p = Partition {
            chain,
            jumped: false,
        };
        iptables(&["-I", "OUTPUT", "-j", &p.chain])?;
        p.jumped = true;
        Ok(p)
    }

    fn add(&self, rule: &[&str]) -> Result<(), String> {
        let mut args = vec!["-A", self.chain.as_str()];
        args.extend_from_slice(rule);
        iptables(&args)
    }

    /// Isolate `server` with the clients whose sockets leave from `side`:
    /// only they reach it and it reaches only them, and they reach none of
    /// `others` (the daemons a client on the server's side could otherwise
    /// still ask for the master).
    pub fn isolate(
        &self,
        server: SocketAddr,
        side: &[IpAddr],
        others: &[SocketAddr],
    ) -> Result<(), String> {
        let (ip, port) = (host(server.ip())?, server.port().to_string());
        for c in side {
            let c = host(*c)?;
            self.add(&[
                "-p", "tcp", "-s", &c, "-d", &ip, "--dport", &port, "-j", "RETURN",
            ])?;
            self.add(&[
                "-p", "tcp", "-s", &ip, "--sport", &port, "-d", &c, "-j", "RETURN",
            ])?;
            for o in others {
                self.add(&[
                    "-p",
                    "tcp",
                    "-s",
                    &c,
                    "-d",
                    &host(o.ip())?,
                    "--dport",
                    &o.port().to_string(),
                    "-j",
                    "DROP",
                ])?;
            }
        }
        self.add(&["-p", "tcp", "-d", &ip, "--dport", &port, "-j", "DROP"])?;
        self.add(&["-p", "tcp", "-s", &ip, "--sport", &port, "-j", "DROP"])
    }

    /// Cut `server` off from the clients whose sockets leave from `from`
    /// (e.g. replicas started with `bind-source-addr`), in both directions.
    pub fn cut(&self, server: SocketAddr, from: &[IpAddr]) -> Result<(), String> {
        let (ip, port) = (host(server.ip())?, server.port().to_string());
        for c in from {
            let c = host(*c)?;
            self.add(&[
                "-p", "tcp", "-s", &c, "-d", &ip, "--dport", &port, "-j", "DROP",
            ])?;
            self.add(&[
                "-p", "tcp", "-s", &ip, "--sport", &port, "-d", &c, "-j", "DROP",
            ])?;
        }
        Ok(())
    }

    /// Remove every rule: the partition heals (the chain stays, empty).
    pub fn heal(&self) -> Result<(), String> {
        iptables(&["-F", &self.chain])
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        let _ = iptables(&["-F", &self.chain]);
        if self.jumped {
            let _ = iptables(&["-D", "OUTPUT", "-j", &self.chain]);
        }
        let _ = iptables(&["-X", &self.chain]);
    }
}

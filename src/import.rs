//! `picket import`: turn a Sentinel deployment (its `sentinel.conf` files,
//! or a live Sentinel's answers) into one picket configuration per
//! Sentinel it replaces, with the state each daemon starts from (the
//! config epochs and current masters) and the secret files the
//! configurations name.
//!
//! Reading is split from writing: [`parse_conf`] and [`live_source`] each
//! give a [`Source`]; [`plan`] merges the sources into a [`Plan`] (pure);
//! [`Plan::write`] writes the files. Every Sentinel setting that is not
//! carried over is recorded in [`Plan::skipped`] with the reason, for the
//! command to print.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::quorum::state::{GroupRecord, StateStore};
use crate::resp::{ClientOptions, Connection};

/// Why an import cannot be done.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A configuration line is not understood.
    #[error("{source_name}:{line}: {reason}")]
    Parse {
        /// The file.
        source_name: String,
        /// Its line (1-based).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A file cannot be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The live Sentinel cannot be asked.
    #[error("Sentinel at {addr}: {reason}")]
    Live {
        /// Its address.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The sources do not describe a deployment picket can take over.
    #[error("{0}")]
    Plan(String),
    /// Writing the output failed.
    #[error("{path}: {reason}")]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// `host:port`, as Sentinel names servers and Sentinels.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPort {
    /// IP or host name.
    pub host: String,
    /// Port.
    pub port: u16,
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A setting that is not carried over, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Where it comes from (file or Sentinel address).
    pub source: String,
    /// The setting as Sentinel names it.
    pub setting: String,
    /// Why it is not carried over.
    pub why: String,
}

/// One monitored master, as one Sentinel knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Master {
    /// The master name (picket's group name).
    pub name: String,
    /// Its current address.
    pub addr: Option<HostPort>,
    /// `quorum`.
    pub quorum: u32,
    /// `down-after-milliseconds`.
    pub down_after_ms: Option<u64>,
    /// `failover-timeout`.
    pub failover_timeout_ms: Option<u64>,
    /// `parallel-syncs`.
    pub parallel_syncs: Option<u32>,
    /// `auth-user`.
    pub auth_user: Option<String>,
    /// `auth-pass`.
    pub auth_pass: Option<String>,
    /// `config-epoch`.
    pub config_epoch: u64,
    /// `leader-epoch`: this Sentinel's last vote.
    pub leader_epoch: u64,
    /// `known-replica` (or `SENTINEL REPLICAS`).
    pub replicas: BTreeSet<HostPort>,
    /// `known-sentinel` (or `SENTINEL SENTINELS`): address and run id.
    pub sentinels: BTreeMap<HostPort, Option<String>>,
    /// `client-reconfig-script`.
    pub reconfig_script: Option<String>,
}

/// TLS settings of a Sentinel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `tls-port`.
    pub port: Option<u16>,
    /// `tls-cert-file`.
    pub cert_file: Option<String>,
    /// `tls-key-file`.
    pub key_file: Option<String>,
    /// `tls-client-cert-file`.
    pub client_cert_file: Option<String>,
    /// `tls-client-key-file`.
    pub client_key_file: Option<String>,
    /// `tls-ca-cert-file`.
    pub ca_file: Option<String>,
    /// `tls-auth-clients`.
    pub auth_clients: Option<String>,
    /// `tls-replication`: TLS to the servers and the other Sentinels.
    pub replication: bool,
}

/// What one Sentinel says: its own settings and its masters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    /// A file path or the Sentinel's address, for messages.
    pub name: String,
    /// The address other Sentinels know it by, when it can be told.
    pub own: Option<HostPort>,
    /// `myid` (its run id).
    pub myid: Option<String>,
    /// `current-epoch`.
    pub current_epoch: u64,
    /// `port`.
    pub port: Option<u16>,
    /// `bind`.
    pub bind: Vec<String>,
    /// `announce-ip`.
    pub announce_ip: Option<String>,
    /// `announce-port`.
    pub announce_port: Option<u16>,
    /// `announce-hostnames`.
    pub announce_hostnames: bool,
    /// `requirepass`: the password clients (and, without `sentinel-pass`,
    /// the other Sentinels) give.
    pub requirepass: Option<String>,
    /// `sentinel-user`.
    pub sentinel_user: Option<String>,
    /// `sentinel-pass`.
    pub sentinel_pass: Option<String>,
    /// TLS.
    pub tls: TlsSettings,
    /// Monitored masters, in file order.
    pub masters: Vec<Master>,
    /// Settings not carried over.
    pub skipped: Vec<Skipped>,
    /// Read from a live Sentinel (which does not reveal `auth-pass`).
    pub live: bool,
}

impl Source {
    fn master_mut(&mut self, name: &str, line: usize) -> Result<&mut Master, ImportError> {
        let src = self.name.clone();
        self.masters
            .iter_mut()
            .find(|m| m.name == name)
            .ok_or_else(|| ImportError::Parse {
                source_name: src,
                line,
                reason: format!("master {name:?} is not monitored (no `sentinel monitor {name} ...` before this line)"),
            })
    }

    fn skip(&mut self, setting: impl Into<String>, why: impl Into<String>) {
        self.skipped.push(Skipped {
            source: self.name.clone(),
            setting: setting.into(),
            why: why.into(),
        });
    }
}

/// Split a `sentinel.conf` line into arguments, as Redis does: blanks
/// separate them, `"..."` may hold blanks and `\`-escapes, `'...'` is
/// taken literally.
fn split_args(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let Some(&first) = chars.peek() else {
            return Ok(out);
        };
        let mut arg = String::new();
        match first {
            '"' => {
                chars.next();
                loop {
                    match chars.next() {
                        None => return Err("unbalanced quotes".into()),
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some('n') => arg.push('\n'),
                            Some('r') => arg.push('\r'),
                            Some('t') => arg.push('\t'),
                            Some('x') => {
                                let hex: String = chars.by_ref().take(2).collect();
                                let b = u8::from_str_radix(&hex, 16)
                                    .map_err(|_| format!("bad escape \\x{hex}"))?;
                                arg.push(char::from(b));
                            }
                            Some(c) => arg.push(c),
                            None => return Err("unbalanced quotes".into()),
                        },
                        Some(c) => arg.push(c),
                    }
                }
            }
            '\'' => {
                chars.next();
                loop {
                    match chars.next() {
                        None => return Err("unbalanced quotes".into()),
                        Some('\'') => break,
                        Some(c) => arg.push(c),
                    }
                }
            }
            _ => {
                while let Some(&c) = chars.peek() {
                    if c.is_whitespace() {
                        break;
                    }
                    arg.push(c);
                    chars.next();
                }
            }
        }
        out.push(arg);
    }
}

fn yes(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "yes" => Some(true),
        "no" => Some(false),
        _ => None,
    }
}

/// Settings of a Sentinel that have no picket equivalent, with the reason
/// given for each.
fn unsupported(directive: &str) -> Option<&'static str> {
    Some(match directive {
        "dir" => "picket keeps its state in [daemon] data_dir (set by --data-dir)",
        "logfile" | "syslog-enabled" | "syslog-ident" | "syslog-facility" => {
            "picket logs to stderr (journald under systemd)"
        }
        "loglevel" => "picket's log level is RUST_LOG (default info)",
        "daemonize" | "pidfile" | "supervised" => {
            "picket runs in the foreground under its service manager (Type=notify unit)"
        }
        "protected-mode" => {
            "picket listens where [daemon] listen says; protect it with password_file/TLS"
        }
        "user" => {
            "Sentinel ACL users are not carried over: picket has [[daemon.user]] with roles (client, operator, peer, all)"
        }
        "acllog-max-len" | "aclfile" => "picket has no ACL log",
        "tls-ca-cert-dir" => "picket reads one PEM CA file (ca_file), not a directory",
        "tls-protocols"
        | "tls-ciphers"
        | "tls-ciphersuites"
        | "tls-prefer-server-ciphers"
        | "tls-session-caching"
        | "tls-session-cache-size"
        | "tls-session-cache-timeout"
        | "tls-dh-params-file"
        | "tls-key-file-pass"
        | "tls-client-key-file-pass" => {
            "picket's TLS uses rustls' safe defaults (TLS 1.2 and 1.3), not configurable"
        }
        "tcp-keepalive" | "tcp-backlog" | "timeout" | "maxclients" | "hz" => {
            "picket sets its own socket and timer settings ([daemon] max_clients caps connections)"
        }
        "latency-tracking-info-percentiles" | "latency-tracking" | "save" | "appendonly" => {
            "a Redis server setting that a Sentinel does not use"
        }
        _ => return None,
    })
}

/// Read one `sentinel.conf` (the file as Sentinel rewrote it: its masters'
/// current addresses, epochs, known replicas and Sentinels).
pub fn parse_conf(name: &str, text: &str) -> Result<Source, ImportError> {
    let mut s = Source {
        name: name.to_string(),
        ..Source::default()
    };
    for (idx, raw) in text.lines().enumerate() {
        let line = idx + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let err = |reason: String| ImportError::Parse {
            source_name: name.to_string(),
            line,
            reason,
        };
        let args = split_args(trimmed).map_err(err)?;
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let num = |v: &str, what: &str| -> Result<u64, ImportError> {
            v.parse::<u64>()
                .map_err(|_| err(format!("{what}: {v:?} is not a number")))
        };
        let directive = a[0].to_ascii_lowercase();
        match (directive.as_str(), &a[1..]) {
            ("port", [p]) => {
                s.port = Some(port_of(num(p, "port")?).map_err(err)?);
            }
            ("bind", ips) => {
                s.bind = ips
                    .iter()
                    .map(|i| i.trim_start_matches('-').to_string())
                    .collect()
            }
            ("requirepass", [p]) => s.requirepass = Some((*p).to_string()),
            ("tls-port", [p]) => {
                let p = port_of(num(p, "tls-port")?).map_err(err)?;
                s.tls.port = (p != 0).then_some(p);
            }
            ("tls-cert-file", [f]) => s.tls.cert_file = Some((*f).to_string()),
            ("tls-key-file", [f]) => s.tls.key_file = Some((*f).to_string()),
            ("tls-client-cert-file", [f]) => s.tls.client_cert_file = Some((*f).to_string()),
            ("tls-client-key-file", [f]) => s.tls.client_key_file = Some((*f).to_string()),
            ("tls-ca-cert-file", [f]) => s.tls.ca_file = Some((*f).to_string()),
            ("tls-auth-clients", [v]) => s.tls.auth_clients = Some(v.to_ascii_lowercase()),
            ("tls-replication", [v]) => {
                s.tls.replication = yes(v)
                    .ok_or_else(|| err(format!("tls-replication: {v:?} is not yes or no")))?;
            }
            ("sentinel", rest) if !rest.is_empty() => {
                parse_sentinel_line(&mut s, rest, line, &err, &num)?;
            }
            (d, _) => match unsupported(d) {
                Some(why) => s.skip(trimmed, why),
                None => s.skip(trimmed, "no picket equivalent"),
            },
        }
    }
    s.own = own_address(&s);
    Ok(s)
}

fn port_of(n: u64) -> Result<u16, String> {
    u16::try_from(n).map_err(|_| format!("{n} is not a port"))
}

fn parse_sentinel_line(
    s: &mut Source,
    rest: &[&str],
    line: usize,
    err: &dyn Fn(String) -> ImportError,
    num: &dyn Fn(&str, &str) -> Result<u64, ImportError>,
) -> Result<(), ImportError> {
    let sub = rest[0].to_ascii_lowercase();
    let whole = format!("sentinel {}", rest.join(" "));
    match (sub.as_str(), &rest[1..]) {
        ("myid", [id]) => s.myid = Some((*id).to_string()),
        ("current-epoch", [e]) => s.current_epoch = num(e, "current-epoch")?,
        ("announce-ip", [ip]) => s.announce_ip = Some((*ip).to_string()),
        ("announce-port", [p]) => {
            let p = port_of(num(p, "announce-port")?).map_err(err)?;
            s.announce_port = (p != 0).then_some(p);
        }
        ("announce-hostnames", [v]) => {
            s.announce_hostnames = yes(v).ok_or_else(|| err(format!("announce-hostnames: {v:?} is not yes or no")))?;
        }
        ("resolve-hostnames", [_]) => s.skip(
            whole,
            "picket always resolves host names (at each reconnect); nothing to set",
        ),
        ("sentinel-user", [u]) => s.sentinel_user = Some((*u).to_string()),
        // Sentinel rewrites its passwords unquoted: a password with blanks
        // comes back as several arguments.
        ("sentinel-pass", p) if !p.is_empty() => s.sentinel_pass = Some(p.join(" ")),
        ("deny-scripts-reconfig", [_]) => s.skip(
            whole,
            "picket's configuration is changed only by editing the file and SIGHUP, never at run time",
        ),
        ("monitor", [name, host, port, quorum]) => {
            if s.masters.iter().any(|m| m.name == *name) {
                return Err(err(format!("master {name:?} is monitored twice")));
            }
            s.masters.push(Master {
                name: (*name).to_string(),
                addr: Some(HostPort {
                    host: (*host).to_string(),
                    port: port_of(num(port, "monitor port")?).map_err(err)?,
                }),
                quorum: u32::try_from(num(quorum, "quorum")?)
                    .map_err(|_| err(format!("quorum {quorum} is too large")))?,
                ..Master::default()
            });
        }
        ("down-after-milliseconds", [name, v]) => {
            let v = num(v, "down-after-milliseconds")?;
            s.master_mut(name, line)?.down_after_ms = Some(v);
        }
        ("failover-timeout", [name, v]) => {
            let v = num(v, "failover-timeout")?;
            s.master_mut(name, line)?.failover_timeout_ms = Some(v);
        }
        ("parallel-syncs", [name, v]) => {
            let v = u32::try_from(num(v, "parallel-syncs")?)
                .map_err(|_| err("parallel-syncs is too large".into()))?;
            s.master_mut(name, line)?.parallel_syncs = Some(v);
        }
        ("auth-pass", [name, p @ ..]) if !p.is_empty() => {
            s.master_mut(name, line)?.auth_pass = Some(p.join(" "));
        }
        ("auth-user", [name, u]) => s.master_mut(name, line)?.auth_user = Some((*u).to_string()),
        ("config-epoch", [name, e]) => {
            let e = num(e, "config-epoch")?;
            s.master_mut(name, line)?.config_epoch = e;
        }
        ("leader-epoch", [name, e]) => {
            let e = num(e, "leader-epoch")?;
            s.master_mut(name, line)?.leader_epoch = e;
        }
        ("known-replica" | "known-slave", [name, host, port]) => {
            let hp = HostPort {
                host: (*host).to_string(),
                port: port_of(num(port, "known-replica port")?).map_err(err)?,
            };
            s.master_mut(name, line)?.replicas.insert(hp);
        }
        ("known-sentinel", [name, host, port, runid]) => {
            let hp = HostPort {
                host: (*host).to_string(),
                port: port_of(num(port, "known-sentinel port")?).map_err(err)?,
            };
            s.master_mut(name, line)?
                .sentinels
                .insert(hp, Some((*runid).to_string()));
        }
        ("client-reconfig-script", [name, path]) => {
            s.master_mut(name, line)?.reconfig_script = Some((*path).to_string());
        }
        ("notification-script", [_, _]) => s.skip(
            whole,
            "picket has no notification script: its events are on the RESP pub/sub channels, in its log and in /metrics; a [[group.discovery]] webhook or exec gets every change of master",
        ),
        ("master-reboot-down-after-period", [_, v]) if *v == "0" => {}
        ("master-reboot-down-after-period", [_, _]) => s.skip(
            whole,
            "picket has no such period: a restarted master is judged against what its replicas hold (a restart with less data is failed over, see configuration.md), and a dead process is down after down_after_refused",
        ),
        ("rename-command", [_, _, _]) => s.skip(
            whole,
            "picket sends the commands under their own names (rename them back on the servers, or keep Sentinel)",
        ),
        ("config-epoch" | "leader-epoch" | "known-replica" | "known-sentinel", _) => {
            return Err(err(format!("{whole}: unexpected number of arguments")));
        }
        ("monitor" | "down-after-milliseconds" | "failover-timeout" | "parallel-syncs"
        | "auth-pass" | "auth-user", _) => {
            return Err(err(format!("{whole}: unexpected number of arguments")));
        }
        _ => s.skip(whole, "no picket equivalent"),
    }
    Ok(())
}

/// The address the other Sentinels know a Sentinel by: its announced one,
/// else its first specific bound address.
fn own_address(s: &Source) -> Option<HostPort> {
    let port = s.announce_port.or(s.port).unwrap_or(26379);
    if let Some(ip) = &s.announce_ip {
        return Some(HostPort {
            host: ip.clone(),
            port,
        });
    }
    s.bind
        .iter()
        .find(|b| !matches!(b.as_str(), "*" | "0.0.0.0" | "::" | "::*"))
        .map(|b| HostPort {
            host: b.clone(),
            port,
        })
}

// ---------------------------------------------------------------------------
// A live Sentinel.

/// How to reach a live Sentinel.
#[derive(Debug, Default)]
pub struct LiveOptions {
    /// `AUTH` user (with `password`).
    pub user: Option<String>,
    /// Its `requirepass` (or the user's password).
    pub password: Option<String>,
    /// TLS, for a Sentinel with `tls-port`.
    pub tls: Option<crate::resp::client::TlsClient>,
}

fn pairs(frame: &redis_protocol::resp2::types::BytesFrame) -> BTreeMap<String, String> {
    use redis_protocol::resp2::types::BytesFrame;
    let mut out = BTreeMap::new();
    if let BytesFrame::Array(items) = frame {
        for kv in items.chunks(2) {
            if let [k, v] = kv
                && let (Some(k), Some(v)) = (crate::resp::frame_text(k), crate::resp::frame_text(v))
            {
                out.insert(k, v);
            }
        }
    }
    out
}

fn array(frame: &redis_protocol::resp2::types::BytesFrame) -> Vec<BTreeMap<String, String>> {
    use redis_protocol::resp2::types::BytesFrame;
    match frame {
        BytesFrame::Array(items) => items.iter().map(pairs).collect(),
        _ => Vec::new(),
    }
}

/// Ask a live Sentinel at `addr` for its masters, their replicas and the
/// other Sentinels (`SENTINEL MYID`, `MASTERS`, `REPLICAS`, `SENTINELS`,
/// `CONFIG GET *`). What the API does not show (the masters' passwords,
/// scripts, TLS files) is listed as skipped.
pub async fn live_source(addr: &str, opts: &LiveOptions) -> Result<Source, ImportError> {
    let live = |reason: String| ImportError::Live {
        addr: addr.to_string(),
        reason,
    };
    let copts = ClientOptions {
        username: opts.user.clone(),
        password: opts.password.clone(),
        tls: opts.tls.clone(),
        connect_timeout: std::time::Duration::from_secs(3),
        command_timeout: std::time::Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let mut c = Connection::connect(addr, &copts)
        .await
        .map_err(|e| live(format!("cannot connect: {e}")))?;
    let own: crate::addr::Addr = addr
        .parse()
        .map_err(|e| live(format!("not a host:port: {e}")))?;
    let mut s = Source {
        name: addr.to_string(),
        own: Some(HostPort {
            host: own.host.clone(),
            port: own.port,
        }),
        port: Some(own.port),
        requirepass: opts.password.clone().filter(|_| opts.user.is_none()),
        live: true,
        ..Source::default()
    };
    let myid = c
        .call(["SENTINEL", "MYID"])
        .await
        .map_err(|e| live(format!("SENTINEL MYID: {e} (is it a Sentinel?)")))?;
    s.myid = crate::resp::frame_text(&myid);
    // Redis 7 answers CONFIG GET for its run-time settings; older ones
    // refuse it, and the defaults stand.
    if let Ok(f) = c.call(["SENTINEL", "CONFIG", "GET", "*"]).await {
        let cfg = pairs(&f);
        if let Some(ip) = cfg.get("announce-ip").filter(|v| !v.is_empty()) {
            s.announce_ip = Some(ip.clone());
        }
        if let Some(p) = cfg.get("announce-port").and_then(|p| p.parse::<u16>().ok()) {
            s.announce_port = (p != 0).then_some(p);
        }
        if let Some(v) = cfg.get("announce-hostnames") {
            s.announce_hostnames = yes(v).unwrap_or(false);
        }
        if let Some(u) = cfg.get("sentinel-user").filter(|v| !v.is_empty()) {
            s.sentinel_user = Some(u.clone());
        }
        if let Some(p) = cfg.get("sentinel-pass").filter(|v| !v.is_empty()) {
            s.sentinel_pass = Some(p.clone());
        }
        if let Some(v) = cfg.get("resolve-hostnames").filter(|v| *v == "yes") {
            s.skip(
                format!("resolve-hostnames {v}"),
                "picket always resolves host names (at each reconnect); nothing to set",
            );
        }
    }
    let masters = c
        .call(["SENTINEL", "MASTERS"])
        .await
        .map_err(|e| live(format!("SENTINEL MASTERS: {e}")))?;
    for m in array(&masters) {
        let get = |k: &str| m.get(k).cloned();
        let num = |k: &str| get(k).and_then(|v| v.parse::<u64>().ok());
        let Some(name) = get("name") else { continue };
        let flags = get("flags").unwrap_or_default();
        if flags.contains("failover_in_progress") || flags.contains("o_down") {
            return Err(live(format!(
                "master {name} is being failed over (flags {flags}): import once it is done"
            )));
        }
        let mut master = Master {
            name: name.clone(),
            addr: match (get("ip"), num("port")) {
                (Some(h), Some(p)) => Some(HostPort {
                    host: h,
                    port: port_of(p).map_err(live)?,
                }),
                _ => None,
            },
            quorum: num("quorum").unwrap_or(0) as u32,
            down_after_ms: num("down-after-milliseconds"),
            failover_timeout_ms: num("failover-timeout"),
            parallel_syncs: num("parallel-syncs").map(|v| v as u32),
            config_epoch: num("config-epoch").unwrap_or(0),
            ..Master::default()
        };
        let replicas = c
            .call(["SENTINEL", "REPLICAS", name.as_str()])
            .await
            .map_err(|e| live(format!("SENTINEL REPLICAS {name}: {e}")))?;
        for r in array(&replicas) {
            if let (Some(h), Some(p)) = (r.get("ip"), r.get("port").and_then(|p| p.parse().ok())) {
                master.replicas.insert(HostPort {
                    host: h.clone(),
                    port: p,
                });
            }
        }
        let sentinels = c
            .call(["SENTINEL", "SENTINELS", name.as_str()])
            .await
            .map_err(|e| live(format!("SENTINEL SENTINELS {name}: {e}")))?;
        for r in array(&sentinels) {
            if let (Some(h), Some(p)) = (r.get("ip"), r.get("port").and_then(|p| p.parse().ok())) {
                master.sentinels.insert(
                    HostPort {
                        host: h.clone(),
                        port: p,
                    },
                    r.get("runid").cloned(),
                );
            }
        }
        s.skip(
            format!("sentinel notification-script/client-reconfig-script {name}"),
            "a live Sentinel does not reveal them: import from sentinel.conf to carry a client-reconfig-script over",
        );
        s.masters.push(master);
    }
    s.skip(
        "tls-* settings",
        "a live Sentinel does not reveal its TLS files: add [daemon.tls] and [group.tls] by hand, or import from sentinel.conf",
    );
    Ok(s)
}

// ---------------------------------------------------------------------------
// Planning.

/// Per-daemon choices the command line makes.
#[derive(Debug, Clone, Default)]
pub struct PlanOptions {
    /// HTTP port (`http_listen`) of every daemon, unless overridden.
    pub http_port: u16,
    /// `http_listen` per Sentinel address (`SENTINEL=IP:PORT`).
    pub http_listen: BTreeMap<String, String>,
    /// `data_dir`, with `{id}` replaced by the daemon's id; None: the
    /// `data` directory beside each configuration.
    pub data_dir: Option<String>,
    /// Masters' password per group (`""` key: every group), for a live
    /// import.
    pub auth_pass: BTreeMap<String, String>,
    /// Masters' ACL user, for a live import.
    pub auth_user: Option<String>,
    /// Listen on every address (`0.0.0.0:port`) and announce the
    /// Sentinel's address, for Sentinels behind NAT (`announce-ip` that is
    /// not a local address); by default each daemon listens on the address
    /// its Sentinel is known by.
    pub bind_any: bool,
}

/// One daemon to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonPlan {
    /// Its id (`daemon.id`): derived from the Sentinel's address.
    pub id: String,
    /// The Sentinel it replaces: its address.
    pub addr: HostPort,
    /// That Sentinel's run id, kept as the daemon's (clients that know a
    /// Sentinel by run id keep knowing it).
    pub run_id: Option<String>,
    /// `http_listen`.
    pub http_listen: String,
}

/// What will be written.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The daemons, in address order.
    pub daemons: Vec<DaemonPlan>,
    /// The groups, merged from every source (the highest config epoch wins).
    pub masters: Vec<Master>,
    /// The settings shared by every daemon (from the first source).
    pub global: Source,
    /// The highest epoch any source knows.
    pub current_epoch: u64,
    /// Settings not carried over, from every source.
    pub skipped: Vec<Skipped>,
    /// Options.
    pub opts: PlanOptions,
}

/// A daemon id from a Sentinel's address: `sentinel-10.0.0.1-26379`
/// (letters, digits, `.`, `-` only).
fn daemon_id(a: &HostPort) -> String {
    let host: String = a
        .host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let mut id = format!("sentinel-{host}-{}", a.port);
    id.truncate(64);
    id
}

/// Merge the sources into what to write.
pub fn plan(sources: Vec<Source>, opts: PlanOptions) -> Result<Plan, ImportError> {
    let Some(first) = sources.first().cloned() else {
        return Err(ImportError::Plan(
            "nothing to import: give --from-sentinel HOST:PORT or sentinel.conf files".into(),
        ));
    };
    let mut skipped: Vec<Skipped> = sources.iter().flat_map(|s| s.skipped.clone()).collect();
    // Masters: the source with the highest config epoch for each name.
    let mut masters: BTreeMap<String, Master> = BTreeMap::new();
    for s in &sources {
        for m in &s.masters {
            match masters.get_mut(&m.name) {
                None => {
                    masters.insert(m.name.clone(), m.clone());
                }
                Some(known) => {
                    let (replicas, sentinels) =
                        (known.replicas.union(&m.replicas).cloned().collect(), {
                            let mut all = known.sentinels.clone();
                            all.extend(m.sentinels.clone());
                            all
                        });
                    if m.config_epoch > known.config_epoch {
                        *known = m.clone();
                    }
                    known.replicas = replicas;
                    known.sentinels = sentinels;
                }
            }
        }
    }
    if masters.is_empty() {
        return Err(ImportError::Plan(format!(
            "{}: no monitored master (`sentinel monitor`)",
            first.name
        )));
    }
    // Daemons: every Sentinel a source is or knows, by address; run ids
    // from the source itself or from the others' lists.
    let mut daemons: BTreeMap<HostPort, Option<String>> = BTreeMap::new();
    for s in &sources {
        for m in &s.masters {
            for (a, id) in &m.sentinels {
                let e = daemons.entry(a.clone()).or_default();
                if e.is_none() {
                    *e = id.clone();
                }
            }
        }
    }
    for s in &sources {
        let own = match (&s.own, &s.myid) {
            (Some(a), _) => a.clone(),
            (None, Some(id)) => match daemons.iter().find(|(_, r)| r.as_deref() == Some(id)) {
                Some((a, _)) => a.clone(),
                None => {
                    return Err(ImportError::Plan(format!(
                        "{}: cannot tell this Sentinel's address (no announce-ip, bind is {:?}, and no other file lists its myid {id}); give the files of all Sentinels, or set announce-ip",
                        s.name, s.bind
                    )));
                }
            },
            (None, None) => {
                return Err(ImportError::Plan(format!(
                    "{}: cannot tell this Sentinel's address (no announce-ip, no specific bind, no myid)",
                    s.name
                )));
            }
        };
        daemons.insert(own, s.myid.clone());
    }
    let mut plans = Vec::new();
    let mut https = BTreeSet::new();
    for (addr, run_id) in daemons {
        let http_listen = match opts.http_listen.get(&addr.to_string()) {
            Some(h) => h.clone(),
            None => {
                // Each daemon on its own host: on every address when the
                // Sentinel's address may not be local (named, NAT).
                let ip = if !opts.bind_any && addr.host.parse::<std::net::IpAddr>().is_ok() {
                    addr.host.clone()
                } else {
                    "0.0.0.0".into()
                };
                HostPort {
                    host: ip,
                    port: opts.http_port,
                }
                .to_string()
            }
        };
        let specific = !http_listen.starts_with("0.0.0.0:") && !http_listen.starts_with("[::]:");
        if specific && !https.insert(http_listen.clone()) {
            return Err(ImportError::Plan(format!(
                "two daemons would serve HTTP on {http_listen}: give each one its own with --http-listen {addr}=IP:PORT"
            )));
        }
        if http_listen.ends_with(&format!(":{}", addr.port)) && http_listen.starts_with(&addr.host)
        {
            return Err(ImportError::Plan(format!(
                "{addr}: http_listen {http_listen} is the RESP port; choose another with --http-listen"
            )));
        }
        plans.push(DaemonPlan {
            id: daemon_id(&addr),
            addr,
            run_id: run_id.filter(|r| r.len() == 40 && r.bytes().all(|b| b.is_ascii_hexdigit())),
            http_listen,
        });
    }
    let n = plans.len();
    for m in masters.values_mut() {
        if m.addr.is_none() {
            return Err(ImportError::Plan(format!("master {}: no address", m.name)));
        }
        if m.quorum as usize > n {
            return Err(ImportError::Plan(format!(
                "master {}: quorum {} but only {n} Sentinel(s) known; give every Sentinel's file",
                m.name, m.quorum
            )));
        }
        if m.auth_pass.is_none() {
            m.auth_pass = opts
                .auth_pass
                .get(&m.name)
                .or_else(|| opts.auth_pass.get(""))
                .cloned();
        }
        if m.auth_user.is_none() {
            m.auth_user = opts.auth_user.clone();
        }
        if m.auth_pass.is_none() && sources.iter().any(|s| s.live) {
            skipped.push(Skipped {
                source: first.name.clone(),
                setting: format!("sentinel auth-pass/auth-user {}", m.name),
                why: "a live Sentinel does not reveal them: if the servers need a password, give --auth-pass-file (and --auth-user), or import from sentinel.conf".into(),
            });
        }
        if m.auth_user.is_some() && m.auth_pass.is_none() {
            return Err(ImportError::Plan(format!(
                "master {}: auth-user without auth-pass (picket's username needs password_file)",
                m.name
            )));
        }
    }
    for src in sources
        .iter()
        .filter(|s| s.announce_ip.is_some() && !opts.bind_any)
    {
        skipped.push(Skipped {
            source: src.name.clone(),
            setting: "sentinel announce-ip".into(),
            why: "each daemon listens on the announced address itself; if it is not local (NAT), import with --bind-any (listen on 0.0.0.0, announce it)".into(),
        });
    }
    if n == 2 {
        skipped.push(Skipped {
            source: first.name.clone(),
            setting: "two Sentinels".into(),
            why:
                "two daemons cannot fail over when one is down (a majority of 2 is 2); add a third"
                    .into(),
        });
    }
    let current_epoch = sources
        .iter()
        .map(|s| s.current_epoch)
        .chain(masters.values().map(|m| m.config_epoch.max(m.leader_epoch)))
        .max()
        .unwrap_or(0);
    Ok(Plan {
        daemons: plans,
        masters: masters.into_values().collect(),
        global: first,
        current_epoch,
        skipped,
        opts,
    })
}

fn toml_str(s: &str) -> String {
    // TOML basic strings escape like JSON's.
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

fn ms_duration(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// A file to write: its path below the daemon's directory, content, and
/// whether it is a secret (mode 0600).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutFile {
    /// Relative to the daemon's directory.
    pub rel: String,
    /// Content.
    pub content: String,
    /// Mode 0600.
    pub secret: bool,
}

impl Plan {
    /// The files of daemon `d`, written below `dir` (its own directory:
    /// the paths in the configuration are absolute, below `dir`).
    pub fn files(&self, d: &DaemonPlan, dir: &Path) -> Vec<OutFile> {
        let g = &self.global;
        let mut files = Vec::new();
        let secret = |files: &mut Vec<OutFile>, name: &str, value: &str| -> String {
            files.push(OutFile {
                rel: format!("secrets/{name}"),
                content: format!("{value}\n"),
                secret: true,
            });
            dir.join("secrets").join(name).display().to_string()
        };
        let data_dir = self.data_dir(d, dir).display().to_string();
        let mut t = String::new();
        let _ = writeln!(
            t,
            "# Written by `picket import` from {}: the daemon that replaces the\n\
             # Sentinel at {}. Check it with `picket check-config --config FILE`.\n",
            self.sources_label(),
            d.addr
        );
        let _ = writeln!(t, "[daemon]");
        let _ = writeln!(t, "id = {}", toml_str(&d.id));
        // The Sentinel's address: clients and the other daemons keep
        // using it. Behind NAT (or by name), listen on every address.
        let (listen, announce) = match (self.opts.bind_any, d.addr.host.parse::<std::net::IpAddr>())
        {
            (false, Ok(_)) => (d.addr.to_string(), None),
            _ => (
                format!("0.0.0.0:{}", g.port.unwrap_or(d.addr.port)),
                Some(d.addr.to_string()),
            ),
        };
        let (listen, plaintext_listen) = match g.tls.port {
            Some(tp) => {
                let host = listen
                    .rsplit_once(':')
                    .map_or("0.0.0.0", |(h, _)| h)
                    .to_string();
                let plain = g.port.filter(|p| *p != 0).map(|p| format!("{host}:{p}"));
                (format!("{host}:{tp}"), plain)
            }
            None => (listen, None),
        };
        let _ = writeln!(t, "listen = {}", toml_str(&listen));
        if let Some(a) = announce {
            let _ = writeln!(t, "announce = {}", toml_str(&a));
        }
        let _ = writeln!(t, "http_listen = {}", toml_str(&d.http_listen));
        let _ = writeln!(t, "data_dir = {}", toml_str(&data_dir));
        let peers: Vec<String> = self
            .daemons
            .iter()
            .filter(|o| o.id != d.id)
            .map(|o| toml_str(&o.addr.to_string()))
            .collect();
        let _ = writeln!(t, "peers = [{}]", peers.join(", "));
        let mut users = String::new();
        if let Some(p) = &g.requirepass {
            let f = secret(&mut files, "password", p);
            let _ = writeln!(t, "password_file = {}", toml_str(&f));
        }
        // The other Sentinels' credentials: a peer user of its own.
        if let Some(pass) = &g.sentinel_pass
            && Some(pass) != g.requirepass.as_ref()
        {
            let name = g
                .sentinel_user
                .clone()
                .unwrap_or_else(|| "picket-peer".into());
            let f = secret(&mut files, "peer-password", pass);
            let _ = writeln!(t, "peer_user = {}", toml_str(&name));
            if g.requirepass.is_none() {
                // Sentinel let anyone run anything without requirepass;
                // picket refuses "all" beside named users.
                let _ = writeln!(t, "default_role = \"operator\"");
            }
            let _ = writeln!(
                users,
                "\n[[daemon.user]]\nname = {}\nrole = \"peer\"\npassword_file = {}",
                toml_str(&name),
                toml_str(&f)
            );
        }
        if let Some(tp) = g.tls.port {
            let _ = writeln!(t, "\n# tls-port {tp}\n[daemon.tls]");
            for (k, v) in [
                ("cert_file", &g.tls.cert_file),
                ("key_file", &g.tls.key_file),
                ("ca_file", &g.tls.ca_file),
            ] {
                if let Some(v) = v {
                    let _ = writeln!(t, "{k} = {}", toml_str(v));
                }
            }
            if let Some(a) = &g.tls.auth_clients {
                let _ = writeln!(t, "auth_clients = {}", toml_str(a));
            }
            let _ = writeln!(t, "peers = {}", g.tls.replication);
            if let Some(p) = plaintext_listen {
                let _ = writeln!(t, "plaintext_listen = {}", toml_str(&p));
            }
        }
        t.push_str(&users);
        for m in &self.masters {
            let _ = writeln!(t, "\n[[group]]");
            let _ = writeln!(t, "name = {}", toml_str(&m.name));
            if let Some(a) = &m.addr {
                let _ = writeln!(
                    t,
                    "master = {}   # config epoch {} (state in data_dir)",
                    toml_str(&a.to_string()),
                    m.config_epoch
                );
            }
            let _ = writeln!(t, "quorum = {}", m.quorum);
            let _ = writeln!(
                t,
                "down_after = \"{}\"",
                ms_duration(m.down_after_ms.unwrap_or(30_000))
            );
            let _ = writeln!(
                t,
                "failover_timeout = \"{}\"",
                ms_duration(m.failover_timeout_ms.unwrap_or(180_000))
            );
            let _ = writeln!(t, "parallel_syncs = {}", m.parallel_syncs.unwrap_or(1));
            if g.announce_hostnames {
                let _ = writeln!(t, "announce_hostnames = true");
            }
            if let Some(u) = &m.auth_user {
                let _ = writeln!(t, "username = {}", toml_str(u));
            }
            if let Some(p) = &m.auth_pass {
                let f = secret(&mut files, &format!("{}.password", m.name), p);
                let _ = writeln!(t, "password_file = {}", toml_str(&f));
            }
            if !m.replicas.is_empty() {
                let list: Vec<String> = m.replicas.iter().map(ToString::to_string).collect();
                let _ = writeln!(
                    t,
                    "# Replicas Sentinel knew (in data_dir's state, probed from the start): {}",
                    list.join(", ")
                );
            }
            if g.tls.replication && g.tls.port.is_some() {
                let _ = writeln!(t, "[group.tls]");
                if let Some(ca) = &g.tls.ca_file {
                    let _ = writeln!(t, "ca_file = {}", toml_str(ca));
                }
                let cert = g.tls.client_cert_file.as_ref().or(g.tls.cert_file.as_ref());
                let key = g.tls.client_key_file.as_ref().or(g.tls.key_file.as_ref());
                if let (Some(c), Some(k)) = (cert, key) {
                    let _ = writeln!(t, "cert_file = {}\nkey_file = {}", toml_str(c), toml_str(k));
                }
            }
            if let Some(script) = &m.reconfig_script {
                let _ = writeln!(
                    t,
                    "\n# client-reconfig-script: same arguments as Sentinel gives it.\n\
                     [[group.discovery]]\ntype = \"exec\"\ncommand = [{}]",
                    toml_str(script)
                );
            }
        }
        files.insert(
            0,
            OutFile {
                rel: "picket.toml".into(),
                content: t,
                secret: false,
            },
        );
        files
    }

    /// Daemon `d`'s `data_dir`, its own directory being `dir`.
    fn data_dir(&self, d: &DaemonPlan, dir: &Path) -> PathBuf {
        match &self.opts.data_dir {
            Some(t) => PathBuf::from(t.replace("{id}", &d.id)),
            None => dir.join("data"),
        }
    }

    fn sources_label(&self) -> String {
        self.global.name.clone()
    }

    /// The state daemon `d` starts from: the current epoch, and each
    /// group's master at its config epoch.
    pub fn state_records(&self) -> (u64, BTreeMap<String, GroupRecord>) {
        let groups = self
            .masters
            .iter()
            .filter_map(|m| {
                let a = m.addr.as_ref()?;
                Some((
                    m.name.clone(),
                    GroupRecord {
                        config_epoch: m.config_epoch,
                        master: (m.config_epoch > 0)
                            .then(|| crate::addr::Addr::new(a.host.clone(), a.port)),
                        vote_epoch: 0,
                        voted_for: None,
                        vote_promote: None,
                        known_replicas: m
                            .replicas
                            .iter()
                            .filter(|r| *r != a)
                            .map(|r| crate::addr::Addr::new(r.host.clone(), r.port))
                            .collect(),
                        led_epoch: 0,
                        led_switchover_until: 0,
                        master_identity: None,
                    },
                ))
            })
            .collect();
        (self.current_epoch, groups)
    }

    /// Write every daemon's files below `out` (`out/<id>/`), the state of
    /// each into its `data_dir` (it must not hold one yet), and check each
    /// configuration as `check-config` would. Returns the configuration
    /// paths.
    pub async fn write(&self, out: &Path) -> Result<Vec<PathBuf>, ImportError> {
        let out = std::path::absolute(out).map_err(|e| ImportError::Write {
            path: out.to_path_buf(),
            reason: e.to_string(),
        })?;
        // Nothing is written while any daemon's state would be refused.
        for d in &self.daemons {
            let state = self
                .data_dir(d, &out.join(&d.id))
                .join(crate::quorum::state::STATE_FILE);
            if state.exists() {
                return Err(state_exists(state));
            }
        }
        let mut written = Vec::new();
        for d in &self.daemons {
            let dir = out.join(&d.id);
            let files = self.files(d, &dir);
            let cfg_path = dir.join("picket.toml");
            for f in &files {
                write_file(&dir.join(&f.rel), &f.content, f.secret)?;
            }
            // Loaded as check-config loads it (the secret files exist now);
            // a configuration it would refuse is not left behind.
            let cfg = match crate::config::load(&cfg_path) {
                Ok(c) => c,
                Err(e) => {
                    for f in &files {
                        let _ = std::fs::remove_file(dir.join(&f.rel));
                    }
                    return Err(ImportError::Plan(format!(
                        "the configuration written for {} would not be accepted:\n{e}",
                        d.id
                    )));
                }
            };
            self.seed_state(d, &cfg.daemon.data_dir).await?;
            written.push(cfg_path);
        }
        Ok(written)
    }

    async fn seed_state(&self, d: &DaemonPlan, data_dir: &Path) -> Result<(), ImportError> {
        let state_file = data_dir.join(crate::quorum::state::STATE_FILE);
        if state_file.exists() {
            return Err(state_exists(state_file));
        }
        let store = StateStore::open(data_dir, Some(&d.id)).map_err(|e| ImportError::Write {
            path: data_dir.to_path_buf(),
            reason: e.to_string(),
        })?;
        let (epoch, groups) = self.state_records();
        let run_id = d.run_id.clone();
        store
            .update(move |s| {
                s.current_epoch = s.current_epoch.max(epoch);
                s.groups.extend(groups);
                if let Some(r) = run_id {
                    s.run_id = r;
                }
            })
            .await
            .map_err(|e| ImportError::Write {
                path: state_file,
                reason: e.to_string(),
            })
    }
}

fn state_exists(path: PathBuf) -> ImportError {
    ImportError::Write {
        path,
        reason: "a state file exists already: this daemon has run; refusing to overwrite its votes (remove it deliberately to import again)".into(),
    }
}

fn write_file(path: &Path, content: &str, secret: bool) -> Result<(), ImportError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let werr = |e: std::io::Error| ImportError::Write {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(werr)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .map_err(|e| ImportError::Write {
            path: path.to_path_buf(),
            reason: if e.kind() == std::io::ErrorKind::AlreadyExists {
                "exists already (choose an empty --out directory)".into()
            } else {
                e.to_string()
            },
        })?;
    f.write_all(content.as_bytes()).map_err(werr)?;
    f.sync_all().map_err(werr)
}

/// Read `sentinel.conf` files.
pub fn read_confs(paths: &[PathBuf]) -> Result<Vec<Source>, ImportError> {
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).map_err(|source| ImportError::Read {
                path: p.clone(),
                source,
            })?;
            parse_conf(&p.display().to_string(), &text)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const S1: &str = r#"
port 26379
bind 10.0.0.1
daemonize yes
logfile "/var/log/redis/sentinel.log"
sentinel myid 1111111111111111111111111111111111111111
sentinel monitor cache 10.1.0.6 6379 2
sentinel down-after-milliseconds cache 1500
sentinel failover-timeout cache 20000
sentinel parallel-syncs cache 2
sentinel auth-pass cache "s3cret pass"
sentinel notification-script cache /usr/local/bin/notify.sh
sentinel config-epoch cache 4
sentinel leader-epoch cache 4
sentinel known-replica cache 10.1.0.5 6379
sentinel known-replica cache 10.1.0.7 6379
sentinel known-sentinel cache 10.0.0.2 26379 2222222222222222222222222222222222222222
sentinel known-sentinel cache 10.0.0.3 26379 3333333333333333333333333333333333333333
sentinel current-epoch 5
"#;

    /// `toml` is a valid configuration but for the files it names, which
    /// do not exist on this machine.
    fn assert_valid_but_files(toml: &str) {
        let problems: Vec<String> = match crate::config::load_str(Path::new("x.toml"), toml) {
            Ok(_) => Vec::new(),
            Err(e) => e
                .problems()
                .iter()
                .map(|p| format!("{}: {}", p.key, p.reason))
                .filter(|p| !p.contains("does not exist"))
                .collect(),
        };
        assert!(problems.is_empty(), "{problems:?}\n{toml}");
    }

    #[test]
    fn a_sentinel_conf_gives_its_masters_epochs_and_sentinels() {
        let s = parse_conf("s1.conf", S1).unwrap();
        assert_eq!(
            s.own,
            Some(HostPort {
                host: "10.0.0.1".into(),
                port: 26379
            })
        );
        assert_eq!(s.current_epoch, 5);
        let m = &s.masters[0];
        assert_eq!(m.name, "cache");
        assert_eq!(m.addr.as_ref().unwrap().to_string(), "10.1.0.6:6379");
        assert_eq!(
            (
                m.quorum,
                m.down_after_ms,
                m.failover_timeout_ms,
                m.parallel_syncs
            ),
            (2, Some(1500), Some(20000), Some(2))
        );
        assert_eq!(m.auth_pass.as_deref(), Some("s3cret pass"));
        assert_eq!(m.config_epoch, 4);
        assert_eq!(m.replicas.len(), 2);
        assert_eq!(m.sentinels.len(), 2);
        let skipped: Vec<&str> = s.skipped.iter().map(|k| k.setting.as_str()).collect();
        assert!(
            skipped.iter().any(|k| k.starts_with("daemonize")),
            "{skipped:?}"
        );
        assert!(
            skipped.iter().any(|k| k.starts_with("logfile")),
            "{skipped:?}"
        );
        assert!(
            skipped.iter().any(|k| k.contains("notification-script")),
            "{skipped:?}"
        );
    }

    #[test]
    fn one_file_plans_three_daemons_that_check_config_accepts() {
        let s = parse_conf("s1.conf", S1).unwrap();
        let p = plan(
            vec![s],
            PlanOptions {
                http_port: 9479,
                ..PlanOptions::default()
            },
        )
        .unwrap();
        let ids: Vec<&str> = p.daemons.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "sentinel-10.0.0.1-26379",
                "sentinel-10.0.0.2-26379",
                "sentinel-10.0.0.3-26379"
            ]
        );
        assert_eq!(
            p.daemons[1].run_id.as_deref(),
            Some("2222222222222222222222222222222222222222")
        );
        assert_eq!(p.current_epoch, 5);
        let dir = Path::new("/etc/picket");
        let files = p.files(&p.daemons[0], dir);
        let toml = &files[0].content;
        // The password file does not exist here; everything else is valid.
        assert_valid_but_files(toml);
        assert!(toml.contains("listen = \"10.0.0.1:26379\""), "{toml}");
        assert!(
            toml.contains("peers = [\"10.0.0.2:26379\", \"10.0.0.3:26379\"]"),
            "{toml}"
        );
        assert!(toml.contains("down_after = \"1500ms\""), "{toml}");
        assert!(toml.contains("failover_timeout = \"20s\""), "{toml}");
        assert!(toml.contains("parallel_syncs = 2"), "{toml}");
        assert!(
            files
                .iter()
                .any(|f| f.secret && f.content == "s3cret pass\n"),
            "{files:?}"
        );
        let (epoch, groups) = p.state_records();
        assert_eq!(epoch, 5);
        assert_eq!(groups["cache"].config_epoch, 4);
        assert_eq!(groups["cache"].known_replicas.len(), 2);
        assert_eq!(
            groups["cache"].master.as_ref().unwrap().to_string(),
            "10.1.0.6:6379"
        );
    }

    #[test]
    fn bad_lines_and_impossible_deployments_are_named() {
        let e = parse_conf("x.conf", "sentinel down-after-milliseconds nope 10\n").unwrap_err();
        assert!(
            e.to_string().starts_with("x.conf:1: master \"nope\""),
            "{e}"
        );
        let e = parse_conf("x.conf", "sentinel monitor a 1.2.3.4 notaport 2\n").unwrap_err();
        assert!(e.to_string().contains("not a number"), "{e}");
        let e = parse_conf("x.conf", "requirepass \"unterminated\n").unwrap_err();
        assert!(e.to_string().contains("unbalanced quotes"), "{e}");
        // A quorum of 2 with one Sentinel known.
        let s = parse_conf(
            "x.conf",
            "bind 10.0.0.1\nsentinel monitor a 10.1.0.1 6379 2\n",
        )
        .unwrap();
        let e = plan(vec![s], PlanOptions::default()).unwrap_err();
        assert!(e.to_string().contains("quorum 2 but only 1"), "{e}");
        // Nobody can tell where this Sentinel is.
        let s = parse_conf("y.conf", "sentinel monitor a 10.1.0.1 6379 1\n").unwrap();
        let e = plan(vec![s], PlanOptions::default()).unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot tell this Sentinel's address"),
            "{e}"
        );
    }

    #[test]
    fn tls_and_peer_credentials_are_carried_over() {
        let conf = "port 0\ntls-port 26379\nbind 10.0.0.1\n\
                    tls-cert-file /etc/redis/s.crt\ntls-key-file /etc/redis/s.key\n\
                    tls-ca-cert-file /etc/redis/ca.crt\ntls-auth-clients optional\n\
                    tls-replication yes\nrequirepass clients\n\
                    sentinel sentinel-user peers\nsentinel sentinel-pass peerpw\n\
                    sentinel monitor a 10.1.0.1 6379 1\n\
                    sentinel client-reconfig-script a /usr/local/bin/reconf.sh\n";
        let p = plan(
            vec![parse_conf("x.conf", conf).unwrap()],
            PlanOptions {
                http_port: 9479,
                ..PlanOptions::default()
            },
        )
        .unwrap();
        let files = p.files(&p.daemons[0], Path::new("/etc/picket"));
        let toml = &files[0].content;
        for want in [
            "listen = \"10.0.0.1:26379\"",
            "[daemon.tls]",
            "cert_file = \"/etc/redis/s.crt\"",
            "ca_file = \"/etc/redis/ca.crt\"",
            "auth_clients = \"optional\"",
            "peers = true",
            "peer_user = \"peers\"",
            "[[daemon.user]]\nname = \"peers\"\nrole = \"peer\"",
            "[group.tls]",
            "command = [\"/usr/local/bin/reconf.sh\"]",
        ] {
            assert!(toml.contains(want), "{want:?} in\n{toml}");
        }
        assert!(
            !toml.contains("plaintext_listen"),
            "port 0: no plaintext listener\n{toml}"
        );
        let secrets: Vec<(&str, &str)> = files
            .iter()
            .filter(|f| f.secret)
            .map(|f| (f.rel.as_str(), f.content.as_str()))
            .collect();
        assert_eq!(
            secrets,
            [
                ("secrets/password", "clients\n"),
                ("secrets/peer-password", "peerpw\n")
            ]
        );
        assert_valid_but_files(toml);
    }

    #[test]
    fn behind_nat_every_daemon_listens_on_every_address() {
        let s = parse_conf("s1.conf", S1).unwrap();
        let p = plan(
            vec![s],
            PlanOptions {
                http_port: 9479,
                bind_any: true,
                ..PlanOptions::default()
            },
        )
        .unwrap();
        for d in &p.daemons {
            let toml = &p.files(d, Path::new("/etc/picket"))[0].content;
            assert!(toml.contains("listen = \"0.0.0.0:26379\""), "{toml}");
            assert!(
                toml.contains(&format!("announce = \"{}\"", d.addr)),
                "{toml}"
            );
            assert!(toml.contains("http_listen = \"0.0.0.0:9479\""), "{toml}");
        }
    }

    #[test]
    fn a_password_sentinel_rewrote_unquoted_is_whole() {
        let s = parse_conf(
            "x.conf",
            "sentinel monitor a 10.1.0.1 6379 1\nsentinel auth-pass a data secret\n",
        )
        .unwrap();
        assert_eq!(s.masters[0].auth_pass.as_deref(), Some("data secret"));
    }

    #[test]
    fn arguments_split_as_redis_does() {
        assert_eq!(
            split_args(r#"sentinel auth-pass m "a \"b\" c" 'd e'"#).unwrap(),
            ["sentinel", "auth-pass", "m", "a \"b\" c", "d e"]
        );
    }
}

//! One topology for one run: a master and two replicas (redis-server, one
//! loopback address each), watched by three redis-sentinel processes or by
//! three picket daemons with the same settings.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use picket::resp::frame_text;
use redis_protocol::resp2::types::BytesFrame;
use serde::Serialize;

use crate::procs::{Access, Proc, cmd, free_port, info_field, pairs, wait_until};

/// The group (master name) every run uses.
pub const GROUP: &str = "cache";

/// Which failover manager drives the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Side {
    /// Three picket daemons.
    Picket,
    /// Three picket daemons with mutual TLS between them and TLS (with a
    /// client certificate and a password) for the client.
    PicketTls,
    /// Three redis-sentinel processes.
    RedisSentinel,
}

impl Side {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Side::Picket => "picket",
            Side::PicketTls => "picket-tls",
            Side::RedisSentinel => "redis-sentinel",
        }
    }
}

/// Which data server the topology runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerKind {
    /// `redis-server`, or `valkey-server` (the same arguments).
    Redis,
    /// Dragonfly (its own flags, see [`dragonfly_args`]).
    Dragonfly,
}

impl ServerKind {
    /// Its name in messages and tables.
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Redis => "redis",
            ServerKind::Dragonfly => "dragonfly",
        }
    }
}

/// Binaries and shared settings.
#[derive(Debug, Clone)]
pub struct Env {
    /// `picket` binary.
    pub picket: PathBuf,
    /// `redis-sentinel` binary.
    pub sentinel: PathBuf,
    /// The data server binary: `redis-server` (or `valkey-server`), or
    /// `dragonfly` when `server` says so.
    pub redis: PathBuf,
    /// What `redis` is, which decides its arguments.
    pub server: ServerKind,
    /// picket's `RUST_LOG` (its log is in the run's directory).
    pub picket_log: String,
    /// Directory for this benchmark's files.
    pub work: PathBuf,
    /// Sentinel's and picket's `failover-timeout`.
    pub failover_timeout: Duration,
}

/// A running topology and its three managers.
pub struct Cluster {
    /// Who manages it.
    pub side: Side,
    /// redis-server processes: the initial master first.
    pub redis: Vec<Proc>,
    /// Their addresses (`ip:port`), same order.
    pub addrs: Vec<String>,
    /// The three managers.
    pub managers: Vec<Proc>,
    /// Their Sentinel-compatible API addresses.
    pub api: Vec<String>,
    /// picket only: their HTTP addresses.
    pub http: Vec<String>,
    /// How clients reach `api` (TLS and a password for picket-tls).
    pub access: Access,
}

/// The `redis-server` arguments of one server.
pub fn redis_args(ip: &str, port: u16, dir: &Path, replica_of: Option<&str>) -> Vec<String> {
    let mut a: Vec<String> = [
        "--bind",
        ip,
        "--port",
        &port.to_string(),
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--protected-mode",
        "no",
        "--replica-announce-ip",
        ip,
        "--repl-diskless-sync-delay",
        "0",
        "--dir",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(dir.display().to_string());
    if let Some(m) = replica_of {
        let (h, p) = m.rsplit_once(':').unwrap_or((m, "6379"));
        a.extend(["--replicaof".to_string(), h.to_string(), p.to_string()]);
    }
    a
}

/// The arguments of one Dragonfly server: the same topology as
/// [`redis_args`] (no snapshot saved or loaded, the replica announcing its
/// address), one thread per server so that three fit on a small machine,
/// no version check (it would reach out to the network).
pub fn dragonfly_args(ip: &str, port: u16, dir: &Path, replica_of: Option<&str>) -> Vec<String> {
    let mut a = vec![
        format!("--bind={ip}"),
        format!("--port={port}"),
        format!("--dir={}", dir.display()),
        // An empty file name: nothing is loaded at start (an empty
        // restart) and nothing saved at shutdown.
        "--dbfilename=".to_string(),
        "--proactor_threads=1".to_string(),
        format!("--replica_announce_ip={ip}"),
        "--version_check=false".to_string(),
        "--alsologtostderr".to_string(),
        format!("--log_dir={}", dir.display()),
    ];
    if let Some(m) = replica_of {
        a.push(format!("--replicaof={m}"));
    }
    a
}

/// The arguments of one data server of kind `kind`.
pub fn server_args(
    kind: ServerKind,
    ip: &str,
    port: u16,
    dir: &Path,
    replica_of: Option<&str>,
) -> Vec<String> {
    match kind {
        ServerKind::Redis => redis_args(ip, port, dir, replica_of),
        ServerKind::Dragonfly => dragonfly_args(ip, port, dir, replica_of),
    }
}

fn sentinel_conf(
    port: u16,
    dir: &Path,
    master: &str,
    down_after: Duration,
    ft: Duration,
) -> String {
    let (h, p) = master.rsplit_once(':').unwrap_or((master, "6379"));
    format!(
        "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {dir}\n\
         sentinel announce-ip 127.0.0.1\n\
         sentinel monitor {GROUP} {h} {p} 2\n\
         sentinel down-after-milliseconds {GROUP} {da}\n\
         sentinel failover-timeout {GROUP} {ft}\n\
         sentinel parallel-syncs {GROUP} 1\n",
        dir = dir.display(),
        da = down_after.as_millis(),
        ft = ft.as_millis(),
    )
}

/// What a scenario adds to the common topology.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// More `redis-server` arguments, for every server (not given to
    /// Dragonfly, which has other flags).
    pub redis_args: Vec<String>,
    /// More Dragonfly arguments, for every server of a Dragonfly run.
    pub dragonfly_args: Vec<String>,
    /// Appended to picket's `[[group]]` table (keys, sub-tables).
    pub picket_group: String,
}

/// The TOML of daemon `i` of cluster `c`.
fn picket_conf(
    i: usize,
    c: &Cluster,
    dir: &Path,
    down_after: Duration,
    ft: Duration,
    daemon_extra: &str,
    group_extra: &str,
) -> String {
    let peers: Vec<String> = (0..c.api.len())
        .filter(|j| *j != i)
        .map(|j| format!("\"{}\"", c.api[j]))
        .collect();
    format!(
        "[daemon]\nid = \"picket-{i}\"\nlisten = \"{listen}\"\nhttp_listen = \"{http}\"\n\
         data_dir = \"{data}\"\npeers = [{peers}]\n{daemon_extra}\n\
         [[group]]\nname = \"{GROUP}\"\nmaster = \"{master}\"\nquorum = 2\n\
         down_after = \"{da}ms\"\nfailover_timeout = \"{ft}ms\"\nparallel_syncs = 1\n{group_extra}",
        listen = c.api[i],
        http = c.http[i],
        master = c.addrs[0],
        data = dir.join("data").display(),
        peers = peers.join(", "),
        da = down_after.as_millis(),
        ft = ft.as_millis(),
    )
}

/// Start the three data servers of run `run` (redis-server or Dragonfly,
/// per `env.server`; `extra` and `dragonfly_extra` are added to the
/// arguments of each kind) and wait for both replicas' links. Addresses are 127.77.R.2-4 (R from the run number), so one
/// address is one server and runs do not share addresses.
pub async fn start_redis(
    env: &Env,
    dir: &Path,
    run: usize,
    extra: &[String],
    dragonfly_extra: &[String],
) -> anyhow::Result<(Vec<Proc>, Vec<String>)> {
    let r = run % 250 + 1;
    let ips: Vec<String> = (2..5).map(|d| format!("127.77.{r}.{d}")).collect();
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        let port = free_port(ip)?;
        let d = dir.join(format!("redis-{i}"));
        std::fs::create_dir_all(&d)?;
        let mut args = server_args(env.server, ip, port, &d, addrs.first().map(String::as_str));
        args.extend(
            match env.server {
                ServerKind::Redis => extra,
                ServerKind::Dragonfly => dragonfly_extra,
            }
            .iter()
            .cloned(),
        );
        procs.push(Proc::spawn(
            &format!("{} {ip}", env.server.name()),
            &env.redis,
            &args,
            &[],
            &d.join("log"),
        )?);
        addrs.push(format!("{ip}:{port}"));
    }
    let master = addrs[0].clone();
    wait_until(
        "both replicas online",
        Duration::from_secs(15),
        Duration::from_millis(20),
        || {
            let m = master.clone();
            async move {
                let Ok(reply) = cmd(&m, &["INFO", "replication"], Duration::from_millis(500)).await
                else {
                    return false;
                };
                frame_text(&reply).is_some_and(|t| t.matches("state=online").count() == 2)
            }
        },
    )
    .await?;
    Ok((procs, addrs))
}

impl Cluster {
    /// Start a topology and its managers; wait until every manager knows the
    /// master, both replicas and its two peers.
    pub async fn start(
        env: &Env,
        side: Side,
        down_after: Duration,
        run: usize,
    ) -> anyhow::Result<Cluster> {
        Self::start_with(env, side, down_after, run, &Extras::default()).await
    }

    /// [`Cluster::start`] with a scenario's additions.
    pub async fn start_with(
        env: &Env,
        side: Side,
        down_after: Duration,
        run: usize,
        extras: &Extras,
    ) -> anyhow::Result<Cluster> {
        let dir = env.work.join(format!("run-{run}-{}", side.name()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        let (redis, addrs) =
            start_redis(env, &dir, run, &extras.redis_args, &extras.dragonfly_args).await?;
        let mut c = Cluster {
            side,
            redis,
            addrs,
            managers: Vec::new(),
            api: Vec::new(),
            http: Vec::new(),
            access: Access::default(),
        };
        let ports: Vec<u16> = (0..3)
            .map(|_| free_port("127.0.0.1"))
            .collect::<Result<_, _>>()?;
        c.api = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        match side {
            Side::RedisSentinel => {
                for (i, port) in ports.iter().enumerate() {
                    let d = dir.join(format!("sentinel-{i}"));
                    std::fs::create_dir_all(&d)?;
                    let conf = d.join("sentinel.conf");
                    std::fs::write(
                        &conf,
                        sentinel_conf(*port, &d, &c.addrs[0], down_after, env.failover_timeout),
                    )?;
                    c.managers.push(Proc::spawn(
                        &format!("redis-sentinel {i}"),
                        &env.sentinel,
                        &[conf.display().to_string()],
                        &[],
                        &d.join("log"),
                    )?);
                }
            }
            Side::Picket | Side::PicketTls => {
                let extra = if side == Side::PicketTls {
                    let (access, extra) = tls_pki(&dir)?;
                    c.access = access;
                    extra
                } else {
                    vec![String::new(); 3]
                };
                c.http = (0..3)
                    .map(|_| free_port("127.0.0.1").map(|p| format!("127.0.0.1:{p}")))
                    .collect::<Result<_, _>>()?;
                for (i, extra) in extra.iter().enumerate() {
                    let d = dir.join(format!("picket-{i}"));
                    std::fs::create_dir_all(&d)?;
                    let conf = d.join("picket.toml");
                    std::fs::write(
                        &conf,
                        picket_conf(
                            i,
                            &c,
                            &d,
                            down_after,
                            env.failover_timeout,
                            extra,
                            &extras.picket_group,
                        ),
                    )?;
                    c.managers.push(Proc::spawn(
                        &format!("picket {i}"),
                        &env.picket,
                        &["run".into(), "--config".into(), conf.display().to_string()],
                        &[("RUST_LOG", env.picket_log.as_str())],
                        &d.join("log"),
                    )?);
                }
            }
        }
        c.wait_ready().await?;
        Ok(c)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        for i in 0..3 {
            let r = match self.side {
                Side::RedisSentinel => {
                    let api = self.api[i].clone();
                    wait_until(
                        "sentinel to see 2 replicas and 2 sentinels",
                        Duration::from_secs(20),
                        Duration::from_millis(50),
                        || {
                            let api = api.clone();
                            async move { sentinel_ready(&api).await }
                        },
                    )
                    .await
                }
                Side::Picket | Side::PicketTls => {
                    let http = self.http[i].clone();
                    wait_until(
                        "picket to see 2 replicas and 2 peers",
                        Duration::from_secs(20),
                        Duration::from_millis(50),
                        || {
                            let http = http.clone();
                            async move { picket_ready(&http).await }
                        },
                    )
                    .await
                }
            };
            if let Err(e) = r {
                bail!(
                    "{e}\n{} log:\n{}",
                    self.managers[i].name,
                    self.managers[i].log_tail(30)
                );
            }
        }
        Ok(())
    }

    /// The final config epoch of the group, per manager (None if unreadable).
    pub async fn config_epochs(&self) -> Vec<Option<u64>> {
        let mut out = Vec::new();
        for i in 0..3 {
            out.push(match self.side {
                Side::RedisSentinel => cmd(
                    &self.api[i],
                    &["SENTINEL", "MASTER", GROUP],
                    Duration::from_secs(1),
                )
                .await
                .ok()
                .and_then(|f| {
                    pairs(&f)
                        .into_iter()
                        .find(|(k, _)| k == "config-epoch")
                        .and_then(|(_, v)| v.parse().ok())
                }),
                Side::Picket | Side::PicketTls => picket_status(&self.http[i])
                    .await
                    .and_then(|s| s["groups"][0]["config_epoch"].as_u64()),
            });
        }
        out
    }

    /// Start a planned switchover on the first manager; returns its reply.
    pub async fn switchover(&self) -> Result<BytesFrame, picket::resp::RespError> {
        let args: &[&str] = match self.side {
            Side::RedisSentinel => &["SENTINEL", "FAILOVER", GROUP],
            Side::Picket | Side::PicketTls => &["PICKET", "FAILOVER", GROUP],
        };
        self.access
            .cmd(&self.api[0], args, Duration::from_secs(30))
            .await
    }
}

async fn sentinel_ready(api: &str) -> bool {
    let t = Duration::from_millis(500);
    let n = |f: Result<BytesFrame, _>| match f {
        Ok(BytesFrame::Array(v)) => v.len(),
        _ => 0,
    };
    n(cmd(api, &["SENTINEL", "REPLICAS", GROUP], t).await) == 2
        && n(cmd(api, &["SENTINEL", "SENTINELS", GROUP], t).await) == 2
}

/// `/v1/status` of a picket daemon as JSON.
pub async fn picket_status(http: &str) -> Option<serde_json::Value> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .ok()?;
    let r = client
        .get(format!("http://{http}/v1/status"))
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

async fn picket_ready(http: &str) -> bool {
    let Some(s) = picket_status(http).await else {
        return false;
    };
    let g = &s["groups"][0];
    let instances = g["instances"].as_array().map(|v| {
        v.iter()
            .filter(|i| i["connected"].as_bool() == Some(true) && i["up"].as_bool() == Some(true))
            .count()
    });
    let peers = g["peers"].as_array().map(|v| {
        v.iter()
            .filter(|p| p["reachable"].as_bool() == Some(true))
            .count()
    });
    instances == Some(3) && peers == Some(2)
}

/// Role of a server (`master` / `slave`), if it answers.
pub async fn role(addr: &str) -> Option<String> {
    info_field(addr, "replication", "role").await
}

/// Keys among `seqs` (`PREFIX:SEQ`) missing on `addr`.
pub async fn missing_keys(addr: &str, prefix: &str, seqs: &[u64]) -> anyhow::Result<Vec<u64>> {
    let mut c =
        picket::resp::Connection::connect(addr, &crate::procs::opts(Duration::from_secs(5)))
            .await
            .with_context(|| format!("connect to final master {addr}"))?;
    let mut missing = Vec::new();
    for chunk in seqs.chunks(500) {
        let mut args = vec!["MGET".to_string()];
        args.extend(chunk.iter().map(|s| format!("{prefix}:{s}")));
        let reply = c.call(&args).await.context("MGET on the final master")?;
        let BytesFrame::Array(vals) = reply else {
            bail!("MGET replied {reply:?}");
        };
        for (s, v) in chunk.iter().zip(vals.iter()) {
            if matches!(v, BytesFrame::Null) {
                missing.push(*s);
            }
        }
    }
    Ok(missing)
}

/// The password of the client (the default user, role client) in
/// picket-tls runs.
const CLIENT_PASSWORD: &str = "bench-client";

/// A CA, one certificate per daemon (127.0.0.1, server and client use), a
/// client certificate, and the users of a picket-tls run, in `dir`: the
/// client's access and each daemon's `[daemon]` lines (mutual TLS, client
/// certificates required, the peers logged in as a peer user, the client
/// as the default user with role client).
fn tls_pki(dir: &Path) -> anyhow::Result<(Access, Vec<String>)> {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        SanType,
    };
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki)?;
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca, ca_key);
    let ca_file = pki.join("ca.pem");
    std::fs::write(&ca_file, &ca_pem)?;
    let issue = |name: &str| -> anyhow::Result<(PathBuf, PathBuf)> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.subject_alt_names = vec![SanType::IpAddress([127, 0, 0, 1].into())];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p.signed_by(&key, &issuer)?;
        let (c, k) = (
            pki.join(format!("{name}.pem")),
            pki.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem())?;
        std::fs::write(&k, key.serialize_pem())?;
        Ok((c, k))
    };
    let secret = |name: &str, value: &str| -> anyhow::Result<PathBuf> {
        let f = pki.join(name);
        std::fs::write(&f, value)?;
        Ok(f)
    };
    let client_pw = secret("client-password", CLIENT_PASSWORD)?;
    let peer_pw = secret("peer-password", "bench-peer")?;
    let mut extra = Vec::new();
    for i in 0..3 {
        let (cert, key) = issue(&format!("picket-{i}"))?;
        extra.push(format!(
            "password_file = \"{pw}\"\ndefault_role = \"client\"\npeer_user = \"peer\"\n\
             [daemon.tls]\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\nca_file = \"{ca}\"\n\
             auth_clients = \"yes\"\n\
             [[daemon.user]]\nname = \"peer\"\nrole = \"peer\"\npassword_file = \"{peer}\"\n",
            pw = client_pw.display(),
            peer = peer_pw.display(),
            cert = cert.display(),
            key = key.display(),
            ca = ca_file.display(),
        ));
    }
    let (cert, key) = issue("client")?;
    let config = picket::tls::client_config(&ca_file, Some((&cert, &key)))?;
    let access = Access {
        tls: Some(picket::resp::client::TlsClient::new(config, None)),
        password: Some(CLIENT_PASSWORD.to_string()),
    };
    Ok((access, extra))
}

//! The `picket` binary: command-line parsing only; everything else is in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use picket::config::{self, Config, EX_USAGE, LogFormat};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "picket",
    version,
    about = "Sentinel-style high availability for Dragonfly, Redis and Valkey"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon.
    Run {
        /// Configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a configuration file and print a summary.
    CheckConfig {
        /// Configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print groups, masters, replicas and peers of a running daemon.
    Status {
        /// HTTP address of the daemon (its `http_listen`); given its RESP
        /// port (`listen`) it says so and which port it needs.
        #[arg(long, default_value = "127.0.0.1:9479")]
        addr: String,
        /// Print the raw JSON of /v1/status.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Exit 0 when the daemon's /healthz answers (container health checks).
    Health {
        /// HTTP address of the daemon (its `http_listen`).
        #[arg(long, default_value = "127.0.0.1:9479")]
        addr: String,
    },
    /// Planned switchover of a group to a replica (the best one by default).
    Failover {
        /// The group.
        group: String,
        /// The replica to promote.
        #[arg(long)]
        to: Option<String>,
        /// RESP address of the daemon (its `listen`); its HTTP address
        /// (`http_listen`) works too: the RESP one is read from /v1/status.
        #[arg(long, default_value = "127.0.0.1:26379")]
        addr: String,
        /// User to log in as (`AUTH user password`), a user with role
        /// operator; without it the default user (`AUTH password`).
        #[arg(long, env = "PICKET_USER")]
        user: Option<String>,
        /// File with the password (else $PICKET_PASSWORD, else no AUTH).
        #[arg(long, env = "PICKET_PASSWORD_FILE")]
        password_file: Option<PathBuf>,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Write one picket configuration per Sentinel of a running deployment
    /// (from a live Sentinel or from its sentinel.conf files), with the
    /// state each daemon starts from; prints on stderr every Sentinel
    /// setting not carried over, and why.
    Import(ImportArgs),
}

/// `picket import`.
#[derive(clap::Args, Debug)]
struct ImportArgs {
    /// A live Sentinel to ask (repeatable: the highest config epoch of each
    /// master wins). The other Sentinels are found through it.
    #[arg(long, value_name = "HOST:PORT")]
    from_sentinel: Vec<String>,
    /// sentinel.conf files (of every Sentinel, ideally), instead of or
    /// besides a live Sentinel.
    #[arg(value_name = "SENTINEL_CONF")]
    conf: Vec<PathBuf>,
    /// Directory to write into: one sub-directory per daemon
    /// (`picket.toml`, `secrets/`, `data/`). Must not hold them yet.
    #[arg(long)]
    out: PathBuf,
    /// HTTP port of every daemon (`http_listen` on the Sentinel's IP).
    #[arg(long, default_value_t = 9479)]
    http_port: u16,
    /// `http_listen` of the daemon replacing one Sentinel (repeatable).
    #[arg(long, value_name = "SENTINEL=IP:PORT")]
    http_listen: Vec<String>,
    /// Listen on 0.0.0.0 and announce the Sentinel's address (Sentinels
    /// behind NAT, with an `announce-ip` that is not local); by default
    /// each daemon listens on the address its Sentinel is known by.
    #[arg(long)]
    bind_any: bool,
    /// `data_dir` of every daemon (`{id}` is replaced by its id); the
    /// starting state is written there. Default: `<out>/<id>/data`.
    #[arg(long)]
    data_dir: Option<String>,
    /// The masters' password (a live Sentinel does not reveal `auth-pass`):
    /// `FILE` for every group or `GROUP=FILE` (repeatable).
    #[arg(long, value_name = "[GROUP=]FILE")]
    auth_pass_file: Vec<String>,
    /// The masters' ACL user (`auth-user`), for a live import.
    #[arg(long)]
    auth_user: Option<String>,
    /// User to log in to the live Sentinel as (`AUTH user password`).
    #[arg(long)]
    user: Option<String>,
    /// File with the live Sentinel's password (its `requirepass`); it
    /// becomes the daemons' `password_file`.
    #[arg(long)]
    password_file: Option<PathBuf>,
    #[command(flatten)]
    tls: TlsArgs,
}

/// TLS towards a daemon with `[daemon.tls]` (redis-cli's option names).
#[derive(clap::Args, Debug, Clone)]
struct TlsArgs {
    /// Connect with TLS (implied by --cacert).
    #[arg(long)]
    tls: bool,
    /// PEM CA to verify the daemon's certificate with.
    #[arg(long, env = "PICKET_CACERT")]
    cacert: Option<PathBuf>,
    /// PEM client certificate (daemon.tls.auth_clients), with --key.
    #[arg(long, env = "PICKET_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, env = "PICKET_KEY", requires = "cert")]
    key: Option<PathBuf>,
    /// Name to verify in the daemon's certificate (default: the host of
    /// --addr).
    #[arg(long)]
    sni: Option<String>,
}

impl TlsArgs {
    /// The client configuration, when TLS is asked for.
    fn client_config(&self) -> anyhow::Result<Option<rustls::ClientConfig>> {
        if !self.tls && self.cacert.is_none() {
            return Ok(None);
        }
        let Some(ca) = &self.cacert else {
            anyhow::bail!("--tls needs --cacert (the CA of the daemons' certificates)");
        };
        let identity = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some((c.as_path(), k.as_path())),
            _ => None,
        };
        Ok(Some(picket::tls::client_config(ca, identity)?))
    }
}

fn load_or_exit(path: &std::path::Path) -> Result<Config, ExitCode> {
    match config::load(path) {
        Ok(c) => Ok(c),
        Err(e) => {
            eprintln!("{e}");
            Err(ExitCode::from(EX_USAGE as u8))
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour codes only on a terminal: log files and journald get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

async fn shutdown_signal(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
    picket::service::notify_stopping();
    token.cancel();
}

async fn run(path: PathBuf) -> anyhow::Result<ExitCode> {
    let cfg = match load_or_exit(&path) {
        Ok(c) => c,
        Err(code) => return Ok(code),
    };
    init_logging(cfg.daemon.log_format);
    let shutdown = CancellationToken::new();
    let running = picket::start(cfg).await.context("cannot start")?;
    picket::reload::spawn_sighup_handler(&running, path);
    picket::service::started(&running);
    tokio::spawn(shutdown_signal(shutdown.clone()));
    tokio::spawn(release_freed_memory());
    running.wait(shutdown).await;
    Ok(ExitCode::SUCCESS)
}

/// What answers on a port: picket's HTTP listener or its RESP one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortKind {
    Http,
    Resp,
    Unknown,
}

/// Ask `addr` one harmless line and tell HTTP from RESP by the first bytes
/// of the answer (`HTTP/1.1 ...` or `+`/`-`/`:`), over TLS when the
/// command was given TLS options. A port that answers neither (a TLS
/// listener that wants a client certificate, nothing listening) is
/// Unknown, and the command goes on as asked.
async fn sniff(addr: &str, tls: &TlsArgs) -> anyhow::Result<PortKind> {
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    async fn ask<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> Option<Vec<u8>> {
        // A valid HTTP request, and an inline command (an unknown one) to
        // a RESP server.
        s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").await.ok()?;
        let mut buf = [0u8; 8];
        let n = s.read(&mut buf).await.ok()?;
        Some(buf[..n].to_vec())
    }
    let config = tls.client_config()?;
    let probe = async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        match config {
            None => ask(tcp).await,
            Some(cfg) => {
                let host = tls.sni.clone().unwrap_or_else(|| {
                    addr.rsplit_once(':')
                        .map_or(addr, |(h, _)| h)
                        .trim_matches(['[', ']'])
                        .to_string()
                });
                let name = rustls_pki_types::ServerName::try_from(host).ok()?;
                let stream = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
                    .connect(name, tcp)
                    .await
                    .ok()?;
                ask(stream).await
            }
        }
    };
    Ok(
        match tokio::time::timeout(std::time::Duration::from_secs(2), probe).await {
            Ok(Some(b)) if b.starts_with(b"HTTP/") => PortKind::Http,
            Ok(Some(b)) if matches!(b.first(), Some(b'+' | b'-' | b':' | b'$' | b'*')) => {
                PortKind::Resp
            }
            _ => PortKind::Unknown,
        },
    )
}

/// GET `path` from a daemon's HTTP listener (HTTPS with TLS options).
async fn http_get(addr: &str, path: &str, tls: &TlsArgs) -> anyhow::Result<String> {
    picket::tls::install_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .no_proxy();
    let url = match tls.client_config()? {
        Some(cfg) => {
            builder = builder.use_preconfigured_tls(cfg);
            match (&tls.sni, addr.rsplit_once(':')) {
                (Some(name), Some((_, port))) => format!("https://{name}:{port}{path}"),
                _ => format!("https://{addr}{path}"),
            }
        }
        None => format!("http://{addr}{path}"),
    };
    if let (Some(name), Ok(sock)) = (&tls.sni, addr.parse::<std::net::SocketAddr>()) {
        // --sni: verify that name, still connecting to --addr.
        builder = builder.resolve(name, sock);
    }
    let client = builder.build()?;
    Ok(client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?
        .error_for_status()?
        .text()
        .await?)
}

async fn status(addr: &str, json: bool, tls: &TlsArgs) -> anyhow::Result<ExitCode> {
    picket::tls::install_crypto_provider();
    if sniff(addr, tls).await? == PortKind::Resp {
        anyhow::bail!(
            "{addr} is a RESP port (picket's `listen`): `picket status` reads /v1/status on \
             picket's HTTP port (`http_listen`, 9479 by default), which a RESP port cannot \
             serve; give --addr HOST:HTTP_PORT"
        );
    }
    let body = http_get(addr, "/v1/status", tls).await?;
    if json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let v: serde_json::Value = serde_json::from_str(&body).context("invalid status JSON")?;
    print!("{}", picket::status_table::render(&v));
    Ok(ExitCode::SUCCESS)
}

async fn failover(
    group: &str,
    to: Option<&str>,
    addr: &str,
    user: Option<String>,
    password_file: Option<&std::path::Path>,
    tls: &TlsArgs,
) -> anyhow::Result<ExitCode> {
    let password = match password_file {
        Some(p) => Some(config::read_secret(p).with_context(|| p.display().to_string())?),
        None => std::env::var("PICKET_PASSWORD").ok(),
    };
    if user.is_some() && password.is_none() {
        anyhow::bail!("--user needs a password: --password-file or $PICKET_PASSWORD");
    }
    let opts = picket::resp::ClientOptions {
        username: user,
        password,
        tls: tls
            .client_config()?
            .map(|c| picket::resp::client::TlsClient::new(c, tls.sni.clone())),
        command_timeout: std::time::Duration::from_secs(30),
        ..Default::default()
    };
    // Given the HTTP port, find the RESP one in /v1/status (`announce`).
    picket::tls::install_crypto_provider();
    let resp_addr = if sniff(addr, tls).await? == PortKind::Http {
        let announce = resp_addr_from_http(addr, tls).await.with_context(|| {
            format!(
                "{addr} is picket's HTTP port (`http_listen`); `picket failover` needs its RESP \
                 port (`listen`, 26379 by default), and /v1/status did not say which it is"
            )
        })?;
        eprintln!("{addr} is the HTTP port; using the RESP port {announce} it announces");
        announce
    } else {
        addr.to_string()
    };
    let addr = resp_addr.as_str();
    let mut conn = picket::resp::Connection::connect(addr, &opts)
        .await
        .with_context(|| format!("cannot reach picket at {addr}"))?;
    let mut args = vec!["PICKET", "FAILOVER", group];
    if let Some(t) = to {
        args.push(t);
    }
    match conn.call(&args).await {
        Ok(_) => {
            println!("switchover of {group} started; follow it with `picket status`");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("switchover refused: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The RESP address a daemon announces, from its /v1/status.
async fn resp_addr_from_http(addr: &str, tls: &TlsArgs) -> anyhow::Result<String> {
    let v: serde_json::Value = serde_json::from_str(&http_get(addr, "/v1/status", tls).await?)?;
    v["announce"]
        .as_str()
        .map(str::to_string)
        .context("no `announce` in /v1/status")
}

async fn import(a: ImportArgs) -> anyhow::Result<ExitCode> {
    use picket::import;
    picket::tls::install_crypto_provider();
    if a.from_sentinel.is_empty() && a.conf.is_empty() {
        eprintln!("picket import: give --from-sentinel HOST:PORT or sentinel.conf files");
        return Ok(ExitCode::from(EX_USAGE as u8));
    }
    let password = match &a.password_file {
        Some(p) => Some(config::read_secret(p).with_context(|| p.display().to_string())?),
        None => None,
    };
    let live = import::LiveOptions {
        user: a.user.clone(),
        password,
        tls: a
            .tls
            .client_config()?
            .map(|c| picket::resp::client::TlsClient::new(c, a.tls.sni.clone())),
    };
    let mut sources = import::read_confs(&a.conf)?;
    for s in &a.from_sentinel {
        sources.push(import::live_source(s, &live).await?);
    }
    let mut opts = import::PlanOptions {
        http_port: a.http_port,
        data_dir: a.data_dir.clone(),
        auth_user: a.auth_user.clone(),
        bind_any: a.bind_any,
        ..Default::default()
    };
    for h in &a.http_listen {
        let (s, l) = h
            .split_once('=')
            .with_context(|| format!("--http-listen {h:?}: expected SENTINEL=IP:PORT"))?;
        opts.http_listen.insert(s.to_string(), l.to_string());
    }
    for f in &a.auth_pass_file {
        let (group, file) = f.split_once('=').unwrap_or(("", f.as_str()));
        let p = std::path::Path::new(file);
        let pass = config::read_secret(p).with_context(|| format!("--auth-pass-file {file}"))?;
        opts.auth_pass.insert(group.to_string(), pass);
    }
    let plan = import::plan(sources, opts)?;
    let written = plan.write(&a.out).await?;
    for s in &plan.skipped {
        eprintln!("not carried over: {}: {}: {}", s.source, s.setting, s.why);
    }
    for (d, path) in plan.daemons.iter().zip(&written) {
        println!(
            "{} (replaces the Sentinel at {}): {}",
            d.id,
            d.addr,
            path.display()
        );
    }
    println!(
        "{} daemon(s), {} group(s), current epoch {}",
        plan.daemons.len(),
        plan.masters.len(),
        plan.current_epoch
    );
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    limit_malloc_arenas();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(async_main()),
        Err(e) => {
            eprintln!("picket: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One allocator arena, unless `MALLOC_ARENA_MAX` says otherwise.
///
/// The GNU C library gives each thread that allocates its own arena, and
/// memory freed in one (a message or an INFO reply made on one worker and
/// dropped on another) is reused only there: with a thousand instances
/// the runtime's threads kept three heaps, 2.8 MiB more than one; two
/// arenas kept 1.5-2 MiB of that. The lock a single arena costs the two
/// workers is rarely taken: the library's per-thread cache serves most of
/// picket's small allocations without it. Set before the runtime's
/// threads exist, as the library reads it when a thread first allocates.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: `mallopt` takes two integers and changes only the
    // allocator's settings; no other thread exists yet to race it.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

/// How often freed memory is handed back to the system.
const RELEASE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Hand the pages the allocator keeps free back to the system, every
/// [`RELEASE_EVERY`].
///
/// The GNU C library returns only the top of its heap by itself: the
/// peaks of start-up (every probe connecting and reading a full INFO at
/// once) and of bursts after it stayed resident for the daemon's life,
/// 1.5-2.6 MiB at a thousand instances. Sentinel's allocator (jemalloc)
/// returns unused pages after about ten seconds; this does the same.
/// `malloc_trim` walks the free lists under the arena's lock: 0.2-0.3 ms
/// at a thousand instances, 2-3 ms at ten thousand.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
async fn release_freed_memory() {
    let mut every = tokio::time::interval(RELEASE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    every.tick().await;
    loop {
        every.tick().await;
        let start = std::time::Instant::now();
        // SAFETY: `malloc_trim` takes the allocator's own locks; it frees
        // nothing that is allocated, only whole free pages.
        let released = unsafe { libc::malloc_trim(0) } != 0;
        tracing::trace!(released, took = ?start.elapsed(), "freed memory handed back");
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
async fn release_freed_memory() {}

async fn async_main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run { config } => run(config).await,
        Command::CheckConfig { config } => match load_or_exit(&config) {
            Ok(c) => {
                let summary = c.summary();
                print!("{summary}");
                if !summary.ends_with('\n') {
                    println!();
                }
                Ok(ExitCode::SUCCESS)
            }
            Err(code) => Ok(code),
        },
        Command::Status { addr, json, tls } => status(&addr, json, &tls).await,
        Command::Import(a) => import(a).await,
        Command::Health { addr } => {
            match picket::service::check_health(&addr, std::time::Duration::from_secs(3)).await {
                Ok(()) => Ok(ExitCode::SUCCESS),
                Err(e) => {
                    eprintln!("picket: {e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Failover {
            group,
            to,
            addr,
            user,
            password_file,
            tls,
        } => {
            failover(
                &group,
                to.as_deref(),
                &addr,
                user,
                password_file.as_deref(),
                &tls,
            )
            .await
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("picket: {e:#}");
            ExitCode::FAILURE
        }
    }
}

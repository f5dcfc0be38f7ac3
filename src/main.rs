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
        /// HTTP address of the daemon (its `http_listen`).
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
        /// RESP address of the daemon (its `listen`).
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
    running.wait(shutdown).await;
    Ok(ExitCode::SUCCESS)
}

async fn status(addr: &str, json: bool, tls: &TlsArgs) -> anyhow::Result<ExitCode> {
    picket::tls::install_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .no_proxy();
    let url = match tls.client_config()? {
        Some(cfg) => {
            builder = builder.use_preconfigured_tls(cfg);
            match (&tls.sni, addr.rsplit_once(':')) {
                (Some(name), Some((_, port))) => format!("https://{name}:{port}/v1/status"),
                _ => format!("https://{addr}/v1/status"),
            }
        }
        None => format!("http://{addr}/v1/status"),
    };
    if let (Some(name), Ok(sock)) = (&tls.sni, addr.parse::<std::net::SocketAddr>()) {
        // --sni: verify that name, still connecting to --addr.
        builder = builder.resolve(name, sock);
    }
    let client = builder.build()?;
    let body = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?
        .error_for_status()?
        .text()
        .await?;
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

/// At most two allocator arenas, unless `MALLOC_ARENA_MAX` says otherwise.
///
/// The GNU C library gives each thread that allocates its own arena, and
/// memory freed in one (a message or an INFO reply made on one worker and
/// dropped on another) is reused only there: with a thousand instances
/// the runtime's threads kept three heaps, 2.8 MiB more than one. Two
/// arenas keep most of that and leave the two workers a lock each. Set
/// before the runtime's threads exist, as the library reads it when a
/// thread first allocates.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    // SAFETY: `mallopt` takes two integers and changes only the
    // allocator's settings; no other thread exists yet to race it.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

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

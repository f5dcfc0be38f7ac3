//! The RESP listener end to end: arbitrary bytes sent to a real daemon
//! (`picket::start`) over loopback, through its request decoding, argument
//! conversion, command dispatch (Sentinel API and the `PICKET` peer
//! protocol) and reply encoding. The daemon must answer with well-formed
//! RESP, close the connection once the input ends, and never crash or hang.
//!
//! This goes through the listener rather than `api::commands::dispatch`
//! because the wire protocol is the stable interface: it fuzzes whatever
//! the dispatcher is.
//!
//! Each input is also matched, as a `SENTINEL RESET` pattern, against
//! group names by `api::pubsub::glob_match` directly (see `NAMES`).
//!
//! Input: byte 0 modulo 4 picks the listener: 0, a daemon without password;
//! 1, one with password `fuzzpw` (most commands need `AUTH fuzzpw` first);
//! 2, the TLS listener of a daemon with users and roles (`AUTH fuzzpw` is
//! a client, `AUTH ops opspw` an operator, `AUTH peer peerpw` a peer),
//! reached through a real TLS handshake with a client certificate, so the
//! bytes go through the TLS-wrapped request path; 3, that TLS port
//! without a handshake (the bytes are the ClientHello: it must refuse
//! them and close). The rest is sent as is, then the write side is shut.
//!
//! Each daemon monitors one group `cache` whose master is a closed port on
//! 127.0.0.1 and lists one peer on another closed port; its state persists
//! across inputs (like a real daemon's), so a crash may depend on earlier
//! inputs and not reproduce from its own input alone.
#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;

/// A byte stream: plain TCP or TLS.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// How long one exchange may take before the daemon counts as hung.
const EXCHANGE_DEADLINE: Duration = Duration::from_secs(30);

struct World {
    rt: Runtime,
    open: SocketAddr,
    locked: SocketAddr,
    tls: SocketAddr,
    client: tokio_rustls::TlsConnector,
    /// The daemons (and their data directories) live as long as the process.
    _keep: Vec<(picket::Running, tempfile::TempDir)>,
}

fn closed_port() -> u16 {
    // Bound then released: nothing listens there afterwards.
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// What a daemon of the world has on its listener.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Open,
    Password,
    Tls,
}

/// A CA, the TLS daemon's certificate and a client certificate, as files
/// in `dir`; returns the client configuration.
fn pki(dir: &std::path::Path) -> rustls::ClientConfig {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    use rustls::pki_types::pem::PemObject;
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    let issuer = Issuer::new(ca, ca_key);
    let issue = |file: &str, names: Vec<String>| {
        let key = KeyPair::generate().expect("key");
        let mut p = CertificateParams::new(names).expect("params");
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p.signed_by(&key, &issuer).expect("certificate");
        std::fs::write(dir.join(format!("{file}.pem")), cert.pem()).expect("write cert");
        std::fs::write(dir.join(format!("{file}.key")), key.serialize_pem()).expect("write key");
        (cert.pem(), key.serialize_pem())
    };
    issue("server", vec!["127.0.0.1".into()]);
    let (cert, key) = issue("client", vec!["client".into()]);
    std::fs::write(dir.join("ca.pem"), ca_cert.pem()).expect("write CA");
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(
            rustls::pki_types::CertificateDer::from_pem_slice(ca_cert.pem().as_bytes())
                .expect("CA PEM"),
        )
        .expect("CA root");
    rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![
                rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes())
                    .expect("cert PEM"),
            ],
            rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key PEM"),
        )
        .expect("client certificate")
}

fn daemon(rt: &Runtime, name: &str, kind: Kind) -> (picket::Running, tempfile::TempDir) {
    daemon_in(rt, name, kind, tempfile::tempdir().expect("tempdir"))
}

/// A daemon whose files (state, secrets, certificates) are in `dir`.
fn daemon_in(
    rt: &Runtime,
    name: &str,
    kind: Kind,
    dir: tempfile::TempDir,
) -> (picket::Running, tempfile::TempDir) {
    let file = |n: &str, text: &str| {
        let f = dir.path().join(n);
        std::fs::write(&f, text).expect("write a secret");
        format!("{:?}", f.display().to_string())
    };
    let pw_line = match kind {
        Kind::Open => String::new(),
        Kind::Password => format!("password_file = {}\n", file("secret", "fuzzpw\n")),
        Kind::Tls => format!(
            "password_file = {}\ndefault_role = \"client\"\npeer_user = \"peer\"\n\
             enable_fault_injection = false\n\
             [daemon.tls]\ncert_file = {:?}\nkey_file = {:?}\nca_file = {:?}\nauth_clients = \"optional\"\n\
             [[daemon.user]]\nname = \"ops\"\nrole = \"operator\"\npassword_file = {}\n\
             [[daemon.user]]\nname = \"peer\"\nrole = \"peer\"\npassword_file = {}\n",
            file("secret", "fuzzpw\n"),
            dir.path().join("server.pem").display().to_string(),
            dir.path().join("server.key").display().to_string(),
            dir.path().join("ca.pem").display().to_string(),
            file("ops", "opspw"),
            file("peer", "peerpw"),
        ),
    };
    let text = format!(
        r#"
[daemon]
id = "fuzz-{name}"
listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
data_dir = {data:?}
peers = ["127.0.0.1:{peer}"]
{pw_line}
[[group]]
name = "cache"
master = "127.0.0.1:{master}"
quorum = 1
down_after = "2s"
failover_timeout = "5s"
"#,
        data = dir.path().join("data").display().to_string(),
        peer = closed_port(),
        master = closed_port(),
    );
    let config = picket::config::load_str(std::path::Path::new("fuzz.toml"), &text)
        .unwrap_or_else(|e| panic!("fuzz config refused: {e}"));
    let running = rt
        .block_on(picket::start(config))
        .unwrap_or_else(|e| panic!("daemon did not start: {e}"));
    (running, dir)
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| {
        // One thread: the daemons' tasks run only while an input is being
        // exchanged, which keeps runs as repeatable as a daemon allows.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        picket::tls::install_crypto_provider();
        let a = daemon(&rt, "open", Kind::Open);
        let b = daemon(&rt, "locked", Kind::Password);
        let pki_dir = tempfile::tempdir().expect("tempdir");
        let client = pki(pki_dir.path());
        let c = daemon_in(&rt, "tls", Kind::Tls, pki_dir);
        World {
            open: a.0.resp_addr,
            locked: b.0.resp_addr,
            tls: c.0.resp_addr,
            client: tokio_rustls::TlsConnector::from(std::sync::Arc::new(client)),
            rt,
            _keep: vec![a, b, c],
        }
    })
}

async fn exchange(
    addr: SocketAddr,
    input: &[u8],
    tls: Option<&tokio_rustls::TlsConnector>,
) -> Option<Vec<u8>> {
    let sock = TcpStream::connect(addr)
        .await
        .expect("connect to the daemon");
    let sock: Box<dyn Io> = match tls {
        None => Box::new(sock),
        Some(c) => {
            let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
            Box::new(
                tokio::time::timeout(EXCHANGE_DEADLINE, c.connect(name, sock))
                    .await
                    .expect("the TLS handshake hangs")
                    .expect("the TLS handshake with a good client certificate fails"),
            )
        }
    };
    let (mut rd, mut wr) = tokio::io::split(sock);
    let send = async {
        // The daemon may close first (QUIT, a protocol error): that is fine.
        let _ = wr.write_all(input).await;
        let _ = wr.shutdown().await;
    };
    let recv = async {
        let mut out = Vec::new();
        // A reset (the daemon closed with our bytes unread) can cut the
        // answer short; only a cleanly closed stream is judged.
        rd.read_to_end(&mut out).await.ok().map(|_| out)
    };
    let ((), out) = tokio::time::timeout(EXCHANGE_DEADLINE, async { tokio::join!(send, recv) })
        .await
        .unwrap_or_else(|_| {
            panic!("the daemon neither answered nor closed within {EXCHANGE_DEADLINE:?}")
        });
    out
}

/// Group names to match `SENTINEL RESET` patterns against: the daemons'
/// own and a long one (names may have 63 characters), since the cost of a
/// glob grows with the name.
const NAMES: [&str; 2] = ["cache", "sessions-eu-west-1-primary-replicated"];

fuzz_target!(|data: &[u8]| {
    let Some((sel, input)) = data.split_first() else {
        return;
    };
    // The `SENTINEL RESET <pattern>` matcher, directly: the daemon has one
    // short group name, and a pattern arrives inside a length-prefixed
    // bulk string, which mutations rarely keep consistent.
    let pattern = String::from_utf8_lossy(input);
    for name in NAMES {
        let _ = picket::api::pubsub::glob_match(&pattern, name);
    }
    let w = world();
    let (addr, tls) = match sel % 4 {
        0 => (w.open, None),
        1 => (w.locked, None),
        _ => (w.tls, (sel % 4 == 2).then_some(&w.client)),
    };
    let out = w.rt.block_on(exchange(addr, input, tls));
    if sel % 4 == 3 {
        // TLS records (an alert), not RESP: it is enough that the daemon
        // answered and closed in time.
        return;
    }
    if let Some(out) = out
        && let Err(e) = picket_fuzz::check_reply_stream(&out)
    {
        panic!(
            "malformed reply stream ({e}): {:?}",
            String::from_utf8_lossy(&out)
        );
    }
});

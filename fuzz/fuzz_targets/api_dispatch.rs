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
//! Input: bit 0 of byte 0 picks the daemon (0: no password, 1: password
//! `fuzzpw`, so most commands need `AUTH fuzzpw` first); the rest is sent
//! as is, then the write side is shut.
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

/// How long one exchange may take before the daemon counts as hung.
const EXCHANGE_DEADLINE: Duration = Duration::from_secs(30);

struct World {
    rt: Runtime,
    open: SocketAddr,
    locked: SocketAddr,
    /// The daemons (and their data directories) live as long as the process.
    _keep: Vec<(picket::Running, tempfile::TempDir)>,
}

fn closed_port() -> u16 {
    // Bound then released: nothing listens there afterwards.
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

fn daemon(rt: &Runtime, name: &str, password: bool) -> (picket::Running, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let pw_line = if password {
        let pw = dir.path().join("secret");
        std::fs::write(&pw, "fuzzpw\n").expect("write the password file");
        format!("password_file = {:?}\n", pw.display().to_string())
    } else {
        String::new()
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
        let a = daemon(&rt, "open", false);
        let b = daemon(&rt, "locked", true);
        World {
            open: a.0.resp_addr,
            locked: b.0.resp_addr,
            rt,
            _keep: vec![a, b],
        }
    })
}

async fn exchange(addr: SocketAddr, input: &[u8]) -> Option<Vec<u8>> {
    let mut sock = TcpStream::connect(addr)
        .await
        .expect("connect to the daemon");
    let (mut rd, mut wr) = sock.split();
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
    let addr = if sel & 1 == 0 { w.open } else { w.locked };
    if let Some(out) = w.rt.block_on(exchange(addr, input))
        && let Err(e) = picket_fuzz::check_reply_stream(&out)
    {
        panic!(
            "malformed reply stream ({e}): {:?}",
            String::from_utf8_lossy(&out)
        );
    }
});

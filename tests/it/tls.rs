//! TLS on the RESP listener and between daemons, with real processes:
//!
//! - three daemons with mutual TLS fail over a kill -9'd redis-server
//!   master, seen through `redis-cli --tls` and redis-py's Sentinel client
//!   with `ssl=True`;
//! - a peer with a certificate of another CA, an expired one or one for
//!   another name is refused in both directions (its handshakes never
//!   complete, the reason is logged) and the failover happens with the
//!   right peers; a client with such a certificate cannot vote either.
//!
//! - the certificate setup of docs/operations.md (openssl) gives daemons
//!   that reach each other and a client that reaches them.
//!
//! Roles, credentials and certificate reload: tests/it/auth.rs.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use picket_harness::tls::{CertFiles, TestCa, Validity, client_config_files};
use picket_harness::*;

const GROUP: &str = "cache";
const PEER_PW: &str = "peer-secret";
const APP_PW: &str = "app-secret";

/// Certificates and secrets of a TLS cluster, in one directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: TestCa,
    ca_file: PathBuf,
    /// A client certificate of the right CA.
    client: CertFiles,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("picket-pki-")
            .tempdir()
            .unwrap();
        let ca = TestCa::new("picket test CA");
        let ca_file = ca.write(dir.path(), "ca.pem");
        let client = ca.issue_files(dir.path(), "client", &["client"], Validity::Now);
        for (name, pw) in [("peer-pw", PEER_PW), ("app-pw", APP_PW)] {
            std::fs::write(dir.path().join(name), pw).unwrap();
        }
        Pki {
            dir,
            ca,
            ca_file,
            client,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The `[daemon]` lines of a daemon with mutual TLS listening on
    /// `resp`: a certificate for its IP, the peer user for the peers, the
    /// default user a client with `APP_PW`.
    fn daemon_extra(&self, i: usize, resp: SocketAddr) -> String {
        let ip = resp.ip().to_string();
        let files = self
            .ca
            .issue_files(self.path(), &format!("picket-{i}"), &[&ip], Validity::Now);
        format!(
            "password_file = \"{app}\"\ndefault_role = \"client\"\npeer_user = \"picket-peer\"\n\
             [daemon.tls]\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\nca_file = \"{ca}\"\n\
             auth_clients = \"yes\"\n\
             [[daemon.user]]\nname = \"picket-peer\"\nrole = \"peer\"\npassword_file = \"{peer}\"\n",
            app = self.path().join("app-pw").display(),
            peer = self.path().join("peer-pw").display(),
            cert = files.cert.display(),
            key = files.key.display(),
            ca = self.ca_file.display(),
        )
    }

    /// A TLS connection with the good client certificate, logged in as
    /// `user` (`None`: the default user).
    fn conn(&self, addr: SocketAddr, user: Option<(&str, &str)>) -> RespConn {
        let cfg = client_config_files(&self.ca_file, Some(&self.client));
        let mut c = RespConn::connect_tls(addr, cfg, CMD_TIMEOUT)
            .unwrap_or_else(|e| panic!("TLS connection to {addr}: {e}"));
        let r = match user {
            Some((u, pw)) => c.cmd(&["AUTH", u, pw]),
            None => c.cmd(&["AUTH", APP_PW]),
        };
        assert!(r.as_ref().is_ok_and(Reply::is_ok), "AUTH on {addr}: {r:?}");
        c
    }
}

fn master_via(c: &mut RespConn) -> Option<SocketAddr> {
    match c
        .cmd(&["SENTINEL", "get-master-addr-by-name", GROUP])
        .ok()?
    {
        Reply::Array(a) if a.len() == 2 => format!("{}:{}", a[0].as_str()?, a[1].as_str()?)
            .parse()
            .ok(),
        _ => None,
    }
}

/// `redis-cli --tls` with the good client certificate, as the default user.
fn redis_cli_tls(pki: &Pki, addr: SocketAddr, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new("redis-cli");
    cmd.arg("--tls")
        .arg("--cacert")
        .arg(&pki.ca_file)
        .arg("--cert")
        .arg(&pki.client.cert)
        .arg("--key")
        .arg(&pki.client.key)
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string()])
        .args(["--pass", APP_PW, "--no-auth-warning"])
        .args(args);
    run_bounded(cmd, Duration::from_secs(10))
}

/// Run `cmd` to its end, killed by PID after `limit`.
fn run_bounded(mut cmd: Command, limit: Duration) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{cmd:?} did not end within {limit:?}: {out:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The redis-py driver (tests/python/sentinel_tls.py), killed by PID when
/// dropped.
struct Py {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Py {
    fn start(pki: &Pki, sentinels: &[SocketAddr]) -> Py {
        let list: Vec<String> = sentinels.iter().map(ToString::to_string).collect();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/sentinel_tls.py");
        let mut child = Command::new("python3")
            .arg("-B")
            .arg(script)
            .args(["--sentinels", &list.join(","), "--service", GROUP])
            .arg("--ca")
            .arg(&pki.ca_file)
            .arg("--cert")
            .arg(&pki.client.cert)
            .arg("--key")
            .arg(&pki.client.key)
            .args(["--user", "default", "--password", APP_PW])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("python3 is needed for this test: {e}"));
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Py {
            child,
            stdin,
            lines,
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        self.lines
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("no answer from redis-py to {cmd:?}: {e}"))
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn three_daemons_with_mutual_tls_fail_over_for_redis_cli_and_redis_py() {
    let mut topo = Topology::master_with_replicas(2);
    let pki = Pki::new();
    let mut plan = ClusterPlan::new(3);
    for i in 0..3 {
        plan.daemon_extra[i] = pki.daemon_extra(i, plan.resp[i]);
    }
    let resp = plan.resp.clone();
    let cluster = plan.start(&group_toml(GROUP, topo.master.addr(), 2, ""));
    // Peers are reachable only if TLS both ways and the peer user work.
    cluster.wait_converged(&[0, 1, 2], GROUP, 3, Duration::from_secs(30));
    let old = topo.master.addr();

    // redis-cli --tls (Debian's redis-tools is built with TLS).
    let out = redis_cli_tls(
        &pki,
        resp[0],
        &["SENTINEL", "get-master-addr-by-name", GROUP],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.split_whitespace().collect::<Vec<_>>(),
        [old.ip().to_string(), old.port().to_string()],
        "redis-cli --tls: {out:?}"
    );
    // The TLS port does not speak plaintext.
    let plain = redis_cmd(resp[0], &["PING"]);
    assert!(plain.is_err(), "plaintext on the TLS port: {plain:?}");

    let mut py = Py::start(&pki, &resp);
    assert_eq!(py.ask("master"), format!("master {old}"));
    assert_eq!(py.ask("write before"), "ok");

    topo.master.kill9();
    let (new, _) = cluster.wait_agreed_new_master(GROUP, &[0, 1, 2], old, Duration::from_secs(40));
    assert!(
        topo.replicas.iter().any(|r| r.addr() == new),
        "{new} is not a replica"
    );
    for &addr in &resp {
        let mut c = pki.conn(addr, None);
        assert_eq!(master_via(&mut c), Some(new), "{addr}");
    }
    let out = redis_cli_tls(
        &pki,
        resp[1],
        &["SENTINEL", "get-master-addr-by-name", GROUP],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>(),
        [new.ip().to_string(), new.port().to_string()],
        "redis-cli --tls after the failover: {out:?}"
    );
    wait_for(
        "redis-py to see the new master",
        Duration::from_secs(20),
        || py.ask("master") == format!("master {new}"),
    );
    assert_eq!(py.ask("write after"), "ok");
    let on_new = topo
        .replicas
        .iter()
        .find(|r| r.addr() == new)
        .unwrap()
        .cmd(&["GET", "after"])
        .unwrap();
    assert_eq!(
        on_new,
        Reply::Bulk(b"1".to_vec()),
        "redis-py wrote to the new master"
    );
}

// ---------------------------------------------------------------------------
// Bad peer certificates

/// A TLS server standing in for a listed peer, with a certificate the test
/// chooses: it counts handshakes begun and completed (a daemon that
/// accepted its certificate would complete one).
struct FakePeer {
    config: Arc<Mutex<Arc<rustls::ServerConfig>>>,
    attempts: Arc<AtomicU64>,
    completed: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn server_config(cert: &str, key: &str) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    picket::tls::install_crypto_provider();
    Arc::new(
        rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    )
}

impl FakePeer {
    fn start(addr: SocketAddr, cert: (&str, &str)) -> FakePeer {
        let listener = TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        let config = Arc::new(Mutex::new(server_config(cert.0, cert.1)));
        let attempts = Arc::new(AtomicU64::new(0));
        let completed = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (cfg, a, c, s) = (
            config.clone(),
            attempts.clone(),
            completed.clone(),
            stop.clone(),
        );
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let Ok((sock, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                a.fetch_add(1, Ordering::SeqCst);
                let cfg = cfg.lock().unwrap().clone();
                let c = c.clone();
                std::thread::spawn(move || {
                    let _ = sock.set_nonblocking(false);
                    let _ = sock.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut sock: TcpStream = sock;
                    let Ok(mut conn) = rustls::ServerConnection::new(cfg) else {
                        return;
                    };
                    while conn.is_handshaking() {
                        if conn.complete_io(&mut sock).is_err() {
                            return;
                        }
                    }
                    // TLS 1.3: a client that refuses our certificate sends
                    // its alert before its first application data, so only
                    // data proves that it went on.
                    let mut buf = [0u8; 64];
                    let mut stream = rustls::Stream::new(&mut conn, &mut sock);
                    if std::io::Read::read(&mut stream, &mut buf).is_ok_and(|n| n > 0) {
                        c.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        FakePeer {
            config,
            attempts,
            completed,
            stop,
            thread: Some(thread),
        }
    }

    /// Serve `cert` from now on and count afresh.
    fn set_cert(&self, cert: (&str, &str)) {
        *self.config.lock().unwrap() = server_config(cert.0, cert.1);
        self.attempts.store(0, Ordering::SeqCst);
    }
}

impl Drop for FakePeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `PICKET IS-DOWN` asking daemon `status` for a vote for `candidate` in
/// `epoch`, as arguments.
fn vote_args(status: &serde_json::Value, epoch: u64, candidate: &str) -> Vec<String> {
    let g = status["groups"]
        .as_array()
        .and_then(|a| a.iter().find(|g| g["name"] == GROUP))
        .expect("the group in /v1/status");
    vec![
        "PICKET".into(),
        "IS-DOWN".into(),
        GROUP.into(),
        g["master"].as_str().unwrap().into(),
        g["config_epoch"].as_u64().unwrap().to_string(),
        epoch.to_string(),
        candidate.into(),
    ]
}

fn cmd_strings(c: &mut RespConn, args: &[String]) -> Result<Reply, String> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    c.cmd(&a)
}

#[test]
fn peers_with_bad_certificates_are_refused_both_ways_and_never_counted() {
    let mut topo = Topology::master_with_replicas(1);
    let pki = Pki::new();
    let other_ca = TestCa::new("someone else's CA");
    // Four daemons are configured: three real ones and "X", a TLS server of
    // this test. A majority is three, so the real ones fail over only
    // together, and X never counts.
    let mut plan = ClusterPlan::new(4);
    let x = plan.resp[3];
    let x_ip = x.ip().to_string();
    let bad_certs = [
        (
            "another CA",
            other_ca.issue("x", &[&x_ip], Validity::Now),
            "UnknownIssuer",
        ),
        (
            "an expired certificate",
            pki.ca.issue("x", &[&x_ip], Validity::Expired),
            "expired",
        ),
        (
            "another name",
            pki.ca.issue("x", &["127.9.9.9"], Validity::Now),
            "not valid for name",
        ),
    ];
    for i in 0..3 {
        plan.daemon_extra[i] = pki.daemon_extra(i, plan.resp[i]);
    }
    let fake = FakePeer::start(x, (&bad_certs[0].1.0, &bad_certs[0].1.1));
    let mut nodes: Vec<PicketNode> = Vec::new();
    let resp = plan.resp.clone();
    let groups = group_toml(GROUP, topo.master.addr(), 2, "");
    for i in 0..3 {
        nodes.push(plan.spawn_node(i, &groups, &|_, j| resp[j].to_string(), None, &[]));
    }
    let cluster = PicketCluster { nodes };
    cluster.wait_ready(READY_TIMEOUT);
    cluster.wait_converged(&[0, 1, 2], GROUP, 2, Duration::from_secs(30));

    for (what, (cert, key), reason) in &bad_certs {
        fake.set_cert((cert, key));
        // Every daemon says hello every second: wait for a few attempts.
        wait_for(
            &format!("daemons to try X with {what}"),
            Duration::from_secs(20),
            || fake.attempts.load(Ordering::SeqCst) >= 6,
        );
        assert_eq!(
            fake.completed.load(Ordering::SeqCst),
            0,
            "a daemon accepted a peer with {what}"
        );
        for n in &cluster.nodes {
            wait_for(
                &format!("{} to log why X ({what}) is refused", n.id),
                Duration::from_secs(10),
                || {
                    n.process.stderr().lines().any(|l| {
                        l.contains("cannot connect to the peer")
                            && l.contains(&x.to_string())
                            && l.to_lowercase().contains(&reason.to_lowercase())
                    })
                },
            );
        }
    }

    // The other direction: a client with a certificate of another CA, or
    // an expired one, knows the peer password and asks for a vote. Its
    // handshake is refused; a real peer asking in the same epoch gets the
    // vote (had the intruder's counted, it would get the intruder's).
    let status = cluster.nodes[0].status().unwrap();
    let epoch = status["current_epoch"].as_u64().unwrap() + 100;
    let target = cluster.nodes[0].resp;
    for (i, (what, (cert, key), reason)) in bad_certs[..2].iter().enumerate() {
        let cfg = picket_harness::tls::client_config(&pki.ca.pem, Some((cert, key)));
        let intruder = format!("intruder-{i}");
        let result = RespConn::connect_tls(target, cfg, CMD_TIMEOUT).and_then(|mut c| {
            c.cmd(&["AUTH", "picket-peer", PEER_PW])?;
            cmd_strings(&mut c, &vote_args(&status, epoch + i as u64, &intruder))
        });
        assert!(result.is_err(), "a client with {what} got {result:?}");
        wait_for(
            &format!("picket-0 to log the refused handshake ({what})"),
            Duration::from_secs(10),
            || {
                cluster.nodes[0].process.stderr().lines().any(|l| {
                    l.contains("TLS handshake refused")
                        && l.to_lowercase().contains(&reason.to_lowercase())
                })
            },
        );
        let mut peer = pki.conn(target, Some(("picket-peer", PEER_PW)));
        let r = cmd_strings(&mut peer, &vote_args(&status, epoch + i as u64, "legit")).unwrap();
        assert_eq!(
            r,
            Reply::Array(vec![
                Reply::Int(0),
                Reply::Bulk(b"legit".to_vec()),
                Reply::Int((epoch + i as u64) as i64)
            ]),
            "the vote of epoch {} after a client with {what}",
            epoch + i as u64
        );
    }

    // The quorum is the three real daemons: they fail over, X stays unknown.
    let old = topo.master.addr();
    topo.master.kill9();
    let (new, _) = cluster.wait_agreed_new_master(GROUP, &[0, 1, 2], old, Duration::from_secs(40));
    assert_eq!(new, topo.replicas[0].addr());
    assert_eq!(fake.completed.load(Ordering::SeqCst), 0);
    for n in &cluster.nodes {
        let g = n.group(GROUP);
        let xs: Vec<&serde_json::Value> = g["peers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["addr"] == x.to_string())
            .collect();
        assert_eq!(xs.len(), 1, "{g}");
        assert_eq!(xs[0]["reachable"], false, "{}: {}", n.id, xs[0]);
        assert!(xs[0]["id"].is_null(), "{}: {}", n.id, xs[0]);
    }
}

// ---------------------------------------------------------------------------
// The documented certificate setup

/// The shell block of docs/operations.md between the cert-setup markers.
fn documented_cert_setup() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    let start = doc
        .find("<!-- begin: cert-setup")
        .expect("the cert-setup block in docs/operations.md");
    let block = &doc[start..];
    let body = &block[block.find("```sh\n").expect("its sh fence") + 6..];
    body[..body.find("```").expect("the end of its fence")].to_string()
}

#[test]
fn the_certificate_setup_of_operations_md_gives_working_mutual_tls() {
    let redis = RedisServer::start_fresh(RedisOpts::default());
    let mut plan = ClusterPlan::new(2);
    let dir = tempfile::Builder::new()
        .prefix("picket-docs-pki-")
        .tempdir()
        .unwrap();
    let script = documented_cert_setup();
    let daemons_line = script
        .lines()
        .find(|l| l.starts_with("DAEMONS="))
        .expect("a DAEMONS= line")
        .to_string();
    let ours = format!(
        "DAEMONS=\"picket-a:{} picket-b:{}\"",
        plan.resp[0].ip(),
        plan.resp[1].ip()
    );
    std::fs::write(
        dir.path().join("setup.sh"),
        script.replace(&daemons_line, &ours),
    )
    .unwrap();
    let mut sh = Command::new("bash");
    sh.arg("setup.sh").current_dir(dir.path());
    let out = run_bounded(sh, Duration::from_secs(60));
    assert!(
        out.status.success(),
        "the documented certificate setup failed (is openssl installed?): {out:?}"
    );
    let d = dir.path();
    std::fs::write(d.join("peer-pw"), PEER_PW).unwrap();
    std::fs::write(d.join("app-pw"), APP_PW).unwrap();
    for (i, name) in ["picket-a", "picket-b"].iter().enumerate() {
        plan.daemon_extra[i] = format!(
            "password_file = \"{app}\"\ndefault_role = \"client\"\npeer_user = \"picket-peer\"\n\
             [daemon.tls]\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\nca_file = \"{ca}\"\n\
             [[daemon.user]]\nname = \"picket-peer\"\nrole = \"peer\"\npassword_file = \"{peer}\"\n",
            app = d.join("app-pw").display(),
            peer = d.join("peer-pw").display(),
            cert = d.join(format!("{name}.pem")).display(),
            key = d.join(format!("{name}.key")).display(),
            ca = d.join("ca.pem").display(),
        );
    }
    let resp = plan.resp.clone();
    let cluster = plan.start(&group_toml(GROUP, redis.addr(), 1, ""));
    cluster.wait_converged(&[0, 1], GROUP, 1, Duration::from_secs(30));
    let app = CertFiles {
        cert: d.join("app.pem"),
        key: d.join("app.key"),
    };
    for addr in resp {
        let cfg = client_config_files(&d.join("ca.pem"), Some(&app));
        let mut c = RespConn::connect_tls(addr, cfg, CMD_TIMEOUT).unwrap();
        assert!(c.cmd(&["AUTH", APP_PW]).unwrap().is_ok());
        assert_eq!(master_via(&mut c), Some(redis.addr()));
    }
}

// ---------------------------------------------------------------------------
// The migration from plaintext to TLS (docs/operations.md)

#[test]
fn a_cluster_migrates_from_plaintext_to_tls_one_daemon_at_a_time() {
    let mut topo = Topology::master_with_replicas(1);
    let pki = Pki::new();
    let plan = ClusterPlan::new(3);
    let plain = plan.resp.clone();
    // Each daemon's TLS listener: another port on its address.
    let tls: Vec<SocketAddr> = plain
        .iter()
        .map(|a| {
            let ip = a.ip().to_string();
            format!("{ip}:{}", free_port(&ip)).parse().unwrap()
        })
        .collect();
    let groups = group_toml(GROUP, topo.master.addr(), 2, "");
    let mut cluster = plan.clone().start(&groups);
    cluster.wait_converged(&[0, 1, 2], GROUP, 2, Duration::from_secs(30));
    let certs: Vec<CertFiles> = (0..3)
        .map(|i| {
            pki.ca.issue_files(
                pki.path(),
                &format!("migrating-{i}"),
                &[&plain[i].ip().to_string()],
                Validity::Now,
            )
        })
        .collect();
    // Step 2: TLS on a new port, the old address in plaintext, peers still
    // reached in plaintext. Step 3: the peers at their TLS addresses.
    let data: Vec<PathBuf> = cluster
        .nodes
        .iter()
        .map(|n| n.process.dir().join("data"))
        .collect();
    let (plain_r, tls_r) = (&plain, &tls);
    let config = |i: usize, step: u8| {
        let peers = move |_: usize, j: usize| {
            if step == 2 {
                plain_r[j].to_string()
            } else {
                tls_r[j].to_string()
            }
        };
        let daemon = plan.daemon_toml(i, &data[i], &peers).replace(
            &format!("listen = \"{}\"", plain[i]),
            &format!("listen = \"{}\"", tls[i]),
        );
        format!(
            "{daemon}[daemon.tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\nca_file = \"{}\"\n\
             plaintext_listen = \"{}\"\npeers = {}\n\n{groups}",
            certs[i].cert.display(),
            certs[i].key.display(),
            pki.ca_file.display(),
            plain[i],
            step == 3,
        )
    };
    for step in [2u8, 3] {
        for i in 0..3 {
            let text = config(i, step);
            std::fs::write(cluster.nodes[i].process.config_path(), text).unwrap();
            cluster.nodes[i].process.restart();
            cluster.wait_ready(READY_TIMEOUT);
            // Every daemon sees its peers again before the next restart.
            cluster.wait_converged(&[0, 1, 2], GROUP, 2, Duration::from_secs(30));
        }
    }
    // Now every link between daemons is TLS: the plaintext listeners could
    // go, and a failover works over TLS alone.
    for n in &cluster.nodes {
        assert!(
            !n.process.stderr().contains("cannot connect to the peer"),
            "{}",
            n.logs()
        );
    }
    let old = topo.master.addr();
    topo.master.kill9();
    let (new, _) = cluster.wait_agreed_new_master(GROUP, &[0, 1, 2], old, Duration::from_secs(40));
    assert_eq!(new, topo.replicas[0].addr());
    let mut c = RespConn::connect_tls(
        tls[2],
        client_config_files(&pki.ca_file, Some(&pki.client)),
        CMD_TIMEOUT,
    )
    .unwrap();
    assert_eq!(master_via(&mut c), Some(new));
}

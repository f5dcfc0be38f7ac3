//! Credentials per role on the RESP listener, against a real daemon with
//! TLS watching a real redis-server master and replica:
//!
//! - a client credential reads but cannot fail over, reset, disconnect
//!   clients or inject faults (`NOPERM`, counted, and nothing happens);
//! - the peer protocol needs the peer credential: a vote asked with
//!   another one is refused and not counted;
//! - failed `AUTH` attempts are slowed down and end the connection;
//! - `picket failover` and `picket status` speak TLS with credentials from
//!   a file or the environment; the plaintext migration listener and the
//!   plaintext probe listener work;
//! - SIGHUP replaces the listener's certificate for new connections, and
//!   refuses files that do not make one;
//! - a single `password_file` alone still opens every command;
//! - the load balancers' check answers the same over HTTPS and on the
//!   plaintext probe listener, and the CLI takes either port over TLS.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use picket_harness::tls::{CertFiles, TestCa, Validity, client_config_files};
use picket_harness::*;

const GROUP: &str = "cache";

struct Setup {
    topo: Topology,
    picket: PicketProcess,
    resp: SocketAddr,
    plain: SocketAddr,
    https: SocketAddr,
    probes: SocketAddr,
    ca: TestCa,
    ca_file: PathBuf,
    client: CertFiles,
    server: CertFiles,
    dir: tempfile::TempDir,
}

const USERS: [(&str, &str, &str); 3] = [
    ("app", "client", "app-pw"),
    ("ops", "operator", "ops-pw"),
    ("picket-peer", "peer", "peer-pw"),
];
const DEFAULT_PW: &str = "shared-pw";

fn addr(ip: &str) -> SocketAddr {
    format!("{ip}:{}", free_port(ip)).parse().unwrap()
}

fn setup() -> Setup {
    let topo = Topology::master_with_replicas(1);
    let dir = tempfile::Builder::new()
        .prefix("picket-auth-")
        .tempdir()
        .unwrap();
    let ca = TestCa::new("picket test CA");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let ip = next_loopback_ip();
    let (resp, plain, https, probes) = (addr(&ip), addr(&ip), addr(&ip), addr(&ip));
    let server = ca.issue_files(dir.path(), "server", &[&ip], Validity::Now);
    let client = ca.issue_files(dir.path(), "client", &["client"], Validity::Now);
    let mut users = String::new();
    for (name, role, pw) in USERS {
        let f = dir.path().join(name);
        std::fs::write(&f, pw).unwrap();
        users.push_str(&format!(
            "[[daemon.user]]\nname = \"{name}\"\nrole = \"{role}\"\npassword_file = \"{}\"\n",
            f.display()
        ));
    }
    let default_pw = dir.path().join("default");
    std::fs::write(&default_pw, DEFAULT_PW).unwrap();
    let config = format!(
        r#"
[daemon]
id = "picket-auth"
listen = "{resp}"
http_listen = "{https}"
data_dir = "{data}"
log_format = "json"
password_file = "{default_pw}"
default_role = "client"
enable_fault_injection = true

[daemon.tls]
cert_file = "{cert}"
key_file = "{key}"
ca_file = "{ca}"
auth_clients = "optional"
plaintext_listen = "{plain}"
http = true
plaintext_http_listen = "{probes}"

{users}
[[group]]
name = "{GROUP}"
master = "{master}"
quorum = 1
down_after = "1s"
failover_timeout = "5s"
"#,
        data = dir.path().join("data").display(),
        default_pw = default_pw.display(),
        cert = server.cert.display(),
        key = server.key.display(),
        ca = ca_file.display(),
        master = topo.master.addr(),
    );
    let picket = PicketProcess::start_with(|_| config, &[], &[("RUST_LOG", "info")]);
    let s = Setup {
        topo,
        picket,
        resp,
        plain,
        https,
        probes,
        ca,
        ca_file,
        client,
        server,
        dir,
    };
    // What the last poll saw, and the daemon's log, if it never comes:
    // a clean-clone CI run once timed out here with nothing to tell why.
    let last = std::cell::RefCell::new(None);
    wait_for_or(
        "picket to watch the replica",
        Duration::from_secs(20),
        || {
            let st = s.status();
            let seen = st.as_ref().is_some_and(|st| {
                st["groups"][0]["instances"].as_array().is_some_and(|a| {
                    a.len() == 2 && a.iter().all(|i| i["role"] != "unknown" && i["up"] == true)
                })
            });
            *last.borrow_mut() = st;
            seen
        },
        || format!("last status: {:?}\n{}", last.borrow(), s.picket.logs()),
    );
    s
}

impl Setup {
    fn tls(&self, with_cert: bool) -> RespConn {
        let cfg = client_config_files(&self.ca_file, with_cert.then_some(&self.client));
        RespConn::connect_tls(self.resp, cfg, CMD_TIMEOUT)
            .unwrap_or_else(|e| panic!("TLS connection: {e}\n{}", self.picket.logs()))
    }

    fn login(&self, user: &str) -> RespConn {
        let mut c = self.tls(true);
        let pw = USERS.iter().find(|u| u.0 == user).unwrap().2;
        assert!(c.cmd(&["AUTH", user, pw]).unwrap().is_ok());
        c
    }

    /// `/v1/status` through `picket status --json` over HTTPS.
    fn status(&self) -> Option<serde_json::Value> {
        let out = self.picket_cli(
            &["status", "--json", "--addr", &self.https.to_string()],
            &[],
        );
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    fn metrics(&self) -> String {
        let (code, body) = http_get(self.probes, "/metrics").unwrap();
        assert_eq!(code, 200, "{body}");
        body
    }

    /// The `picket` binary with TLS towards this daemon.
    fn picket_cli(&self, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_picket"));
        cmd.args(args)
            .arg("--tls")
            .arg("--cacert")
            .arg(&self.ca_file)
            .env_remove("PICKET_PASSWORD")
            .env_remove("PICKET_USER")
            .envs(env.iter().copied());
        cmd.output().unwrap()
    }

    fn group(&self) -> serde_json::Value {
        self.status()
            .map(|s| s["groups"][0].clone())
            .unwrap_or_default()
    }
}

fn err(r: Result<Reply, String>) -> String {
    match r {
        Ok(Reply::Error(e)) => e,
        other => panic!("expected an error reply, got {other:?}"),
    }
}

#[test]
fn a_client_credential_reads_but_cannot_act() {
    let s = setup();
    let master = s.topo.master.addr();
    let epoch = s.group()["config_epoch"].as_u64();

    // Before AUTH: nothing but AUTH, HELLO and QUIT.
    let mut anon = s.tls(false);
    assert_eq!(
        err(anon.cmd(&["SENTINEL", "MASTERS"])),
        "NOAUTH Authentication required."
    );
    // AUTH <password> is the default user, whose role here is client.
    assert!(anon.cmd(&["AUTH", DEFAULT_PW]).unwrap().is_ok());
    assert!(matches!(
        anon.cmd(&["SENTINEL", "get-master-addr-by-name", GROUP]).unwrap(),
        Reply::Array(a) if a.len() == 2
    ));
    assert_eq!(
        err(anon.cmd(&["SENTINEL", "FAILOVER", GROUP])),
        "NOPERM User default has no permissions to run the 'sentinel|failover' command"
    );

    let mut app = s.login("app");
    for read in [
        &["SENTINEL", "MASTERS"][..],
        &["SENTINEL", "MASTER", GROUP],
        &["SENTINEL", "REPLICAS", GROUP],
        &["SENTINEL", "SENTINELS", GROUP],
        &["SENTINEL", "CKQUORUM", GROUP],
        &["SENTINEL", "MYID"],
        &["INFO"],
        &["ROLE"],
        &["PING"],
        &["CLIENT", "LIST"],
    ] {
        let r = app.cmd(read).unwrap();
        assert!(r.as_error().is_none(), "{read:?}: {r:?}");
    }
    let list = app.cmd(&["CLIENT", "LIST"]).unwrap();
    assert!(
        list.as_str().is_some_and(|l| l.contains("user=app")),
        "{list:?}"
    );
    for (args, name) in [
        (&["SENTINEL", "FAILOVER", GROUP][..], "sentinel|failover"),
        (&["SENTINEL", "RESET", "*"], "sentinel|reset"),
        (
            &["SENTINEL", "SIMULATE-FAILURE", "crash-after-election"],
            "sentinel|simulate-failure",
        ),
        (&["PICKET", "FAILOVER", GROUP], "picket|failover"),
        (&["CLIENT", "KILL", "TYPE", "normal"], "client|kill"),
    ] {
        assert_eq!(
            err(app.cmd(args)),
            format!("NOPERM User app has no permissions to run the '{name}' command"),
            "{args:?}"
        );
    }
    // Events are for clients too.
    let sub = app.cmd(&["SUBSCRIBE", "+switch-master"]).unwrap();
    assert!(matches!(sub, Reply::Array(_)), "{sub:?}");

    // Nothing happened: same master, same epoch, no failover, no flags.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let g = s.group();
        assert_eq!(g["master"], master.to_string(), "{g}");
        assert_eq!(g["config_epoch"].as_u64(), epoch, "{g}");
        assert!(g["failover"].is_null(), "{g}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut ops = s.login("ops");
    let info = ops.cmd(&["INFO", "sentinel"]).unwrap();
    assert_eq!(
        info_value(info.as_str().unwrap(), "sentinel_simulate_failure_flags").as_deref(),
        Some("0")
    );
    let m = s.metrics();
    assert_eq!(
        metric_value(
            &m,
            "picket_api_refused_total",
            &[("command", "sentinel|failover"), ("user", "app")]
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "picket_api_refused_total",
            &[("command", "sentinel|failover"), ("user", "default")]
        ),
        Some(1.0)
    );

    // The operator may: a planned switchover to the replica.
    let replica = s.topo.replicas[0].addr();
    assert!(ops.cmd(&["SENTINEL", "FAILOVER", GROUP]).unwrap().is_ok());
    wait_for("the operator's switchover", Duration::from_secs(30), || {
        s.group()["master"] == replica.to_string()
    });
}

#[test]
fn the_peer_protocol_needs_the_peer_credential() {
    let s = setup();
    let g = s.group();
    let (master, config_epoch) = (
        g["master"].as_str().unwrap().to_string(),
        g["config_epoch"].as_u64().unwrap().to_string(),
    );
    let epoch = "500";
    let vote = |c: &mut RespConn, who: &str| {
        c.cmd(&[
            "PICKET",
            "IS-DOWN",
            GROUP,
            &master,
            &config_epoch,
            epoch,
            who,
        ])
    };
    let (ip, port) = master.rsplit_once(':').unwrap();
    for user in ["app", "ops"] {
        let mut c = s.login(user);
        for (r, name) in [
            (vote(&mut c, "intruder"), "picket|is-down"),
            (
                c.cmd(&[
                    "SENTINEL",
                    "IS-MASTER-DOWN-BY-ADDR",
                    ip,
                    port,
                    epoch,
                    "intruder",
                ]),
                "sentinel|is-master-down-by-addr",
            ),
            (c.cmd(&["PICKET", "HELLO", "{}"]), "picket|hello"),
        ] {
            assert_eq!(
                err(r),
                format!("NOPERM User {user} has no permissions to run the '{name}' command")
            );
        }
    }
    // The peer gets the vote of that epoch: nobody else's was counted.
    let mut peer = s.login("picket-peer");
    assert_eq!(
        vote(&mut peer, "legit").unwrap(),
        Reply::Array(vec![
            Reply::Int(0),
            Reply::Bulk(b"legit".to_vec()),
            Reply::Int(500)
        ])
    );
    // It may not act as an operator.
    assert_eq!(
        err(peer.cmd(&["SENTINEL", "FAILOVER", GROUP])),
        "NOPERM User picket-peer has no permissions to run the 'sentinel|failover' command"
    );
}

#[test]
fn failed_auths_are_slowed_down_counted_and_end_the_connection() {
    let s = setup();
    let mut c = s.tls(true);
    let mut took = Vec::new();
    for i in 1..=10 {
        let t = Instant::now();
        let r = c.cmd(&["AUTH", "ops", "guess"]);
        took.push(t.elapsed());
        assert_eq!(
            err(r),
            "WRONGPASS invalid username-password pair or user is disabled.",
            "attempt {i}"
        );
    }
    for (i, t) in took.iter().enumerate().take(3) {
        assert!(*t < Duration::from_millis(200), "attempt {}: {t:?}", i + 1);
    }
    assert!(took[3] >= Duration::from_millis(240), "{took:?}");
    assert!(took[4] >= Duration::from_millis(490), "{took:?}");
    assert!(took[9] >= Duration::from_millis(1990), "{took:?}");
    // The tenth failure closed the connection.
    assert!(c.cmd(&["PING"]).is_err(), "the connection stays open");
    let m = s.metrics();
    assert_eq!(
        metric_value(&m, "picket_api_auth_failures_total", &[]),
        Some(10.0),
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "picket_api_rejected_total",
            &[("reason", "auth_failures")]
        ),
        Some(1.0)
    );
    // A new connection with the right password is not held back.
    let t = Instant::now();
    let mut ok = s.tls(true);
    assert!(ok.cmd(&["AUTH", "ops", "ops-pw"]).unwrap().is_ok());
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn the_cli_listeners_and_certificate_reload() {
    let s = setup();
    // picket failover over TLS: the operator from a file, the client from
    // the environment (refused).
    let ops_pw = s.dir.path().join("ops");
    let resp = s.resp.to_string();
    let out = s.picket_cli(
        &["failover", GROUP, "--addr", &resp, "--user", "app"],
        &[("PICKET_PASSWORD", "app-pw")],
    );
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("NOPERM User app has no permissions to run the 'picket|failover' command"),
        "{stderr}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_picket"))
        .args(["failover", GROUP, "--addr", &resp, "--tls", "--cacert"])
        .arg(&s.ca_file)
        .args(["--cert"])
        .arg(&s.client.cert)
        .arg("--key")
        .arg(&s.client.key)
        .env("PICKET_USER", "ops")
        .env("PICKET_PASSWORD_FILE", &ops_pw)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}\n{}", s.picket.logs());
    let replica = s.topo.replicas[0].addr();
    wait_for("the CLI's switchover", Duration::from_secs(30), || {
        s.group()["master"] == replica.to_string()
    });
    // picket status over HTTPS (the table).
    let out = s.picket_cli(&["status", "--addr", &s.https.to_string()], &[]);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(GROUP));
    // Plain HTTP on the TLS port fails; the probe listener is plaintext.
    assert!(http_get(s.https, "/healthz").map_or(true, |(c, _)| c != 200));
    assert_eq!(http_get(s.probes, "/healthz").unwrap().0, 200);
    assert_eq!(http_get(s.probes, "/v1/status").unwrap().0, 404);

    // The plaintext listener of a migration: same users.
    let mut plain = RespConn::connect(s.plain, CMD_TIMEOUT).unwrap();
    assert!(plain.cmd(&["AUTH", "app", "app-pw"]).unwrap().is_ok());
    assert!(matches!(
        plain
            .cmd(&["SENTINEL", "get-master-addr-by-name", GROUP])
            .unwrap(),
        Reply::Array(_)
    ));
    assert!(err(plain.cmd(&["SENTINEL", "FAILOVER", GROUP])).starts_with("NOPERM"));

    // SIGHUP: a renewed certificate for new connections.
    let served = || {
        let cfg = client_config_files(&s.ca_file, Some(&s.client));
        let c = picket_harness::tls::handshake(s.resp, cfg, CMD_TIMEOUT).unwrap();
        c.conn.peer_certificates().unwrap()[0].as_ref().to_vec()
    };
    let first = served();
    let ip = s.resp.ip().to_string();
    let (cert, key) = s.ca.issue("renewed", &[&ip], Validity::Now);
    std::fs::write(&s.server.cert, &cert).unwrap();
    std::fs::write(&s.server.key, &key).unwrap();
    let mut kept = s.login("app");
    s.picket.sighup();
    wait_for("the renewed certificate", Duration::from_secs(10), || {
        served() != first
    });
    let second = served();
    assert!(kept.cmd(&["PING"]).is_ok(), "an open connection survives");
    // A broken file is refused: the renewed certificate stays.
    std::fs::write(&s.server.cert, "not a certificate").unwrap();
    s.picket.sighup();
    wait_for("the refused reload logged", Duration::from_secs(10), || {
        s.picket.stderr().contains("TLS certificates not reloaded")
    });
    assert_eq!(served(), second);
}

#[test]
fn a_single_password_still_opens_every_command() {
    let redis = RedisServer::start_fresh(RedisOpts::default());
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("secret");
    std::fs::write(&pw, "only-pw\n").unwrap();
    let ip = next_loopback_ip();
    let (resp, http) = (addr(&ip), addr(&ip));
    let picket = PicketProcess::start(&format!(
        "[daemon]\nlisten = \"{resp}\"\nhttp_listen = \"{http}\"\ndata_dir = \"{}\"\npassword_file = \"{}\"\n\n{}",
        dir.path().join("data").display(),
        pw.display(),
        group_toml(GROUP, redis.addr(), 1, "")
    ));
    wait_for("picket answers", READY_TIMEOUT, || {
        redis_cmd_auth(resp, Some("only-pw"), &["PING"]).is_ok_and(|r| r.as_str() == Some("PONG"))
    });
    let mut c = RespConn::connect(resp, CMD_TIMEOUT).unwrap();
    assert_eq!(
        err(c.cmd(&["SENTINEL", "MASTERS"])),
        "NOAUTH Authentication required."
    );
    c.auth("only-pw").unwrap();
    // Operator and peer commands are allowed (their own answers, no NOPERM).
    assert_eq!(
        c.cmd(&["SENTINEL", "RESET", "nothing-*"]).unwrap(),
        Reply::Int(0)
    );
    assert_eq!(
        c.cmd(&["CLIENT", "KILL", "ID", "999999"]).unwrap(),
        Reply::Int(0)
    );
    let hello = err(c.cmd(&[
        "PICKET",
        "HELLO",
        "{\"id\":\"x\",\"addr\":\"127.9.9.9:1\",\"current_epoch\":0,\"groups\":[]}",
    ]));
    assert!(hello.starts_with("ERR unknown peer"), "{hello}");
    let mut d = RespConn::connect(resp, CMD_TIMEOUT).unwrap();
    assert!(d.cmd(&["AUTH", "default", "only-pw"]).unwrap().is_ok());
    drop(picket);
}

/// GET `path` over HTTPS from `addr` (verified with `ca`): code and body.
fn https_get(addr: SocketAddr, ca: &std::path::Path, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s =
        picket_harness::tls::handshake(addr, client_config_files(ca, None), CMD_TIMEOUT).unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: picket\r\n\r\n").as_bytes())
        .unwrap();
    let mut raw = Vec::new();
    // The server closes after an HTTP/1.0 reply; a TLS close without
    // close_notify is an error here, with the reply already read.
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

#[test]
fn the_lb_check_and_the_cli_ports_over_tls() {
    let s = setup();
    let (m, r) = (s.topo.master.addr(), s.topo.replicas[0].addr());
    // The load balancers' check, the same on the HTTPS listener and on the
    // plaintext probe listener.
    wait_for(
        "the check to pass over HTTPS",
        Duration::from_secs(10),
        || https_get(s.https, &s.ca_file, &format!("/v1/lb/{GROUP}/{m}")).0 == 200,
    );
    let (code, body) = https_get(s.https, &s.ca_file, &format!("/v1/lb/{GROUP}/{r}"));
    assert_eq!(code, 503, "{body}");
    assert!(body.starts_with("replica"), "{body}");
    assert_eq!(
        http_get(s.probes, &format!("/v1/lb/{GROUP}/{m}")).unwrap(),
        (200, format!("master {m} config epoch 0\n"))
    );
    assert_eq!(
        http_get(s.probes, &format!("/v1/lb/{GROUP}/{r}"))
            .unwrap()
            .0,
        503
    );
    // status given the RESP (TLS) port: which port it wants, and why.
    let out = s.picket_cli(&["status", "--addr", &s.resp.to_string()], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr.contains("RESP port") && stderr.contains("http_listen"),
        "{stderr}"
    );
    // failover given the HTTPS port: the RESP port from /v1/status.
    let out = s.picket_cli(
        &[
            "failover",
            GROUP,
            "--addr",
            &s.https.to_string(),
            "--user",
            "ops",
        ],
        &[("PICKET_PASSWORD", "ops-pw")],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}\n{}", s.picket.logs());
    assert!(
        stderr.contains(&format!("using the RESP port {}", s.resp)),
        "{stderr}"
    );
    wait_for("the switchover", Duration::from_secs(30), || {
        s.group()["master"] == r.to_string()
    });
    wait_for("the check to follow it", Duration::from_secs(10), || {
        https_get(s.https, &s.ca_file, &format!("/v1/lb/{GROUP}/{r}")).0 == 200
            && https_get(s.https, &s.ca_file, &format!("/v1/lb/{GROUP}/{m}")).0 == 503
    });
}

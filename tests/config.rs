//! Loading and validating `picket.toml`: exact key paths, line numbers and
//! reasons for bad files; good files, including the shipped example.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use picket::config::{
    Config, ConfigErrors, DiscoveryConfig, KubernetesMode, LogFormat, load, load_str,
};

/// A temporary directory holding a readable `secret` file and a `subdir`
/// directory, for the `*_file` checks; `{dir}` in a config is replaced by it.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("secret"), "s3cret\n").unwrap();
        // A certificate and its key, for [daemon.tls] (its files must hold PEM).
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        fs::write(dir.path().join("cert.pem"), cert.pem()).unwrap();
        fs::write(dir.path().join("key.pem"), key.serialize_pem()).unwrap();
        fs::create_dir(dir.path().join("subdir")).unwrap();
        Fixture { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Write `text` (its first newline dropped, `{dir}` substituted) as a
    /// config file and load it.
    fn load(&self, text: &str) -> Result<Config, ConfigErrors> {
        let text = text.strip_prefix('\n').unwrap_or(text);
        let text = text.replace("{dir}", self.path().to_str().unwrap());
        let file = self.path().join("picket.toml");
        fs::write(&file, text).unwrap();
        load(&file)
    }
}

struct Bad {
    what: &'static str,
    toml: &'static str,
    key: &'static str,
    line: usize,
    reason: &'static str,
}

/// Each bad config has exactly one problem; the rest of it is valid.
const BAD: &[Bad] = &[
    Bad {
        what: "isolation fencing with min_replicas 0",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[group.isolation_fencing]
min_replicas = 0
"#,
        key: "group[0].isolation_fencing.min_replicas",
        line: 9,
        reason: "must be at least 1",
    },
    Bad {
        what: "isolation fencing with a lag below one second",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
isolation_fencing = { max_lag = "500ms" }
"#,
        key: "group[0].isolation_fencing.max_lag",
        line: 7,
        reason: "must be a whole number of seconds",
    },
    Bad {
        what: "isolation fencing with an unknown key",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[group.isolation_fencing]
min_replicas_to_write = 1
"#,
        key: "group[0].isolation_fencing.min_replicas_to_write",
        line: 9,
        reason: "unknown field",
    },
    Bad {
        what: "listen is not a socket address",
        toml: r#"
[daemon]
listen = "localhost:26379"
"#,
        key: "daemon.listen",
        line: 2,
        reason: "is not an IP address and port",
    },
    Bad {
        what: "http_listen has no port",
        toml: r#"
[daemon]
listen = "127.0.0.1:26379"
http_listen = "127.0.0.1"
"#,
        key: "daemon.http_listen",
        line: 3,
        reason: "is not an IP address and port such as 0.0.0.0:9479",
    },
    Bad {
        what: "http_listen on the RESP port",
        toml: r#"
[daemon]
listen = "0.0.0.0:26379"
http_listen = "127.0.0.1:26379"
"#,
        key: "daemon.http_listen",
        line: 3,
        reason: "overlaps daemon.listen",
    },
    Bad {
        what: "announce without a port",
        toml: r#"
[daemon]
announce = "10.0.0.1"
"#,
        key: "daemon.announce",
        line: 2,
        reason: "expected host:port",
    },
    Bad {
        what: "peer with port 0, in a multi-line array",
        toml: r#"
[daemon]
peers = [
    "127.0.0.2:26379",
    "127.0.0.3:0",
]
"#,
        key: "daemon.peers[1]",
        line: 4,
        reason: "invalid port",
    },
    Bad {
        what: "peer is this daemon's announce address",
        toml: r#"
[daemon]
listen = "0.0.0.0:26379"
announce = "10.0.0.1:26379"
peers = ["10.0.0.2:26379", "10.0.0.1:26379"]
"#,
        key: "daemon.peers[1]",
        line: 4,
        reason: "is this daemon's own address",
    },
    Bad {
        what: "peer is this daemon's listen address (IPv6 spelled differently)",
        toml: r#"
[daemon]
listen = "[::1]:26379"
http_listen = "[::1]:9479"
peers = ["[0:0:0:0:0:0:0:1]:26379"]
"#,
        key: "daemon.peers[0]",
        line: 4,
        reason: "own address",
    },
    Bad {
        what: "duplicate peer (host names compare case-insensitively)",
        toml: r#"
[daemon]
peers = ["picket-b.example:26379", "picket-c.example:26379", "PICKET-B.example:26379"]
"#,
        key: "daemon.peers[2]",
        line: 2,
        reason: "listed twice (also daemon.peers[0])",
    },
    Bad {
        what: "id with a space",
        toml: r#"
[daemon]
id = "picket a"
"#,
        key: "daemon.id",
        line: 2,
        reason: "contains ' '",
    },
    Bad {
        what: "empty id",
        toml: r#"
[daemon]
id = ""
"#,
        key: "daemon.id",
        line: 2,
        reason: "must not be empty",
    },
    Bad {
        what: "id of 65 characters",
        toml: r#"
[daemon]
id = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
"#,
        key: "daemon.id",
        line: 2,
        reason: "at most 64",
    },
    Bad {
        what: "daemon password_file does not exist",
        toml: r#"
[daemon]
password_file = "{dir}/missing"
"#,
        key: "daemon.password_file",
        line: 2,
        reason: "missing does not exist",
    },
    Bad {
        what: "data_dir is a file",
        toml: r#"
[daemon]
data_dir = "{dir}/secret"
"#,
        key: "daemon.data_dir",
        line: 2,
        reason: "is not a directory",
    },
    Bad {
        what: "max_clients 0",
        toml: r#"
[daemon]

max_clients = 0
"#,
        key: "daemon.max_clients",
        line: 3,
        reason: "at least 1",
    },
    Bad {
        what: "group name starts with '-'",
        toml: r#"
[daemon]

[[group]]
name = "-cache"
master = "127.0.0.5:6379"
quorum = 1
"#,
        key: "group[0].name",
        line: 4,
        reason: "must start and end with a letter or digit",
    },
    Bad {
        what: "group name with '/'",
        toml: r#"
[daemon]

[[group]]
name = "cache/eu"
master = "127.0.0.5:6379"
quorum = 1
"#,
        key: "group[0].name",
        line: 4,
        reason: "contains '/'",
    },
    Bad {
        what: "group name too long for a label value",
        toml: r#"
[daemon]

[[group]]
name = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
master = "127.0.0.5:6379"
quorum = 1
"#,
        key: "group[0].name",
        line: 4,
        reason: "at most 63",
    },
    Bad {
        what: "duplicate group name",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group]]
name = "cache"
master = "127.0.0.6:6379"
quorum = 1
"#,
        key: "group[1].name",
        line: 9,
        reason: "duplicate group name \"cache\" (also group[0])",
    },
    Bad {
        what: "two groups share a master",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group]]
name = "sessions"
master = "127.0.0.5:6379"
quorum = 1
"#,
        key: "group[1].master",
        line: 10,
        reason: "already the master of group[0] (\"cache\")",
    },
    Bad {
        what: "master without a port",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "10.1.0.5"
quorum = 1
"#,
        key: "group[0].master",
        line: 5,
        reason: "expected host:port",
    },
    Bad {
        what: "quorum larger than the number of daemons",
        toml: r#"
[daemon]
peers = ["127.0.0.2:26379", "127.0.0.3:26379"]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 4
"#,
        key: "group[0].quorum",
        line: 7,
        reason: "must be between 1 and 3 (the number of daemons)",
    },
    Bad {
        what: "quorum 0",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 0
"#,
        key: "group[0].quorum",
        line: 6,
        reason: "must be between 1 and 1",
    },
    Bad {
        what: "down_after 0",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
down_after = "0s"
"#,
        key: "group[0].down_after",
        line: 7,
        reason: "must be greater than 0",
    },
    Bad {
        what: "down_after_refused longer than down_after",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
down_after = "1s"
down_after_refused = "2s"
"#,
        key: "group[0].down_after_refused",
        line: 8,
        reason: "must be at most down_after (1s)",
    },
    Bad {
        what: "down_after_refused 0",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
down_after_refused = "0s"
"#,
        key: "group[0].down_after_refused",
        line: 7,
        reason: "must be greater than 0",
    },
    Bad {
        what: "failover_timeout shorter than down_after",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
down_after = "5s"
failover_timeout = "2s"
"#,
        key: "group[0].failover_timeout",
        line: 8,
        reason: "must be longer than down_after (5s)",
    },
    Bad {
        what: "default failover_timeout (60s) not longer than down_after: header line",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
down_after = "90s"
"#,
        key: "group[0].failover_timeout",
        line: 3,
        reason: "must be longer than down_after (1m 30s)",
    },
    Bad {
        what: "parallel_syncs 0",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
parallel_syncs = 0
"#,
        key: "group[0].parallel_syncs",
        line: 7,
        reason: "at least 1",
    },
    Bad {
        what: "username without password_file",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
username = "picket"
"#,
        key: "group[0].password_file",
        line: 3,
        reason: "required when username is set",
    },
    Bad {
        what: "group password_file is a directory",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
password_file = "{dir}/subdir"
"#,
        key: "group[0].password_file",
        line: 7,
        reason: "is a directory, not a file",
    },
    Bad {
        what: "tls cert_file without key_file: the [group.tls] header line",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[group.tls]
ca_file = "{dir}/secret"
cert_file = "{dir}/secret"
"#,
        key: "group[0].tls.key_file",
        line: 8,
        reason: "required when cert_file is set",
    },
    Bad {
        what: "tls key_file without cert_file, second group",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group]]
name = "sessions"
master = "127.0.0.6:6379"
quorum = 1
tls = { key_file = "{dir}/secret" }
"#,
        key: "group[1].tls.cert_file",
        line: 12,
        reason: "required when key_file is set",
    },
    Bad {
        what: "tls ca_file missing",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[group.tls]
ca_file = "{dir}/ca.pem"
"#,
        key: "group[0].tls.ca_file",
        line: 9,
        reason: "ca.pem does not exist",
    },
    Bad {
        what: "admin_port 0",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
admin_port = 0
"#,
        key: "group[0].admin_port",
        line: 7,
        reason: "must not be 0",
    },
    Bad {
        what: "kubernetes pod-labels without pod_selector",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "kubernetes"
namespace = "cache"
skip_service_gate = true
"#,
        key: "group[0].discovery[0].pod_selector",
        line: 8,
        reason: "required when mode is \"pod-labels\"",
    },
    Bad {
        what: "kubernetes pod-labels without service and without skip_service_gate",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "kubernetes"
namespace = "cache"
pod_selector = "app=cache"
"#,
        key: "group[0].discovery[0].service",
        line: 8,
        reason: "is required when mode is \"pod-labels\": name the Service that selects the master",
    },
    Bad {
        what: "kubernetes pod-labels with service and skip_service_gate",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "kubernetes"
namespace = "cache"
pod_selector = "app=cache"
service = "cache-master"
skip_service_gate = true
"#,
        key: "group[0].discovery[0].skip_service_gate",
        line: 13,
        reason: "contradicts `service`",
    },
    Bad {
        what: "kubernetes endpointslice with skip_service_gate",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "kubernetes"
namespace = "cache"
mode = "endpointslice"
service = "cache"
skip_service_gate = true
"#,
        key: "group[0].discovery[0].skip_service_gate",
        line: 13,
        reason: "only applies when mode is \"pod-labels\"",
    },
    Bad {
        what: "kubernetes endpointslice without service",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "file"
path = "{dir}/cache.json"

[[group.discovery]]
type = "kubernetes"
namespace = "cache"
mode = "endpointslice"
"#,
        key: "group[0].discovery[1].service",
        line: 12,
        reason: "required when mode is \"endpointslice\"",
    },
    Bad {
        what: "kubernetes namespace not a DNS label",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "kubernetes"
namespace = "Cache_NS"
pod_selector = "app=cache"
service = "cache-master"
"#,
        key: "group[0].discovery[0].namespace",
        line: 10,
        reason: "not a valid DNS label",
    },
    Bad {
        what: "kubernetes kubeconfig missing",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "kubernetes"
kubeconfig = "{dir}/kubeconfig"
namespace = "cache"
pod_selector = "app=cache"
service = "cache-master"
"#,
        key: "group[0].discovery[0].kubeconfig",
        line: 10,
        reason: "kubeconfig does not exist",
    },
    Bad {
        what: "kubernetes empty role_label",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "kubernetes"
namespace = "cache"
pod_selector = "app=cache"
role_label = ""
service = "cache-master"
"#,
        key: "group[0].discovery[0].role_label",
        line: 12,
        reason: "must not be empty",
    },
    Bad {
        what: "kubernetes same master and replica values",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "kubernetes"
namespace = "cache"
pod_selector = "app=cache"
master_value = "replica"
service = "cache-master"
"#,
        key: "group[0].discovery[0].replica_value",
        line: 8,
        reason: "must differ from master_value",
    },
    Bad {
        what: "exec with an empty command",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "exec"
command = []
"#,
        key: "group[0].discovery[0].command",
        line: 10,
        reason: "must name the program to run",
    },
    Bad {
        what: "exec with an empty program",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "exec"
command = [
  "",
  "--flag",
]
"#,
        key: "group[0].discovery[0].command[0]",
        line: 11,
        reason: "it is the program to run",
    },
    Bad {
        what: "exec timeout 0",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "exec"
command = ["/bin/true"]
timeout = "0ms"
"#,
        key: "group[0].discovery[0].timeout",
        line: 11,
        reason: "must be greater than 0",
    },
    Bad {
        what: "webhook url not http(s)",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "webhook"
url = "ftp://hooks.example/picket"
"#,
        key: "group[0].discovery[0].url",
        line: 10,
        reason: "must start with http:// or https://",
    },
    Bad {
        what: "webhook hmac_key_file missing",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "webhook"
url = "https://hooks.example/picket"
token_file = "{dir}/secret"
hmac_key_file = "{dir}/hmac"
"#,
        key: "group[0].discovery[0].hmac_key_file",
        line: 12,
        reason: "hmac does not exist",
    },
    Bad {
        what: "file backend in a missing directory",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "file"
path = "{dir}/nowhere/cache.json"
"#,
        key: "group[0].discovery[0].path",
        line: 10,
        reason: "nowhere does not exist",
    },
    Bad {
        what: "two file backends write the same file",
        toml: r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
discovery = [{ type = "file", path = "{dir}/topology.json" }]

[[group]]
name = "sessions"
master = "127.0.0.6:6379"
quorum = 1
discovery = [{ type = "file", path = "{dir}/topology.json" }]
"#,
        key: "group[1].discovery[0].path",
        line: 13,
        reason: "also written by group[0].discovery[0].path",
    },
    Bad {
        what: "a TLS certificate file that holds no certificate",
        toml: r#"
[daemon]
[daemon.tls]
cert_file = "{dir}/secret"
key_file = "{dir}/key.pem"
auth_clients = "no"
"#,
        key: "daemon.tls.cert_file",
        line: 3,
        reason: "holds no PEM certificate",
    },
    Bad {
        what: "a TLS key file that holds no key",
        toml: r#"
[daemon]
[daemon.tls]
cert_file = "{dir}/cert.pem"
key_file = "{dir}/cert.pem"
auth_clients = "no"
"#,
        key: "daemon.tls.key_file",
        line: 4,
        reason: "holds no usable PEM private key",
    },
    Bad {
        what: "client certificates without a CA to verify them",
        toml: r#"
[daemon]
[daemon.tls]
cert_file = "{dir}/cert.pem"
key_file = "{dir}/key.pem"
"#,
        key: "daemon.tls.ca_file",
        line: 2,
        reason: "is required to verify client certificates",
    },
    Bad {
        what: "TLS peers without a CA to verify them",
        toml: r#"
[daemon]
peers = ["127.0.0.9:26379"]
[daemon.tls]
cert_file = "{dir}/cert.pem"
key_file = "{dir}/key.pem"
auth_clients = "no"
"#,
        key: "daemon.tls.ca_file",
        line: 3,
        reason: "is required to verify the peers",
    },
    Bad {
        what: "the plaintext listener on the TLS listener's port",
        toml: r#"
[daemon]
listen = "0.0.0.0:26379"
[daemon.tls]
cert_file = "{dir}/cert.pem"
key_file = "{dir}/key.pem"
auth_clients = "no"
plaintext_listen = "127.0.0.1:26379"
"#,
        key: "daemon.tls.plaintext_listen",
        line: 7,
        reason: "overlaps daemon.listen",
    },
    Bad {
        what: "a plaintext probe listener while HTTP is plaintext anyway",
        toml: r#"
[daemon]
[daemon.tls]
cert_file = "{dir}/cert.pem"
key_file = "{dir}/key.pem"
auth_clients = "no"
plaintext_http_listen = "127.0.0.1:9480"
"#,
        key: "daemon.tls.plaintext_http_listen",
        line: 6,
        reason: "only applies with http = true",
    },
    Bad {
        what: "a user named default",
        toml: r#"
[daemon]
password_file = "{dir}/secret"
[[daemon.user]]
name = "default"
role = "client"
password_file = "{dir}/secret"
"#,
        key: "daemon.user[0].name",
        line: 4,
        reason: "is the user of password_file",
    },
    Bad {
        what: "a user whose role is none",
        toml: r#"
[daemon]
password_file = "{dir}/secret"
[[daemon.user]]
name = "app"
role = "none"
password_file = "{dir}/secret"
"#,
        key: "daemon.user[0].role",
        line: 5,
        reason: "must be client, operator, peer or all",
    },
    Bad {
        what: "a user defined twice",
        toml: r#"
[daemon]
password_file = "{dir}/secret"
[[daemon.user]]
name = "app"
role = "client"
password_file = "{dir}/secret"
[[daemon.user]]
name = "app"
role = "operator"
password_file = "{dir}/secret"
"#,
        key: "daemon.user[1].name",
        line: 8,
        reason: "defined twice (also daemon.user[0])",
    },
    Bad {
        what: "peer_user names no user",
        toml: r#"
[daemon]
password_file = "{dir}/secret"
peer_user = "nobody"
"#,
        key: "daemon.peer_user",
        line: 3,
        reason: "is not one of the [[daemon.user]] names",
    },
    Bad {
        what: "peer_user is not a peer",
        toml: r#"
[daemon]
password_file = "{dir}/secret"
peer_user = "app"
[[daemon.user]]
name = "app"
role = "client"
password_file = "{dir}/secret"
"#,
        key: "daemon.peer_user",
        line: 3,
        reason: "the peers need role peer",
    },
    Bad {
        what: "users, but the default user may do anything without AUTH",
        toml: r#"
[daemon]
[[daemon.user]]
name = "ops"
role = "operator"
password_file = "{dir}/secret"
"#,
        key: "daemon.default_role",
        line: 1,
        reason: "anyone may run every command",
    },
];

#[test]
fn every_bad_config_names_its_key_line_and_reason() {
    assert!(BAD.len() >= 20);
    let fx = Fixture::new();
    let mut failures = Vec::new();
    for case in BAD {
        let problems = match fx.load(case.toml) {
            Ok(_) => {
                failures.push(format!("{}: loaded without problems", case.what));
                continue;
            }
            Err(e) => e.problems().to_vec(),
        };
        let ok = problems.len() == 1
            && problems[0].key == case.key
            && problems[0].line == Some(case.line)
            && problems[0].reason.contains(case.reason);
        if !ok {
            failures.push(format!(
                "{}: expected one problem {}:{} containing {:?}, got {problems:?}",
                case.what, case.key, case.line, case.reason
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn display_is_one_path_line_key_reason_per_problem() {
    let fx = Fixture::new();
    let err = fx
        .load(
            r#"
[daemon]
peers = ["127.0.0.2:26379", "127.0.0.3:26379"]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 5
"#,
        )
        .unwrap_err();
    let file = fx.path().join("picket.toml");
    assert_eq!(err.path(), file);
    assert_eq!(
        err.to_string(),
        format!(
            "{}:7: group[0].quorum: must be between 1 and 3 (the number of daemons)",
            file.display()
        )
    );
}

#[test]
fn all_problems_are_reported_in_file_order() {
    let fx = Fixture::new();
    let err = fx
        .load(
            r#"
[daemon]
listen = "nope"
peers = ["127.0.0.2:26379", "127.0.0.2:26379"]

[[group]]
name = "a b"
master = "127.0.0.5"
quorum = 9
down_after = "0s"

[[group.discovery]]
type = "webhook"
url = "hooks.example"
"#,
        )
        .unwrap_err();
    let got: Vec<(Option<usize>, &str)> = err
        .problems()
        .iter()
        .map(|p| (p.line, p.key.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some(2), "daemon.listen"),
            (Some(3), "daemon.peers[1]"),
            (Some(6), "group[0].name"),
            (Some(7), "group[0].master"),
            (Some(8), "group[0].quorum"),
            (Some(9), "group[0].down_after"),
            (Some(13), "group[0].discovery[0].url"),
        ]
    );
    assert_eq!(err.to_string().lines().count(), 7);
}

#[test]
fn minimal_config_from_the_design_loads() {
    let fx = Fixture::new();
    fs::write(fx.path().join("kubeconfig"), "apiVersion: v1\n").unwrap();
    let config = fx
        .load(
            r#"
[daemon]
id = "picket-a"                 # optional; generated once and persisted in data_dir
listen = "0.0.0.0:26379"        # RESP: Sentinel-compatible API and the peer protocol
announce = "10.0.0.1:26379"     # optional; the address peers and clients should use
http_listen = "0.0.0.0:9479"    # /metrics /healthz /readyz /v1/status
data_dir = "/var/lib/picket"
password_file = "{dir}/secret"   # AUTH required on `listen` when set
log_format = "text"             # or "json"
peers = ["10.0.0.2:26379", "10.0.0.3:26379"]   # the other daemons (a key of [daemon])

[[group]]
name = "cache"
master = "10.1.0.5:6379"        # the initial master; replicas are discovered from INFO
quorum = 2
down_after = "1s"
failover_timeout = "30s"
parallel_syncs = 1
flush_on_failover = false

[[group.discovery]]
type = "kubernetes"
kubeconfig = "{dir}/kubeconfig"   # omitted: in-cluster service account
context = "prod"                        # omitted: current-context
namespace = "cache"
mode = "pod-labels"                     # or "endpointslice"
pod_selector = "app=cache"              # pod-labels: which pods; matched to instances by pod IP
role_label = "role"                     # pod-labels: key; values master_value / replica_value
service = "cache"                       # endpointslice: the selector-less Service
required = true

[[group.discovery]]
type = "exec"
command = ["/usr/local/bin/reconfigure", "--flag"]   # argv; Sentinel's 7 arguments appended
timeout = "5s"

[[group.discovery]]
type = "webhook"
url = "https://hooks.example/picket"
timeout = "2s"

[[group.discovery]]
type = "file"
path = "{dir}/cache.json"
"#,
        )
        .unwrap();
    assert_eq!(config.daemon.id.as_deref(), Some("picket-a"));
    assert_eq!(config.daemon.announce_addr(), "10.0.0.1:26379");
    assert_eq!(config.daemon.peers.len(), 2);
    assert_eq!(config.groups.len(), 1);
    let g = &config.groups[0];
    assert_eq!(g.down_after, Duration::from_secs(1));
    assert_eq!(g.failover_timeout, Duration::from_secs(30));
    assert_eq!(g.discovery.len(), 4);
    match &g.discovery[0] {
        DiscoveryConfig::Kubernetes(k) => {
            assert_eq!(k.mode, KubernetesMode::PodLabels);
            assert_eq!(k.pod_selector.as_deref(), Some("app=cache"));
            assert_eq!(k.timeout, Duration::from_secs(2), "default timeout");
        }
        other => panic!("expected kubernetes, got {other:?}"),
    }
    let summary = config.summary();
    assert!(
        summary.contains("daemon picket-a: listen 0.0.0.0:26379"),
        "{summary}"
    );
    assert!(
        summary.contains("peers (2): 10.0.0.2:26379, 10.0.0.3:26379"),
        "{summary}"
    );
    assert!(
        summary.contains(
            "group cache: master 10.1.0.5:6379, quorum 2 of 3, down_after 1s, \
             failover_timeout 30s, flush_on_failover no, \
             discovery: kubernetes (pod-labels), exec, webhook, file"
        ),
        "{summary}"
    );
}

#[test]
fn a_daemon_without_groups_is_valid_and_gets_defaults() {
    let fx = Fixture::new();
    let config = fx.load("[daemon]\n").unwrap();
    assert!(config.groups.is_empty());
    assert_eq!(config.daemon.listen, "0.0.0.0:26379");
    assert_eq!(config.daemon.http_listen, "0.0.0.0:9479");
    assert_eq!(config.daemon.data_dir, PathBuf::from("/var/lib/picket"));
    assert_eq!(config.daemon.log_format, LogFormat::Text);
    assert_eq!(config.daemon.max_clients, 10_000);
    let summary = config.summary();
    assert!(
        summary.contains("(id generated on first start"),
        "{summary}"
    );
    assert!(summary.contains("peers: none"), "{summary}");
    assert!(
        summary.contains(
            "security: listen in plaintext; default user: no AUTH needed, role all; users: 0"
        ),
        "{summary}"
    );
    assert!(summary.contains("groups: none"), "{summary}");
}

#[test]
fn durations_accept_milliseconds_and_seconds() {
    let fx = Fixture::new();
    let config = fx
        .load(
            r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
down_after = "250ms"
failover_timeout = "1s"

[[group.discovery]]
type = "exec"
command = ["/bin/true"]
timeout = "1m 30s"
"#,
        )
        .unwrap();
    let g = &config.groups[0];
    assert_eq!(g.down_after, Duration::from_millis(250));
    assert_eq!(g.failover_timeout, Duration::from_secs(1));
    assert_eq!(g.parallel_syncs, 1, "default");
    match &g.discovery[0] {
        DiscoveryConfig::Exec(e) => assert_eq!(e.timeout, Duration::from_secs(90)),
        other => panic!("expected exec, got {other:?}"),
    }
}

/// Load and expect exactly one problem.
fn one_problem(fx: &Fixture, text: &str) -> (Option<usize>, String, String) {
    let err = fx.load(text).unwrap_err();
    assert_eq!(err.problems().len(), 1, "{err}");
    let p = &err.problems()[0];
    (p.line, p.key.clone(), p.reason.clone())
}

#[test]
fn bad_duration_string_points_at_its_key() {
    let fx = Fixture::new();
    let (line, key, reason) = one_problem(
        &fx,
        r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
down_after = "5 parsecs"
"#,
    );
    assert_eq!((line, key.as_str()), (Some(7), "group[0].down_after"));
    assert!(reason.contains("expected a duration"), "{reason}");
}

#[test]
fn bad_duration_inside_a_discovery_entry_points_at_its_key() {
    let fx = Fixture::new();
    let (line, key, reason) = one_problem(
        &fx,
        r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "exec"
command = ["/bin/true"]
timeout = "soon"
"#,
    );
    assert_eq!(
        (line, key.as_str()),
        (Some(11), "group[0].discovery[0].timeout")
    );
    assert!(reason.contains("expected a duration"), "{reason}");
}

#[test]
fn toml_syntax_error_reports_its_line() {
    let fx = Fixture::new();
    let (line, key, reason) = one_problem(
        &fx,
        r#"
[daemon]
id = "picket-a"
listen = "127.0.0.1:26379
http_listen = "127.0.0.1:9479"
"#,
    );
    assert_eq!(line, Some(3));
    assert_eq!(key, "daemon.listen");
    assert!(reason.contains("string"), "{reason}");
}

#[test]
fn duplicate_key_is_a_syntax_error_on_the_second_one() {
    let fx = Fixture::new();
    let (line, key, reason) = one_problem(
        &fx,
        r#"
[daemon]
listen = "127.0.0.1:26379"

listen = "127.0.0.2:26379"
"#,
    );
    assert_eq!((line, key.as_str()), (Some(4), "daemon.listen"));
    assert!(reason.contains("duplicate key"), "{reason}");
}

#[test]
fn unknown_key_typo_reports_its_line() {
    let fx = Fixture::new();
    let (line, key, reason) = one_problem(
        &fx,
        r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1
down_aftr = "1s"
"#,
    );
    assert_eq!((line, key.as_str()), (Some(7), "group[0].down_aftr"));
    assert!(reason.contains("unknown field `down_aftr`"), "{reason}");
}

#[test]
fn unknown_key_in_a_discovery_entry_reports_its_line() {
    let fx = Fixture::new();
    let (line, key, reason) = one_problem(
        &fx,
        r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "webhook"
url = "https://hooks.example/picket"
tokenfile = "/etc/picket/token"
"#,
    );
    assert_eq!(
        (line, key.as_str()),
        (Some(11), "group[0].discovery[0].tokenfile")
    );
    assert!(reason.contains("unknown field `tokenfile`"), "{reason}");
}

#[test]
fn unknown_discovery_type_points_at_the_type() {
    let fx = Fixture::new();
    let (line, key, reason) = one_problem(
        &fx,
        r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = 1

[[group.discovery]]
type = "consul"
"#,
    );
    assert_eq!(
        (line, key.as_str()),
        (Some(9), "group[0].discovery[0].type")
    );
    assert!(reason.contains("unknown variant `consul`"), "{reason}");
}

#[test]
fn wrong_type_points_at_the_value() {
    let fx = Fixture::new();
    let (line, key, reason) = one_problem(
        &fx,
        r#"
[daemon]

[[group]]
name = "cache"
master = "127.0.0.5:6379"
quorum = "two"
"#,
    );
    assert_eq!((line, key.as_str()), (Some(6), "group[0].quorum"));
    assert!(reason.contains("invalid type"), "{reason}");
}

#[test]
fn missing_required_key_points_at_its_table_header() {
    let fx = Fixture::new();
    let (line, key, reason) = one_problem(
        &fx,
        r#"
[daemon]

[[group]]
name = "cache"
quorum = 1
"#,
    );
    assert_eq!((line, key.as_str()), (Some(3), "group[0].master"));
    assert!(reason.contains("missing"), "{reason}");

    let (line, key, _) = one_problem(&fx, "# no daemon table\n");
    assert_eq!((line, key.as_str()), (Some(1), "daemon"));
}

#[test]
fn unreadable_file_is_one_problem_without_a_line() {
    let fx = Fixture::new();
    let missing = fx.path().join("absent.toml");
    let err = load(&missing).unwrap_err();
    assert_eq!(err.problems().len(), 1);
    assert_eq!(err.problems()[0].line, None);
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!("{}: cannot read", missing.display())),
        "{shown}"
    );
}

#[test]
fn load_str_names_the_given_path() {
    let err = load_str(Path::new("/etc/picket.toml"), "[daemon]\nmax_clients = 0\n").unwrap_err();
    assert_eq!(
        err.to_string(),
        "/etc/picket.toml:2: daemon.max_clients: must be at least 1"
    );
}

// ---------------------------------------------------------------------------
// The shipped example.

fn example_text() -> String {
    fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/picket.toml")).unwrap()
}

/// Keys whose value names a file (or, for `path`, a file to create).
const FILE_KEYS: &[&str] = &[
    "password_file",
    "ca_file",
    "cert_file",
    "key_file",
    "token_file",
    "hmac_key_file",
    "kubeconfig",
    "path",
];

/// Point every file-naming key of the example at a file in `dir`, keeping
/// every line where it is.
fn rewrite_file_keys(text: &str, dir: &Path) -> (String, usize) {
    let mut rewritten = 0;
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            let key = line.split('=').next().unwrap_or("").trim();
            if line.contains('=') && !line.trim_start().starts_with('#') && FILE_KEYS.contains(&key)
            {
                rewritten += 1;
                let target = match key {
                    "path" => format!("out{rewritten}.json"),
                    // [daemon.tls] files must hold PEM (checked at load).
                    "cert_file" | "ca_file" => "cert.pem".to_string(),
                    "key_file" => "key.pem".to_string(),
                    _ => "secret".to_string(),
                };
                format!("{key} = \"{}\"", dir.join(target).display())
            } else {
                line.to_string()
            }
        })
        .collect();
    (lines.join("\n"), rewritten)
}

#[test]
fn example_config_validates_once_its_files_exist() {
    let fx = Fixture::new();
    let (text, rewritten) = rewrite_file_keys(&example_text(), fx.path());
    assert!(
        rewritten >= FILE_KEYS.len(),
        "only {rewritten} file keys found"
    );
    let file = fx.path().join("picket.toml");
    fs::write(&file, text).unwrap();
    let config = load(&file).unwrap_or_else(|e| panic!("{e}"));
    assert!(!config.groups.is_empty());
    let summary = config.summary();
    assert!(
        summary.contains(
            "security: TLS on listen (client certificates: optional), to the peers, \
             plaintext on 0.0.0.0:26380, HTTPS; default user: password, role client; \
             users: 2; peers logged in as picket-peer"
        ),
        "{summary}"
    );
}

#[test]
fn example_config_problems_are_only_its_missing_files() {
    let text = example_text();
    match load_str(Path::new("picket.toml"), &text) {
        Ok(_) => {} // every file it names happens to exist here
        Err(e) => {
            for p in e.problems() {
                let last = p.key.rsplit('.').next().unwrap_or("");
                assert!(FILE_KEYS.contains(&last), "unexpected problem: {e}");
            }
        }
    }
}

/// Every key of the schema, as `daemon.id`, `group.tls.ca_file`,
/// `group.discovery.exec.timeout`: found by serializing a config in which
/// every optional value is set and every discovery type is present, so a
/// field added to the schema must be added to the example too.
#[test]
fn example_config_has_every_key() {
    use picket::config::{
        AuthClients, DaemonConfig, ExecConfig, FileConfig, GroupConfig, IsolationFencingConfig,
        KubernetesConfig, ListenTlsConfig, MembersConfig, PortRef, Role, TlsConfig, UserConfig,
        WebhookConfig,
    };
    let p = || Some(PathBuf::from("/x"));
    let s = || Some("x".to_string());
    let d = Duration::from_secs(1);
    let full = Config {
        daemon: DaemonConfig {
            id: s(),
            listen: "x".into(),
            announce: s(),
            http_listen: "x".into(),
            data_dir: "/x".into(),
            password_file: p(),
            log_format: LogFormat::Json,
            peers: vec![picket::addr::Addr::new("x", 1)],
            max_clients: 1,
            tcp_backlog: 1,
            enable_fault_injection: true,
            default_role: Role::Client,
            peer_user: s(),
            tls: Some(ListenTlsConfig {
                cert_file: "/x".into(),
                key_file: "/x".into(),
                ca_file: p(),
                auth_clients: AuthClients::Optional,
                peers: true,
                verify_peer_name: true,
                plaintext_listen: s(),
                http: true,
                plaintext_http_listen: s(),
            }),
            users: vec![UserConfig {
                name: "x".into(),
                role: Role::Peer,
                password_file: "/x".into(),
            }],
        },
        groups: vec![GroupConfig {
            name: "x".into(),
            master: picket::addr::Addr::new("x", 1),
            quorum: 1,
            down_after: d,
            down_after_refused: Some(d),
            failover_timeout: d,
            parallel_syncs: 1,
            flush_on_failover: true,
            announce_hostnames: false,
            username: s(),
            password_file: p(),
            tls: Some(TlsConfig {
                ca_file: p(),
                cert_file: p(),
                key_file: p(),
                server_name: s(),
            }),
            admin_port: Some(1),
            isolation_fencing: Some(IsolationFencingConfig {
                min_replicas: 2,
                max_lag: d,
            }),
            discovery: vec![
                DiscoveryConfig::Kubernetes(KubernetesConfig {
                    kubeconfig: p(),
                    context: s(),
                    namespace: "x".into(),
                    mode: KubernetesMode::PodLabels,
                    pod_selector: s(),
                    role_label: "x".into(),
                    master_value: "x".into(),
                    replica_value: "x".into(),
                    service: s(),
                    port_name: "x".into(),
                    required: true,
                    timeout: d,
                    service_gate_timeout: d,
                    skip_service_gate: true,
                }),
                DiscoveryConfig::Exec(ExecConfig {
                    command: vec!["x".into()],
                    timeout: d,
                    required: true,
                    on_fence: false,
                }),
                DiscoveryConfig::Webhook(WebhookConfig {
                    url: "x".into(),
                    timeout: d,
                    token_file: p(),
                    hmac_key_file: p(),
                    ca_file: p(),
                    required: true,
                }),
                DiscoveryConfig::File(FileConfig {
                    path: "/x".into(),
                    required: true,
                }),
            ],
            members: Some(MembersConfig {
                kubeconfig: p(),
                context: s(),
                namespace: s(),
                pod_selector: s(),
                port: PortRef::Number(1),
                handover_on_delete: true,
                timeout: d,
            }),
            forget_after: d,
        }],
    };
    let schema = key_set(&toml::Value::try_from(&full).unwrap());
    let example = key_set(&toml::from_str::<toml::Value>(&example_text()).unwrap());
    let missing: Vec<&String> = schema.difference(&example).collect();
    assert!(
        missing.is_empty(),
        "keys missing from config/picket.toml: {missing:?}"
    );
    assert!(
        schema.len() > 40,
        "schema walk found only {} keys",
        schema.len()
    );
}

/// Dotted key names without array indices; discovery entries are keyed by
/// their type.
fn key_set(value: &toml::Value) -> std::collections::BTreeSet<String> {
    fn walk(v: &toml::Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
        match v {
            toml::Value::Table(t) => {
                let prefix = match (prefix.ends_with("discovery"), t.get("type")) {
                    (true, Some(toml::Value::String(kind))) => format!("{prefix}.{kind}"),
                    _ => prefix.to_string(),
                };
                for (k, v) in t {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    out.insert(key.clone());
                    walk(v, &key, out);
                }
            }
            toml::Value::Array(items) => items.iter().for_each(|i| walk(i, prefix, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(value, "", &mut out);
    out
}

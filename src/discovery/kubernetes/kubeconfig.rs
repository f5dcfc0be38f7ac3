//! Where the Kubernetes API is and how picket authenticates to it.
//!
//! kube-rs reads the kubeconfig (`Kubeconfig::read_from`, relative paths
//! made absolute, the context resolved by `Config::from_custom_kubeconfig`)
//! or the pod's service account (`Config::incluster`). picket adds what
//! kube-rs does not do safely for a daemon (and `client.rs` reads token
//! files, trimmed):
//!
//! - refusals at start-up of what would fail later or hang: an
//!   `auth-provider` (kube-rs runs the gcp one's command without a
//!   deadline), username/password (removed from Kubernetes), a proxy other
//!   than `http://`, half a client certificate or a certificate file that
//!   is not there (kube-rs drops both silently and the first request gets a
//!   401); only the kubeconfig's own `proxy-url`, never `HTTPS_PROXY`;
//! - exec credential plugins, run here ([`ExecPlugin`]): kube-rs runs them
//!   synchronously on the runtime's thread, with no deadline, with the
//!   terminal's stdin unless `interactiveMode: Never`, three times while
//!   building a client, and never again after a 401; picket runs them
//!   non-interactively, killed after a deadline, and hands kube-rs the
//!   token or client certificate they return.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use futures::FutureExt as _;
use kube::config::{self as kc, KubeConfigOptions, Kubeconfig};
use serde::Deserialize;

/// Default deadline of one exec credential plugin run.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(10);

const EXEC_V1: &str = "client.authentication.k8s.io/v1";
const EXEC_V1BETA1: &str = "client.authentication.k8s.io/v1beta1";

/// Everything needed to reach and authenticate to one API server.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// kube-rs's settings: the server, the CA, TLS options, the proxy, the
    /// token or token file and client certificate (never the exec plugin).
    pub config: kube::Config,
    /// The user's exec credential plugin, which picket runs itself.
    pub exec: Option<ExecPlugin>,
}

/// Why no usable cluster configuration could be built.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// kube-rs could not read or resolve the kubeconfig.
    #[error("kubeconfig {path}: {message}")]
    Kube {
        /// The file.
        path: PathBuf,
        /// kube-rs's error and its causes.
        message: String,
    },
    /// A setting picket refuses (see the module documentation).
    #[error("kubeconfig {path}: {what}")]
    Refused {
        /// The file.
        path: PathBuf,
        /// What (and what to use instead).
        what: String,
    },
    /// kube-rs could not read the pod's service account.
    #[error(
        "in-cluster service account: {0} (is picket running in a pod? otherwise set `kubeconfig`)"
    )]
    InCluster(String),
}

impl ClusterConfig {
    /// From `kubeconfig` (with `context`, or its current-context) when
    /// given, else the in-cluster service account.
    pub fn load(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Self, KubeconfigError> {
        match kubeconfig {
            Some(path) => Self::from_kubeconfig(path, context),
            None => kube::Config::incluster()
                .map(|config| ClusterConfig { config, exec: None })
                .map_err(|e| KubeconfigError::InCluster(super::client::error_chain(&e))),
        }
    }

    /// Read `path` (relative paths in it resolve against its directory)
    /// and resolve `context` (or the file's current-context).
    pub fn from_kubeconfig(path: &Path, context: Option<&str>) -> Result<Self, KubeconfigError> {
        let kubeconfig = Kubeconfig::read_from(path).map_err(|e| KubeconfigError::Kube {
            path: path.to_path_buf(),
            message: super::client::error_chain(&e),
        })?;
        Self::from_parsed(kubeconfig, path, context)
    }

    /// Resolve an already parsed kubeconfig (`path` only names it in errors).
    pub fn from_parsed(
        kubeconfig: Kubeconfig,
        path: &Path,
        context: Option<&str>,
    ) -> Result<Self, KubeconfigError> {
        let refuse = |what: String| KubeconfigError::Refused {
            path: path.to_path_buf(),
            what,
        };
        let options = KubeConfigOptions {
            context: context.map(str::to_string),
            ..Default::default()
        };
        // The kubeconfig's own proxy-url only: kube-rs would fall back to
        // HTTPS_PROXY, which may be meant for other traffic (and kube-rs
        // ignores NO_PROXY).
        let own_proxy = context
            .map(str::to_string)
            .or_else(|| kubeconfig.current_context.clone())
            .and_then(|name| kubeconfig.contexts.iter().find(|c| c.name == name).cloned())
            .and_then(|c| c.context)
            .and_then(|c| {
                kubeconfig
                    .clusters
                    .iter()
                    .find(|n| n.name == c.cluster)
                    .cloned()
            })
            .and_then(|n| n.cluster?.proxy_url)
            .filter(|p| !p.trim().is_empty());
        // Nothing in it waits (it reads local files): it completes at once.
        let kube_error = |message: String| KubeconfigError::Kube {
            path: path.to_path_buf(),
            message,
        };
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
            .now_or_never()
            .ok_or_else(|| kube_error("its resolution did not complete".into()))?
            .map_err(|e| kube_error(super::client::error_chain(&e)))?;
        config.proxy_url = None;
        if let Some(p) = own_proxy {
            if !p.starts_with("http://") {
                return Err(refuse(format!(
                    "proxy-url {p:?} is not supported (only an http:// proxy, HTTP CONNECT)"
                )));
            }
            config.proxy_url = Some(
                p.parse()
                    .map_err(|_| refuse(format!("bad proxy-url {p:?}")))?,
            );
        }
        let user = &mut config.auth_info;
        if user.auth_provider.is_some() {
            return Err(refuse(
                "auth-provider is not supported (use an exec credential plugin instead)".into(),
            ));
        }
        if user.username.is_some() || user.password.is_some() {
            return Err(refuse(
                "username/password is not supported (basic auth was removed from Kubernetes)"
                    .into(),
            ));
        }
        let cert = user.client_certificate_data.is_some() || user.client_certificate.is_some();
        let key = user.client_key_data.is_some() || user.client_key.is_some();
        if cert != key {
            return Err(refuse(
                "a client certificate needs both client-certificate(-data) and client-key(-data)"
                    .into(),
            ));
        }
        // A `-data` field wins over the file; a file named must be there.
        for (data, file) in [
            (
                user.client_certificate_data.is_some(),
                &user.client_certificate,
            ),
            (user.client_key_data.is_some(), &user.client_key),
        ] {
            if let (false, Some(f)) = (data, file) {
                std::fs::metadata(f).map_err(|e| refuse(format!("cannot read {f}: {e}")))?;
            }
        }
        // kubectl's precedence: a token or token file, then exec.
        let exec = match user.exec.take() {
            Some(e) if user.token.is_none() && user.token_file.is_none() => {
                let dir = path.parent().unwrap_or_else(|| Path::new("."));
                Some(ExecPlugin::new(e, dir).map_err(refuse)?)
            }
            _ => None,
        };
        Ok(ClusterConfig { config, exec })
    }

    /// Shorten the exec plugin deadline (tests); no-op without a plugin.
    pub fn with_exec_timeout(mut self, timeout: Duration) -> Self {
        if let Some(e) = &mut self.exec {
            e.timeout = timeout;
        }
        self
    }
}

/// A kubeconfig `exec` credential plugin, as picket runs it.
#[derive(Debug, Clone)]
pub struct ExecPlugin {
    /// The user's `exec` (its `cluster` filled by kube-rs with
    /// `provideClusterInfo`).
    config: kc::ExecConfig,
    /// The program (a relative path with a `/` resolved against the kubeconfig's directory).
    command: PathBuf,
    /// The plugin is killed after this long.
    timeout: Duration,
}

/// What an exec plugin returned.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ExecCredential {
    /// Bearer token, if any.
    pub token: Option<String>,
    /// PEM client certificate and key, if it returned them.
    pub identity: Option<(String, String)>,
    /// When it expires (`None`: until a 401).
    pub expires: Option<SystemTime>,
}

impl std::fmt::Debug for ExecCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecCredential")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("identity", &self.identity.as_ref().map(|_| "<redacted>"))
            .field("expires", &self.expires)
            .finish()
    }
}

/// The exec plugin could not be started, failed, timed out or printed garbage.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("exec credential plugin {command}: {message}")]
pub struct CredentialError {
    /// The program.
    pub command: String,
    /// What went wrong.
    pub message: String,
}

impl ExecPlugin {
    fn new(config: kc::ExecConfig, dir: &Path) -> Result<Self, String> {
        let api = config.api_version.as_deref().unwrap_or_default();
        if api != EXEC_V1 && api != EXEC_V1BETA1 {
            return Err(format!(
                "exec apiVersion {api:?} is not supported (use {EXEC_V1} or {EXEC_V1BETA1})"
            ));
        }
        if config.interactive_mode == Some(kc::ExecInteractiveMode::Always) {
            return Err(
                "exec interactiveMode Always is not supported (picket is a daemon without a terminal)"
                    .into(),
            );
        }
        let command = config.command.as_deref().filter(|c| !c.is_empty());
        let command = command.ok_or("exec.command is missing")?;
        // kubectl: a relative path with a separator is relative to the
        // kubeconfig; a bare name is looked up in PATH.
        let command = if command.contains('/') {
            dir.join(command)
        } else {
            PathBuf::from(command)
        };
        Ok(ExecPlugin {
            config,
            command,
            timeout: DEFAULT_EXEC_TIMEOUT,
        })
    }

    /// `KUBERNETES_EXEC_INFO`: never interactive, the cluster when asked for.
    fn exec_info(&self) -> String {
        let mut spec = serde_json::json!({ "interactive": false });
        if let Some(c) = self
            .config
            .cluster
            .as_ref()
            .filter(|_| self.config.provide_cluster_info)
        {
            spec["cluster"] = serde_json::to_value(c).unwrap_or_default();
        }
        serde_json::json!({
            "apiVersion": self.config.api_version,
            "kind": "ExecCredential",
            "spec": spec,
        })
        .to_string()
    }

    /// Run the plugin, stdin closed, killed after its deadline.
    pub async fn run(&self) -> Result<ExecCredential, CredentialError> {
        let fail = |message: String| CredentialError {
            command: self.command.display().to_string(),
            message,
        };
        let env = self.config.env.iter().flatten();
        let mut cmd = tokio::process::Command::new(&self.command);
        cmd.args(self.config.args.iter().flatten())
            .envs(env.filter_map(|v| Some((v.get("name")?, v.get("value")?))))
            .env("KUBERNETES_EXEC_INFO", self.exec_info())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A plugin that outlives its deadline is killed when the future is dropped.
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| fail(format!("cannot start: {e}")))?;
        let out = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| fail(format!("timed out after {:?}", self.timeout)))?
            .map_err(|e| fail(format!("wait failed: {e}")))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let stderr: String = stderr.trim().chars().take(300).collect();
            return Err(fail(format!("exited with {}: {stderr}", out.status)));
        }
        // Never echo stdout: it holds the credential.
        let api = self.config.api_version.as_deref().unwrap_or_default();
        decode_exec_credential(&out.stdout, api).map_err(fail)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawExecCredential {
    api_version: Option<String>,
    kind: Option<String>,
    status: Option<RawExecStatus>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RawExecStatus {
    token: Option<String>,
    client_certificate_data: Option<String>,
    client_key_data: Option<String>,
    expiration_timestamp: Option<String>,
}

/// Describe why a plugin's output is not JSON of the right shape without
/// quoting the output: serde_json's "invalid type: string \"...\"" and
/// "invalid value" messages repeat the offending value, which may be the
/// token itself, and this message is logged.
fn exec_output_error(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let quotes_input = [
        "invalid type",
        "invalid value",
        "unknown variant",
        "invalid length",
    ]
    .iter()
    .any(|m| message.contains(m));
    if quotes_input {
        format!(
            "output is not an ExecCredential: a value has the wrong type at line {} column {}",
            e.line(),
            e.column()
        )
    } else {
        format!("output is not an ExecCredential: {message}")
    }
}

/// Decode an exec plugin's standard output (an `ExecCredential` object
/// whose `apiVersion` must be `api_version`).
///
/// Public so that the fuzz target `kube_json` can feed it arbitrary bytes.
pub fn decode_exec_credential(stdout: &[u8], api_version: &str) -> Result<ExecCredential, String> {
    let raw: RawExecCredential =
        serde_json::from_slice(stdout).map_err(|e| exec_output_error(&e))?;
    if raw.kind.as_deref() != Some("ExecCredential") {
        return Err("output kind is not ExecCredential".into());
    }
    if raw.api_version.as_deref() != Some(api_version) {
        return Err(format!(
            "output apiVersion {:?} does not match the requested {api_version}",
            raw.api_version
        ));
    }
    let status = raw
        .status
        .ok_or_else(|| "output has no status".to_string())?;
    let token = status
        .token
        .filter(|t| !t.is_empty())
        .map(|t| t.trim().to_string());
    let identity = match (status.client_certificate_data, status.client_key_data) {
        (Some(c), Some(k)) if !c.is_empty() && !k.is_empty() => Some((c, k)),
        (None, None) => None,
        _ => {
            return Err("status has only one of clientCertificateData and clientKeyData".into());
        }
    };
    if token.is_none() && identity.is_none() {
        return Err("status has neither token nor clientCertificateData/clientKeyData".into());
    }
    let expires = match status.expiration_timestamp.as_deref() {
        None | Some("") => None,
        Some(ts) => {
            Some(parse_timestamp(ts).ok_or_else(|| format!("bad expirationTimestamp {ts:?}"))?)
        }
    };
    Ok(ExecCredential {
        token,
        identity,
        expires,
    })
}

/// RFC 3339 with `Z` or a numeric offset (`+02:00`), as the exec
/// credential's `expirationTimestamp` is (chrono, k8s-openapi's own time
/// crate).
pub(crate) fn parse_timestamp(ts: &str) -> Option<SystemTime> {
    k8s_openapi::chrono::DateTime::parse_from_rfc3339(ts)
        .ok()
        .map(SystemTime::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<ClusterConfig, KubeconfigError> {
        let k = Kubeconfig::from_yaml(yaml).unwrap();
        ClusterConfig::from_parsed(k, Path::new("/etc/picket/kubeconfig"), None)
    }

    const EXEC: &str = r#"
current-context: x
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: ./bin/get-token
      args: ["--cluster", "prod"]
      env: [{name: REGION, value: eu}]
      interactiveMode: Never
      provideClusterInfo: true
contexts:
- name: x
  context: {cluster: c, user: u}
"#;

    #[test]
    fn what_kube_would_take_and_picket_refuses() {
        let c = parse(EXEC).unwrap();
        let e = c.exec.as_ref().unwrap();
        assert_eq!(e.command, PathBuf::from("/etc/picket/./bin/get-token"));
        assert!(c.config.auth_info.exec.is_none(), "kube-rs never runs it");
        let info: serde_json::Value = serde_json::from_str(&e.exec_info()).unwrap();
        assert_eq!(info["apiVersion"], EXEC_V1);
        assert_eq!(info["spec"]["interactive"], false);
        assert_eq!(info["spec"]["cluster"]["server"], "https://127.0.0.1:1");

        for (from, to, says) in [
            ("/v1\n", "/v2\n", "exec apiVersion"),
            ("Never", "Always", "interactiveMode Always"),
            (
                "exec:",
                "auth-provider: {name: gcp}\n    x:",
                "auth-provider",
            ),
            ("exec:", "username: u\n    x:", "username/password"),
            (
                "exec:",
                "client-certificate-data: eA==\n    x:",
                "client-key",
            ),
            (
                "exec:",
                "client-certificate: /nonexistent\n    client-key-data: eA==\n    x:",
                "/nonexistent",
            ),
            (
                "insecure-skip-tls-verify: true",
                "proxy-url: socks5://h:1",
                "socks5",
            ),
        ] {
            let e = parse(&EXEC.replace(from, to)).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        // A token wins over exec, as in kubectl.
        let c = parse(&EXEC.replace("exec:", "token: t\n    exec:")).unwrap();
        assert!(c.exec.is_none());
    }

    #[test]
    fn timestamps() {
        let z = parse_timestamp("2030-01-02T03:04:05Z").unwrap();
        let plus = parse_timestamp("2030-01-02T05:04:05+02:00").unwrap();
        assert_eq!(z, plus);
        assert!(parse_timestamp("2030-01-02T03:04:05.123Z").is_some());
        assert!(parse_timestamp("tomorrow").is_none());
        assert!(parse_timestamp("2030-01-02T03:04:05+0200").is_none());
        // Found by fuzz/fuzz_targets/kube_json: a multi-byte character
        // where an offset was expected is refused, not a panic.
        assert_eq!(parse_timestamp("2030-01-02T05:04:05+0\u{e9}:00"), None);
    }

    #[test]
    fn a_malformed_credential_is_reported_without_quoting_the_token() {
        // The error is logged; serde_json's own message for a value of the
        // wrong type repeats the value, which here is the secret.
        for out in [
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":"s3cr3t-token"}"#,
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":["s3cr3t-token"]}}"#,
            r#"["s3cr3t-token"]"#,
        ] {
            let e = decode_exec_credential(out.as_bytes(), EXEC_V1).expect_err(out);
            assert!(!e.contains("s3cr3t") && e.contains("line 1 column"), "{e}");
        }
        let e = decode_exec_credential(br#"{"kind":"ExecCredential""#, EXEC_V1).expect_err("eof");
        assert!(e.contains("EOF"), "{e}");
        let ok = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",
            "status":{"token":"s3cr3t","expirationTimestamp":"2030-01-02T05:04:05Z"}}"#;
        let c = decode_exec_credential(ok.as_bytes(), EXEC_V1).unwrap();
        assert!(c.expires.is_some() && !format!("{c:?}").contains("s3cr3t"));
    }
}

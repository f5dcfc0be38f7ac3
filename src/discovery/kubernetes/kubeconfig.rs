//! Where the Kubernetes API is and how picket authenticates to it: a
//! kubeconfig file (one context of it) or the in-cluster service account.
//!
//! Both are resolved once, at start-up, into a [`ClusterConfig`]; the
//! credentials that change at run time (token files, exec plugins) are
//! fetched through [`Credentials`], which the client asks before every
//! request and tells about every 401.
//!
//! Secrets (tokens, private keys) are wrapped in [`Secret`], whose `Debug`
//! never shows them, so that no `{:?}` of a config can leak one into a log.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use kube::config as kc;
use secrecy::ExposeSecret as _;
use serde::Deserialize;
use tokio::time::Instant;

/// Where a pod's service-account credentials are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How often a token file is re-read even when no 401 forced it: bound
/// service-account tokens rotate (about hourly) and the kubelet rewrites
/// the file well before expiry.
pub const TOKEN_FILE_REFRESH: Duration = Duration::from_secs(60);

/// Default deadline of one exec credential plugin run.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(10);

/// A credential that must never be printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret string.
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// A client certificate chain and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientIdentity {
    /// PEM certificate chain, leaf first.
    pub cert_pem: Vec<u8>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: Vec<u8>,
}

impl fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("cert_pem_len", &self.cert_pem.len())
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// How requests are authenticated (besides a client certificate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthConfig {
    /// No bearer token (client certificate only, or an unauthenticated proxy).
    None,
    /// A fixed bearer token.
    Token(Secret),
    /// A bearer token read from a file, re-read every [`TOKEN_FILE_REFRESH`] and after a 401.
    TokenFile(PathBuf),
    /// An exec credential plugin.
    Exec(ExecConfig),
}

/// A kubeconfig `exec` credential plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecConfig {
    /// `client.authentication.k8s.io/v1` or `.../v1beta1`.
    pub api_version: String,
    /// The program (a relative path with a `/` resolves against the kubeconfig's directory).
    pub command: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
    /// Whether to pass the cluster's details in `KUBERNETES_EXEC_INFO`.
    pub provide_cluster_info: bool,
    /// The plugin is killed after this long.
    pub timeout: Duration,
}

/// Everything needed to reach and authenticate to one API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Base URL, without a trailing slash (`https://10.0.0.1:6443`).
    pub server: String,
    /// PEM bundle of the CA(s) to trust; `None` only with `insecure_skip_tls_verify`
    /// or a plain-HTTP server.
    pub ca_pem: Option<Vec<u8>>,
    /// Accept any server certificate (kubeconfig `insecure-skip-tls-verify`).
    pub insecure_skip_tls_verify: bool,
    /// Name to verify the server certificate against instead of the URL host.
    pub tls_server_name: Option<String>,
    /// Client certificate from the kubeconfig (an exec plugin may supply one later).
    pub client_identity: Option<ClientIdentity>,
    /// Bearer-token source.
    pub auth: AuthConfig,
    /// The context's (or the service account's) namespace, if any.
    pub namespace: Option<String>,
    /// The kubeconfig cluster's `proxy-url` (an `http://` HTTP CONNECT
    /// proxy); the environment's `HTTPS_PROXY` is not used.
    pub proxy_url: Option<String>,
}

/// Why no usable cluster configuration could be built.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// A file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// What the file is (kubeconfig, client-key, ...).
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The kubeconfig is not valid YAML of the expected shape.
    #[error("kubeconfig {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// No `context` configured and no `current-context` in the file.
    #[error("kubeconfig {path}: no context given and no current-context set")]
    NoContext {
        /// The file.
        path: PathBuf,
    },
    /// The named context does not exist.
    #[error("kubeconfig {path}: context {name:?} not found (have: {available})")]
    ContextNotFound {
        /// The file.
        path: PathBuf,
        /// The missing context.
        name: String,
        /// The contexts the file has, comma-separated.
        available: String,
    },
    /// The context names a cluster the file does not have.
    #[error("kubeconfig {path}: context {context:?} refers to missing cluster {cluster:?}")]
    ClusterNotFound {
        /// The file.
        path: PathBuf,
        /// The context.
        context: String,
        /// The missing cluster.
        cluster: String,
    },
    /// The context names a user the file does not have.
    #[error("kubeconfig {path}: context {context:?} refers to missing user {user:?}")]
    UserNotFound {
        /// The file.
        path: PathBuf,
        /// The context.
        context: String,
        /// The missing user.
        user: String,
    },
    /// A required field is missing or empty.
    #[error("{place}: missing {field}")]
    Missing {
        /// Where (`cluster "prod"`, `user "admin"`, `in-cluster`).
        place: String,
        /// The missing field.
        field: &'static str,
    },
    /// A `*-data` field is not valid base64.
    #[error("{place}: {field} is not valid base64: {message}")]
    BadBase64 {
        /// Where.
        place: String,
        /// The field.
        field: &'static str,
        /// The decoder's message.
        message: String,
    },
    /// A configured feature picket does not implement.
    #[error("{place}: {what} is not supported")]
    Unsupported {
        /// Where.
        place: String,
        /// What (and what to use instead).
        what: String,
    },
    /// The in-cluster environment is incomplete.
    #[error(
        "in-cluster: environment variable {var} is not set (is picket running in a pod? otherwise set `kubeconfig`)"
    )]
    NotInCluster {
        /// The missing variable.
        var: &'static str,
    },
}

// The kubeconfig file format is kube-rs's (`kube::config::Kubeconfig`),
// read with serde-saphyr; its secrets are `SecretString`s, which never print.

const EXEC_V1: &str = "client.authentication.k8s.io/v1";
const EXEC_V1BETA1: &str = "client.authentication.k8s.io/v1beta1";

impl ClusterConfig {
    /// From `kubeconfig` (with `context`, or its current-context) when
    /// given, else the in-cluster service account.
    pub fn load(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Self, KubeconfigError> {
        match kubeconfig {
            Some(path) => Self::from_kubeconfig(path, context),
            None => Self::in_cluster(),
        }
    }

    /// Load `path` and resolve `context` (or the file's current-context).
    pub fn from_kubeconfig(path: &Path, context: Option<&str>) -> Result<Self, KubeconfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| KubeconfigError::Read {
            what: "kubeconfig",
            path: path.to_path_buf(),
            source,
        })?;
        let dir = path.parent().unwrap_or_else(|| Path::new("."));
        Self::from_kubeconfig_str(&text, path, dir, context)
    }

    /// Resolve a kubeconfig given as text. `path` is only used in errors;
    /// relative file paths in it resolve against `dir`.
    pub fn from_kubeconfig_str(
        text: &str,
        path: &Path,
        dir: &Path,
        context: Option<&str>,
    ) -> Result<Self, KubeconfigError> {
        let raw: kc::Kubeconfig =
            serde_saphyr::from_str(text).map_err(|e| KubeconfigError::Parse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?;
        let ctx_name = match context.map(str::to_string).or(raw.current_context.clone()) {
            Some(c) if !c.is_empty() => c,
            _ => {
                return Err(KubeconfigError::NoContext {
                    path: path.to_path_buf(),
                });
            }
        };
        let ctx = raw
            .contexts
            .iter()
            .find(|c| c.name == ctx_name)
            .ok_or_else(|| KubeconfigError::ContextNotFound {
                path: path.to_path_buf(),
                name: ctx_name.clone(),
                available: raw
                    .contexts
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let ctx_fields = ctx.context.clone().unwrap_or_default();
        let cluster_name = ctx_fields.cluster.clone();
        let cluster = raw
            .clusters
            .iter()
            .find(|c| c.name == cluster_name)
            .ok_or_else(|| KubeconfigError::ClusterNotFound {
                path: path.to_path_buf(),
                context: ctx_name.clone(),
                cluster: cluster_name.clone(),
            })?;
        // A context without a user is legal (e.g. an unauthenticated proxy).
        let user = match ctx_fields.user.as_deref() {
            None | Some("") => None,
            Some(u) => Some(raw.auth_infos.iter().find(|x| x.name == u).ok_or_else(|| {
                KubeconfigError::UserNotFound {
                    path: path.to_path_buf(),
                    context: ctx_name.clone(),
                    user: u.to_string(),
                }
            })?),
        };

        let cplace = format!("cluster {:?}", cluster.name);
        let c = cluster.cluster.clone().unwrap_or_default();
        let insecure_skip_tls_verify = c.insecure_skip_tls_verify.unwrap_or(false);
        let server = c
            .server
            .as_deref()
            .map(|s| s.trim_end_matches('/').to_string())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| KubeconfigError::Missing {
                place: cplace.clone(),
                field: "server",
            })?;
        // An HTTP CONNECT proxy (kube-rs `http-proxy`); socks5 and the
        // rest are refused here, with the place, rather than at the first
        // request.
        let proxy_url = c.proxy_url.clone().filter(|p| !p.trim().is_empty());
        if let Some(p) = &proxy_url
            && !p.starts_with("http://")
        {
            return Err(KubeconfigError::Unsupported {
                place: cplace,
                what: format!("proxy-url {p:?} (only an http:// proxy, HTTP CONNECT)"),
            });
        }
        let ca_pem = data_or_file(
            &cplace,
            "certificate-authority-data",
            c.certificate_authority_data.as_deref(),
            "certificate-authority",
            c.certificate_authority.as_deref().map(Path::new),
            dir,
        )?;
        if ca_pem.is_none() && !insecure_skip_tls_verify && server.starts_with("https://") {
            return Err(KubeconfigError::Missing {
                place: cplace,
                field: "certificate-authority or certificate-authority-data \
                        (or insecure-skip-tls-verify: true)",
            });
        }

        let mut client_identity = None;
        let mut auth = AuthConfig::None;
        if let Some(u) = user {
            let uplace = format!("user {:?}", u.name);
            let user = u.auth_info.clone().unwrap_or_default();
            if user.auth_provider.is_some() {
                return Err(KubeconfigError::Unsupported {
                    place: uplace,
                    what: "auth-provider (use an exec credential plugin instead)".into(),
                });
            }
            if user.username.is_some() || user.password.is_some() {
                return Err(KubeconfigError::Unsupported {
                    place: uplace,
                    what: "username/password (basic auth was removed from Kubernetes)".into(),
                });
            }
            let cert = data_or_file(
                &uplace,
                "client-certificate-data",
                user.client_certificate_data.as_deref(),
                "client-certificate",
                user.client_certificate.as_deref().map(Path::new),
                dir,
            )?;
            let key = data_or_file(
                &uplace,
                "client-key-data",
                user.client_key_data.as_ref().map(|k| k.expose_secret()),
                "client-key",
                user.client_key.as_deref().map(Path::new),
                dir,
            )?;
            client_identity = match (cert, key) {
                (Some(cert_pem), Some(key_pem)) => Some(ClientIdentity { cert_pem, key_pem }),
                (None, None) => None,
                (Some(_), None) => {
                    return Err(KubeconfigError::Missing {
                        place: uplace,
                        field: "client-key or client-key-data (client-certificate is set)",
                    });
                }
                (None, Some(_)) => {
                    return Err(KubeconfigError::Missing {
                        place: uplace,
                        field: "client-certificate or client-certificate-data (client-key is set)",
                    });
                }
            };
            // kubectl's precedence: a literal token, then a token file, then exec.
            let token = user.token.as_ref().map(|t| t.expose_secret());
            auth = if let Some(t) = token.filter(|t| !t.is_empty()) {
                AuthConfig::Token(Secret::new(t.trim()))
            } else if let Some(f) = &user.token_file {
                AuthConfig::TokenFile(resolve(dir, Path::new(f)))
            } else if let Some(e) = &user.exec {
                AuthConfig::Exec(exec_config(&uplace, e, dir)?)
            } else {
                AuthConfig::None
            };
        }

        Ok(ClusterConfig {
            server,
            ca_pem,
            insecure_skip_tls_verify,
            tls_server_name: c.tls_server_name.clone().filter(|s| !s.is_empty()),
            client_identity,
            auth,
            namespace: ctx_fields.namespace.clone().filter(|s| !s.is_empty()),
            proxy_url,
        })
    }

    /// The in-cluster service account, from the process environment and
    /// [`SERVICE_ACCOUNT_DIR`].
    pub fn in_cluster() -> Result<Self, KubeconfigError> {
        Self::in_cluster_from(&InClusterSource::from_env())
    }

    /// The in-cluster service account from explicit inputs (tests inject them).
    pub fn in_cluster_from(src: &InClusterSource) -> Result<Self, KubeconfigError> {
        let host =
            src.host
                .as_deref()
                .filter(|s| !s.is_empty())
                .ok_or(KubeconfigError::NotInCluster {
                    var: "KUBERNETES_SERVICE_HOST",
                })?;
        let port =
            src.port
                .as_deref()
                .filter(|s| !s.is_empty())
                .ok_or(KubeconfigError::NotInCluster {
                    var: "KUBERNETES_SERVICE_PORT",
                })?;
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let token_path = src.dir.join("token");
        // Fail now, with the path, rather than on the first request.
        std::fs::metadata(&token_path).map_err(|source| KubeconfigError::Read {
            what: "service-account token",
            path: token_path.clone(),
            source,
        })?;
        let ca_path = src.dir.join("ca.crt");
        let ca = std::fs::read(&ca_path).map_err(|source| KubeconfigError::Read {
            what: "service-account CA",
            path: ca_path,
            source,
        })?;
        let namespace = std::fs::read_to_string(src.dir.join("namespace"))
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        Ok(ClusterConfig {
            server: format!("https://{host}:{port}"),
            ca_pem: Some(ca),
            insecure_skip_tls_verify: false,
            tls_server_name: None,
            client_identity: None,
            auth: AuthConfig::TokenFile(token_path),
            namespace,
            proxy_url: None,
        })
    }

    /// Shorten the exec plugin deadline (tests); no-op for other auth kinds.
    pub fn with_exec_timeout(mut self, timeout: Duration) -> Self {
        if let AuthConfig::Exec(e) = &mut self.auth {
            e.timeout = timeout;
        }
        self
    }
}

/// Inputs of the in-cluster configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InClusterSource {
    /// `KUBERNETES_SERVICE_HOST`.
    pub host: Option<String>,
    /// `KUBERNETES_SERVICE_PORT`.
    pub port: Option<String>,
    /// The directory holding `token`, `ca.crt` and `namespace`.
    pub dir: PathBuf,
}

impl InClusterSource {
    /// From the process environment and the standard mount point.
    pub fn from_env() -> Self {
        InClusterSource {
            host: std::env::var("KUBERNETES_SERVICE_HOST").ok(),
            port: std::env::var("KUBERNETES_SERVICE_PORT").ok(),
            dir: PathBuf::from(SERVICE_ACCOUNT_DIR),
        }
    }
}

fn resolve(dir: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}

/// `-data` (base64) wins over the file path, as in kubectl.
fn data_or_file(
    place: &str,
    data_field: &'static str,
    data: Option<&str>,
    file_field: &'static str,
    file: Option<&Path>,
    dir: &Path,
) -> Result<Option<Vec<u8>>, KubeconfigError> {
    if let Some(d) = data.filter(|d| !d.trim().is_empty()) {
        let compact: String = d.split_whitespace().collect();
        return B64
            .decode(compact.as_bytes())
            .map(Some)
            .map_err(|e| KubeconfigError::BadBase64 {
                place: place.to_string(),
                field: data_field,
                message: e.to_string(),
            });
    }
    match file.filter(|f| !f.as_os_str().is_empty()) {
        None => Ok(None),
        Some(f) => {
            let path = resolve(dir, f);
            std::fs::read(&path)
                .map(Some)
                .map_err(|source| KubeconfigError::Read {
                    what: file_field,
                    path,
                    source,
                })
        }
    }
}

fn exec_config(place: &str, e: &kc::ExecConfig, dir: &Path) -> Result<ExecConfig, KubeconfigError> {
    let api_version = e.api_version.clone().unwrap_or_default();
    if api_version != EXEC_V1 && api_version != EXEC_V1BETA1 {
        return Err(KubeconfigError::Unsupported {
            place: place.to_string(),
            what: format!("exec apiVersion {api_version:?} (use {EXEC_V1} or {EXEC_V1BETA1})"),
        });
    }
    if e.interactive_mode == Some(kc::ExecInteractiveMode::Always) {
        return Err(KubeconfigError::Unsupported {
            place: place.to_string(),
            what: "exec interactiveMode Always (picket is a daemon without a terminal)".into(),
        });
    }
    let command = e
        .command
        .as_deref()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| KubeconfigError::Missing {
            place: place.to_string(),
            field: "exec.command",
        })?;
    // kubectl: a relative path with a separator is relative to the
    // kubeconfig; a bare name is looked up in PATH.
    let command = if command.contains('/') {
        resolve(dir, Path::new(command))
    } else {
        PathBuf::from(command)
    };
    Ok(ExecConfig {
        api_version,
        command,
        args: e.args.clone().unwrap_or_default(),
        // Each entry is `{name: ..., value: ...}`.
        env: e
            .env
            .iter()
            .flatten()
            .filter_map(|v| Some((v.get("name")?.clone(), v.get("value")?.clone())))
            .collect(),
        provide_cluster_info: e.provide_cluster_info,
        timeout: DEFAULT_EXEC_TIMEOUT,
    })
}

// ---- credentials at run time ----

/// Why no credential could be produced right now.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum CredentialError {
    /// The token file could not be read and no earlier token is known.
    #[error("cannot read token file {path}: {message}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        message: String,
    },
    /// The exec plugin could not be started, failed, timed out or printed garbage.
    #[error("exec credential plugin {command}: {message}")]
    Exec {
        /// The program.
        command: String,
        /// What went wrong.
        message: String,
    },
}

/// What to present on the next request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthMaterial {
    /// Bearer token, if any.
    pub token: Option<Secret>,
    /// Client certificate from an exec plugin, if it returned one.
    pub identity: Option<ClientIdentity>,
}

/// The run-time credential source of one client.
#[derive(Debug)]
pub struct Credentials {
    kind: CredKind,
}

#[derive(Debug)]
enum CredKind {
    None,
    Static(Secret),
    File {
        path: PathBuf,
        state: std::sync::Mutex<Option<(Secret, Option<Instant>)>>,
    },
    Exec {
        cfg: ExecConfig,
        exec_info: String,
        cache: tokio::sync::Mutex<Option<ExecCredential>>,
    },
}

#[derive(Debug, Clone)]
struct ExecCredential {
    material: AuthMaterial,
    expires: Option<SystemTime>,
}

/// Re-run the plugin a little before the stated expiry, not at it.
const EXPIRY_MARGIN: Duration = Duration::from_secs(5);

impl Credentials {
    /// The source described by `cluster.auth`.
    pub fn new(cluster: &ClusterConfig) -> Self {
        let kind = match &cluster.auth {
            AuthConfig::None => CredKind::None,
            AuthConfig::Token(t) => CredKind::Static(t.clone()),
            AuthConfig::TokenFile(p) => CredKind::File {
                path: p.clone(),
                state: std::sync::Mutex::new(None),
            },
            AuthConfig::Exec(e) => CredKind::Exec {
                exec_info: exec_info(e, cluster),
                cfg: e.clone(),
                cache: tokio::sync::Mutex::new(None),
            },
        };
        Credentials { kind }
    }

    /// Whether a 401 may be cured by fetching the credential again.
    pub fn refreshable(&self) -> bool {
        matches!(self.kind, CredKind::File { .. } | CredKind::Exec { .. })
    }

    /// Forget the cached credential (after a 401), so the next
    /// [`current`](Self::current) re-reads the file or re-runs the plugin.
    pub async fn invalidate(&self) {
        match &self.kind {
            CredKind::File { state, .. } => {
                let mut g = state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((_, read_at)) = g.as_mut() {
                    *read_at = None;
                }
            }
            CredKind::Exec { cache, .. } => *cache.lock().await = None,
            CredKind::None | CredKind::Static(_) => {}
        }
    }

    /// The credential to use now.
    pub async fn current(&self) -> Result<AuthMaterial, CredentialError> {
        match &self.kind {
            CredKind::None => Ok(AuthMaterial::default()),
            CredKind::Static(t) => Ok(AuthMaterial {
                token: Some(t.clone()),
                identity: None,
            }),
            CredKind::File { path, state } => {
                let mut g = state.lock().unwrap_or_else(|e| e.into_inner());
                let fresh = matches!(&*g, Some((_, Some(at))) if at.elapsed() < TOKEN_FILE_REFRESH);
                if !fresh {
                    // The file is small and local; a blocking read here is
                    // cheaper than a thread hop.
                    match crate::config::read_secret(path) {
                        Ok(t) if !t.trim().is_empty() => {
                            *g = Some((Secret::new(t.trim()), Some(Instant::now())));
                        }
                        res => {
                            let message = match res {
                                Ok(_) => "the file is empty".to_string(),
                                Err(e) => e.to_string(),
                            };
                            match g.as_mut() {
                                // Keep the last good token: a rotation in
                                // progress must not take the backend down.
                                Some((_, at)) => {
                                    tracing::warn!(path = %path.display(), error = %message,
                                        "cannot re-read token file; keeping the previous token");
                                    *at = Some(Instant::now());
                                }
                                None => {
                                    return Err(CredentialError::TokenFile {
                                        path: path.clone(),
                                        message,
                                    });
                                }
                            }
                        }
                    }
                }
                Ok(AuthMaterial {
                    token: g.as_ref().map(|(t, _)| t.clone()),
                    identity: None,
                })
            }
            CredKind::Exec {
                cfg,
                exec_info,
                cache,
            } => {
                let mut g = cache.lock().await;
                if let Some(c) = g.as_ref() {
                    let valid = match c.expires {
                        None => true,
                        Some(exp) => SystemTime::now() + EXPIRY_MARGIN < exp,
                    };
                    if valid {
                        return Ok(c.material.clone());
                    }
                }
                let cred = run_exec(cfg, exec_info).await?;
                let material = cred.material.clone();
                *g = Some(cred);
                Ok(material)
            }
        }
    }
}

fn exec_info(e: &ExecConfig, cluster: &ClusterConfig) -> String {
    let mut spec = serde_json::json!({ "interactive": false });
    if e.provide_cluster_info {
        let mut c = serde_json::json!({
            "server": cluster.server,
            "insecure-skip-tls-verify": cluster.insecure_skip_tls_verify,
        });
        if let Some(ca) = &cluster.ca_pem {
            c["certificate-authority-data"] = B64.encode(ca).into();
        }
        if let Some(n) = &cluster.tls_server_name {
            c["tls-server-name"] = n.clone().into();
        }
        spec["cluster"] = c;
    }
    serde_json::json!({
        "apiVersion": e.api_version,
        "kind": "ExecCredential",
        "spec": spec,
    })
    .to_string()
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

async fn run_exec(cfg: &ExecConfig, exec_info: &str) -> Result<ExecCredential, CredentialError> {
    let command = cfg.command.display().to_string();
    let fail = |message: String| CredentialError::Exec {
        command: command.clone(),
        message,
    };
    let mut cmd = tokio::process::Command::new(&cfg.command);
    cmd.args(&cfg.args)
        .envs(cfg.env.iter().map(|(k, v)| (k, v)))
        .env("KUBERNETES_EXEC_INFO", exec_info)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A plugin that outlives its deadline is killed when the future is dropped.
        .kill_on_drop(true);
    let child = cmd
        .spawn()
        .map_err(|e| fail(format!("cannot start: {e}")))?;
    let out = tokio::time::timeout(cfg.timeout, child.wait_with_output())
        .await
        .map_err(|_| fail(format!("timed out after {:?}", cfg.timeout)))?
        .map_err(|e| fail(format!("wait failed: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stderr: String = stderr.trim().chars().take(300).collect();
        return Err(fail(format!("exited with {}: {stderr}", out.status)));
    }
    // Never echo stdout: it holds the credential.
    let (material, expires) =
        decode_exec_credential(&out.stdout, &cfg.api_version).map_err(fail)?;
    Ok(ExecCredential { material, expires })
}

/// Decode an exec plugin's standard output (an `ExecCredential` object
/// whose `apiVersion` must be `api_version`) into what the client presents
/// and when that expires.
///
/// The client calls it after running the plugin; it is public so that the
/// fuzz target `kube_json` can feed it arbitrary bytes.
pub fn decode_exec_credential(
    stdout: &[u8],
    api_version: &str,
) -> Result<(AuthMaterial, Option<SystemTime>), String> {
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
        .map(|t| Secret::new(t.trim()));
    let identity = match (status.client_certificate_data, status.client_key_data) {
        (Some(c), Some(k)) if !c.is_empty() && !k.is_empty() => Some(ClientIdentity {
            cert_pem: c.into_bytes(),
            key_pem: k.into_bytes(),
        }),
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
    Ok((AuthMaterial { token, identity }, expires))
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

    fn parse(yaml: &str, dir: &Path, ctx: Option<&str>) -> Result<ClusterConfig, KubeconfigError> {
        ClusterConfig::from_kubeconfig_str(yaml, Path::new("/test/kubeconfig"), dir, ctx)
    }

    const BASIC: &str = r#"
apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: dev-cluster
  cluster:
    server: https://127.0.0.1:6443/
    certificate-authority-data: LS0tLS1CRUdJTi1DQS0tLS0tCg==
    tls-server-name: kubernetes.default
- name: prod-cluster
  cluster:
    server: https://10.0.0.1:6443
    insecure-skip-tls-verify: true
users:
- name: dev-user
  user:
    token: dev-token-123
- name: prod-user
  user:
    tokenFile: secrets/token
contexts:
- name: dev
  context: {cluster: dev-cluster, user: dev-user, namespace: cache}
- name: prod
  context:
    cluster: prod-cluster
    user: prod-user
"#;

    #[test]
    fn current_context_with_token_and_ca_data() {
        let c = parse(BASIC, Path::new("/etc/picket"), None).unwrap();
        assert_eq!(c.server, "https://127.0.0.1:6443");
        assert_eq!(c.ca_pem.as_deref(), Some(&b"-----BEGIN-CA-----\n"[..]));
        assert_eq!(c.tls_server_name.as_deref(), Some("kubernetes.default"));
        assert_eq!(c.auth, AuthConfig::Token(Secret::new("dev-token-123")));
        assert_eq!(c.namespace.as_deref(), Some("cache"));
        assert!(!c.insecure_skip_tls_verify);
    }

    #[test]
    fn chosen_context_with_token_file_relative_to_kubeconfig_dir() {
        let c = parse(BASIC, Path::new("/etc/picket"), Some("prod")).unwrap();
        assert_eq!(c.server, "https://10.0.0.1:6443");
        assert!(c.insecure_skip_tls_verify);
        assert_eq!(c.ca_pem, None);
        assert_eq!(
            c.auth,
            AuthConfig::TokenFile(PathBuf::from("/etc/picket/secrets/token"))
        );
        assert_eq!(c.namespace, None);
    }

    #[test]
    fn missing_pieces_are_named() {
        let e = parse(BASIC, Path::new("/x"), Some("nope")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("\"nope\"") && msg.contains("dev, prod"),
            "{msg}"
        );

        let no_ctx = BASIC.replace("current-context: dev", "");
        let e = parse(&no_ctx, Path::new("/x"), None).unwrap_err();
        assert!(matches!(e, KubeconfigError::NoContext { .. }), "{e}");

        let bad_cluster = BASIC.replace("cluster: dev-cluster,", "cluster: ghost,");
        let e = parse(&bad_cluster, Path::new("/x"), None).unwrap_err();
        assert!(e.to_string().contains("missing cluster \"ghost\""), "{e}");

        let bad_user = BASIC.replace("user: dev-user,", "user: ghost,");
        let e = parse(&bad_user, Path::new("/x"), None).unwrap_err();
        assert!(e.to_string().contains("missing user \"ghost\""), "{e}");

        let no_server = BASIC.replace("server: https://127.0.0.1:6443/", "");
        let e = parse(&no_server, Path::new("/x"), None).unwrap_err();
        assert!(e.to_string().contains("missing server"), "{e}");

        let no_ca = BASIC.replace(
            "certificate-authority-data: LS0tLS1CRUdJTi1DQS0tLS0tCg==",
            "",
        );
        let e = parse(&no_ca, Path::new("/x"), None).unwrap_err();
        assert!(e.to_string().contains("certificate-authority"), "{e}");

        let bad_b64 = BASIC.replace("LS0tLS1CRUdJTi1DQS0tLS0tCg==", "not!base64");
        let e = parse(&bad_b64, Path::new("/x"), None).unwrap_err();
        assert!(
            e.to_string()
                .contains("certificate-authority-data is not valid base64"),
            "{e}"
        );

        let e = parse("clusters: [", Path::new("/x"), None).unwrap_err();
        assert!(matches!(e, KubeconfigError::Parse { .. }), "{e}");
    }

    #[test]
    fn client_cert_files_and_data_precedence() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), "CA FROM FILE\n").unwrap();
        std::fs::write(dir.path().join("c.pem"), "CERT FROM FILE").unwrap();
        std::fs::write(dir.path().join("k.pem"), "KEY FROM FILE").unwrap();
        let yaml = format!(
            r#"
current-context: x
clusters:
- name: c
  cluster:
    server: https://127.0.0.1:1
    certificate-authority: ca.pem
users:
- name: u
  user:
    client-certificate: c.pem
    client-key: {abs}
    client-key-data: {data}
contexts:
- name: x
  context: {{cluster: c, user: u}}
"#,
            abs = dir.path().join("k.pem").display(),
            data = B64.encode("KEY FROM DATA"),
        );
        let c = parse(&yaml, dir.path(), None).unwrap();
        assert_eq!(c.ca_pem.as_deref(), Some(&b"CA FROM FILE\n"[..]));
        let id = c.client_identity.clone().unwrap();
        assert_eq!(id.cert_pem, b"CERT FROM FILE");
        assert_eq!(id.key_pem, b"KEY FROM DATA", "-data wins over the path");
        assert_eq!(c.auth, AuthConfig::None);
        // The key never shows in debug output.
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("KEY FROM"), "{dbg}");

        let missing_file = yaml.replace("c.pem", "nope.pem");
        let e = parse(&missing_file, dir.path(), None).unwrap_err();
        assert!(
            e.to_string().contains("client-certificate") && e.to_string().contains("nope.pem"),
            "{e}"
        );

        let only_cert = yaml
            .lines()
            .filter(|l| !l.contains("client-key"))
            .collect::<Vec<_>>()
            .join("\n");
        let e = parse(&only_cert, dir.path(), None).unwrap_err();
        assert!(e.to_string().contains("missing client-key"), "{e}");
    }

    #[test]
    fn exec_plugin_config_and_rejections() {
        let yaml = r#"
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
        let c = parse(yaml, Path::new("/etc/picket"), None).unwrap();
        let AuthConfig::Exec(e) = &c.auth else {
            panic!("expected exec, got {:?}", c.auth)
        };
        assert_eq!(e.command, PathBuf::from("/etc/picket/./bin/get-token"));
        assert_eq!(e.args, vec!["--cluster", "prod"]);
        assert_eq!(e.env, vec![("REGION".to_string(), "eu".to_string())]);
        let info: serde_json::Value = serde_json::from_str(&exec_info(e, &c)).unwrap();
        assert_eq!(info["kind"], "ExecCredential");
        assert_eq!(info["apiVersion"], EXEC_V1);
        assert_eq!(info["spec"]["interactive"], false);
        assert_eq!(info["spec"]["cluster"]["server"], "https://127.0.0.1:1");

        let e = parse(&yaml.replace("/v1\n", "/v2\n"), Path::new("/x"), None).unwrap_err();
        assert!(e.to_string().contains("exec apiVersion"), "{e}");
        let e = parse(&yaml.replace("Never", "Always"), Path::new("/x"), None).unwrap_err();
        assert!(e.to_string().contains("interactiveMode Always"), "{e}");

        let ap = yaml.replace("exec:", "auth-provider: {name: oidc}\n    old-exec:");
        let e = parse(&ap, Path::new("/x"), None);
        // unknown keys are ignored, auth-provider is refused by name
        assert!(e.unwrap_err().to_string().contains("auth-provider"));
    }

    #[test]
    fn in_cluster_needs_env_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let mut src = InClusterSource {
            host: None,
            port: Some("443".into()),
            dir: dir.path().to_path_buf(),
        };
        let e = ClusterConfig::in_cluster_from(&src).unwrap_err();
        assert!(e.to_string().contains("KUBERNETES_SERVICE_HOST"), "{e}");
        src.host = Some("10.96.0.1".into());
        let e = ClusterConfig::in_cluster_from(&src).unwrap_err();
        assert!(e.to_string().contains("token"), "{e}");
        std::fs::write(dir.path().join("token"), "t1\n").unwrap();
        let e = ClusterConfig::in_cluster_from(&src).unwrap_err();
        assert!(e.to_string().contains("ca.crt"), "{e}");
        std::fs::write(dir.path().join("ca.crt"), "CA").unwrap();
        std::fs::write(dir.path().join("namespace"), "cache\n").unwrap();
        let c = ClusterConfig::in_cluster_from(&src).unwrap();
        assert_eq!(c.server, "https://10.96.0.1:443");
        assert_eq!(c.namespace.as_deref(), Some("cache"));
        assert_eq!(c.auth, AuthConfig::TokenFile(dir.path().join("token")));
        src.host = Some("fd00::1".into());
        let c = ClusterConfig::in_cluster_from(&src).unwrap();
        assert_eq!(c.server, "https://[fd00::1]:443");
    }

    #[tokio::test(start_paused = true)]
    async fn token_file_is_reread_every_minute_and_after_invalidate() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "one\n").unwrap();
        let mut cfg = parse(BASIC, Path::new("/x"), None).unwrap();
        cfg.auth = AuthConfig::TokenFile(path.clone());
        let creds = Credentials::new(&cfg);
        assert!(creds.refreshable());
        let tok = |m: AuthMaterial| m.token.unwrap().expose().to_string();
        assert_eq!(tok(creds.current().await.unwrap()), "one");

        std::fs::write(&path, "two\n").unwrap();
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(
            tok(creds.current().await.unwrap()),
            "one",
            "cached within 60 s"
        );
        tokio::time::advance(Duration::from_secs(31)).await;
        assert_eq!(
            tok(creds.current().await.unwrap()),
            "two",
            "re-read after 60 s"
        );

        std::fs::write(&path, "three\n").unwrap();
        creds.invalidate().await;
        assert_eq!(
            tok(creds.current().await.unwrap()),
            "three",
            "re-read after a 401"
        );

        // A vanished file keeps the last good token.
        std::fs::remove_file(&path).unwrap();
        creds.invalidate().await;
        assert_eq!(tok(creds.current().await.unwrap()), "three");

        // With no earlier token, the error names the file.
        let fresh = Credentials::new(&cfg);
        let e = fresh.current().await.unwrap_err();
        assert!(e.to_string().contains("token"), "{e}");
    }

    #[test]
    fn secrets_are_redacted() {
        let c = parse(BASIC, Path::new("/x"), None).unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("dev-token-123"), "{dbg}");
        assert!(dbg.contains("redacted"));
    }

    #[test]
    fn timestamps() {
        let z = parse_timestamp("2030-01-02T03:04:05Z").unwrap();
        let plus = parse_timestamp("2030-01-02T05:04:05+02:00").unwrap();
        let minus = parse_timestamp("2030-01-02T01:04:05-02:00").unwrap();
        assert_eq!(z, plus);
        assert_eq!(z, minus);
        assert!(parse_timestamp("2030-01-02T03:04:05.123Z").is_some());
        assert!(parse_timestamp("tomorrow").is_none());
        assert!(parse_timestamp("2030-01-02T03:04:05+0200").is_none());
    }

    #[test]
    fn a_non_ascii_expiry_is_refused_not_a_panic() {
        // Found by fuzz/fuzz_targets/kube_json: an exec plugin printing an
        // expirationTimestamp whose last 6 bytes start inside a multi-byte
        // character panicked the credential refresh (byte-index split).
        assert_eq!(parse_timestamp("2030é00:00"), None);
        assert_eq!(parse_timestamp("2030-01-02T05:04:05+0\u{e9}:00"), None);
        assert_eq!(parse_timestamp("é"), None);
        let out = r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",
            "status":{"token":"t","expirationTimestamp":"2030-01-02T05:04é00:00"}}"#;
        let e = decode_exec_credential(out.as_bytes(), "client.authentication.k8s.io/v1");
        assert!(
            matches!(&e, Err(m) if m.contains("bad expirationTimestamp")),
            "{e:?}"
        );
    }

    #[test]
    fn a_malformed_credential_is_reported_without_quoting_the_token() {
        // The error is logged; serde_json's own message for a value of the
        // wrong type repeats the value, which here is the secret.
        let v1 = "client.authentication.k8s.io/v1";
        for out in [
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":"s3cr3t-token"}"#,
            r#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":["s3cr3t-token"]}}"#,
            r#"["s3cr3t-token"]"#,
        ] {
            let e = decode_exec_credential(out.as_bytes(), v1).expect_err(out);
            assert!(!e.contains("s3cr3t"), "{e}");
            assert!(e.contains("line 1 column"), "{e}");
        }
        // Messages that quote nothing keep serde_json's detail.
        let e = decode_exec_credential(br#"{"kind":"ExecCredential""#, v1).expect_err("eof");
        assert!(e.contains("EOF"), "{e}");
    }
}

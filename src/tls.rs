//! TLS plumbing: one rustls stack (ring provider) for the data servers, the
//! Kubernetes API, the RESP and HTTP listeners and the links between
//! daemons.
//!
//! reqwest is built without a default provider, so the provider must be
//! installed once per process before any client is built
//! ([`install_crypto_provider`]).
//!
//! The listener's certificates can be replaced while the daemon runs
//! (SIGHUP, [`ListenerTls::reload`]): every configuration built from the
//! files sits behind a [`Shared`] handle that new handshakes read, so that
//! open connections keep the certificate they started with and new ones
//! get the new files.

use std::path::Path;
use std::sync::{Arc, Once, RwLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;

use crate::config::{AuthClients, ListenTlsConfig};

static INSTALL: Once = Once::new();

/// Install ring as the process-wide rustls crypto provider (idempotent).
pub fn install_crypto_provider() {
    INSTALL.call_once(|| {
        // Another library may have installed one already; either is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// Why a TLS configuration could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The files are readable but do not make a configuration (e.g. the key
    /// does not belong to the certificate).
    #[error("{0}")]
    Config(String),
}

fn file_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Every certificate of a PEM file (at least one).
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect();
    let certs = certs.map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no certificate found"));
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(path, format!("no usable key: {e}")))
}

/// The CAs of a PEM file as trust anchors.
pub fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| file_error(path, e))?;
    }
    Ok(roots)
}

/// A client configuration trusting only the CAs of `ca_file`, showing the
/// certificate and key of `identity` when given (mutual TLS).
pub fn client_config(
    ca_file: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientConfig, TlsError> {
    install_crypto_provider();
    let builder = ClientConfig::builder().with_root_certificates(read_roots(ca_file)?);
    with_identity(builder, identity)
}

fn with_identity(
    builder: rustls::ConfigBuilder<ClientConfig, rustls::client::WantsClientCert>,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientConfig, TlsError> {
    match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
            .map_err(|e| TlsError::Config(format!("{}: {e}", cert.display()))),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// Which name a [`NameVerifier`] checks the server certificate against.
#[derive(Debug, Clone)]
pub enum NameCheck {
    /// This name instead of the one connected to (kubeconfig
    /// `tls-server-name`).
    As(ServerName<'static>),
    /// None: any certificate of the pinned CA will do (`verify_peer_name =
    /// false`, where every certificate of the daemons' own CA is a daemon,
    /// as between Redis nodes).
    Skip,
}

/// webpki's verification (chain, dates, key usage) against the pinned CAs,
/// with the server name checked as [`NameCheck`] says.
#[derive(Debug)]
pub struct NameVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    name: NameCheck,
}

impl NameVerifier {
    /// Wrap `inner`.
    pub fn new(inner: Arc<rustls::client::WebPkiServerVerifier>, name: NameCheck) -> Arc<Self> {
        Arc::new(NameVerifier { inner, name })
    }
}

impl ServerCertVerifier for NameVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let v = |name: &ServerName<'_>| {
            self.inner
                .verify_server_cert(end_entity, intermediates, name, ocsp, now)
        };
        match &self.name {
            NameCheck::As(name) => v(name),
            // webpki checks the chain first and the name last, so a name
            // error means everything else held.
            NameCheck::Skip => match v(server_name) {
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => Ok(ServerCertVerified::assertion()),
                other => other,
            },
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The configuration this daemon connects to its peers with: their
/// certificates verified against `ca_file` (and their names unless
/// `verify_peer_name = false`), its own certificate shown as the client's.
pub fn peer_client_config(cfg: &ListenTlsConfig) -> Result<ClientConfig, TlsError> {
    install_crypto_provider();
    let ca = cfg.ca_file.as_deref().ok_or_else(|| {
        TlsError::Config("daemon.tls.ca_file is required to verify the peers".into())
    })?;
    let identity = Some((cfg.cert_file.as_path(), cfg.key_file.as_path()));
    if cfg.verify_peer_name {
        return client_config(ca, identity);
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(read_roots(ca)?))
        .build()
        .map_err(|e| TlsError::Config(format!("{}: {e}", ca.display())))?;
    let builder = ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(NameVerifier::new(verifier, NameCheck::Skip));
    with_identity(builder, identity)
}

/// The server configuration of the RESP listener (client certificates as
/// `auth_clients` says) or, with `client_certs` false, of the HTTP listener
/// (none asked for: scrapers and probes rarely have one).
pub fn server_config(cfg: &ListenTlsConfig, client_certs: bool) -> Result<ServerConfig, TlsError> {
    install_crypto_provider();
    let builder = ServerConfig::builder();
    let builder = match (&cfg.ca_file, cfg.auth_clients) {
        (Some(ca), AuthClients::Yes | AuthClients::Optional) if client_certs => {
            let mut v = rustls::server::WebPkiClientVerifier::builder(Arc::new(read_roots(ca)?));
            if cfg.auth_clients == AuthClients::Optional {
                v = v.allow_unauthenticated();
            }
            let v = v
                .build()
                .map_err(|e| TlsError::Config(format!("{}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(v)
        }
        (None, AuthClients::Yes | AuthClients::Optional) if client_certs => {
            return Err(TlsError::Config(
                "daemon.tls.ca_file is required to verify client certificates".into(),
            ));
        }
        _ => builder.with_no_client_auth(),
    };
    builder
        .with_single_cert(read_certs(&cfg.cert_file)?, read_key(&cfg.key_file)?)
        .map_err(|e| {
            TlsError::Config(format!(
                "{} and {}: {e}",
                cfg.cert_file.display(),
                cfg.key_file.display()
            ))
        })
}

/// A configuration that can be replaced while connections use it: readers
/// take the current one with [`current`].
pub type Shared<T> = Arc<RwLock<Arc<T>>>;

/// A new [`Shared`] holding `value`.
pub fn shared<T>(value: T) -> Shared<T> {
    Arc::new(RwLock::new(Arc::new(value)))
}

/// The configuration in a [`Shared`] now.
pub fn current<T>(s: &Shared<T>) -> Arc<T> {
    s.read().unwrap_or_else(|e| e.into_inner()).clone()
}

fn replace<T>(s: &Shared<T>, value: T) {
    *s.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(value);
}

/// Everything built from `[daemon.tls]`: the RESP and HTTP server
/// configurations and the peers' client configuration, reloadable as one.
#[derive(Debug)]
pub struct ListenerTls {
    cfg: ListenTlsConfig,
    resp: Shared<ServerConfig>,
    http: Option<Shared<ServerConfig>>,
    peers: Option<Shared<ClientConfig>>,
}

/// The configurations of one load of the files.
struct Built {
    resp: ServerConfig,
    http: Option<ServerConfig>,
    peers: Option<ClientConfig>,
}

impl ListenerTls {
    /// Read the files of `cfg` (refused before any port is bound when they
    /// are unusable).
    pub fn load(cfg: &ListenTlsConfig, has_peers: bool) -> Result<ListenerTls, TlsError> {
        let cfg = ListenTlsConfig {
            // No peer configuration to build without peers.
            peers: cfg.peers && has_peers,
            ..cfg.clone()
        };
        let b = Self::build(&cfg)?;
        Ok(ListenerTls {
            resp: shared(b.resp),
            http: b.http.map(shared),
            peers: b.peers.map(shared),
            cfg,
        })
    }

    fn build(cfg: &ListenTlsConfig) -> Result<Built, TlsError> {
        Ok(Built {
            resp: server_config(cfg, true)?,
            http: cfg.http.then(|| server_config(cfg, false)).transpose()?,
            peers: cfg.peers.then(|| peer_client_config(cfg)).transpose()?,
        })
    }

    /// The RESP listener's configuration (read per handshake).
    pub fn resp(&self) -> Shared<ServerConfig> {
        self.resp.clone()
    }

    /// The HTTP listener's, when `http = true`.
    pub fn http(&self) -> Option<Shared<ServerConfig>> {
        self.http.clone()
    }

    /// The peer links', when `peers = true` and there are peers.
    pub fn peers(&self) -> Option<Shared<ClientConfig>> {
        self.peers.clone()
    }

    /// Read the files again and use them for every new handshake, all or
    /// nothing: on an error the certificates in use stay.
    pub fn reload(&self) -> Result<(), TlsError> {
        let b = Self::build(&self.cfg)?;
        replace(&self.resp, b.resp);
        if let (Some(s), Some(c)) = (&self.http, b.http) {
            replace(s, c);
        }
        if let (Some(s), Some(c)) = (&self.peers, b.peers) {
            replace(s, c);
        }
        Ok(())
    }
}

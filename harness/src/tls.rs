//! Test certificates (rcgen) and a blocking TLS RESP client (rustls over a
//! std `TcpStream`), independent of picket's own TLS code so that tests can
//! judge it.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, date_time_ymd,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::RespConn;

/// A certificate authority of the test.
pub struct TestCa {
    /// Its certificate (PEM).
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

/// How a certificate should be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validity {
    /// Valid now.
    Now,
    /// Expired years ago.
    Expired,
}

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

impl TestCa {
    /// A new CA called `cn`.
    pub fn new(cn: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("CA certificate");
        TestCa {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names` (IP addresses or DNS names), usable as a
    /// server's and a client's (a daemon is both to its peers), as PEM
    /// (certificate, key).
    pub fn issue(&self, cn: &str, names: &[&str], validity: Validity) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = names
            .iter()
            .map(|n| match n.parse::<std::net::IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName((*n).try_into().expect("DNS name")),
            })
            .collect();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        if validity == Validity::Expired {
            params.not_before = date_time_ymd(2001, 1, 1);
            params.not_after = date_time_ymd(2002, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).expect("certificate");
        (cert.pem(), key.serialize_pem())
    }

    /// [`TestCa::issue`] written to `dir/<file>.pem` and `dir/<file>.key`.
    pub fn issue_files(
        &self,
        dir: &Path,
        file: &str,
        names: &[&str],
        validity: Validity,
    ) -> CertFiles {
        let (cert, key) = self.issue(file, names, validity);
        write_pair(dir, file, &cert, &key)
    }

    /// Write the CA certificate to `dir/<file>` and return its path.
    pub fn write(&self, dir: &Path, file: &str) -> PathBuf {
        let p = dir.join(file);
        fs::write(&p, &self.pem).unwrap_or_else(|e| panic!("write {p:?}: {e}"));
        p
    }
}

/// Write a certificate and key as `dir/<file>.pem` and `dir/<file>.key`.
pub fn write_pair(dir: &Path, file: &str, cert: &str, key: &str) -> CertFiles {
    let files = CertFiles {
        cert: dir.join(format!("{file}.pem")),
        key: dir.join(format!("{file}.key")),
    };
    fs::write(&files.cert, cert).unwrap_or_else(|e| panic!("write {:?}: {e}", files.cert));
    fs::write(&files.key, key).unwrap_or_else(|e| panic!("write {:?}: {e}", files.key));
    files
}

/// A client configuration trusting `ca_pem`, with a client certificate
/// when `identity` is given.
pub fn client_config(ca_pem: &str, identity: Option<(&str, &str)>) -> Arc<rustls::ClientConfig> {
    picket::tls::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("CA PEM")).expect("CA");
    }
    let b = rustls::ClientConfig::builder().with_root_certificates(roots);
    Arc::new(match identity {
        Some((cert, key)) => b
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("certificate PEM"),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key PEM"),
            )
            .expect("client certificate"),
        None => b.with_no_client_auth(),
    })
}

/// A client configuration from files (see [`client_config`]).
pub fn client_config_files(ca: &Path, identity: Option<&CertFiles>) -> Arc<rustls::ClientConfig> {
    let read = |p: &Path| fs::read_to_string(p).unwrap_or_else(|e| panic!("read {p:?}: {e}"));
    let pair = identity.map(|f| (read(&f.cert), read(&f.key)));
    client_config(
        &read(ca),
        pair.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
    )
}

/// A finished client handshake with `addr`, verifying the name of its IP.
/// `Err` holds rustls' reason (or the alert the server sent).
pub fn handshake(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, String> {
    let tcp =
        TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect {addr}: {e}"))?;
    tcp.set_read_timeout(Some(timeout))
        .and_then(|()| tcp.set_write_timeout(Some(timeout)))
        .map_err(|e| format!("socket options: {e}"))?;
    let name = ServerName::IpAddress(addr.ip().into());
    let conn = rustls::ClientConnection::new(config, name).map_err(|e| format!("{e}"))?;
    let mut s = rustls::StreamOwned::new(conn, tcp);
    while s.conn.is_handshaking() {
        s.conn
            .complete_io(&mut s.sock)
            .map_err(|e| format!("TLS handshake with {addr}: {e}"))?;
    }
    // TLS 1.3: the server checks the client's certificate after the
    // client has finished, and says so with an alert on the first read.
    Ok(s)
}

/// Anything a RESP connection can run over.
pub trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

impl RespConn {
    /// A RESP connection over TLS (see [`handshake`]); the first command
    /// shows whether the server accepted the client's certificate.
    pub fn connect_tls(
        addr: SocketAddr,
        config: Arc<rustls::ClientConfig>,
        timeout: Duration,
    ) -> Result<RespConn, String> {
        let s = handshake(addr, config, timeout)?;
        Ok(RespConn::over(Box::new(s), addr))
    }
}

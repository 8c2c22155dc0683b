//! TLS setup from PEM files: server configs (optionally requiring client certificates), client configs, peer identity.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {what}: {detail}")]
    File { path: String, what: &'static str, detail: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn file_err(path: &Path, what: &'static str, e: impl std::fmt::Display) -> TlsError {
    TlsError::File { path: path.display().to_string(), what, detail: e.to_string() }
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_err(path, "reading certificates", e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(path, "parsing certificates", e))?;
    if certs.is_empty() {
        return Err(file_err(path, "reading certificates", "no certificate found"));
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_err(path, "reading private key", e))
}

pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(path)? {
        roots.add(c).map_err(|e| file_err(path, "adding CA certificate", e))?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The error for a certificate chain and key that rustls refused to pair: a key that belongs to
/// another certificate gets a message saying so.
fn identity_error(cert: &Path, key: &Path, e: rustls::Error) -> TlsError {
    match e {
        rustls::Error::InconsistentKeys(_) => TlsError::File {
            path: key.display().to_string(),
            what: "private key",
            detail: format!("does not match the certificate in {} (it belongs to another certificate)", cert.display()),
        },
        e => TlsError::Config(format!("{}: {e}", cert.display())),
    }
}

/// Which file of a TLS identity a problem is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Cert,
    Key,
    Ca,
}

/// Every problem with one identity's files, loaded exactly as [`server_config`] and
/// [`client_config`] load them: a file missing or unreadable, no usable PEM in it, a CA that
/// cannot be a trust anchor, a key that does not belong to the certificate. Binds nothing.
pub fn check_files(cert: &Path, key: &Path, ca: Option<&Path>) -> Vec<(Part, TlsError)> {
    let mut out = Vec::new();
    let certs = load_certs(cert).map_err(|e| out.push((Part::Cert, e))).ok();
    let k = load_key(key).map_err(|e| out.push((Part::Key, e))).ok();
    if let Some(ca) = ca
        && let Err(e) = load_roots(ca)
    {
        out.push((Part::Ca, e));
    }
    if let (Some(certs), Some(k)) = (certs, k)
        && let Err(e) = rustls::sign::CertifiedKey::from_der(certs, k, &provider())
    {
        let part = if matches!(e, rustls::Error::InconsistentKeys(_)) { Part::Key } else { Part::Cert };
        out.push((part, identity_error(cert, key, e)));
    }
    out
}

/// A TLS server config. With `client_ca`, clients must present a certificate issued by it.
/// `tls13_only` for the tunnel, whose contract is TLS 1.3.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    alpn: &[&[u8]],
    tls13_only: bool,
) -> Result<Arc<ServerConfig>, TlsError> {
    let versions: &[&rustls::SupportedProtocolVersion] =
        if tls13_only { &[&rustls::version::TLS13] } else { rustls::DEFAULT_VERSIONS };
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(load_roots(ca)?), provider())
                .build()
                .map_err(|e| TlsError::Config(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut cfg =
        builder.with_single_cert(load_certs(cert)?, load_key(key)?).map_err(|e| identity_error(cert, key, e))?;
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// A TLS client config trusting `ca`, presenting `cert`/`key` when given.
pub fn client_config(
    ca: &Path,
    client_cert: Option<(&Path, &Path)>,
    alpn: &[&[u8]],
    tls13_only: bool,
) -> Result<Arc<ClientConfig>, TlsError> {
    let versions: &[&rustls::SupportedProtocolVersion] =
        if tls13_only { &[&rustls::version::TLS13] } else { rustls::DEFAULT_VERSIONS };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(load_roots(ca)?);
    let mut cfg = match client_cert {
        Some((c, k)) => {
            builder.with_client_auth_cert(load_certs(c)?, load_key(k)?).map_err(|e| identity_error(c, k, e))?
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(cfg))
}

/// The subject common name of a DER certificate (the identity a tunnel agent presents).
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?.as_str().ok()?.to_owned();
    Some(cn)
}

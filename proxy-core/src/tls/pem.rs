//! Certificates, keys and CA bundles read from PEM files, each error naming its file.

use super::error::{TlsError, file_err};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;

/// Every certificate in `path` (at least one).
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

/// The private key in `path`.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_err(path, "reading private key", e))
}

/// The CA certificates in `path`, as trust roots.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in load_certs(path)? {
        roots.add(c).map_err(|e| file_err(path, "adding CA certificate", e))?;
    }
    Ok(roots)
}

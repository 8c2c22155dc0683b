//! Certificate revocation lists: read from PEM or DER files for rustls' verifiers, and looked up by certificate for sessions that were verified before a list changed.
//!
//! rustls checks a list at every handshake. A session verified earlier is checked here when the
//! list is reloaded: [`Revoked::of`] tells whether a certificate's serial is on a list its issuer
//! published. Only the end-entity certificate is looked up (the verifiers are built the same
//! way: intermediates are not checked), and only against a list whose issuer is the
//! certificate's issuer.

use super::error::{TlsError, file_err};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::CertificateRevocationListDer;
use rustls::pki_types::pem::PemObject;
use std::collections::HashSet;
use std::path::Path;

/// The lists in `path`: every `X509 CRL` PEM block, or the whole file as one DER list.
pub fn load_crls(path: &Path) -> Result<Vec<CertificateRevocationListDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|e| file_err(path, "reading revocation lists", e))?;
    let pem: Vec<_> = CertificateRevocationListDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| file_err(path, "parsing revocation lists", e))?;
    let lists = match pem.is_empty() {
        // `openssl crl -outform DER` writes one list, no PEM armour: a DER SEQUENCE.
        true if bytes.first() == Some(&0x30) => vec![CertificateRevocationListDer::from(bytes)],
        true => return Err(file_err(path, "reading revocation lists", "no X509 CRL found (PEM or DER)")),
        false => pem,
    };
    for l in &lists {
        x509_parser::parse_x509_crl(l.as_ref()).map_err(|e| file_err(path, "parsing revocation lists", e))?;
    }
    Ok(lists)
}

/// One list's issuer (its DER name) and the serial numbers it revokes.
#[derive(Debug, Clone)]
struct List {
    issuer: Vec<u8>,
    serials: HashSet<Vec<u8>>,
    /// When the issuer promises the next list (Unix seconds), if it says.
    next_update: Option<i64>,
}

/// The revoked serials of a set of lists, by issuer.
#[derive(Debug, Clone, Default)]
pub struct Revoked {
    lists: Vec<List>,
}

impl Revoked {
    /// The lists in `path` ([`load_crls`]).
    pub fn load(path: &Path) -> Result<Self, TlsError> {
        Self::from_lists(&load_crls(path)?).map_err(|e| file_err(path, "parsing revocation lists", e))
    }

    fn from_lists(lists: &[CertificateRevocationListDer<'_>]) -> Result<Self, String> {
        let mut out = Vec::with_capacity(lists.len());
        for der in lists {
            let (_, crl) = x509_parser::parse_x509_crl(der.as_ref()).map_err(|e| e.to_string())?;
            out.push(List {
                issuer: crl.issuer().as_raw().to_vec(),
                serials: crl.iter_revoked_certificates().map(|r| r.raw_serial().to_vec()).collect(),
                next_update: crl.next_update().map(|t| t.timestamp()),
            });
        }
        Ok(Self { lists: out })
    }

    /// The serial of `cert` (hex, as `openssl x509 -serial` prints it) when a list of its
    /// issuer revokes it; `None` when no list does, or `cert` cannot be parsed.
    pub fn of(&self, cert: &CertificateDer<'_>) -> Option<String> {
        if self.lists.iter().all(|l| l.serials.is_empty()) {
            return None;
        }
        let (_, x) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        let (issuer, serial) = (x.issuer().as_raw(), x.raw_serial());
        let listed = self.lists.iter().any(|l| l.issuer == issuer && l.serials.contains(serial));
        listed.then(|| serial_hex(serial))
    }

    /// Revoked serials across all lists.
    pub fn len(&self) -> usize {
        self.lists.iter().map(|l| l.serials.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The earliest `nextUpdate` of the lists (Unix seconds): after it a list is stale.
    pub fn next_update(&self) -> Option<i64> {
        self.lists.iter().filter_map(|l| l.next_update).min()
    }
}

/// `serial` as upper-case hex without leading zero bytes (openssl's `serial=` form).
pub fn serial_hex(serial: &[u8]) -> String {
    let trimmed = match serial.iter().position(|b| *b != 0) {
        Some(i) => &serial[i..],
        None => &serial[serial.len().saturating_sub(1)..],
    };
    trimmed.iter().map(|b| format!("{b:02X}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_print_as_openssl_does() {
        assert_eq!(serial_hex(&[0x00, 0x1f, 0xa0]), "1FA0");
        assert_eq!(serial_hex(&[0x00]), "00");
        assert_eq!(serial_hex(&[]), "");
    }

    #[test]
    fn a_file_without_a_list_is_refused_with_its_name() {
        let dir = std::env::temp_dir().join(format!("seedgate-crl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let f = dir.join("crl.pem");
        std::fs::write(&f, "not a list\n").expect("write");
        let e = load_crls(&f).expect_err("no list").to_string();
        assert!(e.contains("crl.pem") && e.contains("no X509 CRL"), "{e}");
        std::fs::write(&f, "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n").expect("write");
        let e = load_crls(&f).expect_err("garbage").to_string();
        assert!(e.contains("parsing revocation lists"), "{e}");
        assert!(load_crls(&dir.join("missing.pem")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

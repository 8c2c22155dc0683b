//! A throw-away PKI: one CA per test, server and client certificates, rustls configs built from them.

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The crypto provider every config here uses. Explicit, so that a second provider feature
/// enabled elsewhere in the workspace (e.g. ring through quinn) cannot make rustls ambiguous.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Valid from an hour ago (clock skew between processes is irrelevant here, but harmless) to
/// a day from now.
fn validity(p: &mut CertificateParams) {
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::hours(1);
    p.not_after = now + time::Duration::days(1);
}

/// A certificate authority with its signing key.
pub struct Ca {
    pub name: String,
    pub cert_pem: String,
    pub cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("name", &self.name).finish_non_exhaustive()
    }
}

/// A leaf certificate and its private key (PKCS#8), in PEM and DER.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: CertificateDer<'static>,
    pub key_der: PrivatePkcs8KeyDer<'static>,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued").finish_non_exhaustive()
    }
}

impl Ca {
    /// A self-signed CA whose subject CN is `name`.
    pub fn new(name: &str) -> anyhow::Result<Self> {
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        validity(&mut p);
        let key = KeyPair::generate()?;
        let cert = p.self_signed(&key)?;
        Ok(Self {
            name: name.to_owned(),
            cert_pem: cert.pem(),
            cert_der: cert.der().clone(),
            issuer: Issuer::new(p, key),
        })
    }

    /// A server certificate for DNS names and/or IP literals (SANs); the CN is the first one.
    pub fn server(&self, names: &[&str]) -> anyhow::Result<Issued> {
        let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        if let Some(first) = names.first() {
            p.distinguished_name.push(DnType::CommonName, *first);
        }
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.issue(p)
    }

    /// A client certificate (clientAuth) whose subject CN is `common_name`: the identity
    /// proxy-server takes as the agent's cluster.
    pub fn client(&self, common_name: &str) -> anyhow::Result<Issued> {
        let mut p = CertificateParams::new(Vec::<String>::new())?;
        p.distinguished_name.push(DnType::CommonName, common_name);
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(p)
    }

    fn issue(&self, mut p: CertificateParams) -> anyhow::Result<Issued> {
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        validity(&mut p);
        let key = KeyPair::generate()?;
        let cert = p.signed_by(&key, &self.issuer)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: PrivatePkcs8KeyDer::from(key.serialize_der()),
        })
    }

    /// Write `<dir>/<stem>.crt` (PEM) and return its path.
    pub fn write(&self, dir: &Path, stem: &str) -> anyhow::Result<PathBuf> {
        let p = dir.join(format!("{stem}.crt"));
        std::fs::write(&p, &self.cert_pem).with_context(|| format!("writing {}", p.display()))?;
        Ok(p)
    }

    /// Write the CA's signing key to `<dir>/<stem>.key` (PEM) and return its path: for tools that
    /// act as this CA (`openssl ca`).
    pub fn write_key(&self, dir: &Path, stem: &str) -> anyhow::Result<PathBuf> {
        let p = dir.join(format!("{stem}.key"));
        std::fs::write(&p, self.issuer.key().serialize_pem()).with_context(|| format!("writing {}", p.display()))?;
        Ok(p)
    }

    /// A root store holding only this CA.
    pub fn roots(&self) -> RootCertStore {
        let mut r = RootCertStore::empty();
        r.add(self.cert_der.clone()).expect("a CA certificate we just made parses");
        r
    }
}

/// A self-signed CA certificate (CN `name`) whose subject alternative names are `names`, with
/// its key, as a server identity: the mistake of serving with the CA itself, which a verifier
/// trusting that CA refuses as a CA used as an end entity.
pub fn ca_as_server(name: &str, names: &[&str]) -> anyhow::Result<Issued> {
    let mut p = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut p);
    let key = KeyPair::generate()?;
    let cert = p.self_signed(&key)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        cert_der: cert.der().clone(),
        key_der: PrivatePkcs8KeyDer::from(key.serialize_der()),
    })
}

impl Issued {
    /// Write `<dir>/<stem>.crt` and `<dir>/<stem>.key` (PEM) and return their paths.
    pub fn write(&self, dir: &Path, stem: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        let c = dir.join(format!("{stem}.crt"));
        let k = dir.join(format!("{stem}.key"));
        std::fs::write(&c, &self.cert_pem).with_context(|| format!("writing {}", c.display()))?;
        std::fs::write(&k, &self.key_pem).with_context(|| format!("writing {}", k.display()))?;
        Ok((c, k))
    }

    /// The private key in the form rustls takes.
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(self.key_der.clone_key())
    }

    /// The chain rustls presents: the leaf only (peers trust the CA directly).
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        vec![self.cert_der.clone()]
    }
}

fn alpn_list(alpn: &[&str]) -> Vec<Vec<u8>> {
    alpn.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// A server config presenting `id`; with `client_ca`, a client certificate from that CA is
/// required. `alpn` lists the protocols offered, in preference order (empty: no ALPN).
pub fn server_config(id: &Issued, client_ca: Option<&Ca>, alpn: &[&str]) -> anyhow::Result<Arc<ServerConfig>> {
    let b = ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let b = match client_ca {
        None => b.with_no_client_auth(),
        Some(ca) => {
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(ca.roots()), provider())
                .build()
                .context("client verifier")?;
            b.with_client_cert_verifier(v)
        }
    };
    let mut cfg = b.with_single_cert(id.chain(), id.key()).context("server certificate")?;
    cfg.alpn_protocols = alpn_list(alpn);
    Ok(Arc::new(cfg))
}

/// A client config trusting `ca`, presenting `client_cert` when given, offering `alpn`.
pub fn client_config(ca: &Ca, client_cert: Option<&Issued>, alpn: &[&str]) -> anyhow::Result<Arc<ClientConfig>> {
    let b = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(ca.roots());
    let mut cfg = match client_cert {
        None => b.with_no_client_auth(),
        Some(c) => b.with_client_auth_cert(c.chain(), c.key()).context("client certificate")?,
    };
    cfg.alpn_protocols = alpn_list(alpn);
    Ok(Arc::new(cfg))
}

/// Subject CN and subject-alternative names (DNS names and IPs, as text) of a DER certificate.
pub fn cert_names(der: &[u8]) -> (Option<String>, Vec<String>) {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return (None, Vec::new());
    };
    let cn = cert.subject().iter_common_name().next().and_then(|a| a.as_str().ok()).map(str::to_owned);
    let mut sans = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for n in &ext.value.general_names {
            match n {
                x509_parser::extensions::GeneralName::DNSName(d) => sans.push((*d).to_owned()),
                x509_parser::extensions::GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).ok().map(|a| std::net::IpAddr::from(a).to_string()),
                        16 => <[u8; 16]>::try_from(*b).ok().map(|a| std::net::IpAddr::from(a).to_string()),
                        _ => None,
                    };
                    sans.extend(ip);
                }
                _ => {}
            }
        }
    }
    (cn, sans)
}

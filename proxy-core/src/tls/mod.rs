//! TLS setup from PEM files: server configs (optionally requiring client certificates), client configs, revocation lists, peer identity.

pub mod crl;
mod error;
mod pem;
mod verify;

pub use crl::{Revoked, UnusedList, load_crls};
pub use error::TlsError;
use error::file_err;
pub use pem::{load_certs, load_key, load_roots};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::path::Path;
use std::sync::Arc;

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
    Crl,
}

/// What is wrong with one identity's files ([`check_files`]): problems refuse the config,
/// warnings do not.
#[derive(Debug, Default)]
pub struct FileCheck {
    pub problems: Vec<(Part, TlsError)>,
    /// Lists that match no CA of the bundle: they revoke nothing, which is allowed (a bundle
    /// that left a CA behind) but rarely meant.
    pub warnings: Vec<(Part, String)>,
}

/// Every problem with one identity's files, loaded exactly as [`server_config`] and
/// [`client_config`] load them: a file missing or unreadable, no usable PEM in it, a CA that
/// cannot be a trust anchor, a revocation list that cannot be read, a key that does not belong
/// to the certificate; and, as warnings, the revocation lists that no CA of the bundle signed.
/// Binds nothing. An agent with a token and no certificate has neither `cert` nor `key`.
pub fn check_files(identity: Option<(&Path, &Path)>, ca: Option<&Path>, crl: Option<&Path>) -> FileCheck {
    let mut out = FileCheck::default();
    let roots = ca.map(|ca| load_roots(ca).map_err(|e| out.problems.push((Part::Ca, e))).is_ok());
    match (crl, ca, roots) {
        (Some(crl), Some(ca), Some(true)) => match Revoked::load(crl, ca) {
            Ok(r) => {
                let unused = r.unused().iter();
                out.warnings.extend(unused.map(|u| (Part::Crl, format!("{}: {}", crl.display(), u.message(ca)))));
            }
            Err(e) => out.problems.push((Part::Crl, e)),
        },
        // The lists alone (their CAs are reported above): can they be read?
        (Some(crl), ..) => {
            if let Err(e) = load_crls(crl) {
                out.problems.push((Part::Crl, e));
            }
        }
        (None, ..) => {}
    }
    let Some((cert, key)) = identity else { return out };
    let certs = load_certs(cert).map_err(|e| out.problems.push((Part::Cert, e))).ok();
    let k = load_key(key).map_err(|e| out.problems.push((Part::Key, e))).ok();
    if let (Some(certs), Some(k)) = (certs, k)
        && let Err(e) = rustls::sign::CertifiedKey::from_der(certs, k, &provider())
    {
        let part = if matches!(e, rustls::Error::InconsistentKeys(_)) { Part::Key } else { Part::Cert };
        out.problems.push((part, identity_error(cert, key, e)));
    }
    out
}

/// How a TLS server verifies its clients' certificates.
#[derive(Debug, Clone, Copy)]
pub struct ClientAuth<'a> {
    /// The CA(s) a client certificate must chain to.
    pub ca: &'a Path,
    /// Revocation lists: a client certificate whose serial a list signed by its issuer's key
    /// names is refused.
    pub crl: Option<&'a Path>,
    /// A client may come without a certificate (it proves who it is otherwise: a token); one it
    /// presents is verified all the same.
    pub optional: bool,
}

/// The protocol versions a config offers: TLS 1.3 alone for the tunnel, whose contract it is.
fn versions(tls13_only: bool) -> &'static [&'static rustls::SupportedProtocolVersion] {
    static TLS13_ONLY: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
    if tls13_only { &TLS13_ONLY } else { rustls::DEFAULT_VERSIONS }
}

/// The roots in `ca` and the lists in `crl` matched to them (none without `crl`).
fn roots_and_lists(ca: &Path, crl: Option<&Path>) -> Result<(RootCertStore, Arc<Revoked>), TlsError> {
    let cas = load_certs(ca)?;
    let mut roots = RootCertStore::empty();
    for c in &cas {
        roots.add(c.clone()).map_err(|e| file_err(ca, "adding CA certificate", e))?;
    }
    let revoked = match crl {
        None => Revoked::default(),
        Some(crl) => {
            Revoked::matched(&cas, &load_crls(crl)?).map_err(|e| file_err(crl, "parsing revocation lists", e))?
        }
    };
    Ok((roots, Arc::new(revoked)))
}

/// A TLS server config, and the revocation lists its client verifier checks (empty without
/// `client` or its `crl`). With `client`, clients present a certificate issued by its CA (which
/// its lists may revoke). `tls13_only` for the tunnel, whose contract is TLS 1.3.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client: Option<ClientAuth<'_>>,
    alpn: &[&[u8]],
    tls13_only: bool,
) -> Result<(Arc<ServerConfig>, Arc<Revoked>), TlsError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(versions(tls13_only))
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let (builder, revoked) = match client {
        Some(a) => {
            let (roots, revoked) = roots_and_lists(a.ca, a.crl)?;
            let mut v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            if a.optional {
                v = v.allow_unauthenticated();
            }
            let chain: Arc<dyn ClientCertVerifier> = v.build().map_err(|e| TlsError::Config(e.to_string()))?;
            let v = match a.crl {
                // Only the leaf, looked up by the key that issued it (`verify`).
                Some(_) => Arc::new(verify::Checked { chain, revoked: revoked.clone() }),
                None => chain,
            };
            (builder.with_client_cert_verifier(v), revoked)
        }
        None => (builder.with_no_client_auth(), Arc::default()),
    };
    let mut cfg =
        builder.with_single_cert(load_certs(cert)?, load_key(key)?).map_err(|e| identity_error(cert, key, e))?;
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok((Arc::new(cfg), revoked))
}

/// A TLS client config trusting `ca` (less the certificates the lists in `crl` revoke),
/// presenting `cert`/`key` when given; and the lists it checks servers' certificates against.
pub fn client_config(
    ca: &Path,
    crl: Option<&Path>,
    client_cert: Option<(&Path, &Path)>,
    alpn: &[&[u8]],
    tls13_only: bool,
) -> Result<(Arc<ClientConfig>, Arc<Revoked>), TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions(tls13_only))
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let (roots, revoked) = roots_and_lists(ca, crl)?;
    let builder = match crl {
        None => builder.with_root_certificates(roots),
        Some(_) => {
            let chain: Arc<dyn ServerCertVerifier> =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
                    .build()
                    .map_err(|e| TlsError::Config(e.to_string()))?;
            // The webpki verifier with a revocation check after it: nothing is verified less.
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verify::Checked { chain, revoked: revoked.clone() }))
        }
    };
    let mut cfg = match client_cert {
        Some((c, k)) => {
            builder.with_client_auth_cert(load_certs(c)?, load_key(k)?).map_err(|e| identity_error(c, k, e))?
        }
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok((Arc::new(cfg), revoked))
}

/// The subject common name of a DER certificate (the identity a tunnel agent presents).
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?.as_str().ok()?.to_owned();
    Some(cn)
}

/// One end of one kind of TLS handshake, with the config keys an operator checks when a
/// certificate is refused there: rustls' own errors (`UnknownIssuer`, `CertificateUnknown`,
/// ...) name the check that failed, not the file to fix.
#[derive(Debug, Clone, Copy)]
pub struct Handshake {
    /// True at the server end: the peer's certificate is a client certificate (clientAuth) and ours
    /// a server certificate (serverAuth).
    pub server: bool,
    /// Who the peer is: "proxy-server", "the agent".
    pub peer: &'static str,
    /// The peer's certificate, as an operator names it: "the agent's client certificate (its tunnel.tls.cert)".
    pub peer_cert: &'static str,
    /// What this end verifies the peer's certificate with: "agents.tls.client_ca".
    pub peer_ca: &'static str,
    /// The revocation lists this end checks the peer's certificate against: "agents.tls.crl".
    pub peer_crl: &'static str,
    /// The name this end asks the peer's certificate for (client end only): "tunnel.tls.server_name".
    pub peer_name: &'static str,
    /// This end's certificate: "agents.tls.cert".
    pub own_cert: &'static str,
    /// What the peer verifies this end's certificate with: "the agent's tunnel.tls.ca".
    pub own_ca: &'static str,
    /// The name the peer asks this end's certificate for (server end only).
    pub own_name: &'static str,
}

/// proxy-server's agents listener.
pub const AGENTS_LISTENER: Handshake = Handshake {
    server: true,
    peer: "the agent",
    peer_cert: "the agent's client certificate (its tunnel.tls.cert)",
    peer_ca: "agents.tls.client_ca",
    peer_crl: "agents.tls.crl",
    peer_name: "",
    own_cert: "agents.tls.cert",
    own_ca: "the agent's tunnel.tls.ca",
    own_name: "the agent's tunnel.tls.server_name",
};

/// The agent's tunnel client.
pub const AGENT_TUNNEL: Handshake = Handshake {
    server: false,
    peer: "proxy-server",
    peer_cert: "proxy-server's certificate (its agents.tls.cert)",
    peer_ca: "tunnel.tls.ca",
    peer_crl: "tunnel.tls.crl",
    peer_name: "tunnel.tls.server_name (default: the host of tunnel.servers)",
    own_cert: "this agent's client certificate (tunnel.tls.cert)",
    own_ca: "proxy-server's agents.tls.client_ca",
    own_name: "",
};

/// A proxy-server front end with TLS (kube-apiserver's egress selector over mTLS TCP).
pub const FRONTEND: Handshake = Handshake {
    server: true,
    peer: "the client",
    peer_cert: "the client's certificate (kube-apiserver: tlsConfig.clientCert)",
    peer_ca: "the front end's tls.client_ca",
    peer_crl: "the front end's tls.crl",
    peer_name: "",
    own_cert: "the front end's tls.cert",
    own_ca: "the client's CA bundle (kube-apiserver: tlsConfig.caBundle)",
    own_name: "the host of the client's URL (kube-apiserver: transport.tcp.url)",
};

/// What to fix for a certificate problem in a handshake at `at`, or `None` when the error is not
/// about a certificate (a reset, a timeout, a protocol mismatch). The rustls name of the
/// problem ends the text in parentheses, so it can still be searched for.
pub fn certificate_hint(e: &rustls::Error, at: &Handshake) -> Option<String> {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let (peer_usage, own_usage) = if at.server { ("clientAuth", "serverAuth") } else { ("serverAuth", "clientAuth") };
    let (peer, ca) = (at.peer_cert, at.peer_ca);
    let (text, code) = match e {
        // This end refused the peer's certificate.
        E::NoCertificatesPresented => {
            (format!("no client certificate was presented: {peer} is required"), "NoCertificatesPresented")
        }
        E::InvalidCertificate(c) => match c {
            C::UnknownIssuer => (format!("{peer} is not signed by a CA in {ca}"), "UnknownIssuer"),
            C::BadSignature => (
                format!(
                    "{peer} has a signature that does not verify with the CA in {ca} (a CA of the same name but another key?)"
                ),
                "BadSignature",
            ),
            C::Revoked => (
                format!("{peer} is revoked: its serial is on a revocation list of its issuer in {}", at.peer_crl),
                "Revoked",
            ),
            C::Expired | C::ExpiredContext { .. } => {
                (format!("{peer} has expired: renew it (or check the clock)"), "Expired")
            }
            C::NotValidYet | C::NotValidYetContext { .. } => {
                (format!("{peer} is not valid yet: check the clocks, or wait for its notBefore"), "NotValidYet")
            }
            C::InvalidPurpose | C::InvalidPurposeContext { .. } => (
                format!("{peer} has no {peer_usage} extended key usage: reissue it with extendedKeyUsage={peer_usage}"),
                "InvalidPurpose",
            ),
            C::NotValidForName | C::NotValidForNameContext { .. } => (
                format!("{peer} has no subject alternative name for the name asked for in {}", at.peer_name),
                "NotValidForName",
            ),
            C::Other(o) => match o.0.downcast_ref::<webpki::Error>() {
                Some(webpki::Error::CaUsedAsEndEntity) => (
                    format!("{peer} is a CA certificate used as an end-entity one (pass the issued leaf, not the CA)"),
                    "CaUsedAsEndEntity",
                ),
                Some(webpki::Error::EndEntityUsedAsCa) => (
                    format!(
                        "{peer} chains to a certificate that is not a CA: {ca} must hold the CA certificate, not a leaf"
                    ),
                    "EndEntityUsedAsCa",
                ),
                _ => return None,
            },
            _ => return None,
        },
        // The peer refused this end's certificate and said why in its alert.
        E::AlertReceived(a) => {
            let (own, by) = (at.own_cert, at.peer);
            match a {
                A::UnknownCA => {
                    (format!("{by} does not trust {own}: it is not signed by a CA in {}", at.own_ca), "UnknownCA")
                }
                A::UnsupportedCertificate => (
                    format!("{by} refused {own} for its extended key usage: it needs {own_usage}"),
                    "UnsupportedCertificate",
                ),
                A::CertificateRevoked => (
                    format!("{by} refused {own}: it is revoked (listed in {by}'s revocation lists); issue a new one"),
                    "CertificateRevoked",
                ),
                A::CertificateExpired => {
                    (format!("{by} says {own} has expired or is not valid yet"), "CertificateExpired")
                }
                A::CertificateUnknown => (
                    format!(
                        "{by} refused {own}; a CA certificate used as an end-entity one is a common cause (pass the issued leaf, not the CA)"
                    ),
                    "CertificateUnknown",
                ),
                A::BadCertificate if at.server => (
                    format!("{by} refused {own}: its subject alternative names must include {}", at.own_name),
                    "BadCertificate",
                ),
                A::BadCertificate => (format!("{by} refused {own} as malformed"), "BadCertificate"),
                A::DecryptError => (
                    format!(
                        "{by} could not verify a signature of the handshake: is {own} signed by the CA in {}?",
                        at.own_ca
                    ),
                    "DecryptError",
                ),
                A::CertificateRequired => {
                    (format!("{by} requires a client certificate: set {own}"), "CertificateRequired")
                }
                _ => return None,
            }
        }
        _ => return None,
    };
    Some(format!("{text} ({code})"))
}

/// The rustls error somewhere in `e`'s chain: through `source()`, and inside the I/O errors
/// that tokio-rustls and h2 wrap it in (`io::Error::source` skips the wrapped error itself).
pub fn find_rustls_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut cur = Some(e);
    // Bounded: error chains are short; a cycle would be a bug elsewhere.
    for _ in 0..16 {
        let e = cur?;
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r);
        }
        let inner: Option<&(dyn std::error::Error + 'static)> = if let Some(io) = e.downcast_ref::<std::io::Error>() {
            io.get_ref().map(|i| i as &(dyn std::error::Error + 'static))
        } else if let Some(h) = e.downcast_ref::<h2::Error>() {
            h.get_io().map(|i| i as &(dyn std::error::Error + 'static))
        } else {
            None
        };
        cur = inner.or_else(|| e.source());
    }
    None
}

/// [`certificate_hint`] for an error that wraps a rustls error.
pub fn hint_for(e: &(dyn std::error::Error + 'static), at: &Handshake) -> Option<String> {
    certificate_hint(find_rustls_error(e)?, at)
}

#[cfg(test)]
mod hints {
    use super::*;
    use rustls::{AlertDescription, CertificateError, Error, OtherError};

    fn hint(e: Error, at: &Handshake) -> String {
        certificate_hint(&e, at).unwrap_or_else(|| panic!("no hint for {e:?}"))
    }

    #[test]
    fn the_agents_listener_names_its_client_ca() {
        let h = hint(Error::InvalidCertificate(CertificateError::UnknownIssuer), &AGENTS_LISTENER);
        assert_eq!(
            h,
            "the agent's client certificate (its tunnel.tls.cert) is not signed by a CA in agents.tls.client_ca (UnknownIssuer)"
        );
        let h = hint(Error::InvalidCertificate(CertificateError::InvalidPurpose), &AGENTS_LISTENER);
        assert!(h.contains("has no clientAuth extended key usage") && h.ends_with("(InvalidPurpose)"), "{h}");
        let ca = OtherError(std::sync::Arc::new(webpki::Error::CaUsedAsEndEntity));
        let h = hint(Error::InvalidCertificate(CertificateError::Other(ca)), &AGENTS_LISTENER);
        assert!(h.contains("a CA certificate used as an end-entity one (pass the issued leaf, not the CA)"), "{h}");
        assert!(h.ends_with("(CaUsedAsEndEntity)"), "{h}");
        let h = hint(Error::NoCertificatesPresented, &AGENTS_LISTENER);
        assert!(h.contains("no client certificate"), "{h}");
        let h = hint(Error::AlertReceived(AlertDescription::BadCertificate), &AGENTS_LISTENER);
        assert!(h.contains("agents.tls.cert") && h.contains("tunnel.tls.server_name"), "{h}");
    }

    #[test]
    fn the_agent_names_its_keys_and_the_servers() {
        let h = hint(Error::AlertReceived(AlertDescription::UnknownCA), &AGENT_TUNNEL);
        assert_eq!(
            h,
            "proxy-server does not trust this agent's client certificate (tunnel.tls.cert): it is not signed by a CA in proxy-server's agents.tls.client_ca (UnknownCA)"
        );
        let h = hint(Error::AlertReceived(AlertDescription::UnsupportedCertificate), &AGENT_TUNNEL);
        assert!(h.contains("it needs clientAuth"), "{h}");
        let h = hint(Error::AlertReceived(AlertDescription::CertificateUnknown), &AGENT_TUNNEL);
        assert!(h.contains("pass the issued leaf"), "{h}");
        let h = hint(Error::InvalidCertificate(CertificateError::UnknownIssuer), &AGENT_TUNNEL);
        assert!(h.starts_with("proxy-server's certificate") && h.contains("tunnel.tls.ca"), "{h}");
        let h = hint(Error::InvalidCertificate(CertificateError::NotValidForName), &AGENT_TUNNEL);
        assert!(h.contains("tunnel.tls.server_name"), "{h}");
        let h = hint(Error::InvalidCertificate(CertificateError::InvalidPurpose), &AGENT_TUNNEL);
        assert!(h.contains("no serverAuth"), "{h}");
    }

    #[test]
    fn other_errors_have_no_hint() {
        assert_eq!(certificate_hint(&Error::DecryptError, &FRONTEND), None);
        assert_eq!(certificate_hint(&Error::AlertReceived(AlertDescription::HandshakeFailure), &FRONTEND), None);
        let other = OtherError(std::sync::Arc::new(webpki::Error::BadDer));
        assert_eq!(certificate_hint(&Error::InvalidCertificate(CertificateError::Other(other)), &FRONTEND), None);
    }

    #[test]
    fn found_inside_the_errors_that_wrap_it() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        let h = hint_for(&io, &FRONTEND).expect("a hint");
        assert!(h.contains("the front end's tls.client_ca"), "{h}");
        // An error whose source is the I/O error (as the tunnel's session errors are).
        #[derive(Debug, thiserror::Error)]
        #[error("session failed")]
        struct Session(#[source] std::io::Error);
        let alert = Error::AlertReceived(AlertDescription::UnknownCA);
        let s = Session(std::io::Error::new(std::io::ErrorKind::InvalidData, alert));
        assert!(hint_for(&s, &AGENT_TUNNEL).is_some_and(|h| h.ends_with("(UnknownCA)")));
        assert_eq!(hint_for(&std::io::Error::other("reset"), &FRONTEND), None);
    }
}

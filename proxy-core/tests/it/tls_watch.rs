//! TLS material that reloads itself, in process: a rotation through secret-volume-style `..data`
//! symlink swaps (new handshakes get the new certificate, a session opened before keeps
//! working), broken and mismatched files refused with the old material kept, a CA rotation that
//! resumption cannot bypass, and the expiry and reload metrics.

use proxy_core::watch::{
    self,
    tls::{ClientFiles, TlsMetrics},
};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        Self { pem: cert.pem(), issuer: Issuer::new(p, key) }
    }

    /// (certificate PEM, key PEM) with subject CN `cn`; server or client usage.
    fn leaf(&self, cn: &str, server: bool) -> (String, String) {
        let sans = if server { vec!["server.test".to_owned()] } else { Vec::new() };
        let mut p = CertificateParams::new(sans).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.extended_key_usages =
            vec![if server { ExtendedKeyUsagePurpose::ServerAuth } else { ExtendedKeyUsagePurpose::ClientAuth }];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A directory laid out like a mounted Kubernetes secret: `tls.crt`, `tls.key`, `ca.crt` are
/// symlinks into `..data`, itself a symlink to a versioned directory swapped atomically.
struct SecretVolume {
    dir: PathBuf,
    version: u32,
}

impl SecretVolume {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("seedgate-tls-watch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir, version: 0 }
    }

    fn path(&self, f: &str) -> PathBuf {
        self.dir.join(f)
    }

    /// Publish a new version of every file at once, the way the kubelet does.
    fn publish(&mut self, files: &[(&str, &str)]) {
        self.version += 1;
        let v = format!("..v{}", self.version);
        std::fs::create_dir_all(self.dir.join(&v)).unwrap();
        for (name, text) in files {
            std::fs::write(self.dir.join(&v).join(name), text).unwrap();
            let link = self.dir.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(name), &link).unwrap();
            }
        }
        std::os::unix::fs::symlink(&v, self.dir.join("..data_tmp")).unwrap();
        std::fs::rename(self.dir.join("..data_tmp"), self.dir.join("..data")).unwrap();
    }
}

impl Drop for SecretVolume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn roots(pem: &str) -> rustls::RootCertStore {
    let mut r = rustls::RootCertStore::empty();
    for c in rustls::pki_types::pem::PemObject::pem_slice_iter(pem.as_bytes()) {
        r.add(c.unwrap()).unwrap();
    }
    r
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A client trusting `ca_pem`, presenting a certificate from `client_ca` when given.
fn client_config(ca_pem: &str, client: Option<&(String, String)>) -> Arc<rustls::ClientConfig> {
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(ca_pem));
    Arc::new(match client {
        Some((c, k)) => {
            use rustls::pki_types::pem::PemObject;
            let chain: Vec<CertificateDer<'static>> =
                CertificateDer::pem_slice_iter(c.as_bytes()).map(Result::unwrap).collect();
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(k.as_bytes()).unwrap();
            b.with_client_auth_cert(chain, key).unwrap()
        }
        None => b.with_no_client_auth(),
    })
}

/// Serve TLS on a loopback port with whatever `material` holds at each accept; echo bytes.
async fn serve(material: Arc<watch::tls::Reloading<rustls::ServerConfig>>) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = l.accept().await.unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(material.current());
            tokio::spawn(async move {
                let Ok(mut s) = acceptor.accept(tcp).await else { return };
                let mut b = [0u8; 64];
                while let Ok(n) = s.read(&mut b).await {
                    if n == 0 || s.write_all(&b[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Handshake with `cfg`; the subject CN of the server's certificate, or the error.
async fn handshake(
    addr: std::net::SocketAddr,
    cfg: Arc<rustls::ClientConfig>,
) -> Result<(String, tokio_rustls::client::TlsStream<TcpStream>), String> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut s = tokio_rustls::TlsConnector::from(cfg)
        .connect(ServerName::try_from("server.test").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    // A TLS 1.3 client learns of a refused client certificate only on its first read.
    s.write_all(b"ping").await.map_err(|e| e.to_string())?;
    let mut b = [0u8; 4];
    s.read_exact(&mut b).await.map_err(|e| e.to_string())?;
    let (_, conn) = s.get_ref();
    let der = conn.peer_certificates().unwrap()[0].clone();
    let (_, x) = x509_parser::parse_x509_certificate(der.as_ref()).unwrap();
    let cn = x.subject().iter_common_name().next().unwrap().as_str().unwrap().to_owned();
    Ok((cn, s))
}

async fn echo(s: &mut tokio_rustls::client::TlsStream<TcpStream>) -> bool {
    let mut b = [0u8; 5];
    s.write_all(b"hello").await.is_ok() && s.read_exact(&mut b).await.is_ok() && &b == b"hello"
}

fn metric(reg: &prometheus::Registry, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = proxy_core::obs::metrics::render(reg);
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn rotation_through_symlink_swaps_reaches_new_handshakes_only() {
    let reg = prometheus::Registry::new();
    let metrics = TlsMetrics::new(&reg);
    let ca = Ca::new("test-ca");
    let mut vol = SecretVolume::new("rotate");
    let (c1, k1) = ca.leaf("server-one", true);
    vol.publish(&[("tls.crt", &c1), ("tls.key", &k1)]);
    let m =
        watch::tls::server("agents", &vol.path("tls.crt"), &vol.path("tls.key"), None, &[], false, &metrics).unwrap();
    let addr = serve(m.clone()).await;
    let client = client_config(&ca.pem, None);
    let (cn, mut before) = handshake(addr, client.clone()).await.unwrap();
    assert_eq!(cn, "server-one");
    assert!(metric(&reg, "seedgate_tls_certificate_expiry_timestamp_seconds", &[("subject", "server-one")]) > 0.0);

    assert!(m.check().is_none(), "nothing changed yet");
    let (c2, k2) = ca.leaf("server-two", true);
    vol.publish(&[("tls.crt", &c2), ("tls.key", &k2)]);
    assert!(matches!(m.check(), Some(Ok(()))));
    assert_eq!(
        handshake(addr, client.clone()).await.unwrap().0,
        "server-two",
        "new handshakes get the new certificate"
    );
    assert!(echo(&mut before).await, "a session opened before the rotation keeps working");
    assert_eq!(metric(&reg, "seedgate_tls_reloads_total", &[("use", "agents"), ("result", "success")]), 2.0);
    assert_eq!(metric(&reg, "seedgate_tls_certificate_expiry_timestamp_seconds", &[("subject", "server-one")]), 0.0);
    assert!(metric(&reg, "seedgate_tls_certificate_expiry_timestamp_seconds", &[("subject", "server-two")]) > 0.0);
}

#[tokio::test]
async fn broken_or_mismatched_files_are_refused_and_the_old_material_stays() {
    let reg = prometheus::Registry::new();
    let metrics = TlsMetrics::new(&reg);
    let ca = Ca::new("test-ca");
    let mut vol = SecretVolume::new("broken");
    let (c1, k1) = ca.leaf("server-one", true);
    vol.publish(&[("tls.crt", &c1), ("tls.key", &k1)]);
    let m = watch::tls::server("fe", &vol.path("tls.crt"), &vol.path("tls.key"), None, &[], false, &metrics).unwrap();
    let addr = serve(m.clone()).await;
    let client = client_config(&ca.pem, None);

    // Truncated PEM (a half-written file).
    vol.publish(&[("tls.crt", &c1[..c1.len() / 2]), ("tls.key", &k1)]);
    assert!(matches!(m.check(), Some(Err(_))), "a truncated certificate is refused");
    assert_eq!(handshake(addr, client.clone()).await.unwrap().0, "server-one");
    // A key that belongs to another certificate.
    let (c2, _) = ca.leaf("server-two", true);
    vol.publish(&[("tls.crt", &c2), ("tls.key", &k1)]);
    let e = m.check().expect("a change").expect_err("a mismatched key is refused");
    assert!(e.to_string().to_lowercase().contains("key"), "{e}");
    assert_eq!(handshake(addr, client.clone()).await.unwrap().0, "server-one", "the old certificate still serves");
    assert!(m.check().is_none(), "a refused change is reported once");
    assert!(metric(&reg, "seedgate_tls_reloads_total", &[("use", "fe"), ("result", "failure")]) >= 2.0);
    // Fixed: taken.
    let (c3, k3) = ca.leaf("server-three", true);
    vol.publish(&[("tls.crt", &c3), ("tls.key", &k3)]);
    assert!(matches!(m.check(), Some(Ok(()))));
    assert_eq!(handshake(addr, client).await.unwrap().0, "server-three");
}

/// The client-CA rotation as it is done in practice: prepare (old + new CA trusted), reissue
/// clients, complete (new CA only). After "complete", a client of the old CA is refused, even
/// one that holds a session from before (no resumption past the new trust set).
#[tokio::test]
async fn a_client_ca_rotation_cannot_be_bypassed_by_resumption() {
    let reg = prometheus::Registry::new();
    let metrics = TlsMetrics::new(&reg);
    let (old_ca, new_ca, server_ca) = (Ca::new("old-ca"), Ca::new("new-ca"), Ca::new("server-ca"));
    let mut vol = SecretVolume::new("ca");
    let (sc, sk) = server_ca.leaf("server", true);
    vol.publish(&[("tls.crt", &sc), ("tls.key", &sk), ("ca.crt", &old_ca.pem)]);
    let ca_file = vol.path("ca.crt");
    let m = watch::tls::server(
        "agents",
        &vol.path("tls.crt"),
        &vol.path("tls.key"),
        Some(ClientFiles { ca: ca_file.clone(), crl: None, optional: false }),
        &[],
        true,
        &metrics,
    )
    .unwrap();
    let addr = serve(m.clone()).await;
    let old_client = client_config(&server_ca.pem, Some(&old_ca.leaf("shoot-a", false)));
    let new_client = client_config(&server_ca.pem, Some(&new_ca.leaf("shoot-a", false)));
    assert!(handshake(addr, old_client.clone()).await.is_ok());
    assert!(handshake(addr, new_client.clone()).await.is_err(), "the new CA is not trusted yet");

    vol.publish(&[("tls.crt", &sc), ("tls.key", &sk), ("ca.crt", &format!("{}{}", old_ca.pem, new_ca.pem))]);
    assert!(matches!(m.check(), Some(Ok(()))));
    assert!(handshake(addr, new_client.clone()).await.is_ok(), "prepare: the new CA is trusted");
    // The old client now holds resumption state from a session the server accepted.
    assert!(handshake(addr, old_client.clone()).await.is_ok(), "prepare: the old CA is still trusted");

    vol.publish(&[("tls.crt", &sc), ("tls.key", &sk), ("ca.crt", &new_ca.pem)]);
    assert!(matches!(m.check(), Some(Ok(()))));
    assert!(handshake(addr, new_client).await.is_ok(), "complete: the new CA is trusted");
    let refused = handshake(addr, old_client).await;
    assert!(refused.is_err(), "complete: an old-CA client is refused, resumption or not");
}

//! Captures real ClientHellos as raw wire bytes into wire/tests/fixtures/client_hello/ (see its README.md).
//!
//! `cargo run -p proxy-core --example capture_client_hello [-- OUT_DIR]`: listens on 127.0.0.1:0, points
//! each client at it, records what the client sends until its whole first handshake message has arrived,
//! then closes. It lives here rather than beside the fixtures because it needs tokio and rustls, which
//! proxy-wire must not depend on.

#[path = "../../wire/tests/support/refragment.rs"]
mod refragment;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// Names of the SNI/ALPN used for each fixture; the tests assert the same values.
const RUSTLS_SNI: &str = "api.shoot-a.example.com";
const OPENSSL_SNI: &str = "api.shoot-b.example.com";
const CURL_HOST: &str = "api.example.com";
/// Record body sizes for multi_record.bin: the first splits the 4-byte handshake header itself.
pub const MULTI_RECORD_SIZES: &[usize] = &[2, 509, 700, usize::MAX];
pub const BIG_ALPN_COUNT: usize = 100;

type BoxErr = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxErr> {
    let out: PathBuf = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../wire/tests/fixtures/client_hello").into())
        .into();
    std::fs::create_dir_all(&out)?;

    let pq = capture_rustls(|c| c.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()]).await?;
    save(&out, "rustls_pq.bin", &pq)?;

    let no_sni = capture_rustls(|c| c.enable_sni = false).await?;
    save(&out, "no_sni.bin", &no_sni)?;

    // rustls itself splitting the hello into several records (a second, non-synthetic multi-record case).
    let frag = capture_rustls(|c| {
        c.alpn_protocols = vec![b"h2".to_vec()];
        c.max_fragment_size = Some(512);
    })
    .await?;
    save(&out, "rustls_fragmented.bin", &frag)?;

    let openssl = capture_cmd(|port| {
        let mut c = Command::new("openssl");
        c.args(["s_client", "-connect", &format!("127.0.0.1:{port}")]).args([
            "-servername",
            OPENSSL_SNI,
            "-alpn",
            "h2",
        ]);
        c
    })
    .await?;
    save(&out, "openssl.bin", &openssl)?;

    let curl = capture_cmd(|port| {
        let mut c = Command::new("curl");
        c.args(["-k", "-s", "--max-time", "5", "--resolve"])
            .arg(format!("{CURL_HOST}:{port}:127.0.0.1"))
            .arg(format!("https://{CURL_HOST}:{port}/"));
        c
    })
    .await?;
    save(&out, "curl.bin", &curl)?;

    let big = capture_cmd(|port| {
        let mut c = Command::new("openssl");
        c.args(["s_client", "-connect", &format!("127.0.0.1:{port}")]).args([
            "-servername",
            OPENSSL_SNI,
            "-alpn",
            &big_alpn_list(),
        ]);
        c
    })
    .await?;
    save(&out, "big.bin", &big)?;

    let multi = refragment::refragment(&pq, MULTI_RECORD_SIZES);
    save(&out, "multi_record.bin", &multi)?;
    Ok(())
}

/// `h2,http/1.1,seedgate-big-alpn-proto-000,...`: makes openssl's hello exceed 2 KiB.
fn big_alpn_list() -> String {
    let mut protos = vec!["h2".to_string(), "http/1.1".to_string()];
    protos.extend((0..BIG_ALPN_COUNT).map(|i| format!("seedgate-big-alpn-proto-{i:03}")));
    protos.join(",")
}

fn save(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), BoxErr> {
    std::fs::write(dir.join(name), bytes)?;
    println!("{name}: {} bytes, {} record(s)", bytes.len(), refragment::split_records(bytes).len());
    Ok(())
}

/// Reads from the accepted socket until the first handshake message is complete; returns exactly those records.
async fn record_hello(listener: &TcpListener) -> Result<Vec<u8>, BoxErr> {
    let (mut sock, _) = listener.accept().await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = refragment::first_handshake_len(&buf) {
            buf.truncate(end);
            return Ok(buf);
        }
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Err("client closed before sending a full hello".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn capture_rustls(tweak: impl FnOnce(&mut rustls::ClientConfig)) -> Result<Vec<u8>, BoxErr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    // Default provider (aws-lc-rs) and default kx groups, so X25519MLKEM768 is offered.
    let mut config =
        rustls::ClientConfig::builder().with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth();
    tweak(&mut config);
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let client = tokio::spawn(async move {
        let tcp = TcpStream::connect(addr).await?;
        // Fails once the capture side closes; only the bytes it sent matter.
        let _ = connector.connect(ServerName::try_from(RUSTLS_SNI)?, tcp).await;
        Ok::<_, BoxErr>(())
    });
    let hello = tokio::time::timeout(Duration::from_secs(10), record_hello(&listener)).await??;
    client.await??;
    Ok(hello)
}

async fn capture_cmd(make: impl FnOnce(u16) -> Command) -> Result<Vec<u8>, BoxErr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let mut child = make(port).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
    let hello = tokio::time::timeout(Duration::from_secs(10), record_hello(&listener)).await;
    // Our own child, ended by its handle; it may already have exited after the close.
    let _ = child.kill();
    let _ = child.wait();
    hello?
}

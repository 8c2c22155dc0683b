//! The gRPC front end with a real gRPC implementation: gRPC core (Python grpcio, the client kube-apiserver's gRPC stack shares its wire behaviour with), over the Unix socket and over mTLS TCP, with each `:authority` real clients send.
//!
//! gRPC clients fill `:authority` from the dial target: for a Unix socket gRPC core sends the
//! socket's path percent-encoded, grpc-java the raw path, grpc-go `localhost` (or the path); a
//! client may also set it, even to nothing. None of these is a URI authority the HTTP/2 library
//! would take as it is. Every combination runs the tonic suite's cases on one long-lived
//! channel: echo with `CLOSE_REQ`, 16 MiB each way with a checksum and a half-close, the dial
//! errors as `DIAL_RSP.error`, `DIAL_CLS`, the shoot side closing first, and 64 `Proxy` streams
//! at once, half on the long-lived channel and half on a channel of their own each.

use crate::grpc::{Via, World, unanswered};
use std::time::Duration;
use testbed::TcpEcho;
use testbed::grpc_core::{GrpcCore, Target};
use testbed::tunnel_kit::{Pattern, SpeakFirst};

const STEP: Duration = Duration::from_secs(10);
const MIB: u64 = 1024 * 1024;

/// The `:authority` the client sends.
#[derive(Debug, Clone, Copy)]
enum Authority {
    /// gRPC core's own: for `unix:` targets the socket's path, percent-encoded; for TCP
    /// `host:port`.
    Default,
    /// The socket's path as it is (grpc-java's form).
    Path,
    /// grpc-go's form for Unix sockets.
    Localhost,
    /// Set to nothing.
    Empty,
}

macro_rules! every_case {
    ($($name:ident: $via:expr, $authority:expr;)*) => {$(
        #[tokio::test]
        async fn $name() -> anyhow::Result<()> {
            every_case($via, $authority).await
        }
    )*};
}

every_case! {
    grpc_core_over_uds_default_authority: Via::Unix, Authority::Default;
    grpc_core_over_uds_path_authority: Via::Unix, Authority::Path;
    grpc_core_over_uds_localhost_authority: Via::Unix, Authority::Localhost;
    grpc_core_over_uds_empty_authority: Via::Unix, Authority::Empty;
    grpc_core_over_mtls_default_authority: Via::Mtls, Authority::Default;
    grpc_core_over_mtls_path_authority: Via::Mtls, Authority::Path;
    grpc_core_over_mtls_localhost_authority: Via::Mtls, Authority::Localhost;
    grpc_core_over_mtls_empty_authority: Via::Mtls, Authority::Empty;
}

/// The access event of the `Proxy` stream to `target` that ended with `reason`.
async fn event(w: &World, target: &str, reason: &str) -> anyhow::Result<String> {
    let target = format!("target={target} ");
    let reason = format!("reason=\"{reason}\"");
    w.server.wait_log_line(&["connection closed", "kind=\"grpc\"", &target, &reason], STEP).await
}

async fn every_case(via: Via, authority: Authority) -> anyhow::Result<()> {
    let w = World::start().await?;
    let target = w.grpc_core_target(via)?;
    let path = w.sock.display().to_string();
    let sent = match authority {
        Authority::Default => None,
        Authority::Path => Some(path.as_str()),
        Authority::Localhost => Some("localhost"),
        Authority::Empty => Some(""),
    };
    let Some(mut c) = GrpcCore::start(&target, sent).await? else { return Ok(()) };

    // Echo, then CLOSE_REQ: CLOSE_RSP and the stream's end.
    let echo = TcpEcho::start().await?;
    let addr = echo.addr().to_string();
    c.run(&format!("echo {addr}")).await?;
    let line = event(&w, &addr, "client_close").await?;
    for field in ["cluster=shoot-a", "strategy=\"default\"", "agent=shoot-a-node-1", "code=200"] {
        anyhow::ensure!(line.contains(field), "{field} not in {line}");
    }

    // 16 MiB up through the echo and back while both directions run, then a half-close.
    let bulk = TcpEcho::start().await?;
    let addr = bulk.addr().to_string();
    let r = c.run(&format!("bulk {addr} {}", 16 * MIB)).await?;
    anyhow::ensure!(r["bytes"] == 16 * MIB, "{r}");
    let line = event(&w, &addr, "closed").await?;
    let moved = format!("bytes_to_upstream={} bytes_to_client={}", 16 * MIB, 16 * MIB);
    anyhow::ensure!(line.contains(&moved), "not {moved}: {line}");

    // Dial errors arrive as DIAL_RSP.error.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string();
    for (target, text, reason) in [
        (closed.as_str(), "connection refused", "refused"),
        ("192.0.2.1:80", "destination not allowed", "not_allowed"),
        ("no-port", "bad destination", "bad_target"),
    ] {
        let r = c.run(&format!("dial_error {target}")).await?;
        let e = r["error"].as_str().unwrap_or_default();
        anyhow::ensure!(e.contains(text), "{target}: {e:?} does not say {text:?}");
        event(&w, target, reason).await?;
    }

    // DIAL_CLS cancels a pending dial (its connect is never answered): no DIAL_RSP, the end.
    let (_l, pending, _fill) = unanswered().await?;
    let addr = pending.to_string();
    c.run(&format!("dial_cancel {addr}")).await?;
    let line = event(&w, &addr, "dial_cancelled").await?;
    anyhow::ensure!(line.contains("code=499"), "{line}");

    // The shoot side speaks and closes first: its bytes, then CLOSE_RSP.
    let speaker = SpeakFirst::start_on("127.0.0.1:0".parse()?, 100_000).await?;
    let addr = speaker.addr().to_string();
    let r = c.run(&format!("read_to_close {addr}")).await?;
    let crc = Pattern::checksum(SpeakFirst::SEED, 100_000).0;
    anyhow::ensure!(r["bytes"] == 100_000 && r["crc32c"] == crc, "{r}, want CRC {crc}");
    event(&w, &addr, "closed").await?;

    // 64 Proxy streams at once: even ones on the long-lived channel, odd ones on their own.
    let many = TcpEcho::start().await?;
    c.run(&format!("many {} 64", many.addr())).await?;
    w.all_streams_ended().await
}

/// What a client sends on a Unix socket to a server that answers only with its SETTINGS:
/// everything read until it has been quiet for 300 ms.
async fn capture(sock: &std::path::Path, client: impl std::future::Future<Output = ()>) -> anyhow::Result<Vec<u8>> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let _ = std::fs::remove_file(sock);
    let l = tokio::net::UnixListener::bind(sock)?;
    let server = async {
        let (mut s, _) = l.accept().await?;
        // An empty SETTINGS frame: the server's preface.
        s.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await?;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await {
            match n? {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        anyhow::Ok(got)
    };
    let (got, _) = tokio::join!(server, tokio::time::timeout(Duration::from_secs(15), client));
    got
}

/// The seeds of the `http2_requests` fuzz target: the first bytes real clients send on a Unix
/// socket when they dial, gRPC core (grpcio) with each `:authority` and tonic's client.
/// `cargo test -p seedgate-tests --test it -- --ignored write_http2_corpus`
#[tokio::test]
#[ignore = "writes wire/fuzz/corpus/http2_requests/"]
async fn write_http2_corpus() -> anyhow::Result<()> {
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../wire/fuzz/corpus/http2_requests");
    std::fs::create_dir_all(&out)?;
    // A fixed path, so the captures are the same from run to run but for ids.
    let dir = std::path::Path::new("/tmp/seedgate-h2-corpus");
    std::fs::create_dir_all(dir)?;
    let sock = dir.join("konnectivity.sock");
    let path = sock.display().to_string();
    for (name, authority) in
        [("default", None), ("path", Some(path.as_str())), ("localhost", Some("localhost")), ("empty", Some(""))]
    {
        let got = capture(&sock, async {
            let Ok(Some(mut c)) = GrpcCore::start(&Target::Unix(sock.clone()), authority).await else {
                panic!("grpcio is needed to write the corpus")
            };
            let _ = c.run("dial_cancel 10.0.0.1:443").await;
        })
        .await?;
        anyhow::ensure!(got.len() > 24, "{name}: {} bytes", got.len());
        std::fs::write(out.join(format!("grpcio_{name}.bin")), got)?;
    }
    let got = capture(&sock, async {
        if let Ok(c) = testbed::konnectivity::Client::connect(testbed::tunnel_kit::Dialer::Unix(sock.clone())).await {
            let _ = c.dial("10.0.0.1:443").await;
        }
    })
    .await?;
    std::fs::write(out.join("tonic.bin"), got)?;
    Ok(())
}

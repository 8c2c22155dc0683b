//! Per-shoot files, end to end: sni-router's `routes_dir` (shoot files added, changed, removed, broken and conflicting while other shoots stream) and proxy-server's `clusters_dir` (a file fences a cluster).

use anyhow::Context as _;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use testbed::pki::client_config;
use testbed::tls_client::{http_get_request, tls_connect};
use testbed::tunnel_kit::{Fe, FeKind, TunnelPki, connect_tcp, refusal_of, server_yaml};
use testbed::{Ca, InProc, TcpEcho, TempDir, TlsHttpBackend, http_get, metric_value, poll_until, tls_request};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(20);

/// Write `name` in `dir` the way tools do: beside it, then renamed over.
fn put(dir: &Path, name: &str, text: &str) -> anyhow::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, dir.join(name))?;
    Ok(())
}

fn route_file(route: &str, sni: &str, up: SocketAddr) -> String {
    format!("routes:\n  - listener: gateway\n    name: {route}\n    sni: [{sni}]\n    upstreams: [{up}]\n")
}

/// Which backend answers a request with this SNI, or why none does.
async fn backend_for(gw: SocketAddr, ca: &Ca, sni: &str) -> anyhow::Result<String> {
    let r = tls_request(gw, Some(sni), client_config(ca, None, &["http/1.1"])?, &http_get_request(sni, "/")).await?;
    let body = r.body();
    body.split_whitespace()
        .find_map(|w| w.strip_prefix("backend="))
        .map(str::to_owned)
        .with_context(|| format!("no backend in {body:?}"))
}

async fn wait_backend(gw: SocketAddr, ca: &Ca, sni: &str, want: Option<&str>) -> anyhow::Result<()> {
    poll_until(WAIT, TICK, || async move {
        let got = backend_for(gw, ca, sni).await.ok();
        anyhow::ensure!(got.as_deref() == want, "{sni} is served by {got:?}, not {want:?}");
        Ok(())
    })
    .await
}

/// An `/echo` stream through the router: after the head, every byte comes back.
struct Stream<S> {
    s: S,
    n: usize,
}

async fn open_stream(
    gw: SocketAddr,
    ca: &Ca,
    sni: &str,
) -> anyhow::Result<Stream<impl AsyncRead + AsyncWrite + Unpin + use<>>> {
    let mut s = tls_connect(gw, Some(sni), client_config(ca, None, &["http/1.1"])?).await?;
    s.write_all(format!("GET /echo HTTP/1.1\r\nHost: {sni}\r\n\r\n").as_bytes()).await?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    // Bounded by the head's size and the timeout.
    tokio::time::timeout(WAIT, async {
        while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
            s.read_exact(&mut b).await?;
            head.push(b[0]);
        }
        anyhow::Ok(())
    })
    .await
    .context("no /echo head")??;
    anyhow::ensure!(head.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&head));
    Ok(Stream { s, n: 0 })
}

impl<S: AsyncRead + AsyncWrite + Unpin> Stream<S> {
    async fn echo(&mut self) -> anyhow::Result<()> {
        self.n += 1;
        let msg = format!("round {} of a streaming connection", self.n);
        self.s.write_all(msg.as_bytes()).await?;
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(WAIT, self.s.read_exact(&mut back)).await.context("no echo")??;
        anyhow::ensure!(back == msg.as_bytes(), "echo corrupted");
        Ok(())
    }
}

async fn file_reloads(admin: SocketAddr, result: &str) -> f64 {
    let text = http_get(admin, "/metrics").await.map(|(_, b)| b).unwrap_or_default();
    metric_value(&text, "seedgate_route_file_reloads_total", &[("result", result)]).unwrap_or(0.0)
}

async fn wait_file_reloads(admin: SocketAddr, result: &str, n: f64) -> anyhow::Result<()> {
    poll_until(WAIT, TICK, || async move {
        let got = file_reloads(admin, result).await;
        anyhow::ensure!(got >= n, "{got} route files counted {result}");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn shoot_files_change_one_shoot_and_leave_the_others_streaming() -> anyhow::Result<()> {
    let dir = TempDir::new("route-files")?;
    let ca = Ca::new("seedgate-test-ca")?;
    let a1 = TlsHttpBackend::start("shoot-a-v1", &ca.server(&["api.shoot-a.example.com"])?, None).await?;
    let a2 = TlsHttpBackend::start("shoot-a-v2", &ca.server(&["api.shoot-a.example.com"])?, None).await?;
    let b = TlsHttpBackend::start("shoot-b", &ca.server(&["api.shoot-b.example.com"])?, None).await?;
    let routes = dir.join("routes");
    std::fs::create_dir_all(&routes)?;
    put(&routes, "shoot-b.yaml", &route_file("shoot-b", "api.shoot-b.example.com", b.addr()))?;
    // Not route files: other names and a ConfigMap mount's hidden entries.
    std::fs::write(routes.join("README.txt"), "not yaml")?;
    std::fs::write(routes.join("..data"), "routes: [")?;
    let yaml = format!(
        "admin: {{ listen: 127.0.0.1:0 }}\nroutes_dir: {}\nlisteners:\n  - name: gateway\n    listen: 127.0.0.1:0\n",
        routes.display()
    );
    let router = InProc::start(&dir, "sni-router", &yaml).await?;
    let addrs = router.read_addresses().context("addresses")?;
    let (gw, admin) = (addrs.listener("gateway")?, addrs.admin()?);
    let log = || router.log();

    wait_backend(gw, &ca, "api.shoot-b.example.com", Some("shoot-b")).await.with_context(log)?;
    let mut streaming_b = open_stream(gw, &ca, "api.shoot-b.example.com").await?;
    streaming_b.echo().await?;
    anyhow::ensure!(backend_for(gw, &ca, "api.shoot-a.example.com").await.is_err(), "shoot-a served before its file");

    // Added.
    put(&routes, "shoot-a.yaml", &route_file("shoot-a", "api.shoot-a.example.com", a1.addr()))?;
    wait_backend(gw, &ca, "api.shoot-a.example.com", Some("shoot-a-v1")).await.with_context(log)?;
    streaming_b.echo().await.context("shoot-b's stream, after shoot-a's file was added")?;
    let mut streaming_a1 = open_stream(gw, &ca, "api.shoot-a.example.com").await?;
    streaming_a1.echo().await?;

    // Changed: new connections follow the file; the live one (no drain deadline) runs on.
    put(&routes, "shoot-a.yaml", &route_file("shoot-a", "api.shoot-a.example.com", a2.addr()))?;
    wait_backend(gw, &ca, "api.shoot-a.example.com", Some("shoot-a-v2")).await.with_context(log)?;
    streaming_b.echo().await.context("shoot-b's stream, after shoot-a's file changed")?;
    streaming_a1.echo().await.context("shoot-a's stream admitted before the change")?;

    // Broken: refused, the routes it had stay.
    let failures = file_reloads(admin, "failure").await;
    put(&routes, "shoot-a.yaml", "routes: [\n")?;
    wait_file_reloads(admin, "failure", failures + 1.0).await.with_context(log)?;
    anyhow::ensure!(backend_for(gw, &ca, "api.shoot-a.example.com").await? == "shoot-a-v2", "old routes kept");
    anyhow::ensure!(log().contains("shoot-a.yaml"), "the refusal names the file:\n{}", log());

    // A duplicate route name (shoot-b's) in another file: refused, naming the other file.
    put(&routes, "shoot-c.yaml", &route_file("shoot-b", "api.shoot-c.example.com", a1.addr()))?;
    wait_file_reloads(admin, "failure", failures + 2.0).await.with_context(log)?;
    anyhow::ensure!(
        log().contains("route \\\"shoot-b\\\" of listener \\\"gateway\\\" is already in")
            || log().contains("route \"shoot-b\" of listener \"gateway\" is already in"),
        "the refusal names the duplicate:\n{}",
        log()
    );
    anyhow::ensure!(backend_for(gw, &ca, "api.shoot-c.example.com").await.is_err(), "the refused route serves");
    let (code, ready) = http_get(admin, "/readyz?verbose").await?;
    anyhow::ensure!(code == 200 && ready.contains("2 files, 2 routes (2 files refused)"), "{code} {ready}");

    // Removed: shoot-a's route goes; shoot-b's stream never noticed anything.
    std::fs::remove_file(routes.join("shoot-a.yaml"))?;
    wait_backend(gw, &ca, "api.shoot-a.example.com", None).await.with_context(log)?;
    for _ in 0..3 {
        streaming_b.echo().await.context("shoot-b's stream, after shoot-a's file was removed")?;
    }
    streaming_a1.echo().await.context("a removed route's live stream runs on without a drain deadline")?;
    anyhow::ensure!(b.connections() >= 2, "shoot-b's backend saw its connections");
    anyhow::ensure!(file_reloads(admin, "removed").await >= 1.0, "the removal is counted");
    Ok(())
}

#[tokio::test]
async fn a_cluster_file_fences_a_cluster() -> anyhow::Result<()> {
    let dir = TempDir::new("cluster-files")?;
    let pki = TunnelPki::new(dir.path())?;
    let echo = TcpEcho::start().await?;
    let clusters = dir.join("clusters");
    std::fs::create_dir_all(&clusters)?;
    let extra = format!("clusters_dir: {}\n", clusters.display());
    let yaml = server_yaml(&pki, "127.0.0.1:0", &[Fe::new("egress", "shoot-a", FeKind::Plain)], &extra);
    let server = InProc::start(&dir, "proxy-server", &yaml).await?;
    let a = server.read_addresses().context("addresses")?;
    let fe = a.listener("egress")?;
    let target = Arc::new(echo.addr().to_string());
    // No agent: the dial fails, but not as a moved cluster.
    let refusal = |fenced: bool| {
        let target = target.clone();
        async move {
            let e = connect_tcp(fe, &target).await.err().context("no agent: the dial cannot succeed")?;
            let r = refusal_of(&e).with_context(|| format!("not an HTTP refusal: {e:#}"))?;
            let moved = r.status == 503 && r.body.contains("cluster moved");
            anyhow::ensure!(moved == fenced, "{} {:?}", r.status, r.body);
            Ok(())
        }
    };
    refusal(false).await?;
    put(&clusters, "shoot-a.yaml", "clusters:\n  shoot-a: { state: fenced }\n")?;
    poll_until(WAIT, TICK, || refusal(true)).await.with_context(|| server.log())?;
    let (_, ready) = http_get(a.admin()?, "/readyz?verbose").await?;
    anyhow::ensure!(ready.contains("1 files, 1 clusters"), "{ready}");
    // Defined twice: refused, naming both files; the state in force stays.
    put(&clusters, "other.yaml", "clusters:\n  shoot-a: { state: active }\n")?;
    poll_until(WAIT, TICK, || async {
        anyhow::ensure!(server.log().contains("clusters.shoot-a: also defined in"), "not refused yet");
        Ok(())
    })
    .await?;
    refusal(true).await?;
    std::fs::remove_file(clusters.join("other.yaml"))?;
    std::fs::remove_file(clusters.join("shoot-a.yaml"))?;
    poll_until(WAIT, TICK, || refusal(false)).await.with_context(|| server.log())?;
    Ok(())
}

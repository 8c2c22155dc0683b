//! stand-in: testbed backends as a process, so topology tests can run them inside a network
//! namespace (`ns.command(bin_path("stand-in"))`). Prints `listening <addr>` once bound, then
//! serves until killed.
//!
//! ```text
//! stand-in tls-http  --listen ADDR --cert F --key F [--name X]   TLS "kube-apiserver" (TlsHttpBackend)
//! stand-in tls-page  --listen ADDR --cert F --key F [--metrics NAME | --body TEXT]   HTTPS page
//! stand-in http      --listen ADDR [--metrics NAME | --body TEXT]   plain HTTP page (HttpBackend)
//! stand-in echo      --listen ADDR                                    TCP echo (TcpEcho)
//! stand-in sink      --listen ADDR                                    TCP sink (TcpSink)
//! stand-in checksum  --listen ADDR [--trailer N]                      ChecksumSink
//! stand-in stall     --listen ADDR                                    accepts, never reads (Stall)
//! ```

use anyhow::{Context as _, bail};
use std::collections::HashMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use testbed::tunnel_kit::{ChecksumSink, Stall, TlsPage, metrics_page, server_config_from_files};
use testbed::{HttpBackend, TcpEcho, TcpSink, TlsHttpBackend};

fn usage() -> ! {
    eprintln!("usage: stand-in <tls-http|tls-page|http|echo|sink|checksum|stall> --listen ADDR [options]");
    std::process::exit(2);
}

fn parse(args: &[String]) -> anyhow::Result<HashMap<String, String>> {
    let mut m = HashMap::new();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let Some(k) = k.strip_prefix("--") else { bail!("unexpected argument {k:?}") };
        let v = it.next().with_context(|| format!("--{k} needs a value"))?;
        m.insert(k.to_owned(), v.clone());
    }
    Ok(m)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some((mode, rest)) = args.split_first() else { usage() };
    let o = parse(rest)?;
    let get = |k: &str| o.get(k).map(String::as_str);
    let listen: SocketAddr = get("listen").context("--listen ADDR is required")?.parse()?;
    let body = || match (get("metrics"), get("body")) {
        (Some(name), _) => metrics_page(name),
        (None, Some(b)) => format!("{b}\n"),
        (None, None) => "stand-in\n".to_owned(),
    };
    let content_type = if get("metrics").is_some() { "text/plain; version=0.0.4" } else { "text/plain" };
    let tls = || -> anyhow::Result<_> {
        let cert = get("cert").context("--cert FILE is required")?;
        let key = get("key").context("--key FILE is required")?;
        server_config_from_files(Path::new(cert), Path::new(key), &["http/1.1"])
    };
    // Each arm keeps its backend alive in `_held` while main waits below.
    let (addr, _held): (SocketAddr, Box<dyn std::any::Any>) = match mode.as_str() {
        "tls-http" => {
            let b = TlsHttpBackend::start_with(get("name").unwrap_or("stand-in"), tls()?, listen).await?;
            (b.addr(), Box::new(b))
        }
        "tls-page" => {
            let b = TlsPage::start_on(listen, tls()?, content_type, &body()).await?;
            (b.addr(), Box::new(b))
        }
        "http" => {
            let b = HttpBackend::start_on(listen, content_type, &body()).await?;
            (b.addr(), Box::new(b))
        }
        "echo" => {
            let b = TcpEcho::start_on(listen).await?;
            (b.addr(), Box::new(b))
        }
        "sink" => {
            let b = TcpSink::start_on(listen).await?;
            (b.addr(), Box::new(b))
        }
        "checksum" => {
            let trailer = get("trailer").map(str::parse).transpose()?.unwrap_or(0);
            let b = ChecksumSink::start_on(listen, trailer).await?;
            (b.addr(), Box::new(b))
        }
        "stall" => {
            let b = Stall::start_on(listen).await?;
            (b.addr(), Box::new(b))
        }
        _ => usage(),
    };
    println!("listening {addr}");
    std::io::stdout().flush()?;
    // Until killed (SIGTERM/SIGKILL from the test, or the end of the namespace's processes).
    std::future::pending::<()>().await;
    Ok(())
}

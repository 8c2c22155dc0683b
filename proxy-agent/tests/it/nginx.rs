//! nginx as the real PROXY protocol v2 peer: it must see our client and the advertised destination.

use crate::common;

use anyhow::{Context as _, bail};
use common::*;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const NGINX: &str = "/usr/sbin/nginx";
const STREAM_MODULE: &str = "/usr/lib/nginx/modules/ngx_stream_module.so";

/// A foreground nginx in its own temp dir, killed (and the dir removed) on drop.
struct Nginx {
    child: Child,
    dir: PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // master_process is off: the one process is all there is to kill.
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::env::var_os("SEEDGATE_KEEP_TMP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `None` when nginx is missing and `SEEDGATE_SKIP_MISSING=1`; an error when it is missing otherwise.
fn nginx_available() -> anyhow::Result<bool> {
    let missing: Vec<&str> = [NGINX, STREAM_MODULE].into_iter().filter(|p| !std::path::Path::new(p).exists()).collect();
    if missing.is_empty() {
        return Ok(true);
    }
    if std::env::var("SEEDGATE_SKIP_MISSING").as_deref() == Ok("1") {
        println!("SKIP: {missing:?} not installed (apt-get install nginx libnginx-mod-stream)");
        return Ok(false);
    }
    bail!(
        "{missing:?} not installed: apt-get install nginx libnginx-mod-stream, or set SEEDGATE_SKIP_MISSING=1 to skip"
    )
}

async fn start_nginx() -> anyhow::Result<(Nginx, u16)> {
    let dir = std::env::temp_dir().join(format!("proxy-agent-nginx-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("logs"))?;
    // nginx cannot listen on port 0: take a free port and release it just before nginx binds it.
    let port = free_port().await;
    let d = dir.display();
    let conf = format!(
        "load_module {STREAM_MODULE};\n\
         master_process off;\nworker_processes 1;\nerror_log {d}/logs/error.log info;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 64; }}\n\
         stream {{\n  server {{\n    listen 127.0.0.1:{port} proxy_protocol;\n    \
         return \"$proxy_protocol_addr:$proxy_protocol_port $proxy_protocol_server_addr:$proxy_protocol_server_port\\n\";\n  }}\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), conf)?;
    let child = Command::new(NGINX)
        .arg("-p")
        .arg(&dir)
        .arg("-e")
        .arg(dir.join("logs/error.log"))
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .args(["-g", "daemon off;"])
        .stdin(Stdio::null())
        .spawn()
        .context("starting nginx")?;
    let mut nginx = Nginx { child, dir };
    let up = poll("nginx listening", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(|_| ())
    })
    .await;
    if let Err(e) = up {
        let status = nginx.child.try_wait()?;
        let log = std::fs::read_to_string(nginx.dir.join("logs/error.log")).unwrap_or_default();
        bail!("{e}; nginx status {status:?}; error.log:\n{log}");
    }
    Ok((nginx, port))
}

#[tokio::test]
async fn nginx_sees_the_client_and_the_advertised_destination() -> anyhow::Result<()> {
    if !nginx_available()? {
        return Ok(());
    }
    let (_nginx, port) = start_nginx().await?;
    let agent = Agent::start(&config(&format!("127.0.0.1:{port}"), "proxy-protocol-v2", "")).await?;
    for _ in 0..3 {
        let mut client = agent.connect().await?;
        // No client bytes: nginx's `return` closes at once, and unread bytes would turn its FIN into a reset.
        let (got, _) = within("nginx answer", read_until_closed(&mut client)).await?;
        let want = format!("{} {}\n", client.local_addr()?, agent.listener());
        assert_eq!(
            String::from_utf8(got)?,
            want,
            "nginx's view: $proxy_protocol_addr:port $proxy_protocol_server_addr:port"
        );
    }
    agent.wait_metric("seedgate_connections_total", &[("result", "ok")], 3.0).await?;
    agent.stop().await
}

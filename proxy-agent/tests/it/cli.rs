//! The proxy-agent binary: `--check` exit codes, `--write-addresses`, serving, and exit 0 on SIGTERM.

use anyhow::{Context as _, bail};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_proxy-agent");
const DEADLINE: Duration = Duration::from_secs(20);

fn temp_dir(label: &str) -> anyhow::Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("proxy-agent-cli-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

fn check(file: &Path) -> anyhow::Result<Output> {
    Ok(Command::new(BIN).arg("--check").arg("--config").arg(file).output()?)
}

#[test]
fn check_exits_0_on_a_good_file_and_2_on_a_bad_one() -> anyhow::Result<()> {
    let dir = temp_dir("check")?;
    let good = dir.join("good.yaml");
    std::fs::write(
        &good,
        "admin: { listen: 127.0.0.1:9903 }\napiserver_proxy:\n  listen: [10.1.2.3:443]\n  gateway: api.seed.example.com:8443\n  mode: proxy-protocol-v2\n  destination: \"outbound|443||kube-apiserver.shoot--a.svc.cluster.local\"\n",
    )?;
    let out = check(&good)?;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8(out.stdout)?.contains("valid"));

    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        "apiserver_proxy:\n  listen: [api.local:443]\n  gateway: a:1\n  mode: http-connect\n  retries: 0\n",
    )?;
    let out = check(&bad)?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8(out.stderr)?;
    let b = bad.display();
    assert!(!err.contains("api.local"), "a host name is a valid listen address: {err}");
    // Left out: shown at its section, saying so.
    assert!(err.contains(&format!("{b}:1:1: apiserver_proxy.destination: required")), "{err}");
    assert!(err.contains("(not in the file: shown at apiserver_proxy)"), "{err}");
    assert!(err.contains(&format!("{b}:5:12: apiserver_proxy.retries")), "{err}");

    let typo = dir.join("typo.yaml");
    std::fs::write(&typo, "timeouts:\n  handshake: 5s\n  conect: 1s\n")?;
    let out = check(&typo)?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8(out.stderr)?;
    assert!(err.starts_with(&format!("{}:3:3:", typo.display())) && err.contains("conect"), "{err}");

    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[test]
fn help_documents_the_flags() -> anyhow::Result<()> {
    let out = Command::new(BIN).arg("--help").output()?;
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8(out.stdout)?;
    for flag in ["--config", "--check", "--log-format", "--write-addresses"] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
    Ok(())
}

/// Kills the child if the test fails before it exits by itself.
struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let end = Instant::now() + DEADLINE;
    while Instant::now() < end {
        if let Some(v) = f() {
            return Ok(v);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("{what}: not within {DEADLINE:?}")
}

#[test]
fn the_binary_serves_and_exits_0_after_sigterm() -> anyhow::Result<()> {
    let dir = temp_dir("run")?;
    let gateway = TcpListener::bind("127.0.0.1:0")?;
    let cfg = dir.join("agent.yaml");
    std::fs::write(
        &cfg,
        format!(
            "admin: {{ listen: 127.0.0.1:0 }}\ndrain_grace: 5s\napiserver_proxy:\n  listen: [127.0.0.3:0, 127.0.0.4:0]\n  gateway: {}\n  mode: proxy-protocol-v2\n",
            gateway.local_addr()?
        ),
    )?;
    let addrs_file = dir.join("addrs.json");
    let child = Command::new(BIN)
        .arg("--config")
        .arg(&cfg)
        .arg("--write-addresses")
        .arg(&addrs_file)
        .args(["--log-format", "json"])
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr.log"))?)
        .spawn()?;
    let mut child = Kill(child);
    let json = wait_for("addresses file", || std::fs::read_to_string(&addrs_file).ok())?;
    let addrs: serde_json::Value = serde_json::from_str(&json)?;
    let listener = addrs["listeners"]["apiserver-proxy"].as_str().context("listener address")?;
    let second = addrs["listeners"]["apiserver-proxy-1"].as_str().context("second listener")?;
    assert!(listener.starts_with("127.0.0.3:") && second.starts_with("127.0.0.4:"), "{json}");
    let admin = addrs["admin"].as_str().context("admin address")?.to_owned();
    assert!(!addrs_file.with_extension("json.tmp").exists());

    // One connection through the second listener: the gateway sees it as the destination.
    let mut client = TcpStream::connect(second)?;
    client.set_read_timeout(Some(DEADLINE))?;
    gateway.set_nonblocking(false)?;
    let (mut conn, _) = gateway.accept()?;
    conn.set_read_timeout(Some(DEADLINE))?;
    let mut buf = Vec::new();
    let header = loop {
        if let Some(h) = proxy_wire::proxy_protocol::parse(&buf)? {
            break h;
        }
        let mut chunk = [0u8; 256];
        let n = conn.read(&mut chunk)?;
        if n == 0 || buf.len() > 4096 {
            bail!("no PROXY header");
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    assert_eq!(header.destination.map(|d| d.to_string()).as_deref(), Some(second));
    assert_eq!(header.source, Some(client.local_addr()?));
    conn.write_all(b"hi")?;
    let mut hi = [0u8; 2];
    client.read_exact(&mut hi)?;
    assert_eq!(&hi, b"hi");
    drop((client, conn));

    let mut admin_conn = TcpStream::connect(&admin)?;
    admin_conn.set_read_timeout(Some(DEADLINE))?;
    admin_conn.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut metrics = String::new();
    admin_conn.read_to_string(&mut metrics)?;
    assert!(metrics.contains("seedgate_build_info{binary=\"proxy-agent\""), "{metrics}");

    let pid = child.0.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status()?;
    assert!(killed.success());
    let status = wait_for("exit after SIGTERM", || child.0.try_wait().ok().flatten())?;
    let log = std::fs::read_to_string(dir.join("stderr.log"))?;
    assert_eq!(status.code(), Some(0), "stderr:\n{log}");
    assert!(log.contains("\"target\":\"access\""), "access log line missing:\n{log}");
    assert!(log.contains("\"reason\":\"") && log.contains("\"gateway\":\""), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

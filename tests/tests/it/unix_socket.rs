//! proxy-server's Unix-socket front end on disk, through the real binary: the socket's mode and
//! group, a parent directory made when missing, a regular file at the path refused (at start and
//! on reload) and left intact, and the socket file removed when the front end is removed and
//! when the process exits.

use anyhow::Context as _;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use testbed::proc::Running;
use testbed::tunnel_kit::{Fe, FeKind, TunnelPki, ensure_binaries, server_yaml};
use testbed::{TempDir, bin_path, poll_until};

const DEADLINE: Duration = Duration::from_secs(20);
const TICK: Duration = Duration::from_millis(20);

/// A group other than the process's own (root's), so setting it is visible; falls back to 0.
fn some_group() -> (String, u32) {
    let text = std::fs::read_to_string("/etc/group").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let (name, _, gid) = (f.next()?, f.next()?, f.next()?.parse::<u32>().ok()?);
            (gid != 0).then(|| (name.to_owned(), gid))
        })
        .next()
        .unwrap_or(("root".into(), 0))
}

/// proxy-server YAML with a TCP front end `egress` and, when `uds` is given, a Unix one `uds`
/// at that path with `extra` keys.
fn yaml(pki: &TunnelPki, uds: Option<(&Path, &str)>) -> String {
    let mut fes = vec![Fe::new("egress", "shoot-a", FeKind::Plain)];
    if let Some((p, _)) = uds {
        fes.push(Fe::new("uds", "shoot-a", FeKind::Unix(p.to_owned())));
    }
    let y = server_yaml(pki, "127.0.0.1:0", &fes, "");
    match uds {
        Some((p, extra)) => {
            let line = format!("    unix: {}\n", p.display());
            y.replace(&line, &format!("{line}{extra}"))
        }
        None => y,
    }
}

async fn gone(path: &Path) -> anyhow::Result<()> {
    poll_until(DEADLINE, TICK, || async move {
        if path.exists() { Err(anyhow::anyhow!("{} still there", path.display())) } else { Ok(()) }
    })
    .await
}

#[tokio::test]
async fn mode_group_and_parent_directory_then_removed_on_reload_and_exit() -> anyhow::Result<()> {
    let dir = TempDir::new("uds-mode")?;
    let pki = TunnelPki::new(dir.path())?;
    let sock = dir.join("run/seedgate/egress.sock");
    let (group, gid) = some_group();
    let with_uds = yaml(&pki, Some((&sock, &format!("    unix_mode: \"0660\"\n    unix_group: {group}\n"))));
    let mut server = Running::start(&dir, "proxy-server", &with_uds).await?;
    let a = server.read_addresses().context("addresses")?;
    let admin = a.admin()?;
    anyhow::ensure!(a.unix("uds")? == sock, "{a:?}");
    let m = std::fs::metadata(&sock)?;
    anyhow::ensure!(m.file_type().is_socket(), "not a socket");
    anyhow::ensure!(m.permissions().mode() & 0o777 == 0o660, "mode {:o}", m.permissions().mode());
    anyhow::ensure!(m.gid() == gid, "group {} instead of {gid} ({group})", m.gid());
    let parent = std::fs::metadata(sock.parent().context("parent")?)?;
    anyhow::ensure!(parent.permissions().mode() & 0o777 == 0o750, "directory mode {:o}", parent.permissions().mode());
    anyhow::ensure!(parent.gid() == gid, "directory group {}", parent.gid());
    tokio::net::UnixStream::connect(&sock).await.context("connecting to the socket")?;

    // Removing the front end removes its socket file.
    // Each reload is waited for by its count, not by the addresses file: the file still names
    // `uds` from before the removal until the removal's reload has finished writing it.
    server.reload_with(&yaml(&pki, None)).await?;
    server.wait_reloads(admin, "success", 1.0).await?;
    gone(&sock).await.with_context(|| server.proc.log())?;
    // Back again, then SIGTERM: the file goes with the process.
    server.reload_with(&with_uds).await?;
    server.wait_reloads(admin, "success", 2.0).await?;
    server.addresses_where(|a| a.listeners.contains_key("uds")).await?;
    anyhow::ensure!(sock.exists(), "socket back after the reload");
    server.proc.signal(libc::SIGTERM)?;
    let st = server.proc.wait_exit(DEADLINE).await.context("no exit after SIGTERM")?;
    anyhow::ensure!(st.success(), "exit {st}");
    anyhow::ensure!(!sock.exists(), "socket file left behind after exit");
    Ok(())
}

#[tokio::test]
async fn a_regular_file_at_the_path_is_refused_at_start_and_on_reload_and_left_intact() -> anyhow::Result<()> {
    ensure_binaries()?;
    let dir = TempDir::new("uds-file")?;
    let pki = TunnelPki::new(dir.path())?;
    let path = dir.write("egress.sock", "not a socket")?;
    let with_file = yaml(&pki, Some((&path, "")));
    let cfg = dir.write("server.yaml", &with_file)?;
    let out = tokio::time::timeout(
        DEADLINE,
        tokio::process::Command::from(Command::new(bin_path("proxy-server")?)).arg("--config").arg(&cfg).output(),
    )
    .await
    .context("proxy-server did not exit")??;
    let err = String::from_utf8_lossy(&out.stderr);
    // The start checks what --check checks, with the same message and exit code.
    anyhow::ensure!(out.status.code() == Some(2), "exit {:?}: {err}", out.status.code());
    anyhow::ensure!(err.contains("frontends[1].unix: ") && err.contains("exists and is not a socket"), "{err}");
    anyhow::ensure!(std::fs::read_to_string(&path)? == "not a socket", "the file was changed");

    // A reload that adds the front end is refused by the bind itself; the file stays.
    let server = Running::start(&dir, "proxy-server", &yaml(&pki, None)).await?;
    let admin = server.read_addresses().context("addresses")?.admin()?;
    server.reload_with(&with_file).await?;
    server.wait_reloads(admin, "failure", 1.0).await?;
    server
        .proc
        .wait_log_line(&["front end uds", "is not a socket; refusing to replace it"], DEADLINE)
        .await
        .with_context(|| server.proc.log())?;
    anyhow::ensure!(std::fs::read_to_string(&path)? == "not a socket", "the file was changed by the reload");
    Ok(())
}

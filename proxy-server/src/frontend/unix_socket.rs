//! Unix-socket front ends on disk: parent directory, stale-socket replacement, mode and group, removal.
//!
//! kube-apiserver reaches a Unix-socket front end through a file shared between containers, so
//! the file's owner, group and mode decide who may connect. Binding never deletes anything but
//! a stale socket (one nobody accepts on): a regular file or directory at the path, or a socket
//! another process still serves, is a start error. The file is removed when its front end stops,
//! but only if it is still the one this process made.

use seedgate_config::FileMode;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::net::UnixListener;

/// Mode of a parent directory created for a socket: the owner and the group may reach it.
pub(crate) const DIR_MODE: u32 = 0o750;

/// Why a socket path cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("the path exists and is not a socket; refusing to replace it (remove it or choose another path)")]
    NotASocket,
    #[error("another process is accepting on this socket; stop it or choose another path")]
    InUse,
    #[error("{path}: {what}: {source}")]
    Io {
        path: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("unix_group {0:?}: no such group in /etc/group")]
    NoGroup(String),
}

fn io_err(path: &Path, what: &'static str) -> impl FnOnce(io::Error) -> SocketError + use<> {
    let path = path.display().to_string();
    move |source| SocketError::Io { path, what, source }
}

/// Who a socket file is for: its mode and group from the config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Access {
    pub mode: Option<FileMode>,
    pub group: Option<String>,
}

/// The numeric gid of `group`: a number, or a name looked up in `/etc/group` (what the
/// container images carry; no NSS module is consulted).
pub(crate) fn resolve_group(group: &str) -> Result<u32, SocketError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let text = std::fs::read_to_string("/etc/group").map_err(io_err(Path::new("/etc/group"), "reading"))?;
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(':');
            let (name, _, gid) = (f.next()?, f.next()?, f.next()?);
            (name == group).then(|| gid.parse::<u32>().ok()).flatten()
        })
        .next()
        .ok_or_else(|| SocketError::NoGroup(group.to_owned()))
}

/// A socket file this process created; identified by device and inode so that a file someone
/// else put at the same path later is never removed.
#[derive(Debug)]
pub(crate) struct SocketFile {
    path: PathBuf,
    id: (u64, u64),
}

impl SocketFile {
    /// Set mode and group as `access` says (also on a reload that changes only them).
    pub(crate) fn apply(&self, access: &Access) -> Result<(), SocketError> {
        if let Some(g) = &access.group {
            std::os::unix::fs::chown(&self.path, None, Some(resolve_group(g)?))
                .map_err(io_err(&self.path, "setting the group"))?;
        }
        if let Some(m) = access.mode {
            std::fs::set_permissions(&self.path, std::fs::Permissions::from_mode(m.0))
                .map_err(io_err(&self.path, "setting the mode"))?;
        }
        Ok(())
    }

    /// Remove the file if it is still the one bound here.
    pub(crate) fn remove(&self) {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id);
        if ours {
            match std::fs::remove_file(&self.path) {
                Ok(()) => tracing::debug!(path = %self.path.display(), "socket file removed"),
                Err(e) => tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the socket file"),
            }
        }
    }
}

/// Make the parent directory if missing (mode [`DIR_MODE`], group as `access` says).
fn make_parent(path: &Path, access: &Access) -> Result<(), SocketError> {
    let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) else { return Ok(()) };
    if dir.exists() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)
        .map_err(io_err(dir, "creating the directory"))?;
    if let Some(g) = &access.group {
        std::os::unix::fs::chown(dir, None, Some(resolve_group(g)?)).map_err(io_err(dir, "setting the group"))?;
    }
    // The umask may have taken bits away.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DIR_MODE)).map_err(io_err(dir, "setting the mode"))
}

/// Clear the way for a bind at `path`: nothing there, or a stale socket (removed).
fn clear(path: &Path) -> Result<(), SocketError> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path, "inspecting")(e)),
        Ok(m) => m,
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket);
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err(SocketError::InUse),
        // Refused: nobody accepts on it any more.
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(io_err(path, "removing the stale socket"))
        }
        // E.g. no permission to connect: whether it is in use cannot be told, so it stays.
        Err(e) => Err(io_err(path, "checking whether the existing socket is in use")(e)),
    }
}

/// Bind a listening socket at `path` with `access`: the parent directory made if missing, a
/// stale socket replaced, anything else refused.
pub(crate) fn bind(path: &Path, access: &Access) -> Result<(UnixListener, SocketFile), SocketError> {
    make_parent(path, access)?;
    clear(path)?;
    let l = UnixListener::bind(path).map_err(io_err(path, "binding"))?;
    let meta = std::fs::symlink_metadata(path).map_err(io_err(path, "inspecting"))?;
    let file = SocketFile { path: path.to_owned(), id: (meta.dev(), meta.ino()) };
    if let Err(e) = file.apply(access) {
        file.remove();
        return Err(e);
    }
    Ok((l, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(label: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("seedgate-uds-{label}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[tokio::test]
    async fn mode_group_parent_directory_and_removal() {
        let d = dir("mode");
        let path = d.join("sub/egress.sock");
        let gid = std::fs::metadata("/").unwrap().gid();
        let access = Access { mode: Some(FileMode(0o660)), group: Some(gid.to_string()) };
        let (_l, file) = bind(&path, &access).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.permissions().mode() & 0o777, 0o660);
        assert_eq!(m.gid(), gid);
        let parent = std::fs::metadata(d.join("sub")).unwrap();
        assert_eq!(parent.permissions().mode() & 0o777, DIR_MODE);
        file.remove();
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn a_regular_file_is_refused_and_left_intact() {
        let d = dir("file");
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("egress.sock");
        std::fs::write(&path, "precious").unwrap();
        let e = bind(&path, &Access::default()).unwrap_err().to_string();
        assert!(e.contains("is not a socket; refusing to replace it"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_a_live_one_is_not() {
        let d = dir("stale");
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("egress.sock");
        // Stale: bound, then the listener closed without removing the file.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let (live, file) = bind(&path, &Access::default()).unwrap();
        let e = bind(&path, &Access::default()).unwrap_err().to_string();
        assert!(e.contains("another process is accepting on this socket"), "{e}");
        drop(live);
        file.remove();
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn groups_by_name_or_number() {
        assert_eq!(resolve_group("0").unwrap(), 0);
        assert_eq!(resolve_group("root").unwrap(), 0);
        assert!(matches!(resolve_group("no-such-group-here"), Err(SocketError::NoGroup(_))));
    }
}

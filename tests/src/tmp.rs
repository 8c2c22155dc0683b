//! Temporary directories that are removed on drop (kept when `SEEDGATE_KEEP_TMP` is set).

use anyhow::Context as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A fresh directory under the system temp dir. Set `SEEDGATE_KEEP_TMP=1` to keep it (and its
/// logs) after a failing run; its path is then printed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
    keep: bool,
}

impl TempDir {
    pub fn new(label: &str) -> anyhow::Result<Self> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("seedgate-{label}-{}-{n}", std::process::id()));
        // A leftover from a killed run with a recycled pid would otherwise leak stale files in.
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path, keep: std::env::var_os("SEEDGATE_KEEP_TMP").is_some() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// Write a file in the directory and return its path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> anyhow::Result<PathBuf> {
        let p = self.join(name);
        std::fs::write(&p, contents).with_context(|| format!("writing {}", p.display()))?;
        Ok(p)
    }

    /// Do not remove the directory on drop.
    pub fn keep(&mut self) -> &Path {
        self.keep = true;
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("testbed: kept {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

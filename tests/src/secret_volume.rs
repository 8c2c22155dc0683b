//! A directory laid out like a mounted Kubernetes secret: files are symlinks into `..data`, itself a symlink swapped atomically to publish a new version.

use anyhow::Context as _;
use std::path::{Path, PathBuf};

/// The kubelet's layout: `<dir>/<name>` -> `..data/<name>`, `..data` -> `..<version>`; a new
/// version is written aside and published by renaming a new `..data` link over the old one, so
/// a reader sees every file of one version or of the other, never a mix.
#[derive(Debug)]
pub struct SecretVolume {
    dir: PathBuf,
    version: u32,
}

impl SecretVolume {
    /// A new volume at `dir` (created).
    pub fn new(dir: PathBuf) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self { dir, version: 0 })
    }

    /// The path a binary is configured with for file `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Publish a new version holding exactly `files` (name, contents).
    pub fn publish(&mut self, files: &[(&str, &str)]) -> anyhow::Result<()> {
        self.version += 1;
        let v = format!("..{}", self.version);
        let vdir = self.dir.join(&v);
        std::fs::create_dir_all(&vdir)?;
        for (name, text) in files {
            std::fs::write(vdir.join(name), text)?;
            let link = self.dir.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(Path::new("..data").join(name), &link)?;
            }
        }
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&v, &tmp)?;
        std::fs::rename(&tmp, self.dir.join("..data")).context("publishing ..data")?;
        Ok(())
    }
}

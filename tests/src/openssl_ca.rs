//! `openssl ca` acting as a test CA: its database, revoking certificates, and the revocation lists it signs (as an operator makes them).

use crate::pki::Ca;
use anyhow::{Context as _, bail};
use std::path::{Path, PathBuf};

/// A CA directory `openssl ca` works in: the CA's certificate and key, `index.txt`,
/// `crlnumber` and the config naming them.
#[derive(Debug)]
pub struct OpensslCa {
    dir: PathBuf,
    config: PathBuf,
}

impl OpensslCa {
    /// Set `ca` up for `openssl ca` in `<dir>/<stem>/`.
    pub fn new(ca: &Ca, dir: &Path, stem: &str) -> anyhow::Result<Self> {
        let dir = dir.join(stem);
        std::fs::create_dir_all(&dir)?;
        let cert = ca.write(&dir, "ca")?;
        let key = ca.write_key(&dir, "ca")?;
        std::fs::write(dir.join("index.txt"), "")?;
        std::fs::write(dir.join("crlnumber"), "1000\n")?;
        let config = dir.join("openssl.cnf");
        std::fs::write(
            &config,
            format!(
                "[ ca ]\ndefault_ca = test_ca\n\n[ test_ca ]\ndatabase = {db}\ncrlnumber = {crlnumber}\ncertificate = {cert}\n\
                 private_key = {key}\ndefault_md = sha256\ndefault_crl_days = 1\nunique_subject = no\n",
                db = dir.join("index.txt").display(),
                crlnumber = dir.join("crlnumber").display(),
                cert = cert.display(),
                key = key.display(),
            ),
        )?;
        Ok(Self { dir, config })
    }

    fn openssl(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = std::process::Command::new("openssl")
            .arg("ca")
            .arg("-config")
            .arg(&self.config)
            .args(args)
            .output()
            .context("running openssl ca (is openssl installed?)")?;
        if !out.status.success() {
            bail!("openssl ca {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    /// `openssl ca -revoke`: the certificate in `cert` (PEM) is revoked from now on.
    pub fn revoke(&self, cert: &Path) -> anyhow::Result<()> {
        self.openssl(&["-revoke", &cert.display().to_string()])
    }

    /// `openssl ca -gencrl`: a list of every certificate revoked so far, written to `out` in one
    /// rename (a watcher never reads half a file).
    pub fn gencrl(&self, out: &Path) -> anyhow::Result<()> {
        let tmp = self.dir.join("crl.pem.new");
        self.openssl(&["-gencrl", "-out", &tmp.display().to_string()])?;
        std::fs::rename(&tmp, out).with_context(|| format!("renaming to {}", out.display()))?;
        Ok(())
    }

    /// The serial of the certificate in `cert` as openssl prints it (`serial=...` without the
    /// name), the form proxy-server logs.
    pub fn serial(cert: &Path) -> anyhow::Result<String> {
        let out = std::process::Command::new("openssl")
            .args(["x509", "-noout", "-serial", "-in"])
            .arg(cert)
            .output()
            .context("running openssl x509")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let serial = text.trim().strip_prefix("serial=").with_context(|| format!("openssl x509 said {text:?}"))?;
        Ok(serial.trim_start_matches("00").to_owned())
    }
}

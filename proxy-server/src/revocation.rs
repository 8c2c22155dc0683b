//! Agent sessions whose client certificate a reloaded revocation list names: ended within seconds of the change, counted and logged with the serial.
//!
//! rustls refuses a revoked certificate at the handshake; a session verified before the list
//! named it is found here. The agents' TLS material reloads itself when `agents.tls.crl`
//! changes (within [`proxy_core::watch::Poll::TLS`]); each reload that took effect reads the
//! lists again and ends every session whose certificate they revoke.

use crate::session::Session;
use crate::shared::Shared;
use proxy_core::tls::Revoked;
use proxy_core::watch::tls::Reloading;
use std::path::PathBuf;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Until `stop`: after every reload of `material`, read the lists in `crl` (none: nothing is
/// revoked) and end the sessions they revoke.
pub(crate) fn follow(
    shared: &Arc<Shared>,
    material: &Reloading<rustls::ServerConfig>,
    crl: Option<PathBuf>,
    stop: CancellationToken,
) {
    let mut changes = material.subscribe();
    let shared = shared.clone();
    tokio::spawn(async move {
        // The lists in force now (a new listener's material: a config reload changed the files).
        loop {
            let revoked = match &crl {
                None => Ok(Revoked::default()),
                Some(path) => {
                    let path = path.clone();
                    tokio::task::spawn_blocking(move || Revoked::load(&path))
                        .await
                        .unwrap_or_else(|e| Err(proxy_core::tls::TlsError::Config(e.to_string())))
                }
            };
            match revoked {
                Ok(r) => {
                    shared.agents_revoked.store(Arc::new(r));
                    end_revoked(&shared);
                }
                // The material took the file a moment ago: a file rewritten since is reported
                // by the next reload.
                Err(e) => {
                    tracing::warn!(error = %e, "agents.tls.crl unreadable after a reload; the lists in force stay")
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                r = changes.changed() => if r.is_err() { return },
            }
        }
    });
}

/// End every registered session whose certificate the lists in force revoke.
fn end_revoked(shared: &Shared) {
    let revoked = shared.agents_revoked.load();
    if revoked.is_empty() {
        return;
    }
    for s in shared.directory.all_sessions() {
        if let Some(serial) = s.identity.cert.as_ref().and_then(|c| revoked.of(c)) {
            ended(shared, &s, &serial);
        }
    }
}

/// Count, log and end a session whose certificate (serial `serial`) is revoked.
pub(crate) fn ended(shared: &Shared, s: &Session, serial: &str) {
    shared.metrics.sessions_ended.with_label_values(&[&s.cluster, "certificate_revoked"]).inc();
    tracing::warn!(cluster = %s.cluster, session = s.id, peer = %s.peer, %serial, "agent session ended: its client certificate is revoked");
    s.stop.cancel();
}

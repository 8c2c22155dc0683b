//! Agent sessions whose client certificate a reloaded revocation list names: ended within seconds of the change, counted and logged with the serial.
//!
//! rustls refuses a revoked certificate at the handshake; a session verified before the list
//! named it is found here. The agents' TLS material reloads itself when `agents.tls.crl`
//! changes (within [`proxy_core::watch::Poll::TLS`]); each reload that took effect hands over
//! the lists its verifier checks (matched to the CAs by key, [`proxy_core::tls::Revoked`]), and
//! every session whose certificate they revoke ends.

use super::wing::Agents;
use crate::registry::Session;
use proxy_core::watch::tls::Reloading;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Until `stop`: after every reload of `material`, take the lists its verifier checks and end
/// the sessions they revoke.
pub(crate) fn follow(agents: &Arc<Agents>, material: &Arc<Reloading<rustls::ServerConfig>>, stop: CancellationToken) {
    let mut changes = material.subscribe();
    let (agents, material) = (agents.clone(), material.clone());
    tokio::spawn(async move {
        // The lists in force now (a new listener's material: a config reload changed the files).
        loop {
            agents.revoked.store(material.revoked());
            end_revoked(&agents);
            tokio::select! {
                _ = stop.cancelled() => return,
                r = changes.changed() => if r.is_err() { return },
            }
        }
    });
}

/// End every registered session whose certificate the lists in force revoke.
fn end_revoked(agents: &Agents) {
    let revoked = agents.revoked.load();
    if revoked.is_empty() {
        return;
    }
    for s in agents.shared.directory.all_sessions() {
        if let Some(serial) = s.identity.cert.as_ref().and_then(|c| revoked.of(c)) {
            ended(agents, &s, &serial);
        }
    }
}

/// Count, log and end a session whose certificate (serial `serial`) is revoked.
pub(crate) fn ended(agents: &Agents, s: &Session, serial: &str) {
    agents.shared.metrics.sessions_ended.with_label_values(&[&s.cluster, "certificate_revoked"]).inc();
    tracing::warn!(cluster = %s.cluster, session = s.id, peer = %s.peer, %serial, "agent session ended: its client certificate is revoked");
    s.stop.cancel();
}

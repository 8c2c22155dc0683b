//! A front-end connection's way in: its place in the pending budget (and its cluster's count of handshakes), then its TLS handshake, under the budget's deadline.

use super::connect::Ready;
use super::{Accepted, BoxIo, FrontendRt, Refusal, by_protocol, rejected};
use crate::shared::Shared;
use proxy_core::net::pending::Admitted;
use proxy_core::net::share::{Hold, Kind};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

/// Admit a connection and run its TLS handshake (if its front end has TLS), then serve it by
/// its front end's protocol: `Some` for a CONNECT answered 200, ready to relay.
pub(super) async fn prepare(
    shared: Arc<Shared>,
    fe: Arc<FrontendRt>,
    conn: Accepted,
    peer: String,
    ip: Option<IpAddr>,
) -> Option<Ready> {
    // Until its request head is read the connection is pending, counted by its TCP peer; a
    // Unix-socket client (the local kube-apiserver) is exempt from the per-source cap. A front
    // end of one cluster admits it for that cluster: at the cluster's share, the cluster's own
    // oldest pending connection makes room, never another cluster's.
    let tenant = fe.cluster.as_deref().map(|c| shared.directory.pending_share(c));
    let ip_or_unix = ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let admitted = match shared.pending.admit_as(ip_or_unix, ip.is_none(), tenant.as_ref()) {
        Ok(a) => a,
        Err(r) => return rejected(&shared, &fe, &Refusal::Admission(r.into())),
    };
    let share = fe.cluster.as_deref().map(|c| {
        let t = shared.directory.shares.tenant(&[c]);
        t.count_refused(Kind::Handshake, admitted.own_evicted());
        t.hold(Kind::Handshake)
    });
    let pre = Pre { admitted, share };
    match conn {
        Accepted::Unix(s) => {
            by_protocol(shared, fe, Handshaken { io: Box::new(s), peer, cert_cluster: None, pre }).await
        }
        Accepted::Tcp(tcp, None) => {
            by_protocol(shared, fe, Handshaken { io: Box::new(tcp), peer, cert_cluster: None, pre }).await
        }
        Accepted::Tcp(tcp, Some(acc)) => {
            let handshake = match pre.admitted.within(acc.accept(tcp)).await {
                Ok(h) => h,
                Err(r) => return rejected(&shared, &fe, &r.into()),
            };
            match handshake {
                Ok(s) => {
                    let cn = s
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(proxy_core::tls::common_name);
                    let io = shared.frontend_certs.watch(&fe.name, &peer, s);
                    by_protocol(shared, fe, Handshaken { io, peer, cert_cluster: cn, pre }).await
                }
                Err(e) => {
                    // A refused certificate is the operator's to fix; other failures (scanners,
                    // resets, a client without a certificate) stay at debug.
                    let hint = proxy_core::tls::find_rustls_error(&e)
                        .filter(|r| !matches!(r, rustls::Error::NoCertificatesPresented))
                        .and_then(|r| proxy_core::tls::certificate_hint(r, &proxy_core::tls::FRONTEND));
                    match hint {
                        Some(hint) => {
                            tracing::warn!(%peer, frontend = %fe.name, error = %e, "front-end TLS handshake failed: {hint}")
                        }
                        None => tracing::debug!(%peer, error = %e, "front-end TLS handshake failed"),
                    }
                    rejected(&shared, &fe, &Refusal::TlsHandshake)
                }
            }
        }
    }
}

/// A front-end connection after its TLS handshake (if any), still pending.
pub(crate) struct Handshaken {
    pub(crate) io: BoxIo,
    pub(crate) peer: String,
    /// The client certificate's CN.
    pub(crate) cert_cluster: Option<String>,
    pub(crate) pre: Pre,
}

/// A front-end connection before its request head is read: its place in the pending budget,
/// and in its cluster's count of pending work when its front end names the cluster.
pub(crate) struct Pre {
    pub(crate) admitted: Admitted,
    pub(crate) share: Option<Hold>,
}

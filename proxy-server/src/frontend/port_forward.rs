//! The port-forward front end (`protocol: tcp`): every connection goes to the front end's one fixed target in its cluster, its bytes relayed as they come.
//!
//! There is no request to read: once the connection is accepted (and its TLS handshake done, if
//! any) it leaves the pending budget for an established slot, is dialled through the tunnel
//! exactly as a CONNECT is (cluster, proxy strategies, shares, limits, metrics) and relayed by
//! the same relay, with the same access event (`kind: tcp`, `code` 200 once relayed, else the
//! status a CONNECT would have been answered with). A client whose dial fails sees its
//! connection closed: the protocol has no other way to say it.

use super::refusal::Refusal;
use super::wing::{Ctx, Exit, Handshaken, Pre, Ready, Reply};
use super::wing::{FrontendRt, Frontends};
use std::sync::Arc;

/// Dial the front end's target for one accepted connection, up to a connection ready to relay;
/// a refusal leaves closed unanswered ([`Reply::Close`]).
pub(super) async fn serve(
    fes: &Arc<Frontends>,
    fe: &Arc<FrontendRt>,
    target: &Arc<str>,
    conn: Handshaken,
) -> Result<Ready, Exit> {
    let Handshaken { io, peer, cert_cluster, pre } = conn;
    let Pre { admitted, share: pending } = pre;
    let mut ctx = Ctx::new(fes, fe.clone(), peer, "-".into(), "tcp");
    ctx.target = target.to_string();
    let Some(cluster) = fe.cluster.clone().or(cert_cluster) else {
        return Err(Exit::late(ctx, io, Reply::Close, Refusal::NoClusterIdentity));
    };
    ctx.cluster = cluster.clone();
    // Nothing more to read before the dial: from the pending budget to an established slot.
    drop(pending);
    let permit = match admitted.establish(&fes.limit).await {
        Ok(p) => p,
        Err(r) => return Err(Exit::late(ctx, io, Reply::Close, r.into())),
    };
    let (stream, share) = match fes.dial(&cluster, target).await {
        Ok(d) => ctx.dialed(d),
        Err(e) => return Err(Exit::late(ctx, io, Reply::Close, e.into())),
    };
    fes.shared.metrics.requests.with_label_values(&[&fe.name, "tcp", "200"]).inc();
    Ok(Ready::new(io, stream, Vec::new(), ctx, permit, share))
}

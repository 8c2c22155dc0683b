//! The port-forward front end (`protocol: tcp`): every connection goes to the front end's one fixed target in its cluster, its bytes relayed as they come.
//!
//! There is no request to read: once the connection is accepted (and its TLS handshake done, if
//! any) it leaves the pending budget for an established slot, is dialled through the tunnel
//! exactly as a CONNECT is (cluster, proxy strategies, shares, limits, metrics) and relayed by
//! the same relay, with the same access event (`kind: tcp`, `code` 200 once relayed, else the
//! status a CONNECT would have been answered with). A client whose dial fails sees its
//! connection closed: the protocol has no other way to say it.

use super::admission::{Handshaken, Pre};
use super::connect::Ready;
use super::{BoxIo, Ctx, FrontendRt, Refusal, dial};
use crate::shared::Shared;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::AsyncWriteExt as _;

/// Dial the front end's target for one accepted connection: `Some` when it is ready to relay;
/// every refusal is counted and logged here.
pub(super) async fn serve(
    shared: Arc<Shared>,
    fe: Arc<FrontendRt>,
    target: Arc<str>,
    conn: Handshaken,
) -> Option<Ready> {
    let Handshaken { mut io, peer, cert_cluster, pre } = conn;
    let Pre { admitted, share: pending } = pre;
    let mut ctx = Ctx {
        conn_id: shared.ids.next(),
        fe: fe.clone(),
        peer,
        cluster: "-".into(),
        kind: "tcp",
        target: target.to_string(),
        strategy: "-",
        agent: String::new(),
        started: Instant::now(),
        results: shared.metrics.conn.connections.clone(),
        session: None,
    };
    let Some(cluster) = fe.cluster.clone().or(cert_cluster) else {
        return refuse(&shared, &ctx, &mut io, &Refusal::NoClusterIdentity).await;
    };
    ctx.cluster = cluster.clone();
    // Nothing more to read before the dial: from the pending budget to an established slot.
    drop(pending);
    let permit = match admitted.establish(&shared.limit).await {
        Ok(p) => p,
        Err(r) => return refuse(&shared, &ctx, &mut io, &r.into()).await,
    };
    let (stream, share) = match dial(&shared, &cluster, &target).await {
        Ok(d) => ctx.dialed(d),
        Err(e) => return refuse(&shared, &ctx, &mut io, &e.into()).await,
    };
    shared.metrics.requests.with_label_values(&[&fe.name, "tcp", "200"]).inc();
    Some(Ready::new(io, stream, Vec::new(), ctx, permit, share))
}

/// Refuse a port-forward connection: counted by reason and by the status a CONNECT would have
/// been answered with (the request a port forward stands for), logged, and closed unanswered.
async fn refuse<T>(shared: &Shared, ctx: &Ctx, io: &mut BoxIo, r: &Refusal) -> Option<T> {
    let (m, status) = (&shared.metrics, r.status());
    m.conn.rejects.with_label_values(&[&ctx.fe.name, r.label()]).inc();
    if status != 0 {
        m.requests.with_label_values(&[&ctx.fe.name, ctx.kind, &status.to_string()]).inc();
        let _ = io.shutdown().await;
    }
    ctx.log(status, r.label(), 0, 0);
    None
}

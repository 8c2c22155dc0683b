//! A front-end connection's life as one pipeline: admit (its place in the pending budget) → handshake (TLS, under the budget's deadline) → its front end's protocol → relay → log; each step returns what the next takes, and a connection that does not reach the relay leaves by one exit.
//!
//! The protocols ([`super::connect`], [`super::port_forward`], [`super::grpc`]) return a
//! connection ready to relay, or an [`Exit`]: served to its end (forward proxy, gRPC), refused
//! early (counted), or refused with its context (counted, answered as its protocol answers,
//! logged). Nothing a protocol does calls back up here.

use super::refusal::Refusal;
use super::wing::{Accepted, Exit, FrontendRt, Frontends, Handshaken, Late, Pre, Ready, Reply};
use super::{connect, grpc, port_forward, revocation};
use proxy_core::net::guard::Active;
use proxy_core::net::share::Kind;
use proxy_core::relay::copy::{Meters, Outcome, Side, Stop, transfer};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use tokio::io::AsyncWriteExt;

/// Serve one accepted front-end connection to its end. The admission, the handshake and the
/// protocol (the request head, the dial) run in a boxed future that is freed before the relay,
/// so a long-lived (mostly idle) stream holds only the relay's state. `ip`: the TCP peer's
/// address (`None` for a Unix socket), which the pending budget counts by.
pub(crate) fn connection(
    fes: Arc<Frontends>,
    fe: Arc<FrontendRt>,
    conn: Accepted,
    peer: String,
    ip: Option<IpAddr>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let active = Active::new(fes.shared.metrics.conn.active.with_label_values(&[&fe.name]));
    let prepare = Box::pin(prepare(fes.clone(), fe, conn, peer, ip));
    async move {
        let _active = active;
        if let Some(r) = prepare.await {
            relay(&fes, r).await;
        }
    }
}

/// Every step before the relay: `Some` for a connection ready to relay; any other way out
/// leaves by [`leave`].
async fn prepare(
    fes: Arc<Frontends>,
    fe: Arc<FrontendRt>,
    conn: Accepted,
    peer: String,
    ip: Option<IpAddr>,
) -> Option<Ready> {
    let steps = async {
        let pre = admit(&fes, &fe, ip)?;
        let conn = handshake(&fes, &fe, conn, peer, pre).await?;
        protocol(&fes, &fe, conn).await
    };
    match steps.await {
        Ok(ready) => Some(ready),
        Err(exit) => {
            leave(&fes, &fe, exit).await;
            None
        }
    }
}

/// The connection's place in the pending budget: until its request head is read it is pending,
/// counted by its TCP peer; a Unix-socket client (the local kube-apiserver) is exempt from the
/// per-source cap. A front end of one cluster admits it for that cluster: at the cluster's
/// share, the cluster's own oldest pending connection makes room, never another cluster's.
fn admit(fes: &Frontends, fe: &FrontendRt, ip: Option<IpAddr>) -> Result<Pre, Exit> {
    let directory = &fes.shared.directory;
    let tenant = fe.cluster.as_deref().map(|c| directory.pending_share(c));
    let ip_or_unix = ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let admitted = fes
        .pending
        .admit_as(ip_or_unix, ip.is_none(), tenant.as_ref())
        .map_err(|r| Exit::Early(Refusal::Admission(r.into())))?;
    let share = fe.cluster.as_deref().map(|c| {
        let t = directory.shares.tenant(&[c]);
        t.count_refused(Kind::Handshake, admitted.own_evicted());
        t.hold(Kind::Handshake)
    });
    Ok(Pre { admitted, share })
}

/// The TLS handshake, if the front end has TLS, under the admission's deadline; a connection
/// with a client certificate is watched for its revocation from then on.
async fn handshake(
    fes: &Frontends,
    fe: &Arc<FrontendRt>,
    conn: Accepted,
    peer: String,
    pre: Pre,
) -> Result<Handshaken, Exit> {
    let (tcp, acceptor) = match conn {
        Accepted::Unix(s) => return Ok(Handshaken { io: Box::new(s), peer, cert_cluster: None, pre }),
        Accepted::Tcp(tcp, None) => return Ok(Handshaken { io: Box::new(tcp), peer, cert_cluster: None, pre }),
        Accepted::Tcp(tcp, Some(acc)) => (tcp, acc),
    };
    match pre.admitted.within(acceptor.accept(tcp)).await.map_err(|r| Exit::Early(r.into()))? {
        Ok(s) => {
            let certs = s.get_ref().1.peer_certificates();
            let cn = certs.and_then(|c| c.first()).and_then(proxy_core::tls::common_name);
            let io = fes.certs.watch(&fe.name, &peer, s);
            Ok(Handshaken { io, peer, cert_cluster: cn, pre })
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
            Err(Exit::Early(Refusal::TlsHandshake))
        }
    }
}

/// Serve the connection by its front end's protocol: gRPC to its end, a port forward or a
/// CONNECT up to the relay (a forward-proxy connection to its end).
async fn protocol(fes: &Arc<Frontends>, fe: &Arc<FrontendRt>, conn: Handshaken) -> Result<Ready, Exit> {
    if fe.grpc {
        return Err(grpc::serve(fes, fe, conn).await);
    }
    if let Some(target) = &fe.target {
        return port_forward::serve(fes, fe, target, conn).await;
    }
    connect::serve(fes, fe, conn).await
}

/// The one exit of a connection that does not reach the relay: nothing more for one served to
/// its end; a refusal is counted by reason and, with its context, answered as its protocol
/// answers and logged.
async fn leave(fes: &Frontends, fe: &FrontendRt, exit: Exit) {
    let Late { ctx, mut io, reply, refusal: r } = match exit {
        Exit::Served => return,
        Exit::Early(r) => return fes.rejected(fe, &r),
        Exit::Late(late) => *late,
    };
    let (m, status) = (&fes.shared.metrics, r.status());
    m.conn.rejects.with_label_values(&[&ctx.fe.name, r.label()]).inc();
    match reply {
        _ if status == 0 => {}
        // Before the request head: answered in HTTP/1.1, no request counted.
        Reply::Http(None) => {
            let _ = io.write_all(&r.answer(1)).await;
        }
        Reply::Http(Some(v)) => {
            m.requests.with_label_values(&[&ctx.fe.name, ctx.kind, &status.to_string()]).inc();
            let _ = io.write_all(&r.answer(v)).await;
            let _ = io.shutdown().await;
        }
        Reply::Close => {
            m.requests.with_label_values(&[&ctx.fe.name, ctx.kind, &status.to_string()]).inc();
            let _ = io.shutdown().await;
        }
    }
    ctx.log(status, r.label(), 0, 0);
}

/// Relay a client and its tunnel stream until both ends close, the idle timeout, a drain of the
/// cluster, or the end of the shutdown grace period; then log the connection's end.
async fn relay(fes: &Frontends, r: Ready) {
    let Ready { io, mut stream, pipelined, ctx, places: _places } = r;
    let shared = &fes.shared;
    let m = &shared.metrics;
    let _active = Active::new(m.streams_active.with_label_values(&[&ctx.cluster]));
    let replayed = pipelined.len() as u64;
    if !pipelined.is_empty() && stream.write_all(&pipelined).await.is_err() {
        ctx.log(200, "tunnel_write_error", 0, 0);
        return;
    }
    drop(pipelined);
    let meters = Meters {
        to_upstream: Some(m.tunnel_bytes.with_label_values(&[&ctx.cluster, "to_shoot"])),
        to_client: Some(m.tunnel_bytes.with_label_values(&[&ctx.cluster, "to_seed"])),
    };
    let idle = shared.config.load().timeouts.idle.get();
    let end = shared.directory.stream_end(&ctx.cluster);
    let mut t = transfer(io, stream, idle, meters);
    let stop = std::pin::pin!(proxy_core::relay::stop_on(&end, &shared.shutdown.kill, Stop::ClusterDrained));
    let done = proxy_core::relay::run(&mut t, stop).await;
    if matches!(done.outcome, Outcome::Stopped(Stop::ClusterDrained)) {
        m.stream_drains.with_label_values(&[&ctx.cluster]).inc();
    }
    let reason = match &done.outcome {
        Outcome::Error(Side::Client, e) if revocation::ended_by(e) => revocation::REASON,
        o => o.label(),
    };
    ctx.log(200, reason, done.bytes.to_upstream + replayed, done.bytes.to_client);
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn connection_future_stays_small() {
        let fes = super::super::wing::test_frontends();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let fe = std::sync::Arc::new(super::FrontendRt {
            name: "fe".into(),
            cluster: Some("c".into()),
            proxy_token: None,
            grpc: false,
            target: None,
        });
        let f = super::connection(fes, fe, super::Accepted::Tcp(c, None), "peer".into(), None);
        // Every byte here is held by each open tunnel stream for its whole life (the pre-relay
        // phases are boxed and freed before the relay).
        let size = std::mem::size_of_val(&f);
        eprintln!("front-end connection future: {size} bytes");
        assert!(size <= 768, "per-connection future grew to {size} bytes");
    }
}

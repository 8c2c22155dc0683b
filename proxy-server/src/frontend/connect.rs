//! The CONNECT front end, a protocol step of the pipeline: the request head (read under the admission's deadline), the connection slot, proxy credentials, the dial and the 200, up to a connection ready to relay; an absolute-form request hands the connection to [`super::forward`].

use super::forward::forward;
use super::proxy_auth::proxy_auth_cluster;
use super::refusal::Refusal;
use super::wing::{BoxIo, Ctx, Exit, Handshaken, Pre, Ready, Reply};
use super::wing::{FrontendRt, Frontends};
use proxy_core::net::accept::ConnPermit;
use proxy_core::relay::io::Prefixed;
use proxy_wire::http_head::{self, HeadReader, RequestHead};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const READ_CHUNK: usize = 4096;

/// Serve one front-end connection (after TLS, if any) up to the relay: a CONNECT answered 200
/// is ready to relay; a forward-proxy connection is served to its end; anything else leaves
/// refused. The cluster is the front end's, the client certificate's CN, or (with proxy
/// credentials) the one each request's credentials name.
pub(super) async fn serve(fes: &Arc<Frontends>, fe: &Arc<FrontendRt>, conn: Handshaken) -> Result<Ready, Exit> {
    let Handshaken { mut io, peer, cert_cluster, pre } = conn;
    let Pre { admitted, share: pending } = pre;
    let cfg = fes.shared.config.load_full();
    let mut ctx = Ctx::new(fes, fe.clone(), peer, "-".into(), "-");
    // With proxy credentials the cluster is known once the request head is read.
    let conn_cluster = fe.cluster.clone().or(cert_cluster);
    if conn_cluster.is_none() && fe.proxy_token.is_none() {
        let r = Refusal::NoClusterIdentity;
        fes.shared.metrics.conn.connections.with_label_values(&[&fe.name, "-", r.label()]).inc();
        let _ = io.write_all(&r.answer(1)).await;
        return Err(Exit::Early(r));
    }
    if let Some(c) = &conn_cluster {
        ctx.cluster = c.clone();
    }
    // Read the request head under what is left of the handshake deadline.
    let mut buf = Vec::with_capacity(1024);
    let read = admitted.within(read_head(&mut io, &mut buf, cfg.limits.request_head_max)).await;
    let head: RequestHead = match read.map_err(Refusal::from).and_then(|r| r) {
        Ok(h) => h,
        Err(r) => return Err(Exit::late(ctx, io, Reply::Http(None), r)),
    };
    // Routed (the head names where to go): from the pending budget to an established slot.
    drop(pending);
    let reply = Reply::Http(Some(head.version));
    let permit = match admitted.establish(&fes.limit).await {
        Ok(p) => p,
        Err(r) => return Err(Exit::late(ctx, io, reply, r.into())),
    };
    if head.is_connect() {
        ctx.kind = "connect";
        ctx.target = head.target.clone();
        connect(fes, ctx, io, (head, buf), permit, conn_cluster).await
    } else if head.target.starts_with("http://") {
        ctx.kind = "forward";
        ctx.target = head.target.clone();
        drop(head);
        // Hand the connection, with the bytes already read, to an HTTP/1.1 server that
        // forwards each request through its own tunnel stream (keep-alive works as usual).
        let io = Prefixed::new(buf, io);
        forward(fes.clone(), &ctx, io).await;
        drop(permit);
        Err(Exit::Served)
    } else {
        let r = Refusal::NotAProxyRequest { method: head.method.clone(), target: head.target.clone() };
        Err(Exit::late(ctx, io, reply, r))
    }
}

/// A CONNECT: its target, its cluster (the connection's, or its proxy credentials'), the dial
/// (the target, never the Host header, says where to go) and the 200; `read` is the request
/// head and the bytes read with it (any after the head go to the tunnel stream first).
async fn connect(
    fes: &Frontends,
    mut ctx: Ctx,
    mut io: BoxIo,
    read: (RequestHead, Vec<u8>),
    permit: ConnPermit,
    conn_cluster: Option<String>,
) -> Result<Ready, Exit> {
    let (head, mut buf) = read;
    let reply = Reply::Http(Some(head.version));
    let target = match head.connect_authority() {
        Ok((h, p)) if h.contains(':') => format!("[{h}]:{p}"),
        Ok((h, p)) => format!("{h}:{p}"),
        Err(e) => return Err(Exit::late(ctx, io, reply, Refusal::BadConnectTarget(e))),
    };
    let cluster = match (&ctx.fe.proxy_token, conn_cluster) {
        (Some(token), _) => match proxy_auth_cluster(head.header("proxy-authorization"), token) {
            Ok(c) => c,
            Err(e) => return Err(Exit::late(ctx, io, reply, Refusal::ProxyAuth(e))),
        },
        (None, c) => c.expect("checked by serve"),
    };
    ctx.cluster = cluster.clone();
    let (stream, share) = match fes.dial(&cluster, &target).await {
        Ok(d) => ctx.dialed(d),
        Err(e) => return Err(Exit::late(ctx, io, reply, e.into())),
    };
    // 200 alone in its write: the egress dialer fails if tunnel bytes follow the head.
    if io.write_all(&http_head::connect_established(head.version)).await.is_err() {
        ctx.log(200, "client_write_error", 0, 0);
        return Err(Exit::Served);
    }
    fes.shared.metrics.requests.with_label_values(&[&ctx.fe.name, "connect", "200"]).inc();
    let pipelined = buf.split_off(head.len);
    Ok(Ready::new(io, stream, pipelined, ctx, permit, share))
}

/// Read a request head into `buf` (which keeps any bytes after it).
async fn read_head(io: &mut BoxIo, buf: &mut Vec<u8>, cap: usize) -> Result<RequestHead, Refusal> {
    // One reader across reads, so each read costs only its new bytes.
    let mut reader = HeadReader::new(cap);
    loop {
        if let Some(h) = reader.poll(buf).map_err(Refusal::BadHead)? {
            return Ok(h);
        }
        let old = buf.len();
        buf.resize(old + READ_CHUNK.min(cap + 1 - old), 0);
        match io.read(&mut buf[old..]).await {
            Ok(0) | Err(_) => {
                buf.truncate(old);
                return Err(Refusal::ClosedEarly);
            }
            Ok(n) => buf.truncate(old + n),
        }
    }
}

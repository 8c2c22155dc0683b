//! connect: HTTP CONNECT open rate, open latency, and bulk through one CONNECT tunnel.
//!
//! Every system gets the same bytes: `CONNECT <backend ip:port> HTTP/1.1`, `Host`, and
//! `X-Gardener-Destination: <value>`. sni-router and nginx (njs)
//! route by the header; squid and tinyproxy by the authority. A transaction is: connect, the
//! CONNECT head, its `200` ("open" latency), a small request through the tunnel, the answer,
//! close. Direct is the same exchange without a proxy (open = TCP connect).

use super::{Ctx, record, record_rate, record_skips};
use crate::host;
use crate::load::{Ping, Preamble, Sink, Txn, bulk_upload, closed_loop, connect_head, open_loop};
use crate::report::{Better, Kind, Results};
use crate::systems::{self, Running, Slot};
use std::net::SocketAddr;
use std::sync::Arc;

pub(super) const SC: &str = "connect";
pub(super) const HEADER: &str = "X-Gardener-Destination";
pub(super) const DEST_PING: &str = "outbound|443||kube-apiserver.shoot--bench.svc.cluster.local";
pub(super) const DEST_SINK: &str = "outbound|1194||vpn-seed-server.shoot--bench.svc.cluster.local";

/// The njs CONNECT handler for njs 0.7.9: preread until the blank line,
/// take the destination header, and let the filter answer 200 and drop the head.
pub(super) const CONNECT_JS: &str = r#"// CONNECT termination for nginx stream (njs 0.7.9).
function preread(s) {
    s.on('upstream', function (data, flags) {
        // In the preread phase every call sees the whole buffer read so far.
        var end = data.indexOf('\r\n\r\n');
        if (end < 0) {
            if (data.length > 8192 || flags.last) {
                s.deny();
            }
            return;
        }
        var lines = data.slice(0, end).toString().split('\r\n');
        if (!/^CONNECT \S+ HTTP\/1\.[01]$/.test(lines[0])) {
            s.deny();
            return;
        }
        var dest = '';
        for (var i = 1; i < lines.length; i++) {
            var m = lines[i].match(/^(X-Gardener-Destination|Reversed-VPN):\s*(.*?)\s*$/i);
            if (m) {
                dest = m[2];
            }
        }
        s.variables.connect_dest = dest;
        s.variables.connect_hdr_len = String(end + 4);
        s.off('upstream');
        s.done();
    });
}

function filter(s) {
    var skip = -1;
    s.on('upstream', function (data, flags) {
        if (skip < 0) {
            // The first upstream-bound data arrives once nginx has connected upstream.
            skip = Number(s.variables.connect_hdr_len) || 0;
            s.sendDownstream('HTTP/1.1 200 Connection established\r\n\r\n');
        }
        if (skip > 0) {
            var n = Math.min(skip, data.length);
            skip -= n;
            data = data.slice(n);
        }
        s.send(data, flags);
    });
}

export default {preread, filter};
"#;

/// The nginx stream server for CONNECT, mapping the two destinations.
pub(super) fn nginx_connect_server(listen: SocketAddr, ping: SocketAddr, sink: SocketAddr) -> String {
    format!(
        "    js_import cn from @DIR@/connect.js;\n    js_var $connect_dest;\n    js_var $connect_hdr_len;\n\
         \x20   map_hash_bucket_size 128;\n\
         \x20   map $connect_dest $connect_upstream {{\n        \"{DEST_PING}\" {ping};\n        \"{DEST_SINK}\" {sink};\n        default unix:@DIR@/reject.sock;\n    }}\n\
         \x20   server {{\n        listen {listen} reuseport;\n        preread_timeout 5s;\n        js_preread cn.preread;\n        js_filter cn.filter;\n\
         \x20       proxy_pass $connect_upstream;\n        proxy_connect_timeout 5s;\n        proxy_timeout 1h;\n    }}\n"
    )
}

/// An sni-router listener `gateway` with CONNECT routes for the two destinations.
pub(super) fn router_connect_listener(ping: SocketAddr, sink: SocketAddr) -> String {
    format!(
        "  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n\
         \x20     - name: api\n        connect: {{ header: {HEADER}, values: [\"{DEST_PING}\"] }}\n        upstreams: [{ping}]\n\
         \x20     - name: vpn\n        connect: {{ header: {HEADER}, values: [\"{DEST_SINK}\"] }}\n        upstreams: [{sink}]\n"
    )
}

/// The CONNECT head every system gets for `target` routed as `dest`.
pub(super) fn head(target: SocketAddr, dest: &str) -> Arc<[u8]> {
    connect_head(&target.to_string(), &format!("{HEADER}: {dest}\r\n")).into()
}

/// CONNECT proxies: sni-router, squid, tinyproxy, nginx+njs. Role `proxy`.
pub(super) async fn connect_systems(ctx: &Ctx, ping: SocketAddr, sink: SocketAddr) -> Vec<Slot> {
    let env = ctx.env();
    let mut slots = Vec::new();
    let r = systems::sni_router(&env, "sni-router", &router_connect_listener(ping, sink)).await.and_then(|mut r| {
        let a = r.addr("gateway")?;
        r.set_addr("proxy", a);
        Ok(r)
    });
    slots.push(Slot::from("sni-router", Kind::Seedgate, r));
    slots.push(Slot::from("squid", Kind::Anchor, systems::squid(&env, "squid").await));
    slots.push(Slot::from("tinyproxy", Kind::Anchor, systems::tinyproxy(&env, "tinyproxy").await));
    let r = async {
        let listen = host::free_port([127, 0, 0, 1])?;
        let body = nginx_connect_server(listen, ping, sink);
        systems::nginx(&env, "nginx njs", &body, &[("connect.js", CONNECT_JS.to_owned())], &[("proxy", listen)], true)
            .await
    }
    .await;
    slots.push(Slot::from("nginx njs", Kind::Anchor, r));
    slots
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let ping = Ping::start().await?;
    let sink = Sink::start().await?;
    let mut slots = vec![Slot::Up(Running::direct(&[("ping", ping.addr()), ("sink", sink.addr())]))];
    slots.extend(connect_systems(ctx, ping.addr(), sink.addr()).await);
    let m_rate = res.metric(SC, &format!("CONNECT opens/s ({} concurrent)", s.concurrency), "conn/s", Better::Higher);
    let m_sat99 = res.metric(SC, "open latency p99 at saturation", "µs", Better::Lower);
    let m50 = res.metric(SC, &format!("open latency p50 at {} conn/s", s.fixed_rate), "µs", Better::Lower);
    let m99 = res.metric(SC, &format!("open latency p99 at {} conn/s", s.fixed_rate), "µs", Better::Lower);
    let m_bulk = res.metric(SC, "bulk through one CONNECT tunnel", "Gbit/s", Better::Higher);
    res.remark(
        SC,
        "open = connect + CONNECT head + `200` received (direct: TCP connect); then a 39-byte request, the 66-byte answer, close",
    );
    for _ in 0..s.repeats {
        for slot in &mut slots {
            let Slot::Up(sys) = slot else { continue };
            let (txn, bulk_addr, bulk_pre) = if sys.kind == Kind::Direct {
                (Txn::Plain { addr: sys.addr("ping")?, pre: Arc::from(&b""[..]) }, sys.addr("sink")?, Preamble::None)
            } else {
                let proxy = sys.addr("proxy")?;
                (
                    Txn::Connect { addr: proxy, head: head(ping.addr(), DEST_PING) },
                    proxy,
                    Preamble::Connect(head(sink.addr(), DEST_SINK)),
                )
            };
            let r = closed_loop(&txn, s.concurrency, s.warmup, s.window).await;
            record_rate(res, sys, &r, &[(m_rate, r.rate), (m_sat99, r.open.quantile_us(0.99))]);
            let r = open_loop(&txn, s.fixed_rate, s.warmup, s.window, 1000).await;
            record_rate(res, sys, &r, &[(m50, r.open.quantile_us(0.5)), (m99, r.open.quantile_us(0.99))]);
            let r = bulk_upload(bulk_addr, &bulk_pre, 1, &sink, s.warmup, s.window).await;
            let r = r.and_then(|v| sys.check_alive().map(|()| v));
            record(res, m_bulk, &sys.label, sys.kind, r);
        }
    }
    record_skips(res, &[m_rate, m_sat99, m50, m99, m_bulk], &slots);
    Ok(())
}

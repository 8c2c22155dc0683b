//! proxy-protocol: connections/s through a PROXY-v2 listener that routes by the header's
//! destination (GEP-8's legacy in-cluster path).
//!
//! Two figures:
//! - the listener alone: the harness writes the v2 header (destination 10.1.2.3:443) and a small
//!   request in one write; sni-router `destination` route vs haproxy `dst,map_ip` vs nginx
//!   `$proxy_protocol_server_addr` map;
//! - node proxy → gateway: the client talks to a real sender (proxy-agent's apiserver proxy in
//!   proxy-protocol-v2 mode, or haproxy `send-proxy-v2`) on 127.0.0.3/127.0.0.4, which adds the
//!   header; sender and receiver both run on the proxy CPU.
//!
//! Each transaction is a new connection, one small request, the answer, close ([`Ping`]).

use super::{Ctx, record_rate, record_skips};
use crate::host;
use crate::load::{Ping, Txn, closed_loop, open_loop, proxy_v2};
use crate::report::{Better, FigureId, Kind, Read, Results, Targets, fmt_num, of};
use crate::systems::{self, Running, Slot};
use std::net::SocketAddr;
use std::sync::Arc;

pub(super) const SC: &str = "proxy-protocol";
const LISTENER: FigureId = FigureId::new(SC, "listener-conn-rate");
/// The destinations receivers route: the harness's header, the agent sender, the haproxy sender.
const HEADER_DST: &str = "10.1.2.3:443";

/// sni-router's listener `pp`: PROXY v2 required from 127.0.0.0/8, one route by destination.
pub(super) fn receivers_yaml(up: SocketAddr) -> String {
    format!(
        "  - name: pp\n    listen: 127.0.0.1:0\n    proxy_protocol: required\n    trusted_proxies: [127.0.0.0/8]\n    routes:\n\
         \x20     - name: legacy\n        destination: [10.1.2.3/32, 127.0.0.3/32, 127.0.0.4/32]\n        upstreams: [{up}]\n"
    )
}

/// haproxy's PROXY-v2 frontend `fe_pp` on `front` and its backend `be_pp` (the caller defines
/// `be_reject`), with the files it reads.
pub(super) fn haproxy_pp_frontend(front: SocketAddr, up: SocketAddr) -> (String, [(&'static str, String); 2]) {
    let body = format!(
        "frontend fe_pp\n    bind {front}\n\
         \x20   tcp-request connection expect-proxy layer4 if {{ src -f @DIR@/trusted.lst }}\n\
         \x20   tcp-request connection reject unless {{ src -f @DIR@/trusted.lst }}\n\
         \x20   use_backend %[dst,map_ip(@DIR@/dst.map)] if {{ dst,map_ip(@DIR@/dst.map) -m found }}\n\
         \x20   default_backend be_reject\n\
         backend be_pp\n    server pp {up}\n"
    );
    let files = [
        ("trusted.lst", "127.0.0.0/8\n".to_owned()),
        ("dst.map", "10.1.2.3/32 be_pp\n127.0.0.3/32 be_pp\n127.0.0.4/32 be_pp\n".to_owned()),
    ];
    (body, files)
}

/// nginx's PROXY-v2 server on `front`, routing by the header's destination to `up`.
pub(super) fn nginx_pp_server(front: SocketAddr, up: SocketAddr) -> String {
    format!(
        "    map $proxy_protocol_server_addr $pp_upstream {{\n        10.1.2.3 {up};\n        127.0.0.3 {up};\n        127.0.0.4 {up};\n        default unix:@DIR@/reject.sock;\n    }}\n\
         \x20   server {{\n        listen {front} proxy_protocol reuseport;\n        proxy_protocol_timeout 5s;\n        allow 127.0.0.0/8;\n        deny all;\n\
         \x20       proxy_pass $pp_upstream;\n        proxy_connect_timeout 5s;\n        proxy_timeout 1h;\n    }}\n"
    )
}

async fn haproxy_receiver(ctx: &Ctx, up: SocketAddr) -> anyhow::Result<Running> {
    let front = host::free_port([127, 0, 0, 1])?;
    let (fe, files) = haproxy_pp_frontend(front, up);
    let body = format!("{fe}backend be_reject\n    tcp-request content reject\n");
    systems::haproxy(&ctx.env(), "haproxy", &body, &files, &[("pp", front)], false).await
}

async fn nginx_receiver(ctx: &Ctx, up: SocketAddr) -> anyhow::Result<Running> {
    let front = host::free_port([127, 0, 0, 1])?;
    systems::nginx(&ctx.env(), "nginx", &nginx_pp_server(front, up), &[], &[("pp", front)], false).await
}

async fn haproxy_sender(ctx: &Ctx, label: &str, gateway: SocketAddr) -> anyhow::Result<Running> {
    let front = host::free_port([127, 0, 0, 4])?;
    let body = format!(
        "frontend kube_apiserver\n    bind {front}\n    default_backend seed\nbackend seed\n    server seed {gateway} send-proxy-v2\n"
    );
    systems::haproxy(&ctx.env(), label, &body, &[], &[("listen", front)], false).await
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let ping = Ping::start().await?;
    let env = ctx.env();
    // Receivers (the listener-alone figure uses them directly).
    let mut recv = vec![Slot::Up(Running::direct(&[("pp", ping.addr())]))];
    let router = systems::sni_router(&env, "sni-router", &receivers_yaml(ping.addr())).await;
    recv.push(Slot::from("sni-router", Kind::Seedgate, router));
    recv.push(Slot::from("haproxy", Kind::Anchor, haproxy_receiver(ctx, ping.addr()).await));
    recv.push(Slot::from("nginx", Kind::Anchor, nginx_receiver(ctx, ping.addr()).await));

    // Sender → receiver pairs.
    let mut pairs = vec![Slot::Up(Running::direct(&[("listen", ping.addr())]))];
    for (rlabel, rkind) in [("sni-router", Kind::Seedgate), ("haproxy", Kind::Anchor), ("nginx", Kind::Anchor)] {
        let gw = recv.iter().find_map(|sl| match sl {
            Slot::Up(r) if r.label == rlabel => r.addr("pp").ok(),
            _ => None,
        });
        for sender in ["proxy-agent", "haproxy"] {
            let label = format!("{sender} → {rlabel}");
            let Some(gw) = gw else {
                pairs.push(Slot::skipped(&label, rkind, &format!("{rlabel} did not start")));
                continue;
            };
            let r = if sender == "proxy-agent" {
                let listen = SocketAddr::from(([127, 0, 0, 3], 0));
                systems::agent_pp_sender(&env, &label, listen, gw).await
            } else {
                haproxy_sender(ctx, &label, gw).await
            }
            .map(|mut r| {
                r.label = label.clone();
                r.kind = rkind;
                r
            });
            pairs.push(Slot::from(&label, rkind, r));
        }
    }
    pairs.push(Slot::skipped(
        "nginx → nginx",
        Kind::Anchor,
        "nginx 1.22 sends PROXY v1 only (`proxy_protocol on`; v2 sending arrived in 1.31.4)",
    ));

    let m_l = res.figure(
        LISTENER,
        &format!("PROXY-v2 listener alone, connections/s ({} concurrent)", s.concurrency),
        "conn/s",
        Better::Higher,
    );
    let m_l50 = res.metric(
        SC,
        &format!("PROXY-v2 listener alone, time to first byte p50 at {} conn/s", s.fixed_rate),
        "µs",
        Better::Lower,
    );
    let m_l99 = res.metric(
        SC,
        &format!("PROXY-v2 listener alone, time to first byte p99 at {} conn/s", s.fixed_rate),
        "µs",
        Better::Lower,
    );
    let m_p = res.metric(SC, "node proxy → gateway (sender + receiver), connections/s", "conn/s", Better::Higher);
    res.remark(
        SC,
        "transaction = new TCP connection + 39-byte request + 66-byte answer + close; listener alone: the harness writes the PROXY v2 header \
         (10.9.9.9:40000 → 10.1.2.3:443) in the same write as the request",
    );
    let header: Arc<[u8]> = proxy_v2("10.9.9.9:40000".parse()?, HEADER_DST.parse()?)?.into();
    for _ in 0..s.repeats {
        for slot in &mut recv {
            let Slot::Up(sys) = slot else { continue };
            let pre: Arc<[u8]> = if sys.kind == Kind::Direct { Arc::from(&b""[..]) } else { header.clone() };
            let txn = Txn::Plain { addr: sys.addr("pp")?, pre };
            let r = closed_loop(&txn, s.concurrency, s.warmup, s.window).await;
            record_rate(res, sys, &r, &[(m_l, r.rate)]);
            let r = open_loop(&txn, s.fixed_rate, s.warmup, s.window, 1000).await;
            record_rate(
                res,
                sys,
                &r,
                &[(m_l50, r.first_byte.quantile_us(0.5)), (m_l99, r.first_byte.quantile_us(0.99))],
            );
        }
        for slot in &mut pairs {
            let Slot::Up(sys) = slot else { continue };
            let txn = Txn::Plain { addr: sys.addr("listen")?, pre: Arc::from(&b""[..]) };
            let r = closed_loop(&txn, s.concurrency, s.warmup, s.window).await;
            record_rate(res, sys, &r, &[(m_p, r.rate)]);
        }
    }
    record_skips(res, &[m_l, m_l50, m_l99], &recv);
    record_skips(res, &[m_p], &pairs);
    Ok(())
}

/// The PROXY-v2 listener's connections/s against the better of haproxy and nginx.
pub(super) fn targets(t: &mut Targets<'_>) {
    let what = "PROXY-v2 listener connections/s ≥ 1.5× best of haproxy/nginx";
    let ours = t.read(of(LISTENER, "sni-router"));
    let anchors = [t.read(of(LISTENER, "haproxy")), t.read(of(LISTENER, "nginx"))];
    // The better anchor of those measured; missing if either is missing.
    let best = match anchors.iter().find(|r| matches!(r, Read::Missing(_))) {
        Some(m) => m.clone(),
        None => anchors
            .iter()
            .filter_map(|r| if let Read::Value(v) = r { Some(*v) } else { None })
            .reduce(f64::max)
            .map_or_else(|| anchors[0].clone(), Read::Value),
    };
    t.check_reads(what, &[ours, best], |v| {
        (v[1] > 0.0).then(|| {
            (format!("{} ÷ {} conn/s = {:.2}×", fmt_num(v[0]), fmt_num(v[1]), v[0] / v[1]), v[0] / v[1] >= 1.5)
        })
    });
}

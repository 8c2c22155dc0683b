//! sni-bulk: a real ClientHello carrying SNI, then bulk bytes to a sink, 1 and 64 streams.
//!
//! The client writes the ClientHello of a real rustls client (the sink does not answer it: the
//! proxies only route on it), then 256 KiB writes as fast as the path takes them. Gbit/s is
//! what the sink received during the window, after the warm-up.

use super::{Ctx, record, record_skips};
use crate::host;
use crate::load::{Preamble, Sink, bulk_upload, client_hello};
use crate::report::{Better, FigureId, Kind, Results, Targets, of};
use crate::systems::{self, Running, Slot};
use std::sync::Arc;

pub(super) const SC: &str = "sni-bulk";
const BULK_1: FigureId = FigureId::new(SC, "bulk-1");
const BULK_64: FigureId = FigureId::new(SC, "bulk-64");
const SNI: &str = "bulk.bench.example";

/// haproxy's SNI frontend (inspect-delay, ClientHello check, SNI map).
pub(super) fn haproxy_sni_frontend(listen: std::net::SocketAddr, map_file: &str) -> String {
    format!(
        "frontend fe_sni\n    bind {listen}\n    tcp-request inspect-delay 5s\n    tcp-request content accept if {{ req.ssl_hello_type 1 }}\n\
         \x20   tcp-request content reject\n\
         \x20   use_backend %[req.ssl_sni,lower,map(@DIR@/{map_file})] if {{ req.ssl_sni,lower,map(@DIR@/{map_file}) -m found }}\n\
         \x20   default_backend be_reject\nbackend be_reject\n    tcp-request content reject\n"
    )
}

/// nginx's ssl_preread server, with the map's entries.
pub(super) fn nginx_sni_server(listen: std::net::SocketAddr, entries: &str) -> String {
    format!(
        "    map_hash_bucket_size 128;\n    map_hash_max_size 65536;\n    map $ssl_preread_server_name $sni_upstream {{\n        hostnames;\n{entries}        default unix:@DIR@/reject.sock;\n    }}\n\
         \x20   server {{\n        listen {listen} reuseport;\n        ssl_preread on;\n        preread_timeout 5s;\n        preread_buffer_size 16k;\n\
         \x20       proxy_pass $sni_upstream;\n        proxy_connect_timeout 5s;\n        proxy_timeout 1h;\n    }}\n"
    )
}

/// An sni-router listener named `gateway` with SNI routes `(name, sni, upstream)`.
pub(super) fn router_sni_listener(routes: &[(String, String, std::net::SocketAddr)]) -> String {
    let mut y = String::from("  - name: gateway\n    listen: 127.0.0.1:0\n    routes:\n");
    for (name, sni, up) in routes {
        y.push_str(&format!("      - name: {name}\n        sni: [{sni}]\n        upstreams: [{up}]\n"));
    }
    y
}

/// Connection caps of [`sni_systems`] in place of the bench's usual (large) ones.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caps {
    /// sni-router `limits.max_connections`.
    pub router_max_connections: usize,
    /// haproxy `maxconn`, global and frontend.
    pub haproxy_maxconn: u32,
    /// nginx `worker_connections` (it counts both sides of a proxied connection).
    pub nginx_worker_connections: u32,
}

/// The standard SNI systems in front of one upstream for one name: sni-router, haproxy
/// (optionally a second one with splice-auto) and nginx, with `caps` if given. Each exposes the
/// role `front`.
pub(super) async fn sni_systems(
    ctx: &Ctx,
    sni: &str,
    upstream: std::net::SocketAddr,
    splice_too: bool,
    caps: Option<Caps>,
) -> Vec<Slot> {
    let env = ctx.env();
    let mut slots = Vec::new();
    let yaml = router_sni_listener(&[("r".into(), sni.into(), upstream)]);
    let r = match caps {
        Some(c) => {
            let limits = format!("limits: {{ max_connections: {} }}\n", c.router_max_connections);
            systems::sni_router_with(&env, "sni-router", &limits, &yaml).await
        }
        None => systems::sni_router(&env, "sni-router", &yaml).await,
    };
    let r = r.and_then(|mut r| {
        let a = r.addr("gateway")?;
        r.set_addr("front", a);
        Ok(r)
    });
    slots.push(Slot::from("sni-router", Kind::Seedgate, r));
    let variants: &[(&str, bool)] =
        if splice_too { &[("haproxy", false), ("haproxy splice-auto", true)] } else { &[("haproxy", false)] };
    for &(label, splice) in variants {
        let r = async {
            let front = host::free_port([127, 0, 0, 1])?;
            let body = format!("{}backend be_up\n    server up {upstream}\n", haproxy_sni_frontend(front, "sni.map"));
            let files = [("sni.map", format!("{sni} be_up\n"))];
            let maxconn = caps.map(|c| c.haproxy_maxconn);
            systems::haproxy_with(&env, label, &body, &files, &[("front", front)], splice, maxconn).await
        }
        .await;
        slots.push(Slot::from(label, Kind::Anchor, r));
    }
    let r = async {
        let front = host::free_port([127, 0, 0, 1])?;
        let body = nginx_sni_server(front, &format!("        {sni} {upstream};\n"));
        let wc = caps.map(|c| c.nginx_worker_connections);
        systems::nginx_with(&env, "nginx", &body, &[], &[("front", front)], false, wc).await
    }
    .await;
    slots.push(Slot::from("nginx", Kind::Anchor, r));
    slots
}

pub(super) async fn run(ctx: &Ctx, res: &mut Results) -> anyhow::Result<()> {
    let s = &ctx.scale;
    let sink = Sink::start().await?;
    let hello: Arc<[u8]> = client_hello(ctx.tls_client.clone(), SNI)?.into();
    let pre = Preamble::Raw(hello);
    let mut slots = vec![Slot::Up(Running::direct(&[("front", sink.addr())]))];
    slots.extend(sni_systems(ctx, SNI, sink.addr(), true, None).await);
    let m1 = res.figure(BULK_1, "bulk, 1 stream", "Gbit/s", Better::Higher);
    let m64 = res.figure(BULK_64, "bulk, 64 streams", "Gbit/s", Better::Higher);
    res.remark(
        SC,
        "client: a rustls ClientHello (SNI bulk.bench.example, one record), then 256 KiB writes; Gbit/s = bytes the sink read in the window",
    );
    for _ in 0..s.repeats {
        for slot in &mut slots {
            let Slot::Up(sys) = slot else { continue };
            let front = sys.addr("front")?;
            for (m, n) in [(m1, 1), (m64, 64)] {
                let r = bulk_upload(front, &pre, n, &sink, s.warmup, s.window).await;
                let r = r.and_then(|v| sys.check_alive().map(|()| v));
                record(res, m, &sys.label, sys.kind, r);
            }
        }
    }
    record_skips(res, &[m1, m64], &slots);
    Ok(())
}

/// sni-router's bulk against direct and ahead of haproxy with splice-auto.
pub(super) fn targets(t: &mut Targets<'_>) {
    let figs = [("1 stream", BULK_1), ("64 streams", BULK_64)];
    for (what, f) in figs {
        t.ratio_at_least(
            &format!("sni-router bulk ({what}) ≥ 0.5× direct"),
            of(f, "sni-router"),
            of(f, "direct"),
            0.5,
            "Gbit/s",
        );
    }
    for (what, f) in figs {
        t.ratio_at_least(
            &format!("sni-router bulk ({what}) ahead of haproxy splice-auto"),
            of(f, "sni-router"),
            of(f, "haproxy splice"),
            1.0,
            "Gbit/s",
        );
    }
}

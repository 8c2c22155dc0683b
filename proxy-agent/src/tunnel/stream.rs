//! Serving one stream the seed opened: the allowlist, the dial in the shoot, the relay and its access-log event.

use super::Tunnel;
use proxy_core::net::connect_in_turn;
use proxy_core::net::guard::Active;
use proxy_core::obs::untrusted::Untrusted;
use proxy_core::relay;
use proxy_core::relay::copy::{Meters, Stop, transfer};
use proxy_core::tunnel::{DialError, Incoming, connect_failed};
use seedgate_config::agent::Tunnel as TunnelCfg;
use seedgate_config::{CidrPort, HostPort, ValueError};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

fn allowed(allow: &[CidrPort], addr: SocketAddr) -> bool {
    allow.iter().any(|c| c.matches(addr))
}

/// Resolve and check the target: every address dialled must be on the allowlist (a name that
/// resolves to a forbidden address is refused, so DNS cannot be used to escape the list).
async fn resolve_allowed(allow: &[CidrPort], target: &str, timeout: Duration) -> Result<Vec<SocketAddr>, DialError> {
    let hp: HostPort = target.parse().map_err(|e: ValueError| DialError::BadTarget(e.to_string()))?;
    if let Some(sa) = hp.socket_addr() {
        return if allowed(allow, sa) {
            Ok(vec![sa])
        } else {
            Err(DialError::NotAllowed(format!("{target} is not on the agent's allowlist")))
        };
    }
    let addrs = tokio::time::timeout(timeout, proxy_core::net::resolve(&hp))
        .await
        .map_err(|_| DialError::Timeout(format!("resolving {} timed out", hp.host)))?
        .map_err(|e| DialError::Resolve(format!("{}: {e}", hp.host)))?;
    let ok: Vec<SocketAddr> = addrs.iter().copied().filter(|a| allowed(allow, *a)).collect();
    if ok.is_empty() {
        return Err(DialError::NotAllowed(format!("{target} resolves to {addrs:?}, none on the agent's allowlist")));
    }
    Ok(ok)
}

/// Connect to `target` within the allowlist, each step under `dial_timeout`.
async fn dial_allowed(cfg: &TunnelCfg, target: &str) -> Result<(TcpStream, SocketAddr), DialError> {
    let timeout = cfg.dial_timeout.get();
    let addrs = resolve_allowed(&cfg.allow, target, timeout).await?;
    connect_in_turn(&addrs, addrs.len(), timeout, |_, _| {}).await.map_err(|e| connect_failed(target, &e))
}

pub(super) async fn serve_stream(t: Arc<Tunnel>, server: String, kill: CancellationToken, inc: Incoming) {
    let cfg = t.cfg.load_full();
    let m = &t.metrics.stream;
    let started = Instant::now();
    let target = inc.target.clone();
    if t.active.fetch_add(1, Ordering::Relaxed) >= cfg.max_streams {
        t.active.fetch_sub(1, Ordering::Relaxed);
        m.limit_hits.with_label_values(&["max_streams"]).inc();
        super::count_dial(&t, "stream_limit");
        inc.responder.refuse(&DialError::Limit(format!("{} streams open", cfg.max_streams)));
        return;
    }
    // Counted once above (the limit check); released with the stream.
    let _slot = (Active::new(m.streams_active.clone()), Active::adopt(&t.active));
    let (tcp, addr) = match dial_allowed(&cfg, &target).await {
        Ok(x) => x,
        Err(e) => {
            m.dial_failures.with_label_values(&[e.code()]).inc();
            super::count_dial(&t, e.code());
            m.dial_seconds.with_label_values(&["failed"]).observe(started.elapsed().as_secs_f64());
            // The seed is authenticated, but what it relays came from its clients: shown escaped.
            let (target, detail) = (Untrusted::new(&target), e.to_string());
            tracing::info!(target: "access", server = %server, %target, reason = e.code(), detail = %Untrusted::new(&detail).max(1024), "dial refused");
            inc.responder.refuse(&e);
            return;
        }
    };
    m.dial_seconds.with_label_values(&["ok"]).observe(started.elapsed().as_secs_f64());
    let stream = match inc.responder.accept() {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "stream vanished before it was answered");
            return;
        }
    };
    m.streams_opened.with_label_values(&[&server]).inc();
    super::count_dial(&t, "ok");
    let meters = Meters {
        to_upstream: Some(m.bytes.with_label_values(&["to_shoot"])),
        to_client: Some(m.bytes.with_label_values(&["to_seed"])),
    };
    let mut relay = transfer(stream, tcp, cfg.idle_timeout.get(), meters);
    // The session's kill token: its re-homing drain passed, or the shutdown grace is over.
    let stop = std::pin::pin!(relay::stop_on(&kill, &t.kill, Stop::SessionDrained));
    let done = relay::run(&mut relay, stop).await;
    proxy_core::access_event!(
        "stream closed", done.bytes, started, done.outcome.label();
        server = %server, target = %target, upstream = %addr
    );
}

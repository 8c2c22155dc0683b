//! Upstream choice and connect: power-of-two-choices or least-connections, skip after failure, retry before the first byte.

use proxy_core::net::balance::p2c;
use proxy_core::net::guard::Active;
use proxy_core::net::{ConnectFailure, connect_host, connect_in_turn};
use seedgate_config::HostPort;
use seedgate_config::router::Balance;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::net::TcpStream;

/// One upstream address of a route, with the state balancing needs.
pub(crate) struct Upstream {
    pub addr: HostPort,
    /// `addr` when it is an IP literal, parsed once instead of on every connect.
    literal: Option<SocketAddr>,
    active: AtomicUsize,
    /// Skip this upstream until this many ms after [`epoch`] (0 = not skipped).
    skip_until_ms: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

impl Upstream {
    pub(crate) fn new(addr: HostPort) -> Self {
        Self { literal: addr.socket_addr(), addr, active: AtomicUsize::new(0), skip_until_ms: AtomicU64::new(0) }
    }

    pub(crate) fn active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Skipped after a failed connect, for a while (`upstream_eject`).
    pub(crate) fn ejected(&self) -> bool {
        self.skipped(now_ms())
    }

    fn skipped(&self, now: u64) -> bool {
        self.skip_until_ms.load(Ordering::Relaxed) > now
    }

    pub(crate) fn eject(&self, for_: Duration) {
        self.skip_until_ms.store(now_ms() + for_.as_millis() as u64, Ordering::Relaxed);
    }
}

impl proxy_core::net::guard::Tally for Upstream {
    fn up(&self) {
        self.active.up();
    }
    fn down(&self) {
        self.active.down();
    }
}

/// Counts a connection against its upstream while it lives.
pub(crate) type UpstreamGuard = Active<Arc<Upstream>>;

/// The order in which to try a route's upstreams: the balancer's pick first, then the other
/// healthy ones by load, then the skipped ones (a skip is a preference, never a hard block, so a
/// route whose only upstream failed once still works when it recovers).
pub(crate) fn attempt_order(ups: &[Arc<Upstream>], balance: Balance) -> Vec<Arc<Upstream>> {
    let now = now_ms();
    let mut healthy: Vec<&Arc<Upstream>> = ups.iter().filter(|u| !u.skipped(now)).collect();
    let skipped = ups.iter().filter(|u| u.skipped(now));
    let first = match balance {
        _ if healthy.len() <= 1 => 0,
        Balance::LeastConnections => {
            // min_by_key keeps the first of equals: ties go to the earlier listed upstream.
            healthy.iter().enumerate().min_by_key(|(_, u)| u.active()).map(|(i, _)| i).unwrap_or(0)
        }
        Balance::PowerOfTwo => p2c(healthy.len(), |i| healthy[i].active()).unwrap_or(0),
    };
    let mut order = Vec::with_capacity(ups.len());
    if !healthy.is_empty() {
        order.push(healthy.swap_remove(first).clone());
        healthy.sort_by_key(|u| u.active());
        order.extend(healthy.into_iter().cloned());
    }
    order.extend(skipped.cloned());
    order
}

/// A connected upstream.
/// Longest a refused upstream is tried last. A refusal (the host answered with a reset, as while
/// a process restarts) costs the next client one round trip, not a connect timeout, so the
/// upstream is retried soon: a restarted replica gets its connections back within a second,
/// not after the whole `upstream_eject`.
const REFUSED_EJECT: Duration = Duration::from_secs(1);

/// How long an upstream that failed with `kind` is tried last.
fn eject_for(kind: ConnectFailure, eject: Duration) -> Duration {
    match kind {
        ConnectFailure::Refused => eject.min(REFUSED_EJECT),
        _ => eject,
    }
}

pub(crate) struct Connected {
    pub stream: TcpStream,
    pub addr: SocketAddr,
    pub guard: UpstreamGuard,
}

/// Every attempt failed; `last` says how the last one failed.
pub(crate) struct AllFailed {
    pub last: ConnectFailure,
    pub detail: String,
}

/// Try the route's upstreams in [`attempt_order`] until one connects. A failed upstream is
/// skipped by later connections for `eject`. `on_attempt` observes each attempt's duration and
/// failure (for metrics).
pub(crate) async fn connect(
    ups: &[Arc<Upstream>],
    balance: Balance,
    timeout: Duration,
    eject: Duration,
    mut on_attempt: impl FnMut(Duration, Option<ConnectFailure>),
) -> Result<Connected, AllFailed> {
    let mut last = None;
    // One upstream (the usual route) is tried as it is: no order to work out.
    let order = match ups {
        [_] => std::borrow::Cow::Borrowed(ups),
        _ => std::borrow::Cow::Owned(attempt_order(ups, balance)),
    };
    for up in order.iter() {
        let started = Instant::now();
        let attempt = match up.literal {
            Some(addr) => connect_in_turn(&[addr], 1, timeout, |_, _| {}).await,
            None => connect_host(&up.addr, timeout).await,
        };
        match attempt {
            Ok((stream, addr)) => {
                on_attempt(started.elapsed(), None);
                let guard = Active::new(up.clone());
                return Ok(Connected { stream, addr, guard });
            }
            Err(e) => {
                let kind = ConnectFailure::classify(&e);
                on_attempt(started.elapsed(), Some(kind));
                tracing::debug!(upstream = %up.addr, error = %e, "upstream connect failed");
                up.eject(eject_for(kind, eject));
                last = Some(AllFailed { last: kind, detail: format!("{}: {e}", up.addr) });
            }
        }
    }
    Err(last.unwrap_or_else(|| AllFailed { last: ConnectFailure::Other, detail: "route has no upstream".into() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ups(n: usize) -> Vec<Arc<Upstream>> {
        (0..n).map(|i| Arc::new(Upstream::new(format!("127.0.0.1:{}", 1000 + i).parse().unwrap()))).collect()
    }

    #[test]
    fn least_connections_prefers_idle_and_first_on_ties() {
        let u = ups(3);
        let _g1 = Active::new(u[0].clone());
        let order = attempt_order(&u, Balance::LeastConnections);
        assert_eq!(order[0].addr.port, 1001);
        assert_eq!(order.len(), 3);
    }

    #[test]
    fn power_of_two_never_picks_the_busier_of_two() {
        let u = ups(2);
        let _g: Vec<_> = (0..5).map(|_| Active::new(u[1].clone())).collect();
        for _ in 0..200 {
            assert_eq!(attempt_order(&u, Balance::PowerOfTwo)[0].addr.port, 1000);
        }
    }

    #[test]
    fn power_of_two_spreads_equal_load() {
        let u = ups(4);
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[(attempt_order(&u, Balance::PowerOfTwo)[0].addr.port - 1000) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
    }

    #[test]
    fn skipped_upstreams_go_last_but_stay_available() {
        let u = ups(2);
        u[0].eject(Duration::from_secs(60));
        let order = attempt_order(&u, Balance::PowerOfTwo);
        assert_eq!(order.iter().map(|x| x.addr.port).collect::<Vec<_>>(), vec![1001, 1000]);
        u[1].eject(Duration::from_secs(60));
        assert_eq!(attempt_order(&u, Balance::LeastConnections).len(), 2);
    }

    #[test]
    fn a_refused_upstream_is_skipped_briefly_a_silent_one_for_the_whole_eject() {
        let ten = Duration::from_secs(10);
        assert_eq!(eject_for(ConnectFailure::Refused, ten), REFUSED_EJECT);
        assert_eq!(eject_for(ConnectFailure::Refused, Duration::from_millis(200)), Duration::from_millis(200));
        assert_eq!(eject_for(ConnectFailure::Timeout, ten), ten);
        assert_eq!(eject_for(ConnectFailure::Unreachable, ten), ten);
    }

    #[test]
    fn guard_counts_active() {
        let u = ups(1);
        {
            let _g = Active::new(u[0].clone());
            assert_eq!(u[0].active(), 1);
        }
        assert_eq!(u[0].active(), 0);
    }
}

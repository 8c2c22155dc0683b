//! UDP listeners: QUIC routed by the SNI in the client's Initial packets and relayed datagram by datagram, without terminating QUIC.
//!
//! A flow is one client address. Its first datagrams wait (bounded in count, bytes and time)
//! until [`InitialReader`] has the ClientHello; the flow then gets a UDP socket connected to
//! one upstream of the route, the waiting datagrams are sent on, and datagrams are relayed both
//! ways until the flow is idle for `timeouts.udp_idle`. A flow keeps its route and upstream
//! across reloads, like a TCP connection. For balancing, a flow counts against its upstream only
//! while its client is heard ([`Counted`]).
//!
//! A flow also follows its client to a new address (NAT rebinding, a node whose address
//! changed): the router learns the connection IDs the upstream gives itself in its handshake
//! packets, and short-header packets from an unknown address that are addressed to one of them
//! may move that flow to the new address, by the rule of [`crate::migration`]: only once the
//! flow's address has gone quiet and the new one has sent several fresh datagrams, so a copied
//! or forged datagram cannot take a live flow's return path. Connection IDs are random and at
//! least 8 bytes with the QUIC stacks in use, so an off-path sender cannot guess one.
//!
//! The receive loop holds the listener's `flows` lock only to look flows up and change the
//! table: reading an Initial (key derivation, AES-GCM) happens outside it.

use crate::flow_budget::FlowSlot;
use crate::listener::ListenerRt;
use crate::migration::{Candidates, Verdict};
use crate::shared::Shared;
use crate::table::Route;
use crate::upstream::{Upstream, attempt_order};
use proxy_core::net::guard::Tally;
use proxy_core::net::resolve_within;
use proxy_core::sync::Mutex;
use proxy_wire::client_hello::Status;
use proxy_wire::quic_cid::{MAX_CID_LEN, long_header_scid, short_header_dcid};
use proxy_wire::quic_initial::{InitialReader, looks_like_initial};
use socket2::{Domain, Protocol, Socket, Type};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::net::UdpSocket;

/// Largest UDP payload (IPv4; IPv6 jumbograms do not cross the Internet).
const MAX_DATAGRAM: usize = 65_535;
/// How often a stopped listener checks whether its last flow is gone.
const STOPPED_CHECK: Duration = Duration::from_secs(1);
/// Upstream sockets of flows ask for this fraction of `limits.udp_socket_buffer`: there is one
/// per flow, and a flow carries one client's traffic, not the whole listener's.
const FLOW_BUFFER_DIVISOR: usize = 16;
const FLOW_BUFFER_MIN: usize = 64 * 1024;
/// Connection IDs learned per flow: an upstream gives itself one in its handshake packets (a
/// few if it retransmits), so this bounds the table against an upstream that changes it often.
const MAX_CIDS_PER_FLOW: usize = 4;

/// Datagrams of a flow waiting for its route, bounded in count and bytes.
struct Queue {
    items: Vec<Vec<u8>>,
    bytes: usize,
    max_items: usize,
    max_bytes: usize,
}

impl Queue {
    fn new(max_items: usize, max_bytes: usize) -> Self {
        Self { items: Vec::new(), bytes: 0, max_items, max_bytes }
    }

    /// False (and nothing kept) when the datagram would exceed a bound.
    fn push(&mut self, d: &[u8]) -> bool {
        if self.items.len() >= self.max_items || self.bytes + d.len() > self.max_bytes {
            return false;
        }
        self.bytes += d.len();
        self.items.push(d.to_vec());
        true
    }
}

/// A flow still reading its ClientHello, or choosing its upstream (`routing`).
struct Pending {
    id: u64,
    /// Taken out while a datagram is read into it, outside the `flows` lock.
    reader: Option<Box<InitialReader>>,
    queue: Queue,
    routing: bool,
    slot: FlowSlot,
}

/// A flow relayed to its upstream.
struct Routed {
    id: u64,
    /// The client's address now: it changes when the flow migrates.
    peer: Mutex<SocketAddr>,
    /// Connection IDs the upstream gave itself (keys of [`Flows::by_cid`]).
    cids: Mutex<Vec<Box<[u8]>>>,
    upstream: Arc<UdpSocket>,
    route: Arc<Route>,
    /// Milliseconds since [`epoch`] of the last datagram either way.
    last: AtomicU64,
    /// Milliseconds since [`epoch`] of the last datagram from the client's address now.
    client_last: AtomicU64,
    /// Other addresses sending the flow's datagrams: whether to follow one.
    candidates: Mutex<Candidates>,
    balance: Counted,
    _slot: FlowSlot,
}

/// A flow's share of its upstream's count, which `least-connections` and power-of-two balancing
/// read. UDP brings no end of connection: a QUIC session that ended (closed, reset by an upstream
/// restarted in place, its client killed) leaves its flow until `udp_idle`, and counting it
/// meanwhile sends new flows away from the upstream that just lost those sessions (after a replica
/// restarts, its agents' new sessions would go to the replicas they still hold). So a flow whose
/// client has been silent for a third of `udp_idle` stops counting, and counts again at its
/// client's next datagram; a live QUIC session is heard at least every keep-alive interval.
struct Counted {
    upstream: Arc<Upstream>,
    on: AtomicBool,
}

impl Counted {
    fn new(upstream: Arc<Upstream>) -> Self {
        upstream.up();
        Self { upstream, on: AtomicBool::new(true) }
    }

    fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Count the flow again (once, however many datagrams race here).
    fn resume(&self) {
        if !self.on() && !self.on.swap(true, Ordering::AcqRel) {
            self.upstream.up();
        }
    }

    fn pause(&self) {
        if self.on.swap(false, Ordering::AcqRel) {
            self.upstream.down();
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.pause();
    }
}

impl Routed {
    fn touch(&self) {
        self.last.store(now_ms(), Ordering::Relaxed);
    }

    /// A datagram from the client's address now.
    fn heard(&self) {
        self.client_last.store(now_ms(), Ordering::Relaxed);
        self.balance.resume();
    }

    fn peer(&self) -> SocketAddr {
        *self.peer.lock()
    }
}

enum Flow {
    /// Boxed: routed flows are most of the table, and should not pay for the reader's size.
    Pending(Box<Pending>),
    Routed(Arc<Routed>),
}

/// The flows of one listener. Keyed by client address, which clients choose: the default
/// (randomly keyed SipHash) hasher, not the table's fast one.
#[derive(Default)]
struct Flows {
    map: HashMap<SocketAddr, Flow>,
    pending: usize,
    /// Routed flows by the connection IDs their upstreams gave themselves.
    by_cid: HashMap<Box<[u8]>, Arc<Routed>>,
    /// How many flows hold a connection ID of each length (index: the length), so a
    /// short header, which does not say how long its ID is, is tried only at lengths in use.
    cid_lens: [usize; MAX_CID_LEN + 1],
}

impl Flows {
    fn remove_pending(&mut self, peer: SocketAddr, id: u64) -> Option<Pending> {
        match self.map.get(&peer) {
            Some(Flow::Pending(p)) if p.id == id => {}
            _ => return None,
        }
        self.pending -= 1;
        match self.map.remove(&peer) {
            Some(Flow::Pending(p)) => Some(*p),
            _ => None,
        }
    }

    /// Note that `f`'s upstream calls itself `cid`.
    fn learn(&mut self, f: &Arc<Routed>, cid: &[u8]) {
        let mut cids = f.cids.lock();
        if cids.len() >= MAX_CIDS_PER_FLOW || cids.iter().any(|c| &**c == cid) || self.by_cid.contains_key(cid) {
            return;
        }
        cids.push(cid.into());
        self.by_cid.insert(cid.into(), f.clone());
        if let Some(n) = self.cid_lens.get_mut(cid.len()) {
            *n += 1;
        }
    }

    /// The routed flow a short-header datagram is addressed to.
    fn by_short_header(&self, datagram: &[u8]) -> Option<Arc<Routed>> {
        let lens = self.cid_lens.iter().enumerate().filter(|&(_, n)| *n > 0).map(|(len, _)| len);
        lens.filter_map(|len| short_header_dcid(datagram, len)).find_map(|cid| self.by_cid.get(cid)).cloned()
    }

    /// Flow `f` ended: forget it under its address and its connection IDs.
    fn forget(&mut self, f: &Routed) {
        let peer = f.peer();
        if matches!(self.map.get(&peer), Some(Flow::Routed(g)) if g.id == f.id) {
            self.map.remove(&peer);
        }
        for cid in f.cids.lock().drain(..) {
            if self.by_cid.remove(&cid).is_some()
                && let Some(n) = self.cid_lens.get_mut(cid.len())
            {
                *n -= 1;
            }
        }
    }
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

/// The limits a listener reads from the config in force when a flow starts.
struct FlowLimits {
    flows: usize,
    pending: usize,
    hello_max: usize,
    packets: usize,
    queue_items: usize,
    queue_bytes: usize,
    deadline: Duration,
    connect: Duration,
    eject: Duration,
    idle: Duration,
    flow_buffer: usize,
}

impl FlowLimits {
    fn of(cfg: &seedgate_config::RouterConfig) -> Self {
        let hello_max = cfg.limits.client_hello_max;
        // Padded client Initials carry about 1,100 bytes of CRYPTO data each; a few more for
        // acknowledgements and retransmissions.
        let packets = hello_max.div_ceil(1000) + 4;
        Self {
            flows: cfg.limits.udp_flows,
            pending: cfg.limits.max_pending,
            hello_max,
            packets,
            queue_items: packets + 4,
            // Room for every queued datagram at a full-size path MTU.
            queue_bytes: (packets + 4) * 1500,
            deadline: cfg.timeouts.handshake.get(),
            connect: cfg.timeouts.connect.get(),
            eject: cfg.upstream_eject.get(),
            idle: cfg.timeouts.udp_idle.get(),
            flow_buffer: (cfg.limits.udp_socket_buffer / FLOW_BUFFER_DIVISOR).max(FLOW_BUFFER_MIN),
        }
    }
}

/// A serving UDP listener.
pub(crate) struct UdpListener {
    rt: Arc<ListenerRt>,
    sock: Arc<UdpSocket>,
    shared: Arc<Shared>,
    flows: Mutex<Flows>,
    next_id: AtomicU64,
    /// Hashes datagrams from addresses a flow may move to (copies are told apart by it).
    hasher: foldhash::fast::RandomState,
}

/// Bind a listener's UDP socket. Must be called inside a tokio runtime.
pub(crate) fn bind_udp(addr: SocketAddr, buffer: usize, what: &str) -> io::Result<UdpSocket> {
    UdpSocket::from_std(proxy_core::net::bind_udp(addr, buffer, what, "limits.udp_socket_buffer", None)?)
}

/// A socket of one flow, connected to `upstream` (so only its datagrams are received).
fn flow_socket(upstream: SocketAddr, buffer: usize) -> io::Result<UdpSocket> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let s = Socket::new(Domain::for_address(upstream), Type::DGRAM, Some(Protocol::UDP))?;
    proxy_core::net::set_udp_buffers(&s, buffer, "flow upstream", "limits.udp_socket_buffer", Some(&WARNED));
    s.set_nonblocking(true)?;
    let any: IpAddr = if upstream.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
    s.bind(&SocketAddr::new(any, 0).into())?;
    s.connect(&upstream.into())?;
    UdpSocket::from_std(s.into())
}

/// Serve `sock` for listener `rt` until the process is killed, or until the listener stopped
/// (reload, shutdown) and its last flow ended.
pub(crate) fn serve(shared: &Arc<Shared>, rt: Arc<ListenerRt>, sock: UdpSocket) {
    let this = UdpListener::new(shared, rt, sock);
    tracing::info!(listener = %this.rt.name, addr = ?this.sock.local_addr().ok(), "listening (udp)");
    shared.shutdown.tracker.spawn(this.run());
}

impl UdpListener {
    fn new(shared: &Arc<Shared>, rt: Arc<ListenerRt>, sock: UdpSocket) -> Arc<Self> {
        Arc::new(Self {
            rt,
            sock: Arc::new(sock),
            shared: shared.clone(),
            flows: Mutex::new(Flows::default()),
            next_id: AtomicU64::new(0),
            hasher: Default::default(),
        })
    }

    fn drop_datagrams(&self, reason: &str, n: usize) {
        // A reason missing from the list would have no series before its first drop.
        debug_assert!(crate::flow_budget::drop_reasons().contains(&reason), "{reason} is not listed");
        self.shared.metrics.udp.dropped.with_label_values(&[&self.rt.name, reason]).inc_by(n as u64);
    }

    fn flow_result(&self, route: &str, result: &str) {
        debug_assert!(
            [crate::flow_budget::unrouted_results().as_slice(), crate::flow_budget::routed_results()]
                .concat()
                .contains(&result),
            "{result} is not listed"
        );
        self.shared.metrics.udp.flows.with_label_values(&[&self.rt.name, route, result]).inc();
    }

    async fn run(self: Arc<Self>) {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let (stop, kill) = (self.rt.stop.clone(), self.shared.shutdown.kill.clone());
        let mut check = tokio::time::interval(STOPPED_CHECK);
        loop {
            tokio::select! {
                r = self.sock.recv_from(&mut buf) => match r {
                    Ok((n, peer)) => self.on_datagram(buf.get(..n).unwrap_or_default(), peer),
                    // Linux reports ICMP errors for earlier sends here; nothing to do but go on.
                    Err(e) => tracing::debug!(listener = %self.rt.name, error = %e, "udp receive error"),
                },
                _ = check.tick() => {
                    if stop.is_cancelled() && self.lock().map.is_empty() {
                        break;
                    }
                }
                _ = kill.cancelled() => break,
            }
        }
        tracing::info!(listener = %self.rt.name, "udp listener stopped");
    }

    fn lock(&self) -> proxy_core::sync::MutexGuard<'_, Flows> {
        self.flows.lock()
    }

    fn on_datagram(self: &Arc<Self>, data: &[u8], peer: SocketAddr) {
        let mut flows = self.lock();
        match flows.map.get_mut(&peer) {
            Some(Flow::Routed(f)) => {
                let f = f.clone();
                drop(flows);
                f.heard();
                self.to_upstream(&f, data);
            }
            Some(Flow::Pending(p)) => {
                if !p.queue.push(data) {
                    drop(flows);
                    return self.drop_datagrams("queue_full", 1);
                }
                if p.routing {
                    return;
                }
                // The receive loop is the only reader: the reader is always there to take.
                let Some(mut reader) = p.reader.take() else { return };
                let id = p.id;
                drop(flows);
                let status = reader.push(data);
                self.initial_read(peer, id, reader, status);
            }
            None => match flows.by_short_header(data) {
                Some(f) => self.migrate(flows, f, data, peer),
                None => {
                    drop(flows);
                    self.new_flow(data, peer);
                }
            },
        }
    }

    /// A pending flow's reader took a datagram (outside the lock): keep waiting, route, or refuse.
    fn initial_read(
        self: &Arc<Self>,
        peer: SocketAddr,
        id: u64,
        reader: Box<InitialReader>,
        status: Result<Status, proxy_wire::quic_initial::InitialError>,
    ) {
        let mut flows = self.lock();
        // The deadline may have ended the flow meanwhile: then there is nothing to do.
        let p = match flows.map.get_mut(&peer) {
            Some(Flow::Pending(p)) if p.id == id => p,
            _ => return,
        };
        match status {
            Ok(Status::Incomplete) => p.reader = Some(reader),
            Ok(Status::Complete(info)) => {
                p.routing = true;
                drop(flows);
                self.route(peer, id, info.sni);
            }
            Err(e) => {
                let queued = flows.remove_pending(peer, id).map_or(0, |p| p.queue.items.len());
                drop(flows);
                tracing::debug!(listener = %self.rt.name, %peer, error = %e, "udp flow refused");
                self.drop_datagrams(e.reason(), queued);
                self.flow_result("", e.reason());
            }
        }
    }

    /// A datagram from `peer`, unknown so far, addressed to routed flow `f`: maybe the client
    /// moved ([`crate::migration`] decides). It goes to the upstream either way (the upstream
    /// sees no change: it talks to the flow's socket); only a move sends answers to `peer`.
    fn migrate(
        &self,
        mut flows: proxy_core::sync::MutexGuard<'_, Flows>,
        f: Arc<Routed>,
        data: &[u8],
        peer: SocketAddr,
    ) {
        let refused = |why: &str| {
            self.shared.metrics.udp.migrations_refused.with_label_values(&[&self.rt.name, &f.route.name, why]).inc()
        };
        if !f.route.source_allowed(peer.ip()) {
            drop(flows);
            refused("source_not_allowed");
            return self.drop_datagrams("source_not_allowed", 1);
        }
        let now = now_ms();
        let current = f.peer();
        let hash = std::hash::BuildHasher::hash_one(&self.hasher, data);
        let client_last = f.client_last.load(Ordering::Relaxed);
        let verdict = f.candidates.lock().observe(peer, hash, now, current, client_last);
        match verdict {
            Verdict::Stay(why) => {
                drop(flows);
                refused(why);
            }
            Verdict::Move => {
                *f.peer.lock() = peer;
                f.heard();
                if matches!(flows.map.get(&current), Some(Flow::Routed(g)) if g.id == f.id) {
                    flows.map.remove(&current);
                }
                flows.map.insert(peer, Flow::Routed(f.clone()));
                drop(flows);
                tracing::debug!(listener = %self.rt.name, route = %f.route.name, from = %current, to = %peer, "udp flow migrated");
                self.shared.metrics.udp.migrated.with_label_values(&[&self.rt.name, &f.route.name]).inc();
            }
        }
        self.to_upstream(&f, data);
    }

    /// The first datagram of a client address: a flow if it starts a QUIC connection and the
    /// bounds allow one more. Called without the `flows` lock: the Initial is read outside it.
    fn new_flow(self: &Arc<Self>, data: &[u8], peer: SocketAddr) {
        // Cheap checks first: garbage costs no key derivation and no state.
        if let Err(e) = looks_like_initial(data) {
            return self.drop_datagrams(e.reason(), 1);
        }
        if self.rt.stop.is_cancelled() {
            return self.drop_datagrams("stopping", 1);
        }
        let limits = FlowLimits::of(&self.shared.config.load());
        // Only the receive loop adds flows, so the count can only fall before the insert below.
        if self.lock().pending >= limits.pending {
            self.flow_result("", "pending_full");
            return self.drop_datagrams("pending_full", 1);
        }
        let gauge = self.shared.metrics.udp.flows_active.with_label_values(&[&self.rt.name]);
        let Some(slot) = self.shared.udp_flows.try_take(limits.flows, gauge) else {
            self.flow_result("", "flows_full");
            return self.drop_datagrams("flows_full", 1);
        };
        let mut reader = Box::new(InitialReader::new(limits.hello_max, limits.packets));
        let complete = match reader.push(data) {
            Ok(Status::Incomplete) => None,
            Ok(Status::Complete(info)) => Some(info.sni),
            Err(e) => {
                tracing::debug!(listener = %self.rt.name, %peer, error = %e, "udp flow refused");
                self.flow_result("", e.reason());
                return self.drop_datagrams(e.reason(), 1);
            }
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut queue = Queue::new(limits.queue_items, limits.queue_bytes);
        queue.push(data);
        let routing = complete.is_some();
        let mut flows = self.lock();
        flows.map.insert(peer, Flow::Pending(Box::new(Pending { id, reader: Some(reader), queue, routing, slot })));
        flows.pending += 1;
        drop(flows);

        // The whole pre-routing phase has `timeouts.handshake`, as for TCP.
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(limits.deadline).await;
            let gone = this.lock().remove_pending(peer, id);
            if let Some(p) = gone {
                this.flow_result("", "timeout");
                this.drop_datagrams("timeout", p.queue.items.len());
            }
        });
        if let Some(sni) = complete {
            self.route(peer, id, sni);
        }
    }

    fn to_upstream(&self, f: &Routed, data: &[u8]) {
        // Never waits: a full socket buffer drops the datagram, as the network would.
        match f.upstream.try_send(data) {
            Ok(n) => {
                f.touch();
                f.route.meters.to_upstream.inc_by(n as u64);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.drop_datagrams("upstream_busy", 1),
            Err(_) => self.drop_datagrams("upstream_error", 1),
        }
    }

    /// Choose the route and upstream of flow `id` (its ClientHello named `sni`) off the receive
    /// loop, since a host name upstream needs a lookup.
    fn route(self: &Arc<Self>, peer: SocketAddr, id: u64, sni: Option<String>) {
        let this = self.clone();
        tokio::spawn(async move {
            let table = this.rt.table.load_full();
            let route = sni.as_deref().and_then(|s| table.by_sni(s)).or(table.default_route()).cloned();
            let Some(route) = route else {
                tracing::debug!(listener = %this.rt.name, %peer, ?sni, "udp flow for an unknown name");
                return this.refuse(peer, id, "", "unknown_sni");
            };
            if !route.source_allowed(peer.ip()) {
                return this.refuse(peer, id, &route.name, "source_not_allowed");
            }
            let limits = FlowLimits::of(&this.shared.config.load());
            for up in attempt_order(&route.upstreams, route.balance) {
                let opened = match resolve_within(&up.addr, limits.connect).await {
                    Ok(addrs) => addrs
                        .first()
                        .copied()
                        .map(|a| flow_socket(a, limits.flow_buffer))
                        .unwrap_or_else(|| Err(io::Error::new(io::ErrorKind::NotFound, "no address"))),
                    Err(e) => Err(e),
                };
                match opened {
                    Ok(sock) => {
                        // tokio learns that a new socket is writable only from the reactor; until
                        // then every `try_send` answers WouldBlock, and the waiting Initials would
                        // be dropped as `upstream_busy` (the client's handshake then waits for its
                        // retransmission timeout, about a second). Datagrams arriving meanwhile
                        // wait in the pending flow's bounded queue.
                        let _ = tokio::time::timeout(limits.connect, sock.writable()).await;
                        return this.install(peer, id, route.clone(), up.clone(), sock, &limits);
                    }
                    Err(e) => {
                        tracing::debug!(upstream = %up.addr, error = %e, "udp upstream unusable");
                        up.eject(limits.eject);
                    }
                }
            }
            this.refuse(peer, id, &route.name, "upstream_unreachable");
        });
    }

    fn refuse(&self, peer: SocketAddr, id: u64, route: &str, why: &str) {
        let gone = self.lock().remove_pending(peer, id);
        if let Some(p) = gone {
            self.flow_result(route, why);
            self.drop_datagrams(why, p.queue.items.len());
        }
    }

    fn install(
        self: &Arc<Self>,
        peer: SocketAddr,
        id: u64,
        route: Arc<Route>,
        upstream: Arc<Upstream>,
        sock: UdpSocket,
        limits: &FlowLimits,
    ) {
        let mut flows = self.lock();
        // The deadline may have passed while the upstream was looked up.
        let Some(p) = flows.remove_pending(peer, id) else { return };
        let f = Arc::new(Routed {
            id,
            peer: Mutex::new(peer),
            cids: Mutex::new(Vec::new()),
            upstream: Arc::new(sock),
            route,
            last: AtomicU64::new(now_ms()),
            client_last: AtomicU64::new(now_ms()),
            candidates: Mutex::default(),
            balance: Counted::new(upstream),
            _slot: p.slot,
        });
        flows.map.insert(peer, Flow::Routed(f.clone()));
        drop(flows);
        self.flow_result(&f.route.name, "ok");
        for d in &p.queue.items {
            self.to_upstream(&f, d);
        }
        let this = self.clone();
        let idle = limits.idle;
        self.shared.shutdown.tracker.spawn(async move { this.relay_back(f, idle).await });
    }

    /// Upstream to client, and the flow's end: idle for `idle`, or its route retired. A client
    /// silent for a third of `idle` takes the flow out of its upstream's count ([`Counted`]).
    async fn relay_back(self: Arc<Self>, f: Arc<Routed>, idle: Duration) {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        let idle_ms = idle.as_millis() as u64;
        let quiet_ms = idle_ms / 3;
        loop {
            let now = now_ms();
            let since = now.saturating_sub(f.last.load(Ordering::Relaxed));
            if since >= idle_ms {
                break;
            }
            let mut wait = idle_ms - since;
            if f.balance.on() {
                let silent = now.saturating_sub(f.client_last.load(Ordering::Relaxed));
                if silent >= quiet_ms {
                    f.balance.pause();
                } else {
                    wait = wait.min(quiet_ms - silent);
                }
            }
            let wait = Duration::from_millis(wait);
            tokio::select! {
                r = f.upstream.recv(&mut buf) => match r {
                    Ok(n) => {
                        let data = buf.get(..n).unwrap_or_default();
                        // Long headers come only in the handshake: the lock is not taken after it.
                        if let Some(cid) = long_header_scid(data) {
                            self.lock().learn(&f, cid);
                        }
                        match self.sock.send_to(data, f.peer()).await {
                        Ok(sent) => {
                            f.touch();
                            f.route.meters.to_client.inc_by(sent as u64);
                        }
                        Err(_) => self.drop_datagrams("client_error", 1),
                        }
                    }
                    // ICMP unreachable from the upstream: datagrams are lost, the flow goes on.
                    Err(_) => self.drop_datagrams("upstream_error", 1),
                },
                _ = tokio::time::sleep(wait) => {}
                _ = f.route.end.cancelled() => break,
            }
        }
        self.lock().forget(&f);
    }

    /// Flows held by this listener (routed and pending).
    #[cfg(test)]
    fn flow_count(&self) -> usize {
        self.lock().map.len()
    }
}

#[cfg(test)]
mod tests;

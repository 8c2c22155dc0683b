//! A QUIC endpoint of the tunnel: its UDP socket and buffer, the packet sizes it accepts, and the keys that let a replica restarted in place reset its predecessor's sessions.

use crate::tunnel::TunnelSettings;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Largest QUIC packet either end sends, and a server endpoint accepts. Path MTU discovery starts at 1,200 bytes and
/// searches up to this: across Ethernet it settles near 1,450, on jumbo-frame links and loopback
/// it reaches this bound, and fewer, larger packets cost less per byte at both ends (a packet
/// is one decryption, one ACK range and one trip through the UDP stack). Not higher: quinn
/// sends up to 10 packets as one GSO datagram, and 10 × 6,500 stays within the 65,507 bytes an
/// IPv4 UDP datagram can carry; a larger bound makes those sends fail as if the path lost them.
pub const MAX_UDP_PAYLOAD: u16 = 6_500;

/// UDP socket buffer for a tunnel endpoint: room for a burst of the connection window, so the
/// kernel does not drop datagrams before quinn reads them (default buffers of ~200 KiB collapse
/// QUIC throughput under bursts); 1 MiB at least, 8 MiB at most (beyond, the window is flow
/// control's job, not the socket's).
pub fn udp_buffer(s: &TunnelSettings) -> usize {
    (s.connection_window as usize).clamp(1 << 20, 8 << 20)
}

/// A server endpoint: its config, and what makes its stateless resets outlive the process
/// (`None`: keys of this process only).
pub struct Server {
    pub config: quinn::ServerConfig,
    pub stable: Option<StableKeys>,
}

/// Shortest interval between two stateless resets of a server endpoint. quinn's default (20 ms)
/// answers 50 dead connections a second: after a replica restarts in place, a thousand agents'
/// sessions would wait up to 20 s for theirs (or their keepalive timeout). A reset is always
/// smaller than the packet that caused it, so a short interval amplifies nothing.
const MIN_RESET_INTERVAL: std::time::Duration = std::time::Duration::from_millis(1);

/// The keys behind a server endpoint's connection IDs and stateless resets, derived from a
/// secret that outlives the process (e.g. the listener's private key) and the replica's id. A
/// replica restarted in place derives the same keys, so it recognises the connection IDs of its
/// killed predecessor's sessions and answers their packets with a reset their peers accept: they
/// end at once, as a TCP reset ends an h2 session, rather than at their keepalive timeout.
/// Another replica's keys differ: a packet that reaches the wrong replica is dropped, not reset.
pub struct StableKeys([u8; 32]);

impl StableKeys {
    pub fn derive(secret: &[u8], id: &str) -> Self {
        use aws_lc_rs::hmac;
        let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let tag = hmac::sign(&key, format!("seedgate QUIC endpoint keys\0{id}").as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        Self(out)
    }

    fn endpoint_config(&self) -> quinn::EndpointConfig {
        use aws_lc_rs::hmac;
        let reset = hmac::Key::new(hmac::HMAC_SHA256, &self.0);
        let cid_tag = hmac::sign(&reset, b"connection ids");
        let mut cid_key = [0u8; 8];
        cid_key.copy_from_slice(&cid_tag.as_ref()[..8]);
        let cid_key = u64::from_le_bytes(cid_key);
        let mut c = quinn::EndpointConfig::new(Arc::new(reset));
        c.cid_generator(move || Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key)));
        c
    }
}

/// A quinn endpoint on a UDP socket bound to `addr` with [`udp_buffer`] bytes of buffer (a
/// warning names `key` if the kernel caps it); a server endpoint when `server` is given.
///
/// quinn reads up to 32 datagrams at once, each into room for as many packets as the socket may
/// coalesce (64 with UDP GRO) of the largest size the endpoint accepts. With GRO, an endpoint
/// accepts packets up to [`MAX_UDP_PAYLOAD`]: that room is 13 MiB of address space, but a read
/// brings at most 64 KiB, so what bursts touch (and stays resident) is at most 2 MiB, as with
/// Ethernet-sized packets. With `settings.receive_offload` off, GRO is turned off on the socket,
/// the agent accepts quinn's 1,472-byte packets and the buffer is 47 KiB, all of it touched;
/// receiving then costs more per packet (less than half the bulk throughput into that endpoint
/// on loopback).
pub fn endpoint(
    addr: std::net::SocketAddr,
    settings: &TunnelSettings,
    server: Option<Server>,
    what: &str,
    key: &str,
) -> io::Result<quinn::Endpoint> {
    // Once per process: an agent opens an endpoint per session, and the cap does not change.
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let sock = crate::net::bind_udp(addr, udp_buffer(settings), what, key, Some(&WARNED))?;
    let (mut config, server) = match server {
        None => (quinn::EndpointConfig::default(), None),
        Some(s) => {
            let mut c = s.stable.map(|k| k.endpoint_config()).unwrap_or_default();
            c.min_reset_interval(MIN_RESET_INTERVAL);
            (c, Some(s.config))
        }
    };
    // What the endpoint accepts is what its peer may send: large packets cut the receiver's
    // per-packet work (decryption, ACK ranges, quinn's bookkeeping) several times over; the seed
    // to agent direction moved 1.6x the bytes per CPU second with them. A server endpoint (one
    // per listener) always accepts them. An agent (an endpoint per session) does when GRO is on:
    // its reads are then capped at 64 KiB by the kernel whatever the packet size, so only
    // untouched address space grows. Without GRO its room is a packet per read and it keeps
    // quinn's 1,472. The bound is within quinn's accepted range (1,200 to 65,527).
    if server.is_some() || settings.receive_offload {
        let _ = config.max_udp_payload_size(MAX_UDP_PAYLOAD);
    }
    let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
    let gro_off = if settings.receive_offload { None } else { Some(sock.try_clone()?) };
    // quinn turns GRO on as it wraps the socket, so it is turned off afterwards.
    let socket = runtime.wrap_udp_socket(sock)?;
    let socket: Arc<dyn quinn::AsyncUdpSocket> = match gro_off {
        None => socket,
        Some(fd) => {
            use std::os::fd::AsFd;
            crate::net::sockopt::set_udp_gro(fd.as_fd(), false)?;
            Arc::new(OnePacketReads(socket))
        }
    };
    quinn::Endpoint::new_with_abstract_socket(config, server, socket, runtime)
}

/// A UDP socket whose reads bring one packet each (GRO turned off on it), so that quinn sizes its
/// receive buffer for that.
#[derive(Debug)]
struct OnePacketReads(Arc<dyn quinn::AsyncUdpSocket>);

impl quinn::AsyncUdpSocket for OnePacketReads {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn quinn::UdpPoller>> {
        self.0.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &quinn::udp::Transmit<'_>) -> io::Result<()> {
        self.0.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [io::IoSliceMut<'_>],
        meta: &mut [quinn::udp::RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.0.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.0.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.0.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        1
    }

    fn may_fragment(&self) -> bool {
        self.0.may_fragment()
    }
}

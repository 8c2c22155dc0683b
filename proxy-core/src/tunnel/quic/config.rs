//! quinn's transport settings from the tunnel's: stream and connection windows, the send window that follows the congestion window, keepalive, packet sizes, the congestion controller.

use super::congestion::{CongestionStats, LossTolerantConfig};
use super::endpoint::MAX_UDP_PAYLOAD;
use crate::tunnel::TunnelSettings;
use quinn::VarInt;
use std::sync::Arc;

/// Streams the seed may have open on an agent's session at first. The agent doubles the
/// allowance (up to `max_streams`) whenever half of it is in use: quinn allocates the state of
/// every stream it allows the peer to open at the moment it allows it, about 280 bytes each, so
/// allowing all 16,384 from the start cost 4.4 MiB per session before any stream was opened.
pub(super) const FIRST_STREAM_ALLOWANCE: u32 = 256;

/// The seed's quinn transport settings. The seed opens every stream of a session (the control
/// stream first), so the agent may open none. `stats`: where `loss_tolerant` controllers count
/// what they do.
pub fn seed_transport_config(s: &TunnelSettings, stats: Option<&CongestionStats>) -> quinn::TransportConfig {
    let mut t = transport_config(s, stats);
    t.max_concurrent_bidi_streams(VarInt::from_u32(0));
    t
}

/// The agent's quinn transport settings: the seed may open [`FIRST_STREAM_ALLOWANCE`] streams
/// at first (the session raises it as they fill).
pub fn agent_transport_config(s: &TunnelSettings, stats: Option<&CongestionStats>) -> quinn::TransportConfig {
    let mut t = transport_config(s, stats);
    t.max_concurrent_bidi_streams(VarInt::from_u32(s.max_streams.min(FIRST_STREAM_ALLOWANCE)));
    t
}

/// Every stream's window: quinn's windows are fixed for a connection's life, so every stream gets
/// the window a fast, long path needs, `max_stream_window` within [`STREAM_SHARES`] of the
/// connection window (16 MiB with the defaults: 300 Mbit/s at 300 ms), never below the
/// configured stream window. A receiver holds only what arrives unread; what a sender holds is
/// bounded for the whole connection by [`send_window`], which follows the path.
fn stream_window(s: &TunnelSettings) -> u32 {
    s.max_stream_window.min(s.connection_window / STREAM_SHARES).max(s.stream_window_quic)
}

/// A QUIC stream's window is at most this share of the connection window (16 MiB by default:
/// 300 Mbit/s at 300 ms). Its window is also what one stream may put in flight, and slow start
/// doubles what is in flight per round trip until a round trip shows the queue, a round trip
/// late: across 300 ms at 100 Mbit/s and 150 ms at 300 Mbit/s (a 50 ms bottleneck queue) it
/// puts twice the path in flight. `loss_tolerant` cuts the loss that ends it to what the path
/// carried in the last round trip, so the overshoot costs one round trip's retransmissions.
/// Four readers that stop reading with full windows are needed to stall a session.
const STREAM_SHARES: u32 = 4;

/// The least a connection's send window is: what a stream's start needs before the congestion
/// window says more (a path's first round trips), and what sixty-four streams answering an open
/// need beside bulk ones.
pub const SEND_WINDOW_FLOOR: u64 = 4 << 20;

/// How many congestion windows a connection's send window holds: one in flight, one held behind
/// a loss until its retransmission is acknowledged (quinn frees a stream's bytes only up to its
/// first hole), and one ready to go out.
const SEND_WINDOW_CWNDS: u64 = 3;

/// The bytes a connection may hold unacknowledged (all its streams together), for a congestion
/// window of `cwnd`: what keeps the path busy through a loss, within [`SEND_WINDOW_FLOOR`] and
/// the configured connection window `cap`. quinn lets a stream buffer up to the window its
/// peer granted, out of this send window shared first come, first served; a fixed send window
/// as large as the stream windows would let one bulk stream hold 16 MiB of a 2 MB path.
pub fn send_window(cwnd: u64, cap: u64) -> u64 {
    cwnd.saturating_mul(SEND_WINDOW_CWNDS).max(SEND_WINDOW_FLOOR).min(cap)
}

/// quinn transport settings from the tunnel's: flow-control windows, keepalive, packet size.
fn transport_config(s: &TunnelSettings, stats: Option<&CongestionStats>) -> quinn::TransportConfig {
    let mut t = quinn::TransportConfig::default();
    t.stream_receive_window(VarInt::from_u32(stream_window(s)));
    t.receive_window(VarInt::from_u32(s.connection_window));
    t.send_window(send_window(0, u64::from(s.connection_window)));
    t.max_concurrent_uni_streams(VarInt::from_u32(0));
    t.keep_alive_interval(Some(s.ping_every()));
    // A quiet path is probed at least as often as a live one is pinged: backed off without bound,
    // the next probe after an outage of some seconds is seconds away, and an open stream waits
    // that long after the path came back.
    t.max_probe_timeout(Some(s.ping_every()));
    // Neither end reads datagrams: the only ones sent are the probes of a quiet path
    // ([`watch_quiet`]), one byte each; a small window bounds what waits unread.
    t.datagram_receive_buffer_size(Some(PROBE_WINDOW));
    t.max_idle_timeout(quinn::IdleTimeout::try_from(s.keepalive_timeout).ok());
    let mut mtu = quinn::MtuDiscoveryConfig::default();
    mtu.upper_bound(MAX_UDP_PAYLOAD);
    t.mtu_discovery_config(Some(mtu));
    t.congestion_controller_factory(congestion_controller(s.congestion, stats));
    t
}

/// The controller for the configured one: quinn's, each with quinn's defaults, or ours.
fn congestion_controller(
    cc: seedgate_config::CongestionControl,
    stats: Option<&CongestionStats>,
) -> Arc<dyn quinn::congestion::ControllerFactory + Send + Sync> {
    use quinn::congestion::{BbrConfig, CubicConfig, NewRenoConfig};
    use seedgate_config::CongestionControl::*;
    match cc {
        Bbr => Arc::new(BbrConfig::default()),
        Cubic => Arc::new(CubicConfig::default()),
        NewReno => Arc::new(NewRenoConfig::default()),
        LossTolerant => Arc::new(match stats {
            Some(stats) => LossTolerantConfig::counted(stats.clone()),
            None => LossTolerantConfig::default(),
        }),
    }
}

/// What a connection keeps of the datagrams it receives (they are never read): a few probes.
const PROBE_WINDOW: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stream_window_is_max_stream_window_within_a_quarter_of_the_connection_window() {
        const MIB: u32 = 1024 * 1024;
        let d = TunnelSettings::default();
        assert_eq!((d.connection_window, d.max_stream_window), (64 * MIB, 16 * MIB));
        assert_eq!(stream_window(&d), 16 * MIB, "max_stream_window, a quarter of 64 MiB");
        let short = TunnelSettings { connection_window: 32 * MIB, ..TunnelSettings::default() };
        assert_eq!(stream_window(&short), 8 * MIB, "a quarter of the connection window");
        let big = TunnelSettings { connection_window: 2047 * MIB, ..TunnelSettings::default() };
        assert_eq!(stream_window(&big), 16 * MIB, "max_stream_window caps it");
        let small = TunnelSettings { connection_window: 2 * MIB, ..TunnelSettings::default() };
        assert_eq!(stream_window(&small), d.stream_window_quic, "never below the configured window");
    }

    #[test]
    fn the_send_window_holds_three_congestion_windows_within_the_floor_and_the_connection_window() {
        const MIB: u64 = 1024 * 1024;
        assert_eq!(send_window(0, 64 * MIB), SEND_WINDOW_FLOOR, "before the path is known");
        assert_eq!(send_window(MIB, 64 * MIB), SEND_WINDOW_FLOOR, "a short path");
        assert_eq!(send_window(2 * MIB, 64 * MIB), 6 * MIB, "150 ms at 100 Mbit/s");
        assert_eq!(send_window(12 * MIB, 64 * MIB), 36 * MIB, "300 ms at 300 Mbit/s");
        assert_eq!(send_window(40 * MIB, 64 * MIB), 64 * MIB, "the connection window caps it");
        assert_eq!(send_window(u64::MAX, 64 * MIB), 64 * MIB, "no overflow");
        assert_eq!(send_window(0, 2 * MIB), 2 * MIB, "a connection window below the floor");
    }
}

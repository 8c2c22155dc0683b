//! The tunnel session's settings, the same keys at both ends (the agent's `tunnel`, proxy-server's `agents`): declared, defaulted and validated once.

use crate::common::{Dur, default_fn};
use crate::error::Problems;
use serde::{Deserialize, Serialize};

/// A tunnel stream's flow-control window when `stream_window` is not given, over HTTP/2. h2
/// re-opens a stream's window once about a third of it was read. On loopback 512 KiB moved one
/// stream 8-15 % faster than 256 KiB (half the window updates), and 768 KiB or 1 MiB slower
/// (more bytes in flight per stream than the caches hold).
pub const STREAM_WINDOW_H2: u32 = 512 * 1024;
/// The same over QUIC. quinn re-opens a stream's window each time its reader has taken an
/// eighth of it: at 256 KiB that is a window update (a packet each way) per 32 KiB, and one
/// QUIC stream moved a fifth less than at 1 MiB (an update per 128 KiB).
pub const STREAM_WINDOW_QUIC: u32 = 1024 * 1024;

/// The most a tunnel stream's window grows to when `max_stream_window` is not given: 16 MiB
/// carries one stream at 100 Mbit/s across a round trip of over a second, and at 400 Mbit/s
/// across 300 ms.
pub const MAX_STREAM_WINDOW: u32 = 16 * 1024 * 1024;

/// The largest flow-control window HTTP/2 and QUIC can express (2^31 - 1).
const MAX_WINDOW: u32 = (1 << 31) - 1;
/// The smallest window a session may give: HTTP/2's initial window.
const MIN_WINDOW: u32 = 65_535;

default_fn! {
    connection_window_default: u32 = 64 * 1024 * 1024;
    max_stream_window_default: u32 = MAX_STREAM_WINDOW;
    tcp_notsent_lowat_default: u32 = 128 * 1024;
    tcp_inflight_bound_default: bool = true;
    h2_adaptive_window_default: bool = true;
    ka_interval_default: Dur = Dur::secs(5);
    ka_timeout_default: Dur = Dur::secs(60);
    ka_suspect_default: Dur = Dur::secs(3);
}

/// Tunnel keepalive, the same on both ends: a session whose PING goes unanswered for a few
/// seconds is suspect (no new streams; the agent opens a replacement beside it), and dead only
/// after the longer timeout (its open streams wait for the path until then, as TCP would).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("x-reload" = "new sessions"))]
pub struct Keepalive {
    /// PING every this long, and at least three times per `suspect_after` (so a few seconds of
    /// silence are noticed). A quiet path is probed at least that often too (the retransmission
    /// back-off stops there: over QUIC always, over HTTP/2 on Linux 6.15 and later, and not below
    /// the kernel's 1 s), so a session resumes within about that long of the path's return. The
    /// agent re-resolves its servers' names this often. Default `5s`.
    #[serde(default = "ka_interval_default")]
    pub interval: Dur,
    /// No PING answer for this long: the session is dead (its streams end; an agent
    /// reconnects). Sized like TCP's own patience with a silent path, so that an outage of
    /// tens of seconds costs no open stream; the socket's limits follow it (`TCP_USER_TIMEOUT`
    /// over h2, the idle timeout over QUIC). Default `60s`.
    #[serde(default = "ka_timeout_default")]
    pub timeout: Dur,
    /// No PING answer for this long (QUIC: nothing heard while a PING or data waits for its
    /// acknowledgement): the session is suspect. It takes no new streams (a dial goes to another
    /// session, or is refused with `no_agent` and the reason), the agent dials a replacement
    /// beside it, and its open streams go on waiting for the path; any sign of life clears it.
    /// At most `timeout` (a shorter `timeout` lowers it; equal to it, a session is never suspect
    /// before it is dead). Default `3s`.
    #[serde(default = "ka_suspect_default")]
    pub suspect_after: Dur,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self { interval: ka_interval_default(), timeout: ka_timeout_default(), suspect_after: ka_suspect_default() }
    }
}

/// A section struct (its reloads: new sessions) with the session keys written in where
/// `..SessionSettings,` stands, and `session()`, which hands them out as a [`SessionSettings`].
/// serde's `flatten` does not combine with `deny_unknown_fields` (nor with the positions the
/// value types record while a file is read), so the keys are declared here once, with their
/// docs and defaults, and written into each end's section: the agent's `tunnel`, proxy-server's
/// `agents`, and [`SessionSettings`] itself.
macro_rules! with_session_settings {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[$before_meta:meta])* pub $before:ident: $before_ty:ty,)*
            ..SessionSettings,
            $($(#[$after_meta:meta])* pub $after:ident: $after_ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[$before_meta])* pub $before: $before_ty,)*
            /// PING interval, and when an unanswered PING makes a session suspect and dead; absent or
            /// `null`: the defaults.
            #[serde(default, deserialize_with = "crate::common::null_is_default")]
            #[schemars(with = "Option<crate::session::Keepalive>")]
            pub keepalive: $crate::session::Keepalive,
            /// Bytes one stream may have in flight unread at first (per-stream flow-control window).
            /// Default: `524288` over HTTP/2 (grown up to `max_stream_window` on a path that needs more
            /// unless `h2_adaptive_window` is off); `1048576` over QUIC, where every stream gets more when
            /// `max_stream_window` and `connection_window` allow (quinn re-opens a stream's window in
            /// smaller steps). At most `connection_window`.
            #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "crate::size::de_opt")]
            #[schemars(schema_with = "crate::schema::size_or_null::<65535, 2147483647>")]
            pub stream_window: Option<u32>,
            /// Bytes all streams of one session may have in flight unread; at least `stream_window`.
            /// Default `67108864`.
            #[serde(default = "crate::session::connection_window_default", deserialize_with = "crate::size::de")]
            #[schemars(schema_with = "crate::schema::size::<65535, 2147483647>")]
            pub connection_window: u32,
            /// The most one stream's window grows to on a path that needs it (a long round trip at a
            /// high rate). Over HTTP/2 with `h2_adaptive_window` each session estimates its path's
            /// bandwidth-delay product from its PINGs and raises every stream's window to twice that,
            /// from `stream_window` up to this, within a quarter of `connection_window` (four stalled
            /// readers are needed to stall a session). Over QUIC every stream gets this window within a
            /// quarter of `connection_window` (16 MiB by default: 300 Mbit/s at 300 ms); a receiver holds
            /// bytes only as they arrive unread, and what a sender holds of all its streams together
            /// follows the path (three congestion windows, at least 4 MiB, at most `connection_window`),
            /// which bulk streams take in turn.
            /// `stream_window` or less: no growth. Default `16777216`.
            #[serde(default = "crate::session::max_stream_window_default", deserialize_with = "crate::size::de")]
            #[schemars(schema_with = "crate::schema::size::<65535, 2147483647>")]
            pub max_stream_window: u32,
            /// HTTP/2 sessions grow their stream windows with the path, up to `max_stream_window`: each
            /// end estimates the bandwidth-delay product of what it receives from its PINGs. One stream
            /// then moves at the link's rate across a long round trip (at 150 ms and 100 Mbit/s: 95
            /// Mbit/s instead of 20). The megabytes in flight this allows share the session's one TCP
            /// connection with every other stream; `tcp_inflight_bound` keeps them from overflowing the
            /// path's bottleneck queue, so a round trip behind a bulk stream stays near the path's. Paths
            /// under a millisecond never grow. Default `true`.
            #[serde(default = "crate::session::h2_adaptive_window_default")]
            pub h2_adaptive_window: bool,
            /// HTTP/2 sessions: the most bytes the kernel may hold unsent on the session's TCP socket
            /// (`TCP_NOTSENT_LOWAT`); `0`: no limit beyond the socket's buffer. What the session has
            /// not yet handed to the kernel it schedules itself, so a stream that sends little (a
            /// keystroke, a request) waits behind at most this much of bulk streams' bytes, not behind
            /// megabytes of socket buffer. Not set on a path whose TCP handshake took under a
            /// millisecond (loopback, one host or zone), where the kernel sends what it holds at once
            /// and the limit would only cost wake-ups. Default `131072`.
            #[serde(default = "crate::session::tcp_notsent_lowat_default", deserialize_with = "crate::size::de")]
            #[schemars(schema_with = "crate::schema::size::<0, 4294967295>")]
            pub tcp_notsent_lowat: u32,
            /// HTTP/2 sessions: bound the bytes the session's TCP socket holds unacknowledged to what the
            /// path carries plus a short queue (an eighth of the path's minimum round trip, 2-10 ms),
            /// following the socket's smoothed round trip against its minimum. The kernel's congestion
            /// control fills the path's bottleneck queue and overflows it; inside one TCP connection a
            /// lost packet stalls every stream of the session behind its retransmission, and the queue
            /// delays every stream by its length. Where the socket's congestion control is BBR, a
            /// bounded session also starts it afresh every 5 s of sending: the bound keeps the queue
            /// short already, and BBR's ProbeRTT (four packets for 200 ms and a round trip, every 10 s)
            /// would stall every stream of the session. A path under a millisecond (loopback, a LAN)
            /// never gets a bound. Off: the kernel alone decides (choose it where the session shares a
            /// bottleneck with loss-based bulk traffic that keeps the queue full: the bound would yield
            /// to it). Default `true`.
            #[serde(default = "crate::session::tcp_inflight_bound_default")]
            pub tcp_inflight_bound: bool,
            $($(#[$after_meta])* pub $after: $after_ty,)*
        }

        impl $name {
            /// The tunnel session's settings this section gives.
            pub fn session(&self) -> $crate::session::SessionSettings {
                $crate::session::SessionSettings {
                    keepalive: self.keepalive,
                    stream_window: self.stream_window,
                    connection_window: self.connection_window,
                    max_stream_window: self.max_stream_window,
                    h2_adaptive_window: self.h2_adaptive_window,
                    tcp_notsent_lowat: self.tcp_notsent_lowat,
                    tcp_inflight_bound: self.tcp_inflight_bound,
                }
            }
        }
    };
}
pub(crate) use with_session_settings;

with_session_settings! {
    /// The tunnel session's settings of one end, as its section (the agent's `tunnel`,
    /// proxy-server's `agents`) gives them: the keepalive, the flow-control windows and the
    /// session socket's limits. Each end turns them into its sessions' tuning.
    #[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[schemars(extend("x-reload" = "new sessions"))]
    pub struct SessionSettings {
        ..SessionSettings,
    }
}

impl Default for SessionSettings {
    fn default() -> Self {
        Self {
            keepalive: Keepalive::default(),
            stream_window: None,
            connection_window: connection_window_default(),
            max_stream_window: max_stream_window_default(),
            h2_adaptive_window: h2_adaptive_window_default(),
            tcp_notsent_lowat: tcp_notsent_lowat_default(),
            tcp_inflight_bound: tcp_inflight_bound_default(),
        }
    }
}

impl SessionSettings {
    /// The per-stream windows in effect, `(HTTP/2, QUIC)`: `stream_window` when given (for both
    /// transports), else each transport's default, never above `connection_window`.
    pub fn stream_windows(&self) -> (u32, u32) {
        match self.stream_window {
            Some(w) => (w, w),
            None => (STREAM_WINDOW_H2.min(self.connection_window), STREAM_WINDOW_QUIC.min(self.connection_window)),
        }
    }
}

/// What a window outside HTTP/2's and QUIC's range is told.
const WINDOW_RANGE: &str = "must be between 65535 and 2147483647 bytes (64Ki - 1 and 2Gi - 1)";

/// The session settings' rules, as problems of the keys under `section` (`tunnel`, `agents`).
pub(crate) fn validate(s: &SessionSettings, section: &str, p: &mut Problems) {
    let ka = &s.keepalive;
    for (key, d) in [("interval", ka.interval), ("timeout", ka.timeout), ("suspect_after", ka.suspect_after)] {
        if d.get().is_zero() {
            p.push(format!("{section}.keepalive.{key}"), "must be positive");
        }
    }
    if let Some(w) = s.stream_window
        && !(MIN_WINDOW..=MAX_WINDOW).contains(&w)
    {
        p.push(format!("{section}.stream_window"), WINDOW_RANGE);
    }
    if s.connection_window < s.stream_window.unwrap_or(MIN_WINDOW) || s.connection_window > MAX_WINDOW {
        p.push(
            format!("{section}.connection_window"),
            "must be at least stream_window and at most 2147483647 bytes (2Gi - 1)",
        );
    }
    if !(MIN_WINDOW..=MAX_WINDOW).contains(&s.max_stream_window) {
        p.push(format!("{section}.max_stream_window"), WINDOW_RANGE);
    }
}

#[cfg(test)]
mod tests;

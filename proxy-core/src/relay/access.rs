//! The access event every relay ends with: one record of the bytes each way, named the same whatever the hop.
//!
//! A relay has two ends: the **client** (the side that came to us: a TLS client, kube-apiserver,
//! or, on the agent, the seed's tunnel stream) and the **upstream** (the side we went to: a
//! backend, the tunnel, the dialled target). Every access event names the two counts
//! `bytes_to_upstream` (what the client sent, passed on) and `bytes_to_client` (the other way),
//! then `duration_ms` and `reason`, after the fields of its own hop; [`access_event!`](crate::access_event!) writes
//! them, so no binary names them differently.

#[doc(hidden)]
pub use tracing as __tracing;

/// The bytes a relay moved each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bytes {
    /// From the client towards the upstream.
    pub to_upstream: u64,
    /// From the upstream towards the client.
    pub to_client: u64,
}

impl Bytes {
    pub fn new(to_upstream: u64, to_client: u64) -> Self {
        Self { to_upstream, to_client }
    }
}

impl std::ops::AddAssign for Bytes {
    fn add_assign(&mut self, other: Bytes) {
        self.to_upstream += other.to_upstream;
        self.to_client += other.to_client;
    }
}

/// Log the `access` event (at `info`) that ends a relayed connection or stream:
/// `access_event!("message", bytes, started, reason; hop fields...)` logs the hop's fields
/// (as `tracing` takes them, without a trailing comma), then `bytes_to_upstream`,
/// `bytes_to_client` (from [`Bytes`]), `duration_ms` (since the `Instant` `started`) and
/// `reason` (a `&str`).
#[macro_export]
macro_rules! access_event {
    ($message:literal, $bytes:expr, $started:expr, $reason:expr; $($field:tt)+) => {{
        let bytes: $crate::relay::access::Bytes = $bytes;
        let reason: &str = $reason;
        $crate::relay::access::__tracing::info!(
            target: "access",
            $($field)+,
            bytes_to_upstream = bytes.to_upstream,
            bytes_to_client = bytes.to_client,
            duration_ms = $started.elapsed().as_secs_f64() * 1000.0,
            reason,
            $message
        )
    }};
}

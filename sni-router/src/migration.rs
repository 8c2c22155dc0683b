//! When a UDP flow follows its client to a new address: the rule, as bookkeeping without I/O or clock.
//!
//! QUIC lets a client's address change under a connection (NAT rebinding, a node whose address
//! changed). The endpoint would validate the new path itself, but the router relays every flow
//! from one socket of its own, so the upstream never sees the change and cannot. A datagram
//! addressed to a flow's connection ID proves nothing about its sender: anyone on the path can
//! copy one. So the router moves a flow's return path only in the case the feature exists for,
//! and never while the client still sends from the address it has:
//!
//! - the flow's address has sent nothing for [`QUIET_MS`] milliseconds (a NAT that lost its mapping; a live
//!   client sends acknowledgements and keepalives far more often), and
//! - the new address has sent at least [`MIN_PACKETS`] datagrams addressed to the flow since the
//!   flow's address last sent.
//!
//! A datagram that repeats one seen from another waiting address in the last few is not counted
//! (an observer copying the client's packets does not count twice), and at most
//! [`MAX_CANDIDATES`] addresses are counted at once. The clock starts again with every move (the
//! new address is the flow's), so a flow moves at most once per [`QUIET_MS`] milliseconds; the one exception is
//! the address the flow last moved away from, which takes the flow back at its first fresh
//! datagram (once), so a move an attacker caused while the client was idle lasts only until the
//! client speaks again. Datagrams from an address waiting to be followed are still relayed to the
//! upstream (a rebinding client's data goes on flowing; QUIC drops forged or replayed packets),
//! but nothing is sent to that address before the flow moves there.

use std::net::SocketAddr;

/// How long (ms) a flow's client address must have been silent before another may take its place.
pub(crate) const QUIET_MS: u64 = 1_000;
/// Datagrams a new address must have sent (since the flow's address last did) to be followed.
pub(crate) const MIN_PACKETS: u32 = 3;
/// New addresses counted per flow at once; more are not followed until the count starts again.
pub(crate) const MAX_CANDIDATES: usize = 4;
/// Datagrams from waiting addresses remembered (by hash) to tell a copy from a fresh one.
const RECENT: usize = 16;

/// What to do with a datagram for a flow from an address that is not the flow's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Follow the client to the new address.
    Move,
    /// Not now; the reason, as the metric label says it.
    Stay(&'static str),
}

/// Addresses that sent a flow's datagrams since its client's address last did.
#[derive(Debug, Default)]
pub(crate) struct Candidates {
    /// When the flow's address last sent, as of the counts below (they count from there).
    since_ms: u64,
    seen: Vec<(SocketAddr, u32)>,
    /// Hashes of the last datagrams from waiting addresses (a ring).
    recent: [u64; RECENT],
    next: usize,
    /// The address the flow last moved away from.
    previous: Option<SocketAddr>,
}

impl Candidates {
    /// A datagram for the flow from `from` at `now_ms`, whose content hashes to `hash`; the
    /// flow's own address (`current`) last sent at `client_last_ms`. On [`Verdict::Move`] the
    /// caller moves the flow to `from` and counts its last datagram from now.
    pub(crate) fn observe(
        &mut self,
        from: SocketAddr,
        hash: u64,
        now_ms: u64,
        current: SocketAddr,
        client_last_ms: u64,
    ) -> Verdict {
        if self.recent.contains(&hash) {
            return Verdict::Stay("duplicate");
        }
        self.recent[self.next] = hash;
        self.next = (self.next + 1) % RECENT;
        if self.previous == Some(from) {
            // Once: the address it comes back from is not another way back.
            self.seen.clear();
            self.previous = None;
            return Verdict::Move;
        }
        if self.since_ms != client_last_ms {
            // The flow's address sent since the counts began: they start over from there.
            self.seen.clear();
            self.since_ms = client_last_ms;
        }
        let packets = match self.seen.iter().position(|(a, _)| *a == from) {
            Some(i) => {
                let n = &mut self.seen[i].1;
                *n = n.saturating_add(1);
                *n
            }
            None if self.seen.len() >= MAX_CANDIDATES => return Verdict::Stay("too_many_addresses"),
            None => {
                self.seen.push((from, 1));
                1
            }
        };
        if now_ms.saturating_sub(client_last_ms) < QUIET_MS {
            return Verdict::Stay("client_active");
        }
        if packets < MIN_PACKETS {
            return Verdict::Stay("too_few_packets");
        }
        self.moved(current)
    }

    fn moved(&mut self, from: SocketAddr) -> Verdict {
        self.seen.clear();
        self.previous = Some(from);
        Verdict::Move
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("addr")
    }

    /// A flow at `client`, and a source of distinct datagram hashes.
    struct Flow {
        c: Candidates,
        client: SocketAddr,
        n: u64,
    }

    impl Flow {
        fn new() -> Self {
            Self { c: Candidates::default(), client: addr("203.0.113.1:40000"), n: 0 }
        }

        /// A fresh datagram from `from` at `now`, the client having last sent at `last`.
        fn fresh(&mut self, from: SocketAddr, now: u64, last: u64) -> Verdict {
            self.n += 1;
            self.c.observe(from, self.n, now, self.client, last)
        }
    }

    #[test]
    fn a_spoofer_cannot_move_a_flow_whose_client_keeps_sending() {
        let mut f = Flow::new();
        let spoofer = addr("192.0.2.66:4433");
        // The client sends every 100 ms; the spoofer sends a datagram after each.
        for t in (0..10_000).step_by(100) {
            assert_eq!(f.fresh(spoofer, t + 50, t), Verdict::Stay("client_active"), "at {t} ms");
        }
        // Many datagrams at once between two of the client's do not either.
        for _ in 0..1_000 {
            assert_eq!(f.fresh(spoofer, 10_050, 10_000), Verdict::Stay("client_active"));
        }
    }

    /// The NAT-rebinding case, on a virtual clock: the old address stops at 0 ms; the client
    /// goes on from a new one every 100 ms. The flow follows at the first datagram that finds
    /// the old address quiet for [`QUIET_MS`] milliseconds and the new one with [`MIN_PACKETS`].
    #[test]
    fn a_rebinding_client_is_followed_once_its_old_address_is_quiet() {
        let mut f = Flow::new();
        let new = addr("198.51.100.7:50000");
        let mut moved_at = None;
        for t in (100..5_000).step_by(100) {
            match f.fresh(new, t, 0) {
                Verdict::Move => {
                    moved_at = Some(t);
                    break;
                }
                Verdict::Stay(why) => assert_eq!(why, "client_active", "at {t} ms"),
            }
        }
        assert_eq!(moved_at, Some(QUIET_MS), "followed as soon as the old address was quiet for QUIET");

        // A client that sends seldom (a keepalive, then its retransmissions): quiet already, so
        // the packets decide.
        let mut f = Flow::new();
        assert_eq!(f.fresh(new, 20_000, 0), Verdict::Stay("too_few_packets"));
        assert_eq!(f.fresh(new, 20_200, 0), Verdict::Stay("too_few_packets"));
        assert_eq!(f.fresh(new, 20_600, 0), Verdict::Move);
    }

    #[test]
    fn the_counts_start_over_whenever_the_client_sends() {
        let mut f = Flow::new();
        let other = addr("192.0.2.66:4433");
        assert_eq!(f.fresh(other, 5_000, 0), Verdict::Stay("too_few_packets"));
        assert_eq!(f.fresh(other, 5_001, 0), Verdict::Stay("too_few_packets"));
        // The client speaks at 5,002 ms: the two datagrams before no longer count.
        assert_eq!(f.fresh(other, 7_000, 5_002), Verdict::Stay("too_few_packets"));
        assert_eq!(f.fresh(other, 7_001, 5_002), Verdict::Stay("too_few_packets"));
        assert_eq!(f.fresh(other, 7_002, 5_002), Verdict::Move);
    }

    #[test]
    fn copies_do_not_count() {
        let mut f = Flow::new();
        let (new, copier) = (addr("198.51.100.7:50000"), addr("192.0.2.66:4433"));
        for h in 1..=2 {
            assert_eq!(f.c.observe(new, h, 5_000, f.client, 0), Verdict::Stay("too_few_packets"));
            assert_eq!(f.c.observe(copier, h, 5_000, f.client, 0), Verdict::Stay("duplicate"));
        }
        assert_eq!(f.c.observe(copier, 2, 5_000, f.client, 0), Verdict::Stay("duplicate"));
        assert_eq!(f.c.observe(new, 3, 5_000, f.client, 0), Verdict::Move, "the sender of fresh datagrams");
    }

    #[test]
    fn addresses_counted_per_flow_are_bounded() {
        let mut f = Flow::new();
        for port in 0..MAX_CANDIDATES as u16 {
            f.fresh(SocketAddr::from(([192, 0, 2, 1], port)), 5_000, 0);
        }
        let late = SocketAddr::from(([192, 0, 2, 1], 999));
        assert_eq!(f.fresh(late, 5_000, 0), Verdict::Stay("too_many_addresses"));
        assert_eq!(f.c.seen.len(), MAX_CANDIDATES);
        // Once the client speaks, the counts (and the places) start over.
        assert_eq!(f.fresh(late, 5_000, 4_500), Verdict::Stay("client_active"));
    }

    /// A move while the client was idle (an attacker's fresh datagrams from its own address)
    /// lasts until the client's next datagram from the address it had: that takes it back at once.
    #[test]
    fn the_address_moved_away_from_takes_the_flow_back_at_once() {
        let mut f = Flow::new();
        let attacker = addr("192.0.2.66:4433");
        let client = f.client;
        for t in [30_000, 30_001] {
            assert_eq!(f.fresh(attacker, t, 0), Verdict::Stay("too_few_packets"));
        }
        assert_eq!(f.fresh(attacker, 30_002, 0), Verdict::Move);
        // The flow is at the attacker's address now, which keeps sending.
        f.client = attacker;
        assert_eq!(f.fresh(client, 30_010, 30_009), Verdict::Move, "the client's own address, at once");
        f.client = client;
        // Back at the client's: the way back was used once; the attacker must wait for the
        // client to be quiet again, as anyone.
        assert_eq!(f.fresh(attacker, 30_020, 30_010), Verdict::Stay("client_active"));
    }
}

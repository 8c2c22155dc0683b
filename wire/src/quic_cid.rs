//! Sans-IO reading of QUIC connection IDs from packet headers (RFC 9000 §17), so a router can follow a flow whose client address changed.
//!
//! Header forms and connection IDs are invariant across QUIC versions (RFC 8999), and neither
//! is protected: a router that relays a connection sees the server's Source Connection ID in
//! the server's handshake packets, and the client addresses every later short-header packet to
//! it, whatever address it sends from.
#![deny(unsafe_code, clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

/// Longest connection ID QUIC v1 and v2 allow.
pub const MAX_CID_LEN: usize = 20;

/// The Source Connection ID of a datagram that starts with a long-header packet: the ID its
/// sender wants to be addressed by. `None` for a short header, a version negotiation packet,
/// an empty ID, or a header cut short.
pub fn long_header_scid(datagram: &[u8]) -> Option<&[u8]> {
    let b0 = *datagram.first()?;
    if b0 & 0x80 == 0 {
        return None;
    }
    let version = datagram.get(1..5)?;
    if version == [0, 0, 0, 0] {
        return None;
    }
    let dcid_len = usize::from(*datagram.get(5)?);
    if dcid_len > MAX_CID_LEN {
        return None;
    }
    let at = 6 + dcid_len;
    let scid_len = usize::from(*datagram.get(at)?);
    if scid_len == 0 || scid_len > MAX_CID_LEN {
        return None;
    }
    datagram.get(at + 1..at + 1 + scid_len)
}

/// The Destination Connection ID of a datagram that starts with a short-header packet, if its
/// receiver chose IDs of `len` bytes (short headers do not carry the length). The fixed bit is
/// not checked: a peer may grease it (RFC 9287).
pub fn short_header_dcid(datagram: &[u8], len: usize) -> Option<&[u8]> {
    let b0 = *datagram.first()?;
    if b0 & 0x80 != 0 || len == 0 || len > MAX_CID_LEN {
        return None;
    }
    // A short header is followed by at least a packet number and an AEAD tag.
    let cid = datagram.get(1..1 + len)?;
    (datagram.len() >= 1 + len + 1 + 16).then_some(cid)
}

#[cfg(test)]
#[allow(clippy::indexing_slicing, clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::quic_initial::build;

    #[test]
    fn the_source_id_of_long_headers() {
        // A client Initial: DCID 8 bytes, SCID 4 bytes.
        let dcid = [0x83, 0x94, 0xc8, 0xf0, 0x3e, 0x51, 0x57, 0x08];
        let mut header = vec![0xc3, 0, 0, 0, 1, 8];
        header.extend_from_slice(&dcid);
        header.extend_from_slice(&[4, 0xaa, 0xbb, 0xcc, 0xdd]);
        header.extend_from_slice(&[0, 0x44, 0xd0, 0, 0, 0, 0]);
        let initial = build::seal(1, &dcid, &header, 0, &[0u8; 1162]).unwrap();
        assert_eq!(long_header_scid(&initial), Some(&[0xaa, 0xbb, 0xcc, 0xdd][..]));
        // Cut anywhere before the end of the SCID: nothing, never a panic.
        for cut in 0..6 + 8 + 1 + 4 {
            assert_eq!(long_header_scid(&initial[..cut]), None, "cut at {cut}");
        }
        assert_eq!(long_header_scid(&initial[..6 + 8 + 1 + 4]), Some(&[0xaa, 0xbb, 0xcc, 0xdd][..]));
    }

    #[test]
    fn no_source_id_where_there_is_none() {
        // Short header, version negotiation, empty SCID, over-long lengths.
        assert_eq!(long_header_scid(&[0x40, 1, 2, 3]), None);
        assert_eq!(long_header_scid(&[0x80, 0, 0, 0, 0, 1, 9, 1, 7]), None);
        assert_eq!(long_header_scid(&[0xc0, 0, 0, 0, 1, 1, 9, 0]), None);
        assert_eq!(long_header_scid(&[0xc0, 0, 0, 0, 1, 21]), None);
        let mut long_scid = vec![0xc0, 0, 0, 0, 1, 0, 21];
        long_scid.extend_from_slice(&[7; 21]);
        assert_eq!(long_header_scid(&long_scid), None);
        assert_eq!(long_header_scid(&[]), None);
    }

    #[test]
    fn the_destination_id_of_short_headers() {
        let mut p = vec![0x41];
        p.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        p.extend_from_slice(&[0u8; 17]);
        assert_eq!(short_header_dcid(&p, 8), Some(&[1, 2, 3, 4, 5, 6, 7, 8][..]));
        // Greased fixed bit: still a short header.
        p[0] = 0x01;
        assert_eq!(short_header_dcid(&p, 8), Some(&[1, 2, 3, 4, 5, 6, 7, 8][..]));
        // Too short to be a packet, a long header, lengths out of range.
        assert_eq!(short_header_dcid(&p[..20], 8), None);
        assert_eq!(short_header_dcid(&[0xc1; 40], 8), None);
        assert_eq!(short_header_dcid(&p, 0), None);
        assert_eq!(short_header_dcid(&p, 21), None);
        assert_eq!(short_header_dcid(&[], 8), None);
    }
}

//! Tests for the control-line framer: the limit wherever the newline falls, several lines per chunk, lines across chunks.

use proxy_wire::lines::{LineFramer, TooLong};

const LIMIT: usize = 8;

fn drain(f: &mut LineFramer) -> Result<Vec<Vec<u8>>, TooLong> {
    let mut out = Vec::new();
    while let Some(l) = f.next_line()? {
        out.push(l);
    }
    Ok(out)
}

#[test]
fn several_lines_in_one_chunk() {
    let mut f = LineFramer::new(LIMIT);
    f.push(b"a\nbb\n\nccc");
    assert_eq!(drain(&mut f), Ok(vec![b"a".to_vec(), b"bb".to_vec(), Vec::new()]));
    assert_eq!(f.pending(), 3);
    f.push(b"c\n");
    assert_eq!(drain(&mut f), Ok(vec![b"cccc".to_vec()]));
    assert_eq!(f.pending(), 0);
}

#[test]
fn a_line_split_across_chunks() {
    let mut f = LineFramer::new(LIMIT);
    for b in b"hello" {
        f.push(&[*b]);
        assert_eq!(f.next_line(), Ok(None));
    }
    f.push(b"\nx");
    assert_eq!(f.next_line(), Ok(Some(b"hello".to_vec())));
    assert_eq!(f.next_line(), Ok(None));
}

#[test]
fn a_line_of_exactly_the_limit_is_accepted() {
    let mut f = LineFramer::new(LIMIT);
    f.push(&[b'x'; LIMIT]);
    assert_eq!(f.next_line(), Ok(None));
    f.push(b"\n");
    assert_eq!(f.next_line(), Ok(Some(vec![b'x'; LIMIT])));
}

/// Refused wherever the newline falls: same chunk, next chunk, or not arrived yet.
#[test]
fn a_line_over_the_limit_is_refused_wherever_its_newline_falls() {
    let long = [b'x'; LIMIT + 1];
    let mut same = LineFramer::new(LIMIT);
    same.push(&[&long[..], b"\nok\n"].concat());
    assert_eq!(same.next_line(), Err(TooLong { limit: LIMIT }));

    let mut next = LineFramer::new(LIMIT);
    next.push(&long[..LIMIT]);
    assert_eq!(next.next_line(), Ok(None));
    next.push(b"x\nok\n");
    assert_eq!(next.next_line(), Err(TooLong { limit: LIMIT }));

    let mut never = LineFramer::new(LIMIT);
    never.push(&long);
    assert_eq!(never.next_line(), Err(TooLong { limit: LIMIT }));
    // Final: the stream has lost its framing, later bytes are not read as lines.
    never.push(b"\nok\n");
    assert_eq!(never.next_line(), Err(TooLong { limit: LIMIT }));
    assert_eq!(never.pending(), 0);
}

#[test]
fn a_long_line_after_good_ones_is_refused_after_them() {
    let mut f = LineFramer::new(LIMIT);
    f.push(b"ok\n0123456789\n");
    assert_eq!(f.next_line(), Ok(Some(b"ok".to_vec())));
    assert_eq!(f.next_line(), Err(TooLong { limit: LIMIT }));
}

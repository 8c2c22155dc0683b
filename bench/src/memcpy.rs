//! `bench memcpy`: this machine's copy speed for 16 KiB blocks by destination − source distance modulo 4 KiB.
//!
//! glibc copies blocks of 8 KiB and more with `rep movsb` where the CPU advertises fast string
//! moves; on AMD Zen (measured on Zen 4) that is many times slower when the destination lies just
//! past the source modulo 4 KiB, a placement rustls's per-record copy often gets. This shows
//! whether a machine has the cliff, in this process's environment (run it with and without
//! `GLIBC_TUNABLES`), in about a second.

use std::hint::black_box;
use std::time::{Duration, Instant};

const PAGE: usize = 4096;
const BLOCK: usize = 16 * 1024;
/// Distances tried: equal offsets, the slow band's edges and middle, and a few far ones.
const DISTANCES: [usize; 9] = [0, 1, 5, 11, 15, 16, 64, 2048, 4091];

/// Copy speed (GB/s) of `BLOCK` bytes from a page-aligned source to a destination `distance`
/// bytes further modulo 4 KiB, over at least `min_time`.
fn speed(distance: usize, min_time: Duration) -> f64 {
    let src = vec![1u8; 2 * PAGE + BLOCK];
    let mut dst = vec![0u8; 3 * PAGE + BLOCK];
    let s0 = src.as_ptr().align_offset(PAGE);
    let d0 = dst.as_ptr().align_offset(PAGE) + distance;
    // A length the optimiser cannot see, so the copy is the library's memcpy, as in rustls.
    let n = black_box(BLOCK);
    let (mut copies, start) = (0u64, Instant::now());
    while start.elapsed() < min_time {
        for _ in 0..256 {
            dst[d0..d0 + n].copy_from_slice(black_box(&src[s0..s0 + n]));
            black_box(&mut dst);
        }
        copies += 256;
    }
    (copies * BLOCK as u64) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// What the speeds say: the slowest distance against the fastest, and the advice when the
/// slowest is under a quarter of it.
pub(crate) fn verdict(speeds: &[(usize, f64)]) -> String {
    let slowest = speeds.iter().min_by(|a, b| a.1.total_cmp(&b.1));
    let fastest = speeds.iter().max_by(|a, b| a.1.total_cmp(&b.1));
    let (Some(&(d, slow)), Some(&(_, fast))) = (slowest, fastest) else { return "no measurements".into() };
    if slow * 4.0 < fast {
        format!(
            "cliff: {slow:.1} GB/s at distance {d} against {fast:.1} GB/s at best ({:.0}x slower); \
             run seedgate with GLIBC_TUNABLES={} (the seedgate image sets it)",
            fast / slow,
            proxy_core::app::memcpy::TUNABLE
        )
    } else {
        format!("no cliff: the slowest distance ({d}) copies {slow:.1} GB/s, the fastest {fast:.1} GB/s")
    }
}

pub(crate) fn main() {
    println!(
        "16 KiB copies by destination - source distance modulo 4 KiB; GLIBC_TUNABLES={}",
        std::env::var("GLIBC_TUNABLES").unwrap_or_else(|_| "(unset)".into())
    );
    let speeds: Vec<(usize, f64)> = DISTANCES.iter().map(|&d| (d, speed(d, Duration::from_millis(100)))).collect();
    for (d, s) in &speeds {
        println!("{d:>6} B  {s:>7.1} GB/s");
    }
    println!("{}", verdict(&speeds));
}

#[cfg(test)]
mod tests {
    use super::{speed, verdict};
    use std::time::Duration;

    #[test]
    fn a_distance_far_slower_than_the_fastest_is_called_a_cliff() {
        let v = verdict(&[(0, 90.0), (5, 3.4), (11, 3.3), (64, 95.0), (2048, 92.0)]);
        assert!(v.starts_with("cliff: 3.3 GB/s at distance 11 against 95.0 GB/s at best (29x slower)"), "{v}");
        assert!(v.contains("GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=1048576"), "{v}");
        let v = verdict(&[(0, 90.0), (5, 60.0), (11, 80.0)]);
        assert!(v.starts_with("no cliff: the slowest distance (5)"), "{v}");
        assert_eq!(verdict(&[]), "no measurements");
    }

    #[test]
    fn every_distance_fits_its_buffers_and_is_measured() {
        for d in super::DISTANCES {
            assert!(speed(d, Duration::from_millis(2)) > 0.0, "distance {d}");
        }
    }
}

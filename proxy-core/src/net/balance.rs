//! Power-of-two-choices: pick the less loaded of two random candidates.

/// Index of the less loaded of two distinct random candidates among `n` (ties go to the first
/// drawn); `None` when `n` is 0. `load(i)` is asked only for the two drawn.
pub fn p2c(n: usize, load: impl Fn(usize) -> usize) -> Option<usize> {
    match n {
        0 => None,
        1 => Some(0),
        n => {
            let a = rand::random_range(0..n);
            let mut b = rand::random_range(0..n - 1);
            if b >= a {
                b += 1;
            }
            Some(if load(b) < load(a) { b } else { a })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::p2c;

    #[test]
    fn never_picks_the_busier_of_two() {
        let loads = [5, 0];
        for _ in 0..200 {
            assert_eq!(p2c(2, |i| loads[i]), Some(1));
        }
    }

    #[test]
    fn spreads_equal_load_and_handles_small_sets() {
        assert_eq!(p2c(0, |_| 0), None);
        assert_eq!(p2c(1, |_| 9), Some(0));
        let mut seen = [0usize; 4];
        for _ in 0..400 {
            seen[p2c(4, |_| 1).unwrap()] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
    }
}

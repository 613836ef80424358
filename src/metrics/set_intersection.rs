//! Average Set Intersection (ASI) over semantic levels, HAPPIER supp. B.3 (after Fagin et al.
//! and the DyML paper), as the authors' `metrics.asi` computes it.

use super::{levels_up_to, RankedLevels, MAX_LEVELS};

/// Hierarchical ASI of one query:
/// `ASI = 1/N · Σ_{n=1..N} SI(n)`, `SI(n) = |{a_1..a_n} ∩ {b_1..b_n}| / n`, where `a` is the
/// predicted list, `b` the ideal list (levels sorted in decreasing order) and `N` the number of
/// positives (items of level `≥ 1`).
///
/// The intersection is a multiset intersection over levels (the authors' code): with `c_v(·)`
/// the number of items of level `v` in a prefix, `|a ∩ b| = Σ_v min(c_v(a_1..n), c_v(b_1..n))`.
/// The first `N` items of the ideal list are all positives, so negatives never enter the
/// intersection. `O(n)`: each step changes two counters, hence at most two terms of the sum.
///
/// `num_levels` is `L`; `None` if the list has no positive or holds a level above `L`.
///
/// ```
/// use rankwise::metrics::asi;
/// // N = 2 positives (levels 1 and 2), ideal list [2, 1, 0]: SI(1) = |{1} ∩ {2}| / 1 = 0,
/// // SI(2) = |{1, 2} ∩ {2, 1}| / 2 = 1.
/// assert_eq!(asi(&[1, 2, 0], 2), Some(0.5));
/// assert_eq!(asi(&[2, 1, 0], 2), Some(1.0));
/// ```
pub fn asi(ranked: &[u8], num_levels: usize) -> Option<f64> {
    let mut counts = [0usize; MAX_LEVELS];
    for &level in ranked {
        counts[level as usize] += 1;
    }
    asi_of(ranked, &counts, num_levels)
}

/// [`asi`] of a list read through its positives ([`RankedLevels`]), given the number of items
/// of each level (`counts[l]`, negatives at 0; levels beyond `counts` count 0): the engine's
/// path, bit for bit [`asi`] of the dense list.
pub(crate) fn asi_of(
    ranked: &(impl RankedLevels + ?Sized),
    counts: &[usize],
    num_levels: usize,
) -> Option<f64> {
    let top = num_levels.min(MAX_LEVELS - 1);
    if counts.iter().skip(top + 1).any(|&c| c > 0) {
        return None;
    }
    let count = |l: usize| counts.get(l).copied().unwrap_or(0);
    let positives = ranked.list_len() - count(0);
    if positives == 0 {
        return None;
    }
    let mut in_list = [0usize; MAX_LEVELS]; // c_v(a_1..n)
    let mut in_ideal = [0usize; MAX_LEVELS]; // c_v(b_1..n)
    let mut common = 0usize; // Σ_v min(c_v(a_1..n), c_v(b_1..n))
    let mut ideal_level = top;
    let mut ideal_left = count(top);
    let mut sum = 0.0;
    for (i, level) in levels_up_to(ranked.positives(), positives).enumerate() {
        // b_{i+1}: the next level of the ideal list (levels L, L−1, …, 1 by population).
        while ideal_left == 0 && ideal_level > 1 {
            ideal_level -= 1;
            ideal_left = count(ideal_level);
        }
        ideal_left -= 1;
        // min(x, y) grows by one when the smaller side grows.
        if in_ideal[ideal_level] < in_list[ideal_level] {
            common += 1;
        }
        in_ideal[ideal_level] += 1;
        let l = level as usize;
        if l > 0 {
            if in_list[l] < in_ideal[l] {
                common += 1;
            }
            in_list[l] += 1;
        }
        sum += common as f64 / (i + 1) as f64;
    }
    Some(sum / positives as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asi_by_hand() {
        // L = 2, list [1, 2, 0, 2], ideal [2, 2, 1]; N = 3.
        // n=1: {1} ∩ {2} = 0; n=2: {1,2} ∩ {2,2} = 1 → 1/2; n=3: {1,2,0} ∩ {2,2,1} = 2 → 2/3.
        let a = asi(&[1, 2, 0, 2], 2).unwrap();
        assert!((a - (0.0 + 0.5 + 2.0 / 3.0) / 3.0).abs() < 1e-15, "{a}");
    }

    #[test]
    fn perfect_and_undefined() {
        assert_eq!(asi(&[2, 2, 1, 1, 0], 2), Some(1.0));
        assert_eq!(asi(&[1, 1], 2), Some(1.0));
        assert_eq!(asi(&[], 2), None);
        assert_eq!(asi(&[0, 0], 2), None);
        assert_eq!(asi(&[3, 1], 2), None);
        assert_eq!(asi(&[1], 0), None);
    }
}

//! Normalised discounted cumulative gain over levels, HAPPIER supp. B.3 (after Croft et al.),
//! as the authors' `metrics.ndcg` computes it.

use super::{RankedLevels, MAX_LEVELS};

/// Gain of an item of level `l`: `2^l − 1` (the level index, not the relevance value).
fn gain(level: usize) -> f64 {
    // Exact in f64 for every u8 level: 2^255 is far below f64::MAX.
    2f64.powi(level as i32) - 1.0
}

/// Discount of 1-based position `rank`: `log2(1 + rank)`.
fn discount(rank: usize) -> f64 {
    (1.0 + rank as f64).log2()
}

/// NDCG of one query (HAPPIER supp. B.3):
/// `DCG = Σ_k (2^{l_k} − 1) / log2(1 + rank(k))` over the whole list (no cutoff), and
/// `NDCG = DCG / IDCG`, with `IDCG` the DCG of the same gains sorted in decreasing order.
///
/// The gain uses the level index `l` (gains 3 / 1 / 0 on SOP, up to 127 on iNat-full). The
/// authors compute it in float32; this is f64. `O(n)`. `None` if the list has no positive
/// (`IDCG = 0`).
///
/// ```
/// use rankwise::metrics::ndcg;
/// // Gains 2^l − 1 = 1, 3, 0 at ranks 1, 2, 3; the ideal order puts the level-2 item first.
/// let dcg = 1.0 + 3.0 / 3f64.log2();
/// let idcg = 3.0 + 1.0 / 3f64.log2();
/// assert!((ndcg(&[1, 2, 0]).unwrap() - dcg / idcg).abs() < 1e-12);
/// assert_eq!(ndcg(&[2, 1, 0]), Some(1.0));
/// ```
pub fn ndcg(ranked: &[u8]) -> Option<f64> {
    let mut counts = [0usize; MAX_LEVELS];
    for &level in ranked {
        counts[level as usize] += 1;
    }
    ndcg_of(ranked, &counts)
}

/// [`ndcg`] of a list read through its positives ([`RankedLevels`]), given the number of items
/// of each level (`counts[l]`): the engine's path, bit for bit [`ndcg`] of the dense list.
pub(crate) fn ndcg_of(ranked: &(impl RankedLevels + ?Sized), counts: &[usize]) -> Option<f64> {
    let mut dcg = 0.0;
    for (i, level) in ranked.positives() {
        dcg += gain(level as usize) / discount(i + 1);
    }
    // The ideal list: every item of the highest level first, and so on down to level 1.
    let mut idcg = 0.0;
    let mut rank = 0;
    for (l, &count) in counts.iter().enumerate().skip(1).rev() {
        let g = gain(l);
        for _ in 0..count {
            rank += 1;
            idcg += g / discount(rank);
        }
    }
    (idcg > 0.0).then(|| dcg / idcg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndcg_by_hand() {
        // Gains [1, 3, 0]: DCG = 1/log2(2) + 3/log2(3); ideal [3, 1]: 3/log2(2) + 1/log2(3).
        let want = (1.0 + 3.0 / 3f64.log2()) / (3.0 + 1.0 / 3f64.log2());
        let got = ndcg(&[1, 2, 0]).unwrap();
        assert!((got - want).abs() < 1e-15, "{got} vs {want}");
    }

    #[test]
    fn perfect_and_undefined() {
        assert_eq!(ndcg(&[3, 2, 2, 0]), Some(1.0));
        assert_eq!(ndcg(&[1, 1]), Some(1.0));
        assert_eq!(ndcg(&[]), None);
        assert_eq!(ndcg(&[0, 0]), None);
        assert!(ndcg(&[255, 0, 255]).is_some_and(|v| v.is_finite()));
    }
}
